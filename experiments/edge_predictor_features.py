r"""The early-step features of the atlas's cells (issue 61): for each (placement, depth) of
experiments/atlas, a run of --steps steps at the reference rate --lr (no warm-up) of the
atlas's model (configs/lm.py:size=small, batches of 16) with train.health=log at every
step, kept as a compact record in experiments/edge_predictor/features.json (one entry per
(placement, depth): resumable, a finished entry is never run again).

  nice -n 19 python experiments/edge_predictor_features.py --workdir=/tmp/edge_features
  python experiments/edge_predictor_features.py --placements=pre --depths=6   # one entry

One range of steps serves both warm-ups of a (placement, depth): the predictor reads the
warm-up as an input (lnjax/sweep/predict.py).
"""

import json
import os
import sys
import time

from absl import app, flags

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(1, REPO)

import lnjax  # noqa: E402
from lnjax import models  # noqa: E402
from lnjax.sweep import predict  # noqa: E402

_WORKDIR = flags.DEFINE_string("workdir", "/tmp/lnjax_edge_features", "The runs' folders.")
_OUT = flags.DEFINE_string("out", os.path.join(REPO, "experiments", "edge_predictor",
                                               "features.json"), "The features' file.")
_PLACEMENTS = flags.DEFINE_list("placements", list(models.NORM_POSITIONS), "Placements.")
_DEPTHS = flags.DEFINE_list("depths", ["6", "12", "24"], "Depths.")
_STEPS = flags.DEFINE_integer("steps", predict.STEPS, "Steps of each run.")
_LR = flags.DEFINE_float("lr", predict.REFERENCE_LR, "The reference learning rate.")
_CONFIG = flags.DEFINE_string("config", "lm:size=small", "The config (name:presets).")


def main(argv):
  del argv
  table = json.load(open(_OUT.value)) if os.path.exists(_OUT.value) else {}
  for depth in map(int, _DEPTHS.value):
    for placement in _PLACEMENTS.value:
      key = f"{placement}/{depth}"
      if key in table:
        continue
      name, _, preset = _CONFIG.value.partition(":")
      config = predict.feature_config(lnjax.get_config(name, preset), placement, depth,
                                      _STEPS.value, _LR.value)
      workdir = os.path.join(_WORKDIR.value, key.replace("/", "_d"))
      t0 = time.perf_counter()
      lnjax.train(config, workdir)
      record = predict.read_run(workdir)
      record["seconds"] = round(time.perf_counter() - t0, 1)
      table[key] = record
      with open(_OUT.value + ".tmp", "w") as f:
        json.dump(table, f)
      os.replace(_OUT.value + ".tmp", _OUT.value)
      print(f"{key}: {record['seconds']} s", flush=True)


if __name__ == "__main__":
  app.run(main)
