"""Test set-up: 8 virtual CPU devices (for the sharding tests), a data cache holding the
fixture corpora, JAX's persistent compilation cache, and less XLA optimisation than a
training run gets.

Everything here is an environment variable set before JAX is first imported, so that the
command-line runs the tests start (lnjax.main, lnjax.sweep, lnjax.tasks.finetune) inherit it.

- Compilation cache: most of a test's time is XLA compiling the same small steps; a
  per-user cache folder keeps them across tests, their subprocesses and sessions
  (LNJAX_TEST_JAX_CACHE=0 turns it off; JAX_COMPILATION_CACHE_DIR set by hand wins).
- Optimisation: the tests check values, not speed; XLA's backend optimisation level 0
  compiles faster and gives the same values at the tests' tolerances (resume and sharding
  equalities compare two runs compiled alike). XLA:CPU's older loop emitters instead of
  its fusion emitters (--xla_cpu_use_fusion_emitters=false) halve the compile again: the
  smoke LM's train step 3.6 s -> 1.6 s, a cold smoke run's compiles 9.9 s -> 5.0 s
  (`python -m lnjax.main --config=configs/lm.py:smoke` with jax's backend compile timed,
  2026-12-05, 2-core machine). One LLVM module per program
  (--xla_cpu_parallel_codegen_split_count=1) instead of parts compiled on parallel threads,
  which two workers on two cores cannot use: a smoke run's compiles 5.1 s -> 3.7 s, its
  process 6.6 -> 5.8 CPU s (`configs/llama.py:smoke`, 5 runs each way interleaved,
  2026-12-06, 2-core machine). LNJAX_TEST_XLA_OPT=1 restores the three defaults.
- Threads, in the fast tier (`-m "not slow"`) only: each XLA computation on one thread
  (--xla_cpu_multi_thread_eigen=false). Two xdist workers on two cores, each spreading
  its small matmuls over both cores, fought for them: the fast tier took 111 s, 97 s on
  one thread each (2026-12-02, 2-core machine, cache warm). The full suite, whose larger
  runs and command lines gain from both cores, ran 2148 s with it against 1955 s before.
- Command lines: the tests' `python -m lnjax...` runs are forked from a process per test
  process that imported jax, flax, optax, orbax and tensorflow_datasets once
  (tests/forkserver.py; LNJAX_TEST_FORK=0 starts each afresh). Not in the fast tier, whose
  few command lines do not repay a server's imports in each worker: 66.6 and 67.7 s with
  it, 62.9 s without (fresh clone, cold cache, bf39693, 2026-12-06, 2-core machine).
- Bytecode: Python images often set PYTHONDONTWRITEBYTECODE=1, and then every test process
  (the two xdist workers, each command line a test starts) parses lnjax's sources again
  and pytest rewrites every test module's asserts again: collecting the fast tier took
  17.4 s, 9.3 s with bytecode kept (measured 2026-12-02 on the 2-core machine). The tests
  keep it, in the clone's __pycache__ folders (git ignores them).
"""

import getpass
import json
import os
import shutil
import subprocess
import sys
import tempfile

_flags = os.environ.get("XLA_FLAGS", "")
if "--xla_force_host_platform_device_count" not in _flags:
  # (pytest-xdist's workers inherit the flags from the controller: add them once.)
  _flags += " --xla_force_host_platform_device_count=8"
if (os.environ.get("LNJAX_TEST_XLA_OPT", "0") == "0"
    and "--xla_backend_optimization_level" not in _flags):
  _flags += (" --xla_backend_optimization_level=0 --xla_cpu_use_fusion_emitters=false"
             " --xla_cpu_parallel_codegen_split_count=1")
os.environ["XLA_FLAGS"] = _flags.strip()
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
sys.dont_write_bytecode = False
os.environ.setdefault("JAX_PLATFORMS", "cpu")
if os.environ.get("LNJAX_TEST_JAX_CACHE", "1") != "0":
  os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", os.path.join(
      tempfile.gettempdir(), f"lnjax_test_jax_cache_{getpass.getuser()}"))
  os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
  os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "0")
