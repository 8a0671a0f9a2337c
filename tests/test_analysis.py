"""Analysis tools: Jacobian spectral norms (paper §3)."""

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lnjax.analysis import spectral_norm
import forkserver


def test_power_iteration_equals_the_dense_svd():
  a = jax.random.normal(jax.random.key(0), (7, 5))
  fn = lambda x: jnp.tanh(a @ x)
  x = jax.random.normal(jax.random.key(1), (5,))
  dense = np.linalg.svd(np.asarray(jax.jacobian(fn)(x)), compute_uv=False)[0]
  assert float(spectral_norm(fn, x, iters=200)) == pytest.approx(dense, rel=1e-4)


@pytest.mark.parametrize("scale", [1.0, 2.0, 4.0, 8.0])
def test_layernorm_jacobian_is_sqrt_d_over_norm(scale):
  """arXiv 2002.04745 §3: ‖J_LN(x)‖₂ ≈ √d/‖x‖ (d = 256: 1.0651 at ‖x‖ = 15.0, halving as ‖x‖ doubles)."""
  d = 256
  x = jax.random.normal(jax.random.key(0), (d,)) * scale
  x = x - x.mean()
  ln = lambda v: (v - v.mean()) / jnp.sqrt(jnp.mean((v - v.mean()) ** 2) + 1e-5)
  sigma = float(spectral_norm(ln, x))
  assert sigma == pytest.approx(np.sqrt(d) / float(jnp.linalg.norm(x)), rel=2e-3)


def test_main_path_norms_follow_lemmas_1_and_2():
  """Post-LN: E‖c‖²/d = 3/2 before each layer's last LN, flat in depth; Pre-LN: between
  1 + l/2 and 1 + 3l/2, growing linearly (Xiong et al. 2020, arXiv 2002.04745, §3.2)."""
  from lnjax.analysis import theory
  draws = [theory.main_path_norms(seed, d=256, n=8, num_layers=8) for seed in range(3)]
  post = np.mean([r["post"] for r in draws], axis=0)
  pre = np.mean([r["pre"] for r in draws], axis=0)
  np.testing.assert_allclose(post, 1.5, atol=0.15)
  layers = np.arange(1, 9)
  assert np.all(pre >= 1 + layers / 2 - 0.05) and np.all(pre <= 1 + 3 * layers / 2)
  assert pre[-1] > 4 * pre[0]


def _smoke_config(**model):
  """The smoke LM on one device, with `model`'s overrides."""
  from lnjax.configs import common as config_lib
  c = config_lib.lm_config()
  config_lib.apply_smoke(c)
  c.mesh.data = 1
  c.model.update(model)
  return c


def _smoke_run(tmp_path_factory, name: str, opt: dict | None = None, train_: dict | None = None,
               **model) -> str:
  from lnjax import tasks
  from lnjax.core import train
  c = _smoke_config(**model)
  c.train.num_steps = 10
  c.opt.update(opt or {})
  c.train.update(train_ or {})
  wd = str(tmp_path_factory.mktemp("analysis") / name)
  train.train_and_evaluate(c, wd, tasks=tasks.get)
  return wd


def _config_only_run(tmp_path_factory, name: str, **model) -> str:
  """The smoke LM's workdir as training writes it before its first step: config.json, the
  resolved config of the run built from it (lnjax/core/train.py), all that the analysis
  at init reads; no step trained."""
  from lnjax import tasks
  from lnjax.core import build, checkpoint
  c = _smoke_config(**model)
  wd = str(tmp_path_factory.mktemp("analysis") / name)
  os.makedirs(wd)
  checkpoint.save_config(wd, build.build(c, build.one_device_mesh(), tasks=tasks.get).config)
  return wd


@pytest.fixture(scope="module")
def smoke_workdir(tmp_path_factory):
  return _smoke_run(tmp_path_factory, "run")


@pytest.mark.slow
@pytest.mark.parametrize("step", ["init", "latest"])
def test_analyze_writes_per_layer_measurements(smoke_workdir, step):
  import os
  from lnjax.analysis import report as analyze
  result, out = analyze.analyze(smoke_workdir, step, num_batches=2, lr=1e-3)
  assert result["step"] == ("init" if step == "init" else "10")
  for name in ("analysis.json", "report.md", "gradients.png"):
    assert os.path.exists(os.path.join(out, name))
  w2 = analyze.per_layer(result["gradient_norms"], "ffn/wo/kernel")["lm"]
  assert [layer for layer, _ in w2] == [0, 1] and all(v > 0 for _, v in w2)
  # Every norm measured, Pre-LN's final one included; LN Jacobians ≈ √d/‖x − μ‖ (γ = 1 at
  # init; trained γ moves them, so the check is at init only).
  assert "final_norm" in result["norms"] and "layer_0/self_attn_norm" in result["norms"]
  if step == "init":
    for j in result["norm_jacobians"].values():
      assert j["spectral_norm"] == pytest.approx(j["sqrt_d_over_norm"], rel=0.02)
  assert all(r > 0 for r in result["update_ratios"].values())


