"""lnjax/analysis/sharpness.py against closed forms: a quadratic's Hessian is its matrix,
P⁻¹H's eigenvalues a diagonal quadratic's entries over P's, Adam's threshold (2 + 2β₁)/(1 − β₁)
(Cohen et al., arXiv 2207.14484) and its preconditioner against optax's own update."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from hypothesis import given, settings, strategies as st

from lnjax.analysis import sharpness


def quadratic(matrix):
  return lambda p: 0.5 * p["w"] @ matrix @ p["w"]


@settings(max_examples=10, deadline=None)
@given(st.integers(0, 2**31 - 1))
def test_the_top_eigenvalue_of_a_quadratics_hessian_is_its_matrixs(seed):
  rng = np.random.default_rng(seed)
  q, _ = np.linalg.qr(rng.normal(size=(5, 5)))
  eigs = np.array([4.0, 1.0, 0.5, -0.25, 0.1])  # A clear top eigenvalue, one negative.
  matrix = jnp.asarray(q @ np.diag(eigs) @ q.T, jnp.float32)
  lam, quotients = sharpness.hessian_top(quadratic(matrix), {"w": jnp.ones(5)}, iters=60,
                                          seed=seed)
  assert lam == pytest.approx(4.0, rel=1e-4) and len(quotients) == 5


def test_a_few_iterations_find_a_separated_top_eigenvalue_of_a_large_spectrum():
  h = jnp.concatenate([jnp.array([50.0, 20.0]), jnp.linspace(-3.0, 5.0, 998)])
  lam, estimates = sharpness.hessian_top(quadratic(jnp.diag(h)), {"w": jnp.ones(1000)}, iters=20)
  assert lam == pytest.approx(50.0, rel=1e-4) and len(estimates) == 20
  assert all(a <= b + 1e-3 for a, b in zip(estimates, estimates[1:]))  # Ritz values rise.


def test_the_preconditioned_eigenvalue_is_the_largest_entry_over_ps():
  h = jnp.array([3.0, 1.0, 0.5, 7.0])
  p = jnp.array([1.0, 0.05, 1.0, 2.0])  # P⁻¹H: 3, 20, 0.5, 3.5.
  lam, _ = sharpness.hessian_top(quadratic(jnp.diag(h)), {"w": jnp.ones(4)},
                                 precond={"w": p}, iters=60)
  assert lam == pytest.approx(20.0, rel=1e-4)
  raw, _ = sharpness.hessian_top(quadratic(jnp.diag(h)), {"w": jnp.ones(4)}, iters=60)
  assert raw == pytest.approx(7.0, rel=1e-4)


@pytest.mark.parametrize("momentum, nesterov", [(0.0, False), (0.5, False), (0.9, False),
                                                (0.5, True), (0.9, True)])
def test_sgds_threshold_is_where_optaxs_sgd_stops_converging_on_a_quadratic(momentum, nesterov):
  """optax.sgd on f(x) = λx²/2 (λ = 3): at 0.97× the threshold's rate x shrinks, at 1.03× it
  grows: 2/λ plain, (2 + 2β)/λ heavy-ball, (2 + 2β)/((1 + 2β)λ) Nesterov."""
  lam = 3.0
  edge = sharpness.sgd_threshold(momentum, nesterov) / lam

  def final(lr):
    opt = optax.sgd(lr, momentum=momentum or None, nesterov=nesterov)

    def step(_, carry):
      x, state = carry
      update, state = opt.update(lam * x, state)
      return x + update, state

    x = jnp.ones(())
    x, _ = jax.jit(lambda c: jax.lax.fori_loop(0, 300, step, c))((x, opt.init(x)))
    return abs(float(x))

  assert final(0.97 * edge) < 1e-2 and not final(1.03 * edge) < 1e2  # Grown, or overflowed.


def test_adams_threshold_and_edge():
  assert sharpness.adam_threshold(0.9) == pytest.approx(38.0)
  assert sharpness.adam_threshold(0.0) == pytest.approx(2.0)  # Gradient descent's 2/η.
  assert sharpness.adam_edge(380.0, 0.9) == pytest.approx(0.1)


def test_adams_preconditioner_is_the_bias_corrected_root_of_its_second_moment():
  b1, b2, eps = 0.9, 0.98, 1e-8
  tx = optax.chain(optax.clip_by_global_norm(1.0), optax.adam(1e-3, b1=b1, b2=b2, eps=eps))
  params = {"w": jnp.ones(3)}
  state = tx.init(params)
  grads = [jnp.array([0.1, -0.2, 0.3]), jnp.array([0.2, 0.0, -0.1])]
  for g in grads:
    _, state = tx.update({"w": g}, state, params)
  nu = (1 - b2) * (b2 * grads[0] ** 2 + grads[1] ** 2)
  want = (1 - b1 ** 2) * (np.sqrt(nu / (1 - b2 ** 2)) + eps)
  np.testing.assert_allclose(sharpness.adam_precond(state, b1, b2, eps)["w"], want, rtol=1e-6)
  with pytest.raises(ValueError, match="at least one update"):
    sharpness.adam_precond(tx.init(params), b1, b2, eps)
  with pytest.raises(ValueError, match="no Adam second moment"):
    sharpness.adam_precond(optax.sgd(0.1).init(params), b1, b2, eps)


@settings(max_examples=10, deadline=None)
@given(st.integers(1, 30), st.integers(0, 2**31 - 1))
def test_adams_update_is_its_first_moment_over_the_preconditioner(updates, seed):
  """Optax's own update, the oracle: after t updates Adam moved by −η m_t / P_t, m_t its
  first moment, P_t = (1 − β₁ᵗ)(√v̂_t + ε) — the P whose P⁻¹H Adam's threshold bounds."""
  lr, b1, b2, eps = 0.01, 0.9, 0.99, 1e-8
  tx = optax.adam(lr, b1=b1, b2=b2, eps=eps)
  rng = np.random.default_rng(seed)
  params = {"w": jnp.zeros(4)}
  state = tx.init(params)
  for _ in range(updates):
    update, state = tx.update({"w": jnp.asarray(rng.normal(size=4), jnp.float32)}, state)
  p = sharpness.adam_precond(state, b1, b2, eps)["w"]
  np.testing.assert_allclose(update["w"], -lr * state[0].mu["w"] / p, rtol=1e-5)


