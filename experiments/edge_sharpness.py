r"""Sharpness as a predictor of the edge (issue 61): for each (placement, depth) of the
atlas, the feature run's 20 steps at 1e-3 (lnjax/sweep/predict.py feature_config), then at
its last checkpoint the Hessian's largest eigenvalue, raw and preconditioned by Adam's
second moment (lnjax/analysis/sharpness.py), on held-out batches. Adam's stability
threshold (Cohen et al., arXiv 2207.14484) turns the preconditioned one into a rate,
38/λ_max(P⁻¹H) at β₁ = 0.9, set beside the atlas's searched edge.

  nice -n 10 python experiments/edge_sharpness.py --depths=6 --workdir=/tmp/sharp
  python experiments/edge_sharpness.py --report_only   # the table and figure from the file

Entries go to experiments/edge_predictor/sharpness.json (resumable: a finished entry is
never measured again); the report to experiments/edge_predictor/sharpness.md and .png.
"""

import json
import os
import time

from absl import app, flags

import lnjax
from lnjax import models
from lnjax.sweep import predict

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(REPO, "experiments", "edge_predictor", "sharpness.json")

_WORKDIR = flags.DEFINE_string("workdir", "/tmp/lnjax_edge_sharpness", "The runs' folders.")
_PLACEMENTS = flags.DEFINE_list("placements", list(models.NORM_POSITIONS[:14]), "Placements.")
_DEPTHS = flags.DEFINE_list("depths", ["6", "12", "24"], "Depths.")
_BATCHES = flags.DEFINE_integer("batches", 2, "Held-out batches the loss is averaged over.")
_ITERS = flags.DEFINE_integer("iters", 20, "Power iterations for each eigenvalue.")
_REPORT_ONLY = flags.DEFINE_bool("report_only", False, "Only the report from the file.")


def measure(placement: str, depth: int, workdir: str) -> dict:
  from lnjax import tasks
  from lnjax.analysis import probes, sharpness
  from lnjax.core import build, checkpoint

  config = predict.feature_config(lnjax.get_config("lm", "size=small"), placement, depth)
  config.data.batch_size = 16  # The atlas's.
  t0 = time.perf_counter()
  summary = lnjax.train(config, workdir)
  if summary.get("status") != "completed":
    return {"status": summary.get("status")}
  restored = checkpoint.restore_run(workdir, tasks=tasks.get)
  built = build.build(restored.config, build.one_device_mesh(), tasks=tasks.get, whole_data=True)
  batches = built.eval_batches(_BATCHES.value)
  params, opt = restored.state.params, restored.run.opt
  loss = lambda p: probes.mean_loss(p, restored.setup, batches)  # noqa: E731
  raw, raw_q = sharpness.hessian_top(loss, params, iters=_ITERS.value)
  precond = sharpness.adam_precond(restored.state.opt_state, int(restored.state.step),
                                   opt.b2, opt.eps)
  pre, pre_q = sharpness.hessian_top(loss, params, precond=precond, iters=_ITERS.value)
  return {"status": "completed", "step": int(restored.state.step), "sharpness": raw,
          "precond_sharpness": pre, "adam_edge": sharpness.adam_edge(pre, opt.b1),
          "estimates": raw_q, "precond_estimates": pre_q,
          "seconds": round(time.perf_counter() - t0, 1)}


def report(table: dict) -> None:
  import numpy as np
  from scipy import stats

  import edge_predictor  # (beside this script: the atlas's searched cells)

  atlas = {k: c["highest_stable_lr"] for k, c in edge_predictor.atlas_cells().items()}
  rows, lines = [], ["| placement | layers | λ_max(H) | λ_max(P⁻¹H) | 38/λ | searched edge, "
                     "warm-up 0 | searched / 38/λ |", "|---|---:|---:|---:|---:|---:|---:|"]
  for key, e in sorted(table.items(), key=lambda kv: (int(kv[0].split("/")[1]), kv[0])):
    placement, depth = key.split("/")
    edge = atlas.get((placement, int(depth), 0))
    if e.get("status") != "completed":
      lines.append(f"| {placement} | {depth} | {e.get('status')} | | | | |")
      continue
    ratio = f"{edge / e['adam_edge']:.2f}" if edge else "—"
    lines.append(f"| {placement} | {depth} | {e['sharpness']:.3g} | {e['precond_sharpness']:.3g}"
                 f" | {e['adam_edge']:.3g} | {edge if edge else '—'} | {ratio} |")
    if edge:
      rows.append((e["adam_edge"], edge))
  if len(rows) >= 3:
    pred, got = np.log10(np.array(rows)).T
    rho = stats.spearmanr(pred, got).statistic
    lines.append(f"\nSpearman's rank correlation of 38/λ and the searched edge: {rho:.2f} "
                 f"({len(rows)} cells)")
  text = "\n".join(lines)
  print(text)


def main(argv):
  del argv
  table = json.load(open(OUT)) if os.path.exists(OUT) else {}
  if not _REPORT_ONLY.value:
    for depth in map(int, _DEPTHS.value):
      for placement in _PLACEMENTS.value:
        key = f"{placement}/{depth}"
        if key in table:
          continue
        table[key] = measure(placement, depth, os.path.join(_WORKDIR.value, f"{placement}_d{depth}"))
        with open(OUT + ".tmp", "w") as f:
          json.dump(table, f)
        os.replace(OUT + ".tmp", OUT)
        print(f"{key}: {table[key].get('adam_edge')} ({table[key].get('seconds')} s)", flush=True)
  report(table)


if __name__ == "__main__":
  app.run(main)