@pytest.mark.slow
def test_analyze_cli_refuses_a_non_workdir(tmp_path):
  import sys
  r = forkserver.run([sys.executable, "-m", "lnjax.cli.analyze", f"--workdir={tmp_path}",
                      "--step=init"], capture_output=True, text=True, timeout=120)
  assert r.returncode == 2 and "not an lnjax workdir" in r.stderr
  assert len(r.stderr.strip().splitlines()) == 1


@pytest.mark.slow
def test_analyze_reads_a_scanned_checkpoint_per_layer(tmp_path_factory):
  """A run trained with model.scan_layers is analysed layer by layer: its gradients taken
  through the scanned model, unstacked, are what the analysis reports per layer."""
  from lnjax.analysis import report as analyze
  from lnjax import tasks
  from lnjax.core import checkpoint, sharding
  from lnjax.analysis import probes
  from lnjax.models.transformer import unscan_params
  wd = _smoke_run(tmp_path_factory, "scanned", scan_layers=True)
  result, _ = analyze.analyze(wd, "latest", num_batches=2, lr=1e-3)
  w2 = analyze.per_layer(result["gradient_norms"], "ffn/wo/kernel")["lm"]
  assert [layer for layer, _ in w2] == [0, 1] and all(v > 0 for _, v in w2)
  assert "layer_1/self_attn_norm" in result["norms"]

  mesh = sharding.make_mesh(sharding.MeshConfig(data=1), jax.local_devices()[:1])
  restored = checkpoint.restore_run(wd, None, mesh, tasks=tasks.get)
  data = restored.run.task.make_data(restored.run.data, restored.run.seed, 0, 1, 1)
  batches = [{k: v for k, v in b.items() if k != "index"} for b in data.eval_batches()[:2]]
  # The loss and its gradients through the scanned model as one program (the loss, taken
  # eagerly, compiled each operation on its own: the test alone, CPU 12.7 -> 11.5 s,
  # 2026-12-07, 2-core machine).
  loss, grads = jax.jit(jax.value_and_grad(
      lambda p: probes.mean_loss(p, restored.setup, batches)))(restored.state.params)
  want = probes.gradient_norms(unscan_params(grads, restored.run.model))
  assert set(result["gradient_norms"]) == set(want)
  for name, value in want.items():
    assert result["gradient_norms"][name] == pytest.approx(value, rel=1e-4, abs=1e-7), name
  assert result["loss"] == pytest.approx(float(loss), abs=1e-5)


def test_the_report_reads_a_gated_ffns_gate_as_its_input_weight():
  """A gated FFN (SwiGLU: ffn/wi_gate, ffn/wi_up, ffn/wo) has no ffn/wi: the report's W¹
  column and panel read the gate's gradient instead of coming out empty."""
  from lnjax.analysis import report
  gated = {"layer_0/ffn/wi_gate/kernel": 1.0, "layer_0/ffn/wi_up/kernel": 2.0,
           "layer_1/ffn/wi_gate/kernel": 3.0}
  suffix = report.ffn_input_suffix(gated)
  assert report.per_layer(gated, suffix) == {"lm": [(0, 1.0), (1, 3.0)]}
  assert report.ffn_input_suffix({"layer_0/ffn/wi/kernel": 1.0}) == "ffn/wi/kernel"


@pytest.fixture(scope="module")
def tiny_skip_workdir(tmp_path_factory):
  """A 10-step run of a one-layer LM of width 4 (844 parameters) that skips spikes
  (`train.on_instability=skip`; none comes, so Adam counts all 10 updates): the two tests
  below read it, trained once."""
  return _smoke_run(tmp_path_factory, "tiny_skip", train_={"on_instability": "skip"},
                    num_layers=1, d_model=4, num_heads=1, d_ff=8)


