"""The stability instrument (lnjax/core/health.py): per-layer statistics against numpy, scanned
equal to unrolled, the model unchanged when nobody asks for them; the early-warning rule,
the host-side 6σ rule and the skip-step optax transform."""

import sys

import flax.linen as nn
import hypothesis
import hypothesis.strategies as st
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from lnjax.core import health
from lnjax.models import EncoderDecoder, ModelConfig, TransformerLM, transformer
import forkserver

CFG = ModelConfig(vocab_size=40, num_layers=2, d_model=16, num_heads=2, d_ff=32, max_len=8,
                  dropout_rate=0.0, norm_position="pre")


def _stats(model, params, *inputs, cfg=CFG):
  """Every health statistic of one gradient step of the mean logit (updates = −0.1·grads)."""

  def loss(p):
    out, v = model.apply({"params": p}, *inputs, mutable=["intermediates"])
    return jnp.mean(out), (out, v["intermediates"])

  (_, (out, inter)), grads = jax.value_and_grad(loss, has_aux=True)(params)
  updates = jax.tree.map(lambda g: -0.1 * g, grads)
  return ({**health.step_statistics(cfg, params, grads, updates),
           **health.sown_statistics(inter, cfg)}, out, grads)


def _lm(cfg=CFG, token_seed=0):
  model = TransformerLM(cfg)
  tokens = jax.random.randint(jax.random.key(token_seed), (2, 8), 0, cfg.vocab_size)
  return model, nn.unbox(model.init(jax.random.key(1), tokens)["params"]), tokens


def _rms(*arrays):
  flat = np.concatenate([np.asarray(a, np.float64).ravel() for a in arrays])
  return np.sqrt(np.mean(flat**2))


def test_statistics_against_numpy():
  """Per sub-layer RMS of gradient, update and parameters (the sub-layer's norm with it);
  the stream entering layer 0 (the embedding); layer 0's largest causal attention logit
  from its own q, k; the output logits' max and mean log-partition. (Tokens whose largest
  layer-0 logit lies on a masked, future key, so that the mask is put to the test.)"""
  model, params, tokens = _lm(token_seed=2)
  stats, logits, grads = _stats(model, params, tokens)
  l0 = params["layer_0"]
  attn = [*jax.tree.leaves(l0["self_attn"]), *jax.tree.leaves(l0["self_attn_norm"])]
  np.testing.assert_allclose(stats["health/layer_0/self_attn/param_rms"], _rms(*attn), rtol=1e-5)
  g0 = grads["layer_0"]
  ffn_grads = [*jax.tree.leaves(g0["ffn"]), *jax.tree.leaves(g0["ffn_norm"])]
  np.testing.assert_allclose(stats["health/layer_0/ffn/grad_rms"], _rms(*ffn_grads), rtol=1e-5)
  np.testing.assert_allclose(stats["health/layer_0/ffn/update_rms"], 0.1 * _rms(*ffn_grads),
                             rtol=1e-5)
  np.testing.assert_allclose(stats["health/embed/param_rms"],
                             _rms(*jax.tree.leaves(params["embed"])), rtol=1e-5)

  e = params["embed"]
  x = np.asarray(e["embedding"])[np.asarray(tokens)] * 16**0.5 + np.asarray(e["positions"])[:8]
  np.testing.assert_allclose(stats["health/layer_0/residual_rms"], _rms(x), rtol=1e-5)
  mu, var = x.mean(-1, keepdims=True), x.var(-1, keepdims=True)
  h = (x - mu) / np.sqrt(var + CFG.norm_eps) * np.asarray(l0["self_attn_norm"]["scale"]) + \
      np.asarray(l0["self_attn_norm"]["bias"])
  proj = lambda n: (h @ np.asarray(l0["self_attn"][n]["kernel"]) +
                    np.asarray(l0["self_attn"][n]["bias"])).reshape(2, 8, 2, 8)
  logits_att = np.einsum("bthk,bshk->bhts", proj("query"), proj("key")) / np.sqrt(8)
  causal = np.tril(np.ones((8, 8), bool))
  assert logits_att.max() > logits_att[:, :, causal].max() + 0.1  # (The data do test the mask.)
  np.testing.assert_allclose(stats["health/layer_0/self_attn/max_logit"],
                             logits_att[:, :, causal].max(), rtol=1e-5)
  out = np.asarray(logits, np.float64)
  np.testing.assert_allclose(stats["health/output_logit_max"], out.max(), rtol=1e-6)
  z = np.log(np.exp(out).sum(-1)).mean()
  np.testing.assert_allclose(stats["health/output_z_mean"], z, rtol=1e-5)


