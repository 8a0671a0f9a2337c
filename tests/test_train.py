"""End to end: smoke training, resume equality, divergence, preemption, corrupt
checkpoints, restore onto another mesh, and the CLI's one-line refusals."""

import functools
import hashlib
import json
import os
import signal
import subprocess
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from conftest import assert_same_final_state
from lnjax import tasks
from lnjax.configs import common as config_lib
from lnjax.core import checkpoint, errors, metrics, run as run_lib, sharding, steps, train
import forkserver

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def smoke_config(**overrides):
  """configs/lm.py:smoke with `overrides` ({'opt.learning_rate': 1e-2, ...})."""
  c = config_lib.lm_config()
  config_lib.apply_smoke(c)
  c.mesh.data = 1  # One device: the sharded cases are in test_sharding.py.
  for key, value in overrides.items():
    section, name = key.split(".")
    c[section][name] = value
  return c


def train_losses(workdir):
  """{step: train_loss}, the later record winning (a resumed run re-logs its steps)."""
  return {r["step"]: r["train_loss"] for r in metrics.read_metrics(workdir) if "train_loss" in r}


def test_smoke_run_learns_and_writes_its_workdir(tmp_path):
  wd = str(tmp_path / "run")
  summary = train.train_and_evaluate(smoke_config(**{"train.num_steps": 40}), wd, tasks=tasks.get)
  assert summary["status"] == "completed" and summary["step"] == 40
  losses = train_losses(wd)
  assert losses[40] < losses[5] - 0.3, losses
  evals = [r for r in metrics.read_metrics(wd) if "eval_loss" in r]
  assert [r["step"] for r in evals] == [10, 20, 30, 40]
  assert evals[-1]["eval_loss"] < evals[0]["eval_loss"]
  assert evals[-1]["eval_unigram_baseline"] == pytest.approx(summary["unigram_baseline"])
  assert sorted(os.listdir(os.path.join(wd, "checkpoints"))) == ["20", "30", "40"]
  saved = json.load(open(os.path.join(wd, "summary.json")))
  assert saved["eval_loss"] == pytest.approx(summary["eval_loss"])
  assert json.load(open(os.path.join(wd, "config.json")))["model"]["vocab_size"] > 0


# The run the resume tests compare against: 20 steps with dropout, every loss logged.
UNINTERRUPTED = {"train.log_every_steps": 1, "model.dropout_rate": 0.1}


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
  """configs/lm.py:smoke with UNINTERRUPTED, 20 steps, checkpoints at 10 and 20 (shared)."""
  wd = str(tmp_path_factory.mktemp("full") / "run")
  train.train_and_evaluate(smoke_config(**UNINTERRUPTED), wd, tasks=tasks.get)
  return wd


@pytest.mark.slow
def test_resume_reproduces_the_uninterrupted_run(uninterrupted, tmp_path):
  """Stop at step 10, run the same command again: steps 11..20 match exactly (CPU)."""
  overrides = UNINTERRUPTED
  full = uninterrupted
  parts = str(tmp_path / "parts")
  first = train.train_and_evaluate(smoke_config(**overrides, **{"train.num_steps": 10}), parts,
                                   tasks=tasks.get)
  summary = train.train_and_evaluate(smoke_config(**overrides), parts, tasks=tasks.get)
  assert summary["status"] == "completed"
  # Wall time adds up over the segments; asking a finished run again leaves it as it was.
  assert summary["wall_seconds"] > first["wall_seconds"] > 0
  again = train.train_and_evaluate(smoke_config(**overrides), parts, tasks=tasks.get)
  assert again["wall_seconds"] == summary["wall_seconds"]
  assert again["eval_loss"] == pytest.approx(summary["eval_loss"])
  a, b = train_losses(full), train_losses(parts)
  assert [a[s] for s in range(1, 21)] == [b[s] for s in range(1, 21)]
  assert_same_final_state(full, parts)


