"""`lnjax compile` (lnjax/core/plan.py, lnjax/core/tpu.py, lnjax/cli/compile.py): a run's
steps compiled for a TPU slice by libtpu's compiler on this CPU host (libtpu comes with
requirements.txt). Compiling needs no TPU; each compile of the smoke LM takes ~10 s on two
cores, so those tests are in the slow tier."""

import functools
import json
import math
import os
import sys
import warnings

import jax
import jax.numpy as jnp
import pytest

import lnjax
from lnjax import tasks
from lnjax.cli import compile as compile_cli
from lnjax.core import build, errors, plan, sharding, tpu
from lnjax.models import layers
import forkserver

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
V5E_4 = "v5e:2x2"
MESHES = {"data": {"mesh.data": 4}, "fsdp": {"mesh.data": 1, "mesh.fsdp": 4},
          "fsdp+tensor": {"mesh.data": 1, "mesh.fsdp": 2, "mesh.model": 2}}


def _config(name="lm", preset="smoke", **overrides):
  config = lnjax.get_config(name, preset).unlock()
  for key, value in overrides.items():
    section, field = key.split(".")
    config[section][field] = value
  return config.lock()


def _aligned_lm(**overrides):
  """The smoke LM at widths whose every shard fills TPU tiles (minor dimensions multiples
  of 128 after sharding over 4 chips), so a chip's buffers hold no padding and the
  compiler's argument bytes are the hand count exactly (up to the scalars' tiles). No
  dropout: its random masks (threefry) made libtpu's compile 2.6× longer (55 s against
  143 s for the train step at sequences of 512, 16 of them, data=4, 2026-12-05); the two
  memory tests measured with dropout keep it."""
  return _config(**{"model.vocab_size": 512, "model.d_model": 512, "model.d_ff": 1024,
                    "model.num_heads": 4, "model.dropout_rate": 0.0, **overrides})


@pytest.mark.parametrize("name, grid", [("v5e:2x4", (2, 4)), ("v5e-8", (2, 4)),
                                        ("v5e-16", (4, 4)), ("v6e-8", (2, 4)),
                                        ("v5p-8", (2, 2, 1)), ("v5p-16", (2, 2, 2)),
                                        ("v4-32", (2, 2, 4)), ("v5e-256", (16, 16))])
def test_topology_names_give_cloud_tpus_chip_grids(name, grid):
  assert tpu.parse_topology(name).grid == grid


@pytest.mark.parametrize("name, listed", [
    ("v7:2x2", "v5e-8, v5e-16, v5p-8, v6e-8"), ("v5e:2x2x1", "v5e-8, v5e-16, v5p-8, v6e-8"),
    ("tpu", "v5e-8, v5e-16, v5p-8, v6e-8"), ("", "v5e-8, v5e-16, v5p-8, v6e-8"),
    ("v5e-12", "v5e-1, v5e-4, v5e-8, v5e-16"), ("v5p-6", "v5p-8, v5p-16")])
def test_an_unknown_topology_is_refused_listing_the_valid_ones(name, listed):
  with pytest.raises(errors.ConfigError, match=listed):
    tpu.parse_topology(name)


@pytest.mark.parametrize("name, slices, said", [
    ("v5e:0x2", 1, "each axis needs one chip or more"),
    ("v5e:32x16", 1, "512 chips, more than a v5e pod's 256"),
    ("v5p:128x128x128", 1, "more than a v5p pod's 8960"),
    ("v5e:2x2", 99999999, "399999996 chips, more than 65536")])
def test_a_slice_larger_than_a_pod_or_than_any_job_is_refused_before_libtpu(name, slices, said):
  """libtpu builds every device it is asked for before checking anything (a million 2x2
  slices: 10.7 GB of host memory, then a crash): the chip counts are checked first."""
  with pytest.raises(errors.ConfigError, match=said):
    tpu.parse_topology(name, slices)
  assert tpu.parse_topology("v5p:16x20x28").num_chips == 8960  # A full v5p pod.
  assert tpu.parse_topology("v5e:16x16", 256).num_chips == tpu.MAX_CHIPS


