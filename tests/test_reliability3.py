"""Reliability, third round (issue 28): no command writes into a run's own files, lock
files are never links, hostile input to the tools is refused in one line or read as far
as it is valid, and the remaining defects of the issue's list (items 1-3 and 5).

Each test pins one defect; the in-process ones need no trained run (a workdir is what
`checkpoint.save_config` writes), the command-line and training ones are marked slow.
"""

import json
import os
import socket
import sys
import tempfile
import time

import pytest

from lnjax import tasks
from lnjax.analysis import compare
from lnjax.core import averaging, checkpoint, errors, fileio, lock, sharding
from lnjax.inference import export
from lnjax.data import builders, mt_builders, paths, sources
from lnjax.sweep import launcher
from test_train import REPO, _one_line_error, smoke_config
import forkserver


def _run_workdir(path) -> str:
  """A run's workdir as training starts it: its config.json and summary.json."""
  wd = str(path)
  os.makedirs(os.path.join(wd, "checkpoints"))
  checkpoint.save_config(wd, smoke_config())
  fileio.write_text(os.path.join(wd, "summary.json"), json.dumps({"status": "running"}))
  return wd


def _files(wd) -> dict:
  return {rel: fileio.read_bytes(os.path.join(wd, rel)) for rel in fileio.walk_files(wd)}


def _cli(module, *args, env=None, timeout=300):
  return forkserver.run([sys.executable, "-m", module, *args], cwd=REPO, capture_output=True,
                        text=True, timeout=timeout, env={**os.environ, **(env or {})})


# ---- Item 1 and part 2: no output of a command lands in a run's own files.

def test_export_into_the_workdir_is_refused_and_changes_nothing(tmp_path):
  wd = _run_workdir(tmp_path / "run")
  before = _files(wd)
  for output in (wd, os.path.join(wd, "checkpoints", "x")):
    with pytest.raises(errors.WorkdirError, match="a run's own files are never overwritten"):
      export.export(wd, output)
  assert _files(wd) == before


@pytest.mark.parametrize("target, refused", [
    ("", True), ("config.json", True), ("metrics.jsonl", True), ("checkpoints/10", True),
    ("best_checkpoint", True), (".lnjax.lock", True), ("export/config.json", False),
    ("analysis/init/report.md", False), ("predictions/test.step20.hyp", False)])
def test_the_output_guard_refuses_the_runs_files_only(tmp_path, target, refused):
  wd = _run_workdir(tmp_path / "run")
  path = os.path.join(wd, target) if target else wd
  if refused:
    with pytest.raises(errors.WorkdirError, match="never overwritten"):
      fileio.refuse_run_files("--output", path, [path])
  else:  # (Into its own run: a command that reads the run, as analyze does.)
    fileio.refuse_run_files("--output", path, [path], own=[wd])
  # An export folder (its config.json names the run's config) is no run: export again.
  os.makedirs(tmp_path / "exp")
  (tmp_path / "exp" / "config.json").write_text('{"lnjax_config": {}}')
  fileio.refuse_run_files("--output", str(tmp_path / "exp"), [str(tmp_path / "exp/config.json")])


def test_averaging_and_compare_refuse_an_output_in_a_runs_files(tmp_path):
  wd = _run_workdir(tmp_path / "run")
  before = _files(wd)
  with pytest.raises(errors.WorkdirError, match="never overwritten"):
    averaging.write_average(wd, 1, os.path.join(wd, "checkpoints", "avg"), tasks=tasks.get)
  with pytest.raises(errors.WorkdirError, match="never overwritten"):
    compare.compare([wd], os.path.join(wd, "tensorboard", "cmp"))
  assert _files(wd) == before


@pytest.mark.slow
def test_translate_and_export_commands_refuse_the_workdir_in_one_line(tmp_path):
  wd = _run_workdir(tmp_path / "run")
  before = _files(wd)
  _one_line_error(_cli("lnjax.cli.export", f"--workdir={wd}", f"--output={wd}"),
                  f"would write config.json of the run in {wd}")
  _one_line_error(_cli("lnjax.cli.translate", f"--workdir={wd}",
                       f"--output={os.path.join(wd, 'metrics.jsonl')}"), "metrics.jsonl")
  assert _files(wd) == before


# ---- Item 2: lock files are never opened through a link.

