"""Dense, attention and feed-forward layers with logical axis names for sharding.

Activations stay [B, T, D] at module boundaries; every dense layer runs as one plain
[B·T, D_in] × [D_in, D_out] matmul, and only attention reshapes to heads, head-major
([B, H, T, d_h]), so XLA sees large 2-D matmuls rather than batched small ones.
Logical axis names (mapped to mesh axes in lnjax/core/sharding.py):
  'vocab' V, 'embed' D, 'heads' H·d_h, 'mlp' F, 'norm' a norm's D;
and activations' (`constrain`): 'batch' B, 'length' T, 'heads' H (or H·d_h), 'kv' d_h,
'embed' D, 'mlp' F, 'vocab' V. Their constraints are no-ops outside a multi-device step.
"""

import functools
from typing import Callable, Sequence

from flax import errors as flax_errors
import flax.linen as nn
import jax
import jax.numpy as jnp

from lnjax.core import sharding
from lnjax.models import kernels

# Large but finite, so that sums of masks stay finite.
NEG_INF = -1e9

# An activation constrained to its logical axes' mesh axes inside a jitted step on a mesh
# of several devices (lnjax/core/sharding.py); elsewhere the array itself.
constrain = sharding.constrain
BTD = ("batch", "length", "embed")  # The residual stream and every sub-layer's output.

# The paper's models (fairseq) use Xavier-uniform weights and zero biases.
xavier_uniform = nn.initializers.xavier_uniform()


def param(module: nn.Module, name: str, init: Callable, shape: Sequence[int],
          axes: Sequence[str | None]):
  """A float32 parameter that carries its logical axis names. One that exists (every apply)
  is read as flax's `Module.param` reads it (unboxed: its logical constraint applied) and
  its shape checked against `shape`: flax checks it by tracing the initializer
  (`jax.eval_shape`) for every parameter at every apply, 6% of the test suite's CPU time in
  its worker processes (py-spy, 2026-12-07)."""
  if module.has_variable("params", name):
    value = nn.meta.unbox(module.get_variable("params", name))
    if jnp.shape(value) != tuple(shape):
      raise flax_errors.ScopeParamShapeError(name, module.scope.path_text, jnp.shape(value),
                                             tuple(shape))
    return value
  return module.param(name, nn.with_logical_partitioning(init, tuple(axes)), tuple(shape),
                      jnp.float32)


# The FFN's (and BERT's MLM head's) non-linearity (`model.activation`): gelu is the tanh
# approximation (flax's nn.gelu; GPT-2's gelu_new), gelu_erf the exact x·Φ(x) (BERT's).
# silu is x·σ(x) (Swish; Llama's SwiGLU, Qwen3, OLMo 2).
ACTIVATIONS = {"relu": nn.relu, "gelu": nn.gelu,
               "gelu_erf": functools.partial(nn.gelu, approximate=False), "silu": nn.silu}

# How a dense layer's x W is differentiated (`model.weight_grad`).
MATMULS = {"autodiff": jnp.matmul, "transposed": kernels.matmul_transposed_grad}


class Dense(nn.Module):
  """y = x W + b on the last axis, as one 2-D matmul."""

  features: int
  axes: tuple[str, str]  # Logical names of W's (in, out) axes.
  use_bias: bool = True
  kernel_init: Callable = xavier_uniform
  dtype: jnp.dtype = jnp.float32
  weight_grad: str = "autodiff"  # A key of MATMULS (kernels.py's transposed-gradient matmul).

  @nn.compact
  def __call__(self, x_NxDin):
    d_in = x_NxDin.shape[-1]
    w = param(self, "kernel", self.kernel_init, (d_in, self.features), self.axes)
    y_MxDout = MATMULS[self.weight_grad](x_NxDin.reshape(-1, d_in).astype(self.dtype),
                                         w.astype(self.dtype))
    if self.use_bias:
      y_MxDout = y_MxDout + param(self, "bias", nn.initializers.zeros, (self.features,),
                                  self.axes[1:]).astype(self.dtype)
    return y_MxDout.reshape(*x_NxDin.shape[:-1], self.features)