def test_an_output_file_that_cannot_be_written_is_refused_before_the_compile(tmp_path):
  """A report path whose folder is a file, or that names something other than a regular
  file (a FIFO here; /dev/full was replaced by the report before: a rename over it)."""
  from lnjax.core import fileio
  (tmp_path / "afile").write_text("x")
  os.mkfifo(tmp_path / "fifo")
  for path, said in ((tmp_path / "afile" / "plan.json", "is a file, not a folder"),
                     (tmp_path / "fifo", "is not a regular file")):
    with pytest.raises(errors.ConfigError, match=said):
      fileio.check_output_file("--output", str(path))
  fileio.check_output_file("--output", str(tmp_path / "new" / "plan.json"))  # Made.
  assert os.listdir(tmp_path / "new") == []  # (The probe file removed.)
  os.symlink(tmp_path / "afile", tmp_path / "link")
  fileio.check_output_file("--output", str(tmp_path / "link"))  # A link to a file: fine.


def test_the_mesh_flag_names_every_axis():
  assert compile_cli.mesh_override("fsdp=4,model=2") == {
      "mesh.data": 1, "mesh.fsdp": 4, "mesh.model": 2}
  with pytest.raises(errors.ConfigError, match="--mesh"):
    compile_cli.mesh_override("tensor=2")
  with pytest.raises(errors.ConfigError, match="axis data given twice"):  # Not the last one.
    compile_cli.mesh_override("data=4,data=1")


@pytest.mark.slow  # libtpu's start for a topology's devices: 6 s of the fast tier's 60.
def test_a_mesh_axis_across_physical_axes_is_laid_out():
  """fsdp=8, model=2 on v5e-16's 4×4 chips: 8 is no product of whole physical axes, so
  mesh_utils refused it ("Failed to find assignment ...", 2026-12-05); split, it is laid."""
  devices = tpu.topology_devices(tpu.parse_topology("v5e-16"))
  mesh = sharding.make_mesh(sharding.MeshConfig(data=1, fsdp=8, model=2), devices)
  assert dict(mesh.shape) == {"data": 1, "fsdp": 8, "model": 2}
  assert sorted(d.id for d in mesh.devices.flat) == sorted(d.id for d in devices)


def test_collectives_are_read_from_hlo_text():
  hlo = """
  %all-gather-start = (bf16[4,128]{1,0}, bf16[16,128]{1,0}) all-gather-start(bf16[4,128]{1,0} %p)
  %all-gather-done = bf16[16,128]{1,0} all-gather-done((bf16[4,128]{1,0}, bf16[16,128]{1,0}) %all-gather-start)
  %all-reduce.1 = f32[1024]{0:T(1024)} all-reduce(f32[1024]{0} %x), to_apply=%add
  %reduce-scatter = f32[8,16]{1,0} reduce-scatter(f32[32,16]{1,0} %y), dimensions={0}
  %fusion = f32[8]{0} fusion(f32[8]{0} %all-reduce.1), kind=kLoop
  %all-reduce-start = (f32[128,256]{1,0:T(8,128)}, bf16[64]{0:T(512)}) all-reduce-start(f32[128,256]{1,0:T(8,128)} %g, bf16[64]{0:T(512)} %h), to_apply=%add
  %all-reduce-done = (f32[128,256]{1,0:T(8,128)}, bf16[64]{0:T(512)}) all-reduce-done((f32[128,256]{1,0:T(8,128)}, bf16[64]{0:T(512)}) %all-reduce-start)
  """
  c = plan.collectives(hlo)
  assert c["all-gather"] == {"count": 1, "bytes": 16 * 128 * 2}
  # A combined all-reduce (a tuple, TPU tiles in its layouts): each array it produces.
  assert c["all-reduce"] == {"count": 2, "bytes": 1024 * 4 + 128 * 256 * 4 + 64 * 2}
  assert c["reduce-scatter"] == {"count": 1, "bytes": 8 * 16 * 4}
  assert c["all-to-all"]["count"] == c["collective-permute"]["count"] == 0