def test_the_forward_pass_sees_the_train_steps_dropout_masks():
  """The activation statistics' forward pass at step s (lnjax/core/steps.py activation_step)
  sows what the train step's own forward pass at s sows: the same parameters, batch and
  dropout masks, whose key is fold_in(key(seed), s). With dropout on, the masks change the
  residual stream, so another step's masks give other values."""
  from lnjax import tasks
  from lnjax.core import optim, state as state_lib, steps
  cfg = ModelConfig(**{**CFG.__dict__, "dropout_rate": 0.3})
  setup = state_lib.make_setup(cfg, optim.OptConfig(), 100, task=tasks.get("lm"))
  model, params, tokens = _lm(cfg)
  batch = {"inputs": tokens, "targets": tokens, "weights": jnp.ones(tokens.shape)}

  def train_steps_forward(p, step):  # Under the gradient, as the train step takes it.
    key = jax.random.fold_in(jax.random.key(3), step)
    out, v = model.apply({"params": p}, tokens, deterministic=False, rngs={"dropout": key},
                         mutable=["intermediates"])
    return jnp.mean(out), v["intermediates"]

  (_, inter), _ = jax.value_and_grad(train_steps_forward, has_aux=True)(params, 7)
  expected = health.sown_statistics(inter, cfg)
  ours = steps.activation_step(params, batch, jnp.asarray(7), setup=setup, seed=3)
  assert sorted(ours) == sorted(expected) and "health/layer_1/residual_rms" in ours
  for k in expected:
    np.testing.assert_allclose(ours[k], expected[k], rtol=1e-5, err_msg=k)
  other = steps.activation_step(params, batch, jnp.asarray(8), setup=setup, seed=3)
  assert float(other["health/layer_1/residual_rms"]) != float(ours["health/layer_1/residual_rms"])


def test_names_cover_every_layer_and_sublayer():
  model, params, tokens = _lm()
  stats, _, _ = _stats(model, params, tokens)
  for i in range(2):
    for sub in ("self_attn", "ffn"):
      for stat in ("grad_rms", "update_rms", "param_rms"):
        assert f"health/layer_{i}/{sub}/{stat}" in stats
    assert f"health/layer_{i}/residual_rms" in stats
    assert f"health/layer_{i}/self_attn/max_logit" in stats
  assert all(np.isfinite(float(v)) for v in stats.values())


@pytest.mark.slow  # (The fast tier checks the statistics of the unrolled layers.)
@pytest.mark.parametrize("pos,remat", [("pre", "nothing_saveable"), ("mix", "none")])
def test_scanned_layers_give_the_unrolled_statistics(pos, remat):
  """Scanned layers (Mix-LN: two scans) report layer_0, layer_1, ... with the unrolled
  values; under rematerialization too."""
  cfg = ModelConfig(**{**CFG.__dict__, "num_layers": 4, "norm_position": pos,
                       "mix_post_fraction": 0.5})
  model, params, tokens = _lm(cfg)
  expected, _, _ = _stats(model, params, tokens, cfg=cfg)
  scan_cfg = ModelConfig(**{**cfg.__dict__, "scan_layers": True, "remat_policy": remat})
  stats, _, _ = _stats(TransformerLM(scan_cfg), transformer.scan_params(params, cfg), tokens,
                       cfg=scan_cfg)
  assert sorted(stats) == sorted(expected)
  for k in expected:
    np.testing.assert_allclose(stats[k], expected[k], rtol=2e-5, atol=1e-7, err_msg=k)


def test_encoder_decoder_names_its_stacks():
  cfg = ModelConfig(**{**CFG.__dict__, "num_layers": 1})
  model = EncoderDecoder(cfg)
  src = jnp.array([[5, 6, 7, 0, 0, 0, 0, 0], [5, 6, 7, 8, 9, 10, 11, 12]])
  tgt = jnp.ones((2, 8), jnp.int32)
  params = nn.unbox(model.init(jax.random.key(1), src, tgt)["params"])
  stats, _, _ = _stats(model, params, src, tgt, cfg=cfg)
  for name in ("encoder/layer_0/self_attn/max_logit", "decoder/layer_0/cross_attn/max_logit",
               "decoder/layer_0/cross_attn/update_rms", "decoder/output_z_mean",
               "encoder/layer_0/residual_rms"):
    assert f"health/{name}" in stats, sorted(stats)
  assert np.isfinite(float(stats["health/decoder/layer_0/cross_attn/max_logit"]))


