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

import numpy as np
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
_ITERS = flags.DEFINE_integer("iters", 20, "Lanczos iterations for each eigenvalue.",
                              lower_bound=1)
_REPORT_ONLY = flags.DEFINE_bool("report_only", False, "Only the report from the file.")


def measure(placement: str, depth: int, workdir: str) -> dict:
  from lnjax.analysis import report as analysis

  config = predict.feature_config(lnjax.get_config("lm", "size=small"), placement, depth)
  config.data.batch_size = 16  # The atlas's.
  t0 = time.perf_counter()
  summary = lnjax.train(config, workdir)
  if summary.get("status") != "completed":
    return {"status": summary.get("status")}
  built, params, label, trained = analysis.load(workdir, "latest")  # `lnjax analyze`'s.
  sharp = analysis.sharpness(built, params, trained, built.eval_batches(_BATCHES.value),
                             _ITERS.value)
  return {"status": "completed", "step": int(label), "sharpness": sharp["hessian_top"],
          "preconditioner": "(1 - b1^t)(sqrt(v_hat) + eps)",
          "precond_sharpness": sharp["adam_top"], "adam_edge": sharp["adam_edge"],
          "estimates": sharp["hessian_estimates"], "precond_estimates": sharp["adam_estimates"],
          "seconds": round(time.perf_counter() - t0, 1)}


def report(table: dict) -> str:
  """The table (each cell's sharpness beside its searched edge), Spearman's rank
  correlation of Adam's edge with the searched one by depth, and the figure."""
  import datetime

  from scipy import stats

  import edge_predictor  # (beside this script: the atlas's searched cells)

  atlas = {k: c for k, c in edge_predictor.atlas_cells().items()}
  date = datetime.date.today().isoformat()
  lines = ["# Sharpness at step 20 against the searched edge", "",
           f"`python experiments/edge_sharpness.py` ({date}): each (placement, depth) of the "
           "2020 atlas trained 20 steps at 1e-3 (the predictor's feature run), then the "
           "largest eigenvalue of the Hessian H and of P⁻¹H (P: Adam's (1 − β₁ᵗ)(√v̂ + ε)) on "
           f"{_BATCHES.value} held-out batches by {_ITERS.value} Lanczos iterations "
           "(lnjax/analysis/sharpness.py). Adam's edge: 38/λ_max(P⁻¹H), the rate at Adam's "
           "stability threshold (Cohen et al., arXiv 2207.14484). Searched: the atlas's "
           "highest stable rate without warm-up (300-step probes, experiments/atlas).", "",
           "| placement | layers | λ_max(H) | λ_max(P⁻¹H) | Adam's edge 38/λ | searched | "
           "searched / Adam's |", "|---|---:|---:|---:|---:|---:|---:|"]
  pairs: dict[int, list] = {}
  for key, e in sorted(table.items(), key=lambda kv: (int(kv[0].split("/")[1]), kv[0])):
    placement, depth = key.split("/")
    cell = atlas.get((placement, int(depth), 0), {})
    edge = cell.get("highest_stable_lr")
    if e.get("status") != "completed":
      lines.append(f"| {placement} | {depth} | {e.get('status')} | | | | |")
      continue
    searched = f"{edge:.3g}" if edge else f"< {cell['lowest_unstable_lr']:.3g}" if cell else "—"
    ratio = f"{edge / e['adam_edge']:.2f}" if edge else "—"
    lines.append(f"| {placement} | {depth} | {e['sharpness']:.3g} | "
                 f"{e['precond_sharpness']:.3g} | {e['adam_edge']:.3g} | {searched} | {ratio} |")
    if edge:
      pairs.setdefault(int(depth), []).append((placement, e["adam_edge"], edge))
  lines.append("")
  every = [p for d in pairs.values() for p in d]
  for label, group in [*((f"{d} layers", pairs[d]) for d in sorted(pairs)), ("all", every)]:
    if len(group) >= 3:
      _, pred, got = zip(*group)
      ratio = np.log10(np.array(got) / np.array(pred))
      rho = stats.spearmanr(pred, got).statistic
      lines.append(f"- {label}: Spearman's rank correlation {rho:.2f}"
                   f" over {len(group)} cells; searched / Adam's edge from "
                   f"{10 ** ratio.min():.2f} to {10 ** ratio.max():.2f} (median "
                   f"{10 ** np.median(ratio):.2f})")
  _figure(pairs, date)
  return "\n".join(lines) + "\n"


def _figure(pairs: dict, date: str) -> None:
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  fig, ax = plt.subplots(figsize=(6.2, 5.6))
  line = [1e-4, 1.0]
  ax.plot(line, line, color="k", lw=1, label="searched = Adam's edge")
  markers = {6: "o", 12: "s", 24: "^"}
  for depth, group in sorted(pairs.items()):
    for placement, pred, got in group:
      color = plt.get_cmap("tab20")(models.NORM_POSITIONS.index(placement) % 20)
      ax.scatter(pred, got, marker=markers.get(depth, "o"), s=30, color=color, edgecolor="k",
                 linewidth=0.4)
      ax.annotate(placement, (pred, got), fontsize=6, xytext=(3, 2), textcoords="offset points")
  for depth, m in markers.items():
    if depth in pairs:
      ax.scatter([], [], marker=m, color="0.5", label=f"{depth} layers")
  ax.set(xscale="log", yscale="log", xlim=(1e-4, 1.0), ylim=(1e-4, 1.0),
         xlabel="Adam's edge at step 20: 38 / λ_max(P⁻¹H)",
         ylabel="searched highest stable lr, no warm-up (experiments/atlas)")
  ax.legend(fontsize=7, loc="upper left")
  ax.set_title(f"python experiments/edge_sharpness.py ({date})", fontsize=9)
  fig.tight_layout()
  fig.savefig(OUT.replace(".json", ".png"), dpi=120)
  plt.close(fig)


def main(argv):
  del argv
  table = json.load(open(OUT)) if os.path.exists(OUT) else {}
  if not _REPORT_ONLY.value:
    for depth in map(int, _DEPTHS.value):
      for placement in _PLACEMENTS.value:
        key = f"{placement}/{depth}"
        if key in table:
          continue
        workdir = os.path.join(_WORKDIR.value, f"{placement}_d{depth}")
        table[key] = measure(placement, depth, workdir)
        with open(OUT + ".tmp", "w") as f:
          json.dump(table, f)
        os.replace(OUT + ".tmp", OUT)
        print(f"{key}: {table[key].get('adam_edge')} ({table[key].get('seconds')} s)", flush=True)
  text = report(table)
  with open(OUT.replace(".json", ".md"), "w") as f:
    f.write(text)
  print(text)


if __name__ == "__main__":
  app.run(main)
