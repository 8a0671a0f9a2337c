r"""The SLURM back end of the sweep launcher: a sweep's unfinished runs as one job array,
one run per array task, in the local launcher's run folders, manifest and progress table.

  python -m lnjax.cli.sweep --backend=slurm --config=configs/lm.py:size=course --sweep=course \
      --workdir=/shared/sweeps/course [--nodes_per_run=2] [--parallel=8] \
      [--sbatch_args="--partition=gpu --gpus-per-node=8 --time=04:00:00"] [--nowait]

Each launch writes ROOT/slurm/array_<k>.sbatch, in which array task i trains the i-th
run left to do, and submits it with sbatch. A task takes the run's lock
(ROOT/<name>/.lock, flock: a run is never trained by two jobs at once) and starts
`python -m lnjax.main`; a run on several nodes through srun, one process per node,
joined by `--distributed` (jax.distributed reads the SLURM environment). SIGTERM makes
the run save a checkpoint and exit 143 (SlurmLauncher.script says how it reaches the
processes).

Preemption and time limits requeue a run by SLURM's own means: the tasks are submitted
with `--requeue`, so a preemption (PreemptMode=REQUEUE), a node failure or an
`scontrol requeue` stops the run with SIGTERM and puts the task back in the queue; two
minutes before the time limit SLURM sends the batch script SIGUSR1
(`--signal=B:USR1@120`), and the script stops the run and requeues its own task. The
requeued task starts again from the script's top (after the cluster's cred_expire, 120 s
by default) and resumes from the checkpoint. `scancel` stops a run for good.

The launcher waits for the array (polling squeue; a requeued task is still in it), then
records each run's state. The same command again submits only the runs neither finished
nor still queued or running in SLURM: a cancelled or failed run resumes from its
checkpoint. The run folders and this checkout must be on a file system every node
shares.
"""

import hashlib
import os
import re
import shlex
import shutil
import signal
import subprocess
import time

from lnjax.core import errors
from lnjax.sweep import launcher

QUEUED = "queued"  # Submitted; waiting for an allocation.
EXIT_LOCKED = 75  # An array task whose run another job holds.
SIGNAL_SECONDS = 120  # SIGUSR1 this long before the time limit: the task requeues itself.
_EXIT_LINE = re.compile(r"^=== slurm exit (-?\d+)$", re.M)