def test_the_model_is_unchanged_when_statistics_are_not_asked_for():
  """Asking for the intermediates adds outputs, never changes the logits; without them
  nothing is sown."""
  model, params, tokens = _lm()
  plain = model.apply({"params": params}, tokens)
  with_stats, v = model.apply({"params": params}, tokens, mutable=["intermediates"])
  np.testing.assert_array_equal(plain, with_stats)
  assert v["intermediates"]
  _, nothing = model.apply({"params": params}, tokens, mutable=["cache"])
  assert not nothing


# ---- The early-warning rule. -------------------------------------------------------------

NAME = "health/layer_0/self_attn/update_rms"


def _feed(rule, values, lr=1e-3, start=1):
  return [w for i, v in enumerate(values) for w in rule(start + i, {NAME: v * lr}, lr)]


def test_warning_fires_once_per_excursion_with_its_ratio():
  rule = health.EarlyWarning(factor=3.0, window=100, min_history=20)
  noise = 1.0 + 0.05 * np.sin(np.arange(60))
  warnings = _feed(rule, list(noise) + [4.1, 5.0, 6.0] + [1.0] * 5 + [3.5])
  assert [w["step"] for w in warnings] == [61, 69]
  assert warnings[0]["ratio"] == pytest.approx(4.1 / np.median(noise), rel=1e-6)
  line = health.warning_line(warnings[0], 100)
  assert line.startswith("warning: step 61: layer 0 self_attn update_rms 4.")
  assert line.endswith("× its 100-step median; loss may diverge")


def test_warning_needs_history_and_ignores_the_learning_rate_schedule():
  rule = health.EarlyWarning(factor=3.0, window=100, min_history=20)
  assert not _feed(rule, [1.0] * 10 + [50.0])  # 10 steps of history: too early to judge.
  rule = health.EarlyWarning(factor=3.0, window=100, min_history=20)
  # The learning rate ×10 at step 100 (a step schedule, the end of a warm-up): the update
  # RMS jumps 10× with it, per unit of learning rate not at all.
  lr = lambda s: 1e-5 if s < 100 else 1e-4
  assert not [w for s in range(1, 201) for w in rule(s, {NAME: 0.7 * lr(s)}, lr(s))]



def test_the_warning_judges_from_exactly_min_history_steps():
  """min_history=20: the 21st value is judged against 20 steps of history, the 20th is not."""
  rule = health.EarlyWarning(factor=3.0, window=100, min_history=20)
  assert [w["step"] for w in _feed(rule, [1.0] * 20 + [50.0])] == [21]
  rule = health.EarlyWarning(factor=3.0, window=100, min_history=20)
  assert not _feed(rule, [1.0] * 19 + [50.0])

def _grads(first: float, top: float = 1e-3, prefix: str = "") -> dict:
  """Health scalars of a 3-layer stack: layer 0's sub-layers at `first` and first / 2."""
  return {f"health/{prefix}layer_0/ffn/grad_rms": first,
          f"health/{prefix}layer_0/self_attn/grad_rms": first / 2,
          f"health/{prefix}layer_1/ffn/grad_rms": top / 3, f"health/{prefix}layer_2/ffn/grad_rms": top,
          f"health/{prefix}layer_2/ffn/update_rms": 50.0}  # (Not a gradient: ignored.)


