"""The launcher: each run of a sweep as its own `python -m lnjax.main` process, on its own
devices, as many at once as there are device slots.

The state of a sweep is the state of its run folders, so the same command finishes it:
  - a run whose summary.json says `completed` (at the asked num_steps) or `diverged` is
    skipped; any other run is started, and lnjax.main resumes it from its checkpoints;
  - a failed run (non-zero exit other than divergence) is recorded in ROOT/sweep.json
    with its exit code and error line, and the others go on; a later launch retries it;
  - SIGINT/SIGTERM to the launcher sends SIGTERM to every run (each saves a checkpoint
    and exits 143), waits for them, and exits 128 + the signal; a second signal kills;
  - each run holds a lock on ROOT/<name>/.lock (inherited by its process), so a run still
    going from an earlier, killed launcher is waited for, never started twice.

The launcher never imports JAX: on a TPU host that would take the chips from the runs.
Its reads and writes go through lnjax.core.fileio: the Ray back end's root may be gs://.
"""

import dataclasses
import fcntl
import glob
import json
import os
import shutil
import signal
import subprocess
import sys
import time

from lnjax.core import errors, fileio, lock
from lnjax.sweep import Run, flag_value, priority

# Run states, in the manifest and the progress view.
PENDING, RUNNING, COMPLETED, DIVERGED, FAILED, INTERRUPTED, ELSEWHERE = (
    "pending", "running", "completed", "diverged", "failed", "interrupted", "elsewhere")
FINISHED = (COMPLETED, DIVERGED)
EXIT_DIVERGED, EXIT_PREEMPTED = 3, 143  # lnjax.main's exit codes.
MANIFEST, LOG = "sweep.json", "log.txt"


# ---------------------------------------------------------------------------------------
# Devices: disjoint slots, one run at a time in each.


@dataclasses.dataclass(frozen=True)
class Slot:
  label: str  # "cpu 0-3", "gpu 2,3", "tpu 0"
  env: dict  # Variables confining a process to the slot's accelerators.
  cpus: tuple[int, ...] = ()  # CPU platform: the cores the process is pinned to.


# TPU_CHIPS_PER_PROCESS_BOUNDS for a process on n chips of one host (x,y,z chip grid).
TPU_BOUNDS = {1: "1,1,1", 2: "1,2,1", 4: "2,2,1", 8: "2,4,1"}
TPU_PORT = 8476


def detect_platform() -> str:
  """gpu, tpu or cpu, from the machine (not from JAX, which the launcher must not start)."""
  forced = os.environ.get("JAX_PLATFORMS", "").split(",")[0].strip().lower()
  if forced in ("cpu", "gpu", "cuda", "tpu"):
    return "gpu" if forced == "cuda" else forced
  if _tpu_chips():
    return "tpu"
  if _gpu_ids():
    return "gpu"
  return "cpu"


def _tpu_chips() -> list[str]:
  """TPU chips of this host: /dev/accel* (v2-v4, v5p) or /dev/vfio/<n> (v5e, v6e)."""
  accel = sorted(glob.glob("/dev/accel[0-9]*"))
  vfio = sorted(p for p in glob.glob("/dev/vfio/[0-9]*"))
  return [str(i) for i in range(len(accel or vfio))]


def _gpu_ids() -> list[str]:
  visible = os.environ.get("CUDA_VISIBLE_DEVICES")
  if visible is not None:
    return [d for d in visible.split(",") if d.strip() and d.strip() != "-1"]
  if not shutil.which("nvidia-smi"):
    return []
  try:
    out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30)
  except (OSError, subprocess.TimeoutExpired):
    return []
  return [str(i) for i, line in enumerate(out.stdout.splitlines()) if line.startswith("GPU ")]


