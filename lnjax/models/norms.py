"""Normalization layers over the last axis (D), written out so the formula is visible.

Statistics are computed in float32 whatever the compute dtype, and LayerNorm's variance
in two passes (mean first, then the mean square of the centred input): the one-pass
E[x²] - E[x]² form loses precision and, on XLA:CPU, is also slower here.

Each norm states the Jacobian reference that `lnjax analyze` sets beside its measured
‖J(x)‖₂ (analysis/probes.py, ln_jacobians): d^radius_power/‖x − μ‖, the unit-gain norm's
‖J‖₂ (its output on the sphere of radius d^radius_power), μ the mean of x if `centred`, else
0. A point-wise norm (DyT, Derf) has no such form: it states LayerNorm's, the norm it
stands in for, and its own ‖J‖₂ is measured beside that.
"""

from typing import ClassVar

import flax.linen as nn
import jax
import jax.numpy as jnp

from lnjax.models import layers


def gain(module: nn.Module, d: int, unit_offset: bool):
  """A norm's per-dimension gain γ (parameter 'scale'): stored as is, init 1; or, with
  `unit_offset` (`model.norm_unit_offset`), stored as w, init 0, and applied as 1 + w
  (Gemma's RMSNorm; transformers' Gemma2RMSNorm), so that weight decay pulls γ towards 1."""
  if unit_offset:
    return 1.0 + layers.param(module, "scale", nn.initializers.zeros, (d,), ("norm",))
  return layers.param(module, "scale", nn.initializers.ones, (d,), ("norm",))


class LayerNorm(nn.Module):
  """LN(x) = (x - μ) / √(σ² + ε) ⊙ γ + β  (Ba et al., 2016)."""

  centred: ClassVar[bool] = True  # ‖J‖₂ = √d/‖x − μ‖ (Xiong et al. 2020, §3.3)
  radius_power: ClassVar[float] = 0.5

  eps: float = 1e-5
  dtype: jnp.dtype = jnp.float32
  unit_offset: bool = False  # γ applied as 1 + w (`gain`).

  @nn.compact
  def __call__(self, x_BxTxD):
    d = x_BxTxD.shape[-1]
    gamma_D = gain(self, d, self.unit_offset)
    beta_D = layers.param(self, "bias", nn.initializers.zeros, (d,), ("norm",))
    x = x_BxTxD.astype(jnp.float32)
    mean = x.mean(-1, keepdims=True)
    centred = x - mean
    var = jnp.mean(centred * centred, -1, keepdims=True)
    y = centred * jnp.reciprocal(jnp.sqrt(var + self.eps)) * gamma_D + beta_D
    return y.astype(self.dtype)


class RMSNorm(nn.Module):
  """RMSNorm(x) = x / √(mean(x²) + ε) ⊙ g  (Zhang & Sennrich, arXiv 1910.07467): no bias.
  With `unit_offset`, g = 1 + w (Gemma's)."""

  centred: ClassVar[bool] = False  # J = (√d/‖x‖)(I − x̂x̂ᵀ): no mean taken off
  radius_power: ClassVar[float] = 0.5

  eps: float = 1e-6
  dtype: jnp.dtype = jnp.float32
  unit_offset: bool = False  # g applied as 1 + w (`gain`).

  @nn.compact
  def __call__(self, x_BxTxD):
    d = x_BxTxD.shape[-1]
    g_D = gain(self, d, self.unit_offset)
    x = x_BxTxD.astype(jnp.float32)
    ms = jnp.mean(x * x, -1, keepdims=True)
    return (x * jnp.reciprocal(jnp.sqrt(ms + self.eps)) * g_D).astype(self.dtype)


class ScaleNorm(nn.Module):
  """ScaleNorm(x) = g · x / max(‖x‖, ε)  (Nguyen & Salazar, arXiv 1910.05895): one scalar
  gain g, initialized to √D (so that the output has ‖y‖²/D = 1 at init, as LN's)."""

  centred: ClassVar[bool] = False  # J = (g/‖x‖)(I − x̂x̂ᵀ), g = √d at init
  radius_power: ClassVar[float] = 0.5

  eps: float = 1e-5
  dtype: jnp.dtype = jnp.float32

  @nn.compact
  def __call__(self, x_BxTxD):
    d = x_BxTxD.shape[-1]
    g = layers.param(self, "scale", nn.initializers.constant(d**0.5), (), ())
    x = x_BxTxD.astype(jnp.float32)
    norm = jnp.sqrt(jnp.sum(x * x, -1, keepdims=True))
    return (x * (g / jnp.maximum(norm, self.eps))).astype(self.dtype)


