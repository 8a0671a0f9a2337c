"""The GPU check (benchmarks/gpu_check.sh) and the tests it runs on a GPU.

On the CPU (the suite): the script's stages at tiny sizes (--dry_run), the suite on the
encoder-decoder only. The device tests run on whatever JAX's default backend is: 8 virtual
CPU devices in the suite, the GPUs when gpu_check.sh runs them with JAX_PLATFORMS=cuda: bf16
steps against float32 ones, sharded bf16 steps against one device (two devices or more),
cuDNN's flash attention against XLA's (a GPU only).
"""

import dataclasses
import functools
import importlib.util
import os
import re
import subprocess
import sys

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from lnjax import tasks
from lnjax.core import optim, sharding, state as state_lib, steps
from lnjax.models import EncoderDecoder, ModelConfig

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
B, T, V, STEPS = 8, 16, 64, 3
CFG = ModelConfig(vocab_size=V, num_layers=2, d_model=64, num_heads=2, d_ff=128, max_len=T,
                  dropout_rate=0.0)


def _lm_losses(cfg: ModelConfig, mesh) -> np.ndarray:
  """Train losses of STEPS SGD steps of the LM on `mesh`, from the seed-0 state."""
  setup = state_lib.make_setup(cfg, optim.OptConfig(name="sgd", learning_rate=0.5), 100,
                               task=tasks.get("lm"))
  shardings = state_lib.state_shardings(setup, mesh)
  batch_sharding = sharding.batch_sharding(mesh)
  step = jax.jit(lambda s, b: steps.train_step(s, b, setup=setup, label_smoothing=0.0, seed=0),
                 in_shardings=(shardings, batch_sharding),
                 out_shardings=(shardings, sharding.replicated(mesh)))
  state = state_lib.init_state(setup, mesh, 0)
  x = np.random.default_rng(0).integers(1, V, (STEPS, B, T + 1)).astype(np.int32)
  losses = []
  for i in range(STEPS):
    batch = {"inputs": x[i, :, :-1], "targets": x[i, :, 1:], "weights": np.ones((B, T), np.float32)}
    state, metrics = step(state, sharding.global_batch(batch, batch_sharding))
    losses.append(float(metrics["train_loss"]))
  assert all(leaf.dtype == jnp.float32 for leaf in jax.tree.leaves(state.params))
  return np.array(losses)


@functools.cache  # The bf16 one-device run is the reference of both tests below.
def _one_device_losses(dtype: str) -> np.ndarray:
  one = sharding.make_mesh(sharding.MeshConfig(data=1), jax.devices()[:1])
  losses = _lm_losses(dataclasses.replace(CFG, dtype=dtype), one)
  losses.setflags(write=False)
  return losses


@pytest.mark.slow
def test_bf16_steps_track_float32():
  """bf16 compute (float32 parameters and optimizer) follows the float32 run's losses."""
  f32, bf16 = _one_device_losses("float32"), _one_device_losses("bfloat16")
  assert np.isfinite(bf16).all() and f32[-1] < f32[0]
  np.testing.assert_allclose(bf16, f32, rtol=2e-2)
  assert not np.array_equal(bf16, f32)  # The compute really is bf16.