def make_slots(platform: str, parallel: int, devices_per_run: int | None) -> list[Slot]:
  """`parallel` disjoint slots of `devices_per_run` devices each (default: all / parallel).

  cpu: cores (each run pinned to its own with sched_setaffinity); gpu: CUDA_VISIBLE_DEVICES;
  tpu: the chip-subset variables of libtpu (one process per chip group, its own port).
  """
  if platform == "auto":
    platform = detect_platform()
  devices = {"cpu": lambda: [str(c) for c in sorted(os.sched_getaffinity(0))],
             "gpu": _gpu_ids, "tpu": _tpu_chips}[platform]()
  if parallel < 1:
    raise errors.ConfigError(f"--parallel={parallel} must be >= 1")
  per_run = devices_per_run or len(devices) // parallel
  if per_run < 1 or per_run * parallel > len(devices):
    raise errors.ConfigError(
        f"{parallel} runs × {devices_per_run or 'at least 1'} {platform} devices each do not fit "
        f"the {len(devices)} {platform} devices here ({','.join(devices) or 'none'})")
  if platform == "tpu" and per_run not in TPU_BOUNDS:
    raise errors.ConfigError(f"--devices_per_run={per_run} on TPU must be one of "
                             f"{', '.join(map(str, TPU_BOUNDS))}")
  slots = []
  for i in range(parallel):
    ids = devices[i * per_run:(i + 1) * per_run]
    joined = ",".join(ids)
    if platform == "cpu":
      label = f"cpu {ids[0]}" + (f"-{ids[-1]}" if len(ids) > 1 else "")
      slots.append(Slot(label, {}, tuple(int(c) for c in ids)))
    elif platform == "gpu":
      slots.append(Slot(f"gpu {joined}", {"CUDA_VISIBLE_DEVICES": joined}))
    else:
      port = str(TPU_PORT + i)
      slots.append(Slot(f"tpu {joined}", {
          "TPU_CHIPS_PER_PROCESS_BOUNDS": TPU_BOUNDS[per_run], "TPU_PROCESS_BOUNDS": "1,1,1",
          "TPU_VISIBLE_CHIPS": joined, "TPU_VISIBLE_DEVICES": joined,
          "TPU_MESH_CONTROLLER_ADDRESS": f"localhost:{port}", "TPU_MESH_CONTROLLER_PORT": port}))
  return slots


# ---------------------------------------------------------------------------------------
# What a run folder says.


def run_to_the_end(config: str, sweep_arg: str, runs: list[Run], root: str, fixed: dict, *,
                   parallel: int, devices_per_run: int | None, platform: str = "auto",
                   on_finished=None) -> int:
  """Launches `runs` (skipping finished ones) on this machine's device slots and waits for
  them; the experiments' entry to the launcher. Exits with the launcher's code when a signal
  stopped it (the runs saved; the same command resumes), else returns it."""
  slots = make_slots(platform, parallel, devices_per_run)
  code = Launcher(config, sweep_arg, runs, root, slots, fixed, on_finished=on_finished).run()
  if code >= 128:
    sys.exit(code)
  return code


def read_json(path: str) -> dict | None:
  try:
    return json.loads(fileio.read_text(path) or "null")
  except (OSError, ValueError):
    return None


def read_metrics(workdir: str) -> list[dict]:
  """metrics.jsonl's records (lnjax.core.metrics.read_metrics without JAX); a line being written
  is skipped."""
  records = []
  try:
    text = fileio.read_text(fileio.join(workdir, "metrics.jsonl")) or ""
  except OSError:
    return records
  for line in text.splitlines():
    try:
      records.append(json.loads(line))
    except ValueError:
      pass
  return records


def finished_state(run: Run, workdir: str) -> str | None:
  """completed / diverged if the run needs no more training, else None."""
  summary = read_json(os.path.join(workdir, "summary.json")) or {}
  if summary.get("status") == DIVERGED:
    return DIVERGED
  if (summary.get("status") == COMPLETED
      and summary.get("num_steps") == run.setting("train.num_steps")):
    return COMPLETED
  return None


def ended_state(run: Run, workdir: str, code: int | None,
                stopped: str) -> tuple[str, str | None]:
  """The state a run is left in once its process ended with `code` (None: no exit code
  recorded) and why: completed or diverged (from its summary), interrupted (preempted,
  or `stopped`), else failed with a None reason (its log's error line, read by the back
  end, which knows where its log starts)."""
  summary = read_json(os.path.join(workdir, "summary.json")) or {}
  done = finished_state(run, workdir)
  if done:
    return done, None if done == COMPLETED else f"non-finite loss at step {summary.get('step')}"
  if code in (EXIT_PREEMPTED, None) and summary.get("status") == "preempted":
    return INTERRUPTED, f"stopped at step {summary.get('step', '?')}"
  if code is None:
    return INTERRUPTED, stopped
  return FAILED, None


