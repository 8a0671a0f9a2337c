"""The SLURM back end of lnjax.sweep against a real single-node SLURM (Debian's slurmctld,
slurmd and munge, started here in a temporary folder and stopped at the end): four runs
through one job array; one of them is stopped twice while it trains, first by its time
limit's warning, then by SLURM's requeue (what preemption does), and finishes in the same
launch; a run cancelled with scancel stays stopped until the same command resubmits it."""

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

import pytest

import forkserver
import test_stability
from lnjax.sweep import launcher

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DAEMONS = ("munged", "mungekey", "slurmctld", "slurmd", "sbatch", "squeue", "scancel", "sinfo")


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def _stop(pid_file: str) -> None:
  """SIGTERM to the daemon whose pid the file holds; waits (10 s) for it to go."""
  try:
    pid = int(open(pid_file).read().split()[0])
    os.kill(pid, signal.SIGTERM)
  except (OSError, ValueError, IndexError):
    return
  for _ in range(100):
    if not os.path.exists(f"/proc/{pid}") or " Z " in open(f"/proc/{pid}/stat").read():
      return
    time.sleep(0.1)


@pytest.fixture(scope="module")
def slurm_env():
  """A one-node SLURM cluster of this machine's CPUs; yields the environment (SLURM_CONF)
  its commands need. The steps are a one-node Debian SLURM 22.05.8 (seen working 2026-11-29), in one folder;
  KillWait (SIGTERM to SIGKILL) is long enough for a checkpoint on a busy machine;
  cred_expire (how long a requeued job waits, 120 s by default) and the scheduler's
  intervals are short, so a requeued task starts again within seconds."""
  missing = [d for d in DAEMONS if shutil.which(d) is None]
  if missing:
    pytest.skip(f"SLURM/munge not installed ({', '.join(missing)} missing): apt-get install "
                "slurmctld slurmd slurm-client munge (.ci/run does)")
  if os.geteuid() != 0:
    pytest.skip("starting slurmd and munged needs root")
  # Under /tmp, not pytest's 0700 folders: the munge user must reach its socket.
  root = tempfile.mkdtemp(prefix="lnjax_slurm_")
  os.chmod(root, 0o755)
  munge = os.path.join(root, "munge")
  os.mkdir(munge, 0o755)
  shutil.chown(munge, "munge", "munge")
  as_munge = ["runuser", "-u", "munge", "--"]
  subprocess.run([*as_munge, "mungekey", "--create", f"--keyfile={munge}/munge.key"], check=True)
  socket_path = f"{munge}/munge.socket"
  subprocess.run([*as_munge, "munged", f"--socket={socket_path}", f"--key-file={munge}/munge.key",
                  f"--pid-file={munge}/munged.pid", f"--log-file={munge}/munged.log",
                  f"--seed-file={munge}/munged.seed"], check=True)
  host = socket.gethostname().split(".")[0]
  conf = os.path.join(root, "slurm.conf")
  with open(conf, "w") as f:
    f.write(f"""ClusterName=lnjaxtest
SlurmctldHost={host}(127.0.0.1)
SlurmctldPort={_free_port()}
SlurmdPort={_free_port()}
AuthType=auth/munge
AuthInfo=socket={socket_path},cred_expire=5
CredType=cred/munge
SlurmUser=root
SlurmdUser=root
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool
SlurmctldPidFile={root}/slurmctld.pid
SlurmdPidFile={root}/slurmd.pid
SlurmctldLogFile={root}/slurmctld.log
SlurmdLogFile={root}/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
JobAcctGatherType=jobacct_gather/none
MpiDefault=none
ReturnToService=2
KillWait=120
SchedulerParameters=sched_interval=1,bf_interval=1
NodeName={host} NodeAddr=127.0.0.1 CPUs={os.cpu_count()} RealMemory=1000 State=UNKNOWN
PartitionName=debug Nodes={host} Default=YES MaxTime=INFINITE State=UP
""")
  env = {**os.environ, "SLURM_CONF": conf}
  try:
    subprocess.run(["slurmctld", "-f", conf], env=env, check=True)
    subprocess.run(["slurmd", "-f", conf], env=env, check=True)
    deadline = time.time() + 60
    while "idle" not in subprocess.run(["sinfo", "-h", "-o", "%T"], env=env, text=True,
                                       capture_output=True).stdout:
      assert time.time() < deadline, open(f"{root}/slurmctld.log").read()[-3000:]
      time.sleep(0.5)
    yield env
  finally:
    subprocess.run(["scancel", "--full", "--user=root"], env=env, capture_output=True)
    _stop(f"{root}/slurmd.pid")
    _stop(f"{root}/slurmctld.pid")
    _stop(f"{munge}/munged.pid")
    shutil.rmtree(root, ignore_errors=True)


