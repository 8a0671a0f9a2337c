"""Where the norm goes: the one place that knows each `norm_position`.

A Transformer layer is a chain of sub-layers F (self-attention, cross-attention, FFN),
each wrapped in a residual connection. The placements differ only in where the norm N
(`model.norm_kind`) sits around that connection, so each one is a single branch of
`residual` below (B2T, whose skip spans a whole layer, a branch of `layer`), with its
formula beside it:

  post        x ← N(x + F(x))                          Vaswani et al. 2017; Xiong et al. 2020
  pre         x ← x + F(N(x)); final N                 Xiong et al. 2020, arXiv 2002.04745
  sandwich    x ← x + N_out(F(N_in(x))); final N       CogView, arXiv 2105.13290
  peri        sandwich's block, plus N on the embedding  Peri-LN, arXiv 2502.02732
  deepnorm    x ← N(α·x + F(x)), β-scaled init         DeepNet, arXiv 2203.00555
  admin       x ← N(ω ⊙ x + F(x)), ω profiled at init  Admin, arXiv 2004.08249
  normformer  attention x ← x + N_a(HeadScaleMHA(N(x))); FFN x ← x + W²N_f(act(W¹N(x)));
              final N                                  NormFormer, arXiv 2110.09456
  resi_dual   x ← N(x + F(x)), d ← d + F(x), d_0 = x_0; output x_L + N(d_L)
                                                       ResiDual, arXiv 2304.14802
  mix         post in layers l < ⌊αL⌋, pre after; final N   Mix-LN, arXiv 2412.13795
  b2t         post, plus the layer input added inside the layer's last N
                                                       B2T, arXiv 2206.00330
  dyt         pre, every N a DyT: γ ⊙ tanh(α·x) + β    DyT, arXiv 2503.10622
  lns         x ← x + F(N(x)/√ℓ), ℓ = 1 + layer index; final N
                                                       LayerNorm Scaling, arXiv 2502.05795
  olmo2       x ← x + N(F(x)), QK-norm; final N        OLMo 2, arXiv 2501.00656
  ngpt        h ← Norm(h + α ⊙ (Norm(F(h)) − h)), Norm(x) = x/‖x‖; h_0 = Norm(embedding);
              matrices' rows on the unit sphere        nGPT, arXiv 2410.01131
  hybridnorm  attention x ← x + Attn(N_q(q), N_k(k), N_v(v)), per-head N on q, k, v;
              FFN z ← N(x), x ← z + F(z); final N      HybridNorm, arXiv 2503.04598
  derf        pre, every N a Derf: γ ⊙ erf(α·x + s) + β   Derf, arXiv 2512.10938

`begin` turns the embedding into the residual stream, `layer` and `residual` advance it,
and `end` turns it into what the output projection (or the decoder) reads. What a
placement changes inside the sub-layers (NormFormer's head scales and FFN norm,
DeepNorm's initialization, the optional QK-norm) is `sublayer_options`; the passes after
model.init (Admin's profiling, nGPT's matrices onto the sphere) are `INIT_PASSES`.
"""

import functools
import math
from typing import Callable, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp

from lnjax.core import errors
from lnjax.models import layers, norms

NORM_POSITIONS = ("post", "pre", "sandwich", "peri", "deepnorm", "normformer", "resi_dual",
                  "admin", "mix", "b2t", "dyt", "lns", "olmo2", "ngpt", "hybridnorm", "derf")
# The placements that normalize q and k their own way: model.qk_norm=True is refused there.
OWN_QK_NORM = ("olmo2", "ngpt", "hybridnorm")


def _norm(cfg, name: str) -> nn.Module:
  if cfg.norm_position == "dyt":  # DyT in place of every norm; the attention blocks' α₀
    attention = name.startswith(("self_attn", "cross_attn"))  # may differ (LLaMA table).
    alpha = cfg.dyt_attention_alpha_init if attention else 0.0
    return norms.DyT(alpha or cfg.dyt_alpha_init, cfg.dtype, cfg.norm_unit_offset, name=name)
  if cfg.norm_position == "derf":  # Derf in place of every norm.
    return norms.Derf(cfg.derf_alpha_init, cfg.dtype, cfg.norm_unit_offset, name=name)
  return norms.make_norm(cfg.norm_kind, cfg.norm_eps, cfg.dtype, name, cfg.norm_unit_offset)