def last_error_line(log_path: str, since: int = 0) -> str:
  """The run's own error line ('lnjax: error: ...'), else the last line it printed."""
  try:
    data = fileio.read_bytes(log_path) or b""
  except OSError:
    return ""
  lines = [l.strip() for l in data[since:].decode(errors="replace").splitlines() if l.strip()]
  for line in reversed(lines):
    if line.startswith("lnjax: error: "):
      return line[len("lnjax: error: "):]
  return lines[-1] if lines else ""


def _try_lock(workdir: str) -> int | None:
  """An fd holding the run's lock, or None if another process holds it."""
  fd = lock.open_lock_file(os.path.join(workdir, ".lock"))  # (A link there is refused.)
  try:
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
  except BlockingIOError:
    os.close(fd)
    return None
  return fd


# ---------------------------------------------------------------------------------------
# The launcher.


@dataclasses.dataclass
class _Active:
  run: Run
  slot: Slot
  proc: subprocess.Popen
  log_offset: int  # Where this attempt's output starts in the log.


class Launcher:
  """Runs `runs` of `config_arg` under `root`, `len(slots)` at a time.

  `fixed` overrides go to every run but not into names (--config.train.num_steps=300);
  `on_finished(run)` is called as each run finishes (completed or diverged).
  """

  def __init__(self, config_arg: str, sweep_arg: str | None, runs: list[Run], root: str,
               slots: list[Slot], fixed: dict | None = None, *, out=None,
               refresh_seconds: float = 2.0, table_every_seconds: float = 60.0,
               grace_seconds: float = 600.0, on_finished=None):
    self.config_arg, self.sweep_arg, self.runs, self.root = config_arg, sweep_arg, runs, root
    self.slots, self.fixed = slots, dict(fixed or {})
    self.out = out or sys.stdout
    self.refresh_seconds, self.table_every_seconds = refresh_seconds, table_every_seconds
    self.grace_seconds, self.on_finished = grace_seconds, on_finished
    self.states = {r.name: PENDING for r in runs}
    self.active: dict[str, _Active] = {}
    self.view = ProgressView(self, self.out)
    self._signals: list[int] = []
    self.manifest = self._load_manifest()

  def workdir(self, run: Run) -> str:
    return os.path.join(self.root, run.name)

  def command(self, run: Run) -> list[str]:
    """`python -m lnjax.main --config=... --workdir=... --config.k=v ...` of one run."""
    return [sys.executable, "-m", "lnjax.main", f"--config={self.config_arg}",
            f"--workdir={fileio.abspath(self.workdir(run))}",
            *[f"--config.{k}={flag_value(v)}"
              for k, v in {**self.fixed, **run.overrides}.items()]]

  # ---- The manifest: ROOT/sweep.json, the launcher's record of every run it handled.

  def _load_manifest(self) -> dict:
    path = os.path.join(self.root, MANIFEST)
    manifest = read_json(path) or {"config": self.config_arg, "runs": {}}
    if manifest.get("config") != self.config_arg:
      raise errors.WorkdirError(f"{self.root} holds a sweep of --config={manifest.get('config')}; "
                                "use another --workdir")
    manifest.update(sweep=self.sweep_arg, fixed={k: _jsonable(v) for k, v in self.fixed.items()})
    for run in self.runs:
      manifest["runs"].setdefault(run.name, {"state": PENDING, "attempts": 0})
      manifest["runs"][run.name]["overrides"] = {k: _jsonable(v) for k, v in run.overrides.items()}
    return manifest

  def _record(self, run: Run, state: str, **fields) -> None:
    self.states[run.name] = state
    entry = self.manifest["runs"][run.name]
    entry.update(state=state, **fields)
    fileio.write_text(fileio.join(self.root, MANIFEST), json.dumps(self.manifest, indent=2) + "\n")
    if state in FINISHED and self.on_finished:
      self.on_finished(run)

  # ---- The loop.

  def run(self) -> int:
    """Launches what is left of the sweep; returns the exit code (0: every run finished)."""
    if fileio.is_remote(self.root):
      raise errors.ConfigError(f"--workdir={self.root}: the local back end locks its runs on a "
                               "local file system; use a local --workdir, or --backend=ray")
    os.makedirs(self.root, exist_ok=True)
    todo, elsewhere = [], []
    for run in self.runs:
      os.makedirs(self.workdir(run), exist_ok=True)
      done = finished_state(run, self.workdir(run))
      if done:
        self._record(run, done)
      else:
        todo.append(run)
    self.view.event(f"sweep {self.config_arg} --sweep={self.sweep_arg}: {len(self.runs)} runs, "
                    f"{len(self.runs) - len(todo)} already finished, {len(todo)} to run, "
                    f"{len(self.slots)} at a time on {', '.join(s.label for s in self.slots)}; "
                    f"results in {self.root}")
    previous = {s: signal.signal(s, self._on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
      free = list(self.slots)
      while (todo or elsewhere or self.active) and not self._signals:
        # A run still held by a process of an earlier launcher waits for it.
        for run in list(elsewhere):
          fd = _try_lock(self.workdir(run))
          if fd is not None:
            os.close(fd)
            elsewhere.remove(run)
            done = finished_state(run, self.workdir(run))
            if done:
              self._record(run, done)
            else:
              todo.append(run)
        while todo and free:
          run = todo.pop(0)
          if not self._start(run, free[0]):
            elsewhere.append(run)
            self._record(run, ELSEWHERE)
            self.view.event(f"{ELSEWHERE:<9} {run.name}: a process of an earlier launch still "
                            "trains it (it holds the run's .lock); waiting for it")
            continue
          free.pop(0)
        for name, active in list(self.active.items()):
          if active.proc.poll() is not None:
            self._finish(active)
            free.append(active.slot)
            del self.active[name]
        self.view.refresh()
        time.sleep(0.2)
      if self._signals:
        self._stop_all()
    finally:
      for s, handler in previous.items():
        signal.signal(s, handler)
    self.view.refresh(force_table=True)
    return self._exit_code()

  def _start(self, run: Run, slot: Slot) -> bool:
    workdir = self.workdir(run)
    fd = _try_lock(workdir)
    if fd is None:
      return False
    log_path = os.path.join(workdir, LOG)
    cmd = self.command(run)
    with open(log_path, "a") as log:
      log.write(f"\n=== {time.strftime('%Y-%m-%d %H:%M:%S')} sweep launch on {slot.label}: "
                f"{' '.join(cmd)}\n")
      log.flush()
      offset = log.tell()
      env = {**os.environ, **slot.env, "PYTHONUNBUFFERED": "1"}
      # Its own session: a terminal's Ctrl-C reaches the launcher only, which then sends
      # SIGTERM (checkpoint and exit) rather than SIGINT (a traceback, nothing saved). The
      # session gets the launcher's niceness (lnjax/sweep/priority.py).
      proc = subprocess.Popen(
          cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
          start_new_session=True, pass_fds=(fd,), preexec_fn=lambda: priority.enter_slot(slot.cpus))
    os.close(fd)  # The process holds the lock until it exits.
    self.active[run.name] = _Active(run, slot, proc, offset)
    attempts = self.manifest["runs"][run.name].get("attempts", 0) + 1
    self._record(run, RUNNING, attempts=attempts, devices=slot.label, exit_code=None,
                 error=None, started=time.strftime("%Y-%m-%d %H:%M:%S"))
    self.view.event(f"start     {run.name} on {slot.label} (log: {log_path})")
    return True

  def _finish(self, active: _Active) -> None:
    run, code = active.run, active.proc.returncode
    workdir = self.workdir(run)
    summary = read_json(os.path.join(workdir, "summary.json")) or {}
    # The summary first: a run stopped after writing its final summary has finished.
    finished = finished_state(run, workdir)
    if finished == COMPLETED:
      state, error = COMPLETED, None
    elif finished == DIVERGED:
      state, error = DIVERGED, f"non-finite loss at step {summary.get('step')}"
    elif code in (EXIT_PREEMPTED, -signal.SIGTERM, -signal.SIGKILL):
      state, error = INTERRUPTED, f"stopped at step {summary.get('step', '?')} (exit {code})"
    else:
      state, error = FAILED, last_error_line(os.path.join(workdir, LOG), active.log_offset)
    self._record(run, state, exit_code=code, error=error,
                 ended=time.strftime("%Y-%m-%d %H:%M:%S"))
    detail = f": {error}" if error and state != COMPLETED else ""
    self.view.event(f"{state:<9} {run.name} (exit {code}){detail}")

  def _on_signal(self, signum, frame):
    self._signals.append(signum)
    if len(self._signals) > 1:  # A second signal: no more waiting for checkpoints.
      for active in self.active.values():
        _kill_group(active.proc, signal.SIGKILL)

  def _stop_all(self) -> None:
    """SIGTERM to every run (each saves a checkpoint and exits), then wait for them."""
    self.view.event(f"signal {self._signals[0]}: stopping {len(self.active)} runs "
                    "(each saves a checkpoint); the same command resumes the sweep")
    for active in self.active.values():
      if active.proc.poll() is None:
        active.proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + self.grace_seconds
    while self.active:
      for name, active in list(self.active.items()):
        if active.proc.poll() is not None:
          self._finish(active)
          del self.active[name]
        elif time.monotonic() > deadline:
          _kill_group(active.proc, signal.SIGKILL)
      time.sleep(0.2)

  def _exit_code(self) -> int:
    if self._signals:
      return 128 + self._signals[0]
    return 0 if all(s in FINISHED for s in self.states.values()) else 1


def _kill_group(proc: subprocess.Popen, sig: int) -> None:
  try:
    os.killpg(proc.pid, sig)  # The run's session: lnjax.main and any data workers.
  except ProcessLookupError:
    pass


def _jsonable(v):
  return list(v) if isinstance(v, tuple) else v


# ---------------------------------------------------------------------------------------
# The progress view.


class ProgressView:
  """One line per run: state, step/total, last train loss, last held-out loss, where.

  On a terminal the table is redrawn in place every `refresh_seconds`; in a log (no
  terminal) each start and end is a line, and the whole table comes every
  `table_every_seconds` and at the end.
  """

  def __init__(self, launcher: Launcher, out):
    self.launcher, self.out = launcher, out
    self.tty = hasattr(out, "isatty") and out.isatty()
    self._drawn_lines = 0
    self._last_draw = self._last_table = time.monotonic()
    self._t0 = time.monotonic()

  def event(self, line: str) -> None:
    self._erase()
    print(line, file=self.out, flush=True)

  def refresh(self, force_table: bool = False) -> None:
    now = time.monotonic()
    if self.tty and (force_table or now - self._last_draw >= self.launcher.refresh_seconds):
      self._erase()
      lines = self.lines()
      print("\n".join(lines), file=self.out, flush=True)
      self._drawn_lines, self._last_draw = len(lines), now
      if force_table:
        self._drawn_lines = 0  # The final table stays.
    elif not self.tty and (
        force_table or now - self._last_table >= self.launcher.table_every_seconds):
      print("\n".join(self.lines()), file=self.out, flush=True)
      self._last_table = now

  def _erase(self) -> None:
    if self.tty and self._drawn_lines:
      self.out.write(f"\x1b[{self._drawn_lines}F\x1b[J")  # Up n lines, clear below.
      self._drawn_lines = 0

  def lines(self) -> list[str]:
    launcher = self.launcher
    counts = {}
    for state in launcher.states.values():
      counts[state] = counts.get(state, 0) + 1
    elapsed = int(time.monotonic() - self._t0)
    header = (f"-- {len(launcher.runs)} runs: " + ", ".join(f"{n} {s}" for s, n in counts.items())
              + f"  ({elapsed // 60}:{elapsed % 60:02d} elapsed)")
    width = max(len(r.name) for r in launcher.runs)
    lines = [header]
    for run in launcher.runs:
      state = launcher.states[run.name]
      workdir = launcher.workdir(run)
      records = read_metrics(workdir)
      train = [r for r in records if r.get("train_loss") is not None]
      evals = [r for r in records if r.get("eval_loss") is not None]
      step = train[-1]["step"] if train else 0
      loss = f"loss {train[-1]['train_loss']:7.4f}" if train else " " * 12
      held = f"eval {evals[-1]['eval_loss']:7.4f}" if evals else " " * 12
      entry = launcher.manifest["runs"].get(run.name, {})
      if run.name in launcher.active:
        where = launcher.active[run.name].slot.label
      elif state in (FAILED, INTERRUPTED):
        where = entry.get("error") or ""
      else:
        where = ""
      total = run.setting("train.num_steps")
      lines.append(f"  {run.name:<{width}}  {state:<11} {step:>7}/{total:<7}"
                   f" {loss}  {held}  {where}".rstrip())
    return lines
