"""Translation end to end: a smoke Multi30k run, predict mode, BLEU."""

import json
import os
import subprocess
import sys

import pytest
import sacrebleu

from configs import multi30k_de_en
from lnjax import evaluate, metrics, train
from lnjax.data import mt_builders

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_bleu_of_references_against_themselves_is_100():
  refs = ["Two young, White males are outside near many bushes.", "A man in a blue shirt."]
  assert evaluate.bleu(refs, refs)["bleu"] == pytest.approx(100.0)
  assert evaluate.bleu(refs, refs, tokenize="none")["bleu"] == pytest.approx(100.0)
  assert evaluate.bleu(["A dog ."] * 2, refs)["bleu"] < 10


def test_bleu_refuses_a_count_mismatch():
  from lnjax import errors
  with pytest.raises(errors.LnjaxError, match="2 hypotheses for 1 references"):
    evaluate.bleu(["a", "b"], ["a"])


@pytest.fixture(scope="module")
def smoke_run(tmp_path_factory):
  wd = str(tmp_path_factory.mktemp("mt") / "run")
  config = multi30k_de_en.get_config("smoke")
  with config.unlocked():
    config.mesh.data = 1
    config.train.num_steps = 30
    config.train.eval_every_steps = 30
    config.decode.bleu_split = "test_2017_mscoco"  # The smallest split: a quick decode.
  summary = train.train_and_evaluate(config, wd)
  return wd, summary


def test_smoke_translation_run_learns(smoke_run):
  wd, summary = smoke_run
  assert summary["status"] == "completed"
  losses = {r["step"]: r["train_loss"] for r in metrics.read_metrics(wd) if "train_loss" in r}
  assert losses[30] < losses[5] - 0.2, losses
  assert summary["eval_bleu"] is not None and summary["best_eval_bleu"] >= summary["eval_bleu"]
  assert os.listdir(os.path.join(wd, "best_checkpoint")) == ["30"]


def test_predict_mode_writes_and_scores_hypotheses(smoke_run):
  wd, _ = smoke_run
  r = subprocess.run([sys.executable, "-m", "lnjax.main", "--mode=predict", f"--workdir={wd}",
                      "--split=test_2017_mscoco", "--checkpoint=latest"],
                     cwd=REPO, capture_output=True, text=True, timeout=300)
  assert r.returncode == 0, r.stderr[-2000:]
  assert "test_2017_mscoco: BLEU" in r.stdout
  result = json.load(open(os.path.join(wd, "predictions", "test_2017_mscoco.step30.json")))
  hyps = open(result["hypotheses_file"]).read().splitlines()
  assert len(hyps) == 461
  # The score is what sacreBLEU gives the written file against the references.
  refs = mt_builders.load_split_pairs(mt_builders.prepare("multi30k_de_en"),
                                     "test_2017_mscoco")[1]
  assert sacrebleu.corpus_bleu(hyps, [refs]).score == pytest.approx(result["bleu"], abs=1e-6)