def _norm_factory(cfg) -> Callable:
  """name -> a norm of `model.norm_kind` (the sub-layers' own norms: QK-norm, NormFormer's
  FFN norm, OLMo 2's q and k norms)."""
  return functools.partial(norms.make_norm, cfg.norm_kind, cfg.norm_eps, cfg.dtype,
                           unit_offset=cfg.norm_unit_offset)


def _unknown(cfg):
  return ValueError(f"model.norm_position={cfg.norm_position!r} is not one of: "
                    f"{', '.join(NORM_POSITIONS)}")


def begin(cfg, x_BxTxD: jax.Array):
  """The residual stream entering layer 0."""
  if cfg.norm_position == "resi_dual":
    return x_BxTxD, x_BxTxD  # (x_0, d_0 = x_0): the Post-LN stream and the sum of F's.
  if cfg.norm_position == "peri":
    # Peri-LN also normalizes the embedding (arXiv 2502.02732; unconfirmed from its text).
    return _norm(cfg, "embed_norm")(x_BxTxD)
  if cfg.norm_position == "ngpt":
    return norms.Unit(name="embed_unit")(x_BxTxD)  # nGPT: on the unit sphere throughout.
  return x_BxTxD


def layer(cfg, index: int, stream, sublayers: Sequence[tuple[str, Callable]],
          dropout: Callable):
  """Layer `index` of its stack: the sub-layers [(name, F), ...] in order (self-attention,
  [cross-attention], FFN), with `dropout` on each F's output.

  Must be called inside a Flax module's compact method: the norms become that module's
  children, named `{name}_norm` (and `{name}_out_norm`, `{name}_shortcut`).
  """
  if cfg.norm_position == "b2t":
    # B2T (Takase et al. 2022, eq. 4-5): Post-LN sub-layers h = N(x + F(x)), except that
    # the last one also adds the layer input x_in: y = N(x_in + h + F(h)).
    x_in = x = stream
    for name, sublayer in sublayers[:-1]:
      x = _norm(cfg, f"{name}_norm")(x + dropout(sublayer(x)))
    name, sublayer = sublayers[-1]
    return _norm(cfg, f"{name}_norm")(x_in + x + dropout(sublayer(x)))
  for name, sublayer in sublayers:
    stream = residual(cfg, index, name, stream, sublayer, dropout)
  return stream


def residual(cfg, index: int, name: str, stream, sublayer: Callable, dropout: Callable):
  """Advances the stream by one sub-layer F = `sublayer` of layer `index`."""
  norm = lambda suffix: _norm(cfg, f"{name}_{suffix}")
  position = cfg.norm_position
  if position == "mix":  # Mix-LN (Li et al. 2024): Post-LN in the first ⌊αL⌋ layers.
    position = "post" if index < mix_post_layers(cfg) else "pre"
  x = stream
  if position == "post":
    return norm("norm")(x + dropout(sublayer(x)))  # x = LN(x + F(x))
  if position in ("pre", "dyt", "derf"):  # (DyT, Derf: N point-wise, from _norm)
    return x + dropout(sublayer(norm("norm")(x)))  # x = x + F(LN(x))
  if position == "lns":  # LayerNorm Scaling: N's output × 1/√ℓ, ℓ = 1 + the layer index.
    return x + dropout(sublayer(norm("norm")(x) / math.sqrt(index + 1)))  # x + F(N(x)/√ℓ)
  if position == "olmo2":  # OLMo 2's reordered norm, on F's output (QK-norm: sublayer_options)
    return x + dropout(norm("norm")(sublayer(x)))  # x = x + N(F(x))
  if position == "ngpt":  # α: nGPT's eigen learning rate, per dimension (|α| as in its code)
    alpha_D = jnp.abs(LearnedScale(0.05, cfg.d_model**-0.5, (cfg.d_model,), ("norm",),
                                   name=f"{name}_alpha")()).astype(x.dtype)
    h_f = norms.Unit(name=f"{name}_out_unit")(dropout(sublayer(x)))
    # h = Norm(h + α ⊙ (Norm(F(h)) − h))
    return norms.Unit(name=f"{name}_unit")(x + alpha_D * (h_f - x))
  if position == "hybridnorm":  # HybridNorm: N on q, k, v inside attention
    if name != "ffn":  # (sublayer_options), nothing around it: x = x + Attn(x)
      return x + dropout(sublayer(x))
    z = norm("norm")(x)
    return z + dropout(sublayer(z))  # FFN: z = N(x); x = z + F(z)
  if position in ("sandwich", "peri"):
    return x + dropout(norm("out_norm")(sublayer(norm("norm")(x))))  # x + N_out(F(N_in(x)))
  if position == "normformer":  # Attention: x + N_a(HeadScaleMHA(N(x))); FFN: x + F(N(x)),
    y = sublayer(norm("norm")(x))  # with N_f inside F (sublayer_options).
    return x + dropout(y if name == "ffn" else norm("out_norm")(y))
  if position == "deepnorm":
    alpha, _ = deepnorm_constants(cfg)
    return norm("norm")(alpha * x + dropout(sublayer(x)))  # x = LN(α·x + F(x))
  if position == "admin":
    return norm("norm")(AdminShortcut(name=f"{name}_shortcut")(x, dropout(sublayer(x))))
  if position == "resi_dual":
    x, d = stream
    f = dropout(sublayer(x))
    return norm("norm")(x + f), d + f  # x = LN(x + F(x)); d = d + F(x)
  raise _unknown(cfg)