def test_the_workdir_lock_refuses_a_symlink_and_leaves_its_target_alone(tmp_path):
  victim = tmp_path / "precious.txt"
  victim.write_text("keep me\n")
  wd = tmp_path / "run"
  wd.mkdir()
  os.symlink(victim, wd / lock.LOCK_FILE)
  with pytest.raises(errors.WorkdirError, match="is a symbolic link"):
    with lock.WorkdirLock(str(wd)):
      pass
  assert victim.read_text() == "keep me\n" and os.path.islink(wd / lock.LOCK_FILE)
  # The sweep launcher's lock on a run: the same.
  os.symlink(victim, wd / ".lock")
  with pytest.raises(errors.WorkdirError, match="is a symbolic link"):
    launcher._try_lock(str(wd))
  assert victim.read_text() == "keep me\n"
  # A plain lock file is still taken and released.
  os.remove(wd / lock.LOCK_FILE)
  with lock.WorkdirLock(str(wd)):
    assert "PID" in (wd / lock.LOCK_FILE).read_text()


# ---- Item 3: binary and Latin-1 input to lnjax.inference.translate.

def test_translate_reads_undecodable_lines_as_empty_ones(tmp_path):
  from lnjax.inference import translate

  path = tmp_path / "in.txt"
  path.write_bytes("Ein Hund.\r\n".encode() + "Café Straße\n".encode("latin-1")
                   + b"\x7fELF\x00\xff\xfe\n\nZwei Katzen.\x0bim Haus\n")
  lines, bad = translate.read_lines(str(path))
  # Lines end at \n only (\x0b inside a line is no break, unlike str.splitlines).
  assert lines == ["Ein Hund.", "", "", "", "Zwei Katzen.\x0bim Haus"] and bad == [2, 3]


# ---- Item 5.

@pytest.mark.parametrize("spec", ["²", "avg:²", "¹⁰", "٣", "avg:0", " 3", "-1", "3.0"])
def test_checkpoint_specs_take_ascii_digits_only(spec):
  with pytest.raises(errors.LnjaxError, match="must be best, latest, a step or avg:N"):
    averaging.parse_spec(spec)
  with pytest.raises(errors.LnjaxError, match="--step=.* must be init, best, latest, a step"):
    averaging.parse_spec(spec, "--step", "init")  # lnjax analyze's flag and its own choice.
  assert averaging.parse_spec("20") == ("step", 20)
  assert averaging.parse_spec("avg:3") == ("avg", 3)


@pytest.mark.slow
def test_a_superscript_checkpoint_is_one_line(tmp_path):
  """lnjax.cli.analyze --step=²: one line. lnjax.cli.translate's and lnjax.cli.export's
  --checkpoint=²: the same one-line LnjaxError (exit code 2) from the functions they run,
  which those commands print as one line (their command lines:
  test_translate_and_export_commands_refuse_the_workdir_in_one_line)."""
  from lnjax.inference import translate

  wd = _run_workdir(tmp_path / "run")
  _one_line_error(_cli("lnjax.cli.analyze", f"--workdir={wd}", "--step=²"),
                  "must be init, best, latest")
  before = _files(wd)
  for refused in (lambda: translate.translate_run(wd, [], "²"),
                  lambda: export.export(wd, str(tmp_path / "export"), "²")):
    with pytest.raises(errors.LnjaxError, match="--checkpoint='²' must be best, latest") as e:
      refused()
    assert e.value.exit_code == 2 and "\n" not in str(e.value), str(e.value)
  assert _files(wd) == before and not os.path.exists(tmp_path / "export")


def test_analyze_refuses_zero_batches_and_a_bad_rate(tmp_path):
  from lnjax.analysis import report as analyze

  wd = _run_workdir(tmp_path / "run")
  for kwargs, needle in (({"num_batches": 0}, "--batches=0"), ({"num_batches": -2}, "--batches"),
                         ({"lr": float("nan")}, "--lr=nan"), ({"lr": -1.0}, "--lr")):
    with pytest.raises(errors.ConfigError, match=needle):
      analyze.analyze(wd, "latest", **kwargs)


@pytest.mark.slow
def test_averaging_last_zero_is_one_line():
  r = _cli("lnjax.cli.average", "--workdir=/nonexistent", "--last=0")
  _one_line_error(r, "--last=0")


def test_hf_name_offline_is_one_quick_line(monkeypatch, capfd):
  import datasets  # noqa: F401  (imported before the clock starts)

  monkeypatch.delenv("LNJAX_DATA_OFFLINE", raising=False)
  monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{_closed_port()}")  # No hub there.
  t0 = time.perf_counter()
  with pytest.raises(paths.DataError, match="the hub is not reachable"):
    sources.open_external("hf:org/NOSUCH")
  assert time.perf_counter() - t0 < 15
  assert "Retry" not in capfd.readouterr().err


def _closed_port() -> int:
  s = socket.socket()
  s.bind(("127.0.0.1", 0))
  port = s.getsockname()[1]
  s.close()
  return port