@pytest.fixture(scope="module")
def tiny_skip_analysis(tiny_skip_workdir):
  """`lnjax analyze --step=latest --batches=1 --lr=1e-3 --sharpness=40` of the module's run:
  (analysis.json's result, its folder), which the two tests below read (an analysis of its
  own each: their CPU 15.6 s, 14.5 s with this one; 2026-12-07, 2-core machine)."""
  from lnjax.analysis import report as analyze
  return analyze.analyze(tiny_skip_workdir, "latest", num_batches=1, lr=1e-3, sharpness_iters=40)


@pytest.mark.slow  # A 10-step training run and its analysis (the module's, shared).
def test_analyze_restores_a_run_that_skips_spikes(tiny_skip_analysis):
  """`train.on_instability=skip` wraps the optimizer (health.skip_spikes): its checkpoints
  hold the wrapper's state, which the analysis restores as the run saved it; the sharpness
  takes Adam's count from the inner state."""
  result, _ = tiny_skip_analysis
  assert result["step"] == "10" and np.isfinite(result["sharpness"]["adam_top"])


@pytest.mark.slow  # The module's 10-step run and an SGD one; the dense Hessian (844²).
def test_analyze_reports_the_hessians_top_eigenvalue_and_adams(tiny_skip_workdir,
                                                               tiny_skip_analysis,
                                                               tmp_path_factory):
  """`lnjax analyze --sharpness=N`: λ_max(H) and λ_max(P⁻¹H) against numpy's eigenvalues of
  the dense Hessian (jax.hessian of the flattened parameters) and Adam's (1 − β₁ᵗ)(√v̂ + ε)
  written out from the checkpoint's second moment (Adam's state inside the skip wrapper of
  the module's run); 38/λ_max(P⁻¹H) is the reported edge."""
  from jax.flatten_util import ravel_pytree

  from lnjax import tasks
  from lnjax.analysis import probes, report as analyze
  from lnjax.core import checkpoint, sharding

  wd = tiny_skip_workdir
  result, out = tiny_skip_analysis
  sharp = result["sharpness"]
  assert "Lanczos" in open(os.path.join(out, "report.md")).read()

  mesh = sharding.make_mesh(sharding.MeshConfig(data=1), jax.local_devices()[:1])
  restored = checkpoint.restore_run(wd, None, mesh, tasks=tasks.get)
  data = restored.run.task.make_data(restored.run.data, restored.run.seed, 0, 1, 1)
  batches = [{k: v for k, v in b.items() if k != "index"} for b in data.eval_batches()[:1]]
  flat, unravel = ravel_pytree(restored.state.params)
  hessian = np.asarray(jax.jit(jax.hessian(lambda f: probes.mean_loss(
      unravel(f), restored.setup, batches)))(flat), np.float64)
  hessian = (hessian + hessian.T) / 2
  assert sharp["hessian_top"] == pytest.approx(np.linalg.eigvalsh(hessian)[-1], rel=1e-3)

  opt = restored.run.opt
  (adam,) = [s for s in jax.tree.leaves(restored.state.opt_state, is_leaf=lambda s: hasattr(
      s, "nu")) if hasattr(s, "nu")]
  nu = np.asarray(ravel_pytree(adam.nu)[0], np.float64)
  assert int(adam.count) == 10
  p = (1 - opt.b1 ** 10) * (np.sqrt(nu / (1 - opt.b2 ** 10)) + opt.eps)  # Adam's m̂ = m/(1 − β₁ᵗ).
  want = np.linalg.eigvalsh(hessian / np.sqrt(p)[:, None] / np.sqrt(p)[None, :])[-1]
  assert sharp["adam_top"] == pytest.approx(want, rel=1e-3)
  assert sharp["adam_edge"] == pytest.approx(38 / want, rel=1e-3)
  lr_last = float(restored.setup.schedule(9))  # The rate of the 10th, last, update.
  assert sharp["lr_at_step"] == pytest.approx(lr_last)
  assert sharp["edge_fraction"] == pytest.approx(lr_last * want / 38, rel=1e-3)
  init, _ = analyze.analyze(wd, "init", num_batches=1, sharpness_iters=5)
  assert "adam_top" not in init["sharpness"] and "no optimizer state" in init["sharpness"]["adam"]
  # SGD, no preconditioner: λ_max(H) against its own threshold, (2 + 2β)/(1 + 2β) Nesterov's.
  sgd = _smoke_run(tmp_path_factory, "sgd", {"name": "sgd", "learning_rate": 0.1,
                                             "momentum": 0.5, "nesterov": True},
                   num_layers=1, d_model=4, num_heads=1, d_ff=8)
  result, out = analyze.analyze(sgd, "latest", num_batches=1, sharpness_iters=20)
  sharp = result["sharpness"]
  assert sharp["sgd_edge"] == pytest.approx(1.5 / sharp["hessian_top"]) and "adam" not in sharp
  assert sharp["edge_fraction"] == pytest.approx(0.1 * sharp["hessian_top"] / 1.5)
  assert "SGD with Nesterov momentum 0.5 is stable" in open(os.path.join(out, "report.md")).read()


