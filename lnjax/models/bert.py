"""BERT (Devlin et al. 2019) from the same blocks as every other lnjax model: a
bidirectional stack (`transformer.stack`, causal=False) under any `norm_position`, with
segment embeddings, a masked-LM head tied to the input embedding, an optional
next-sentence head, and a classification head on the first token for fine-tuning.

Parameters are laid out so that fine-tuning restores what pre-training learned by name:
  bert/{embed, segment_embed, [embed_norm,] stack/layer_*, stack/final_norm}   the encoder
  pooler                                                         tanh(W h_[CLS] + b)
  mlm_transform, mlm_norm, mlm_bias                              pre-training only
  next_sentence                                                  pre-training with NSP
  classifier                                                     fine-tuning only
"""

import flax.linen as nn
import jax.numpy as jnp

from lnjax.models import layers, norms
from lnjax.models.config import ModelConfig
from lnjax.models.transformer import Embed, output_logits, stack

NUM_SEGMENTS = 2  # Sentence A and sentence B.


class _Stack(nn.Module):
  """`transformer.stack` as a module of its own (its blocks become stack/layer_i)."""

  cfg: ModelConfig

  @nn.compact
  def __call__(self, x_BxTxD, bias, *, deterministic: bool):
    return stack(self.cfg, x_BxTxD, bias, deterministic=deterministic, causal=False)


class BertEncoder(nn.Module):
  """Tokens and segment ids [B, T] -> hidden states [B, T, D]; token id 0 is padding."""

  cfg: ModelConfig

  def setup(self):
    self.embed = Embed(self.cfg)
    self.segment_embed = layers.param(self, "segment_embed", nn.initializers.normal(0.02),
                                      (NUM_SEGMENTS, self.cfg.d_model), (None, "embed"))
    if self.cfg.embed_norm:
      self.embed_norm = norms.NORMS[self.cfg.norm_kind](self.cfg.norm_eps, self.cfg.dtype)
    self.dropout = nn.Dropout(self.cfg.dropout_rate)
    self.stack = _Stack(self.cfg)

  def __call__(self, tokens_BxT, segments_BxT, *, deterministic: bool, mask_BxT=None):
    """`mask_BxT`: 1 on real tokens, 0 on padding (None: padding is token id 0)."""
    # Token·√D (`scale_embeddings`) + position from the shared Embed (its own dropout
    # off), + segment, [a norm (`embed_norm`),] then dropout once on the sum, as BERT does.
    x_BxTxD = self.embed(tokens_BxT, deterministic=True)
    x_BxTxD = x_BxTxD + jnp.take(self.segment_embed, segments_BxT, axis=0).astype(x_BxTxD.dtype)
    if self.cfg.embed_norm:
      x_BxTxD = self.embed_norm(x_BxTxD)
    x_BxTxD = self.dropout(x_BxTxD, deterministic=deterministic)
    mask_BxT = tokens_BxT > 0 if mask_BxT is None else mask_BxT
    return self.stack(x_BxTxD, layers.padding_bias(mask_BxT), deterministic=deterministic)


def _pooler(cfg: ModelConfig, h_BxTxD):
  """BERT's pooled output tanh(W h_0 + b): the first token ([CLS]) only."""
  return jnp.tanh(layers.Dense(cfg.d_model, ("embed", None), dtype=cfg.dtype,
                               name="pooler")(h_BxTxD[:, 0]))


class BertPretraining(nn.Module):
  """Masked LM (and next-sentence prediction when `next_sentence`).

  Returns {'mlm': logits [B, P, V] at the P gathered `mlm_positions`, 'nsp': logits
  [B, 2] (is-next = 0, random = 1) when `next_sentence`}, float32. Only the masked
  positions reach the output projection: the [B·P, D] × [D, V] matmul is ~7× smaller
  than one over every position.
  """

  cfg: ModelConfig
  next_sentence: bool = True

  @nn.compact
  def __call__(self, tokens_BxT, segments_BxT, mlm_positions_BxP, *, deterministic: bool = True,
               mask_BxT=None):
    cfg = self.cfg
    encoder = BertEncoder(cfg, name="bert")
    h_BxTxD = encoder(tokens_BxT, segments_BxT, deterministic=deterministic, mask_BxT=mask_BxT)
    h_BxPxD = jnp.take_along_axis(h_BxTxD, mlm_positions_BxP[..., None], axis=1)
    # BERT's MLM head: dense + activation + LN, then the output projection (the input
    # embedding transposed when cfg.tie_embeddings, as in BERT) and a per-token bias.
    h_BxPxD = layers.ACTIVATIONS[cfg.activation](layers.Dense(cfg.d_model, ("embed", None), dtype=cfg.dtype,
                                   name="mlm_transform")(h_BxPxD))
    h_BxPxD = norms.make_norm(cfg.norm_kind, cfg.norm_eps, cfg.dtype, "mlm_norm")(h_BxPxD)
    bias_V = layers.param(self, "mlm_bias", nn.initializers.zeros, (cfg.vocab_size,), ("vocab",))
    outputs = {"mlm": output_logits(cfg, encoder.embed, h_BxPxD) + bias_V}
    if self.next_sentence:
      outputs["nsp"] = layers.Dense(2, ("embed", None), dtype=cfg.dtype, name="next_sentence")(
          _pooler(cfg, h_BxTxD)).astype(jnp.float32)
    return outputs


class BertClassifier(nn.Module):
  """Sentence-pair classification (GLUE): logits [B, C] from the first token's state."""

  cfg: ModelConfig
  num_classes: int = 2

  @nn.compact
  def __call__(self, tokens_BxT, segments_BxT, *, deterministic: bool = True):
    cfg = self.cfg
    h_BxTxD = BertEncoder(cfg, name="bert")(tokens_BxT, segments_BxT,
                                             deterministic=deterministic)
    pooled_BxD = nn.Dropout(cfg.dropout_rate)(_pooler(cfg, h_BxTxD), deterministic=deterministic)
    return layers.Dense(self.num_classes, ("embed", None), dtype=cfg.dtype,
                        name="classifier")(pooled_BxD).astype(jnp.float32)
