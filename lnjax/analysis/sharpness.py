r"""The loss's sharpness, raw and as Adam sees it: the largest eigenvalue of the Hessian H,
and of P⁻¹H with Adam's preconditioner P = diag(√v̂ + ε) (v̂: the bias-corrected second
moment in the optimizer state).

Adam with momentum β₁ is stable on a quadratic only while η · λ_max(P⁻¹H) < (2 + 2β₁)/(1 − β₁)
(38 at β₁ = 0.9), and full-batch Adam trains at that edge (Cohen et al., "Adaptive Gradient
Methods at the Edge of Stability", arXiv 2207.14484): `adam_edge` is the rate that sets
the measured sharpness at that threshold. SGD has no preconditioner: λ_max(H) against
`sgd_threshold`.

  lam = hessian_top(loss, params, iters=20)                      # λ_max(H)
  lam_p = hessian_top(loss, params, precond=adam_precond(...))   # λ_max(P⁻¹H)

Both by Lanczos iterations on Hessian-vector products (forward over reverse: one product
costs about two gradients); P⁻¹H is iterated as its symmetric similar P^-½ H P^-½.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.flatten_util import ravel_pytree


def adam_threshold(b1: float) -> float:
  """(2 + 2β₁)/(1 − β₁): the largest η·λ_max(P⁻¹H) at which Adam is stable (38 at 0.9)."""
  return (2 + 2 * b1) / (1 - b1)


def sgd_threshold(momentum: float, nesterov: bool = False) -> float:
  """The largest η·λ_max(H) at which SGD is stable on a quadratic: 2 without momentum,
  2 + 2β with heavy-ball momentum β (optax.sgd's trace), (2 + 2β)/(1 + 2β) with Nesterov's
  (Cohen et al., "Gradient Descent on Neural Networks Typically Occurs at the Edge of
  Stability", arXiv 2103.00065)."""
  return (2 + 2 * momentum) / (1 + 2 * momentum) if nesterov else 2 + 2 * momentum


def adam_edge(sharpness: float, b1: float) -> float:
  """The learning rate at which `sharpness` (λ_max(P⁻¹H)) meets Adam's threshold."""
  return adam_threshold(b1) / sharpness


def adam_precond(opt_state, step: int, b2: float, eps: float):
  """√v̂ + ε, a tree shaped as the parameters, from the (first) ScaleByAdamState in
  `opt_state` after `step` updates."""
  adam = [s for s in jax.tree.leaves(opt_state, is_leaf=lambda s: isinstance(
      s, optax.ScaleByAdamState)) if isinstance(s, optax.ScaleByAdamState)]
  if not adam:
    raise ValueError("the optimizer state holds no Adam second moment (optimizer not Adam?)")
  if step < 1:
    raise ValueError("Adam's preconditioner needs at least one update (step >= 1)")
  return jax.tree.map(lambda nu: jnp.sqrt(nu / (1 - b2 ** step)) + eps, adam[0].nu)


@functools.lru_cache(maxsize=8)
def _hvp(loss_fn):
  """(params, scale, v) -> S v with S = diag(scale) H diag(scale), v flat: one program per
  loss for every preconditioner (H's and P⁻¹H's Lanczos share it), the parameters its
  arguments rather than constants folded into it."""

  def apply(params, scale, v):
    _, unravel = ravel_pytree(params)
    _, hv = jax.jvp(jax.grad(loss_fn), (params,), (unravel(scale * v),))
    return scale * ravel_pytree(hv)[0]

  return jax.jit(apply)


def hessian_top(loss_fn, params, *, precond=None, iters: int = 20, seed: int = 0):
  """The largest eigenvalue of loss_fn's Hessian at `params` (of P⁻¹H where `precond` is P's
  diagonal, a tree shaped as `params`) after `iters` Lanczos iterations; returns (λ, the
  estimate iteration by iteration, for a look at convergence).

  Lanczos (with full reorthogonalization) rather than power iteration: the largest
  eigenvalue, not the largest in magnitude, which a negative one can be at a saddle, and
  both ends of the spectrum in a few tens of products (Ghorbani et al., arXiv 1901.10159)."""
  flat, _ = ravel_pytree(params)
  scale = jnp.ones_like(flat) if precond is None else jax.lax.rsqrt(ravel_pytree(precond)[0])
  apply = _hvp(loss_fn)

  q = jax.random.normal(jax.random.key(seed), flat.shape, flat.dtype)
  basis, alphas, betas, estimates = [], [], [], []
  q = q / jnp.linalg.norm(q)
  for _ in range(min(iters, flat.size)):
    basis.append(q)
    w = apply(params, scale, q)
    alphas.append(float(jnp.vdot(q, w)))
    found = jnp.stack(basis)  # (Twice: one pass leaves round-off in the directions found.)
    w = w - found.T @ (found @ w)
    w = w - found.T @ (found @ w)
    tridiagonal = np.diag(alphas) + np.diag(betas, 1) + np.diag(betas, -1)
    estimates.append(float(np.linalg.eigvalsh(tridiagonal)[-1]))
    beta = float(jnp.linalg.norm(w))
    if beta <= 1e-6 * max(abs(a) for a in alphas):  # An invariant subspace: exact.
      break
    betas.append(beta)
    q = w / beta
  return estimates[-1], estimates
