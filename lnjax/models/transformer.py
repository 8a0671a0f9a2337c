"""Transformer models built from one `Block`: the decoder-only LM here; the encoder,
encoder-decoder and masked LM reuse the same block (causal or not, with or without
cross-attention) and the same placement functions.
"""

import dataclasses
import re
from collections.abc import Mapping

import flax.linen as nn
import jax
import jax.numpy as jnp

from lnjax.models import kernels, layers, placement
from lnjax.models.config import ModelConfig


class Block(nn.Module):
  """One Transformer layer: self-attention, optional cross-attention, FFN, each a residual
  sub-layer placed by `placement.layer`. `deterministic` and `decode` are fields rather
  than arguments, so that nn.remat and nn.scan see only arrays.
  """

  cfg: ModelConfig
  has_cross_attention: bool = False
  causal: bool = False  # Self-attention under a causal mask (LM, decoder).
  index: int = 0  # Position in the stack (Mix-LN places layers by it).
  deterministic: bool = True  # No dropout.
  decode: bool = False  # One position per call against the 'cache' collection.

  @nn.compact
  def __call__(self, stream, self_bias, encoded_BxSxD=None, cross_bias=None, window=0):
    """`window`: this layer's sliding window W (0 = global; traced under nn.scan)."""
    cfg, deterministic = self.cfg, self.deterministic
    drop = lambda y: nn.Dropout(cfg.dropout_rate)(y, deterministic=deterministic)
    attention_options, mlp_options = placement.sublayer_options(cfg)
    attention = lambda name, causal=False, rope_theta=0.0: layers.Attention(
        cfg.num_heads, cfg.use_bias, cfg.attention_dropout_rate, cfg.dtype, causal, name=name,
        weight_grad=cfg.weight_grad, attention_impl=cfg.attention_impl,
        num_kv_heads=cfg.num_kv_heads, head_dim=cfg.head_size, query_scale=cfg.query_scale,
        logit_softcap=cfg.attn_logit_softcap, rope_theta=rope_theta, **attention_options)
    rope_theta = cfg.rope_theta if cfg.pos_emb == "rope" else 0.0  # (self-attention only)

    sublayers = [("self_attn", lambda h: attention("self_attn", self.causal, rope_theta)(
        h, h, self_bias, deterministic, self.decode, window))]
    if self.has_cross_attention:
      sublayers.append(("cross_attn", lambda h: attention("cross_attn")(
          h, encoded_BxSxD, cross_bias, deterministic)))
    sublayers.append(("ffn", lambda h: layers.Mlp(
        cfg.d_ff, cfg.activation, cfg.use_bias, cfg.dtype, name="ffn",
        weight_grad=cfg.weight_grad, gated=cfg.gated_ffn, **mlp_options)(h)))
    stream = layers.constrain(stream, layers.BTD)  # (ResiDual's two streams alike)
    if self.is_mutable_collection("intermediates"):  # lnjax.core.health's, when asked for.
      x = stream[0] if isinstance(stream, tuple) else stream  # (ResiDual: the Post-LN one)
      self.sow("intermediates", "residual_rms", _rms(x))
    return layers.constrain(placement.layer(cfg, self.index, stream, sublayers, drop),
                            layers.BTD)


class ScanStep(Block):
  """`Block` as nn.scan's body: (stream, inputs shared by every layer[, this layer's
  window]) -> (stream, None)."""

  @nn.compact
  def __call__(self, stream, self_bias, encoded_BxSxD, cross_bias, window=0):
    return super().__call__(stream, self_bias, encoded_BxSxD, cross_bias, window), None