def test_the_update_count_is_the_optimizers_not_the_training_steps():
  """A skipped step leaves the optimizer's state, its count included, as it was: the bias
  corrections and the last update's rate follow its count."""
  params = {"w": jnp.ones(2)}
  schedule = optax.linear_schedule(0.1, 0.0, 10)
  for tx in (optax.adam(schedule), optax.sgd(schedule, momentum=0.9)):
    state = tx.init(params)
    for _ in range(3):
      _, state = tx.update({"w": jnp.ones(2)}, state, params)
    assert sharpness.update_count(state, step=5) == 3
  assert sharpness.update_count(optax.sgd(0.1).init(params), step=5) == 5  # Keeps none.


def test_a_larger_negative_eigenvalue_does_not_hide_the_largest_one():
  h = jnp.array([-30.0, 2.0, 0.5, -1.0])  # Largest in magnitude: −30; largest: 2.
  lam, quotients = sharpness.hessian_top(quadratic(jnp.diag(h)), {"w": jnp.ones(4)}, iters=30)
  assert lam == pytest.approx(2.0, rel=1e-5) and len(quotients) == 4  # Exact at n = 4.


def test_lanczos_refuses_zero_iterations():
  with pytest.raises(ValueError, match="at least one Lanczos iteration"):
    sharpness.hessian_top(quadratic(jnp.eye(3)), {"w": jnp.ones(3)}, iters=0)


