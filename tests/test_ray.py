"""The Ray back end of lnjax.sweep on a real two-node Ray cluster on this machine: a head
and a second node, each its own `ray start` (its own session, 1 CPU, a custom resource
naming it), on loopback only, stopped by the test (every process of their sessions).

Two smoke runs (Post-LN and Pre-LN) spread over both nodes; a relaunch starts none of them again; one run on
two nodes (two processes joined by jax.distributed, 4 virtual CPU devices each) equals
the run in one process on 8; the second node killed (kill -9, every process of its
session: raylet, workers, the run) while a run trains there: Ray reschedules the run on
the head, it resumes from its checkpoint and ends with the uninterrupted run's metrics;
the whole cluster stopped mid-sweep: the launcher exits with one line and the relaunch on
a new cluster resumes. A sweep into a bucket (tests/test_gcs.py's GCS emulator) on the same
cluster, whose nodes were started with the emulator's client settings: its files and report
in the bucket, a relaunch starts none of its runs. Bad input: an address nobody answers, a
run no node fits.

One cluster serves the module (starting one takes seconds of both cores); the tests that
kill its nodes come last.

Loopback: Ray's CLI takes 127.0.0.1 for "this machine" and replaces it with the
machine's routable address; RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 keeps the head (and the
launcher's driver) on 127.0.0.1, and the second node joins through `127.1` (the same
address, which Ray does not rewrite, resolved by gRPC's native resolver), so every Ray
server listens on 127.0.0.1 only (Ray binds to 127.0.0.1 alone when a node's address is
exactly that).
"""

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

import pytest

import forkserver
import test_gcs
import test_stability
from lnjax.sweep import launcher, ray_backend

gcs = test_gcs.gcs  # The GCS emulator on 127.0.0.1 (a module fixture).
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RAY = shutil.which("ray")
# The runs' config: configs/lm.py:smoke, longer, with a checkpoint every 20 steps. The
# kill tests strike between the checkpoint of step 20 and the end: 80 steps (about 2 s on
# an idle 2-core machine; 40 were too few to be sure of a run still training).
STEPS = 100
CONFIG = f"""
from configs import lm
from lnjax import sweep

def get_config(arg=None):
  c = lm.get_config('smoke')
  c.train.num_steps = {STEPS}
  c.train.checkpoint_every_steps = 20
  c.train.eval_every_steps = {STEPS}
  return c

def get_sweep(arg=None):
  if arg == 'two':
    return sweep.axis('model.norm_position', ['pre', 'post'])
  return sweep.axis('model.norm_position', ['pre'])
"""
# The two-process run (tests/test_multiprocess.py's settings): SGD, a mesh of fsdp 4 ×
# model 2, built from the two processes' 1×2×2 devices.
MP_STEPS = 6
MP = {"opt.name": "sgd", "opt.learning_rate": 0.1, "train.num_steps": MP_STEPS,
      "train.log_every_steps": 1, "train.eval_every_steps": MP_STEPS,
      "train.checkpoint_every_steps": 3, "data.eval_batches": 1, "mesh.data": 1,
      "mesh.model": 2}


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def _stat(pid) -> list[str]:
  """/proc/PID/stat's fields after the command name: state, parent, group, session, ..."""
  stat = open(f"/proc/{pid}/stat").read()
  return stat[stat.rindex(")") + 2:].split()


def _session_pids(sid: int) -> list[int]:
  pids = []
  for entry in os.listdir("/proc"):
    if entry.isdigit():
      try:
        fields = _stat(entry)
      except OSError:
        continue
      if int(fields[3]) == sid and fields[0] != "Z":
        pids.append(int(entry))
  return pids


def _cmdline(pid: int) -> str:
  try:
    return open(f"/proc/{pid}/cmdline", "rb").read().replace(b"\0", b" ").decode()
  except OSError:
    return ""


