"""An averaged workdir (python -m lnjax.averaging) works with every tool's default
checkpoint: translate, --mode=predict, analyze and export, no --checkpoint needed."""

import json
import os
import subprocess
import sys

import pytest

from configs import multi30k_de_en
from lnjax import averaging, train, translate

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.slow
def test_tools_default_checkpoint_on_an_averaged_workdir(tmp_path):
  config = multi30k_de_en.get_config("smoke")
  with config.unlocked():
    config.mesh.data = 1
    config.decode.bleu_in_training = False  # No best_checkpoint/ in the run either.
  run, avg = str(tmp_path / "run"), str(tmp_path / "run_avg2")
  assert train.train_and_evaluate(config, run)["status"] == "completed"
  assert averaging.write_average(run, 2, avg)["steps"] == [10, 20]
  assert not os.path.exists(os.path.join(avg, "best_checkpoint"))

  chosen = averaging.restore(avg)  # 'latest' and 'best' are its one checkpoint.
  assert (chosen.steps, averaging.restore(avg, "best").steps) == ([20], [20])
  result = translate.translate_run(avg, ["Ein Hund läuft.", "Zwei Männer."])  # default: best
  assert result["checkpoint"] == "best" and result["steps"] == [20]
  assert len(result["hypotheses"]) == 2

  env = {**os.environ, "PYTHONPATH": REPO}
  r = subprocess.run([sys.executable, "-m", "lnjax.main", "--mode=predict", f"--workdir={avg}",
                      "--split=test_2017_mscoco"], cwd=tmp_path, env=env, capture_output=True,
                     text=True, timeout=600)
  assert r.returncode == 0, r.stderr[-2000:]
  written = json.load(open(os.path.join(avg, "predictions", "test_2017_mscoco.step20.json")))
  assert (written["checkpoint"], written["steps"]) == ("best", [20])
