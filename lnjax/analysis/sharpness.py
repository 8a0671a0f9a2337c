r"""The loss's sharpness, raw and as Adam sees it: the largest eigenvalue of the Hessian H,
and of P⁻¹H with Adam's preconditioner P = (1 − β₁ᵗ) diag(√v̂ + ε) after t updates (v̂: the
bias-corrected second moment in the optimizer state; 1 − β₁ᵗ: the first moment's correction,
which divides the update, m_t / (1 − β₁ᵗ), as P's diagonal does — Cohen et al.'s P_t).

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
import scipy.linalg
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


def _first_state(opt_state, kinds):
  """The first of `opt_state`'s transforms' states that is one of `kinds`, else None."""
  found = [s for s in jax.tree.leaves(opt_state, is_leaf=lambda s: isinstance(s, kinds))
           if isinstance(s, kinds)]
  return found[0] if found else None


def adam_state(opt_state) -> optax.ScaleByAdamState | None:
  """The (first) ScaleByAdamState in `opt_state`; None for an optimizer without one."""
  return _first_state(opt_state, optax.ScaleByAdamState)


def update_count(opt_state, step: int) -> int:
  """The optimizer's own count of updates (Adam's, or its schedule's): the training step
  counts skipped steps too (`train.on_instability=skip` leaves the optimizer state as it
  was), the schedule and the bias corrections do not. `step` where the state keeps none."""
  counted = _first_state(opt_state, (optax.ScaleByAdamState, optax.ScaleByScheduleState))
  return int(counted.count) if counted is not None else step


def adam_precond(opt_state, b1: float, b2: float, eps: float):
  """(1 − β₁ᵗ)(√v̂ + ε), a tree shaped as the parameters, from the (first) ScaleByAdamState in
  `opt_state`, t its own count of updates (not the training step: a skipped step leaves it
  as it was)."""
  adam = adam_state(opt_state)
  if adam is None:
    raise ValueError("the optimizer state holds no Adam second moment (optimizer not Adam?)")
  count = int(adam.count)
  if count < 1:
    raise ValueError("Adam's preconditioner needs at least one update (its count is 0)")
  # A coordinate whose second moment is 0 never had a gradient: Adam has not moved it, and
  # ε alone would stand for its √v̂ (λ inflated by up to 1/ε, e.g. the embedding row of a
  # token absent from the training batches). P = ∞ there leaves it out of P⁻¹H.
  return jax.tree.map(lambda nu: jnp.where(
      nu > 0, (1 - b1 ** count) * (jnp.sqrt(nu / (1 - b2 ** count)) + eps), jnp.inf), adam.nu)


@functools.lru_cache(maxsize=2)  # The loss of the checkpoint measured: H and P⁻¹H share it.
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
  both ends of the spectrum in a few tens of products (Ghorbani et al., arXiv 1901.10159).
  Its basis is one (iters, parameters) buffer, allocated once."""
  if iters < 1:
    raise ValueError(f"hessian_top needs at least one Lanczos iteration, not {iters}")
  flat, _ = ravel_pytree(params)
  scale = jnp.ones_like(flat) if precond is None else jax.lax.rsqrt(ravel_pytree(precond)[0])
  apply = _hvp(loss_fn)
  steps = min(iters, flat.size)
  try:
    basis = jnp.zeros((steps, flat.size), flat.dtype)
    q = jax.random.normal(jax.random.key(seed), flat.shape, flat.dtype)
    q = q / jnp.linalg.norm(q)
    alphas, betas, estimates = [], [], []
    for k in range(steps):
      basis = _store(basis, k, q)
      w = apply(params, scale, q)
      alphas.append(float(jnp.vdot(q, w)))
      w = _orthogonalize(basis, w)
      estimates.append(float(scipy.linalg.eigvalsh_tridiagonal(
          np.asarray(alphas), np.asarray(betas), select="i", select_range=(k, k))[0]))
      beta = float(jnp.linalg.norm(w))
      if beta <= 1e-6 * max(abs(a) for a in alphas):  # An invariant subspace: exact.
        break
      betas.append(beta)
      q = w / beta
  except jax.errors.JaxRuntimeError as e:
    if "RESOURCE_EXHAUSTED" not in str(e):
      raise
    raise MemoryError(f"{steps} Lanczos vectors of {flat.size:,} parameters "
                      f"({steps * flat.size * flat.dtype.itemsize / 2**30:.1f} GiB) and the "
                      "Hessian-vector product do not fit in the device's memory: fewer "
                      "iterations") from None
  return estimates[-1], estimates


@functools.partial(jax.jit, donate_argnums=0)
def _store(basis, k, q):
  return basis.at[k].set(q)


@jax.jit
def _orthogonalize(basis, w):
  """w without its components along the basis's rows (rows not yet filled are zero):
  twice, as one pass leaves round-off in the directions found."""
  w = w - basis.T @ (basis @ w)
  return w - basis.T @ (basis @ w)