@pytest.mark.slow
def test_logged_train_loss_is_the_mean_of_the_windows_step_losses(uninterrupted, tmp_path):
  """A logged train_loss is the mean over its logging window of the per-step losses of the
  same seed's run: those of the run that logs every step, averaged here in numpy (windows of
  6 steps and a last one of 2). That run's own first loss is against a hand-computed value:
  at initialization the model predicts about uniformly, a loss near ln V (ln 67 = 4.20)."""
  every_step = train_losses(uninterrupted)
  vocab_size = json.load(open(os.path.join(uninterrupted, "config.json")))["model"]["vocab_size"]
  assert abs(every_step[1] - np.log(vocab_size)) < 0.5, (every_step[1], vocab_size)
  wd = str(tmp_path / "every6")
  train.train_and_evaluate(smoke_config(**{**UNINTERRUPTED, "train.log_every_steps": 6}), wd,
                           tasks=tasks.get)
  windows = train_losses(wd)
  assert sorted(windows) == [6, 12, 18, 20]
  for first, last in ((1, 6), (7, 12), (13, 18), (19, 20)):
    expected = np.mean([every_step[s] for s in range(first, last + 1)])
    assert windows[last] == pytest.approx(expected, rel=1e-6), (last, windows, every_step)


@functools.cache
def _tiny_lm(rate: float):
  """(setup, state, batch) of a one-layer LM with dropout `rate` at step 0 on one device, for
  the dropout tests below (shared, read-only: _at gives the state at another step)."""
  from lnjax.core import optim, state as state_lib
  from lnjax.models import ModelConfig

  batch = {"inputs": np.arange(32, dtype=np.int32).reshape(2, 16) % 13 + 1,
           "weights": np.ones((2, 16), np.float32)}
  batch["targets"] = (batch["inputs"] + 1) % 13 + 1
  mesh = sharding.make_mesh(sharding.MeshConfig(data=1), jax.devices()[:1])
  cfg = ModelConfig(vocab_size=16, num_layers=1, d_model=32, num_heads=2, d_ff=64,
                    max_len=16, dropout_rate=rate)
  setup = state_lib.make_setup(cfg, optim.OptConfig(), 10, task=tasks.get("lm"))
  return setup, state_lib.init_state(setup, mesh, 0), batch


@functools.cache
def _tiny_loss(rate: float, generator: str = run_lib.TrainConfig.dropout_rng):
  """The loss of _tiny_lm(rate)'s jitted train step, its masks from `generator` (by default
  train_step's own default). Shared: each step program traced and compiled once for the
  dropout tests (the five's CPU 3.9 -> 2.5 s, 2026-12-07, 2-core machine)."""
  setup = _tiny_lm(rate)[0]
  return jax.jit(lambda s, b: steps.train_step(s, b, setup=setup, label_smoothing=0.0, seed=0,
                                               dropout_rng=generator)[1]["train_loss"])


def _at(state, t: int):
  """`state` at step t, an int32 as the state holds it (so every t runs the one program)."""
  return state.replace(step=jnp.asarray(t, state.step.dtype))


def test_dropout_draws_new_masks_at_every_step():
  """The resume tests compare two runs that draw their masks alike, so a key that never
  changed (the same mask at every step) would pass them. Here: from one state and batch,
  the step's loss is the same when repeated and changes with the step number (dropout
  0.1), and does not change with it without dropout."""
  losses = {}
  for rate in (0.1, 0.0):
    _, state, batch = _tiny_lm(rate)
    step = _tiny_loss(rate)
    losses[rate] = [float(step(_at(state, t), batch)) for t in (0, 0, 1)]
  assert losses[0.1][0] == losses[0.1][1] != losses[0.1][2], losses
  assert losses[0.0][0] == losses[0.0][2], losses


@pytest.mark.parametrize("rng, op", [("threefry2x32", "threefry2x32"), ("rbg", "rng_bit_generator"),
                                     pytest.param("unsafe_rbg", "rng_bit_generator",
                                                  marks=pytest.mark.slow)])