def test_a_bucket_without_network_is_a_bounded_line_naming_the_endpoint(monkeypatch):
  monkeypatch.setattr(fileio, "_reachable", set())
  endpoint = f"http://127.0.0.1:{_closed_port()}"
  monkeypatch.setenv("STORAGE_EMULATOR_HOST", endpoint)
  t0 = time.perf_counter()
  with pytest.raises(errors.LnjaxError, match=f"storage endpoint {endpoint} is not reachable"):
    fileio.exists("gs://bucket/run")
  # A name that does not resolve (.invalid never does, RFC 2606), as with no network at
  # all: the wait is at most PROBE_SECONDS, not gcsfs's minute of retries.
  monkeypatch.setattr(fileio, "PROBE_SECONDS", 2.0)
  monkeypatch.setenv("STORAGE_EMULATOR_HOST", "http://storage.lnjax.invalid:4443")
  with pytest.raises(errors.LnjaxError, match="storage.lnjax.invalid:4443 is not reachable"):
    fileio.write_text("gs://bucket/run/config.json", "{}")
  assert time.perf_counter() - t0 < 10



@pytest.mark.slow
def test_a_refused_save_leaves_the_summary_failed_not_running(small_disk):
  from lnjax.core import train

  wd = os.path.join(small_disk, "run")
  with open(os.path.join(small_disk, "filler"), "wb") as f:  # Room for all but checkpoints.
    f.write(b"\0" * (1024 * 1024 - 150 * 1024))
  with pytest.raises(errors.CheckpointError, match="could not save the checkpoint"):
    train.train_and_evaluate(smoke_config(**{"train.checkpoint_every_steps": 5}), wd,
                             tasks=tasks.get)
  summary = json.load(open(os.path.join(wd, "summary.json")))
  assert summary["status"] == "failed" and "could not save" in summary["error"], summary


def test_a_mesh_on_fewer_devices_than_present_says_so(capfd):
  mesh = sharding.make_mesh(sharding.MeshConfig(data=2))
  captured = capfd.readouterr()
  out = captured.out.strip().splitlines()
  assert captured.err == "", "stderr is for errors; the mesh notice goes with the start-up lines"
  assert len(mesh.devices.flat) == 2 and out == ["Mesh: 2 of the 8 devices used "
                 "(data×fsdp×model = 2×1×1); the other 6 stay idle (mesh.data=-1 uses them "
                 "all)."], out
  sharding.make_mesh(sharding.MeshConfig())  # Every device: nothing to say.
  sharding.make_mesh(sharding.MeshConfig(data=1), sharding.jax.local_devices()[:1])
  assert capfd.readouterr() == ("", "")


def test_a_killed_preparations_incomplete_folder_is_removed_on_the_next(tmp_path):
  builder = builders.prepare("tiny_shakespeare", cache_dir=str(tmp_path / "cache"))
  left = os.path.join(os.path.dirname(builder.data_dir), "incomplete.AB12CD_1.0.0")
  os.makedirs(os.path.join(left, "partial"))
  builders.prepare("tiny_shakespeare", cache_dir=str(tmp_path / "cache"))
  assert not os.path.exists(left)
  assert sorted(os.listdir(os.path.dirname(builder.data_dir))) == [
      os.path.basename(builder.data_dir)]


def test_preparing_a_data_set_leaves_nothing_in_the_temp_folder(tmp_path, monkeypatch, corpora):
  """TFDS makes an empty temp folder for each builder of a data set not yet prepared and
  never removes it: two per preparation here, 56 in /tmp after one run of the README's
  test command (TensorFlow Datasets 4.9.10, 2026-12-05)."""
  temp = tmp_path / "temp"
  temp.mkdir()
  monkeypatch.setattr(tempfile, "tempdir", str(temp))
  builders.prepare("tiny_shakespeare", cache_dir=str(tmp_path / "cache"))
  mt_builders.prepare("multi30k_de_en", data_dir=corpora, cache_dir=str(tmp_path / "cache"))
  assert os.listdir(temp) == []
  assert tempfile.gettempdir() == str(temp)



@pytest.mark.parametrize("age_seconds, taken", [(120, False), (16 * 60, True)])
def test_a_bucket_lock_of_another_host_is_taken_over_after_15_minutes(tmp_path, age_seconds,
                                                                        taken):
  """Its holder refreshes it at every summary write (minutes apart at most): a lock
  refreshed 2 minutes ago is a live run's, one 16 minutes old a dead one's. (The lock's
  logic on a local folder, as fileio serves both.)"""
  with open(tmp_path / lock.LOCK_FILE, "w") as f:
    json.dump({"host": "another-host", "pid": 1, "time": time.time() - age_seconds}, f)
  if not taken:
    with pytest.raises(errors.WorkdirError, match="in use by host another-host PID 1;"):
      with lock.BucketLock(str(tmp_path)):
        pass
    return
  with lock.BucketLock(str(tmp_path)) as held:
    assert held.previous_holder == "host another-host PID 1"