class Embed(nn.Module):
  """Token embedding × √D plus positions (Vaswani et al.; fairseq), then dropout; no
  position table under pos_emb rope (in the attention) or none."""

  cfg: ModelConfig

  def setup(self):
    cfg = self.cfg
    # N(0, D^-1/2) entries, so that √D·E has unit-variance entries (fairseq's init).
    self.embedding = layers.param(self, "embedding", nn.initializers.normal(cfg.d_model**-0.5),
                                  (cfg.vocab_size, cfg.d_model), ("vocab", "embed"))
    if cfg.pos_emb == "learned":
      self.positions = layers.param(self, "positions", nn.initializers.normal(0.02),
                                    (cfg.max_len, cfg.d_model), (None, "embed"))
    elif cfg.pos_emb == "sinusoidal":
      self.positions = layers.sinusoidal_positions(cfg.max_len, cfg.d_model)
    self.dropout = nn.Dropout(cfg.dropout_rate)

  def __call__(self, tokens_BxT, *, deterministic: bool, offset=0):
    """`offset`: position of the first token (the decode step when decoding)."""
    t = tokens_BxT.shape[1]
    if t > self.cfg.max_len:
      raise ValueError(f"sequence length {t} exceeds model.max_len={self.cfg.max_len}")
    x_BxTxD = jnp.take(self.embedding, tokens_BxT, axis=0)
    if self.cfg.scale_embeddings:
      x_BxTxD = x_BxTxD * self.cfg.d_model**0.5
    if self.cfg.pos_emb in ("learned", "sinusoidal"):
      x_BxTxD = x_BxTxD + jax.lax.dynamic_slice_in_dim(self.positions, offset, t)
    x_BxTxD = layers.constrain(x_BxTxD.astype(self.cfg.dtype), layers.BTD)
    return self.dropout(x_BxTxD, deterministic=deterministic)

  def attend(self, x_BxTxD):
    """Tied output projection: logits = x Eᵀ."""
    return x_BxTxD @ self.embedding.T.astype(self.cfg.dtype)


def stack(cfg: ModelConfig, x_BxTxD, self_bias, encoded_BxSxD=None, cross_bias=None, *,
          deterministic: bool, decode: bool = False, causal: bool = False,
          final_norm: str = "final_norm"):
  """`cfg.num_layers` blocks between the placement's begin and end; call it inside a
  module's compact method. With `encoded_BxSxD`, every block cross-attends to it (a
  decoder); `causal` says that `self_bias` is a causal mask.

  Unrolled (default), the blocks become `layer_0`, `layer_1`, ... of that module. With
  `cfg.scan_layers`, each run of `placement.layer_runs` (one, 'layers', but for Mix-LN) is
  one nn.scan over a block whose parameters (and decode cache) carry a leading axis of
  the run's length, logical name 'layers': the step compiles one layer instead of L
  (`scan_params` / `unscan_params` convert between the two layouts); a per-layer sliding
  window (`cfg.attention_pattern`) is then an input scanned over, one W per layer.
  `cfg.remat_policy` rematerializes each block in the backward pass.
  """
  fields = dict(cfg=cfg, has_cross_attention=encoded_BxSxD is not None, causal=causal,
                deterministic=deterministic, decode=decode)
  inputs = (self_bias, encoded_BxSxD, cross_bias)
  windows = cfg.layer_windows()  # Sliding windows: each layer's W, 0 = global.
  stream = placement.begin(cfg, x_BxTxD)
  if not cfg.scan_layers:
    block = _remat(Block, cfg, prevent_cse=True)
    for i in range(cfg.num_layers):
      stream = block(index=i, name=f"layer_{i}", **fields)(stream, *inputs, windows[i])
    return placement.end(cfg, stream, name=final_norm)
  for name, first, end in placement.layer_runs(cfg):
    # Parameters, cache (and sown values) per layer; one dropout key per layer; the
    # biases and encoder output shared; with sliding windows, each layer's W scanned over.
    run_windows = (jnp.array(windows[first:end]),) if any(windows) else ()
    run = nn.scan(_remat(ScanStep, cfg, prevent_cse=False),
                  variable_axes={"params": 0, "cache": 0, "intermediates": 0},
                  split_rngs={"params": True, "dropout": True},
                  in_axes=(nn.broadcast,) * 3 + (0,) * len(run_windows),
                  length=end - first, metadata_params={nn.PARTITION_NAME: "layers"})
    stream, _ = run(index=first, name=name, **fields)(stream, *inputs, *run_windows)
  return placement.end(cfg, stream, name=final_norm)


def _remat(block_class, cfg: ModelConfig, prevent_cse: bool):
  """`block_class` recomputed in the backward pass under `cfg.remat_policy` (a
  jax.checkpoint_policies name), or unchanged for 'none'."""
  if cfg.remat_policy == "none":
    return block_class
  return nn.remat(block_class, policy=getattr(jax.checkpoint_policies, cfg.remat_policy),
                  prevent_cse=prevent_cse)


def scan_params(params, cfg: ModelConfig):
  """Unrolled parameters (unboxed) -> the `cfg.scan_layers` layout: in every stack, the
  layers of each run of `placement.layer_runs` stacked on a new leading axis."""

  def convert(tree, stack_cfg):
    out = {k: v for k, v in tree.items() if not _LAYER_KEY.fullmatch(k)}
    for name, first, end in placement.layer_runs(stack_cfg):
      out[name] = jax.tree.map(lambda *xs: jnp.stack(xs),
                               *[tree[f"layer_{i}"] for i in range(first, end)])
    return out

  return _map_stacks(params, cfg, convert)