def test_a_program_with_loops_takes_its_flops_from_the_step_before_partitioning():
  """XLA counts a loop's body once; under FSDP the partitioner makes loops of all-gathered
  matmuls (the 125M Llama's fsdp=8 step read 1.39e12 FLOPs against data=8's 1.68e12 on
  v5e-8): a compiled program with a `while` takes its FLOPs from the lowered step over the
  chips, its bytes from its own analysis; one without keeps its own count."""
  def looped(x):
    return jax.lax.fori_loop(0, 4, lambda i, y: jnp.tanh(y @ x), x)

  x = jnp.ones((64, 64))
  for fn, loops in ((looped, True), (lambda x: jnp.tanh(x @ x), False)):
    lowered = jax.jit(fn).lower(x)
    compiled = lowered.compile()
    cost, source = plan.step_cost(compiled, lowered, num_chips=4)
    own = compiled.cost_analysis()
    own = own[0] if isinstance(own, (list, tuple)) else own
    assert (" while(" in compiled.as_text()) == loops
    if loops:
      assert source == "compiled; FLOPs before partitioning"
      assert cost["flops"] == pytest.approx(lowered.cost_analysis()["flops"] / 4)
      assert cost["bytes accessed"] == own["bytes accessed"]
    else:
      assert (source, cost["flops"]) == ("compiled", own["flops"])


def test_the_compilers_out_of_memory_message_becomes_the_shortfall():
  message = ("RESOURCE_EXHAUSTED: Ran out of memory on HBM, the total memory required for "
             "HLO temporaries (26.84G) exceeds available HBM (15.75G).")
  short = plan._hbm_shortfall(message)
  assert short["hbm_missing_bytes"] == pytest.approx((26.84 - 15.75) * tpu.GiB, rel=1e-6)
  assert plan._hbm_shortfall("INVALID_ARGUMENT: shapes differ") is None


@pytest.mark.slow  # Prepares three corpora (the translation one trains a SentencePiece).
@pytest.mark.parametrize("name, preset", [("lm", "smoke"), ("bert", "smoke"),
                                          ("multi30k_de_en", "smoke")])
def test_batch_shapes_are_those_of_the_real_train_batches(name, preset):
  """What the plan compiles is what the data give: the same keys, dtypes and shapes (the
  longest bucket's for translation)."""
  config = _config(name, preset)
  task = tasks.get(config.get("task", "lm"))
  from lnjax.core import run as run_lib
  run = run_lib.resolve_config(config, tasks=tasks.get)
  data = task.make_data(run.data, 0, 0, 1, 1)
  real = {k: (v.shape, v.dtype) for k, v in next(data.train_iter()).items()}
  if hasattr(data, "train_shapes"):  # Translation: the longest bucket.
    rows, length = max(data.train_shapes, key=lambda s: s[1])
    real = {k: ((rows, length), dtype) for k, (_, dtype) in real.items()}
  spec = {k: (shape, jnp.dtype(dtype)) for k, (shape, dtype) in
          task.batch_shapes(run.data, 1).items()}
  assert spec == real


# test_fsdp_keeps_the_activations_split_over_the_batch's steps: 4,096 tokens, 32 rows of 128.
SPLIT_BATCH = (("data.batch_size", 32), ("data.seq_len", 128), ("model.max_len", 128))


@functools.cache
def _aligned_train_step(mesh: str, shape: tuple = ()) -> tuple[dict, dict]:
  """(prepare's parts, compile_report) of _aligned_lm's train step on MESHES[mesh] over
  v5e:2x2, `shape` its further (key, value) overrides; each compiled once a test process.
  The argument-bytes test's data and fsdp cases read the fsdp test's two steps at
  SPLIT_BATCH (~25 s compiles) instead of compiling two more (~8 s each at the smoke
  batch, the suite's durations of 2026-12-07)."""
  config = _aligned_lm(**MESHES[mesh], **dict(shape))
  slice_ = tpu.parse_topology(V5E_4)
  parts = plan.prepare(config, slice_, tasks=tasks.get)
  return parts, plan.compile_report(
      lambda: parts["train_step"].lower(parts["state"], parts["batch"]), slice_, 1.0)


