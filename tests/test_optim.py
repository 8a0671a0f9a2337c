"""Schedules (the paper's warm-up, inverse square root, step decay), optimizers, loss."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from lnjax.core import losses
from lnjax.core import errors, optim

from conftest import fast_tier


def lr(schedule, t):
  return float(schedule(t))


def test_warmup_endpoints_and_inverse_sqrt():
  """Xiong et al. §2: lr(t) = t/T_w · lr_max for t <= T_w, then lr_max · √(T_w / t)."""
  s = optim.make_schedule(optim.OptConfig(learning_rate=5e-4, schedule="inverse_sqrt",
                                          warmup_steps=4000), num_steps=100_000)
  assert lr(s, 0) == 0.0
  assert lr(s, 1000) == pytest.approx(5e-4 / 4)
  assert lr(s, 4000) == pytest.approx(5e-4)
  for t in (4001, 16000, 64000):
    assert lr(s, t) == pytest.approx(5e-4 * np.sqrt(4000 / t), rel=1e-5)


def test_inverse_sqrt_held_until_a_decay_epoch():
  """The paper's WMT14 Pre-LN schedule: no warm-up, lr_max until epoch 6, then √(T_d / t)."""
  cfg = optim.OptConfig(learning_rate=7e-4, schedule="inverse_sqrt", decay_epochs=(6,))
  s = optim.make_schedule(cfg, 100_000, steps_per_epoch=1000)
  assert lr(s, 0) == lr(s, 5998) == pytest.approx(7e-4)
  assert lr(s, 4 * 6000 - 1) == pytest.approx(7e-4 / 2)  # t = s + 1 without warm-up.


def test_no_warmup_means_peak_at_step_0():
  for name in optim.SCHEDULES:
    cfg = optim.OptConfig(learning_rate=1e-3, schedule=name, warmup_steps=0, decay_steps=(50,))
    assert lr(optim.make_schedule(cfg, 100), 0) == pytest.approx(1e-3)


def test_step_decay_at_epochs():
  """The paper's Pre-LN schedule: lr 5e-4, ×0.1 at epoch 8 (steps per epoch 1100 here)."""
  cfg = optim.OptConfig(learning_rate=5e-4, schedule="step", decay_epochs=(8,), decay_factor=0.1)
  s = optim.make_schedule(cfg, 20_000, steps_per_epoch=1100)
  assert lr(s, 8 * 1100 - 1) == pytest.approx(5e-4)
  assert lr(s, 8 * 1100) == pytest.approx(5e-5)
  with pytest.raises(errors.ConfigError, match="epoch length"):
    optim.make_schedule(cfg, 20_000)


def test_step_decay_after_warmup_uses_absolute_steps():
  cfg = optim.OptConfig(learning_rate=1.0, schedule="step", warmup_steps=10,
                        decay_steps=(30, 60), decay_factor=0.5)
  s = optim.make_schedule(cfg, 100)
  assert [lr(s, t) for t in (5, 10, 29, 30, 59, 60)] == pytest.approx(
      [0.5, 1.0, 1.0, 0.5, 0.5, 0.25])


# Closed forms of every decay after a warm-up of W steps to `peak`, over a run of N steps
# ending at `end` (linear, cosine); t counts optimizer updates from 0.
PEAK, END, W, N = 1e-3, 1e-5, 100, 1000
CLOSED_FORMS = {
    "constant": lambda t: PEAK,
    "linear": lambda t: PEAK + (END - PEAK) * min(t - W, N - W) / (N - W),
    "cosine": lambda t: END + (PEAK - END) * 0.5 * (1 + np.cos(np.pi * min(t - W, N - W)
                                                                 / (N - W))),
    "inverse_sqrt": lambda t: PEAK * np.sqrt(W / t),
}
STEPS = (0, 1, 2, 50, 99, 100, 101, 200, 325, 550, 777, 999, 1000, 1500)


