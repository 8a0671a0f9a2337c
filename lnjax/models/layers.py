"""Dense, attention and feed-forward layers with logical axis names for sharding.

Activations stay [B, T, D] at module boundaries; every dense layer runs as one plain
[B·T, D_in] × [D_in, D_out] matmul, and only attention reshapes to heads, head-major
([B, H, T, d_h]), so XLA sees large 2-D matmuls rather than batched small ones.
Logical axis names (mapped to mesh axes in lnjax/core/sharding.py):
  'vocab' V, 'embed' D, 'heads' H·d_h, 'mlp' F, 'norm' a norm's D.
"""

import functools
from typing import Callable, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp

from lnjax.models import kernels

# Large but finite, so that sums of masks stay finite.
NEG_INF = -1e9

# The paper's models (fairseq) use Xavier-uniform weights and zero biases.
xavier_uniform = nn.initializers.xavier_uniform()


def param(module: nn.Module, name: str, init: Callable, shape: Sequence[int],
          axes: Sequence[str | None]):
  """A float32 parameter that carries its logical axis names."""
  return module.param(name, nn.with_logical_partitioning(init, tuple(axes)), tuple(shape),
                      jnp.float32)


# The FFN's (and BERT's MLM head's) non-linearity (`model.activation`): gelu is the tanh
# approximation (flax's nn.gelu; GPT-2's gelu_new), gelu_erf the exact x·Φ(x) (BERT's).
ACTIVATIONS = {"relu": nn.relu, "gelu": nn.gelu,
               "gelu_erf": functools.partial(nn.gelu, approximate=False)}

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
  """Multi-head attention softmax(q kᵀ/√d_h + bias) v; self-attention when kv is x.

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
  weight_grad: str = "autodiff"  # The projections' Dense.weight_grad.
  attention_impl: str = "plain"  # One of ATTENTION_IMPLS.

  @nn.compact
  def __call__(self, x_BxTxD, kv_BxSxD, bias_BxHxTxS, deterministic: bool, decode: bool = False):
    """`decode=True` (self-attention only) keeps the keys and values of past positions in
    the 'cache' collection: initialized by a call on a full-length input, then each call
    adds T=1 position and attends to every cached one."""
    b, t, d = x_BxTxD.shape
    s = kv_BxSxD.shape[1]
    h = self.num_heads
    dense = lambda name, axes, init: Dense(d, axes, self.use_bias, init, self.dtype,
                                           self.weight_grad, name=name)

    def heads(y_BxSxD, length):  # -> [B, H, S, d_h]
      return y_BxSxD.reshape(b, length, h, d // h).transpose(0, 2, 1, 3)

    q_BxTxD = dense("query", ("embed", "heads"), self.qk_init)(x_BxTxD)
    k_BxSxD = dense("key", ("embed", "heads"), self.qk_init)(kv_BxSxD)
    if self.full_qk_norm is not None:
      q_BxTxD = self.full_qk_norm(name="query_norm")(q_BxTxD)
      k_BxSxD = self.full_qk_norm(name="key_norm")(k_BxSxD)
    q_BxHxTxK, k_BxHxSxK = heads(q_BxTxD, t), heads(k_BxSxD, s)
    v_BxHxSxK = heads(dense("value", ("embed", "heads"), self.vo_init)(kv_BxSxD), s)
    if self.qk_norm is not None:
      q_BxHxTxK = self.qk_norm(name="query_norm")(q_BxHxTxK)
      k_BxHxSxK = self.qk_norm(name="key_norm")(k_BxHxSxK)
    if self.unit_qk is not None:
      q_BxHxTxK, k_BxHxSxK = self.unit_qk(name="qk_scale")(q_BxHxTxK, k_BxHxSxK)
    if decode:
      k_BxHxSxK, v_BxHxSxK, bias_BxHxTxS = self._cached(k_BxHxSxK, v_BxHxSxK, bias_BxHxTxS)
    q_BxHxTxK = q_BxHxTxK * (d // h) ** (0.5 if self.unit_qk is not None else -0.5)
    if self.is_mutable_collection("intermediates") and not decode:
      # lnjax.core.health: the largest attention logit, masked entries excluded (Wortsman et
      # al. 2023, arXiv 2309.14322: its growth precedes attention-logit divergence). Only
      # when the train step asks for intermediates; the kernels keep their own logits.
      logits_BxHxTxS = jnp.einsum("bhtk,bhsk->bhts", q_BxHxTxK, k_BxHxSxK).astype(jnp.float32)
      self.sow("intermediates", "max_logit",
               jnp.max(jnp.where(bias_BxHxTxS > NEG_INF / 2, logits_BxHxTxS, -jnp.inf)))
    if deterministic or self.dropout_rate == 0.0 or self.attention_impl in ("xla", "cudnn"):
      # (xla and cudnn have no attention dropout: ModelConfig refuses it with them)
      out_BxHxTxK = kernels.attention(q_BxHxTxK, k_BxHxSxK, v_BxHxSxK, bias_BxHxTxS,
                                      impl="plain" if decode else self.attention_impl,
                                      causal=self.causal and not decode)
    else:  # Dropout on the attention probabilities, autodiff's backward pass.
      probs_BxHxTxS = kernels.attention_probs(q_BxHxTxK, k_BxHxSxK, bias_BxHxTxS)
      probs_BxHxTxS = nn.Dropout(self.dropout_rate)(probs_BxHxTxS, deterministic=False)
      out_BxHxTxK = jnp.einsum("bhts,bhsk->bhtk", probs_BxHxTxS, v_BxHxSxK)
    if self.head_scale:
      gamma_H = param(self, "head_scale", nn.initializers.ones, (h,), ("norm",))
      out_BxHxTxK = out_BxHxTxK * gamma_H.astype(self.dtype)[None, :, None, None]
    out_BxTxD = out_BxHxTxK.transpose(0, 2, 1, 3).reshape(b, t, d)
    return dense("out", ("heads", "embed"), self.vo_init)(out_BxTxD)

  def _cached(self, k_BxHx1xK, v_BxHx1xK, bias):
    initialized = self.has_variable("cache", "cached_key")
    key = self.variable("cache", "cached_key", jnp.zeros, k_BxHx1xK.shape, k_BxHx1xK.dtype)
    value = self.variable("cache", "cached_value", jnp.zeros, v_BxHx1xK.shape, v_BxHx1xK.dtype)
    index = self.variable("cache", "cache_index", lambda: jnp.zeros((), jnp.int32))
    if not initialized:  # The call that sizes the cache: a plain forward pass.
      return k_BxHx1xK, v_BxHx1xK, bias
    i = index.value
    key.value = jax.lax.dynamic_update_slice(key.value, k_BxHx1xK, (0, 0, i, 0))
    value.value = jax.lax.dynamic_update_slice(value.value, v_BxHx1xK, (0, 0, i, 0))
    index.value = i + 1
    max_len = key.value.shape[2]
    visible_1x1x1xS = jnp.where(jnp.arange(max_len) <= i, 0.0, NEG_INF)[None, None, None, :]
    return key.value, value.value, visible_1x1x1xS


class Mlp(nn.Module):
  """FFN(x) = act(x W¹ + b¹) W² + b²; the paper's W¹ is 'wi', W² is 'wo'.

  `mid_norm` (a norm factory, name -> module) normalizes the F-wide hidden layer,
  W² N(act(x W¹ + b¹)) + b²: NormFormer's FFN LayerNorm (Shleifer et al. 2021).
  `pre_act` (a factory, name -> module) maps x W¹ + b¹ before the activation: nGPT's
  learned s_ν·√D (arXiv 2410.01131)."""

  d_ff: int
  activation: str = "relu"
  use_bias: bool = True
  dtype: jnp.dtype = jnp.float32
  mid_norm: Callable | None = None
  pre_act: Callable | None = None
  kernel_init: Callable = xavier_uniform
  weight_grad: str = "autodiff"  # W¹'s and W²'s Dense.weight_grad.

  @nn.compact
  def __call__(self, x_BxTxD):
    act = ACTIVATIONS[self.activation]
    h_BxTxF = Dense(self.d_ff, ("embed", "mlp"), self.use_bias, self.kernel_init,
                    self.dtype, self.weight_grad, name="wi")(x_BxTxD)
    if self.pre_act is not None:
      h_BxTxF = self.pre_act(name="hidden_scale")(h_BxTxF)
    h_BxTxF = act(h_BxTxF)
    if self.mid_norm is not None:
      h_BxTxF = self.mid_norm(name="mid_norm")(h_BxTxF)
    return Dense(x_BxTxD.shape[-1], ("mlp", "embed"), self.use_bias, self.kernel_init,
                 self.dtype, self.weight_grad, name="wo")(h_BxTxF)


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