def unscan_params(params, cfg: ModelConfig):
  """`scan_params` undone: scanned parameters (unboxed) -> layer_0, layer_1, ..."""

  def convert(tree, stack_cfg):
    runs = placement.layer_runs(stack_cfg)
    out = {k: v for k, v in tree.items() if k not in {name for name, _, _ in runs}}
    for name, first, end in runs:
      for i in range(end - first):
        out[f"layer_{first + i}"] = jax.tree.map(lambda x: x[i], tree[name])
    return out

  return _map_stacks(params, cfg, convert)


_LAYER_KEY = re.compile(r"layer_\d+")


def _map_stacks(tree, cfg: ModelConfig, convert):
  """`convert(stack_params, stack_cfg)` on every stack of a parameter tree: a dict holding
  layer_0 or a run of `placement.layer_runs`; under 'encoder' and 'decoder', the stack's
  config is `cfg.stack(...)` (its own placement and depth)."""
  if not isinstance(tree, Mapping):
    return tree
  if "layer_0" in tree or any(name in tree for name, _, _ in placement.layer_runs(cfg)):
    return convert(tree, cfg)
  return {k: _map_stacks(v, cfg.stack(k) if k in ("encoder", "decoder") else cfg, convert)
          for k, v in tree.items()}


def _rms(x):
  return jnp.sqrt(jnp.mean(jnp.square(x.astype(jnp.float32))))


def sow_output_stats(module: nn.Module, logits_BxTxV):
  """lnjax.core.health's output statistics (computed only when the caller asks for the
  'intermediates' collection): the largest logit and the mean log-partition
  z = log Σ_v exp(logit_v) over every position (PaLM's z-loss term, arXiv 2204.02311 §5;
  its drift is the output-logit divergence of Wortsman et al., arXiv 2309.14322)."""
  if module.is_mutable_collection("intermediates"):
    module.sow("intermediates", "output_logit_max", jnp.max(logits_BxTxV))
    module.sow("intermediates", "output_z_mean",
               jnp.mean(jax.nn.logsumexp(logits_BxTxV, axis=-1)))
  return logits_BxTxV


def output_logits(cfg: ModelConfig, embed: Embed, x_BxTxD):
  """Logits [B, T, V] in float32: the transposed embedding (tied) or a dense layer (scaled
  as the placement says: placement.scale_logits), then soft-capped when
  `cfg.final_logit_softcap` > 0: c·tanh(z/c) (Gemma 2, arXiv 2408.00118)."""
  if cfg.tie_embeddings:
    logits_BxTxV = embed.attend(x_BxTxD).astype(jnp.float32)
  else:
    logits_BxTxV = layers.Dense(cfg.vocab_size, ("embed", "vocab"), use_bias=False,
                                dtype=cfg.dtype, weight_grad=cfg.weight_grad,
                                name="logits")(x_BxTxD).astype(jnp.float32)
  logits_BxTxV = layers.constrain(logits_BxTxV, ("batch", "length", "vocab"))
  return kernels.softcap(placement.scale_logits(cfg, logits_BxTxV), cfg.final_logit_softcap)


class TransformerLM(nn.Module):
  """Decoder-only causal language model: tokens [B, T] -> logits [B, T, V] (float32)."""

  cfg: ModelConfig

  @nn.compact
  def __call__(self, tokens_BxT, *, deterministic: bool = True, mask_BxT=None):
    """`mask_BxT`: 1 on real tokens, 0 on padding no query attends to (a batch of texts
    padded on either side, as Hugging Face's attention_mask); None: every token is real."""
    embed = Embed(self.cfg, name="embed")
    x_BxTxD = embed(tokens_BxT, deterministic=deterministic)
    bias = layers.causal_bias(tokens_BxT.shape[1])
    if mask_BxT is not None:
      bias = bias + layers.padding_bias(mask_BxT)
    x_BxTxD = stack(self.cfg, x_BxTxD, bias, deterministic=deterministic, causal=True)
    return sow_output_stats(self, output_logits(self.cfg, embed, x_BxTxD))


class Encoder(nn.Module):
  """Bidirectional stack over the source: tokens [B, S] (0 = padding) -> [B, S, D]."""

  cfg: ModelConfig
  embed: Embed

  @nn.compact
  def __call__(self, src_BxS, *, deterministic: bool):
    x_BxSxD = self.embed(src_BxS, deterministic=deterministic)
    return stack(self.cfg, x_BxSxD, layers.padding_bias(src_BxS > 0),
                 deterministic=deterministic)


