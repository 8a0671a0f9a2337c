"""Translation end to end: a smoke Multi30k run, predict mode, BLEU."""

import json
import os
import sys

import pytest
import sacrebleu

from configs import multi30k_de_en
from conftest import assert_same_final_state
from lnjax import tasks
from lnjax.core import metrics, train
from lnjax.inference import evaluate
from lnjax.data import mt_builders
import forkserver
from quiet_runs import NO_HEALTH

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_bleu_of_references_against_themselves_is_100():
  refs = ["Two young, White males are outside near many bushes.", "A man in a blue shirt."]
  assert evaluate.bleu(refs, refs)["bleu"] == pytest.approx(100.0)
  assert evaluate.bleu(refs, refs, tokenize="none")["bleu"] == pytest.approx(100.0)
  assert evaluate.bleu(["A dog ."] * 2, refs)["bleu"] < 10


def test_bleu_refuses_a_count_mismatch():
  from lnjax.core import errors
  with pytest.raises(errors.LnjaxError, match="2 hypotheses for 1 references"):
    evaluate.bleu(["a", "b"], ["a"])


def smoke_config(num_steps: int = 30, bleu: bool = True):
  """configs/multi30k_de_en.py:smoke (Pre-LN, dropout, label smoothing), evaluated every 10
  steps, BLEU on the smallest split (a quick decode), the loss logged at every step. Steps
  21-29 run at 100x the learning rate (train.inject_fault): the model of step 30 decodes
  worse than step 20's (BLEU 0.0 against 0.017 on the fixture), so that the best checkpoint
  is not the latest. No train.health statistics (tests/quiet_runs.py)."""
  config = multi30k_de_en.get_config("smoke")
  with config.unlocked():
    config.train.health = NO_HEALTH
    config.mesh.data = 1
    config.train.num_steps = num_steps
    config.train.eval_every_steps = 10
    config.train.log_every_steps = 1
    config.decode.bleu_split = "test_2017_mscoco"
    config.decode.bleu_in_training = bleu
    config.train.inject_fault = "lr_spike:21:9:100"
  return config


@pytest.fixture(scope="module")
def smoke_run(tmp_path_factory):
  """30 steps, evaluated (with BLEU) at 10, 20 and 30; shared by the tests below."""
  wd = str(tmp_path_factory.mktemp("mt") / "run")
  return wd, train.train_and_evaluate(smoke_config(), wd, tasks=tasks.get)


def _bleu_by_step(wd):
  return {r["step"]: r["eval_bleu"] for r in metrics.read_metrics(wd) if "eval_bleu" in r}


@pytest.mark.slow
def test_smoke_translation_run_learns(smoke_run):
  wd, summary = smoke_run
  assert summary["status"] == "completed"
  losses = {r["step"]: r["train_loss"] for r in metrics.read_metrics(wd) if "train_loss" in r}
  assert losses[20] < losses[5] - 0.2, losses
  bleu = _bleu_by_step(wd)
  assert sorted(bleu) == [10, 20, 30] and summary["eval_bleu"] == bleu[30]
  assert summary["best_eval_bleu"] == max(bleu.values())
  best = max(bleu, key=lambda s: (bleu[s], -s))  # The first evaluation reaching the best.
  assert os.listdir(os.path.join(wd, "best_checkpoint")) == [str(best)]


@pytest.mark.slow
def test_translation_resume_reproduces_the_uninterrupted_run(smoke_run, tmp_path):
  """Stopped at step 20 and run again to 30 (no decoding, which does not touch the state):
  every step's loss (dropout, label smoothing, token-budget batches from the saved data
  position, the learning-rate spike of steps 21-29, all after the resume), the final state
  and the data position equal the uninterrupted run's. (Stopping at 20 rather than earlier
  leaves the resumed segment fewer batch shapes to compile.)"""
  full, _ = smoke_run
  parts = str(tmp_path / "parts")
  train.train_and_evaluate(smoke_config(20, bleu=False), parts, tasks=tasks.get)
  assert train.train_and_evaluate(smoke_config(30, bleu=False), parts,
                                  tasks=tasks.get)["status"] == "completed"
  losses = lambda wd: {r["step"]: r["train_loss"] for r in metrics.read_metrics(wd)
                       if "train_loss" in r}
  a, b = losses(full), losses(parts)
  assert [a[s] for s in range(1, 31)] == [b[s] for s in range(1, 31)]
  assert_same_final_state(full, parts)


def _predict(wd, *args):
  """--mode=predict on one CPU device (not conftest's 8), as the run trained and decoded."""
  env = {**os.environ, "XLA_FLAGS": " ".join(
      f for f in os.environ.get("XLA_FLAGS", "").split()
      if not f.startswith("--xla_force_host_platform_device_count"))}
  r = forkserver.run([sys.executable, "-m", "lnjax.main", "--mode=predict", f"--workdir={wd}",
                      "--split=test_2017_mscoco", *args],
                     cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
  assert r.returncode == 0, r.stderr[-2000:]
  assert "test_2017_mscoco: BLEU" in r.stdout
  return r


@pytest.mark.slow
def test_predict_mode_writes_and_scores_hypotheses(smoke_run):
  """By default the best checkpoint (by BLEU), here not the latest; --checkpoint=latest the
  latest. Each scores what the training's evaluation of that step scored, and the score is
  sacreBLEU's of the written file."""
  wd, _ = smoke_run
  bleu = _bleu_by_step(wd)
  best = max(bleu, key=lambda s: (bleu[s], -s))
  assert best == 20, ("the test needs a best checkpoint that is not the latest", bleu)
  _predict(wd)
  _predict(wd, "--checkpoint=latest")
  refs = mt_builders.load_split_pairs(mt_builders.prepare("multi30k_de_en"),
                                     "test_2017_mscoco")[1]
  for step, checkpoint_name in ((20, "best"), (30, "latest")):
    result = json.load(open(os.path.join(wd, "predictions", f"test_2017_mscoco.step{step}.json")))
    assert (result["step"], result["checkpoint"]) == (step, checkpoint_name)
    assert result["bleu"] == pytest.approx(bleu[step], abs=1e-6)
    hyps = open(result["hypotheses_file"]).read().splitlines()
    assert len(hyps) == len(refs) == 100  # the fixture's first 100 sentences
    # The score is what sacreBLEU gives the written file against the references.
    assert sacrebleu.corpus_bleu(hyps, [refs]).score == pytest.approx(result["bleu"], abs=1e-6)
