"""Reliability (issue 18): one run per workdir, logged losses independent of where a run
was interrupted, checkpoint checksums, atomic run files, one-line refusals of bad inputs,
divergence beyond NaN/Inf, and the summary's bookkeeping across segments.

Each test pins one numbered defect of the issue; the smoke preset keeps them short.
"""

import contextlib
import io
import json
import os
import shutil
import socket
import subprocess
import sys
import time

import jax
import numpy as np
import pytest

from lnjax import tasks
from lnjax.core import checkpoint, errors, lock, metrics, run as run_lib, train
from lnjax.inference import predict
from test_train import REPO, _one_line_error, run_cli, smoke_config, snapshot
import forkserver

pytestmark = pytest.mark.slow  # Most of them train or launch runs.


def records(workdir):
  return metrics.read_metrics(workdir)


def cli_args(workdir, *extra):
  return ["--config=configs/lm.py:smoke", f"--workdir={workdir}", "--config.mesh.data=1", *extra]


def popen_cli(*args):
  env = {**os.environ, "PYTHONUNBUFFERED": "1"}
  return forkserver.Popen([sys.executable, "-m", "lnjax.main", *args], cwd=REPO, env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def read_summary(workdir):
  try:
    return json.load(open(os.path.join(workdir, "summary.json")))
  except (OSError, ValueError):
    return {}


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
  """The uninterrupted smoke run, checkpoints every 8 steps (not a multiple of the
  logging interval 5), all of them kept."""
  wd = str(tmp_path_factory.mktemp("ref") / "run")
  summary = train.train_and_evaluate(smoke_config(**RESUMABLE), wd, tasks=tasks.get)
  assert summary["status"] == "completed"
  return wd


RESUMABLE = {"train.checkpoint_every_steps": 8, "train.keep_checkpoints": 5}


@pytest.fixture(scope="module")
def killed_run(tmp_path_factory):
  """A CLI run killed with -9 after a few log lines; while it trained, a second launch on
  its workdir was refused."""
  wd = str(tmp_path_factory.mktemp("killed") / "run")
  args = cli_args(wd, "--config.train.num_steps=100000", "--config.train.log_every_steps=2",
                  "--config.train.checkpoint_every_steps=4")
  first = popen_cli(*args)
  try:
    deadline = time.time() + 240
    while time.time() < deadline and read_summary(wd).get("step", 0) < 8:
      time.sleep(0.2)
    assert read_summary(wd).get("status") == "running", first.stderr.read() if first.poll() else ""
    t0 = time.time()
    second = run_cli(*args)
    second_seconds = time.time() - t0
    segment = read_summary(wd)
  finally:
    first.kill()
    first.communicate()
  return dict(workdir=wd, pid=first.pid, second=second, second_seconds=second_seconds,
              segment=segment)


# ---- 1. One run per workdir.

def test_1_second_launch_on_a_workdir_is_refused(killed_run):
  r = killed_run["second"]
  _one_line_error(r, "in use by", f"host {socket.gethostname()}", f"PID {killed_run['pid']}")
  assert killed_run["second_seconds"] < 60


@pytest.fixture(scope="module")
def resumed_killed_run(killed_run):
  """The killed run relaunched (in this process) for two more steps."""
  wd = killed_run["workdir"]
  left_lock = os.path.exists(os.path.join(wd, lock.LOCK_FILE))
  config = smoke_config(**{"train.log_every_steps": 2, "train.checkpoint_every_steps": 4})
  config.train.num_steps = read_summary(wd)["step"] + 2
  out = io.StringIO()
  with contextlib.redirect_stdout(out):
    summary = train.train_and_evaluate(config, wd, tasks=tasks.get)
  return dict(summary=summary, out=out.getvalue(), left_lock=left_lock)


def test_1_stale_lock_of_a_killed_run_is_taken_over(killed_run, resumed_killed_run):
  assert resumed_killed_run["left_lock"]  # kill -9 left the lock file behind ...
  assert resumed_killed_run["summary"]["status"] == "completed"  # ... and it was taken over,
  assert f"PID {killed_run['pid']}" in resumed_killed_run["out"]  # saying so,
  assert not os.path.exists(os.path.join(killed_run["workdir"], lock.LOCK_FILE))  # and released.


def test_1_lock_names_its_holder(tmp_path):
  with lock.WorkdirLock(str(tmp_path)):
    with pytest.raises(errors.WorkdirError, match=f"PID {os.getpid()}"):
      train.train_and_evaluate(smoke_config(), str(tmp_path), tasks=tasks.get)


def test_1_bucket_lock_of_a_live_process_of_this_host_is_refused_however_old(tmp_path):
  """A bucket lock naming a process of this host that is alive (a `sleep` started here) is
  refused, even one not refreshed for twice STALE_SECONDS: age only condemns other hosts'
  holders, whose processes cannot be seen. Once that process has ended it is taken over.
  (The lock's logic on a local folder: fileio serves local paths and buckets alike.)"""
  name = f"host {socket.gethostname()} PID "
  holder = forkserver.Popen(["sleep", "600"])
  try:
    with open(tmp_path / lock.LOCK_FILE, "w") as f:
      json.dump({"host": socket.gethostname(), "pid": holder.pid,
                 "time": time.time() - 2 * lock.STALE_SECONDS}, f)
    with pytest.raises(errors.WorkdirError, match=f"in use by {name}{holder.pid};"):
      with lock.BucketLock(str(tmp_path)):
        pass
  finally:
    holder.kill()
    holder.wait()
  with lock.BucketLock(str(tmp_path)) as taken:
    assert taken.previous_holder == f"{name}{holder.pid}"
    assert json.load(open(tmp_path / lock.LOCK_FILE))["pid"] == os.getpid()


# ---- 2. Logged losses do not depend on where the run was interrupted.

def test_2_resume_inside_a_logging_window_logs_the_uninterrupted_records(reference, tmp_path):
  """As if killed by -9 after step 15 was logged: the last checkpoint is step 8, inside
  the window 6..10, and metrics.jsonl holds records up to step 15."""
  wd = str(tmp_path / "killed")
  shutil.copytree(reference, wd)
  for step in ("16", "20"):
    shutil.rmtree(os.path.join(wd, "checkpoints", step))
  with open(os.path.join(wd, "metrics.jsonl"), "w") as f:
    f.writelines(json.dumps(r) + "\n" for r in records(reference) if r["step"] <= 15)
  train.train_and_evaluate(smoke_config(**RESUMABLE), wd, tasks=tasks.get)
  assert records(wd) == records(reference)


def test_2_saved_window_is_the_window_at_the_saved_step(reference, tmp_path, monkeypatch):
  """The loop goes on adding to its window dict while orbax writes the checkpoint in the
  background: what is restored is the window as it was when save() was called."""
  restored = checkpoint.restore_run(reference, step=16, tasks=tasks.get)
  handed = []  # What orbax is given to write later: never the caller's own objects.
  json_save = checkpoint.ocp.args.JsonSave
  monkeypatch.setattr(checkpoint.ocp.args, "JsonSave",
                      lambda item: handed.append(item) or json_save(item))
  ckpt = checkpoint.Checkpoints(str(tmp_path), 1, 1)
  window = {"train_loss": 3.5, "grad_norm": 0.75, "_n": 1}
  data_state = {"position": [16]}
  ckpt.save(16, restored.state, data_state, force=True, log={"window": window})
  assert handed and all(x is not data_state and x.get("window") is not window for x in handed)
  window["train_loss"] += 3.25  # Step 17, added at once (as the loop does).
  window["_n"] += 1
  data_state["position"][0] = 17
  ckpt.wait()
  _, data, saved = ckpt.restore_latest(restored.state)
  ckpt.close()
  assert saved == {"window": {"train_loss": 3.5, "grad_norm": 0.75, "_n": 1}}
  assert data == {"position": [16]}


# ---- 3. A checkpoint altered after it was written is not restored.

def _flip_bytes(step_dir, n=64):
  files = [os.path.join(r, f) for r, _, fs in os.walk(step_dir) for f in fs]
  largest = max(files, key=os.path.getsize)
  size = os.path.getsize(largest)
  with open(largest, "r+b") as f:
    f.seek(size // 2)
    data = f.read(n)
    f.seek(size // 2)
    f.write(bytes(b ^ 0xFF for b in data))
  assert os.path.getsize(largest) == size


def test_3_flipped_bytes_fall_back_to_the_previous_checkpoint(reference, tmp_path, capsys):
  wd = str(tmp_path / "flipped")
  shutil.copytree(reference, wd)
  _flip_bytes(os.path.join(wd, "checkpoints", "20"))
  with pytest.raises(errors.CheckpointError, match="differs from its checksum"):
    checkpoint.restore_run(wd, tasks=tasks.get)
  summary = train.train_and_evaluate(smoke_config(**RESUMABLE), wd, tasks=tasks.get)
  out = capsys.readouterr().out
  assert "checkpoint at step 20" in out and "checksum" in out and "from step 16" in out
  assert os.path.isdir(os.path.join(wd, "corrupt_checkpoints", "20"))
  # Retrained from 16: the same state as the uninterrupted run's.
  assert summary["status"] == "completed" and records(wd) == records(reference)
  a, b = (checkpoint.restore_run(w, tasks=tasks.get) for w in (reference, wd))
  for x, y in zip(jax.tree.leaves(a.state), jax.tree.leaves(b.state)):
    np.testing.assert_array_equal(x, y)



def test_3_avg_2_is_the_numpy_mean_of_the_last_2_of_3_checkpoints(reference):
  """The reference keeps steps 8, 16 and 20: avg:2 is the mean of 16 and 20 (not 8 and 16),
  computed here in numpy from the checkpoints themselves."""
  from lnjax.core import averaging
  chosen = averaging.restore(reference, "avg:2", tasks=tasks.get)
  assert chosen.steps == [16, 20] and chosen.label == "avg2-step20"
  leaves = [jax.tree.leaves(checkpoint.restore_run(reference, step=s, tasks=tasks.get).state.params)
            for s in (16, 20)]
  for mean, a, b in zip(jax.tree.leaves(chosen.params), *leaves):
    np.testing.assert_allclose(np.asarray(mean), (np.asarray(a, np.float64) +
                                                  np.asarray(b, np.float64)) / 2, rtol=1e-6)

# ---- 4. Run files: atomic writes; an empty config.json or a cut metrics line.

def test_4_empty_config_json_is_one_line_and_nothing_is_overwritten(reference, tmp_path):
  """A one-line WorkdirError (exit code 2) from train.train_and_evaluate, the function
  lnjax.main hands its config to and whose errors it reports in one line (test_1's
  refusal on the command line); nothing in the workdir changed."""
  wd = str(tmp_path / "empty_config")
  shutil.copytree(reference, wd)
  open(os.path.join(wd, "config.json"), "w").close()
  before = snapshot(wd)
  with pytest.raises(errors.WorkdirError, match="config.json is empty") as e:
    train.train_and_evaluate(smoke_config(**RESUMABLE), wd, tasks=tasks.get)
  assert e.value.exit_code == 2 and "\n" not in str(e.value), str(e.value)
  assert snapshot(wd) == before


def test_4_cut_metrics_line_is_left_out_with_a_warning(reference, tmp_path, capsys):
  wd = str(tmp_path / "cut")
  shutil.copytree(reference, wd)
  shutil.rmtree(os.path.join(wd, "checkpoints", "20"))  # Killed while writing step 20's line.
  lines = [json.dumps(r) + "\n" for r in records(reference)]
  with open(os.path.join(wd, "metrics.jsonl"), "w") as f:
    f.writelines(lines[:-2])
    f.write(lines[-2][:30])  # Step 20's train record, cut.
  assert len(records(wd)) == len(records(reference)) - 2
  assert "left out" in capsys.readouterr().err
  summary = train.train_and_evaluate(smoke_config(**RESUMABLE), wd, tasks=tasks.get)
  assert summary["status"] == "completed" and records(wd) == records(reference)


def test_4_config_json_is_written_atomically_and_only_when_it_changes(tmp_path):
  config = smoke_config()
  checkpoint.save_config(str(tmp_path), config)
  path = tmp_path / "config.json"
  stat = os.stat(path)
  checkpoint.save_config(str(tmp_path), config)
  assert os.stat(path).st_mtime_ns == stat.st_mtime_ns  # Unchanged: not rewritten.
  config = smoke_config(**{"train.num_steps": 30})
  checkpoint.save_config(str(tmp_path), config)
  assert os.stat(path).st_ino != stat.st_ino  # A new file renamed over the old one.
  assert json.load(open(path))["train"]["num_steps"] == 30
  assert os.listdir(tmp_path) == ["config.json"]  # No temporary file left.


# ---- 5. One line, exit 2, for every bad input.

def test_5_missing_config_file(tmp_path):
  r = run_cli("--config=configs/nope.py", f"--workdir={tmp_path}/x")
  _one_line_error(r, "configs/nope.py", "No such file")
  assert not os.path.exists(tmp_path / "x")


def test_5_analyze_step_that_is_not_a_number(reference):
  """report.analyze, what lnjax.cli.analyze runs and reports in one line (its command line:
  test_reliability3.py's superscript step), refuses the step of a trained run at once."""
  from lnjax.analysis import report
  with pytest.raises(errors.LnjaxError, match="--step='abc'") as e:
    report.analyze(reference, "abc")
  assert e.value.exit_code == 2 and "\n" not in str(e.value), str(e.value)



def test_5_disk_full_during_a_save_is_one_line(small_disk):
  wd = os.path.join(small_disk, "run")
  # Fill the disk but for ~150 kB: config, metrics and summary fit, a checkpoint does not.
  with open(os.path.join(small_disk, "filler"), "wb") as f:
    f.write(b"\0" * (1024 * 1024 - 150 * 1024))
  r = run_cli(*cli_args(wd))
  _one_line_error(r, "No space left on device")


# ---- 6. Divergence beyond NaN/Inf.

def test_6_a_huge_finite_loss_is_divergence(tmp_path):
  wd = str(tmp_path / "huge")
  summary = train.train_and_evaluate(smoke_config(**{"opt.learning_rate": 1e6}), wd,
                                     tasks=tasks.get)
  assert summary["status"] == "diverged"
  assert summary["last_finite_train_loss"] is not None
  assert summary["last_finite_train_loss"] < 1e4 * np.log(65)
  assert not os.path.exists(os.path.join(wd, "checkpoints", "20"))


def test_6_divergence_factor_is_a_setting():
  assert run_lib.resolve_config(smoke_config(), tasks=tasks.get).train.divergence_factor == 1e4
  assert run_lib.resolve_config(smoke_config(**{"train.divergence_factor": 0.0}), tasks=tasks.get)
  with pytest.raises(errors.ConfigError, match="divergence_factor=-1.0 must be a number"):
    run_lib.resolve_config(smoke_config(**{"train.divergence_factor": -1.0}), tasks=tasks.get)


# ---- 7. Smaller ones.

def test_7_warmup_longer_than_the_run_is_refused():
  with pytest.raises(errors.ConfigError, match="opt.warmup_steps=30 exceeds train.num_steps=20"):
    run_lib.resolve_config(smoke_config(**{"opt.warmup_steps": 30}), tasks=tasks.get)


def test_7_relaunching_a_finished_run_keeps_its_summary(reference, tmp_path):
  wd = str(tmp_path / "again")
  shutil.copytree(reference, wd)
  before = read_summary(wd)
  after = train.train_and_evaluate(smoke_config(**RESUMABLE), wd, tasks=tasks.get)
  for key in ("last_finite_train_loss", "last_finite_step", "wall_seconds", "eval_loss"):
    assert after[key] == before[key] and after[key] is not None, key
  assert records(wd) == records(reference)  # The evaluation is not logged twice.


def test_7_wall_seconds_count_segments_ended_by_kill_9(killed_run, resumed_killed_run):
  segment = killed_run["segment"]  # What summary.json said just before the kill.
  assert segment["status"] == "running" and segment["wall_seconds"] > 0
  assert resumed_killed_run["summary"]["wall_seconds"] > segment["wall_seconds"]


def test_7_predict_on_a_language_model_workdir(reference):
  before = snapshot(reference)
  with pytest.raises(errors.LnjaxError, match="decodes translation runs"):
    predict.predict(reference)
  assert not os.path.exists(os.path.join(reference, "best_checkpoint"))
  assert snapshot(reference) == before
