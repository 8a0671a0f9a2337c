r"""The Ray back end of the sweep launcher: each run of a sweep a Ray task on a node of a
Ray cluster, in the local launcher's run folders, manifest and progress table.

  python -m lnjax.cli.sweep --backend=ray --ray_address=HEAD:6379 \
      --config=configs/lm.py:size=course \
      --sweep=course --workdir=gs://bucket/sweeps/course [--platform=auto|cpu|gpu|tpu] \
      [--devices_per_run=N] [--nodes_per_run=2] [--parallel=K]

A run asks Ray for `--devices_per_run` devices of the platform (cpu: CPUs; gpu: GPUs,
Ray sets CUDA_VISIBLE_DEVICES; tpu: Ray's `TPU` resource, chips of one host, Ray sets
TPU_VISIBLE_CHIPS) and one CPU beside accelerators; auto takes TPUs if a node has them,
else GPUs, else CPUs. Its task runs `python -m lnjax.main` on the node it lands on, in the
launcher's folder (or the job's working_dir under `ray job submit`), and writes to
ROOT/<name>: the run folders must be on storage every node sees, a shared file system or a
bucket (gs://; every node needs the bucket's credentials, as training does). Every read
and write of ROOT goes through lnjax.core.fileio. On a bucket, a run's log.txt is written
on its node's local disk and copied over the bucket's log.txt every LOG_UPLOAD_SECONDS and
when the process ends (the earlier attempts' lines kept above it), and the Ray driver's
own log stays on the launcher's machine (its path is in the messages that name it).
With `--nodes_per_run=N > 1` a run is N tasks, one per node (a STRICT_SPREAD placement
group), joined by `--distributed` with process 0's node as coordinator.

What survives what:
  - a finished run is never started again: the launcher skips it, and a task that finds
    its run finished (a retry after the run completed) returns at once;
  - a run holds ROOT/<name>/.lock (flock) while lnjax.main trains it, so two tasks never
    train one run: a task waits for the lock of an earlier attempt still saving; on a
    bucket (no flock) the task waits for lnjax.main's own lock, ROOT/<name>/.lnjax.lock,
    until its holder ended (or, on a lost node, until it is stale: lnjax/core/lock.py);
  - a lost node (a dead raylet, a preempted VM): Ray retries the task elsewhere
    (`max_retries`), and lnjax.main resumes from the run's last checkpoint; a run on
    several nodes is restarted whole (a new placement group);
  - lnjax.main gets SIGTERM when its task's worker dies (PR_SET_PDEATHSIG), so a stopped
    cluster leaves every run with a checkpoint;
  - the cluster stopping mid-sweep ends Ray's driver (it exits with its raylet): Ray is
    driven from a child process (`python -m lnjax.sweep.ray_driver`), and the launcher
    says so in one line and exits 1; the same command resumes on a cluster that is up.

The launcher itself never imports Ray (nor JAX): only its driver process does. Functions
for other programs (a search launching probe runs): `launch(...)` starts runs and returns
the launcher (`poll()`, `wait()`, `stop()`, `states`), `run_to_the_end(...)` as the local
launcher's.
"""

import hashlib
import json
import os
import pickle
import queue
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

from lnjax.core import errors, fileio
from lnjax.sweep import Run, launcher

QUEUED = "queued"  # Submitted to Ray; waiting for a node with the run's resources.
TASK_FILE = ".ray_task.json"  # In a run folder: where the run's current attempt trains.
DRIVER_LOG = "ray_driver.log"  # In the sweep folder: the Ray driver's own output.
LOG_UPLOAD_SECONDS = 10.0  # On a bucket: how often a task copies its run's log there.


class ClusterLost(errors.LnjaxError):
  """The Ray cluster went away during the sweep: the runs are unfinished, not failed."""

  exit_code = 1


# ---------------------------------------------------------------------------------------
# The launcher (no Ray here).