def end(cfg, stream, name: str = "final_norm") -> jax.Array:
  """The stream after the last layer, as the output projection (or decoder) reads it."""
  x = stream
  if cfg.norm_position in ("post", "deepnorm", "admin", "b2t", "ngpt"):
    return x  # Every sub-layer already ended in a norm.
  if cfg.norm_position in ("pre", "sandwich", "peri", "normformer", "mix", "dyt", "lns", "olmo2",
                           "hybridnorm", "derf"):
    # Pre-LN's stream is a sum of un-normalized sub-layer outputs; without this final
    # LN its scale grows with depth (arXiv 2002.04745; a common bug in public code).
    return _norm(cfg, name)(x)
  if cfg.norm_position == "resi_dual":
    x, d = stream
    return x + _norm(cfg, name)(d)  # x_L + LN(d_L)
  raise _unknown(cfg)


def layer_runs(cfg) -> list[tuple[str, int, int]]:
  """The stack's layers as runs that share one formula, [(name, first, end), ...]: what
  `model.scan_layers` scans over, one nn.scan per run, its parameters under `name`.
  Every placement is one run, 'layers' (DeepNorm's α and β depend on the depth only,
  Admin's ω and ResiDual's two streams are per-layer values and carries), except Mix-LN:
  its Post-LN and Pre-LN layers are two runs, 'post_layers' and 'pre_layers'."""
  if cfg.norm_position == "mix":
    k = mix_post_layers(cfg)
    runs = [("post_layers", 0, k), ("pre_layers", k, cfg.num_layers)]
    return [run for run in runs if run[2] > run[1]]
  if cfg.norm_position == "lns":  # 1/√ℓ is a constant of each layer: one run per layer
    return [(f"lns_layer_{i}", i, i + 1) for i in range(cfg.num_layers)]  # (no saving).
  return [("layers", 0, cfg.num_layers)]


# ---- Each placement's own constants and initialization. ---------------------------------

def mix_post_layers(cfg) -> int:
  """Mix-LN's number of Post-LN layers, ⌊αL⌋ (α = `mix_post_fraction`; 0.25 in the
  official examples: 3 of 12, 6 of 24 layers)."""
  return math.floor(cfg.mix_post_fraction * cfg.num_layers + 1e-9)