def test_dropout_masks_come_from_the_configured_generator(rng, op):
  """train.dropout_rng: threefry's masks are hashes in the program; rbg's and unsafe_rbg's
  come from XLA's RngBitGenerator (what makes libtpu's compile shorter). Either way the masks
  are a function of (seed, step): the same step's loss repeats, the next step's differs,
  and they differ from threefry's."""
  _, state, batch = _tiny_lm(0.1)
  lowered = _tiny_loss(0.1, rng).lower(state, batch)
  text = lowered.as_text()
  assert op in text  # (rbg folds keys with threefry, then draws the bits with the op.)
  assert ("rng_bit_generator" in text) == (rng != "threefry2x32")
  step = lowered.compile()  # (The program read above, not lowered again by a call.)
  losses = [float(step(_at(state, t), batch)) for t in (0, 0, 1)]
  assert losses[0] == losses[1] != losses[2], losses
  if rng != "threefry2x32":
    assert losses[0] != float(_tiny_loss(0.1, "threefry2x32")(state, batch))


def test_an_unknown_dropout_generator_is_refused():
  with pytest.raises(errors.ConfigError, match="train.dropout_rng.*threefry2x32"):
    run_lib.TrainConfig(dropout_rng="mt19937")


def test_cudnn_attention_off_a_gpu_is_a_one_line_refusal():
  """model.attention_impl='cudnn' on CPU devices: one ConfigError (exit 2) as the run is
  built, before data or compile, not jax's "cuDNN is not detected" traceback at step 1."""
  from lnjax.core import build
  config = smoke_config(**{"model.attention_impl": "cudnn", "model.dtype": "bfloat16"})
  mesh = sharding.make_mesh(sharding.MeshConfig(data=1), jax.devices("cpu")[:1])
  with pytest.raises(errors.ConfigError, match="attention_impl='cudnn' needs NVIDIA GPUs, "
                     "not cpu") as e:
    build.build(config, mesh, tasks=tasks.get)
  assert e.value.exit_code == 2


@pytest.mark.slow
def test_label_smoothing_changes_the_update(tmp_path):
  """train.label_smoothing reaches the objective: step 1's reported loss (the NLL, from the
  same initialization) is the same with and without it, step 2's (after one update of
  another gradient) is not."""
  losses = {}
  for eps in (0.0, 0.3):
    wd = str(tmp_path / f"ls{eps}")
    # (One layer: the objective is the point, not the depth; the test alone: CPU 7.4 -> 5.9 s,
    # 2026-12-07, 2-core machine.)
    train.train_and_evaluate(smoke_config(**{"train.num_steps": 2, "train.log_every_steps": 1,
                                             "train.label_smoothing": eps,
                                             "model.num_layers": 1}), wd, tasks=tasks.get)
    losses[eps] = train_losses(wd)
  assert losses[0.0][1] == losses[0.3][1]
  assert abs(losses[0.0][2] - losses[0.3][2]) > 1e-4, losses


@pytest.mark.slow
def test_divergence_exits_with_code_3(tmp_path):
  """A NaN/Inf loss ends the run (the loss threshold off): exit code 3, the status, step and last finite loss in
  summary.json, no evaluation or checkpoint of the diverged state."""
  wd = str(tmp_path / "nan")
  r = run_cli("--config=configs/default.py:smoke", f"--workdir={wd}", "--config.mesh.data=1",
              "--config.opt.name=sgd", "--config.opt.learning_rate=1e12",
              "--config.train.divergence_factor=0",  # Only the NaN/Inf rule.
              # One layer diverges as two do, in less of the command's compile (the test
              # alone: CPU 5.6 -> 4.9 s, 2026-12-07, 2-core machine).
              "--config.model.num_layers=1")
  assert r.returncode == 3, (r.returncode, r.stdout[-1000:], r.stderr[-2000:])
  assert "== diverged at step" in r.stdout and "last finite train loss" in r.stdout
  summary = json.load(open(os.path.join(wd, "summary.json")))
  assert summary["status"] == "diverged"
  assert summary["step"] <= 20 and summary["last_finite_train_loss"] is not None
  assert summary["last_finite_step"] < summary["step"]
  assert not [r for r in metrics.read_metrics(wd) if "eval_loss" in r]
  saved = os.listdir(os.path.join(wd, "checkpoints")) if os.path.isdir(
      os.path.join(wd, "checkpoints")) else []
  assert all(int(s) < summary["step"] for s in saved), saved