class Cluster:
  """A Ray cluster of this machine: the head and a second node, each `ray start` in a
  session of its own (so that every process of a node is found by its session id)."""

  def __init__(self):
    # Short: Ray's Unix sockets live under it (a socket path is at most 107 bytes).
    self.temp = tempfile.mkdtemp(prefix="lnjr", dir="/tmp")
    self.sessions: dict[str, int] = {}
    self.starting: dict[str, subprocess.Popen] = {}  # `ray start` commands not waited for.
    self.ports: set[int] = set()  # The heads' ports so far.
    self.temps = [self.temp]  # The heads' folders so far.
    base = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    flags = [f for f in base.get("XLA_FLAGS", "").split()
             if not f.startswith("--xla_force_host_platform_device_count")]
    self.env = {**base, "RAY_USAGE_STATS_ENABLED": "0", "PYTHONUNBUFFERED": "1",
                "XLA_FLAGS": " ".join(flags + ["--xla_force_host_platform_device_count=4"]),
                # A lost node is seen within seconds (Ray's default: 5 × 3 s).
                "RAY_health_check_period_ms": "500", "RAY_health_check_timeout_ms": "500",
                "RAY_health_check_failure_threshold": "3",
                # The launcher's driver gives up on a head gone for 10 s (Ray's default: 60).
                "RAY_gcs_rpc_server_reconnect_timeout_s": "10"}
    self.local = {**self.env, "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}

  def start_head(self, wait: bool = True) -> None:
    """`ray start --head`; a later head (a new cluster, which may start while the last one
    still runs) on a port and in a folder no earlier head had. `wait=False` returns while
    it starts (wait_for("head"))."""
    self.port = _free_port()
    while self.port in self.ports:
      self.port = _free_port()
    temp = tempfile.mkdtemp(prefix="lnjr", dir="/tmp") if self.ports else self.temp
    self.ports.add(self.port)
    self.temps.append(temp)
    self.address = f"127.0.0.1:{self.port}"
    self._start("head", ["--head", "--node-ip-address=127.0.0.1", f"--port={self.port}",
                         f"--ray-client-server-port={_free_port()}",
                         f"--dashboard-port={_free_port()}", f"--temp-dir={temp}",
                         "--include-dashboard=false"],
                self.local, wait)

  def start_node(self) -> None:
    self._start("node_b", [f"--address=127.1:{self.port}"],
                {**self.env, "GRPC_DNS_RESOLVER": "native"})

  def _start(self, name: str, args: list[str], env: dict, wait: bool = True) -> None:
    with open(os.path.join(self.temp, f"{name}.log"), "a") as log:
      proc = subprocess.Popen(
          [RAY, "start", *args, "--num-cpus=1", f'--resources={{"{name}": 1}}',
           "--object-store-memory=78643200", "--include-log-monitor=false", "--disable-usage-stats",
           f"--dashboard-agent-listen-port={_free_port()}"],
          stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
          start_new_session=True)
    self.sessions[name] = proc.pid
    self.starting[name] = proc
    if wait:
      self.wait_for(name)

  def wait_for(self, name: str) -> None:
    """Until the node's `ray start` ended; it must have succeeded."""
    code = self.starting.pop(name).wait(180)
    tail = open(os.path.join(self.temp, f"{name}.log")).read()[-3000:]
    assert code == 0, tail

  def kill(self, name: str, spare=lambda cmdline: False) -> list[str]:
    """kill -9 every process of a node's session (but those `spare` keeps); their command
    lines, read before the kill (a killed process has none)."""
    processes = {p: _cmdline(p) for p in _session_pids(self.sessions.pop(name))}
    killed = []
    for pid, cmdline in processes.items():
      if spare(cmdline):
        continue
      try:
        os.kill(pid, signal.SIGKILL)
        killed.append(cmdline)
      except ProcessLookupError:
        pass
    return killed

  def stop(self) -> None:
    for name in list(self.sessions):
      self.kill(name)
    for proc in self.starting.values():  # (Killed above with its session.)
      proc.wait(60)
    for temp in self.temps:
      shutil.rmtree(temp, ignore_errors=True)


def _two_node_cluster():
  """A head and a second node, stopped when the module's tests are done."""
  if RAY is None:
    pytest.skip("ray is not installed (pip install -r requirements.txt)")
  c = Cluster()
  # The fork server the launchers come from (tests/forkserver.py, started on first use)
  # starts while the nodes do: one after the other they took 7 s + 21 s (2026-12-07,
  # 2-core machine with other jobs beside it).
  server = threading.Thread(target=forkserver.start, daemon=True)
  server.start()
  try:
    c.start_head()
    c.start_node()
    server.join()
    yield c
  finally:
    server.join()
    c.stop()


@pytest.fixture(scope="module")
def cluster(gcs):
  """The module's cluster, started with the GCS emulator's client settings in its
  environment (as a real cluster's nodes have their bucket credentials)."""
  yield from _two_node_cluster()


def _config(tmp) -> str:
  path = os.path.join(tmp, "ray_sweep_config.py")
  with open(path, "w") as f:
    f.write(CONFIG)
  return path


def _sweep(cluster, config, sweep, root, *flags, wait=True, timeout=300, niceness=0,
           env=None):
  """The sweep's launcher, at `niceness` (`nice -n NICENESS python -m lnjax.cli.sweep`);
  at niceness 0 forked as the tests' command lines are (tests/forkserver.py: the launcher
  loads the config, so JAX and Flax, which the fork server has imported); `env` adds to
  the cluster's environment."""
  cmd = [sys.executable, "-m", "lnjax.cli.sweep", f"--config={config}", f"--sweep={sweep}",
         f"--workdir={root}", "--backend=ray", f"--ray_address={cluster.address}", *flags]
  nice = {"preexec_fn": lambda: os.nice(niceness)} if niceness else {}
  proc = (subprocess.Popen if niceness else forkserver.Popen)(
      cmd, cwd=REPO, env={**cluster.local, **(env or {})}, stdout=subprocess.PIPE,
      stderr=subprocess.STDOUT, text=True, start_new_session=True, **nice)
  if not wait:
    return proc
  try:
    out, _ = proc.communicate(timeout=timeout)
  finally:
    if proc.poll() is None:
      os.killpg(proc.pid, signal.SIGKILL)
  return proc.returncode, out


def _losses(workdir: str) -> list[tuple]:
  """(step, train_loss, eval_loss) per record; a line the run is still writing is left out."""
  records = launcher.read_metrics(workdir)
  return [(r["step"], r.get("train_loss"), r.get("eval_loss")) for r in records
          if "train_loss" in r or "eval_loss" in r]


def _manifest(root: str) -> dict:
  return json.load(open(os.path.join(root, "sweep.json")))


def _node_names(manifest: dict) -> dict[str, str]:
  """Node id -> the custom resource naming it (head, node_b)."""
  return {i: next(k for k in n["resources"] if k in ("head", "node_b"))
          for i, n in manifest["ray"]["nodes"].items()}


@pytest.fixture(scope="module")
def reference(cluster, tmp_path_factory):
  """Two smoke runs through the Ray back end, uninterrupted: the reference metrics."""
  tmp = str(tmp_path_factory.mktemp("ray"))
  config, root = _config(tmp), os.path.join(tmp, "two")
  code, out = _sweep(cluster, config, "two", root)
  return {"config": config, "root": root, "code": code, "out": out, "tmp": tmp}


@pytest.mark.slow
def test_two_runs_spread_over_both_nodes_and_a_relaunch_starts_none(cluster, reference):
  root, out = reference["root"], reference["out"]
  assert reference["code"] == 0, out[-3000:]
  manifest = _manifest(root)
  names = _node_names(manifest)
  runs = manifest["runs"]
  assert sorted(runs) == ["norm=post", "norm=pre"]
  assert all(r["state"] == "completed" and r["exit_code"] == 0 for r in runs.values()), runs
  assert {names[r["node"]] for r in runs.values()} == {"head", "node_b"}  # Both nodes ran.
  # The local launcher's progress lines and table.
  assert "ray: 2 nodes" in out and out.count("start     norm=") == 2
  assert out.count("completed norm=") == 2 and f"{STEPS}/{STEPS}" in out
  for name in runs:
    assert _losses(os.path.join(root, name))[-1][0] == STEPS

  # The same command again: every run finished, none starts (no Ray driver at all).
  task_files = {n: open(os.path.join(root, n, ".ray_task.json")).read() for n in runs}
  code, again = _sweep(cluster, reference["config"], "two", root)
  assert code == 0 and "2 already finished, 0 to run" in again and "start " not in again
  assert task_files == {n: open(os.path.join(root, n, ".ray_task.json")).read() for n in runs}
  assert all(r["attempts"] == 1 for r in _manifest(root)["runs"].values())


@pytest.mark.slow
def test_a_stability_search_sends_its_probe_as_a_ray_task(cluster, tmp_path):
  """`lnjax stability --backend=ray`: a search with one probe left runs it on the cluster
  (test_stability.one_probe_left)."""
  state, workdir = test_stability.one_probe_left(tmp_path)
  out = forkserver.run(
      [sys.executable, "-m", "lnjax.cli.stability", "--backend=ray",
       f"--ray_address={cluster.address}", *test_stability.ONE_PROBE_FLAGS,
       f"--workdir={workdir}", f"--state={state}"],
      cwd=REPO, env=cluster.local, capture_output=True, text=True, timeout=600)
  assert out.returncode == 0, out.stdout + out.stderr
  entry = test_stability.check_the_last_probe(state, workdir)
  assert entry["node"], entry  # Run by Ray, on this node.


@pytest.mark.slow
def test_a_sweep_in_a_bucket_reports_there_and_a_relaunch_starts_none(cluster, gcs, tmp_path):
  """--workdir=gs://...: every file of the sweep and its runs in the bucket (each run's
  log copied there from its node), the report written there, and the same command again
  starts no run."""
  _, fs = gcs
  config, prefix = _config(str(tmp_path)), f"{test_gcs.BUCKET}/ray_sweep"
  fixed = {"train.num_steps": 20, "train.eval_every_steps": 20}
  short = [f"--config.{k}={v}" for k, v in fixed.items()]
  code, out = _sweep(cluster, config, "two", f"gs://{prefix}", *short)
  assert code == 0, out[-3000:]
  manifest = json.loads(fs.cat(f"{prefix}/sweep.json"))
  runs = manifest["runs"]
  assert sorted(runs) == ["norm=post", "norm=pre"]
  assert all(r["state"] == "completed" and r["attempts"] == 1 for r in runs.values()), runs
  assert {_node_names(manifest)[r["node"]] for r in runs.values()} == {"head", "node_b"}
  assert out.count("start     norm=") == 2 and "20/20" in out
  assert not re.findall(r"^I\d{4} ", out, re.M), out[-3000:]  # No INFO lines (gcsfs's).
  for name in runs:
    assert json.loads(fs.cat(f"{prefix}/{name}/summary.json"))["step"] == 20
    assert "ray task on node" in fs.cat(f"{prefix}/{name}/log.txt").decode()
  assert not os.path.exists(os.path.join(REPO, "gs:"))  # Nothing local named after the URL.

  from lnjax import sweep
  from lnjax.sweep import report  # What `--report` writes.
  report.write(f"gs://{prefix}", sweep.expand(config, "two", fixed), title="bucket")
  rows = json.loads(fs.cat(f"{prefix}/results.json"))
  assert [row["state"] for row in rows] == ["completed", "completed"]
  assert all(fs.exists(f"{prefix}/{f}") for f in ("report.md", "results.csv",
                                                  "loss_curves.png", "stability_map.png"))

  # The same command again: every run finished, none starts.
  task_files = {n: fs.cat(f"{prefix}/{n}/.ray_task.json") for n in runs}
  code, again = _sweep(cluster, config, "two", f"gs://{prefix}", *short)
  assert code == 0 and "2 already finished, 0 to run" in again and "start " not in again
  assert task_files == {n: fs.cat(f"{prefix}/{n}/.ray_task.json") for n in runs}
  assert all(r["attempts"] == 1 for r in json.loads(fs.cat(f"{prefix}/sweep.json"))[
      "runs"].values())
  # The local back end's locks need a local file system: a bucket is one line.
  from lnjax.core import errors
  from lnjax.sweep import launcher
  with pytest.raises(errors.ConfigError, match="the local back end locks its runs on a local"):
    launcher.Launcher(config, "two", [], f"gs://{prefix}", []).run()


@pytest.mark.slow
def test_a_run_on_two_nodes_equals_the_run_in_one_process(cluster, reference):
  """--nodes_per_run=2: one process per node (a STRICT_SPREAD placement group), joined by
  jax.distributed, against the same run in one process on 8 devices (trained meanwhile,
  beside the cluster: its start-up overlaps the sweep's; forked as the tests' command
  lines are)."""
  tmp = reference["tmp"]
  one = os.path.join(tmp, "mp_one")
  flags = [f"--config.{k}={v}" for k, v in MP.items()]
  env = {**os.environ, "JAX_PLATFORMS": "cpu"}  # 8 virtual devices (tests/conftest.py).
  with open(os.path.join(tmp, "mp_one.log"), "w+") as log:
    single = forkserver.Popen([sys.executable, "-m", "lnjax.main",
                               f"--config={reference['config']}", f"--workdir={one}", *flags,
                               "--config.mesh.fsdp=4"], cwd=REPO, env=env, stdout=log,
                              stderr=subprocess.STDOUT)
    try:
      root = os.path.join(tmp, "mp")
      code, out = _sweep(cluster, reference["config"], "one", root, "--nodes_per_run=2",
                         *flags, "--config.mesh.fsdp=2", "--config.mesh.dcn_fsdp=2")
      single.wait(timeout=300)
    finally:
      if single.poll() is None:
        single.kill()
    log.seek(0)
    assert single.returncode == 0, log.read()[-3000:]
  assert code == 0, out[-3000:] + open(os.path.join(root, "norm=pre", "log.txt")).read()[-3000:]
  two = os.path.join(root, "norm=pre")
  # Both processes trained, process 1 on the other node; only process 0 wrote metrics.
  log0, log1 = (open(os.path.join(two, f)).read() for f in ("log.txt", "log.process_1.txt"))
  assert "process 0/2" in log0 and "process 1/2" in log1
  assert os.path.isdir(os.path.join(two, "checkpoints", str(MP_STEPS), "state",
                                    "ocdbt.process_1"))
  import numpy as np
  for column in (1, 2):  # The train loss of every step, then the held-out loss.
    a, b = ([(r[0], r[column]) for r in _losses(w) if r[column] is not None] for w in (one, two))
    assert [step for step, _ in a] == [step for step, _ in b]
    np.testing.assert_allclose([v for _, v in b], [v for _, v in a], rtol=1e-5, atol=1e-5)


@pytest.mark.slow
def test_a_run_no_node_fits_is_one_line(cluster, reference):
  root = os.path.join(reference["tmp"], "too_big")
  code, out = _sweep(cluster, reference["config"], "one", root, "--platform=cpu",
                     "--devices_per_run=64", timeout=120)
  lines = [l for l in out.splitlines() if l.startswith("lnjax.cli.sweep: error")]
  assert code == 2 and len(lines) == 1, out[-3000:]
  assert "a run asks for 1 node(s) with CPU 64, 0 node(s) have it" in lines[0]


@pytest.mark.slow
def test_unreachable_address_is_one_line_after_a_bounded_wait(tmp_path):
  config, port = _config(str(tmp_path)), _free_port()
  t0 = time.monotonic()
  r = forkserver.run([sys.executable, "-m", "lnjax.cli.sweep", f"--config={config}",
                      "--sweep=one", f"--workdir={tmp_path / 'x'}", "--backend=ray",
                      f"--ray_address=127.0.0.1:{port}", "--ray_connect_seconds=2"],
                     cwd=REPO, capture_output=True, text=True, timeout=120)
  assert r.returncode == 2 and time.monotonic() - t0 < 60, r.stderr[-3000:]
  assert r.stderr.strip().splitlines() == [
      f"lnjax.cli.sweep: error: no Ray cluster answers at 127.0.0.1:{port} (Connection refused "
      "for 2 s): start one (ray start --head) or fix --ray_address / RAY_ADDRESS"]


def _wait_for(predicate, timeout: float, what: str):
  deadline = time.monotonic() + timeout
  while time.monotonic() < deadline:
    value = predicate()
    if value:
      return value
    time.sleep(0.1)
  raise AssertionError(f"timed out waiting for {what}")


def _ended_summary(workdir: str) -> dict | None:
  try:
    summary = json.load(open(os.path.join(workdir, "summary.json")))
  except (OSError, ValueError):
    return None
  return summary if summary.get("status") not in (None, "running") else None


def _checkpointed_not_done(workdir: str):
  """True once the run saved step 20 and has not yet reached step STEPS."""
  steps = [s for s, *_ in _losses(workdir)] if os.path.exists(
      os.path.join(workdir, "metrics.jsonl")) else []
  return (os.path.isdir(os.path.join(workdir, "checkpoints", "20"))
          and (not steps or steps[-1] < STEPS))


@pytest.mark.slow
def test_a_run_whose_node_is_lost_is_rescheduled_and_resumes(cluster, reference):
  """Two runs (one per node); the second node's processes killed with -9 while its run
  trains past its first checkpoint: Ray retries the task on the head, the run resumes.
  The launcher runs at nice 17, above Ray's workers (15), and so does the run's process
  on node_b."""
  root = os.path.join(reference["tmp"], "lost")
  proc = _sweep(cluster, reference["config"], "two", root, wait=False, niceness=17)
  try:
    def on_node_b():
      if not os.path.exists(os.path.join(root, "sweep.json")):
        return None
      manifest = _manifest(root)
      if "ray" not in manifest:
        return None
      names = _node_names(manifest)
      return next((n for n, r in manifest["runs"].items()
                   if r.get("node") and names.get(r["node"]) == "node_b"), None)
    name = _wait_for(on_node_b, 120, "a run on node_b")
    workdir = os.path.join(root, name)
    _wait_for(lambda: _checkpointed_not_done(workdir), 120, "the run's checkpoint at step 20")
    pid = json.load(open(os.path.join(workdir, ray_backend.TASK_FILE)))["pid"]
    worker = int(_stat(pid)[1])
    worker_nice = os.getpriority(os.PRIO_PROCESS, worker)  # Ray's worker_niceness: 15.
    assert "lnjax.main" in _cmdline(pid)
    assert os.getpriority(os.PRIO_PROCESS, pid) == max(worker_nice, min(19, os.nice(0) + 17))
    killed = cluster.kill("node_b")
    assert any("raylet" in c for c in killed) and any("lnjax.main" in c for c in killed), (
        killed, _losses(workdir)[-1:])
    out, _ = proc.communicate(timeout=300)
  finally:
    if proc.poll() is None:
      os.killpg(proc.pid, signal.SIGKILL)
  assert proc.returncode == 0, out[-3000:]
  assert f"resumed   {name} on node 127.0.0.1" in out and "after its node was lost" in out
  entry = _manifest(root)["runs"][name]
  assert entry["state"] == "completed" and entry["reschedules"] == 1
  assert _node_names(_manifest(root))[entry["node"]] == "head"
  log = open(os.path.join(workdir, "log.txt")).read()
  assert "Resuming" in log or "from step" in log, log[-3000:]
  # The resumed run's metrics are the uninterrupted run's.
  for run in ("norm=pre", "norm=post"):
    assert _losses(os.path.join(root, run)) == _losses(os.path.join(reference["root"], run)), run


@pytest.mark.slow
def test_the_cluster_stopping_mid_sweep_is_one_line_and_the_relaunch_resumes(
    cluster, reference):
  """Every Ray process of both nodes killed while a run trains (as `ray stop` does; the
  run gets SIGTERM from its dead worker and saves); a new cluster, the same command."""
  if "node_b" in cluster.sessions:
    cluster.kill("node_b")
  root = os.path.join(reference["tmp"], "stopped")
  # The launcher's driver gives up on a head gone for 3 s (not the cluster's 10), and the
  # new cluster starts while the old one trains: one after the other, the driver's wait and
  # the new head's start took 11 s + 15 s (2026-12-07, 2-core machine with other jobs).
  proc = _sweep(cluster, reference["config"], "one", root, wait=False,
                env={"RAY_gcs_rpc_server_reconnect_timeout_s": "3"})
  workdir, address = os.path.join(root, "norm=pre"), cluster.address
  cluster.sessions["stopped"] = cluster.sessions.pop("head")
  cluster.start_head(wait=False)
  try:
    _wait_for(lambda: _checkpointed_not_done(workdir), 120, "the run's checkpoint")
    cluster.kill("stopped", spare=lambda cmdline: "lnjax.main" in cmdline)
    out, _ = proc.communicate(timeout=120)
  finally:
    if proc.poll() is None:
      os.killpg(proc.pid, signal.SIGKILL)
  errors = [l for l in out.splitlines() if l.startswith("lnjax.cli.sweep: error")]
  assert proc.returncode == 1 and errors == [
      f"lnjax.cli.sweep: error: the Ray cluster at {address} went away during the sweep "
      "(1 run(s) stopped: norm=pre; each saved a checkpoint on SIGTERM or resumes from its "
      "last one); the same command resumes the sweep on a running cluster"], out[-3000:]
  # The run got SIGTERM from its dead worker (PR_SET_PDEATHSIG) and saved a checkpoint.
  summary = _wait_for(lambda: _ended_summary(workdir), 60, "the run's end")
  assert summary["status"] == "preempted" and summary["step"] < STEPS, summary

  cluster.wait_for("head")
  code, out = _sweep(cluster, reference["config"], "one", root)
  assert code == 0, out[-3000:]
  assert "0 already finished, 1 to run" in out or "1 already finished" in out
  assert _losses(workdir) == _losses(os.path.join(reference["root"], "norm=pre"))


def test_kuberay_manifests_match_the_pinned_ray_and_ask_for_their_accelerators():
  """cluster/*.yaml: a RayCluster at requirements.txt's Ray version, the shared volume in
  every pod, workers asking Kubernetes for TPU chips or GPUs on nodes that have them."""
  import yaml
  pin = next(l.split("==")[1].split()[0] for l in open(os.path.join(REPO, "requirements.txt"))
             if l.startswith("ray=="))
  for name, resource, selector in (("tpu", "google.com/tpu", "cloud.google.com/gke-tpu-accelerator"),
                                   ("gpu", "nvidia.com/gpu", "cloud.google.com/gke-accelerator")):
    docs = list(yaml.safe_load_all(open(os.path.join(REPO, "cluster", f"kuberay-{name}.yaml"))))
    claim = next(d for d in docs if d["kind"] == "PersistentVolumeClaim")
    cluster = next(d for d in docs if d["kind"] == "RayCluster")
    assert claim["spec"]["accessModes"] == ["ReadWriteMany"]
    assert cluster["spec"]["rayVersion"] == pin
    pods = [cluster["spec"]["headGroupSpec"]["template"]["spec"]] + [
        g["template"]["spec"] for g in cluster["spec"]["workerGroupSpecs"]]
    for pod in pods:
      (container,) = pod["containers"]
      assert {"name": "shared", "mountPath": "/shared"} in container["volumeMounts"]
      assert pod["volumes"][0]["persistentVolumeClaim"]["claimName"] == claim["metadata"]["name"]
    for group in cluster["spec"]["workerGroupSpecs"]:
      pod = group["template"]["spec"]
      limits = pod["containers"][0]["resources"]["limits"]
      assert int(limits[resource]) >= 1 and selector in pod["nodeSelector"]
      assert group["minReplicas"] >= 1  # A run's shape is checked against present nodes.


def test_each_process_asks_ray_for_its_platforms_devices(tmp_path, monkeypatch):
  """--platform/--devices_per_run as Ray resources (auto: TPUs, else GPUs, else CPUs; one
  CPU beside accelerators), and the refusals made before anything starts."""
  from lnjax import sweep
  from lnjax.core import errors
  from lnjax.sweep import ray_backend, ray_driver
  shape = ray_driver.per_process_resources
  assert shape("cpu", 4, {"CPU": 64, "GPU": 8}) == {"CPU": 4}
  assert shape("gpu", 2, {"CPU": 64, "GPU": 8}) == {"CPU": 1, "GPU": 2}
  assert shape("tpu", 4, {"CPU": 96, "TPU": 16}) == {"CPU": 1, "TPU": 4}
  assert shape("auto", None, {"CPU": 96, "TPU": 16, "GPU": 8}) == {"CPU": 1, "TPU": 1}
  assert shape("auto", 8, {"CPU": 64, "GPU": 8}) == {"CPU": 1, "GPU": 8}
  assert shape("auto", None, {"CPU": 2}) == {"CPU": 1}
  assert ray_driver._ray_options({"CPU": 1, "TPU": 4}) == {
      "num_cpus": 1, "num_gpus": 0, "resources": {"TPU": 4}}
  runs = sweep.expand(_config(str(tmp_path)), "one")
  monkeypatch.delenv("RAY_ADDRESS", raising=False)
  with pytest.raises(errors.ConfigError, match="needs the cluster's address"):
    ray_backend.RayLauncher("c.py", "one", runs, str(tmp_path / "a"))
  with pytest.raises(errors.ConfigError, match="--nodes_per_run=0 must be >= 1"):
    ray_backend.RayLauncher("c.py", "one", runs, str(tmp_path / "b"), address="h:1",
                            nodes_per_run=0)
  monkeypatch.setenv("RAY_ADDRESS", "head:6379")
  assert ray_backend.RayLauncher("c.py", "one", runs, str(tmp_path / "c")).address == "head:6379"
