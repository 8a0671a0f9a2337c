"""Reliability, fourth round (issue 62): the boundaries a hostile tester found (a model
shorter than the init's example input, a seed past int64, no evaluation split, the
stability search's flags, token ids outside the vocabulary), each refused in one line
before anything is written, or accepted and working.

The guard that keeps every command out of other runs' folders is tested in
tests/test_run_guard.py; the fuzzer that enumerates every key's boundaries in
tests/test_config_fuzz.py.
"""

import os

import numpy as np
import pytest

from configs import multi30k_de_en
from lnjax import tasks
from lnjax.core import build, errors, run as run_lib, state as state_lib, train
from lnjax.models import ModelConfig, TransformerLM
from conftest import run_command_lines
from test_train import REPO, smoke_config


@pytest.mark.slow  # Compiles the initialization.
def test_a_model_shorter_than_eight_positions_initializes():
  """model.max_len=2: the init's example input was 8 positions long (lnjax/tasks/lm.py), a
  length the model refuses. It is min(8, max_len) now; the parameters' shapes are the same."""
  config = smoke_config(**{"data.seq_len": 2, "model.max_len": 2})
  b = build.build(config, build.one_device_mesh(), whole_data=True, tasks=tasks.get)
  example, _ = state_lib.init_inputs(b.setup)
  assert example[0].shape == (1, 2)
  state = b.init_state()
  assert state.params["embed"]["positions"].shape[0] == 2


@pytest.mark.parametrize("seed, refused", [(0, False), (2**63 - 1, False), (2**63, True),
                                           (99999999999999999999, True), (-1, True)])
def test_the_seed_is_an_int64_refused_before_anything_is_written(tmp_path, seed, refused):
  """jax.random.key takes an int64: a larger seed was an OverflowError after the workdir
  and its checkpoints/ were made. Now the config's check refuses it, and nothing is written."""
  config = smoke_config()
  config.seed = seed
  if not refused:
    assert run_lib.resolve_config(config, tasks=tasks.get).seed == seed
    return
  wd = tmp_path / "run"
  with pytest.raises(errors.ConfigError, match=r"seed=.* in \[0, 9223372036854775807\]"):
    train.train_and_evaluate(config, str(wd), tasks=tasks.get)
  assert not wd.exists()


def test_translation_without_an_evaluation_split_is_refused_before_anything_is_written(
    tmp_path):
  """data.eval_splits=(): an IndexError (lnjax/tasks/translation.py) after config.json and
  checkpoints/ were written. The held-out loss needs a split: refused with the config."""
  config = multi30k_de_en.get_config("smoke")
  config.data.eval_splits = ()
  wd = tmp_path / "run"
  with pytest.raises(errors.ConfigError, match=r"data.eval_splits=\(\) must be a non-empty"):
    train.train_and_evaluate(config, str(wd), tasks=tasks.get)
  assert not wd.exists()


def test_the_fine_tuning_config_outside_its_driver_names_the_driver():
  """configs/glue.py's finetune section belongs to `lnjax finetune` (one run per seed from a
  pre-trained BERT run); `lnjax train` and `lnjax compile` said "unknown config key finetune"."""
  from configs import glue
  with pytest.raises(errors.ConfigError, match="finetune section is lnjax finetune's.*run "
                                               "`lnjax finetune"):
    run_lib.resolve_config(glue.get_config("smoke"), tasks=tasks.get)


def test_a_tasks_command_sections_are_refused_with_the_tasks_own_line():
  """The core names no task's config section: a task states the sections its configs hold
  for another command (Task.command_sections: glue's finetune, lnjax finetune's) with the
  line that refuses them in a run, and resolve_config refuses with that line (it named
  configs/glue.py's finetune section itself, a key of one task's in the core)."""
  import dataclasses

  import ml_collections
  from configs import lm
  line = "this config's probe section is lnjax probe's: run `lnjax probe --config=...`"
  task = dataclasses.replace(tasks.get("lm"), command_sections={"probe": line})
  config = lm.get_config("smoke")
  with config.unlocked():
    config.probe = ml_collections.ConfigDict({"depth": 1})
  with pytest.raises(errors.ConfigError) as refusal:
    run_lib.resolve_config(config, tasks=lambda name: task)
  assert str(refusal.value) == line
  with pytest.raises(errors.ConfigError, match="unknown config key probe"):  # Another task's.
    run_lib.resolve_config(config, tasks=tasks.get)
  assert set(tasks.get("glue").command_sections) == {"finetune"}


@pytest.mark.slow
def test_logits_refuses_ids_outside_the_vocabulary():
  """JAX clamps an out-of-range gather: run.logits([100000, -5]) gave logits of the last
  and first tokens without a word. A ValueError names the valid range now."""
  import jax

  from lnjax.api import Loaded

  cfg = ModelConfig(vocab_size=16, num_layers=1, d_model=8, num_heads=2, d_ff=16, max_len=8)
  model = TransformerLM(cfg)
  params = model.init(jax.random.key(0), np.zeros((1, 4), np.int32))["params"]
  run = Loaded(None, model, params, None, 0, "step0")
  for ids in ([100000, -5], [3, 16], [[1, 2], [-1, 0]]):
    with pytest.raises(ValueError, match=r"outside the vocabulary: ids must be in \[0, 15\]"):
      run.logits(ids)
  with pytest.raises(ValueError, match="must be integers"):
    run.logits([1.5, 2.0])
  assert run.logits([0, 15]).shape == (2, 16)


STABILITY_FLAGS = [
    ("--probe_steps=0", "--probe_steps=0: is invalid: must be an integer in [1, "),
    ("--range_steps=0", "--range_steps=0: is invalid: must be an integer in [2, "),
    ("--margin_nats=nan", "--margin_nats=nan: must be a number in (-inf, inf)"),
    ("--divergence_factor=-1", "--divergence_factor=-1.0: must be a number in [0.0, inf)")]


@pytest.mark.slow  # Four command lines (forked from the tests' warm process).
def test_the_stability_search_refuses_its_flags_boundaries(tmp_path):
  """--probe_steps=0 was read as unset (the config's steps), NaN and a negative factor were
  passed on to every run. One line, exit 2, and no workdir."""
  wd = tmp_path / "search"
  runs = run_command_lines([["lnjax.cli.stability", "--config=lm:smoke", f"--workdir={wd}", flag]
                            for flag, _ in STABILITY_FLAGS],
                           env=os.environ, cwd=REPO, timeout=300)
  for (flag, needle), (code, _, stderr) in zip(STABILITY_FLAGS, runs, strict=True):
    lines = stderr.strip().splitlines()
    assert code == 2 and len(lines) == 1, (flag, stderr[-2000:])
    assert lines[0].startswith("lnjax.cli.stability: error: ") and needle in lines[0], lines
  assert not wd.exists()