def test_vanishing_gradient_warns_after_patience_once_per_excursion():
  """Post-LN's failure without warm-up: layer 0's gradient falls orders of magnitude below
  the top layer's and stays there (the numbers of a 12-layer run of the early-warning
  benchmark); nothing spikes, so the ratio-to-median rule says nothing."""
  rule = health.VanishingGradient(ratio=1e-3, patience=3)
  firsts = [1.6e-3, 2.8e-5, 2.5e-6, 4e-8, 1.6e-10, 1e-12, 1e-3, 1e-7, 1e-7, 1e-7, 1e-7]
  got = [w for step, g in enumerate(firsts, 1) for w in rule(step, _grads(g))]
  # Below 1e-3 × the top's 1e-3 from step 4 (4e-8; step 3's 2.5e-6 is not): the warning at
  # step 6, the third step below; back above at step 7; below again from 8, warned at 10.
  assert [w["step"] for w in got] == [6, 10]
  assert got[0]["name"] == "health/layer_0/grad_rms" and got[0]["value"] == 1e-12
  assert got[0]["ratio"] == pytest.approx(1e-9)
  assert got[0]["line"].startswith("warning: step 6: layer 0 grad_rms 1e-12 is 1.0e-09× "
                                   "layer 2's for 3 steps; the lower layers have stopped")
  # Each stack of an encoder-decoder on its own; a one-layer stack has no depth to judge.
  rule = health.VanishingGradient(ratio=1e-3, patience=1)
  stats = {**_grads(1e-9, prefix="encoder/"), **_grads(1e-4, prefix="decoder/"),
           "health/layer_0/ffn/grad_rms": 1e-12}
  assert [w["name"] for w in rule(1, stats)] == ["health/encoder/layer_0/grad_rms"]


@hypothesis.given(st.lists(st.floats(1e-6, 1e6), min_size=2, max_size=12),
                  st.integers(1, 400))
def test_vanishing_gradient_is_silent_while_layer_0_keeps_its_share(norms, steps):
  """Any depth and any gradient sizes: while the first layer's gradient is at least 1e-3 of
  the largest layer's, nothing fires, however long the run."""
  top = max(norms)
  stats = {f"health/layer_{i}/ffn/grad_rms": g for i, g in enumerate(norms)}
  stats["health/layer_0/ffn/grad_rms"] = max(norms[0], 1e-3 * top)
  rule = health.VanishingGradient()
  assert not [w for s in range(1, min(steps, 20) + 1) for w in rule(s, stats)]


def test_sigma_rule_flags_six_sigma_and_non_finite_values():
  rule = health.SigmaRule(window=128, num_sigma=6.0)
  rng = np.random.default_rng(0)
  losses = 3.0 + 0.01 * rng.standard_normal(200)
  assert not [s for v in losses[:64] for s in rule(loss=v)]  # Half a window first.
  flagged = [i for i, v in enumerate(losses[64:]) if rule(loss=v)]
  assert not flagged
  assert rule(loss=3.5) == ["loss"]
  assert rule(loss=float("nan")) == ["loss"]
  assert rule(loss=3.0) == []  # The NaN did not poison the window.


# ---- The skip-step transform. --------------------------------------------------------------

def test_skip_spikes_zeroes_the_update_and_keeps_the_state():
  """A step whose loss is 6σ above the window: no update, Adam's state as it was, counted;
  every other step is Adam's, to float32 rounding."""
  tx = health.skip_spikes(optax.adam(0.1), window=8, num_sigma=6.0)
  ref = optax.adam(0.1)
  params = {"w": jnp.ones(3)}
  state, ref_state = tx.init(params), ref.init(params)
  update, ref_update = jax.jit(tx.update), jax.jit(ref.update)
  rng = np.random.default_rng(0)
  for i in range(12):
    g = {"w": jnp.asarray(rng.standard_normal(3), jnp.float32)}
    loss = 5.0 if i == 9 else 2.0 + 0.01 * rng.standard_normal()
    u, state = update(g, state, params, value=loss)
    if i == 9:
      assert float(jnp.abs(u["w"]).max()) == 0.0
      assert int(state.skipped) == 1
      continue
    u_ref, ref_state = ref_update(g, ref_state, params)
    # (atol: two programs, whose fusions round differently, where Adam's update is ~1e-5.)
    np.testing.assert_allclose(u["w"], u_ref["w"], rtol=1e-6, atol=1e-8)
  assert int(health.skipped_steps(state)) == 1
  # A non-finite loss is skipped however short the history.
  state = tx.init(params)
  u, state = update({"w": jnp.ones(3)}, state, params, value=float("nan"))
  assert float(jnp.abs(u["w"]).max()) == 0.0 and int(state.skipped) == 1
  assert int(state.count) == 0  # and stays out of the window