@pytest.mark.slow  # Three compiles of the train step for 4 TPU v5e chips (~10-25 s each).
@pytest.mark.parametrize("mesh", list(MESHES))
def test_the_train_steps_argument_bytes_are_the_sharded_state_and_batch(mesh):
  """Per chip: parameters + Adam's two moments, each leaf divided over the mesh axes its
  logical axes map to (counted by hand from the shapes), plus the batch's rows of that chip;
  donation makes the outputs alias the state. data and fsdp at the fsdp test's batch (the
  same compiles), fsdp+tensor at the smoke batch (8 rows of 32)."""
  parts, report = _aligned_train_step(mesh, SPLIT_BATCH if mesh in ("data", "fsdp") else ())
  state, batch = parts["state"], parts["batch"]
  hand = sum(math.prod(x.sharding.shard_shape(x.shape)) * x.dtype.itemsize
             for x in jax.tree.leaves((state, batch)))
  assert report["argument_bytes"] == pytest.approx(hand, rel=2e-3)
  assert report["alias_bytes"] == pytest.approx(hand, rel=2e-3)  # State donated.
  params = sum(x.size for x in jax.tree.leaves(state.params))
  whole = 3 * 4 * params  # float32 parameters, mu and nu.
  expected = {"data": whole, "fsdp": whole / 4, "fsdp+tensor": whole / 4}[mesh]
  assert report["argument_bytes"] == pytest.approx(expected, rel=0.02)
  assert report["fits"] and report["verdict"] == "fits" and report["flops"] > 0
  gathers = report["collectives"]["all-gather"]["count"]
  assert (gathers == 0) == (mesh == "data")  # FSDP gathers the parameters it shards.


@pytest.mark.slow  # Three train steps lowered (3.5 s).
def test_activation_constraints_add_nothing_on_one_device(monkeypatch):
  """The models' activation constraints (lnjax/core/sharding.py's `constrain`) leave the
  one-device step as it was, operation for operation, and are in the step of four."""
  config = _config(**{"model.vocab_size": 128})
  four = sharding.make_mesh(sharding.MeshConfig(data=1, fsdp=4), jax.devices()[:4])

  def program(mesh):
    parts = plan.prepare(config, mesh=mesh, tasks=tasks.get)
    return parts["train_step"].lower(parts["state"], parts["batch"]).as_text()

  constrained = {"one": program(build.one_device_mesh()), "four": program(four)}
  monkeypatch.setattr(layers, "constrain", lambda x, axes: x)
  assert program(build.one_device_mesh()) == constrained["one"]
  assert program(four) != constrained["four"]


@pytest.mark.slow  # Two compiles of the train step for 4 TPU v5e chips.
def test_fsdp_keeps_the_activations_split_over_the_batch():
  """Under fsdp=4 the weights' 'embed' axis is on the fsdp axis that also splits the batch;
  without constraints on the activations XLA replicated them over the batch (with
  `layers.constrain` made the identity, temporaries of 22.2 MB a chip against data=4's
  18.3 MB at this shape, 2026-12-05; the 125M LM on v5e-8 needed 50 GiB a chip,
  BENCHMARKS.md). With them, a chip holds its own rows' activations, no more than under
  data parallelism (12.3 MB). (Sequences of 128, no dropout: at 512 each compile took
  65-77 s; dropout's threefry masks doubled it.) No smaller step told them apart
  (2026-12-07): at 2,048 tokens (32 rows of 64, 16 of 128), at d_ff 512, at one layer, or
  at 4,096 tokens as 128 rows of 32, the broken step's temporaries stayed under data=4's
  (7.3-13.6 MB against 11.1-18.5 MB). The two steps are also the argument-bytes test's
  data and fsdp cases (_aligned_train_step: each compiled once)."""
  temp = {mesh: _aligned_train_step(mesh, SPLIT_BATCH)[1]["temp_bytes"]
          for mesh in ("data", "fsdp")}
  assert temp["fsdp"] <= temp["data"], temp