def test_the_reports_sharpness_follows_the_optimizer():
  """`lnjax analyze --sharpness`'s entry (lnjax/analysis/report.py) on a diagonal quadratic:
  Adam's λ_max(P⁻¹H) = max hᵢ/Pᵢ with P at the optimizer's own count (2 updates, though the
  training step says 5) and the rate of its 2nd update; RAdam's rectified steps are not
  Adam's, so no Adam threshold is claimed for them."""
  import types

  from lnjax.analysis import report
  from lnjax.core.optim import OptConfig

  h = jnp.array([4.0, 1.0, 0.25])
  params, schedule = {"w": jnp.ones(3)}, lambda count: 0.1 * (count + 1)
  for name, tx in (("adam", optax.adam(0.1, b2=0.98)), ("radam", optax.radam(0.1, b2=0.98))):
    built = types.SimpleNamespace(run=types.SimpleNamespace(opt=OptConfig(name=name)),
                                  setup=types.SimpleNamespace(schedule=schedule))
    state = tx.init(params)
    for g in ([1.0, -2.0, 0.5], [0.3, 1.0, -1.0]):
      _, state = tx.update({"w": jnp.array(g)}, state, params)
    out = report._sharpness(built, params, (state, 5), quadratic(jnp.diag(h)), iters=10)
    assert out["hessian_top"] == pytest.approx(4.0, rel=1e-5)
    assert out["lr_at_step"] == pytest.approx(0.2)  # schedule(1): the 2nd update's rate.
    if name == "radam":
      assert "adam_top" not in out and "RAdam's rectified steps" in out["adam"]
      continue
    p = sharpness.adam_precond(state, 0.9, 0.98, 1e-8)["w"]
    assert out["adam_top"] == pytest.approx(float(jnp.max(h / p)), rel=1e-4)
    assert out["edge_fraction"] == pytest.approx(0.2 * out["adam_top"] / 38, rel=1e-6)


def test_coordinates_without_a_gradient_are_left_out_of_adams_sharpness():
  """v̂ = 0 (never a gradient: a token absent from the training batches): ε alone would be
  its √v̂ and its curvature ×1/ε would swamp λ_max(P⁻¹H); P = ∞ leaves it out."""
  b1, b2, eps = 0.9, 0.98, 1e-8
  tx = optax.adam(0.1, b1=b1, b2=b2, eps=eps)
  params = {"w": jnp.ones(3)}
  state = tx.init(params)
  _, state = tx.update({"w": jnp.array([0.5, 0.2, 0.0])}, state, params)
  p = sharpness.adam_precond(state, b1, b2, eps)["w"]
  assert np.isinf(p[2]) and np.all(np.isfinite(p[:2]))
  h = jnp.array([4.0, 1.0, 100.0])
  lam, _ = sharpness.hessian_top(quadratic(jnp.diag(h)), params, precond={"w": p}, iters=3)
  assert lam == pytest.approx(float(jnp.max(h[:2] / p[:2])), rel=1e-4)


def test_the_report_claims_no_threshold_without_positive_curvature_or_finite_parameters():
  import types

  from lnjax.analysis import report
  from lnjax.core import errors
  from lnjax.core.optim import OptConfig

  params = {"w": jnp.ones(2)}
  tx = optax.sgd(0.1, momentum=0.9)
  state = tx.update({"w": jnp.ones(2)}, tx.init(params), params)[1]
  built = types.SimpleNamespace(run=types.SimpleNamespace(opt=OptConfig(name="sgd")),
                                setup=types.SimpleNamespace(schedule=lambda c: 0.1))
  concave = quadratic(-jnp.diag(jnp.array([2.0, 1.0])))
  out = report._sharpness(built, params, (state, 1), concave, iters=2)
  assert out["hessian_top"] < 0 and "no_threshold" in out and "sgd_edge" not in out
  assert "no stability threshold" in report._sharpness_lines({"sharpness": out})[0]
  with pytest.raises(errors.LnjaxError, match="not all finite"):
    report._sharpness(built, {"w": jnp.array([1.0, jnp.nan])}, (state, 1), concave, iters=2)