def test_skip_spikes_skips_a_gradient_norm_spike_under_a_steady_loss():
  """The gradient norm is judged against the gradient-norm history: norms near 1 then 5,
  the loss steady at 10 throughout (5 is far below the loss history: a rule reading it
  would let the spike through)."""
  tx = health.skip_spikes(optax.sgd(0.1), window=8, num_sigma=6.0)
  params = {"w": jnp.zeros(4)}
  state, update = tx.init(params), jax.jit(tx.update)
  rng = np.random.default_rng(0)
  for i in range(8):
    g = rng.normal(0, 1, 4)
    norm = 5.0 if i == 7 else 1.0 + 0.01 * rng.standard_normal()
    u, state = update({"w": jnp.asarray(g / np.linalg.norm(g) * norm, jnp.float32)}, state,
                      params, value=10.0)
    assert (float(jnp.abs(u["w"]).max()) == 0.0) == (i == 7), i
  assert int(health.skipped_steps(state)) == 1

# ---- Under sharding, and in a run. ---------------------------------------------------------

def _sharded_stats(mesh_shape):
  from lnjax import tasks
  from lnjax.core import optim, sharding, state as state_lib, steps
  import functools
  cfg = ModelConfig(**{**CFG.__dict__, "num_heads": 4, "d_ff": 64})
  setup = state_lib.make_setup(cfg, optim.OptConfig(name="sgd", learning_rate=0.5), 100,
                               task=tasks.get("lm"))
  devices = jax.devices()[:int(np.prod(mesh_shape))]
  mesh = sharding.make_mesh(sharding.MeshConfig(*mesh_shape), devices)
  shardings, bs = state_lib.state_shardings(setup, mesh), sharding.batch_sharding(mesh)
  x = np.random.default_rng(0).integers(1, 40, (8, 9)).astype(np.int32)
  batch = sharding.global_batch({"inputs": x[:, :-1], "targets": x[:, 1:],
                                 "weights": np.ones((8, 8), np.float32)}, bs)
  step = jax.jit(functools.partial(steps.train_step, setup=setup, label_smoothing=0.0, seed=0,
                                   health=True),
                 in_shardings=(shardings, bs), out_shardings=(shardings, sharding.replicated(mesh)))
  forward = jax.jit(functools.partial(steps.activation_step, setup=setup, seed=0),
                    in_shardings=(shardings.params, bs, sharding.replicated(mesh)),
                    out_shardings=sharding.replicated(mesh))
  state = state_lib.init_state(setup, mesh, 0)
  sown = forward(state.params, batch, state.step)
  _, metrics = step(state, batch)
  return {k: float(v) for k, v in jax.device_get({**metrics, **sown}).items()
          if k.startswith("health/")}


@pytest.mark.slow
def test_statistics_under_sharding_equal_one_device():
  """Data, FSDP and tensor parallelism at once (2×2×2 on 8 virtual devices): every health
  statistic equals the single-device step's."""
  one, eight = _sharded_stats((1, 1, 1)), _sharded_stats((2, 2, 2))
  assert sorted(one) == sorted(eight) and "health/layer_1/self_attn/max_logit" in one
  for k in one:
    np.testing.assert_allclose(eight[k], one[k], rtol=2e-5, atol=1e-8, err_msg=k)


# A rollback's checkpoints: every 20 steps. The other runs save once, at the end (saving
# changes no value of the run).
ROLLBACK = {"train.on_instability": "rollback", "train.rollback_steps": 20,
            "train.rollback_skip_batches": 4, "train.checkpoint_every_steps": 20}


def _run(tmp_path, name, **overrides):
  from lnjax.configs import common as config_lib
  from lnjax import tasks
  from lnjax.core import metrics, train
  c = config_lib.lm_config()
  config_lib.apply_smoke(c)
  c.mesh.data = 1
  base = {"train.num_steps": 160, "train.checkpoint_every_steps": 160,
          "train.keep_checkpoints": 10, "train.eval_every_steps": 160,
          "train.log_every_steps": 20, "opt.learning_rate": 3e-3}
  c.update_from_flattened_dict({**base, **overrides})
  wd = str(tmp_path / name)
  summary = train.train_and_evaluate(c, wd, tasks=tasks.get)
  return summary, metrics.read_metrics(wd)


@pytest.fixture(scope="module")
def clean_run(tmp_path_factory):
  """The fault tests' reference: the same 160-step smoke run without a fault (one for all)."""
  return _run(tmp_path_factory.mktemp("clean"), "clean")[0]


def _within_1_percent(run, clean) -> bool:
  return abs(run["eval_loss"] - clean["eval_loss"]) <= 0.01 * clean["eval_loss"]


