"""The Ray side of the sweep's Ray back end (lnjax/sweep/ray_backend.py): the driver, the
only process that imports Ray (`python -m lnjax.sweep.ray_driver`, started by the
launcher with a pickled spec on stdin; one JSON event per line on stdout), and the task
each run's processes are.
"""

import ctypes
import json
import os
import pickle
import signal
import socket
import subprocess
import sys
import tempfile
import time

from lnjax.core import fileio, lock as lock_lib
from lnjax.sweep import Run, launcher, priority
from lnjax.sweep.ray_backend import LOG_UPLOAD_SECONDS, TASK_FILE

PR_SET_PDEATHSIG = 1  # prctl(2): the signal a child gets when its parent dies.


def train_process(run: Run, cmd: list[str], workdir: str, cwd: str, submitted: str,
                  process_id: int = 0, num_processes: int = 1,
                  coordinator: str | None = None, grace_seconds: float = 600.0,
                  niceness: int = 0) -> dict:
  """Runs lnjax.main for `run` on this node, at the launcher's `niceness` or above, and
  returns {"code": its exit code}; process 0 holds the run's lock (on a bucket: waits for
  lnjax.main's own) and writes TASK_FILE for the launcher."""
  import ray
  node_id, node_ip = ray.get_runtime_context().get_node_id(), ray.util.get_node_ip_address()
  remote = fileio.is_remote(workdir)
  if not remote and not os.path.isdir(workdir):
    return {"code": None, "error": f"{workdir} does not exist on node {node_ip}: the sweep's "
            "--workdir must be on storage every node sees"}
  if ray.get_runtime_context().runtime_env.get("working_dir"):
    cwd = os.getcwd()  # `ray job submit --working-dir`: the job's copy of the checkout.
  lock = None
  if process_id == 0:
    if launcher.finished_state(run, workdir):  # A retry after the run ended.
      return {"code": 0}
    # An earlier attempt's lnjax.main may still be saving its checkpoint.
    if remote:
      _wait_for_bucket_lock(workdir)
    else:
      while (lock := launcher._try_lock(workdir)) is None:
        time.sleep(1.0)
    if launcher.finished_state(run, workdir):
      if lock is not None:
        os.close(lock)
      return {"code": 0}
  cmd = [sys.executable, *cmd[1:]]
  log_name = launcher.LOG
  if num_processes > 1:
    cmd += ["--distributed", f"--coordinator_address={coordinator}",
            f"--num_processes={num_processes}", f"--process_id={process_id}"]
    log_name = launcher.LOG if process_id == 0 else f"log.process_{process_id}.txt"
  # One process of several: killed with its task (its peers cannot save without it).
  death_signal = signal.SIGTERM if num_processes == 1 else signal.SIGKILL
  parent = os.getpid()
  log = _Log(fileio.join(workdir, log_name))
  with open(log.local, "a") as out:
    out.write(f"\n=== {time.strftime('%Y-%m-%d %H:%M:%S')} ray task on node {node_ip} "
              f"({node_id[:8]}), process {process_id}/{num_processes}: {' '.join(cmd)}\n")
    out.flush()
    proc = subprocess.Popen(
        cmd, cwd=cwd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
        env={**os.environ, "PYTHONUNBUFFERED": "1"}, pass_fds=(lock,) if lock else (),
        preexec_fn=lambda: (_die_with(parent, death_signal), priority.at_least(niceness)))
  if lock is not None:
    os.close(lock)  # lnjax.main holds it until it exits.
  if process_id == 0:
    fileio.write_text(fileio.join(workdir, TASK_FILE), json.dumps({
        "node_id": node_id, "node_ip": node_ip, "host": socket.gethostname(),
        "pid": proc.pid, "submitted": submitted, "time": time.time()}))
  try:
    while True:
      try:
        return {"code": proc.wait(LOG_UPLOAD_SECONDS if remote else None)}
      except subprocess.TimeoutExpired:
        log.upload()
  except KeyboardInterrupt:  # ray.cancel: the run saves a checkpoint and stops.
    proc.send_signal(signal.SIGTERM)
    try:
      proc.wait(grace_seconds)
    except subprocess.TimeoutExpired:
      proc.kill()
    raise
  finally:
    log.close()