class Attention(nn.Module):
  """Multi-head attention softmax(q kᵀ·s + bias) v, s = 1/√d_h; self-attention when kv is x.

  The block's options (`model.*`, docs/configs.md), all off by default:
    num_kv_heads  G key/value heads, each shared by H/G query heads (GQA, Ainslie et al.
                  2023, arXiv 2305.13245; G = 1: MQA, Shazeer 2019, arXiv 1911.02150);
                  0 = H. K and V are [D, G·d_h]; the decode cache keeps the G heads
    head_dim      d_h; 0 = D/H. Q is [D, H·d_h], W^O [H·d_h, D]
    query_scale   s; 0 = 1/√d_h (Gemma 2: query_pre_attn_scalar^-1/2)
    logit_softcap c: the logits q kᵀ·s become c·tanh(q kᵀ·s / c) before the mask
                  (Gemma 2, arXiv 2408.00118); 0 = off
    rope_theta    θ of rotary positions on each head's q and k after their norms
                  (`rope`; Su et al., arXiv 2104.09864); 0 = none (cross-attention)
  and, per call, `window` W > 0: a query at t sees keys |t - s| < W only (sliding-window
  attention, Beltagy et al. 2020, arXiv 2004.05150; Gemma 2's local layers), 0 = all.
  Options the norm placements use (lnjax/models/placement.py), all off by default:
    qk_norm     a norm factory (name -> module): each head's q and k normalized over d_h
                before q kᵀ/√d_h (ViT-22B's QK-LayerNorm, Dehghani et al. 2023,
                arXiv 2302.05442), one gain (and bias) of width d_h shared by the heads
    head_scale  NormFormer's HeadScaleMHA (Shleifer et al. 2021, arXiv 2110.09456, eq. 2):
                Concat(γ_1 h_1, ..., γ_H h_H) W^O, γ learned per head, init 1
    qk_init, vo_init  kernel initializers of the query/key and value/out projections
                (DeepNorm's β-scaled Xavier-normal on V and W^O)
    full_qk_norm  a norm factory: q and k normalized over all heads (width H·d_h) before
                they split into heads (OLMo 2, arXiv 2501.00656), one gain of width D each
    unit_qk     a factory of a module (q, k) -> (q, k) putting each head's q and k on the
                unit sphere (nGPT, arXiv 2410.01131); q kᵀ is then scaled by √d_h, not 1/√d_h
    v_norm      a norm factory: each head's v normalized over d_h, as qk_norm does q and k
                (HybridNorm's QKV-norm, arXiv 2503.04598)
  `attention_impl` (one of ATTENTION_IMPLS) picks the kernel of training and evaluation;
  incremental decoding always runs the plain one.
  """

  num_heads: int
  use_bias: bool = True
  dropout_rate: float = 0.0
  dtype: jnp.dtype = jnp.float32
  causal: bool = False  # bias masks every key after its query (skips those blocks).
  qk_norm: Callable | None = None
  head_scale: bool = False
  qk_init: Callable = xavier_uniform
  vo_init: Callable = xavier_uniform
  full_qk_norm: Callable | None = None
  unit_qk: Callable | None = None
  v_norm: Callable | None = None
  weight_grad: str = "autodiff"  # The projections' Dense.weight_grad.
  attention_impl: str = "plain"  # One of ATTENTION_IMPLS.
  num_kv_heads: int = 0  # G; 0 = num_heads.
  head_dim: int = 0  # d_h; 0 = D / num_heads.
  query_scale: float = 0.0  # s; 0 = d_h^-1/2.
  logit_softcap: float = 0.0  # c; 0 = off.
  rope_theta: float = 0.0  # θ; 0 = no rotary positions.

  @nn.compact
  def __call__(self, x_BxTxD, kv_BxSxD, bias_BxHxTxS, deterministic: bool, decode: bool = False,
               window=0):
    """`decode=True` (self-attention only) keeps the keys and values of past positions in
    the 'cache' collection: initialized by a call on a full-length input, then each call
    adds T=1 position and attends to every cached one. `window`: W (an int, or a traced
    one under nn.scan), 0 = no sliding window."""
    b, t, d = x_BxTxD.shape
    s = kv_BxSxD.shape[1]
    h, g = self.num_heads, self.num_kv_heads or self.num_heads
    k_h = self.head_dim or d // h
    dense = lambda width, name, axes, init: Dense(width, axes, self.use_bias, init, self.dtype,
                                                  self.weight_grad, name=name)

    def heads(y_BxSxHK, length, n):  # -> [B, n, S, d_h]
      return constrain(y_BxSxHK.reshape(b, length, n, k_h).transpose(0, 2, 1, 3),
                       ("batch", "heads", "length", "kv"))

    q_BxTxHK = dense(h * k_h, "query", ("embed", "heads"), self.qk_init)(x_BxTxD)
    k_BxSxGK = dense(g * k_h, "key", ("embed", "heads"), self.qk_init)(kv_BxSxD)
    if self.full_qk_norm is not None:
      q_BxTxHK = self.full_qk_norm(name="query_norm")(q_BxTxHK)
      k_BxSxGK = self.full_qk_norm(name="key_norm")(k_BxSxGK)
    q_BxHxTxK, k_BxGxSxK = heads(q_BxTxHK, t, h), heads(k_BxSxGK, s, g)
    v_BxGxSxK = heads(dense(g * k_h, "value", ("embed", "heads"), self.vo_init)(kv_BxSxD), s, g)
    if self.qk_norm is not None:
      q_BxHxTxK = self.qk_norm(name="query_norm")(q_BxHxTxK)
      k_BxGxSxK = self.qk_norm(name="key_norm")(k_BxGxSxK)
    if self.v_norm is not None:
      v_BxGxSxK = self.v_norm(name="value_norm")(v_BxGxSxK)
    offset = self._cache_index() if decode else 0  # Position of the first query.
    if self.rope_theta:  # (self-attention: q and k at the same positions)
      positions_T = offset + jnp.arange(t)
      q_BxHxTxK = rope(q_BxHxTxK, positions_T, self.rope_theta)
      k_BxGxSxK = rope(k_BxGxSxK, positions_T, self.rope_theta)
    if decode:
      k_BxGxSxK, v_BxGxSxK, bias_BxHxTxS = self._cached(k_BxGxSxK, v_BxGxSxK, bias_BxHxTxS)
    if not isinstance(window, int) or window:
      bias_BxHxTxS = bias_BxHxTxS + window_bias(offset + jnp.arange(t),
                                                jnp.arange(k_BxGxSxK.shape[2]), window)
    k_BxHxSxK, v_BxHxSxK = k_BxGxSxK, v_BxGxSxK
    if g != h:  # GQA: key/value head j serves query heads j·H/G ... (j+1)·H/G - 1
      k_BxHxSxK = jnp.repeat(k_BxGxSxK, h // g, axis=1)  # (transformers' repeat_kv order)
      v_BxHxSxK = jnp.repeat(v_BxGxSxK, h // g, axis=1)
    if self.unit_qk is not None:
      q_BxHxTxK, k_BxHxSxK = self.unit_qk(name="qk_scale")(q_BxHxTxK, k_BxHxSxK)
    scale = self.query_scale or k_h**-0.5
    q_BxHxTxK = q_BxHxTxK * (k_h**0.5 if self.unit_qk is not None else scale)
    if self.is_mutable_collection("intermediates") and not decode:
      # lnjax.core.health: the largest attention logit, masked entries excluded (Wortsman et
      # al. 2023, arXiv 2309.14322: its growth precedes attention-logit divergence). Only
      # when the train step asks for intermediates; the kernels keep their own logits.
      logits_BxHxTxS = kernels.softcap(jnp.einsum("bhtk,bhsk->bhts", q_BxHxTxK, k_BxHxSxK)
                                       .astype(jnp.float32), self.logit_softcap)
      self.sow("intermediates", "max_logit",
               jnp.max(jnp.where(bias_BxHxTxS > NEG_INF / 2, logits_BxHxTxS, -jnp.inf)))
    if deterministic or self.dropout_rate == 0.0 or self.attention_impl in ("xla", "cudnn"):
      # (xla and cudnn have no attention dropout: ModelConfig refuses it with them)
      out_BxHxTxK = kernels.attention(q_BxHxTxK, k_BxHxSxK, v_BxHxSxK, bias_BxHxTxS,
                                      impl="plain" if decode else self.attention_impl,
                                      causal=self.causal and not decode,
                                      logit_softcap=self.logit_softcap)
    else:  # Dropout on the attention probabilities, autodiff's backward pass.
      probs_BxHxTxS = kernels.attention_probs(q_BxHxTxK, k_BxHxSxK, bias_BxHxTxS,
                                              self.logit_softcap)
      probs_BxHxTxS = nn.Dropout(self.dropout_rate)(probs_BxHxTxS, deterministic=False)
      out_BxHxTxK = jnp.einsum("bhts,bhsk->bhtk", probs_BxHxTxS, v_BxHxSxK)
    if self.head_scale:
      gamma_H = param(self, "head_scale", nn.initializers.ones, (h,), ("norm",))
      out_BxHxTxK = out_BxHxTxK * gamma_H.astype(self.dtype)[None, :, None, None]
    out_BxTxHK = constrain(out_BxHxTxK.transpose(0, 2, 1, 3).reshape(b, t, h * k_h),
                           ("batch", "length", "heads"))
    return constrain(dense(d, "out", ("heads", "embed"), self.vo_init)(out_BxTxHK), BTD)

  def _cache_index(self):
    """The decode step's position: the cache's index once the cache exists, else 0."""
    if not self.has_variable("cache", "cache_index"):
      return 0
    return self.get_variable("cache", "cache_index")

  def _cached(self, k_BxGx1xK, v_BxGx1xK, bias):
    initialized = self.has_variable("cache", "cached_key")
    key = self.variable("cache", "cached_key", jnp.zeros, k_BxGx1xK.shape, k_BxGx1xK.dtype)
    value = self.variable("cache", "cached_value", jnp.zeros, v_BxGx1xK.shape, v_BxGx1xK.dtype)
    index = self.variable("cache", "cache_index", lambda: jnp.zeros((), jnp.int32))
    if not initialized:  # The call that sizes the cache: a plain forward pass.
      return k_BxGx1xK, v_BxGx1xK, bias
    i = index.value
    key.value = jax.lax.dynamic_update_slice(key.value, k_BxGx1xK, (0, 0, i, 0))
    value.value = jax.lax.dynamic_update_slice(value.value, v_BxGx1xK, (0, 0, i, 0))
    index.value = i + 1
    max_len = key.value.shape[2]
    visible_1x1x1xS = jnp.where(jnp.arange(max_len) <= i, 0.0, NEG_INF)[None, None, None, :]
    return key.value, value.value, visible_1x1x1xS


def rope(x_BxHxTxK, positions_T, theta: float):
  """Rotary position embedding (RoPE, Su et al. 2021, arXiv 2104.09864, eq. 34) in
  transformers' rotate_half layout: feature i < d_h/2 pairs with i + d_h/2, the pair
  rotated by the angle p·θ^(-2i/d_h) at position p:
    x·cos + rotate_half(x)·sin,   rotate_half(x) = [-x₂, x₁]  (x = [x₁, x₂], two halves)
  so that a rotated q at position m and k at n have q·k depending on m - n only."""
  k = x_BxHxTxK.shape[-1]
  inv_freq_K2 = theta ** (-jnp.arange(0, k, 2, dtype=jnp.float32) / k)
  angles_TxK = jnp.tile(positions_T.astype(jnp.float32)[:, None] * inv_freq_K2, 2)
  x = x_BxHxTxK.astype(jnp.float32)
  x1, x2 = x[..., : k // 2], x[..., k // 2:]
  rotated = jnp.concatenate([-x2, x1], axis=-1)
  return (x * jnp.cos(angles_TxK) + rotated * jnp.sin(angles_TxK)).astype(x_BxHxTxK.dtype)


def window_bias(query_positions_T, key_positions_S, window):
  """[1, 1, T, S] additive mask of a sliding window W: a large negative where the key is
  W or more positions from the query (|t - s| >= W: under a causal mask, t-W < s <= t
  stay visible); nothing where W = 0 (a global layer). `window` may be traced (one value
  per layer under nn.scan)."""
  too_far_TxS = jnp.abs(query_positions_T[:, None] - key_positions_S[None, :]) >= window
  return jnp.where(too_far_TxS & (window > 0), NEG_INF, 0.0)[None, None]


class Mlp(nn.Module):
  """FFN(x) = act(x W¹ + b¹) W² + b²; the paper's W¹ is 'wi', W² is 'wo'.

  `gated` (`model.gated_ffn`): FFN(x) = (act(x W_gate) ⊙ x W_up) W², parameters 'wi_gate',
  'wi_up', 'wo' (GLU variants, Shazeer 2020, arXiv 2002.05202: SwiGLU with act = SiLU,
  as Llama; GeGLU with act = GELU, as Gemma).
  `mid_norm` (a norm factory, name -> module) normalizes the F-wide hidden layer,
  W² N(act(x W¹ + b¹)) + b²: NormFormer's FFN LayerNorm (Shleifer et al. 2021).
  `pre_act` (a factory, name -> module) maps x W¹ + b¹ (gated: x W_gate) before the
  activation: nGPT's learned s_ν·√D (arXiv 2410.01131)."""

  d_ff: int
  activation: str = "relu"
  use_bias: bool = True
  dtype: jnp.dtype = jnp.float32
  mid_norm: Callable | None = None
  pre_act: Callable | None = None
  kernel_init: Callable = xavier_uniform
  weight_grad: str = "autodiff"  # The Dense layers' weight_grad.
  gated: bool = False

  @nn.compact
  def __call__(self, x_BxTxD):
    act = ACTIVATIONS[self.activation]
    dense = lambda width, axes, name: Dense(width, axes, self.use_bias, self.kernel_init,
                                            self.dtype, self.weight_grad, name=name)
    hidden = lambda y_BxTxF: constrain(y_BxTxF, ("batch", "length", "mlp"))
    h_BxTxF = hidden(dense(self.d_ff, ("embed", "mlp"),
                           "wi_gate" if self.gated else "wi")(x_BxTxD))
    if self.pre_act is not None:
      h_BxTxF = self.pre_act(name="hidden_scale")(h_BxTxF)
    h_BxTxF = act(h_BxTxF)
    if self.gated:
      h_BxTxF = h_BxTxF * hidden(dense(self.d_ff, ("embed", "mlp"), "wi_up")(x_BxTxD))
    if self.mid_norm is not None:
      h_BxTxF = self.mid_norm(name="mid_norm")(h_BxTxF)
    return constrain(dense(x_BxTxD.shape[-1], ("mlp", "embed"), "wo")(hidden(h_BxTxF)), BTD)


def causal_bias(t: int) -> jax.Array:
  """[1, 1, T, T] additive mask: 0 where key s <= query t, a large negative elsewhere."""
  allowed_TxT = jnp.tril(jnp.ones((t, t), dtype=bool))
  return jnp.where(allowed_TxT, 0.0, NEG_INF)[None, None]


def padding_bias(key_mask_BxS: jax.Array) -> jax.Array:
  """[B, 1, 1, S] additive mask hiding padded keys (mask 0)."""
  return jnp.where(key_mask_BxS[:, None, None, :] > 0, 0.0, NEG_INF)


def sinusoidal_positions(max_len: int, d: int) -> jax.Array:
  """[max_len, D] fixed positions of Vaswani et al. (sin on even, cos on odd features)."""
  pos_Lx1 = jnp.arange(max_len, dtype=jnp.float32)[:, None]
  inv_freq = jnp.exp(-jnp.log(10000.0) * jnp.arange(0, d, 2, dtype=jnp.float32) / d)
  angles_LxD2 = pos_Lx1 * inv_freq[None, :]
  pe = jnp.zeros((max_len, d), jnp.float32)
  pe = pe.at[:, 0::2].set(jnp.sin(angles_LxD2))
  return pe.at[:, 1::2].set(jnp.cos(angles_LxD2[:, : d // 2]))
