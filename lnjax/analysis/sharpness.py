r"""The loss's sharpness, raw and as Adam sees it: the largest eigenvalue of the Hessian H,
and of P⁻¹H with Adam's preconditioner P = diag(√v̂ + ε) (v̂: the bias-corrected second
moment in the optimizer state).

Adam with momentum β₁ is stable on a quadratic only while η · λ_max(P⁻¹H) < (2 + 2β₁)/(1 − β₁)
(38 at β₁ = 0.9), and full-batch Adam trains at that edge (Cohen et al., "Adaptive Gradient
Methods at the Edge of Stability", arXiv 2207.14484): `adam_edge` is the rate that sets
the measured sharpness at that threshold.

  lam = hessian_top(loss, params, iters=20)                      # λ_max(H)
  lam_p = hessian_top(loss, params, precond=adam_precond(...))   # λ_max(P⁻¹H)

Both by power iteration on Hessian-vector products (forward over reverse: one HVP costs
about two gradients); P⁻¹H is iterated as its symmetric similar P^-½ H P^-½.
"""

import jax
import jax.numpy as jnp
import optax


def adam_threshold(b1: float) -> float:
  """(2 + 2β₁)/(1 − β₁): the largest η·λ_max(P⁻¹H) at which Adam is stable (38 at 0.9)."""
  return (2 + 2 * b1) / (1 - b1)


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


def hessian_top(loss_fn, params, *, precond=None, iters: int = 20, seed: int = 0):
  """λ_max of loss_fn's Hessian at `params` (of P⁻¹H where `precond` is P's diagonal, a tree
  shaped as `params`) by `iters` power iterations; returns (λ, the Rayleigh quotients
  iteration by iteration, for a look at convergence)."""
  scale = jax.tree.map(lambda p: jnp.ones_like(p), params) if precond is None else (
      jax.tree.map(lambda p: jax.lax.rsqrt(p), precond))

  @jax.jit
  def apply(v):  # S v, S = P^-½ H P^-½ (H itself where P = I).
    tangent = jax.tree.map(jnp.multiply, scale, v)
    _, hv = jax.jvp(jax.grad(loss_fn), (params,), (tangent,))
    return jax.tree.map(jnp.multiply, scale, hv)

  leaves, tree = jax.tree.flatten(params)
  keys = jax.random.split(jax.random.key(seed), len(leaves))
  v = jax.tree.unflatten(tree, [jax.random.normal(k, x.shape, x.dtype)
                                for k, x in zip(keys, leaves)])
  quotients = []
  for _ in range(iters):
    v = jax.tree.map(lambda x: x / optax.tree.norm(v), v)
    sv = apply(v)
    quotients.append(float(sum(jnp.vdot(a, b) for a, b in zip(
        jax.tree.leaves(v), jax.tree.leaves(sv)))))
    v = sv
  return quotients[-1], quotients