def deepnorm_role_constants(role: str, n: int, m: int = 0) -> tuple[float, float]:
  """DeepNorm's (α, β) for a stack (DeepNet, Wang et al. 2022, Table 1), N encoder and M
  decoder layers:
    decoder_only, depth M         α = (2M)^¼                β = (8M)^-¼
    encoder_only, depth N         α = (2N)^¼                β = (8N)^-¼
    encoder of an N+M enc-dec     α = 0.81·(N⁴M)^(1/16)     β = 0.87·(N⁴M)^(-1/16)
    decoder of an N+M enc-dec     α = (3M)^¼                β = (12M)^-¼
  The encoder's β uses the paper's 0.87; torchscale's code uses 1.15 instead.
  """
  if role in ("decoder_only", "encoder_only"):
    return (2 * n) ** 0.25, (8 * n) ** -0.25
  if role == "encoder":
    return 0.81 * (n**4 * m) ** (1 / 16), 0.87 * (n**4 * m) ** (-1 / 16)
  if role == "decoder":
    return (3 * m) ** 0.25, (12 * m) ** -0.25
  raise ValueError(f"DeepNorm role {role!r} is not one of: decoder_only, encoder_only, "
                   "encoder, decoder")


def deepnorm_constants(cfg) -> tuple[float, float]:
  """(α, β) of this stack: the config's, where set (ModelConfig.stack sets the
  encoder-decoder's), else the decoder-only values for its depth."""
  alpha, beta = deepnorm_role_constants("decoder_only", cfg.num_layers)
  return cfg.deepnorm_alpha or alpha, cfg.deepnorm_beta or beta


def xavier_normal(gain: float) -> Callable:
  """Xavier-normal with a gain: N(0, gain² · 2 / (fan_in + fan_out))."""
  return nn.initializers.variance_scaling(gain**2, "fan_avg", "normal")


def sublayer_options(cfg) -> tuple[dict, dict]:
  """What the placement (and the QK-norm switch) changes inside the sub-layers: keyword
  arguments of (layers.Attention, layers.Mlp); none for post and pre."""
  attention, mlp = {}, {}
  if cfg.qk_norm is None:
    raise ValueError("model.qk_norm=None is resolved with the run's placement: "
                     "ModelConfig.for_placement first")
  if cfg.qk_norm:  # ViT-22B (arXiv 2302.05442), Qwen3: a norm on each head's q and k.
    attention["qk_norm"] = _norm_factory(cfg)
  if cfg.norm_position == "normformer":  # NormFormer: head scales (init 1); N_f after act.
    attention["head_scale"] = True
    mlp["mid_norm"] = _norm_factory(cfg)
  if cfg.norm_position == "deepnorm":  # DeepNet Fig. 2: Xavier-normal, gain β on V, W^O
    _, beta = deepnorm_constants(cfg)  # and the FFN, gain 1 on Q and K.
    attention["qk_init"], attention["vo_init"] = xavier_normal(1.0), xavier_normal(beta)
    mlp["kernel_init"] = xavier_normal(beta)
  if cfg.norm_position == "olmo2":
    # OLMo 2: N on all heads' q and k (width H·d_h, before the split into heads); every
    # sub-layer weight N(0, 0.02²) cut at ±3σ (OLMo-core's 'normal' init).
    attention["full_qk_norm"] = _norm_factory(cfg)
    olmo_init = nn.initializers.truncated_normal(0.02, lower=-3.0, upper=3.0)
    attention["qk_init"] = attention["vo_init"] = mlp["kernel_init"] = olmo_init
  if cfg.norm_position == "hybridnorm":
    # HybridNorm (BryceZhuo/HybridNorm's OLMo code: use_query_norm, use_key_norm,
    # use_value_norm): N of norm_kind on each head's q, k and v, width d_h, before RoPE.
    attention["qk_norm"] = attention["v_norm"] = _norm_factory(cfg)
  if cfg.norm_position == "ngpt":
    # nGPT: s_qk ⊙ Norm(q), s_qk ⊙ Norm(k) and q kᵀ·√d_h; act(s_ν√D ⊙ x W¹); normal weights
    # (their rows put on the sphere after init, ngpt_unit_matrices).
    attention["unit_qk"] = functools.partial(NgptQK, cfg.d_model)
    mlp["pre_act"] = functools.partial(NgptHiddenScale, cfg.d_model)
    attention["qk_init"] = attention["vo_init"] = mlp["kernel_init"] = nn.initializers.normal()
  return attention, mlp


def own_qk_norm(cfg) -> list[str]:
  """The placements of `cfg` (its stacks' included) that normalize q and k their own way."""
  positions = {cfg.norm_position, cfg.encoder_norm_position, cfg.decoder_norm_position}
  return sorted(positions & set(OWN_QK_NORM))