# Prepared data sets and tokenizers are cached once per test session (the xdist workers
# inherit the controller's folder). Its download folder starts with the small corpora of
# tests/fixtures/corpora: lnjax finds them there as corpora it downloaded before, so the
# tests read no folder outside the repository (a user's clone has none) and no network.
_OWN_CACHE = "LNJAX_TEST_CACHE_DIR" not in os.environ  # (Removed by this process at its end.)
if _OWN_CACHE:
  os.environ["LNJAX_TEST_CACHE_DIR"] = tempfile.mkdtemp(prefix="lnjax_test_cache_")
  shutil.copytree(os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures", "corpora"),
                  os.path.join(os.environ["LNJAX_TEST_CACHE_DIR"], "downloads"))
os.environ["LNJAX_CACHE_DIR"] = os.environ["LNJAX_TEST_CACHE_DIR"]
os.environ.pop("LNJAX_DATA_DIR", None)  # A user's corpus folder would hide the fixtures.
# Tests never reach the internet: a corpus missing locally is an error naming its URL.
# The download tests unset this and point LNJAX_DATA_MIRROR at a loopback server.
os.environ["LNJAX_DATA_OFFLINE"] = "1"

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:
  sys.path.insert(0, REPO)

import pytest  # noqa: E402  (after the environment above)

# Imported now, in the main thread: hypothesis's pytest plugin otherwise imports it at the
# session's end, through pytest's assertion rewriting, and CPython 3.11's ast.parse can
# then fail with "SystemError: AST constructor recursion depth mismatch" once the tests'
# background threads (orbax's saves) have parsed code concurrently (seen with
# -k refused_save, 1 run in 5).
import hypothesis  # noqa: E402,F401

import forkserver  # noqa: E402  (keeps a copy of the environment set above)

CORPORA = os.path.join(REPO, "tests", "fixtures", "corpora")


@pytest.fixture(scope="session")
def corpora():
  """tests/fixtures/corpora: a data dir of small real corpora (tests/fixtures/README.md),
  for tests that name a data dir or use a cache of their own."""
  import pathlib
  return pathlib.Path(CORPORA)


def pytest_configure(config):
  """xdist's files in LONGEST_FIRST's order (below); the fast tier's one thread per XLA
  computation and command lines started afresh (above): set before any test imports JAX;
  the xdist workers run this too, with the same -m."""
  if hasattr(config.option, "loadscopereorder"):  # xdist: the files in the order below.
    config.option.loadscopereorder = False
  if (config.option.markexpr or "").replace(" ", "") == "notslow":
    flags = os.environ.get("XLA_FLAGS", "")
    if "--xla_cpu_multi_thread_eigen" not in flags:
      os.environ["XLA_FLAGS"] = (flags + " --xla_cpu_multi_thread_eigen=false").strip()
    os.environ.setdefault("LNJAX_TEST_FORK", "0")  # (no fork server: above)


def fast_tier(values, keep):
  """pytest.mark.parametrize's values, those not in `keep` marked slow: the fast tier checks
  a few representatives (the paper's two placements, say), the full tier every one."""
  return [v if v in keep else pytest.param(v, marks=pytest.mark.slow) for v in values]


def assert_same_final_state(workdir_a: str, workdir_b: str) -> None:
  """The latest checkpoints of two runs hold the same train state, leaf for leaf and bit for
  bit, and the same data position (a resumed run against the uninterrupted one)."""
  import jax
  import numpy as np
  from lnjax import tasks
  from lnjax.core import checkpoint
  ra, rb = (checkpoint.restore_run(w, tasks=tasks.get) for w in (workdir_a, workdir_b))
  for x, y in zip(jax.tree.leaves(ra.state), jax.tree.leaves(rb.state), strict=True):
    np.testing.assert_array_equal(x, y)
  assert ra.data_state == rb.data_state


def read_only(*trees):
  """Makes every numpy leaf of `trees` non-writeable, for values a cached helper hands to
  several tests: a test that writes into one fails instead of changing the others'."""
  import jax

  for leaf in jax.tree.leaves(trees):
    leaf.flags.writeable = False


def edit_hf_config(folder, **changes) -> None:
  """A Hugging Face folder's config.json with `changes` applied."""
  path = os.path.join(folder, "config.json")
  with open(path) as f:
    config = json.load(f)
  config.update(changes)
  with open(path, "w") as f:
    json.dump(config, f)


