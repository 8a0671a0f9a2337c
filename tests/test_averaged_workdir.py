"""An averaged workdir (python -m lnjax.cli.average) works with every tool's default
checkpoint: translate, --mode=predict, analyze and export, no --checkpoint needed."""

import os

import pytest

from configs import multi30k_de_en
from lnjax import tasks
from lnjax.core import averaging, train
from lnjax.inference import predict, translate


@pytest.mark.slow
def test_tools_default_checkpoint_on_an_averaged_workdir(tmp_path):
  config = multi30k_de_en.get_config("smoke")
  with config.unlocked():
    config.mesh.data = 1
    config.decode.bleu_in_training = False  # No best_checkpoint/ in the run either.
    # Two checkpoints (steps 1 and 2) to average. Seed 1: both steps' batches in one length
    # bucket, one train step to compile (seed 0's two shapes: two); no health statistics (their
    # forward pass is one more program). Train CPU 9.8 s -> 5.7 s.
    config.train.num_steps, config.train.checkpoint_every_steps = 2, 1
    config.train.eval_every_steps = config.train.log_every_steps = 2
    config.seed, config.train.health = 1, "off"
  run, avg = str(tmp_path / "run"), str(tmp_path / "run_avg2")
  assert train.train_and_evaluate(config, run, tasks=tasks.get)["status"] == "completed"
  assert averaging.write_average(run, 2, avg, tasks=tasks.get)["steps"] == [1, 2]
  assert not os.path.exists(os.path.join(avg, "best_checkpoint"))

  chosen = averaging.restore(avg, tasks=tasks.get)  # 'latest' and 'best' are its one checkpoint.
  assert (chosen.steps, averaging.restore(avg, "best", tasks=tasks.get).steps) == ([2], [2])
  result = translate.translate_run(avg, ["Ein Hund läuft.", "Zwei Männer."])  # default: best
  assert result["checkpoint"] == "best" and result["steps"] == [2]
  assert len(result["hypotheses"]) == 2
  # --mode=predict's default (lnjax.main's --checkpoint=best) is predict.predict's.
  written = predict.predict(avg, "test_2017_mscoco")
  assert (written["checkpoint"], written["steps"]) == ("best", [2])
  assert os.path.isfile(os.path.join(avg, "predictions", "test_2017_mscoco.step2.hyp"))