@pytest.mark.slow  # Two compiles of the train step for 4 TPU v5e chips.
def test_the_health_statistics_keep_no_copy_of_the_updates():
  """train.health's per-layer RMS of a scanned stack's updates, read by slicing the stack
  into layers, kept a float32 copy of the updates beside the parameters (4.9 GB a chip for
  Llama 2 7B on v5p-8; here 17.4 MB of temporaries over health=off's, two thirds of a
  chip's parameter bytes, measured 2026-12-05 before the change; 17.7 MB as the mutant
  `health_statistics_slice_the_stack_first`). Read by one reduction along the stack, they
  cost under half a copy (5.8 MB here). Dropout's masks from rbg: threefry's doubled the
  compile (BENCHMARKS.md)."""
  slice_ = tpu.parse_topology(V5E_4)
  temp, copy_bytes = {}, 0
  for mode in ("warn", "off"):
    config = _aligned_lm(**MESHES["fsdp"], **{
        "data.seq_len": 128, "model.max_len": 128, "data.batch_size": 4,
        "model.d_ff": 2048, "model.num_layers": 8, "model.scan_layers": True,
        "train.health": mode, "model.dropout_rate": 0.1, "train.dropout_rng": "rbg"})
    parts = plan.prepare(config, slice_, tasks=tasks.get)
    temp[mode] = plan.compile_report(
        lambda: parts["train_step"].lower(parts["state"], parts["batch"]), slice_, 1.0)[
            "temp_bytes"]
    num_params = sum(x.size for x in jax.tree.leaves(parts["state"].params))
    copy_bytes = 4 * num_params / slice_.num_chips  # A float32 copy, sharded over fsdp.
  assert temp["warn"] - temp["off"] < 0.5 * copy_bytes, (temp, copy_bytes)


def test_a_mesh_other_than_the_chip_count_is_refused():
  with pytest.raises(errors.ConfigError, match="differs from the 4 chips"):
    plan.prepare(_aligned_lm(**{"mesh.data": 2}), tpu.parse_topology(V5E_4), tasks=tasks.get)


def test_a_batch_the_data_axes_do_not_divide_is_refused():
  with pytest.raises(errors.ConfigError, match="data.batch_size=6"):
    plan.prepare(_aligned_lm(**{"data.batch_size": 6}), tpu.parse_topology(V5E_4), tasks=tasks.get)


@pytest.mark.slow  # Two command lines (JAX's import; one compile that runs out of memory).
def test_the_command_refuses_in_one_line_or_reports_a_model_too_large(tmp_path):
  """An unknown topology: one line, exit 2, nothing written. A model too large for the
  chip: the report, saying by how much it misses, and exit 1. ~1.6 G parameters replicated
  on every chip (data parallel) are 19 GB of float32 state and Adam moments alone, more
  than a v5e's 16 GiB."""
  out = tmp_path / "plan.json"
  base = [sys.executable, "-m", "lnjax.cli.compile", "--config=lm:smoke", f"--output={out}",
          "--noeval", "--config.model.vocab_size=512", "--config.model.num_layers=1",
          "--config.model.d_model=16384", "--config.model.d_ff=16384",
          "--config.model.num_heads=128"]
  bad = forkserver.run(base + ["--topology=v9x:2x2"], capture_output=True, text=True,
                       cwd=REPO, timeout=300)
  assert bad.returncode == 2 and len(bad.stderr.splitlines()) == 1, bad.stderr
  assert "v5e-8" in bad.stderr and not out.exists()
  afile = tmp_path / "afile"
  afile.write_text("x")
  for flag, said in (("--topology=v5e:3x3", "not divisible by"),  # libtpu's reason alone.
                     (f"--output={tmp_path}", "is a folder"),  # Before compiling.
                     (f"--output={afile}/plan.json", "is a file, not a folder")):
    bad = forkserver.run(base + ["--topology=v5e-4", flag], capture_output=True, text=True, cwd=REPO,
                         timeout=300)
    assert bad.returncode == 2 and len(bad.stderr.splitlines()) == 1, bad.stderr
    assert said in bad.stderr and "pip install" not in bad.stderr, bad.stderr
  big = forkserver.run(base + ["--topology=v5e-4", "--mesh=data=4"], capture_output=True,
                       text=True, cwd=REPO, timeout=600)
  assert big.returncode == 1, big.stderr[-2000:]
  train = json.loads(out.read_text())["train"]
  assert not train["fits"] and train["verdict"].startswith("misses by")
  assert train["hbm_missing_bytes"] > 2 * tpu.GiB
  assert "DOES NOT FIT, misses by" in big.stdout