def pointwise(module: nn.Module, x_BxTxD, f):
  """γ ⊙ f(α·x) + β, the statistics-free norms' shape (DyT, Derf): α one learned scalar
  (parameter 'alpha', init `module.alpha_init`), γ (`gain`) and β per dimension."""
  d = x_BxTxD.shape[-1]
  alpha = layers.param(module, "alpha", nn.initializers.constant(module.alpha_init), (), ())
  gamma_D = gain(module, d, module.unit_offset)
  beta_D = layers.param(module, "bias", nn.initializers.zeros, (d,), ("norm",))
  return (f(alpha * x_BxTxD.astype(jnp.float32)) * gamma_D + beta_D).astype(module.dtype)


class DyT(nn.Module):
  """DyT(x) = γ ⊙ tanh(α·x) + β  (Dynamic Tanh, Zhu et al. 2025, arXiv 2503.10622, eq. 1):
  no statistics; α one learned scalar, init `alpha_init` (the paper's α₀: 0.5 by default;
  for its LLaMA models smaller and width-dependent, larger on the attention block's DyT
  than on the others), γ init 1 and β init 0 per dimension."""

  centred: ClassVar[bool] = True  # Point-wise: LayerNorm's reference (module docstring).
  radius_power: ClassVar[float] = 0.5

  alpha_init: float = 0.5
  dtype: jnp.dtype = jnp.float32
  unit_offset: bool = False  # γ applied as 1 + w (`gain`).

  @nn.compact
  def __call__(self, x_BxTxD):
    return pointwise(self, x_BxTxD, jnp.tanh)


class Derf(nn.Module):
  """Derf(x) = γ ⊙ erf(α·x + s) + β  (Dynamic erf, Chen et al. 2025, arXiv 2512.10938,
  eq. 10; zlab-princeton/Derf's Dynamic_erf): DyT's successor, no statistics; α and the
  shift s one learned scalar each, init `alpha_init` (the code's default 0.5; its GPT-2
  runs 1.0) and 0; γ init 1 and β init 0 per dimension."""

  centred: ClassVar[bool] = True  # As DyT's: LayerNorm's reference.
  radius_power: ClassVar[float] = 0.5

  alpha_init: float = 0.5
  dtype: jnp.dtype = jnp.float32
  unit_offset: bool = False  # γ applied as 1 + w (`gain`).

  @nn.compact
  def __call__(self, x_BxTxD):
    shift = layers.param(self, "shift", nn.initializers.zeros, (), ())
    return pointwise(self, x_BxTxD, lambda ax: jax.scipy.special.erf(ax + shift))


def unit(x, axis: int = -1):
  """x / ‖x‖ along `axis`: nGPT's Norm (Loshchilov et al. 2024, arXiv 2410.01131), which
  puts hidden states, q, k and weight rows on the unit sphere; no ε, as in nGPT."""
  x32 = x.astype(jnp.float32)
  return (x32 / jnp.sqrt(jnp.sum(x32 * x32, axis, keepdims=True))).astype(x.dtype)


class Unit(nn.Module):
  """`unit` as a module without parameters, along the last axis: nGPT's Norm where it
  normalizes the residual stream, q and k, so that the analysis finds it as a norm."""

  centred: ClassVar[bool] = False  # J = (I − x̂x̂ᵀ)/‖x‖: the unit sphere, no √d
  radius_power: ClassVar[float] = 0.0

  @nn.compact
  def __call__(self, x):
    return unit(x)


NORMS = {"layernorm": LayerNorm, "rmsnorm": RMSNorm, "scalenorm": ScaleNorm}
NORM_KINDS = tuple(NORMS)
# Every norm module a model may hold: model.norm_kind's and the point-wise DyT and Derf
# (norm_position dyt, derf) and nGPT's x/‖x‖, which the analysis finds by their calls.
MODULES = (*NORMS.values(), DyT, Derf, Unit)


def make_norm(kind: str, eps: float, dtype, name: str | None = None,
              unit_offset: bool = False) -> nn.Module:
  """One norm of `kind`; the valid kinds are checked by ModelConfig (which refuses
  `unit_offset` with ScaleNorm's scalar gain)."""
  if kind not in NORMS:
    raise ValueError(f"model.norm_kind={kind!r} is not one of: {', '.join(NORM_KINDS)}")
  if unit_offset:
    return NORMS[kind](eps=eps, dtype=dtype, unit_offset=True, name=name)
  return NORMS[kind](eps=eps, dtype=dtype, name=name)