def check_options(cfg):
  """Refuses what contradicts a placement (ModelConfig's check): a second QK-norm, nGPT in
  an encoder-decoder stack."""
  own = own_qk_norm(cfg)
  if cfg.qk_norm and own:
    raise errors.ConfigError(f"model.qk_norm=True with norm_position={own[0]!r}, which "
                             "normalizes q and k its own way: set model.qk_norm=False")
  for which in ("encoder", "decoder"):
    check_stack(getattr(cfg, f"{which}_norm_position"), which)


def check_stack(position: str, which: str):
  """nGPT (arXiv 2410.01131) is a decoder-only model: no cross-attention update, no
  encoder output on the decoder's sphere. Refused in the encoder-decoder's stacks."""
  if position == "ngpt":
    raise errors.ConfigError(f"model.norm_position='ngpt' in the encoder-decoder's {which}: "
                             "nGPT is defined for decoder-only models (task=lm) only")


class AdminShortcut(nn.Module):
  """Admin's residual ω ⊙ x + F(x): ω a learned per-dimension vector, initialized to 1
  by `init` and set by `admin_profile`."""

  @nn.compact
  def __call__(self, x_BxTxD, f_BxTxD):
    omega_D = layers.param(self, "omega", nn.initializers.ones, (x_BxTxD.shape[-1],),
                           ("norm",))
    return omega_D.astype(x_BxTxD.dtype) * x_BxTxD + f_BxTxD


def admin_profile(model: nn.Module, params, *inputs):
  """Admin's profiling pass (Liu et al. 2020, §4.2; Transformer-Clinic's
  'adaptive-profiling'): one deterministic forward pass on `inputs` in which each Admin
  sub-layer i of a stack, in order, gets ω_i and then computes the next one:

    ω_1 = 1,   ω_{i+1} = √(Var[ω_i · x_i] + Var[F_i(x_i)])

  with the variances over every entry of the batch; the encoder's and the decoder's chains
  are separate. Returns `params` (boxed or not) with every `omega` filled with its ω_i.
  """
  omegas, ratios = {}, {}

  def interceptor(next_fun, args, kwargs, context):
    if not isinstance(context.module, AdminShortcut) or context.method_name != "__call__":
      return next_fun(*args, **kwargs)
    x, f = args
    path = context.module.path  # (..stack.., 'layer_i', '<sub-layer>_shortcut')
    chain = path[:-2]
    omega = ratios.get(chain, jnp.float32(1.0))
    omegas[path] = omega
    x32, f32 = x.astype(jnp.float32) * omega, f.astype(jnp.float32)
    ratios[chain] = jnp.sqrt(jnp.var(x32) + jnp.var(f32))
    return (x32 + f32).astype(x.dtype)

  with nn.intercept_methods(interceptor):
    model.apply({"params": params}, *inputs, deterministic=True)

  def fill(path, leaf):
    keys = tuple(k.key for k in path)
    if keys[-1] != "omega" or keys[:-1] not in omegas:
      return leaf
    value = nn.unbox(leaf)
    filled = jnp.full(value.shape, omegas[keys[:-1]], value.dtype)
    return leaf.replace_boxed(filled) if isinstance(leaf, nn.meta.AxisMetadata) else filled

  return jax.tree_util.tree_map_with_path(
      fill, params, is_leaf=lambda x: isinstance(x, nn.meta.AxisMetadata))


# ---- nGPT (Loshchilov et al. 2024, arXiv 2410.01131; NVIDIA/ngpt's model.py). ------------

class LearnedScale(nn.Module):
  """One of nGPT's learned vectors: stored as `scale`·1 and read as
  stored · `value`/`scale` (`value` at init), so that an Adam step of about lr on it moves
  it by lr·value/scale. nGPT's: α_A, α_M value 0.05, s_qk and s_z value 1, all at scale
  1/√D; s_ν value 1 at scale 1."""

  value: float
  scale: float
  shape: tuple[int, ...]
  axes: tuple[str | None, ...]

  @nn.compact
  def __call__(self):
    stored = layers.param(self, "scale", nn.initializers.constant(self.scale), self.shape,
                          self.axes)
    return stored * (self.value / self.scale)