LR_SPIKE = {"train.inject_fault": "lr_spike:110:3:300"}  # Rate ×300 for 3 steps at step 110.


@pytest.mark.slow
def test_a_run_with_health_log_records_the_statistics(tmp_path):
  """train.health=log builds the health hook (test_hooks.py: it never warns): a health/
  record at every log step of the smoke run (of one layer: the hook's records are the
  point, not the depth; the test alone: CPU 6.1 -> 4.9 s, 2026-12-07, 2-core machine)."""
  _, records = _run(tmp_path, "log", **{
      "train.health": "log", "train.num_steps": 20, "train.log_every_steps": 5,
      "train.checkpoint_every_steps": 20, "train.eval_every_steps": 20,
      "model.num_layers": 1})
  health = [r for r in records if any(k.startswith("health/") for k in r)]
  assert [r["step"] for r in health] == [5, 10, 15, 20], health
  # Records of their own (not averaged into the train_* window), the sown activation
  # statistics with them (their forward pass is taken at log steps only).
  assert all("train_loss" not in r and any(k.endswith("max_logit") for k in r) for r in health)


@pytest.mark.slow
def test_rollback_recovers_from_a_learning_rate_spike(tmp_path, clean_run):
  """A learning rate ×300 for 3 steps at step 110: without recovery the run ends far from
  the clean run's held-out loss; with rollback (back ≥ 20 steps, 4 batches skipped) within
  1% of it, the action one record and one summary entry."""
  clean = clean_run
  fault = LR_SPIKE
  broken, _ = _run(tmp_path, "broken", **fault)
  rescued, records = _run(tmp_path, "rescued", **fault, **ROLLBACK)
  assert abs(rescued["eval_loss"] - clean["eval_loss"]) <= 0.01 * clean["eval_loss"], (
      rescued["eval_loss"], clean["eval_loss"])
  assert broken["status"] == "diverged" or (
      abs(broken["eval_loss"] - clean["eval_loss"]) > 0.01 * clean["eval_loss"]), broken
  actions = rescued["instability_actions"]
  assert actions and actions[0]["rollback_to_step"] <= actions[0]["step"] - 20
  assert any("rollback_to_step" not in r and r["step"] == actions[0]["rollback_to_step"]
             for r in records)


def test_bad_recovery_settings_are_refused_in_one_line():
  from lnjax.core import errors, run
  with pytest.raises(errors.ConfigError, match="train.on_instability='sometimes' is not one of"):
    run.TrainConfig(on_instability="sometimes")
  with pytest.raises(errors.ConfigError, match="train.health='loud'"):
    run.TrainConfig(health="loud")
  with pytest.raises(errors.ConfigError, match="train.rollback_steps=500"):
    run.TrainConfig(num_steps=100, on_instability="rollback", rollback_steps=500)
  with pytest.raises(errors.ConfigError, match="train.rollback_skip_batches=-2"):
    run.TrainConfig(rollback_skip_batches=-2)
  # Both beyond the run: one line names both.
  with pytest.raises(errors.ConfigError, match="train.rollback_steps=30 and "
                     "train.rollback_skip_batches=40 exceed train.num_steps=20"):
    run.TrainConfig(num_steps=20, on_instability="rollback", rollback_steps=30,
                    rollback_skip_batches=40)
  with pytest.raises(errors.ConfigError, match="train.inject_fault="):
    run.TrainConfig(inject_fault="lr_spike:10:3")


def test_rollback_defaults_follow_the_runs_length():
  """K = min(100, num_steps // 20), at least 1, B = 2K within the run; set values kept."""
  from lnjax.core import run
  rollback = lambda n, **kw: run.TrainConfig(num_steps=n, on_instability="rollback",
                                             **kw).rollback()
  assert [rollback(n) for n in (1, 20, 160, 2000, 10**6)] == [
      (1, 1), (1, 2), (8, 16), (100, 200), (100, 200)]
  assert rollback(20, rollback_steps=5, rollback_skip_batches=0) == (5, 0)


@pytest.mark.slow
def test_rollback_alone_on_the_smoke_preset_runs(tmp_path):
  """`lnjax train --config=lm:smoke --config.train.on_instability=rollback`, no other key."""
  r = forkserver.run([sys.executable, "-m", "lnjax.cli.console", "train", "--config=lm:smoke",
                      "--config.mesh.data=1", "--config.train.on_instability=rollback",
                      f"--workdir={tmp_path / 'run'}"], capture_output=True, text=True,
                     timeout=600, cwd=tmp_path)
  assert r.returncode == 0, r.stderr[-2000:]
  assert "== completed at step 20/20" in r.stdout


