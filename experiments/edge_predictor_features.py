r"""The early-step features of the atlas's cells (issue 61): for each (placement, depth) of
experiments/atlas, a run of --steps steps at the reference rate --lr (no warm-up) of the
atlas's model (configs/lm.py:size=small, batches of 16) with train.health=log at every
step, kept as a compact record in experiments/edge_predictor/features.json (one entry per
(placement, depth): resumable, a finished entry is never run again).

  nice -n 19 python experiments/edge_predictor_features.py --workdir=/tmp/edge_features
  python experiments/edge_predictor_features.py --placements=pre --depths=6   # one entry
  nice -n 10 python experiments/edge_predictor_features.py --depths=6 --lr=0.01
      # the second runs, at ten times the rate: features_lr0.01.json
  nice -n 19 python experiments/edge_predictor_features.py --block=modern --depths=12
      # the modern block's (RoPE, SwiGLU, RMSNorm, no biases): features_modern.json, read by
      # experiments/atlas.py --block=modern for the placements that move between blocks

One range of steps serves both warm-ups of a (placement, depth): the predictor reads the
warm-up as an input (lnjax/sweep/predict.py).
"""

import json
import os
import time

from absl import app, flags

import lnjax
from lnjax import models
from lnjax.sweep import predict

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

_WORKDIR = flags.DEFINE_string("workdir", "/tmp/lnjax_edge_features", "The runs' folders.")
_OUT = flags.DEFINE_string("out", None, "The features' file (default: experiments/"
                           "edge_predictor/features.json, features_modern.json; at another "
                           "--lr, features_lr<lr>.json, features_modern_lr<lr>.json).")
_BLOCK = flags.DEFINE_enum("block", "2020", ["2020", "modern"], "The block (as "
                           "experiments/atlas.py's --block).")
# The modern block's keys (experiments/atlas.py MODERN).
MODERN = {"pos_emb": "rope", "activation": "silu", "gated_ffn": True, "norm_kind": "rmsnorm",
          "use_bias": False}
_PLACEMENTS = flags.DEFINE_list("placements", None, "Placements (default: the atlas's: the "
                                 "2020 block's 14, every placement on the modern block).")
_DEPTHS = flags.DEFINE_list("depths", ["6", "12", "24"], "Depths.")
_STEPS = flags.DEFINE_integer("steps", predict.STEPS, "Steps of each run.")
_LR = flags.DEFINE_float("lr", predict.REFERENCE_LR, "The reference learning rate.")
_CONFIG = flags.DEFINE_string("config", "lm:size=small", "The config (name:presets).")


def main(argv):
  del argv
  name = "features" if _BLOCK.value == "2020" else "features_modern"
  if _LR.value != predict.REFERENCE_LR:
    name += f"_lr{_LR.value:g}"
  out = _OUT.value or os.path.join(REPO, "experiments", "edge_predictor", f"{name}.json")
  table = json.load(open(out)) if os.path.exists(out) else {}
  placements = _PLACEMENTS.value or list(
      models.NORM_POSITIONS[:14] if _BLOCK.value == "2020" else models.NORM_POSITIONS)
  for depth in map(int, _DEPTHS.value):
    for placement in placements:
      key = f"{placement}/{depth}"
      if key in table:
        continue
      name, _, preset = _CONFIG.value.partition(":")
      config = predict.feature_config(lnjax.get_config(name, preset), placement, depth,
                                      _STEPS.value, _LR.value)
      config.data.batch_size = 16  # The atlas's.
      if _BLOCK.value == "modern":
        for name_, value in MODERN.items():
          config.model[name_] = value
      workdir = os.path.join(_WORKDIR.value, _BLOCK.value + (
          "" if _LR.value == predict.REFERENCE_LR else f"_lr{_LR.value:g}"), key.replace("/", "_d"))
      t0 = time.perf_counter()
      summary = lnjax.train(config, workdir)
      if summary.get("status") not in ("completed", "diverged"):  # Stopped: not a record.
        print(f"{key}: {summary.get('status')}, not recorded", flush=True)
        return
      record = predict.read_run(workdir)
      record["seconds"] = round(time.perf_counter() - t0, 1)
      table[key] = record
      with open(out + ".tmp", "w") as f:
        json.dump(table, f)
      os.replace(out + ".tmp", out)
      print(f"{key}: {record['seconds']} s", flush=True)


if __name__ == "__main__":
  app.run(main)