def _sweep(env, config, root):
  env = {**env, "PYTHONUNBUFFERED": "1",  # One CPU device per run (not conftest's 8).
         "XLA_FLAGS": " ".join(f for f in os.environ.get("XLA_FLAGS", "").split()
                               if not f.startswith("--xla_force_host_platform_device_count"))}
  return forkserver.Popen(  # (Forked: the launcher loads the config, so JAX and Flax.)
      [sys.executable, "-m", "lnjax.cli.sweep", "--backend=slurm", f"--config={config}",
       "--sweep=all", f"--workdir={root}", "--refresh_seconds=0.5"],
      cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _wait_for(condition, proc, what):
  deadline = time.time() + 600  # Seconds on an idle machine; minutes on a busy one.
  while not condition():
    assert proc.poll() is None, proc.stdout.read()
    assert time.time() < deadline, f"no {what} in 600 s"
    time.sleep(0.1)


def _resumed_from(workdir) -> list[int]:
  log = open(workdir / "log.txt").read()
  return [int(m) for m in re.findall(r"from step (\d+)\.", log)]


def _last_step(workdir) -> int:
  return max((r["step"] for r in launcher.read_metrics(str(workdir)) if "train_loss" in r),
             default=0)


def test_job_array_requeues_its_stopped_runs_and_keeps_cancelled_ones(slurm_env, tmp_path):
  config = tmp_path / "sweep_config.py"
  # One block, not the smoke model's two: SLURM's requeues are what is checked, and the two
  # tasks that start at once with nothing compiled (seeds 0 and 1) compile in two thirds of
  # the time: the test 34.5, 33.2 -> 27.5, 26.8 CPU s, the SLURM tasks' own included, with
  # an empty compilation cache (28.1 -> 25.1 warm; 2026-12-07, 2-core machine).
  config.write_text(
      "from configs import lm\nfrom lnjax import sweep\n\n"
      "def get_config(arg=None):\n"
      "  c = lm.get_config('smoke')\n  c.mesh.data = 1\n  c.model.num_layers = 1\n"
      "  c.train.num_steps = 4\n"
      "  c.train.log_every_steps = 1\n  c.train.eval_every_steps = 100000\n"
      "  c.train.checkpoint_every_steps = 100000\n  c.data.eval_batches = 1\n  return c\n\n"
      "def get_sweep(arg=None):\n  return [{'seed': 0}, {'seed': 1, 'train.num_steps': 200},"
      " {'seed': 2, 'train.num_steps': 150}]\n")
  root = tmp_path / "sweep"
  requeued, cancelled = root / "seed=1,steps=200", root / "seed=2,steps=150"

  proc = _sweep(slurm_env, config, root)
  try:
    _wait_for(lambda: launcher.read_metrics(str(requeued)), proc, "step of seed=1")
    jobs = {n: e["job"] for n, e in json.load(open(root / "sweep.json"))["runs"].items()}
    # The time limit's warning (--signal=B:USR1): the task stops its run and requeues itself.
    subprocess.run(["scancel", "--batch", "--signal=USR1", jobs[requeued.name]],
                   env=slurm_env, check=True)
    _wait_for(lambda: launcher.read_metrics(str(cancelled)), proc, "step of seed=2")
    subprocess.run(["scancel", jobs[cancelled.name]], env=slurm_env, check=True)
    _wait_for(lambda: _resumed_from(requeued) and _last_step(requeued) > _resumed_from(
        requeued)[0], proc, "step after the first requeue")
    # Preemption (PreemptMode=REQUEUE) and an administrator's requeue: SLURM stops the run.
    subprocess.run(["scontrol", "requeue", jobs[requeued.name]], env=slurm_env, check=True)
    out, _ = proc.communicate(timeout=600)
  finally:
    if proc.poll() is None:
      proc.kill()
  assert proc.returncode == 1, out  # The cancelled run is unfinished.
  manifest = json.load(open(root / "sweep.json"))["runs"]
  assert {n: e["state"] for n, e in manifest.items()} == {
      "seed=0": "completed", requeued.name: "completed", cancelled.name: "interrupted"}, out
  assert len({e["job"].split("_")[0] for e in manifest.values()}) == 1  # One job array.
  assert manifest[requeued.name]["requeues"] == 2 and manifest[requeued.name]["attempts"] == 1
  assert out.count(f"requeued  {requeued.name}") == 2, out
  log = open(requeued / "log.txt").read()
  assert [f"(restart {i})" in log for i in range(3)] == [True] * 3, log
  assert log.count("=== time limit near: requeued") == 1
  first, second = _resumed_from(requeued)
  assert 0 < first < second < 200, log
  steps = [r["step"] for r in launcher.read_metrics(str(requeued)) if "train_loss" in r]
  assert sorted(steps) == list(range(1, 201))  # Every step logged once, none lost.
  stopped = json.load(open(cancelled / "summary.json"))  # scancel: no requeue.
  assert stopped["status"] == "preempted" and 0 < stopped["step"] < 150, out
  assert os.listdir(cancelled / "checkpoints") == [str(stopped["step"])]

  proc = _sweep(slurm_env, config, root)
  try:
    out, _ = proc.communicate(timeout=600)
  finally:
    if proc.poll() is None:
      proc.kill()
  assert proc.returncode == 0, out
  assert "3 runs, 2 already finished, 0 still in SLURM, 1 to submit" in out
  manifest = json.load(open(root / "sweep.json"))["runs"]
  assert all(e["state"] == "completed" for e in manifest.values()), manifest
  assert manifest[cancelled.name]["attempts"] == 2 and manifest["seed=0"]["attempts"] == 1
  log = open(cancelled / "log.txt").read()
  assert log.count("slurm job") == 2 and _resumed_from(cancelled) == [stopped["step"]], log
  steps = [r["step"] for r in launcher.read_metrics(str(cancelled)) if "train_loss" in r]
  assert sorted(steps) == list(range(1, 151))
  assert len(os.listdir(root / "slurm")) == 2 + 4  # Two scripts, four array tasks' output.


def test_a_stability_search_sends_its_probe_as_a_slurm_job(slurm_env, tmp_path):
  """`lnjax stability --backend=slurm`: a search with one probe left runs it as a SLURM job
  (test_stability.one_probe_left)."""
  state, workdir = test_stability.one_probe_left(tmp_path)
  env = {**slurm_env, "XLA_FLAGS": " ".join(
      f for f in os.environ.get("XLA_FLAGS", "").split()
      if not f.startswith("--xla_force_host_platform_device_count"))}
  out = forkserver.run(
      [sys.executable, "-m", "lnjax.cli.stability", "--backend=slurm",
       *test_stability.ONE_PROBE_FLAGS, f"--workdir={workdir}", f"--state={state}"],
      cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
  assert out.returncode == 0, out.stdout + out.stderr
  entry = test_stability.check_the_last_probe(state, workdir)
  assert entry["job"], entry  # Run by SLURM, as this job.