# Four batches of random tokens from step 150 of 160. One alone does the smoke LM no
# lasting harm (garbage:150:1 ended 0.35% above the clean run's held-out loss, 2.7849 against
# 2.7751, measured 2026-12-01 with this file's _run): several, late in the run, do.
GARBAGE = {"train.inject_fault": "garbage:150:4"}


@pytest.mark.slow
def test_rollback_recovers_from_garbage_batches(tmp_path, clean_run):
  """Garbage batches spike the loss: without recovery the run ends more than 1% above the
  clean run's held-out loss; with rollback (6σ loss spike, back ≥ 20 steps, 4 batches
  skipped) within 1% of it. The fault fires once per step, so the garbage the loop had
  already drawn when it rolled back is spent, and a second rollback clears the rest."""
  broken, _ = _run(tmp_path, "broken", **GARBAGE)
  assert broken["status"] == "diverged" or not _within_1_percent(broken, clean_run), (
      broken["eval_loss"], clean_run["eval_loss"])
  rescued, records = _run(tmp_path, "rescued", **GARBAGE, **ROLLBACK)
  assert _within_1_percent(rescued, clean_run), (rescued["eval_loss"], clean_run["eval_loss"])
  actions = rescued["instability_actions"]
  assert actions and all(a["rollback_to_step"] == 120 and "loss 6σ spike" in a["why"]
                         and 150 <= a["step"] <= 155 for a in actions), actions
  # One record each, at the step rolled back to (metrics.jsonl keeps it past the rollback).
  assert [(r["step"], r["rollback_from_step"]) for r in records if "rollback_to_step" in r] == [
      (a["rollback_to_step"], a["step"]) for a in actions]


@pytest.mark.slow
def test_skip_mode_skips_the_garbage_updates(tmp_path, clean_run):
  """train.on_instability=skip: the updates of the garbage batches are skipped inside the
  optimizer, one `skipped_step` record each and `train_skipped` in the window's train_*
  record (its mean over the 20 steps), and the run ends within 1% of the clean one."""
  summary, records = _run(tmp_path, "skip", **GARBAGE, **{"train.on_instability": "skip"})
  skipped = [r["skipped_step"] for r in records if "skipped_step" in r]
  assert skipped and set(skipped) <= {150, 151, 152, 153}, skipped
  window = next(r for r in records if r["step"] == 160 and "train_loss" in r)
  assert window["train_skipped"] * 20 == pytest.approx(len(skipped))
  assert all(r["train_skipped"] == 0 for r in records if "train_loss" in r and r["step"] < 160)
  assert [a["skipped_step"] for a in summary["instability_actions"]] == skipped
  assert _within_1_percent(summary, clean_run), (summary["eval_loss"], clean_run["eval_loss"])


def test_a_group_past_two_billion_entries_traces_without_a_host_array_of_its_size():
  """A 400B-parameter model's FFN: the counts behind each group's mean are numbers, not
  host arrays as long as a parameter's leading axis (a 3·10⁹-row matrix once asked for 22
  GiB of host memory while `lnjax compile` traced its step), and their sum, past 2³¹, is
  no int32 argument."""
  import tracemalloc
  cfg = ModelConfig(num_layers=1, d_model=4, num_heads=1, d_ff=8, vocab_size=8, max_len=8)
  stats = lambda t: health.rms_by_group(t, cfg, "grad_rms")
  wide = {"layer_0": {"ffn": {"wo": {"kernel": jax.ShapeDtypeStruct((2, 1_100_000_000),
                                                                    jnp.float32)}}}}
  assert [v.shape for v in jax.eval_shape(stats, wide).values()] == [()]  # 2.2·10⁹ entries.
  long = {"layer_0": {"ffn": {"wo": {"kernel": jax.ShapeDtypeStruct((50_000_000, 2),
                                                                    jnp.float32)},
                              "bias": jax.ShapeDtypeStruct((50_000_000,), jnp.float32)}}}
  tracemalloc.start()
  jax.eval_shape(stats, long)
  peak = tracemalloc.get_traced_memory()[1]
  tracemalloc.stop()
  assert peak < 50e6, peak  # (The per-row counts alone would be 400 MB a leaf.)