class RayLauncher(launcher.Launcher):
  """Runs `runs` of `config_arg` under `root` as Ray tasks on the cluster at `address`.

  `platform`/`devices_per_run` size each process's Ray resources, `nodes_per_run` the
  processes of a run (one per node), `parallel` caps the runs submitted at once (0: all;
  Ray queues what does not fit), `reschedules` how often a run lost with its node is
  started again, `connect_seconds` how long an address that does not answer is tried.
  """

  def __init__(self, config_arg, sweep_arg, runs, root, fixed=None, *, address=None,
               platform="auto", devices_per_run=None, nodes_per_run=1, parallel=0,
               reschedules=3, connect_seconds=30.0, grace_seconds=600.0, **view):
    super().__init__(config_arg, sweep_arg, runs, root, [], fixed, grace_seconds=grace_seconds,
                     **view)
    self.address = address or os.environ.get("RAY_ADDRESS")
    if not self.address:
      raise errors.ConfigError("--backend=ray needs the cluster's address: --ray_address="
                               "HEAD:6379 (or RAY_ADDRESS)")
    if platform not in ("auto", "cpu", "gpu", "tpu"):
      raise errors.ConfigError(f"--platform={platform} is not one of auto, cpu, gpu, tpu")
    for name, value, low in (("devices_per_run", devices_per_run or 1, 1),
                             ("nodes_per_run", nodes_per_run, 1), ("parallel", parallel, 0)):
      if value < low:
        raise errors.ConfigError(f"--{name}={value} must be >= {low}")
    self.platform, self.devices_per_run = platform, devices_per_run
    self.nodes_per_run, self.parallel, self.reschedules = nodes_per_run, parallel, reschedules
    self.connect_seconds = connect_seconds
    self.where: dict[str, str] = {}  # Run name -> "node 10.0.0.3 (1a2b3c4d)".
    self._tasks: dict[str, dict] = {}  # Run name -> the task file last seen.
    self._driver = None
    self._events: queue.Queue = queue.Queue()
    self._submitted: list[str] = []
    self._connected_by = None  # Deadline for the driver's connection; 0 once connected.
    # The task files read at most this often (on a bucket each read is a request).
    self._check_every = 2.0 if fileio.is_remote(root) else 0.0
    self._next_check = 0.0
    self.driver_log = os.path.join(root, DRIVER_LOG)
    if fileio.is_remote(root):  # (No append on a bucket: the driver's log stays here.)
      tag = hashlib.sha1(root.encode()).hexdigest()[:10]
      self.driver_log = os.path.join(tempfile.gettempdir(), f"lnjax_ray_driver_{tag}.log")
    self._done = False
    self._stopping = False  # Asked the driver to stop the runs (a signal came).

  # ---- Starting, polling, stopping (what other programs call).

  def start(self) -> None:
    """Records finished runs, checks the cluster answers, and starts the Ray driver on the
    others; returns at once."""
    fileio.makedirs(self.root)
    todo = []
    for run in self.runs:
      fileio.makedirs(self.workdir(run))
      done = launcher.finished_state(run, self.workdir(run))
      if done:
        self._record(run, done)
      else:
        todo.append(run)
    self.view.event(
        f"sweep {self.config_arg} --sweep={self.sweep_arg}: {len(self.runs)} runs, "
        f"{len(self.runs) - len(todo)} already finished, {len(todo)} to run on the Ray "
        f"cluster at {self.address} ({self.nodes_per_run} node(s) each); results in {self.root}")
    if not todo:
      self._done = True
      return
    _wait_for_address(self.address, self.connect_seconds)
    submitted = time.strftime("%Y-%m-%d %H:%M:%S")
    for run in todo:
      attempts = self.manifest["runs"][run.name].get("attempts", 0) + 1
      self._record(run, QUEUED, attempts=attempts, exit_code=None, error=None, node=None,
                   started=submitted)
      self._submitted.append(run.name)
    spec = {"address": self.address, "platform": self.platform,
            "devices_per_run": self.devices_per_run, "nodes_per_run": self.nodes_per_run,
            "parallel": self.parallel, "reschedules": self.reschedules, "cwd": os.getcwd(),
            "grace_seconds": self.grace_seconds, "submitted": submitted,
            "niceness": os.nice(0),
            "runs": [(run, self.command(run), fileio.abspath(self.workdir(run))) for run in todo]}
    log = open(self.driver_log, "a")
    self._driver = subprocess.Popen(
        [sys.executable, "-m", "lnjax.sweep.ray_driver"], stdin=subprocess.PIPE,
        stdout=subprocess.PIPE, stderr=log, start_new_session=True)
    log.close()
    self._driver.stdin.write(pickle.dumps(spec))
    self._driver.stdin.close()
    threading.Thread(target=self._read_events, daemon=True).start()
    self._connected_by = time.monotonic() + self.connect_seconds + 120

  def poll(self) -> dict[str, str]:
    """Takes in what happened since the last call; returns every run's state. Raises
    ConfigError for a refused sweep (no node fits a run, the address is no Ray cluster)
    and ClusterLost when the cluster went away."""
    if self._done:
      return dict(self.states)
    if time.monotonic() >= self._next_check:
      self._check_tasks()
      self._next_check = time.monotonic() + self._check_every
    while True:
      try:
        event = self._events.get_nowait()
      except queue.Empty:
        break
      if event is None:  # The driver ended.
        self._driver.wait()
        self._check_tasks()
        self._done = True
        if self._connected_by or any(self.states[n] in (QUEUED, launcher.RUNNING)
                                     for n in self._submitted):
          self._lost()
        break
      self._on_event(event)
    if (self._connected_by and time.monotonic() > self._connected_by
        and self._driver.poll() is None):
      self._kill_driver()
      raise errors.ConfigError(f"{self.address} answers but no Ray cluster connected within "
                               f"{self.connect_seconds + 120:.0f} s (see {self.driver_log})")
    return dict(self.states)

  def wait(self, timeout: float | None = None) -> dict[str, str]:
    """poll() until every run ended (or `timeout` seconds passed)."""
    deadline = None if timeout is None else time.monotonic() + timeout
    while not self._done and (deadline is None or time.monotonic() < deadline):
      self.poll()
      self.view.refresh()
      time.sleep(0.2)
    return dict(self.states)

  def stop(self, force: bool = False) -> None:
    """Stops every run (SIGTERM: each saves a checkpoint; `force`: killed at once)."""
    if self._driver is not None and self._driver.poll() is None:
      self._driver.send_signal(signal.SIGUSR1 if force else signal.SIGTERM)

  def run(self) -> int:
    """Launches what is left of the sweep and waits for it; the exit code."""
    previous = {s: signal.signal(s, self._on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
      self.start()
      while not self._done:
        if self._signals and not self._stopping:
          self._stopping = True
          self.view.event(f"signal {self._signals[0]}: stopping the runs (each saves a "
                          "checkpoint); the same command resumes the sweep")
          self.stop()
        self.poll()
        self.view.refresh()
        time.sleep(0.2)
    except (errors.LnjaxError, KeyboardInterrupt):
      self._kill_driver()
      raise
    finally:
      for s, handler in previous.items():
        signal.signal(s, handler)
    self.view.refresh(force_table=True)
    return self._exit_code()

  def _on_signal(self, signum, frame):
    self._signals.append(signum)
    if len(self._signals) > 1:  # A second signal: no more waiting for checkpoints.
      self.stop(force=True)

  # ---- What the driver and the run folders say.

  def _read_events(self) -> None:
    for line in self._driver.stdout:
      try:
        self._events.put(json.loads(line))
      except ValueError:
        pass
    self._events.put(None)

  def _on_event(self, event: dict) -> None:
    kind = event.get("event")
    if kind == "connected":
      self._connected_by = 0
      self.manifest["ray"] = {"address": self.address, "nodes": event["nodes"],
                              "per_process": event["per_process"]}
      nodes = ", ".join(f"{n['ip']} ({i[:8]})" for i, n in event["nodes"].items())
      self.view.event(f"ray: {len(event['nodes'])} nodes ({nodes}); each run "
                      f"{self.nodes_per_run} × {event['per_process']}")
    elif kind == "refused":
      self._kill_driver()
      raise errors.ConfigError(event["message"])
    elif kind == "restarted":
      run = self._run(event["run"])
      entry = self.manifest["runs"][run.name]
      self._record(run, QUEUED, restarts=entry.get("restarts", 0) + 1)
      self.view.event(f"{'restarted':<9} {run.name}: {event['why']}; every process starts "
                      "again from the run's last checkpoint")
    elif kind == "ended":
      self._check_tasks()
      self._finish_task(self._run(event["run"]), event.get("code"), event.get("error"))

  def _run(self, name: str) -> Run:
    return next(r for r in self.runs if r.name == name)

  def _check_tasks(self) -> None:
    """A run's task file changes when its task starts on a node: started or rescheduled."""
    for name in self._submitted:
      if self.states[name] not in (QUEUED, launcher.RUNNING):
        continue
      run = self._run(name)
      task = launcher.read_json(fileio.join(self.workdir(run), TASK_FILE))
      if not task or task == self._tasks.get(name) or task.get("submitted") != self.manifest[
          "runs"][name].get("started"):
        continue
      again = name in self._tasks
      self._tasks[name] = task
      self.where[name] = f"node {task['node_ip']} ({task['node_id'][:8]})"
      entry = self.manifest["runs"][name]
      fields = {"node": task["node_id"], "node_ip": task["node_ip"], "pid": task["pid"]}
      if again:
        fields["reschedules"] = entry.get("reschedules", 0) + 1
      self._record(run, launcher.RUNNING, **fields)
      self.active[name] = launcher._Active(run, launcher.Slot(self.where[name], {}), None, 0)
      log = fileio.join(self.workdir(run), launcher.LOG)
      self.view.event(f"{'resumed' if again else 'start':<9} {name} on {self.where[name]}"
                      + (" after its node was lost" if again else f" (log: {log})"))

  def _finish_task(self, run: Run, code: int | None, error: str | None) -> None:
    workdir = self.workdir(run)
    state, reason = launcher.ended_state(run, workdir, code, error or "stopped before it ended")
    if state == launcher.FAILED:
      reason = error or launcher.last_error_line(fileio.join(workdir, launcher.LOG))
    error = reason
    self._record(run, state, exit_code=code, error=error,
                 ended=time.strftime("%Y-%m-%d %H:%M:%S"))
    self.where.pop(run.name, None)
    self.active.pop(run.name, None)
    detail = f": {error}" if error else ""
    self.view.event(f"{state:<9} {run.name} (exit {code}){detail}")

  def _lost(self) -> None:
    """The driver ended before its runs: the cluster went away (or the address was none)."""
    code = self._driver.returncode
    if self._connected_by:
      raise errors.ConfigError(f"could not connect to a Ray cluster at {self.address} "
                               f"(driver exit {code}: {launcher.last_error_line(self.driver_log)})")
    stopped = [n for n in self._submitted if self.states[n] in (QUEUED, launcher.RUNNING)]
    for name in stopped:
      self._finish_task(self._run(name), None, "its Ray cluster went away")
    self.view.refresh(force_table=True)
    raise ClusterLost(
        f"the Ray cluster at {self.address} went away during the sweep ({len(stopped)} "
        f"run(s) stopped: {', '.join(stopped)}; each saved a checkpoint on SIGTERM or "
        "resumes from its last one); the same command resumes the sweep on a running "
        "cluster")

  def _kill_driver(self) -> None:
    if self._driver is not None and self._driver.poll() is None:
      self._driver.kill()
      self._driver.wait()


def _wait_for_address(address: str, seconds: float) -> None:
  """Until HOST:PORT accepts a connection; one line naming it after `seconds`."""
  if address in ("auto", "local"):
    return
  host, _, port = address.split("://")[-1].rpartition(":")
  try:
    port = int(port)
  except ValueError:
    raise errors.ConfigError(f"--ray_address={address} is not HOST:PORT") from None
  deadline = time.monotonic() + seconds
  while True:
    try:
      socket.create_connection((host.strip("[]"), port), timeout=2).close()
      return
    except OSError as e:
      if time.monotonic() > deadline:
        raise errors.ConfigError(
            f"no Ray cluster answers at {address} ({e.strerror or e} for {seconds:.0f} s): "
            "start one (ray start --head) or fix --ray_address / RAY_ADDRESS") from None
      time.sleep(0.5)


def launch(config_arg: str, runs: list[Run], root: str, fixed: dict | None = None,
           **options) -> RayLauncher:
  """Starts `runs` on the Ray cluster (RayLauncher's options) and returns its launcher:
  `poll()` / `wait()` give every run's state, `stop()` stops them with a checkpoint."""
  ray_launcher = RayLauncher(config_arg, None, runs, root, fixed, **options)
  ray_launcher.start()
  return ray_launcher


def run_to_the_end(config: str, sweep_arg: str | None, runs: list[Run], root: str,
                   fixed: dict | None = None, **options) -> int:
  """As launcher.run_to_the_end, on a Ray cluster (RayLauncher's options)."""
  code = RayLauncher(config, sweep_arg, runs, root, fixed, **options).run()
  if code >= 128:
    sys.exit(code)
  return code


# ---------------------------------------------------------------------------------------
# The task: one process of one run, on a node of the cluster.