def test_the_preflight_compiles_the_grids_largest_run():
  from lnjax import configs
  from lnjax.sweep import grid, preflight
  runs = grid.runs(configs.resolve("lm:smoke"), "model.d_model=64,512 model.remat_policy="
                   "none,nothing_saveable data.batch_size=8,16")
  big = preflight.largest(runs)
  assert (big.setting("model.d_model"), big.setting("data.batch_size"),
          big.setting("model.remat_policy")) == (512, 16, "none")


@pytest.mark.slow  # Two sweep command lines, one compile that runs out of memory.
def test_a_sweep_whose_largest_run_cannot_fit_is_refused_before_anything_is_queued(tmp_path):
  base = [sys.executable, "-m", "lnjax.cli.sweep", "--config=lm:smoke",
          f"--workdir={tmp_path / 'sweep'}", "--grid=model.d_model=128,16384", "--dry_run",
          "--topology=v5e-4", "--config.model.vocab_size=512", "--config.model.num_layers=1",
          "--config.model.d_ff=16384", "--config.model.num_heads=128", "--config.mesh.data=4"]
  refused = forkserver.run(base, capture_output=True, text=True, cwd=REPO, timeout=600)
  assert refused.returncode == 2, refused.stderr[-2000:]
  assert len(refused.stderr.splitlines()) == 1 and "misses by" in refused.stderr
  assert "d_model=16384" in refused.stderr and "lnjax.main" not in refused.stdout
  skipped = forkserver.run(base + ["--skip_preflight"], capture_output=True, text=True,
                           cwd=REPO, timeout=300)
  assert skipped.returncode == 0 and "lnjax.main" in skipped.stdout, skipped.stderr[-2000:]


@pytest.mark.slow  # Loads libtpu.
def test_a_tpu_compile_after_a_cpu_one_keeps_out_of_the_persistent_cache(tmp_path):
  """jax decides once per process whether its persistent compilation cache is used: after
  a CPU program had used it, the TPU programs `compile_report` compiled were written to
  it too, and a later process reading them back warned (`PjRtCompiler must be constructed
  with a Client`) and compiled again: seven warnings in a full suite run with the cache
  warm, 2026-12-07. The CPU programs after it use the cache again."""
  from jax.experimental.compilation_cache import compilation_cache

  def entries(name):
    return [f for f in os.listdir(tmp_path) if f.startswith(f"jit_{name}-")]

  def cpu_probe(x):
    return jnp.tanh(x) * 2

  def tpu_probe(x):
    return jnp.tanh(x @ x)

  before = jax.config.jax_compilation_cache_dir
  jax.config.update("jax_compilation_cache_dir", str(tmp_path))
  compilation_cache.reset_cache()
  try:
    jax.jit(cpu_probe).lower(jnp.ones(3)).compile()
    assert entries("cpu_probe"), os.listdir(tmp_path)  # The cache is in use.
    slice_ = tpu.parse_topology(V5E_4)
    mesh = jax.sharding.Mesh(tpu.topology_devices(slice_), ("data",))
    spec = jax.ShapeDtypeStruct((128, 128), jnp.float32, sharding=jax.sharding.NamedSharding(
        mesh, jax.sharding.PartitionSpec("data")))
    with warnings.catch_warnings():
      warnings.simplefilter("error")
      plan.compile_report(lambda: jax.jit(tpu_probe).lower(spec), slice_, 1.0)
    assert entries("tpu_probe") == []
    jax.jit(lambda x: cpu_probe(x) + 1).lower(jnp.ones(3)).compile()
    assert entries("_lambda"), os.listdir(tmp_path)  # The CPU's programs again.
  finally:
    jax.config.update("jax_compilation_cache_dir", before)
    compilation_cache.reset_cache()