class SlurmLauncher(launcher.Launcher):
  """Submits `runs` of `config_arg` under `root` as SLURM job arrays.

  `nodes_per_run` nodes per run (one lnjax.main process on each); `sbatch_args` go to
  sbatch as they are (partition, GPUs, time limit, account); `parallel` caps the array
  tasks running at once (0: as many as the cluster allows).
  """

  def __init__(self, config_arg, sweep_arg, runs, root, fixed=None, *, nodes_per_run=1,
               sbatch_args="", parallel=0, wait=True, poll_seconds=2.0, **view):
    super().__init__(config_arg, sweep_arg, runs, root, [], fixed, **view)
    if nodes_per_run < 1:
      raise errors.ConfigError(f"--nodes_per_run={nodes_per_run} must be >= 1")
    self.nodes_per_run, self.parallel = nodes_per_run, parallel
    self.sbatch_args = shlex.split(sbatch_args)
    self.wait, self.poll_seconds = wait, poll_seconds
    # One job name per sweep folder: squeue --name finds this sweep's tasks.
    self.job_name = "lnjax-" + hashlib.sha1(os.path.abspath(root).encode()).hexdigest()[:10]

  def command(self, run) -> list[str]:
    return super().command(run) + (["--distributed"] if self.nodes_per_run > 1 else [])

  # ---- The job array.

  def script(self, runs: list) -> str:
    """The sbatch script whose array task i trains runs[i].

    One node: the run is the batch script's child, and the script passes SIGTERM on to
    it (scancel and a requeue send it to both). Several: srun starts a process per node
    and SLURM signals them itself; a plain scancel makes srun kill them at once, so
    `scancel --signal=TERM` stops such a run with a checkpoint. SIGUSR1 to the script
    (the time limit's warning) stops the run the same way, then requeues the task.
    """
    slurm_dir = os.path.join(os.path.abspath(self.root), "slurm")
    cases = "\n".join(
        f"  {i}) RUN={shlex.quote(os.path.abspath(self.workdir(run)))}\n"
        f"     CMD=({shlex.join(self.command(run))}) ;;" for i, run in enumerate(runs))
    throttle = f"%{self.parallel}" if self.parallel else ""
    several = self.nodes_per_run > 1
    log = f'"$RUN/{launcher.LOG}"'
    return f"""#!/bin/bash
# lnjax.sweep --config={self.config_arg} --sweep={self.sweep_arg}: one run per array task.
#SBATCH --job-name={self.job_name}
#SBATCH --array=0-{len(runs) - 1}{throttle}
#SBATCH --nodes={self.nodes_per_run}
#SBATCH --ntasks-per-node=1
#SBATCH --chdir={os.getcwd()}
#SBATCH --output={slurm_dir}/%A_%a.out
#SBATCH --open-mode=append
#SBATCH --requeue
#SBATCH --signal=B:USR1@{SIGNAL_SECONDS}
set -u
case "$SLURM_ARRAY_TASK_ID" in
{cases}
esac
# The run's lock, held until the task ends: never two jobs on one run.
exec 9>>"$RUN/.lock"
if ! flock -n 9; then
  echo "$RUN: another job or launcher trains it; skipped"
  exit {EXIT_LOCKED}
fi
echo "=== $(date '+%F %T') slurm job ${{SLURM_ARRAY_JOB_ID}}_${{SLURM_ARRAY_TASK_ID}} \\
(restart ${{SLURM_RESTART_COUNT:-0}}) on ${{SLURM_JOB_NODELIST}}: ${{CMD[*]}}" >> {log}
# The run; exit 143: stopped by SIGTERM after saving a checkpoint.
{"srun --kill-on-bad-exit=1 " if several else ""}"${{CMD[@]}}" >> {log} 2>&1 &
child=$!
stop() {{ {'scancel --signal=TERM "$SLURM_JOB_ID"' if several else 'kill -TERM $child 2>/dev/null'}; }}
trap '{":" if several else "stop"}' TERM
# The time limit is near: the run saves and stops, then the task goes back in the queue.
requeue=0
trap 'requeue=1; stop' USR1
wait $child
code=$?
while kill -0 $child 2>/dev/null; do wait $child; code=$?; done
echo "=== slurm exit $code" >> {log}
if [ $requeue = 1 ] && [ $code = {launcher.EXIT_PREEMPTED} ]; then
  echo "=== time limit near: requeued" >> {log}
  scontrol requeue "$SLURM_JOB_ID"
fi
exit $code
"""

  def _submit(self, runs: list) -> str:
    slurm_dir = os.path.join(self.root, "slurm")
    os.makedirs(slurm_dir, exist_ok=True)
    path = os.path.join(slurm_dir, f"array_{len(os.listdir(slurm_dir))}.sbatch")
    with open(path, "w") as f:
      f.write(self.script(runs))
    out = _slurm(["sbatch", "--parsable", *self.sbatch_args, path])
    job = out.strip().split(";")[0]
    for i, run in enumerate(runs):
      log = os.path.join(self.workdir(run), launcher.LOG)
      attempts = self.manifest["runs"][run.name].get("attempts", 0) + 1
      self._record(run, QUEUED, attempts=attempts, job=f"{job}_{i}", script=path,
                   log_offset=os.path.getsize(log) if os.path.exists(log) else 0,
                   exit_code=None, error=None, started=time.strftime("%Y-%m-%d %H:%M:%S"))
    self.view.event(f"submitted {path}: job array {job}, {len(runs)} runs")
    return job

  def _live(self) -> dict[str, str]:
    """{run name: SLURM state} of this sweep's array tasks still queued or running."""
    jobs = {self.manifest["runs"][r.name].get("job"): r.name for r in self.runs}
    out = _slurm(["squeue", "-h", "-r", f"--name={self.job_name}", "-o", "%i %T"])
    live = {}
    for line in out.splitlines():
      job, _, state = line.strip().partition(" ")
      if job in jobs:
        live[jobs[job]] = state
    return live

  # ---- The loop.

  def run(self) -> int:
    """Submits what is left of the sweep; waits for it unless told not to."""
    os.makedirs(self.root, exist_ok=True)
    live = self._live()
    todo = []
    for run in self.runs:
      os.makedirs(self.workdir(run), exist_ok=True)
      done = launcher.finished_state(run, self.workdir(run))
      if done:
        self._record(run, done)
      elif run.name in live:
        self.states[run.name] = launcher.RUNNING if live[run.name] == "RUNNING" else QUEUED
      else:
        todo.append(run)
    self.view.event(
        f"sweep {self.config_arg} --sweep={self.sweep_arg}: {len(self.runs)} runs, "
        f"{len(self.runs) - len(todo) - len(live)} already finished, {len(live)} still in "
        f"SLURM, {len(todo)} to submit ({self.nodes_per_run} node(s) each); results in "
        f"{self.root}")
    if todo:
      self._submit(todo)
    if not self.wait:
      self.view.event(f"not waiting: squeue --name={self.job_name} shows the tasks; the "
                      "same command with --wait waits for them")
      return 0
    previous = {s: signal.signal(s, self._on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
      waiting = {r.name for r in self.runs if self.states[r.name] in (QUEUED, launcher.RUNNING)}
      while waiting and not self._signals:
        live = self._live()
        for run in self.runs:
          if run.name not in waiting:
            continue
          if run.name in live:
            state = launcher.RUNNING if live[run.name] in ("RUNNING", "COMPLETING") else QUEUED
            if state != self.states[run.name]:
              entry = self.manifest["runs"][run.name]
              if state == QUEUED:  # Back in the queue: requeued by SLURM or by itself.
                self._record(run, state, requeues=entry.get("requeues", 0) + 1)
              else:
                self._record(run, state)
              self.view.event(f"{'requeued' if state == QUEUED else state:<9} {run.name} "
                              f"(job {entry['job']})")
          else:
            waiting.discard(run.name)
            self._finish_task(run)
        self.view.refresh()
        time.sleep(self.poll_seconds)
    finally:
      for s, handler in previous.items():
        signal.signal(s, handler)
    if self._signals:
      self.view.event(f"signal {self._signals[0]}: stopped waiting; the jobs go on in SLURM "
                      f"(scancel --name={self.job_name} stops them), the same command waits")
    self.view.refresh(force_table=True)
    return self._exit_code()

  def _on_signal(self, signum, frame):
    self._signals.append(signum)

  def _finish_task(self, run) -> None:
    """Records how a run's array task ended, from its folder and log."""
    workdir, entry = self.workdir(run), self.manifest["runs"][run.name]
    log_path = os.path.join(workdir, launcher.LOG)
    try:
      with open(log_path, errors="replace") as f:
        f.seek(entry.get("log_offset", 0))
        codes = _EXIT_LINE.findall(f.read())
    except OSError:
      codes = []
    code = int(codes[-1]) if codes else None
    state, error = launcher.ended_state(run, workdir, code,
                                        "cancelled before it ended (no exit recorded)")
    if state == launcher.FAILED:
      error = launcher.last_error_line(log_path, entry.get("log_offset", 0))
    self._record(run, state, exit_code=code, error=error,
                 ended=time.strftime("%Y-%m-%d %H:%M:%S"))
    detail = f": {error}" if error else ""
    self.view.event(f"{state:<9} {run.name} (job {entry.get('job')}, exit {code}){detail}")


def _slurm(cmd: list[str]) -> str:
  """A SLURM command's output; its failure as one line."""
  if shutil.which(cmd[0]) is None:
    raise errors.ConfigError(f"--backend=slurm: {cmd[0]} not found (is SLURM installed "
                             "and on PATH?)")
  r = subprocess.run(cmd, capture_output=True, text=True)
  if r.returncode:
    lines = (r.stderr or r.stdout).strip().splitlines()
    raise errors.ConfigError(f"{cmd[0]} failed (exit {r.returncode}): "
                             f"{lines[-1] if lines else ''}")
  return r.stdout