class Decoder(nn.Module):
  """Causal stack with cross-attention: target inputs [B, T] -> logits [B, T, V].

  `decode=True` runs one position per call against the 'cache' collection (initialize it
  by a first call on a [B, max_decode_len] input)."""

  cfg: ModelConfig
  embed: Embed

  @nn.compact
  def __call__(self, tgt_in_BxT, encoded_BxSxD, src_BxS, *, deterministic: bool,
               decode: bool = False):
    offset = 0
    if decode:
      initialized = self.has_variable("cache", "position")
      position = self.variable("cache", "position", lambda: jnp.zeros((), jnp.int32))
      if initialized:
        offset = position.value
        position.value = offset + tgt_in_BxT.shape[1]
    x_BxTxD = self.embed(tgt_in_BxT, deterministic=deterministic, offset=offset)
    x_BxTxD = stack(self.cfg, x_BxTxD, layers.causal_bias(tgt_in_BxT.shape[1]), encoded_BxSxD,
                    layers.padding_bias(src_BxS > 0), deterministic=deterministic, decode=decode,
                    causal=True)
    return sow_output_stats(self, output_logits(self.cfg, self.embed, x_BxTxD))


class EncoderDecoder(nn.Module):
  """Sequence-to-sequence Transformer; each stack has its own norm placement
  (`cfg.stack('encoder')`, `cfg.stack('decoder')`). Token id 0 is padding."""

  cfg: ModelConfig

  def setup(self):
    # Assigned here, the embeddings are this module's children ('embed', 'target_embed'),
    # shared with the stacks rather than owned by one of them.
    self.embed = Embed(self.cfg)
    self.target_embed = self.embed if self.cfg.share_embeddings else Embed(self.cfg)
    self.encoder = Encoder(self.cfg.stack("encoder"), self.embed)
    self.decoder = Decoder(self.cfg.stack("decoder"), self.target_embed)

  def __call__(self, src_BxS, tgt_in_BxT, *, deterministic: bool = True):
    encoded_BxSxD = self.encode(src_BxS, deterministic=deterministic)
    return self.decode(encoded_BxSxD, src_BxS, tgt_in_BxT, deterministic=deterministic)

  def encode(self, src_BxS, *, deterministic: bool = True):
    return self.encoder(src_BxS, deterministic=deterministic)

  def decode(self, encoded_BxSxD, src_BxS, tgt_in_BxT, *, deterministic: bool = True,
             decode: bool = False):
    return self.decoder(tgt_in_BxT, encoded_BxSxD, src_BxS, deterministic=deterministic,
                        decode=decode)


def init_params(model: nn.Module, key: jax.Array, *example_inputs, random_inputs=None):
  """`model.init`'s parameters (boxed with their logical axes), then the pass after init
  of the placements that have one (`placement.INIT_PASSES`: Admin's profiling pass, nGPT's
  unit-norm matrices), on `random_inputs(key, vocab_size)` (a batch of random tokens) or
  else the example inputs, so that what it sets is part of the parameters (and of every
  checkpoint) from step 0."""
  params = model.init(key, *example_inputs)["params"]
  cfg = model.cfg
  positions = {cfg.norm_position, cfg.encoder_norm_position, cfg.decoder_norm_position}
  for position, init_pass in placement.INIT_PASSES.items():
    if position in positions:
      inputs = example_inputs
      if random_inputs is not None:
        inputs = random_inputs(jax.random.fold_in(key, 1), cfg.vocab_size)
      params = _on_unrolled_model(init_pass, model, params, inputs)
  return params


def _on_unrolled_model(init_pass, model: nn.Module, params, inputs):
  """`init_pass` on a clone of `model` without scan or remat (such a pass follows the
  sub-layers one by one, in Python). Scanned parameters are unstacked for it and
  stacked back, still boxed."""
  cfg = model.cfg
  plain = model.clone(cfg=dataclasses.replace(cfg, scan_layers=False, remat_policy="none"))
  if not cfg.scan_layers:
    return init_pass(plain, params, *inputs)
  profiled = scan_params(init_pass(plain, unscan_params(nn.unbox(params), cfg), *inputs), cfg)
  is_box = lambda x: isinstance(x, nn.meta.AxisMetadata)
  return jax.tree.map(lambda box, value: box.replace_boxed(value) if is_box(box) else value,
                      params, profiled, is_leaf=is_box)


def count_params(params) -> int:
  return sum(x.size for x in jax.tree.leaves(params))
