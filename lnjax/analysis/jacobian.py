"""Spectral norms of Jacobians by power iteration with jvp and vjp: no dense Jacobian.

For f: R^n -> R^m at x, ‖J‖₂ = √λ_max(JᵀJ); power iteration on v ↦ Jᵀ(J v) needs one
jvp and one vjp per step. The paper's use (§3, Lemma): LayerNorm's Jacobian at x has
‖J_LN(x)‖₂ ≈ √d / ‖x‖ (for zero-mean x), so a large input shrinks the gradient that
flows back through the norm.
"""

from typing import Callable

import jax
import jax.numpy as jnp


def spectral_norm(fn: Callable[[jax.Array], jax.Array], x: jax.Array, *, iters: int = 50,
                  seed: int = 0) -> jax.Array:
  """‖∂fn/∂x‖₂ at `x` (largest singular value), by `iters` power-iteration steps."""
  _, vjp = jax.vjp(fn, x)
  jvp = lambda v: jax.jvp(fn, (x,), (v,))[1]

  def step(v, _):
    w = vjp(jvp(v))[0]  # JᵀJ v
    return w / jnp.linalg.norm(w), None

  v0 = jax.random.normal(jax.random.key(seed), x.shape, x.dtype)
  v, _ = jax.lax.scan(step, v0 / jnp.linalg.norm(v0), None, length=iters)
  return jnp.linalg.norm(jvp(v))