class NgptQK(nn.Module):
  """q ← s_qk ⊙ Norm(q), k ← s_qk ⊙ Norm(k) on each head's d_h, one s_qk [H, d_h] for both
  (nGPT; NVIDIA/ngpt's sqk); layers.Attention then scales q kᵀ by √d_h instead of 1/√d_h."""

  d_model: int

  @nn.compact
  def __call__(self, q_BxHxTxK, k_BxHxSxK):
    shape = (q_BxHxTxK.shape[1], q_BxHxTxK.shape[3])
    s_HxK = LearnedScale(1.0, self.d_model**-0.5, shape, (None, None), name="s_qk")()
    s_1xHx1xK = s_HxK[None, :, None, :].astype(q_BxHxTxK.dtype)
    return (s_1xHx1xK * norms.Unit(name="query_unit")(q_BxHxTxK),
            s_1xHx1xK * norms.Unit(name="key_unit")(k_BxHxSxK))


class NgptHiddenScale(nn.Module):
  """x W¹ → s_ν ⊙ x W¹ · √D before the FFN's activation (nGPT's s_ν on ν,
  the input of its SwiGLU's SiLU)."""

  d_model: int

  @nn.compact
  def __call__(self, u_BxTxF):
    s_F = LearnedScale(1.0, 1.0, u_BxTxF.shape[-1:], ("mlp",), name="s_nu")()
    return u_BxTxF * (s_F * self.d_model**0.5).astype(u_BxTxF.dtype)


def scale_logits(cfg, logits_BxTxV):
  """The output logits as the placement reads them: nGPT's z ← s_z ⊙ z, s_z
  learned per vocabulary entry; the others' unchanged."""
  if cfg.norm_position != "ngpt":
    return logits_BxTxV
  s_V = LearnedScale(1.0, cfg.d_model**-0.5, logits_BxTxV.shape[-1:], ("vocab",),
                     name="logit_scale")()
  return logits_BxTxV * s_V


# nGPT's matrices and the axis (of width D, 'embed') along which each row is a unit vector,
# as NVIDIA/ngpt's normalize_matrices keeps them: by parameter name, from the end so that
# scanned layers' leading axis does not count. The other parameters are free.
NGPT_UNIT_AXES = {"embedding": -1, "query": -2, "key": -2, "value": -2, "out": -1, "wi": -2,
                  "wi_gate": -2, "wi_up": -2, "wo": -1, "logits": -2}


def ngpt_unit_axis(path: tuple[str, ...]) -> int | None:
  """The axis along which parameter `path` (its keys) has unit rows; None: unconstrained."""
  if path[-1] == "embedding":
    return NGPT_UNIT_AXES["embedding"]
  if path[-1] == "kernel" and len(path) > 1:
    return NGPT_UNIT_AXES.get(path[-2])
  return None


def unit_sphere_axis(cfg):
  """`ngpt_unit_axis` under nGPT (the optimizer keeps those rows on the sphere, after every
  step: optim.keep_params_on_unit_sphere), None under any other placement."""
  return ngpt_unit_axis if cfg.norm_position == "ngpt" else None


def ngpt_unit_matrices(model: nn.Module, params, *inputs):
  """nGPT's init: its matrices' rows projected onto the unit sphere (`ngpt_unit_axis`), as
  NVIDIA/ngpt's train.py does before step 0. Reads no data."""
  del model, inputs
  is_box = lambda x: isinstance(x, nn.meta.AxisMetadata)

  def project(path, leaf):
    axis = ngpt_unit_axis(tuple(k.key for k in path))
    if axis is None:
      return leaf
    if is_box(leaf):
      return leaf.replace_boxed(norms.unit(nn.unbox(leaf), axis))
    return norms.unit(leaf, axis)

  return jax.tree_util.tree_map_with_path(project, params, is_leaf=is_box)


# Placements whose initialization needs a pass after model.init, and that pass: `model,
# params, *inputs -> params` (models.init_params runs it; Admin's on data).
INIT_PASSES = {"admin": admin_profile, "ngpt": ngpt_unit_matrices}