@pytest.mark.parametrize("name", sorted(CLOSED_FORMS))
def test_schedule_values_against_closed_forms(name):
  """lr(t) = t/W · peak during the warm-up (lr(0) = 0, lr(1) = peak/W), then the decay's
  closed form, at steps across the warm-up, the decay and past the run's end."""
  cfg = optim.OptConfig(learning_rate=PEAK, schedule=name, warmup_steps=W, end_learning_rate=END)
  s = optim.make_schedule(cfg, N)
  for t in STEPS:
    expected = t / W * PEAK if t < W else CLOSED_FORMS[name](t)
    assert lr(s, t) == pytest.approx(expected, rel=1e-5, abs=1e-12), (name, t)
  if name != "constant":  # Without warm-up the decay starts at step 0 (from peak).
    s = optim.make_schedule(dataclasses.replace(cfg, warmup_steps=0), N)
    assert lr(s, 0) == pytest.approx(PEAK)
    assert lr(s, N // 2) < 0.75 * PEAK


def test_constant_schedule_without_warmup_is_constant():
  s = optim.make_schedule(optim.OptConfig(learning_rate=3e-4, schedule="constant"), 100)
  assert [lr(s, t) for t in (0, 1, 50, 99, 100, 10_000)] == pytest.approx([3e-4] * 6)


def test_linear_and_cosine_end_values():
  for name in ("linear", "cosine"):
    cfg = optim.OptConfig(learning_rate=1e-3, schedule=name, warmup_steps=100,
                          end_learning_rate=1e-5)
    s = optim.make_schedule(cfg, 1000)
    assert lr(s, 100) == pytest.approx(1e-3)
    assert lr(s, 1000) == pytest.approx(1e-5, rel=1e-4)
    assert lr(s, 550) < 1e-3


@pytest.mark.parametrize("bad, match", [
    (dict(warmup_steps=-1), "opt.warmup_steps"),
    (dict(schedule="noam"), "opt.schedule='noam' is not one of: constant"),
    (dict(name="lamb"), "opt.name='lamb' is not one of: adam, adamw, sgd, radam"),
    (dict(learning_rate=0.0), "opt.learning_rate"),
    (dict(schedule="step"), "needs opt.decay_steps"),
])
def test_refusals(bad, match):
  with pytest.raises(errors.ConfigError, match=match):
    optim.OptConfig(**bad)


@pytest.mark.parametrize("name", fast_tier(optim.OPTIMIZERS, ("adam", "sgd")))
def test_every_optimizer_descends(name):
  params = {"w": jnp.array([3.0, -2.0])}
  tx = optim.make_optimizer(optim.OptConfig(name=name, learning_rate=0.05),
                            optax.constant_schedule(0.05))
  state = tx.init(params)
  loss = lambda p: jnp.sum(p["w"] ** 2)
  for _ in range(50):
    g = jax.grad(loss)(params)
    updates, state = tx.update(g, state, params)
    params = optax.apply_updates(params, updates)
  assert loss(params) < 13.0 * 0.5


def test_radam_updates_against_the_papers_formula():
  """RAdam (Liu et al., arXiv 1908.03265, Algorithm 2) in numpy: while the length of the
  approximated SMA ρ_t is below the threshold the update is the bias-corrected momentum
  alone, -lr · m̂_t; above it, the rectified Adam step -lr · r_t · m̂_t / (√v̂_t + ε).
  The paper rectifies when ρ_t > 4; optax (whose default lnjax keeps) and the authors'
  code when ρ_t >= 5. With β₂ = 0.98, ρ_1..ρ_4 = 1.0, 2.0, 2.97, 3.95 are below both,
  ρ_5 = 4.93 lies between them (momentum alone here), ρ_6.. > 5."""
  lr_, b1, b2, eps = 0.1, 0.9, 0.98, 1e-8
  tx = optim.make_optimizer(optim.OptConfig(name="radam", learning_rate=lr_, b1=b1, b2=b2,
                                            eps=eps), optax.constant_schedule(lr_))
  grads = np.random.default_rng(0).normal(size=(8, 5)) * [0.01, 0.3, 2.0, -5.0, 40.0]
  params = {"w": jnp.zeros(5)}
  state = tx.init(params)
  m, v = np.zeros(5), np.zeros(5)
  rho_inf = 2 / (1 - b2) - 1
  for t, g in enumerate(grads, start=1):
    updates, state = tx.update({"w": jnp.asarray(g, jnp.float32)}, state, params)
    m, v = b1 * m + (1 - b1) * g, b2 * v + (1 - b2) * g * g
    m_hat, v_hat = m / (1 - b1**t), v / (1 - b2**t)
    rho = rho_inf - 2 * t * b2**t / (1 - b2**t)
    if rho < 5:
      expected = -lr_ * m_hat
    else:
      r = np.sqrt((rho - 4) * (rho - 2) * rho_inf / ((rho_inf - 4) * (rho_inf - 2) * rho))
      expected = -lr_ * r * m_hat / (np.sqrt(v_hat) + eps)
    assert (rho <= 4) == (t <= 4) and (rho < 5) == (t <= 5), (t, rho)
    np.testing.assert_allclose(np.asarray(updates["w"]), expected, rtol=1e-4, err_msg=f"t={t}")


def test_clipping_is_off_by_default_and_bounds_updates_when_on():
  g = {"w": jnp.array([300.0, 400.0])}  # Global norm 500.
  sgd = lambda clip: optim.make_optimizer(
      optim.OptConfig(name="sgd", momentum=0.0, learning_rate=1.0, grad_clip_norm=clip),
      optax.constant_schedule(1.0))
  for clip, norm in ((0.0, 500.0), (1.0, 1.0)):
    tx = sgd(clip)
    u, _ = tx.update(g, tx.init(g), g)
    assert float(optax.tree.norm(u)) == pytest.approx(norm, rel=1e-5)


def test_cross_entropy_and_label_smoothing():
  logits = jnp.log(jnp.array([[[0.7, 0.2, 0.1]]]))
  targets, weights = jnp.array([[0]]), jnp.ones((1, 1))
  loss, nll, n = losses.cross_entropy(logits, targets, weights)
  assert float(nll) == pytest.approx(-np.log(0.7), rel=1e-6) and float(loss) == float(nll)
  loss, nll, _ = losses.cross_entropy(logits, targets, weights, label_smoothing=0.1)
  expected = 0.9 * -np.log(0.7) + 0.1 * -np.mean(np.log([0.7, 0.2, 0.1]))
  assert float(loss) == pytest.approx(expected, rel=1e-6)
  assert float(nll) == pytest.approx(-np.log(0.7), rel=1e-6)


@pytest.mark.parametrize("eps", [0.0, 0.1])
def test_cross_entropy_gradient_equals_autodiff_of_the_formula(eps):
  """The hand-written backward (softmax − smoothed one-hot) against jax.grad of log_softmax."""
  k1, k2, k3 = jax.random.split(jax.random.key(0), 3)
  logits = 3 * jax.random.normal(k1, (2, 5, 7))
  targets = jax.random.randint(k2, (2, 5), 0, 7)
  weights = (jax.random.uniform(k3, (2, 5)) > 0.3).astype(jnp.float32)

  def plain(lg):
    logp = jax.nn.log_softmax(lg, -1)
    nll = -jnp.take_along_axis(logp, targets[..., None], -1)[..., 0]
    loss = (1 - eps) * nll - eps * logp.mean(-1)
    return (loss * weights).sum() + 0.5 * (nll * weights).sum()

  def ours(lg):
    loss, nll, _ = losses.cross_entropy(lg, targets, weights, label_smoothing=eps)
    return loss + 0.5 * nll

  np.testing.assert_allclose(ours(logits), plain(logits), rtol=1e-6)
  np.testing.assert_allclose(jax.grad(ours)(logits), jax.grad(plain)(logits), atol=1e-6)


def test_exponential_schedule_grows_geometrically_for_the_range_test():
  """lr(t) = lr₀ · γ^t: the range test's 1e-5 → 1 over 101 steps is γ = 10^(5/100)."""
  gamma = 10 ** (5 / 100)
  s = optim.make_schedule(optim.OptConfig(learning_rate=1e-5, schedule="exponential",
                                          decay_factor=gamma), 101)
  assert [lr(s, t) for t in (0, 1, 20, 50, 100)] == pytest.approx(
      [1e-5, 1e-5 * gamma, 1e-4, 10 ** -2.5, 1.0], rel=1e-4)


def _updates(tx, grads, params):
  """The updates of `tx` for the gradients `grads` in turn, from `params` (applied)."""
  state, out = tx.init(params), []
  for g in grads:
    u, state = tx.update(g, state, params)
    params = optax.apply_updates(params, u)
    out.append(np.asarray(u["w"]))
  return out


def test_clipped_adamw_is_optax_clip_then_adamw_with_the_configured_weight_decay():
  """The oracle: optax's own chain(clip_by_global_norm, adamw(...)), clipping the gradient
  before the optimizer (clipping Adam's update instead, or optax's default weight decay
  1e-4 instead of the configured 0.3, both change every update)."""
  cfg = optim.OptConfig(name="adamw", learning_rate=0.1, b1=0.9, b2=0.98, eps=1e-8,
                        weight_decay=0.3, grad_clip_norm=0.5)
  schedule = optax.constant_schedule(0.1)
  oracle = optax.chain(optax.clip_by_global_norm(0.5),
                       optax.adamw(schedule, b1=0.9, b2=0.98, eps=1e-8, weight_decay=0.3))
  rng = np.random.default_rng(0)
  grads = [{"w": jnp.asarray(rng.normal(0, s, 4), jnp.float32)} for s in (3.0, 0.01, 2.0)]
  params = {"w": jnp.asarray([1.0, -2.0, 3.0, 0.5])}
  for ours, theirs in zip(_updates(optim.make_optimizer(cfg, schedule), grads, params),
                          _updates(oracle, grads, params)):
    np.testing.assert_allclose(ours, theirs, rtol=1e-6)


def test_sgd_with_nesterov_momentum_against_its_closed_form():
  """optax's Nesterov SGD: m_t = g_t + μ m_{t-1}, update -η (g_t + μ m_t) (Sutskever et
  al. 2013, in the form of Bengio et al. 2013, arXiv 1212.0901); without the flag the
  update is -η m_t."""
  lr_, mu = 0.1, 0.9
  g1, g2 = np.array([1.0, -2.0]), np.array([0.5, 3.0])
  m1, m2 = g1, g2 + mu * g1
  expected = [-lr_ * (g1 + mu * m1), -lr_ * (g2 + mu * m2)]
  cfg = optim.OptConfig(name="sgd", learning_rate=lr_, momentum=mu, nesterov=True)
  tx = optim.make_optimizer(cfg, optax.constant_schedule(lr_))
  got = _updates(tx, [{"w": jnp.asarray(g, jnp.float32)} for g in (g1, g2)],
                 {"w": jnp.zeros(2)})
  np.testing.assert_allclose(got, expected, rtol=1e-6)