@pytest.mark.slow
def test_restore_onto_another_mesh(tmp_path):
  """Trained on a data×model mesh of 8 devices (2 steps: the checkpoint's layout, not the
  training, is the point); restored onto one device and onto 2×2×2. One layer: its
  sharded programs are this test's own (no other test compiles them), and layer_0's
  layout is the one checked (the test alone, cold cache: CPU 5.7 -> 3.9 s, 2026-12-07,
  2-core machine)."""
  wd = str(tmp_path / "mesh")
  c = smoke_config(**{"train.num_steps": 2, "model.num_layers": 1})
  c.mesh.data, c.mesh.model = 4, 2
  train.train_and_evaluate(c, wd, tasks=tasks.get)
  one = checkpoint.restore_run(wd, tasks=tasks.get)
  assert {d for leaf in jax.tree.leaves(one.state) for d in leaf.devices()} == {jax.devices()[0]}
  mesh = sharding.make_mesh(sharding.MeshConfig(data=2, fsdp=2, model=2))
  eight = checkpoint.restore_run(wd, mesh=mesh, tasks=tasks.get)
  wi = eight.state.params["layer_0"]["ffn"]["wi"]["kernel"]
  assert wi.addressable_shards[0].data.shape == (32 // 2, 64 // 2)
  for x, y in zip(jax.tree.leaves(one.state), jax.tree.leaves(eight.state)):
    np.testing.assert_array_equal(x, y)
  assert one.step == 2 and int(one.state.step) == 2


@pytest.mark.slow
def test_corrupt_latest_checkpoint_falls_back_to_the_previous(uninterrupted, tmp_path, capsys):
  """The latest checkpoint (20) unreadable: it is moved aside, the run resumes from step 10
  and trains steps 11..20 again, as the uninterrupted run did."""
  import shutil
  wd = str(tmp_path / "corrupt")
  shutil.copytree(uninterrupted, wd)  # Checkpoints at 10 and 20.
  _corrupt(os.path.join(wd, "checkpoints", "20"))
  summary = train.train_and_evaluate(smoke_config(**UNINTERRUPTED), wd, tasks=tasks.get)
  out = capsys.readouterr().out
  assert "checkpoint at step 20" in out and "Resuming" in out and "from step 10" in out
  assert summary["status"] == "completed" and summary["step"] == 20
  assert "step     11/20" in out  # Trained again from step 11, not taken as finished.
  assert train_losses(wd) == train_losses(uninterrupted)
  assert os.path.isdir(os.path.join(wd, "corrupt_checkpoints", "20"))


def _corrupt(step_dir):
  for root, _, files in os.walk(os.path.join(step_dir, "state")):
    for f in files:
      with open(os.path.join(root, f), "w") as fh:
        fh.write("garbage")


# ---- The command line: one-line errors, non-zero exits, nothing overwritten.

def run_cli(*args, timeout=240, **popen):
  env = {**os.environ, "PYTHONUNBUFFERED": "1"}
  return forkserver.run([sys.executable, "-m", "lnjax.main", *args], cwd=REPO, env=env,
                        capture_output=True, text=True, timeout=timeout, **popen)


def snapshot(path):
  """Every file under `path` with its content hash and mtime."""
  out = {}
  for root, _, files in os.walk(path):
    for f in files:
      p = os.path.join(root, f)
      out[p] = (hashlib.sha256(open(p, "rb").read()).hexdigest(), os.stat(p).st_mtime_ns)
  return out


def default_smoke_config(**overrides):
  """configs/default.py:smoke on one device, as `--config=configs/default.py:smoke
  --config.mesh.data=1` gives it, with `overrides` ({'train.num_steps': 30, ...})."""
  from configs import default
  c = default.get_config("smoke")
  with c.unlocked():
    c.mesh.data = 1
    for key, value in overrides.items():
      section, name = key.split(".")
      c[section][name] = value
  return c


@pytest.fixture(scope="module")
def finished_workdir(uninterrupted, tmp_path_factory):
  """A finished run: a copy of the resume tests' configs/lm.py:smoke run (`uninterrupted`,
  checkpoints at 10 and 20), which the command lines below find as their own. (A
  configs/default.py:smoke run of its own cost a train step's compile and a training run,
  the fixture's CPU 2.9 s, 2026-12-07, 2-core machine; the refusals below need a finished
  workdir, not that config's.)"""
  import shutil
  wd = str(tmp_path_factory.mktemp("cli") / "run")
  shutil.copytree(uninterrupted, wd)
  assert json.load(open(os.path.join(wd, "summary.json")))["status"] == "completed"
  return wd


def _one_line_error(r, *needles):
  assert r.returncode == 2, (r.returncode, r.stdout[-500:], r.stderr[-2000:])
  lines = [l for l in r.stderr.splitlines() if l.strip()]
  assert len(lines) == 1, r.stderr
  assert lines[0].startswith("lnjax: error: "), lines[0]
  for n in needles:
    assert n in lines[0], lines[0]


@pytest.mark.slow
def test_cli_refuses_bad_config_before_compute(finished_workdir):
  """A key no section has: one line from the command line's parsing, the workdir untouched.
  A bad value of a known key: a one-line ConfigError (exit code 2) from
  train.train_and_evaluate, the function the command line hands its config to (and whose
  LnjaxErrors it reports in one line: the refusals below), before anything is written."""
  before = snapshot(finished_workdir)
  r = run_cli("--config=configs/default.py:smoke", f"--workdir={finished_workdir}",
              "--config.model.norm_place=pre")
  _one_line_error(r, "unknown config key model.norm_place")
  assert snapshot(finished_workdir) == before
  for key, value, needles in (
      ("model.norm_position", "middle", ["model.norm_position='middle' is not one of: post, pre"]),
      ("opt.warmup_steps", -5, ["opt.warmup_steps=-5"]),
      ("opt.schedule", "noam", ["opt.schedule='noam'", "inverse_sqrt"])):
    with pytest.raises(errors.ConfigError) as e:
      train.train_and_evaluate(default_smoke_config(**{key: value}), finished_workdir,
                               tasks=tasks.get)
    assert e.value.exit_code == 2 and "\n" not in str(e.value), str(e.value)
    for n in needles:
      assert n in str(e.value), str(e.value)
    assert snapshot(finished_workdir) == before


@pytest.mark.slow
def test_cli_refuses_unknown_preset(tmp_path):
  r = run_cli("--config=configs/lm.py:norm=middle", f"--workdir={tmp_path}/x")
  _one_line_error(r, "norm must be one of: post, pre")
  assert not os.path.exists(tmp_path / "x")


@pytest.mark.slow
def test_cli_missing_and_empty_corpus(tmp_path):
  """A missing corpus: one line on the command line. An empty one: the same DataError
  path, raised by train.train_and_evaluate in this process. Neither leaves a file."""
  from lnjax.data import paths
  empty_dir = tmp_path / "nodata"
  empty_dir.mkdir()
  r = run_cli("--config=configs/default.py:smoke", f"--workdir={tmp_path}/a",
              f"--config.data.data_dir={empty_dir}", f"--config.data.cache_dir={tmp_path}/c")
  _one_line_error(r, str(empty_dir), "tiny_shakespeare")
  (empty_dir / "tiny_shakespeare").mkdir()
  (empty_dir / "tiny_shakespeare" / "input.txt").write_text("  \n")
  with pytest.raises(paths.DataError, match="empty") as e:
    train.train_and_evaluate(default_smoke_config(**{
        "data.data_dir": str(empty_dir), "data.cache_dir": f"{tmp_path}/c"}), f"{tmp_path}/a",
        tasks=tasks.get)
  assert e.value.exit_code == 2 and "\n" not in str(e.value), str(e.value)
  assert not os.path.exists(tmp_path / "a") or os.listdir(tmp_path / "a") == []


@pytest.mark.slow
def test_cli_unwritable_workdir(tmp_path):
  ro = tmp_path / "ro"
  ro.mkdir()
  ro.chmod(0o500)
  try:
    if os.access(ro, os.W_OK):  # root ignores permission bits: use a path under a file.
      target = tmp_path / "afile" / "run"
      (tmp_path / "afile").write_text("not a folder")
    else:
      target = ro / "run"
    r = run_cli("--config=configs/default.py:smoke", f"--workdir={target}")
    _one_line_error(r, "workdir", str(target))
  finally:
    ro.chmod(0o700)


@pytest.mark.slow
def test_cli_all_checkpoints_corrupt(finished_workdir, tmp_path):
  import shutil
  wd = str(tmp_path / "copy")
  shutil.copytree(finished_workdir, wd)
  for step in os.listdir(os.path.join(wd, "checkpoints")):
    _corrupt(os.path.join(wd, "checkpoints", step))
  before = snapshot(wd)
  # The copied run's own config (configs/lm.py:smoke, finished_workdir), a longer run asked.
  r = run_cli("--config=configs/lm.py:smoke", f"--workdir={wd}", "--config.mesh.data=1",
              "--config.train.num_steps=30")
  _one_line_error(r, "no checkpoint", "could be restored")
  assert snapshot(wd) == before


def sigterm_when(module, args, ready, poll=0.2):
  """Runs `python -m module args`, sends SIGTERM once ready() (or after 180 s), and checks
  that it saved and exited 143; returns (stdout, stderr)."""
  proc = forkserver.Popen([sys.executable, "-m", module, *args], cwd=REPO,
                          env={**os.environ, "PYTHONUNBUFFERED": "1"}, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True)
  try:
    deadline = time.time() + 180
    while time.time() < deadline and proc.poll() is None and not ready():
      time.sleep(poll)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
  finally:
    proc.kill()
  assert proc.returncode == 143, (out[-1000:], err[-2000:])
  return out, err


@pytest.mark.slow
def test_cli_sigterm_saves_and_the_same_command_resumes(tmp_path):
  wd = str(tmp_path / "preempt")
  # (One layer: saving and resuming are the point, not the model; the two commands' compiles
  # smaller, the test alone: CPU 7.8 -> 6.4 s, 2026-12-07, 2-core machine.)
  args = ["--config=configs/default.py:smoke", f"--workdir={wd}", "--config.mesh.data=1",
          "--config.model.num_layers=1", "--config.train.num_steps=100000",
          "--config.train.log_every_steps=1",
          "--config.train.eval_every_steps=100000", "--config.train.checkpoint_every_steps=100000"]
  sigterm_when("lnjax.main", args, lambda: len(train_losses(wd)) >= 2)
  saved = json.load(open(os.path.join(wd, "summary.json")))
  assert saved["status"] == "preempted" and saved["step"] >= 2
  assert os.listdir(os.path.join(wd, "checkpoints")) == [str(saved["step"])]
  r = run_cli(*args[:-4], f"--config.train.num_steps={saved['step'] + 3}",
              "--config.train.log_every_steps=1")
  assert r.returncode == 0, r.stderr[-2000:]
  assert f"from step {saved['step']}" in r.stdout


@pytest.mark.slow
@pytest.mark.parametrize("scan_layers", [False, True])
def test_per_weight_gradient_norms_are_logged(tmp_path, scan_layers):
  """train.log_grad_norms: ‖∂L/∂W‖ of every weight per layer and sub-layer (scanned layers
  too); together they make up the global gradient norm."""
  wd = str(tmp_path / "run")
  train.train_and_evaluate(smoke_config(**{
      "train.num_steps": 3, "train.log_every_steps": 1, "train.log_grad_norms": True,
      "model.scan_layers": scan_layers}), wd, tasks=tasks.get)
  rows = [r for r in metrics.read_metrics(wd) if "train_loss" in r]
  assert [r["step"] for r in rows] == [1, 2, 3]
  for r in rows:
    per_weight = {k: v for k, v in r.items() if k.startswith("grad_norm/")}
    assert "grad_norm/layer_0/ffn/wi/kernel" in per_weight
    assert "grad_norm/layer_1/self_attn/query/kernel" in per_weight
    assert all(v > 0 for v in per_weight.values())
    assert np.sqrt(sum(v**2 for v in per_weight.values())) == pytest.approx(r["grad_norm"],
                                                                            rel=1e-4)


def test_resume_accepts_fields_added_since_at_their_defaults(tmp_path):
  """A run started before lnjax gained a config field resumes when the field is at its
  default; set otherwise, or with any saved value changed, the workdir is refused."""
  config = smoke_config()
  saved = config.to_dict()
  del saved["model"]["scan_layers"]  # As written by an lnjax without scan_layers.
  with open(tmp_path / checkpoint.CONFIG_FILE, "w") as f:
    json.dump(saved, f)
  assert train.prepare_workdir(str(tmp_path), config, tasks=tasks.get) is True
  for key, value in [("scan_layers", True), ("norm_position", "post")]:
    changed = smoke_config()
    changed.model[key] = value
    with pytest.raises(errors.WorkdirError, match=f"model.{key}"):
      train.prepare_workdir(str(tmp_path), changed, tasks=tasks.get)


@pytest.mark.slow
def test_cli_compilation_cache_and_profile(tmp_path):
  """train.compilation_cache_dir: a second launch finds its programs compiled (summary.json
  counts those it read; its first step was faster, but under load not always: 2.06 against
  2.57 s in a full suite run, 2026-12-07); train.profile_steps: a jax.profiler trace in the
  workdir. Each run's summary on stdout gives its held-out loss against the unigram
  baseline."""
  cache = str(tmp_path / "cache")
  hits = []
  for name in ("a", "b"):
    wd = str(tmp_path / name)
    # One layer: the first launch compiles every program in an empty cache, which the smoke
    # model's 2 layers made the test's largest cost (the two launches' CPU 10.0 -> 8.0 s,
    # 2026-12-07, 2-core machine); the programs are the same four.
    r = run_cli("--config=configs/lm.py:smoke", f"--workdir={wd}", "--config.mesh.data=1",
                "--config.model.num_layers=1", "--config.train.num_steps=6",
                f"--config.train.compilation_cache_dir={cache}",
                "--config.train.profile_steps=2,4")
    assert r.returncode == 0, r.stderr[-2000:]
    assert "held-out loss" in r.stdout and "unigram baseline" in r.stdout
    hits.append(json.load(open(os.path.join(wd, "summary.json")))["compilation_cache_hits"])
    traces = [f for _, _, fs in os.walk(os.path.join(wd, "profile")) for f in fs]
    assert any(f.endswith(".xplane.pb") for f in traces), traces
  assert any("train_step" in f for f in os.listdir(cache))
  assert hits[0] == 0 and hits[1] >= 3, hits  # The train, eval and init programs at least.


def test_profile_steps_are_checked():
  from lnjax.core import run as run_lib
  for bad in ("5", "4,2", "0,3", "a,b"):
    with pytest.raises(errors.ConfigError, match="train.profile_steps"):
      run_lib.resolve_config(smoke_config(**{"train.profile_steps": bad}), tasks=tasks.get)