@pytest.mark.slow
def test_sharded_bf16_steps_equal_one_device():
  """bf16 steps over every device (data × FSDP) equal the one-device bf16 steps."""
  n = jax.device_count()
  if n < 2 or n % 2:
    pytest.skip(f"{n} device(s): sharding needs an even count of 2 or more")
  one = _one_device_losses("bfloat16")
  many = _lm_losses(dataclasses.replace(CFG, dtype="bfloat16"),
                    sharding.make_mesh(sharding.MeshConfig(data=2, fsdp=n // 2)))
  np.testing.assert_allclose(many, one, rtol=1e-2)


def test_cudnn_flash_attention_matches_xla():
  """model.attention_impl='cudnn' (cuDNN flash attention) against 'xla' in bf16: loss and
  gradients of an encoder-decoder with padded sources (heads of 128, as IWSLT's)."""
  if jax.default_backend() != "gpu":
    pytest.skip("cuDNN flash attention needs an NVIDIA GPU")
  cfg = dataclasses.replace(CFG, d_model=256, d_ff=512, max_len=64, dtype="bfloat16")
  rng = np.random.default_rng(0)
  src = rng.integers(1, V, (B, 64)).astype(np.int32)
  src[np.arange(64)[None, :] >= rng.integers(32, 65, (B, 1))] = 0
  tgt = rng.integers(1, V, (B, 65)).astype(np.int32)
  params = nn.unbox(EncoderDecoder(cfg).init(jax.random.key(0), src, tgt[:, :-1])["params"])

  def loss(params, impl):
    model = EncoderDecoder(dataclasses.replace(cfg, attention_impl=impl))
    logits = model.apply({"params": params}, src, tgt[:, :-1]).astype(jnp.float32)
    return optax.softmax_cross_entropy_with_integer_labels(logits, tgt[:, 1:]).mean()

  grad = jax.jit(jax.value_and_grad(loss), static_argnums=1)
  (l_xla, g_xla), (l_cudnn, g_cudnn) = grad(params, "xla"), grad(params, "cudnn")
  np.testing.assert_allclose(l_cudnn, l_xla, rtol=1e-2)
  flat = lambda g: np.concatenate([np.ravel(x) for x in jax.tree.leaves(g)]).astype(np.float32)
  a, b = flat(g_cudnn), flat(g_xla)
  assert np.linalg.norm(a - b) <= 5e-2 * np.linalg.norm(b)


def _one_device_offline_env(tmp_path) -> dict:
  """As on a lent GPU machine: one device, no network, nothing downloaded before."""
  flags = [f for f in os.environ.get("XLA_FLAGS", "").split()
           if not f.startswith("--xla_force_host_platform_device_count")]
  return {**os.environ, "JAX_PLATFORMS": "cpu", "XLA_FLAGS": " ".join(flags),
          "LNJAX_DATA_OFFLINE": "1", "LNJAX_CACHE_DIR": str(tmp_path / "cache")}


def test_the_cpu_branch_dry_runs_the_gpu_stages_own_commands():
  """gpu_check.sh's CPU branch runs stage 2's suite command itself (one array, models and
  dtype included) and stage 3's gpu_check.py, each with --dry_run."""
  script = open(os.path.join(REPO, "benchmarks", "gpu_check.sh")).read()
  start = script.index('if [ "$backend" != gpu ]')
  cpu_branch = script[start:script.index("\n  exit 0\n", start)]
  assert re.search(r"^suite=\(benchmarks/suite.py --dtype bfloat16 --models lm,mt_iwslt\)",
                   script, re.M)
  assert 'python "${suite[@]}" --dry_run' in cpu_branch
  assert "python benchmarks/gpu_check.py --dry_run" in cpu_branch
  assert 'python "${suite[@]}" --rounds' in script  # Stage 2 on a GPU.
  # Stage "llama": the Llama-style rows against LlamaForCausalLM, dry-run on a CPU too.
  assert re.search(r"^llama=\(benchmarks/suite.py --dtype bfloat16 --models "
                   r"llama,llama_compile\)", script, re.M)
  assert 'python "${llama[@]}" --dry_run' in cpu_branch
  assert 'python "${llama[@]}" --rounds' in script
  assert re.search(r'^ *timeout -k 10 \d+ python benchmarks/gpu_check.py --parts "\$parts" '
                   r'--out "\$out"', script, re.M)
  # Each GPU stage has its own time limit, and an image with python3 alone still runs.
  assert len(re.findall(r'^ *stage "[^"]+" \d+ ', script, re.M)) == 3
  assert "command -v python >/dev/null" in script


@pytest.mark.slow
def test_gpu_check_parts_other_than_kernels_and_run_are_one_line():
  r = subprocess.run([sys.executable, "benchmarks/gpu_check.py", "--dry_run", "--parts=kernel"],
                     cwd=REPO, capture_output=True, text=True, timeout=300)
  assert r.returncode == 2 and "--parts: some of kernels, run, plan, not 'kernel'" in r.stderr


_SECTIONS = r"""
import os, sys
sys.path.insert(0, "benchmarks")
import gpu_check, jax
import numpy as np

jax.default_backend = lambda: "gpu"  # What gpu_check.py sees on a lent machine.
workdir = os.path.join(os.getcwd(), "runs", "x")  # A path on the machine that measured.
row = {"dtype": "bfloat16", "loss": 9.7, "loss_diff": 0.0, "grad_diff": 0.0, "ms": 60.0,
       "ok": True}
# The gap's split by parameter: 4² of 4² + 3² in "a"; |(4, 3)| / |(0, 0, 12)| in all.
gap = gpu_check._grad_diff({"a": np.array([0.0, 4.0]), "b": np.array([15.0])},
                           {"a": np.array([0.0, 0.0]), "b": np.array([12.0])})
assert np.allclose([gap["grad_diff"], gap["worst_share"]], [5 / 12, 16 / 25]), gap
assert gap["worst_param"] == "a", gap
failed = dict(row, dtype="float32", impl="xla", ok=False, **gap)
gpu_check.check_attention = lambda *a, **k: [dict(row, impl=i) for i in ("plain", "cudnn")] + [
    failed]
gpu_check.run_on_iwslt_or_multi30k = lambda impl, *a, **k: {
    "command": f"python -m lnjax.main --workdir={workdir}", "returncode": 0, "output": "",
    "summary": {"status": "completed", "step": 300, "eval_loss": 5.0,
                "last_finite_train_loss": 5.1},
    "lines": [(25, 9.0, 1000), (50, 8.0, 2000)], "wall_s": 100.0, "data": "Multi30k"}
out = sys.argv[1]
for parts, seconds, failures in (("kernels,run", 91, 1), ("run", 80, 0)):
  argv = ["--parts", parts, "--out", out, "--stages", f"tests={seconds}=passed"]
  assert gpu_check.main(argv) == failures
"""


@pytest.mark.slow
def test_gpu_check_writes_one_section_per_part_with_repository_paths(tmp_path):
  """gpu_check.py's sections as a lent GPU machine writes them (the backend, kernels and run
  replaced by fixed results): the earlier stages in the first section written, each part's
  section replaced in place on a second call, the page's other text kept, paths relative
  to the repository and the run's workdir written as DIR; a failed kernel names the
  parameter with the largest share of its gradient gap."""
  out = tmp_path / "BENCHMARKS.md"
  out.write_text("# Benchmarks\n\nText before.\n")
  r = subprocess.run([sys.executable, "-c", _SECTIONS, str(out)], cwd=REPO,
                     capture_output=True, text=True, timeout=300,
                     env=dict(os.environ, GPU_CHECK_STAGES="kernels,run"))
  assert r.returncode == 0, r.stderr[-3000:]
  page = out.read_text()
  assert page.startswith("# Benchmarks\n\nText before.\n")
  for tag in ("gpu_check", "gpu_check_run"):
    assert page.count(f"<!-- {tag}:begin") == page.count(f"<!-- {tag}:end -->") == 1, page
  kernels = page[page.index("<!-- gpu_check:begin"):page.index("<!-- gpu_check:end")]
  run = page[page.index("<!-- gpu_check_run:begin"):page.index("<!-- gpu_check_run:end")]
  command = "Command: `GPU_CHECK_STAGES=kernels,run bash benchmarks/gpu_check.sh`"
  assert command in kernels and command in run
  assert re.search(r"\nMachine: .+, \d+ cores, \d+ × \w+\. Versions: Python ", kernels)
  assert "| tests | 91 | passed |\n| attention kernels |" in kernels
  assert "| bfloat16 | cudnn | 9.70000 |" in kernels
  assert "| 4.2e-01 | 60.0 | — | FAILED (64% of the gradient gap in `a`) |" in kernels
  # The second call wrote the run's section alone: its earlier stages went there.
  assert "| tests | 80 | passed |\n| 300-step run | 100 |  |" in run
  assert "| Multi30k | 300 | cudnn | completed | 9.000 (step 25) |" in run
  assert "`python -m lnjax.main --workdir=DIR`" in run and REPO not in page


_WORKERS = r"""
import os, sys
sys.path.insert(0, "benchmarks")
import suite  # Sets the GPU sharing before JAX starts.

print("preallocate", os.environ.get("XLA_PYTHON_CLIENT_PREALLOCATE"))
pidfile = sys.argv[1]
silent = [sys.executable, "-c", "import os, time; open(%r, 'w').write(str(os.getpid())); "
          "os.close(1); time.sleep(600)" % pidfile]
try:
  suite.Worker(silent, dict(os.environ))
except RuntimeError as e:
  print("raised:", e)
try:
  os.kill(int(open(pidfile).read()), 0)
  print("silent worker: running")
except ProcessLookupError:
  print("silent worker: ended")


class Fake:
  made = []

  def __init__(self, argv, env):
    self.env, self.killed = env, False
    Fake.made.append(self)
    if len(Fake.made) == 2:
      raise RuntimeError("the peer ran out of memory")

  def kill(self):
    self.killed = True


suite.Worker = Fake
try:
  suite.start_workers("lm", "pre", os.path.dirname(pidfile), "bfloat16", "cuda")
except RuntimeError as e:
  print("raised:", e)
ln = Fake.made[0]
print("lnjax worker killed:", ln.killed, ln.env["XLA_PYTHON_CLIENT_MEM_FRACTION"])
"""


@pytest.mark.slow
def test_a_failed_worker_start_leaves_no_worker_running(tmp_path):
  """What the first GPU run (an H200, 2026-12-04) hit: suite.py's parent took JAX's default
  75% of the GPU, the PyTorch worker ran out of memory before its hello, and with a worker
  left running the stage hung until the check's time limit. Now the parent allocates on
  demand, a worker that dies before its hello is ended, and so is the other one."""
  r = subprocess.run([sys.executable, "-c", _WORKERS, str(tmp_path / "pid")], cwd=REPO,
                     capture_output=True, text=True, timeout=120)
  assert r.returncode == 0, r.stderr[-3000:]
  assert r.stdout.splitlines() == [
      "preallocate false",
      "raised: the worker closed its output without answering (still running; its error, if "
      "any, is above)",
      "silent worker: ended",
      "raised: the peer ran out of memory",
      "lnjax worker killed: True 0.45"], r.stdout


@pytest.mark.slow
def test_the_gpu_stages_dry_run_on_the_cpu(tmp_path):
  """The script's stages 2 to 4 at tiny sizes on the CPU, offline with nothing downloaded
  (as a lent GPU machine is): the bf16 suite against the PyTorch peer on the IWSLT-shaped
  encoder-decoder (parameters handed over, initial losses equal, steps timed, the table
  printed; `bash benchmarks/gpu_check.sh` adds the LM, 40 s more on 2 cores) and
  gpu_check.py's GPU path (the IWSLT model's kernels in float32 and bf16, cudnn reported
  as not offered, the run falling back to the repository's Multi30k excerpt)."""
  if jax.default_backend() == "gpu":
    pytest.skip("on a GPU gpu_check.sh runs these tests itself")
  env = _one_device_offline_env(tmp_path)
  out = ""
  for cmd in (["benchmarks/suite.py", "--dtype", "bfloat16", "--models", "mt_iwslt", "--dry_run"],
              ["benchmarks/gpu_check.py", "--dry_run"]):
    r = subprocess.run([sys.executable, *cmd], cwd=REPO, env=env, capture_output=True,
                       text=True, timeout=600)
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    out += r.stdout + r.stderr
  assert out.count(" at --dry_run sizes |") == 1, out[-3000:]
  assert "| float32 | plain |" in out and "| bfloat16 | xla |" in out, out[-3000:]
  assert "| bfloat16 | cudnn | — |" in out and "not offered" in out, out[-3000:]
  assert "Multi30k's first 2,000 pairs" in out and "| completed |" in out, out[-3000:]
  # The compiled plan's predicted memory beside the measured peak (none on the CPU).
  assert "| 1 × cpu | 16×16 |" in out and "no device memory statistics" in out, out[-3000:]
  assert "gpu_check.py: passed" in out


@pytest.mark.slow
def test_the_pytorch_peers_sinusoidal_positions_are_lnjaxs():
  """benchmarks/torch_peer.py builds the sinusoidal table in torch (the IWSLT config's
  positions); the suite's initial-loss check is bf16-loose, so the tables meet here."""
  from lnjax.models import layers

  spec = importlib.util.spec_from_file_location(
      "torch_peer", os.path.join(REPO, "benchmarks", "torch_peer.py"))
  torch_peer = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(torch_peer)
  np.testing.assert_allclose(torch_peer.sinusoidal_positions(64, 32).numpy(),
                             np.asarray(layers.sinusoidal_positions(64, 32)), atol=2e-5)
