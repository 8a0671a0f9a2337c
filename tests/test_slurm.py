"""The SLURM back end of lnjax.sweep against a real single-node SLURM (Debian's slurmctld,
slurmd and munge, started here in a temporary folder and stopped at the end): four runs
through one job array, one of them cancelled with scancel while it trains; the same
command again resubmits only that one, which resumes from its checkpoint."""

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

import pytest

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
  its commands need. The steps are CLUSTER_NOTES.md's, with everything in one folder;
  KillWait (SIGTERM to SIGKILL) is long enough for a checkpoint on a busy machine."""
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
AuthInfo=socket={socket_path}
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
  return subprocess.Popen(
      [sys.executable, "-m", "lnjax.sweep", "--backend=slurm", f"--config={config}",
       "--sweep=all", f"--workdir={root}", "--refresh_seconds=0.5"],
      cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def test_job_array_with_a_cancelled_run_finishes_on_resubmission(slurm_env, tmp_path):
  config = tmp_path / "sweep_config.py"
  config.write_text(
      "from configs import lm\nfrom lnjax import sweep\n\n"
      "def get_config(arg=None):\n"
      "  c = lm.get_config('smoke')\n  c.mesh.data = 1\n  c.train.num_steps = 4\n"
      "  c.train.log_every_steps = 1\n  c.train.eval_every_steps = 100000\n"
      "  c.train.checkpoint_every_steps = 100000\n  c.data.eval_batches = 1\n  return c\n\n"
      "def get_sweep(arg=None):\n  return sweep.chain(sweep.axis('seed', [0, 1, 2]),"
      " [{'seed': 3, 'train.num_steps': 1000}])\n")
  root = tmp_path / "sweep"
  long = root / "seed=3,steps=1000"

  proc = _sweep(slurm_env, config, root)
  try:
    deadline = time.time() + 600  # Seconds on an idle machine; minutes on a busy one.
    while time.time() < deadline and not launcher.read_metrics(str(long)):
      assert proc.poll() is None, proc.stdout.read()
      time.sleep(0.1)
    job = json.load(open(root / "sweep.json"))["runs"][long.name]["job"]
    subprocess.run(["scancel", job], env=slurm_env, check=True)
    out, _ = proc.communicate(timeout=600)
  finally:
    if proc.poll() is None:
      proc.kill()
  assert proc.returncode == 1, out  # One run unfinished.
  manifest = json.load(open(root / "sweep.json"))["runs"]
  assert {n: e["state"] for n, e in manifest.items()} == {
      "seed=0": "completed", "seed=1": "completed", "seed=2": "completed",
      long.name: "interrupted"}, out
  assert len({e["job"].split("_")[0] for e in manifest.values()}) == 1  # One job array.
  stopped = json.load(open(long / "summary.json"))
  assert stopped["status"] == "preempted" and 0 < stopped["step"] < 1000, out
  assert os.listdir(long / "checkpoints") == [str(stopped["step"])]

  proc = _sweep(slurm_env, config, root)
  try:
    out, _ = proc.communicate(timeout=600)
  finally:
    if proc.poll() is None:
      proc.kill()
  assert proc.returncode == 0, out
  assert "4 runs, 3 already finished, 0 still in SLURM, 1 to submit" in out
  manifest = json.load(open(root / "sweep.json"))["runs"]
  assert all(e["state"] == "completed" for e in manifest.values()), manifest
  assert manifest[long.name]["attempts"] == 2 and manifest["seed=0"]["attempts"] == 1
  log = open(long / "log.txt").read()
  assert log.count("slurm job") == 2 and f"from step {stopped['step']}" in log
  steps = [r["step"] for r in launcher.read_metrics(str(long)) if "train_loss" in r]
  assert sorted(steps) == list(range(1, 1001))  # Every step logged once, none lost.
  assert len(os.listdir(root / "slurm")) == 2 + 5  # Two scripts, five array tasks' output.