def import_benchmark(name: str):
  """benchmarks/NAME.py as a module, as its script imports it (bench_env first; it leaves
  malloc alone in a process where JAX has started). The environment the scripts set when
  imported (suite.py's XLA_PYTHON_CLIENT_PREALLOCATE, for a GPU its processes share) is
  restored after the import, and benchmarks/ taken off sys.path: a module imports the
  others it needs at its own import."""
  import importlib

  import jax  # noqa: F401  (before bench_env, which then leaves this process's malloc alone)

  here = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks")
  saved = dict(os.environ)
  sys.path.insert(0, here)
  try:
    return importlib.import_module(name)
  finally:
    sys.path.remove(here)
    os.environ.clear()
    os.environ.update(saved)


# Slow tests (`-m "not slow"` leaves them out) in files that other sessions own: marked
# here, by node id prefix, until their files carry @pytest.mark.slow themselves.
SLOW_ELSEWHERE = (
    "tests/test_slurm.py",  # a real one-node SLURM cluster
    "tests/test_multiprocess.py",  # two processes over jax.distributed
    "tests/test_gcs.py::test_smoke_run_in_a_bucket_killed_and_resumed_equals_a_local_run",
    "tests/test_sources.py::test_fresh_clone_runs_the_default_smoke_with_no_data_setting",
    "tests/test_sources.py::test_first_use_downloads_verifies_and_trains_then_reuses",
    "tests/test_sources.py::test_translation_smoke_trains_on_a_tfds_source",
    "tests/test_sources.py::test_iwslt14_prepare_matches_fairseq_test_split_and_trains_the_smoke",
    "tests/test_reliability.py::test_1_",  # a run killed with SIGKILL, then resumed
    "tests/test_reliability.py::test_7_wall_seconds_count_segments_ended_by_kill_9",
)


def pytest_unconfigure(config):
  if _OWN_CACHE:  # The session's prepared data (3-20 MB): not left in the temp folder.
    shutil.rmtree(os.environ["LNJAX_TEST_CACHE_DIR"], ignore_errors=True)


# The files with the longest runs, longest first: the suite's seconds per file, summed over
# its tests (`--durations=0` of the README's command with a new `TMPDIR`, so an empty
# compilation cache, 2026-12-05 at 67af280, 2-core machine with other jobs beside it: the
# tests' own times 3663 s, the run 1853 s: 22 s past half of them). xdist's loadfile hands a
# worker its next file when it is nearly done, so a long file started last keeps one worker
# busy while the other idles; xdist's own order (most tests first) put Ray's ten tests and
# the GPU check's six after the 120 quick mutant-list checks. Started first, they end early
# and the quick files fill in around them.
LONGEST_FIRST = (
    "tests/test_ray.py",  # 257 s
    "tests/test_train.py",  # 231 s
    "tests/test_compile_plan.py",  # 189 s
    "tests/test_sources.py",  # 169 s
    "tests/test_preemption_phases.py",  # 162 s
    "tests/test_bert.py",  # 160 s
    "tests/test_gpu_check.py",  # 151 s
    "tests/test_config_fuzz.py",  # 151 s
    "tests/test_placements.py",  # 135 s
    "tests/test_hf.py",  # 135 s
    "tests/test_hf_modern.py",  # 131 s
    "tests/test_block_options.py",  # 130 s
    "tests/test_workflow.py",  # 128 s
    "tests/test_api.py",  # 127 s
    "tests/test_sharding.py",  # 123 s
    "tests/test_health.py",  # 119 s
    "tests/test_decode.py",  # 100 s
    "tests/test_reliability.py",  # 93 s
    "tests/test_multiprocess.py",  # 90 s
    "tests/test_atlas.py",  # 87 s
    "tests/test_slurm.py",  # 84 s on 2026-12-03 (its cluster did not start in this run)
)


def pytest_collection_modifyitems(config, items):
  for item in items:
    if item.nodeid.startswith(SLOW_ELSEWHERE):
      item.add_marker(pytest.mark.slow)
  rank = {path: i for i, path in enumerate(LONGEST_FIRST)}
  # (A stable sort: each file's tests, and the files not listed, keep their order.)
  items.sort(key=lambda item: rank.get(item.nodeid.split("::")[0], len(rank)))


