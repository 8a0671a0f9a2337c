"""benchmarks/stability_search.py's ledger: the grid runs finished on one machine are skipped
by the launcher in a new workdir on another, and only finished runs enter it."""

import json
import os

import ml_collections
import pytest

from conftest import import_benchmark
from lnjax import sweep
from lnjax.sweep import launcher


@pytest.fixture(scope="module")
def bench():
  return import_benchmark("stability_search")


def grid_run(name, num_steps=300):
  config = ml_collections.ConfigDict({"train": {"num_steps": num_steps}})
  return sweep.Run(name, {}, config)


def write_summary(root, name, **summary):
  os.makedirs(os.path.join(root, name), exist_ok=True)
  with open(os.path.join(root, name, "summary.json"), "w") as f:
    json.dump(summary, f)


def test_the_ledger_carries_finished_runs_to_a_new_workdir(bench, tmp_path):
  runs = [grid_run(n) for n in ("lr=0.01,seed=0", "lr=0.1,seed=0", "lr=1,seed=0")]
  old, new, ledger = str(tmp_path / "old"), str(tmp_path / "new"), str(tmp_path / "grid.json")
  write_summary(old, runs[0].name, status="completed", step=300, num_steps=300,
                eval_loss=2.9, unigram_baseline=3.3, tokens_per_second=1.0)
  write_summary(old, runs[1].name, status="diverged", step=41, num_steps=300)
  write_summary(old, runs[2].name, status="preempted", step=120, num_steps=300)  # Not finished.
  bench.save_ledger(ledger, runs, old)
  with open(ledger) as f:
    kept = json.load(f)
  assert set(kept) == {runs[0].name, runs[1].name}
  assert kept[runs[0].name] == {"status": "completed", "step": 300, "num_steps": 300,
                                "eval_loss": 2.9, "unigram_baseline": 3.3}

  assert bench.restore_ledger(ledger, runs, new) == 2
  states = [launcher.finished_state(r, os.path.join(new, r.name)) for r in runs]
  assert states == [launcher.COMPLETED, launcher.DIVERGED, None]
  assert bench.restore_ledger(ledger, runs, new) == 0  # What is there already is kept.

  # A later save keeps the old entries and adds the newly finished run.
  write_summary(new, runs[2].name, status="completed", step=300, num_steps=300,
                eval_loss=3.0, unigram_baseline=3.3)
  bench.save_ledger(ledger, runs[2:], new)
  with open(ledger) as f:
    assert set(json.load(f)) == {r.name for r in runs}


def test_a_ledger_entry_for_other_steps_does_not_count_as_finished(bench, tmp_path):
  # A ledger from 300-step runs does not finish a 600-step grid: the launcher runs it again.
  ledger = str(tmp_path / "grid.json")
  write_summary(str(tmp_path / "a"), "r", status="completed", step=300, num_steps=300)
  bench.save_ledger(ledger, [grid_run("r")], str(tmp_path / "a"))
  bench.restore_ledger(ledger, [grid_run("r", num_steps=600)], str(tmp_path / "b"))
  assert launcher.finished_state(grid_run("r", num_steps=600), str(tmp_path / "b" / "r")) is None