class _Log:
  """Where a process of a run writes its output: the run's log itself on a file system;
  on a bucket (no append there), a file on this node's disk that `upload()` copies over
  the bucket's log, after the lines earlier attempts left there."""

  def __init__(self, path: str):
    self.path, self.local, self.earlier = path, path, b""
    if fileio.is_remote(path):
      self.earlier = fileio.read_bytes(path) or b""
      fd, self.local = tempfile.mkstemp(prefix="lnjax_run_log_", suffix=".txt")
      os.close(fd)

  def upload(self) -> None:
    if self.local != self.path:
      with open(self.local, "rb") as f:
        fileio.write_bytes(self.path, self.earlier + f.read())

  def close(self) -> None:
    if self.local != self.path:
      self.upload()
      os.remove(self.local)


def _wait_for_bucket_lock(workdir: str) -> None:
  """Until lnjax.main's lock on `workdir` (a bucket) has no live holder: its holder ended,
  or stopped refreshing it (lnjax/core/lock.py's rules)."""
  path = fileio.join(workdir, lock_lib.LOCK_FILE)
  while True:
    try:
      holder = json.loads(fileio.read_text(path) or "null")
    except ValueError:
      holder = None
    if not isinstance(holder, dict) or not lock_lib.holder_alive(holder):
      return
    time.sleep(5.0)


def _die_with(parent: int, sig: int) -> None:
  """In the child, before exec: `sig` when the task's worker process dies (a lost node,
  a stopped cluster, a cancelled task)."""
  ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, int(sig))
  if os.getppid() != parent:  # It died before the line above.
    os.kill(os.getpid(), sig)


def free_port() -> str:
  """HOST:PORT free on this node: a multi-process run's coordinator address."""
  import ray
  ip = ray.util.get_node_ip_address()
  with socket.socket() as s:
    s.bind((ip, 0))
    port = s.getsockname()[1]
  return f"{ip}:{port}"


# ---------------------------------------------------------------------------------------
# The driver: the only process that talks to Ray (`python -m lnjax.sweep.ray_driver`, a
# pickled spec on stdin, one JSON event per line on stdout).


def per_process_resources(platform: str, devices: int | None, cluster: dict) -> dict:
  """Ray's resource request of one process of a run."""
  if platform == "auto":
    platform = "tpu" if cluster.get("TPU") else "gpu" if cluster.get("GPU") else "cpu"
  if platform == "cpu":
    return {"CPU": devices or 1}
  return {"CPU": 1, {"gpu": "GPU", "tpu": "TPU"}[platform]: devices or 1}


def _ray_options(resources: dict) -> dict:
  custom = {k: v for k, v in resources.items() if k not in ("CPU", "GPU")}
  return {"num_cpus": resources.get("CPU", 0), "num_gpus": resources.get("GPU", 0),
          **({"resources": custom} if custom else {})}