def test_analysis_json_is_strict_json():
  """A norm's input of zero (Gemma's padding embedding) gives √d/‖x‖ = inf, a diverged
  checkpoint NaN losses: analysis.json writes them as null, which jq and JavaScript read,
  not Python's bare NaN and Infinity."""
  from lnjax.core import fileio

  def refuse(word):
    raise ValueError(word)
  text = fileio.json_text({"loss": float("nan"), "jacobians": [1.0, float("inf"), -float("inf")],
                           "norm": {"x": np.float64(2.5)}})
  assert json.loads(text, parse_constant=refuse) == {"loss": None, "jacobians": [1.0, None, None],
                                                     "norm": {"x": 2.5}}


def _norm_record(module, x_NxD, seed: int):
  """probes.summarize_norms' record of `module` (unbound) at input vectors x, its parameters
  drawn at random around their init (so a (1 + w) gain, α and the shift all matter)."""
  import flax.linen as nn
  params = nn.unbox(module.init(jax.random.key(seed), x_NxD[:1])["params"])
  keys = iter(jax.random.split(jax.random.key(seed + 1), len(params)))
  params = {k: v + 0.3 * jax.random.normal(next(keys), v.shape) for k, v in params.items()}
  return {"tokens": np.asarray(x_NxD), "d": x_NxD.shape[-1], "module": module,
          "params": params}


def test_norm_jacobians_of_every_norm_module_match_the_dense_jacobian():
  """probes.ln_jacobians of RMSNorm with and without Gemma's (1 + w) gain, DyT and Derf
  (which have no ε) in one call: each is its own module's ‖J‖₂, checked against the
  singular values of jax.jacfwd's dense Jacobian (point-wise Derf: diag(γ α erf'(αx + s)))."""
  from lnjax.analysis import probes
  from lnjax.models import norms
  x = jax.random.normal(jax.random.key(0), (3, 16)) * 2.0 + 0.5
  modules = {"rms": norms.RMSNorm(), "rms_offset": norms.RMSNorm(unit_offset=True),
             "ln": norms.LayerNorm(), "dyt": norms.DyT(), "derf": norms.Derf(),
             "derf_offset": norms.Derf(unit_offset=True)}
  records = {k: _norm_record(m, x, i) for i, (k, m) in enumerate(modules.items())}
  got = probes.ln_jacobians(records, iters=100)
  for name, r in records.items():
    fn = lambda v, r=r: r["module"].apply({"params": r["params"]}, v[None])[0]
    dense = [np.linalg.svd(np.asarray(jax.jacfwd(fn)(v)), compute_uv=False)[0] for v in x]
    assert got[name]["spectral_norm"] == pytest.approx(np.mean(dense), rel=1e-3), name
  p, a = records["derf"]["params"], x
  erf_prime = 2 / np.sqrt(np.pi) * np.exp(-np.square(p["alpha"] * a + p["shift"]))
  exact = np.max(np.abs(p["scale"] * p["alpha"] * erf_prime), -1)
  assert got["derf"]["spectral_norm"] == pytest.approx(float(np.mean(exact)), rel=1e-3)
  assert got["derf"]["spectral_norm"] != pytest.approx(1.0, rel=0.05)  # not the identity's


@pytest.mark.slow
@pytest.mark.parametrize("placement", ["derf", "ngpt"])
def test_analyze_finds_pointwise_norms_and_plots_without_any(tmp_path_factory, placement):
  """Derf's (and DyT's) point-wise norms are measured like LN's: every one found, with its
  own Jacobian (not the identity's 1); nGPT's x/‖x‖ on the stream, q and k too, its
  Jacobian (I − x̂x̂ᵀ)/‖x‖ of spectral norm 1/‖x‖ (once missed: an empty table and a
  traceback on the empty Jacobian panel). At init, which a run's config.json alone gives."""
  from lnjax.analysis import report as analyze
  wd = _config_only_run(tmp_path_factory, placement, norm_position=placement)
  result, out = analyze.analyze(wd, "init", num_batches=1, lr=1e-3)
  for name in ("analysis.json", "report.md", "gradients.png"):
    assert os.path.exists(os.path.join(out, name))
  if placement == "ngpt":
    want = {"embed_unit", *(f"layer_{i}/{n}" for i in range(2) for n in (
        "self_attn_unit", "self_attn_out_unit", "ffn_unit", "ffn_out_unit",
        "self_attn/qk_scale/query_unit", "self_attn/qk_scale/key_unit"))}
    assert set(result["norms"]) == want == set(result["norm_jacobians"])
    for j in result["norm_jacobians"].values():
      assert j["spectral_norm"] == pytest.approx(j["sqrt_d_over_norm"], rel=1e-3)
    return
  want = {"final_norm", *(f"layer_{i}/{n}" for i in range(2)
                          for n in ("self_attn_norm", "ffn_norm"))}
  assert set(result["norms"]) == want == set(result["norm_jacobians"])
  for j in result["norm_jacobians"].values():
    # At init γ = 1, α = 0.5, s = 0: ‖J‖₂ = max_i 0.5·erf'(0.5 x_i) ≤ 1/√π.
    assert 0.3 < j["spectral_norm"] <= 1 / np.sqrt(np.pi) + 1e-6