@pytest.fixture(autouse=True)
def _command_lines_still_fork():
  """No test leaves a variable that the fork server's imports read (tests/forkserver.py's
  _IMPORT_TIME_ENV) changed in its process: from then on every command line of that xdist
  worker ran afresh, each paying Python's start and the imports again (tests/test_llama_bench.py
  importing benchmarks/suite.py, which sets XLA_PYTHON_CLIENT_PREALLOCATE, sent 20 command
  lines of the tests after it to new processes; 2026-12-07)."""
  before = forkserver.import_time_variables(os.environ)
  yield
  after = forkserver.import_time_variables(os.environ)
  changed = {k: (before.get(k), after.get(k)) for k in {*before, *after}
             if before.get(k) != after.get(k)}
  assert not changed, (f"os.environ left changed (before, after): {changed}; the fork server "
                      "would start every later command line of this worker afresh")


@pytest.fixture
def small_disk(tmp_path):
  """A 1 MiB tmpfs (root only): a disk that fills up (tests/test_reliability*.py)."""
  mount = tmp_path / "disk"
  mount.mkdir()
  r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mount)],
                     capture_output=True)
  if r.returncode:
    pytest.skip("needs permission to mount a tmpfs")
  yield str(mount)
  subprocess.run(["umount", "-l", str(mount)])


def pytest_collection_finish(session):
  """Everything imported so far (JAX, flax, transformers, the tests) lives to the end: frozen
  out of the garbage collector's scans, which otherwise walked those objects again at each
  full collection: the fast tier took 88-91 s, 79-82 s frozen (2026-12-02, 2-core machine).
  JAX imported by now (nearly every test module has: a no-op), so that the variables its
  import sets are there before the first test (_command_lines_still_fork)."""
  import gc

  import jax  # noqa: F401
  gc.collect()
  gc.freeze()


def assert_layer_removal_is_the_block_passing_its_input_on(setup, params, batches, num_layers):
  """lnjax.analysis.removal's profile against the model with block i replaced by the
  identity (a flax interceptor returning its input): for every layer, the loss increase
  equals the intercepted model's loss minus the full model's. Returns the profile."""
  import flax.linen as nn
  from lnjax.analysis import probes, removal
  from lnjax.models.transformer import Block

  profile = removal.layer_removal(setup, params, batches)
  for i in range(num_layers):
    def skip(next_fun, args, kwargs, context, i=i):
      if isinstance(context.module, Block) and context.module.index == i:
        return args[0]
      return next_fun(*args, **kwargs)

    with nn.intercept_methods(skip):
      skipped = float(probes.mean_loss(params, setup, batches))
    assert profile["increase"][i] == pytest.approx(skipped - profile["loss"], abs=1e-5)
  return profile


def run_command_lines(argvs: list, env=None, cwd=None, timeout: int = 600) -> list:
  """[(exit code, stdout, stderr)] of `python -m MODULE ARGS...` for each [MODULE, ARGS...]
  in `argvs`, one after another; forked from the tests' warm process where they can be
  (tests/forkserver.py: each child runs its module afresh, its flags, its exit path, its
  one line on stderr)."""
  runs = [forkserver.run([sys.executable, "-m", *map(str, argv)], capture_output=True,
                         text=True, env=env, cwd=cwd, timeout=timeout) for argv in argvs]
  return [(r.returncode, r.stdout, r.stderr) for r in runs]


def signal_when(argv: list, ready, sig=None, env=None, stderr=subprocess.PIPE,
                timeout: int = 600) -> tuple:
  """Starts `argv` from the repository (forked as the tests' command lines are), waits until
  `ready()` holds or it ends, sends `sig` (SIGTERM by default). Returns (exit code, stdout,
  stderr, seconds from the signal to the exit); `stderr=subprocess.STDOUT` merges the two."""
  import signal
  import time
  proc = forkserver.Popen(argv, cwd=REPO, text=True, stdout=subprocess.PIPE, stderr=stderr,
                          env=env)
  try:
    deadline = time.time() + timeout
    while time.time() < deadline and proc.poll() is None and not ready():
      time.sleep(0.05)
    proc.send_signal(sig or signal.SIGTERM)
    sent = time.time()
    out, err = proc.communicate(timeout=300)
    seconds = time.time() - sent
  finally:
    proc.kill()
  return proc.returncode, out, err, seconds