def test_commands_keep_jax_on_the_cpu_where_libtpu_finds_no_tpu(monkeypatch):
  """libtpu installed, no TPU chip, no NVIDIA GPU: JAX_PLATFORMS=cpu (JAX would load
  libtpu to look for chips); a JAX_PLATFORMS the user set, even empty, stays."""
  monkeypatch.setattr(tpu, "tpu_attached", lambda: False)
  monkeypatch.setattr(tpu.importlib.util, "find_spec", lambda name: object())
  monkeypatch.setattr(tpu.glob, "glob", lambda pattern: [])
  monkeypatch.setenv("JAX_PLATFORMS", "")
  assert not tpu.cpu_unless_accelerated() and os.environ["JAX_PLATFORMS"] == ""
  monkeypatch.delenv("JAX_PLATFORMS")
  assert tpu.cpu_unless_accelerated() and os.environ["JAX_PLATFORMS"] == "cpu"
  monkeypatch.delenv("JAX_PLATFORMS")
  monkeypatch.setattr(tpu, "tpu_attached", lambda: True)
  assert not tpu.cpu_unless_accelerated() and "JAX_PLATFORMS" not in os.environ


@pytest.mark.slow  # Four compiles: scanned, its two depth probes, unrolled.
def test_a_scanned_stack_is_counted_at_its_full_depth():
  """XLA's cost analysis counts a loop's body once; the plan's FLOPs of a scanned 3-layer
  LM are the unrolled one's (the depth-1 and depth-2 probes extended to 3 layers)."""
  slice_ = tpu.parse_topology(V5E_4)
  flops = {}
  for scan in (True, False):
    # (The smoke widths: FLOPs need no tile-aligned shapes; 17 s against 30 s at _aligned_lm's.
    # No dropout: threefry's masks made the four compiles 19.3 CPU s against 11.6, 2026-12-07.)
    config = _config(**{"model.vocab_size": 128, "model.scan_layers": scan,
                        "model.num_layers": 3, "mesh.data": 4, "model.dropout_rate": 0.0})
    train = plan.plan_run(config, slice_, with_eval=False, tasks=tasks.get)["train"]
    flops[scan] = train["flops"]
    if scan:
      assert train["depth_extrapolated"] and train["flops_scanned_program"] < 0.6 * train["flops"]
  assert flops[True] == pytest.approx(flops[False], rel=0.01)


@pytest.mark.slow  # One compile for two slices of 4 v5e chips.
def test_two_slices_put_the_data_axis_across_them():
  """(No dropout: threefry's masks made the compile 4.9 CPU s against 3.5, 2026-12-07.)"""
  config = _config(**{"model.vocab_size": 128, "mesh.data": 1, "mesh.fsdp": 4,
                      "model.dropout_rate": 0.0})
  report = plan.plan_run(config, tpu.parse_topology(V5E_4, num_slices=2), with_eval=False,
                         tasks=tasks.get)
  assert report["num_chips"] == 8 and report["mesh"] == {"data": 2, "fsdp": 4, "model": 1}
  assert report["train"]["fits"]
  assert report["train"]["collectives"]["all-reduce"]["count"] > 0  # Gradients across slices.