def test_rmsnorm_jacobian_reference_is_uncentred():
  """At unit gain RMSNorm's Jacobian is (√d/‖x‖)(I − x̂x̂ᵀ), ‖J‖₂ = √d/‖x‖ exactly: the
  reference beside it takes no mean off x (LN's √d/‖x − μ‖ would, wrongly, for x with a
  mean); LayerNorm's stays centred."""
  import flax.linen as nn
  from lnjax.analysis import probes
  from lnjax.models import norms
  x = jax.random.normal(jax.random.key(0), (4, 8)) + 1.5  # A large mean: the two differ.
  records = {}
  for name, module in (("rms", norms.RMSNorm(eps=1e-12)), ("ln", norms.LayerNorm(eps=1e-12))):
    params = nn.unbox(module.init(jax.random.key(1), x[:1])["params"])
    records[name] = {"tokens": np.asarray(x), "d": 8, "module": module, "params": params}
  got = probes.ln_jacobians(records, iters=100)
  for j in got.values():
    assert j["spectral_norm"] == pytest.approx(j["sqrt_d_over_norm"], rel=1e-3)
  assert got["rms"]["sqrt_d_over_norm"] == pytest.approx(
      float(np.mean(np.sqrt(8) / np.linalg.norm(np.asarray(x), axis=-1))), rel=1e-6)


@pytest.mark.slow  # (The fast tier keeps RMSNorm's reference, above.)
def test_each_norm_states_its_jacobian_reference():
  """Each module of norms.MODULES states on its own class the reference that lnjax analyze
  sets beside its measured ‖J(x)‖₂, radius/‖x − μ‖: `centred` (μ the mean of x, else 0)
  and `radius_power` (the unit-gain output's radius d^p: √d; 1 for nGPT's x/‖x‖); the probe
  reads them (it picked them by a list of classes, which a new norm was not in). At unit
  gain and a random input with a large mean (where centring matters) the reference is
  ‖J(x)‖₂ of jax.jacobian's dense Jacobian; a point-wise norm (a diagonal Jacobian: DyT,
  Derf) is set beside LayerNorm's, the norm it stands in for."""
  import dataclasses

  import flax.linen as nn
  from lnjax.analysis import probes
  from lnjax.models import norms
  d = 16
  x = jax.random.normal(jax.random.key(0), (3, d)) + 1.5

  def jacobians(cls):  # At init (unit gain; ScaleNorm's g = √d), ε negligible.
    eps = {"eps": 1e-12} if "eps" in {f.name for f in dataclasses.fields(cls)} else {}
    module = cls(**eps)
    params = nn.unbox(module.init(jax.random.key(1), x[:1])).get("params", {})
    fn = lambda v: module.apply({"params": params}, v[None])[0]
    return module, params, [np.asarray(jax.jacobian(fn)(v)) for v in x]

  for cls in norms.MODULES:
    assert {"centred", "radius_power"} <= set(vars(cls)), f"{cls.__name__} declares neither"
    module, params, js = jacobians(cls)
    if all(np.allclose(j, np.diag(np.diag(j))) for j in js):  # Point-wise: LN's reference.
      js = jacobians(norms.LayerNorm)[2]
    want = np.mean([np.linalg.svd(j, compute_uv=False)[0] for j in js])
    got = probes.ln_jacobians({"n": {"tokens": np.asarray(x), "d": d, "module": module,
                                     "params": params}}, iters=2)["n"]["sqrt_d_over_norm"]
    assert got == pytest.approx(float(want), rel=1e-4), cls.__name__
