"""Transformer models built from one `Block`: the decoder-only LM here; the encoder,
encoder-decoder and masked LM reuse the same block (causal or not, with or without
cross-attention) and the same placement functions.
"""

import flax.linen as nn
import jax
import jax.numpy as jnp

from lnjax.models import layers, placement
from lnjax.models.config import ModelConfig


class Block(nn.Module):
  """One Transformer layer: self-attention, optional cross-attention, FFN, each a residual
  sub-layer placed by `placement.residual`.
  """

  cfg: ModelConfig
  has_cross_attention: bool = False

  @nn.compact
  def __call__(self, stream, self_bias, encoded_BxSxD=None, cross_bias=None, *,
               deterministic: bool):
    cfg = self.cfg
    drop = lambda y: nn.Dropout(cfg.dropout_rate)(y, deterministic=deterministic)
    attention = lambda name: layers.Attention(
        cfg.num_heads, cfg.use_bias, cfg.attention_dropout_rate, cfg.dtype, name=name)

    stream = placement.residual(
        cfg, "self_attn", stream,
        lambda h: attention("self_attn")(h, h, self_bias, deterministic), drop)
    if self.has_cross_attention:
      stream = placement.residual(
          cfg, "cross_attn", stream,
          lambda h: attention("cross_attn")(h, encoded_BxSxD, cross_bias, deterministic), drop)
    stream = placement.residual(
        cfg, "ffn", stream,
        lambda h: layers.Mlp(cfg.d_ff, cfg.activation, cfg.use_bias, cfg.dtype, name="ffn")(h),
        drop)
    return stream


class Embed(nn.Module):
  """Token embedding × √D plus positions (Vaswani et al.; fairseq), then dropout."""

  cfg: ModelConfig

  def setup(self):
    cfg = self.cfg
    # N(0, D^-1/2) entries, so that √D·E has unit-variance entries (fairseq's init).
    self.embedding = layers.param(self, "embedding", nn.initializers.normal(cfg.d_model**-0.5),
                                  (cfg.vocab_size, cfg.d_model), ("vocab", "embed"))
    if cfg.pos_emb == "learned":
      self.positions = layers.param(self, "positions", nn.initializers.normal(0.02),
                                    (cfg.max_len, cfg.d_model), (None, "embed"))
    else:
      self.positions = layers.sinusoidal_positions(cfg.max_len, cfg.d_model)
    self.dropout = nn.Dropout(cfg.dropout_rate)

  def __call__(self, tokens_BxT, *, deterministic: bool):
    t = tokens_BxT.shape[1]
    if t > self.cfg.max_len:
      raise ValueError(f"sequence length {t} exceeds model.max_len={self.cfg.max_len}")
    x_BxTxD = jnp.take(self.embedding, tokens_BxT, axis=0) * self.cfg.d_model**0.5
    x_BxTxD = (x_BxTxD + self.positions[:t]).astype(self.cfg.dtype)
    return self.dropout(x_BxTxD, deterministic=deterministic)

  def attend(self, x_BxTxD):
    """Tied output projection: logits = x Eᵀ."""
    return x_BxTxD @ self.embedding.T.astype(self.cfg.dtype)


class TransformerLM(nn.Module):
  """Decoder-only causal language model: tokens [B, T] -> logits [B, T, V] (float32)."""

  cfg: ModelConfig

  @nn.compact
  def __call__(self, tokens_BxT, *, deterministic: bool = True):
    cfg = self.cfg
    embed = Embed(cfg, name="embed")
    stream = placement.begin(cfg, embed(tokens_BxT, deterministic=deterministic))
    bias = layers.causal_bias(tokens_BxT.shape[1])
    for i in range(cfg.num_layers):
      stream = Block(cfg, name=f"layer_{i}")(stream, bias, deterministic=deterministic)
    x_BxTxD = placement.end(cfg, stream)
    if cfg.tie_embeddings:
      logits_BxTxV = embed.attend(x_BxTxD)
    else:
      logits_BxTxV = layers.Dense(cfg.vocab_size, ("embed", "vocab"), use_bias=False,
                                  dtype=cfg.dtype, name="logits")(x_BxTxD)
    return logits_BxTxV.astype(jnp.float32)


def count_params(params) -> int:
  return sum(x.size for x in jax.tree.leaves(params))
