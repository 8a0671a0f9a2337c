"""No command writes into a run that is not its own (issue 62, item 3): one guard,
lnjax.core.fileio.refuse_run_files, on resolved paths (symbolic links followed), used by
train, export, average, analyze (--hf too), translate/predict, compare, sweep, stability
and finetune. An output or workdir that is, or is inside, another run's folder or its
files (checkpoints/, metrics.jsonl, ...) is refused in one line before anything is written.

The in-process cases call each command's function (no compile: the guard comes first); the
commands whose guard lives in their command line (analyze --hf, translate, sweep,
stability) run as command lines, in the slow tier.
"""

import json
import os

import pytest

from lnjax import tasks
from lnjax.analysis import compare
from lnjax.core import averaging, checkpoint, errors, fileio, train
from lnjax.inference import export
from conftest import run_command_lines
from test_train import REPO, smoke_config


def _run(path) -> str:
  """A run's workdir as training starts it: config.json, summary.json, checkpoints/20."""
  wd = str(path)
  os.makedirs(os.path.join(wd, "checkpoints", "20"))
  checkpoint.save_config(wd, smoke_config())
  fileio.write_text(os.path.join(wd, "summary.json"), json.dumps({"status": "running"}))
  return wd


def _files(root) -> dict:
  return {rel: fileio.read_bytes(os.path.join(root, rel)) for rel in fileio.walk_files(root)}


@pytest.fixture
def victim(tmp_path):
  """(another run, its files before, a link to its checkpoints/, a link to the run)."""
  wd = _run(tmp_path / "victim")
  os.symlink(os.path.join(wd, "checkpoints"), tmp_path / "ckpt_link")
  os.symlink(wd, tmp_path / "run_link")
  return wd, _files(wd), str(tmp_path / "ckpt_link"), str(tmp_path / "run_link")


# Each command's function, given a path in or at `victim` (the others' inputs valid).
COMMANDS = {
    "train": lambda target, tmp: train.train_and_evaluate(smoke_config(), target, tasks=tasks.get),
    "export": lambda target, tmp: export.export(_run(tmp / "mine"), target),
    "average": lambda target, tmp: averaging.write_average(_run(tmp / "mine"), 1, target,
                                                           tasks=tasks.get),
    "compare": lambda target, tmp: compare.compare([_run(tmp / "mine")], target + "/cmp"),
}
# Targets, from the victim's folder V, its checkpoints/ link C and its folder's link L.
TARGETS = {"V/checkpoints": ("V", "checkpoints"), "V/checkpoints/20": ("V", "checkpoints/20"),
           "V": ("V", ""), "V/new": ("V", "new"), "C (link)": ("C", ""),
           "C/20 (link)": ("C", "20"), "L/checkpoints (link)": ("L", "checkpoints")}


@pytest.mark.parametrize("target", sorted(TARGETS))
@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_no_command_writes_into_another_run(tmp_path, victim, command, target):
  wd, before, ckpt_link, run_link = victim
  base, rel = TARGETS[target]
  path = os.path.join({"V": wd, "C": ckpt_link, "L": run_link}[base], rel)
  if command == "train" and target == "V":
    return  # A run's own workdir: train resumes it (below).
  with pytest.raises(errors.WorkdirError, match=r"the run in .*victim: a run's own files"):
    COMMANDS[command](path.rstrip("/"), tmp_path)
  assert _files(wd) == before and not os.path.exists(os.path.join(wd, "new"))


def test_a_runs_own_folder_and_a_folder_of_runs_are_accepted(tmp_path):
  """Train resumes its own workdir; a sweep's root (sweep.json), a fine-tuning's seeds/
  and a stability search's runs/ take runs; a tool writes analysis/ into the run it reads;
  a run's checkpoints/ stay refused to the run itself."""
  wd = _run(tmp_path / "run")
  fileio.refuse_run_files("--workdir", wd, [wd], own=[wd])
  fileio.refuse_run_files("--step", "init", [wd + "/analysis/init"], own=[wd])
  with pytest.raises(errors.WorkdirError, match="would write checkpoints/x of"):
    fileio.refuse_run_files("--output", wd, [wd + "/checkpoints/x"], own=[wd])
  for mark, sub in fileio.CONTAINERS.items():
    root = tmp_path / mark.replace(".json", "")
    os.makedirs(root)
    (root / mark).write_text("{}")
    child = _run(root / sub / "seed=0")  # Itself a run, and its own.
    fileio.refuse_run_files("--workdir", child, [child], own=[child])
    with pytest.raises(errors.WorkdirError, match="would write checkpoints/20 of"):
      fileio.refuse_run_files("--workdir", child, [child + "/checkpoints/20"], own=[child])
  fileio.refuse_run_files("--output", "x", [str(tmp_path / "elsewhere")])


def test_bucket_paths_are_compared_by_prefix():
  """gs:// has no links: '.', '..' and '//' folded, then the folders above by prefix."""
  assert fileio.resolve("gs://b/x/../run//checkpoints/") == "gs://b/run/checkpoints"
  assert list(fileio._folders_up("gs://b/run/checkpoints")) == [
      "gs://b/run/checkpoints", "gs://b/run", "gs://b"]


CLI = {  # command line (RUN: the victim, LINK: the link to its checkpoints/) -> needle
    "analyze --hf": ["lnjax.cli.analyze", "--hf=gpt2", "--text=t.txt", "--output=LINK"],
    "translate": ["lnjax.cli.translate", "--workdir=RUN", "--output=LINK/hyp.txt"],
    "sweep": ["lnjax.cli.sweep", "--config=lm:smoke", "--workdir=RUN/checkpoints",
              "--grid=seed=0,1"],
    "stability": ["lnjax.cli.stability", "--config=lm:smoke", "--workdir=LINK/search"],
}


@pytest.mark.slow  # Four command lines (each its own process: run from another folder).
def test_the_commands_refuse_another_runs_folder_in_one_line(tmp_path, victim):
  wd, before, ckpt_link, _ = victim
  argvs = [[a.replace("RUN", wd).replace("LINK", ckpt_link) for a in argv]
           for argv in CLI.values()]
  runs = run_command_lines(argvs, env={**os.environ, "PYTHONPATH": REPO}, cwd=tmp_path,
                           timeout=300)
  failures = []
  for argv, (code, _, stderr) in zip(argvs, runs, strict=True):
    lines = stderr.strip().splitlines()
    ok = (code == 2 and len(lines) == 1 and "the run in" in lines[0]
          and "a run's own files are never overwritten" in lines[0])
    if not ok:
      failures.append(f"{argv}: exit {code}: {stderr[-800:]}")
  assert not failures, "\n".join(failures)
  assert _files(wd) == before