class _Driver:
  """Submits each run as Ray tasks and reports how each ended."""

  def __init__(self, spec: dict):
    self.spec = spec
    self.stop_signals = []
    self.waiting = list(spec["runs"])  # Not yet submitted: (run, cmd, workdir).
    self.active = {}  # Run name -> {"refs": [...], "pg": ..., "stage": ..., "restarts": n}

  def emit(self, **event) -> None:
    print(json.dumps(event), flush=True)

  def main(self) -> None:
    import ray
    signal.signal(signal.SIGTERM, lambda *_: self.stop_signals.append("term"))
    signal.signal(signal.SIGUSR1, lambda *_: self.stop_signals.append("kill"))
    ray.init(address=self.spec["address"], log_to_driver=False, logging_level="ERROR")
    nodes = {n["NodeID"]: {"ip": n["NodeManagerAddress"], "resources": n["Resources"]}
             for n in ray.nodes() if n["Alive"]}
    cluster = ray.cluster_resources()
    self.resources = per_process_resources(self.spec["platform"], self.spec["devices_per_run"],
                                           cluster)
    self.emit(event="connected", nodes=nodes, per_process=self.resources)
    fit = [n for n in nodes.values()
           if all(n["resources"].get(k, 0) >= v for k, v in self.resources.items())]
    if len(fit) < self.spec["nodes_per_run"]:
      shapes = "; ".join(f"{n['ip']}: " + ", ".join(
          f"{k} {v:g}" for k, v in sorted(n["resources"].items())
          if not k.startswith(("node:", "memory", "object_store"))) for n in nodes.values())
      self.emit(event="refused", message=(
          f"no run fits the Ray cluster at {self.spec['address']}: a run asks for "
          f"{self.spec['nodes_per_run']} node(s) with {_shape(self.resources)}, "
          f"{len(fit)} node(s) have it (nodes: {shapes})"))
      return
    self.remote = ray.remote(train_process)
    self.port = ray.remote(free_port)
    stopping = 0
    while self.waiting or self.active:
      if len(self.stop_signals) > stopping:
        stopping = len(self.stop_signals)
        self.waiting.clear()
        for entry in self.active.values():
          for ref in entry["refs"]:
            ray.cancel(ref, force=self.stop_signals[-1] == "kill")
      parallel = self.spec["parallel"] or len(self.waiting) + len(self.active)
      while self.waiting and len(self.active) < parallel:
        self.submit(*self.waiting.pop(0))
      refs = [ref for entry in self.active.values() for ref in entry["refs"]]
      ready, _ = ray.wait(refs, num_returns=1, timeout=0.5) if refs else ([], [])
      if ready:
        self.advance(ready[0])

  def submit(self, run, cmd, workdir, restarts: int = 0) -> None:
    from ray.util import placement_group
    n = self.spec["nodes_per_run"]
    entry = {"run": run, "cmd": cmd, "workdir": workdir, "restarts": restarts,
             "submitted": time.strftime("%Y-%m-%d %H:%M:%S")}
    if n == 1:
      ref = self.remote.options(**_ray_options(self.resources),
                                max_retries=self.spec["reschedules"]).remote(
          run, cmd, workdir, self.spec["cwd"], self.spec["submitted"],
          grace_seconds=self.spec["grace_seconds"], niceness=self.spec["niceness"])
      entry.update(stage="train", refs=[ref])
    else:
      pg = placement_group([dict(self.resources)] * n, strategy="STRICT_SPREAD")
      entry.update(stage="placement", refs=[pg.ready()], pg=pg)
    self.active[run.name] = entry

  def advance(self, ref) -> None:
    import ray
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy
    name, entry = next((k, e) for k, e in self.active.items() if ref in e["refs"])
    run = entry["run"]
    on = lambda i: PlacementGroupSchedulingStrategy(entry["pg"], placement_group_bundle_index=i)
    if entry["stage"] == "placement":
      entry.update(stage="coordinator", refs=[self.port.options(
          num_cpus=0, scheduling_strategy=on(0)).remote()])
      return
    if entry["stage"] == "coordinator":
      coordinator = ray.get(ref)
      n = self.spec["nodes_per_run"]
      entry.update(stage="train", results={}, refs=[self.remote.options(
          **_ray_options(self.resources), max_retries=0, scheduling_strategy=on(i)).remote(
              run, entry["cmd"], entry["workdir"], self.spec["cwd"],
              self.spec["submitted"], i, n, coordinator,
              self.spec["grace_seconds"], self.spec["niceness"]) for i in range(n)])
      return
    try:
      result = ray.get(ref)
    except ray.exceptions.TaskCancelledError:
      result = {"code": None, "error": "stopped"}
    except ray.exceptions.RayTaskError as e:  # The task's own code raised.
      result = {"code": None, "error": str(e).strip().splitlines()[-1]}
    except ray.exceptions.RayError as e:  # Its node or worker died, retries spent.
      result = {"code": None, "error": f"lost ({type(e).__name__})", "lost": True}
    if "pg" not in entry:
      del self.active[name]
      self.emit(event="ended", run=name, code=result["code"], error=result.get("error"))
      return
    # One process of a run on several nodes ended.
    entry["refs"].remove(ref)
    entry["results"][len(entry["results"])] = result
    lost = result.get("lost")
    if lost and entry["refs"] and not self.stop_signals:
      for other in entry["refs"]:
        ray.cancel(other, force=True)
    if entry["refs"]:
      return
    ray.util.remove_placement_group(entry["pg"])
    del self.active[name]
    results = list(entry["results"].values())
    if (any(r.get("lost") for r in results) and not self.stop_signals
        and entry["restarts"] < self.spec["reschedules"]):
      self.emit(event="restarted", run=name, why="a process of the run lost its node")
      self.submit(run, entry["cmd"], entry["workdir"], entry["restarts"] + 1)
      return
    codes = [r["code"] for r in results]
    errs = [r["error"] for r in results if r.get("error")]
    code = max(codes, key=lambda c: (c is not None, c != 0)) if codes else None
    self.emit(event="ended", run=name, code=code, error=errs[0] if errs else None)


def _shape(resources: dict) -> str:
  return ", ".join(f"{k} {v:g}" for k, v in resources.items())


def _driver_main() -> None:
  spec = pickle.load(sys.stdin.buffer)
  _Driver(spec).main()


if __name__ == "__main__":
  _driver_main()
