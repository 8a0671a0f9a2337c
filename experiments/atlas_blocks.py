"""The atlas on both blocks (issue 61): every placement's 12-layer edge on the 2020 block
and on the modern one (RoPE, SwiGLU, RMSNorm, no biases), Spearman's rank correlation
between the two columns, the placements that move more than two search steps with the
health statistics of their first steps beside them, and the figure of both side by side.
Used by experiments/atlas.py --block=modern."""

import json
import math
import os

import numpy as np

from lnjax import models
from lnjax.analysis import plotting
from lnjax.sweep import predict

HERE = os.path.dirname(os.path.abspath(__file__))
FEATURES = {"2020": os.path.join(HERE, "edge_predictor", "features.json"),
            "modern": os.path.join(HERE, "edge_predictor", "features_modern.json")}
STEP = 2.0  # One search step: the atlas's --tolerance (its brackets end within 2×).
DEPTH = 12
# The health statistics read for a placement that moves (lnjax/sweep/predict.py features).
WHY = {"init_last_grad": "the last layer's gradient RMS at initialization",
       "init_first_share": "layer 0's share of the gradient at initialization",
       "end_first_share": "layer 0's share of the gradient after 20 steps",
       "grad_growth": "the gradient's growth over 20 steps",
       "logit_growth": "the largest attention logit's growth over 20 steps",
       "output_logit_growth": "the output logits' growth over 20 steps",
       "update_per_lr": "Adam's update RMS per unit of rate",
       "residual_growth": "the last layer's residual RMS growth"}


def edge(cell: dict | None) -> float | None:
  """A cell's edge for ranking: its highest stable rate; half its lowest unstable rate where
  no rate was stable (below every rate tried)."""
  if cell is None:
    return None
  low, high = cell["highest_stable_lr"], cell["lowest_unstable_lr"]
  return low if low is not None else (high / 2 if high is not None else None)


def ranks(x: np.ndarray) -> np.ndarray:
  """Ranks 1..n, ties given their mean rank."""
  order = np.argsort(x, kind="stable")
  r = np.empty(len(x))
  r[order] = np.arange(1, len(x) + 1)
  for v in np.unique(x):
    r[x == v] = r[x == v].mean()
  return r


def spearman(a, b) -> float:
  """Spearman's rank correlation: Pearson's correlation of the ranks."""
  ra, rb = ranks(np.asarray(a, float)), ranks(np.asarray(b, float))
  return float(np.corrcoef(ra, rb)[0, 1])


def _features(block: str) -> dict:
  if not os.path.exists(FEATURES[block]):
    return {}
  with open(FEATURES[block]) as f:
    return json.load(f)


def why(placement: str) -> str:
  """The health statistic of the first steps that changes most between the blocks (log10;
  a correlate, not a cause: the feature runs are the same 20 steps at lr 1e-3 without
  warm-up on both blocks, for either warm-up's cell)."""
  older, newer = _features("2020"), _features("modern")
  key = f"{placement}/{DEPTH}"
  if key not in older or key not in newer:
    return "no feature run of both blocks yet (experiments/edge_predictor_features.py)"
  a = predict.features(older[key], DEPTH, 0)
  b = predict.features(newer[key], DEPTH, 0)
  name = max(WHY, key=lambda n: abs(b[n] - a[n]))
  return (f"{WHY[name]}: 10^{a[name]:.2f} on the 2020 block, 10^{b[name]:.2f} on the "
          "modern one (of its first steps' health statistics, the one that changes most: a "
          "correlate)")


def _bracket_steps(older: dict, newer: dict) -> tuple[float, float | None]:
  """How far the edge moved, in search steps, as far as both cells' brackets tell it: the
  edge lies in [highest stable, lowest unstable) (below the lowest unstable where none was
  stable); (least, most) in absolute steps, most None when unbounded."""
  def bracket(c):
    return c["highest_stable_lr"], c["lowest_unstable_lr"]
  (a0, a1), (b0, b1) = bracket(older), bracket(newer)
  log = lambda x: math.log(x) / math.log(STEP)
  up = (b0 or 0) >= (a0 or 0)  # The direction of the point estimates.
  if up:  # Least: the modern low end over the 2020 high end; most: the reverse.
    least = log(b0 / a1) if b0 and a1 else 0.0
    most = log(b1 / a0) if b1 and a0 else None
  else:
    least = log(a0 / b1) if a0 and b1 else 0.0
    most = log(a1 / b0) if a1 and b0 else None
  return max(least, 0.0), most


def comparison(older: dict, newer: dict, warmups=(0, 500),
               pending: tuple[dict, dict] = ({}, {})) -> list[str]:
  """Markdown: per placement and warm-up both blocks' edges and their ratio; Spearman's rank
  correlation per warm-up over the placements measured on both; the placements that move
  more than two search steps, which way, and the statistic that changed most. `pending`:
  each block's cells still searching, as the words their rows show (else 'not yet')."""
  out = [f"## Both blocks, {DEPTH} layers", "",
         "| placement | warm-up | 2020 block | modern block | modern / 2020 | search steps |",
         "|---|---:|---:|---:|---:|---:|"]
  moved, correlations = [], []
  for w in warmups:
    pairs = []
    for p in models.NORM_POSITIONS:
      a, b = edge(older.get((p, DEPTH, w))), edge(newer.get((p, DEPTH, w)))
      cells = older.get((p, DEPTH, w)), newer.get((p, DEPTH, w))
      fmt = lambda v, cell, i: (pending[i].get((p, DEPTH, w), "not yet") if v is None
                                else f"{v:.3g}" if cell["highest_stable_lr"] is not None
                                else f"< {cell['lowest_unstable_lr']:.3g}")
      # Where one block has no stable rate its edge is a bound: the ratio is bounded by its
      # lowest unstable rate (the halved one only ranks it); two bounds give no ratio.
      bounded = [c is not None and c["highest_stable_lr"] is None for c in cells]
      ratio = None
      if a and b and not all(bounded):
        ratio = (b if not bounded[1] else cells[1]["lowest_unstable_lr"]) / (
            a if not bounded[0] else cells[0]["lowest_unstable_lr"])
      steps = math.log(ratio) / math.log(STEP) if ratio else None
      sign = "> " if bounded[0] else "< " if bounded[1] else ""
      out.append(f"| {plotting.placement_label(p)} | {w} | {fmt(a, cells[0], 0)} | "
                 f"{fmt(b, cells[1], 1)} | "
                 + (f"{sign}{ratio:.2g}× | {sign}{steps:+.1f} |" if steps is not None
                    else "— | — |"))
      if a and b:
        pairs.append((a, b))
      if steps is not None and abs(steps) > 2:
        moved.append((p, w, steps, _bracket_steps(*cells)))
    if len(pairs) >= 3:
      rho = spearman(*zip(*pairs))
      correlations.append(f"warm-up {w}: Spearman's rank correlation {rho:.2f} over "
                          f"{len(pairs)} placements")
    else:
      correlations.append(f"warm-up {w}: {len(pairs)} placement(s) measured on both blocks, "
                          "too few for a rank correlation")
  out += ["", "Rank correlation of the two columns: " + "; ".join(correlations) + ".", ""]
  out.append("Placements that move more than two search steps (a step: the search's 2× "
             "tolerance):" if moved else "No placement measured on both blocks moves more "
             "than two search steps (a step: the search's 2× tolerance) so far.")
  for p, w, steps, (low, high) in moved:
    by = (f"{abs(steps):.1f} steps (from the brackets, {low:.1f} to {high:.1f})"
          if high is not None else f"more than {low:.1f} steps (a bound: no stable rate)")
    out.append(f"- {plotting.placement_label(p)}, warm-up {w}: "
               f"{'higher' if steps > 0 else 'lower'} on the modern block by {by}; {why(p)}")
  return out


def figure(path: str, older: dict, newer: dict, warmups=(0, 500),
           made: str = "python experiments/atlas.py --block=modern") -> None:
  """Both blocks' 12-layer edges side by side: a panel per warm-up, a placement per row;
  `made`: the command and date in its title."""
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  names = list(models.NORM_POSITIONS)
  fig, axes = plt.subplots(1, len(warmups), figsize=(5 * len(warmups), 0.35 * len(names) + 1.5),
                           sharey=True, sharex=True)
  for ax, w in zip(np.atleast_1d(axes), warmups):
    for offset, cells, label, color in ((-0.15, older, "2020 block", "tab:blue"),
                                        (0.15, newer, "modern block", "tab:orange")):
      for i, p in enumerate(names):
        cell = cells.get((p, DEPTH, w))
        if edge(cell) is None:
          continue
        bound = cell["highest_stable_lr"] is None  # No stable rate: hollow, at half the lowest.
        ax.scatter(edge(cell), i + offset, color="none" if bound else color, edgecolor=color,
                   s=25, marker="<" if bound else "o")
      ax.scatter([], [], color=color, label=label)
    ax.set_xscale("log")
    ax.set_title(f"{DEPTH} layers, warm-up {w}")
    ax.set_xlabel("highest stable learning rate")
    ax.grid(True, which="both", axis="x", alpha=0.3)
  ax0 = np.atleast_1d(axes)[0]
  ax0.set_yticks(range(len(names)), [plotting.placement_label(p) for p in names])
  ax0.invert_yaxis()
  ax0.scatter([], [], color="none", edgecolor="0.4", marker="<", label="no stable rate (< lowest)")
  ax0.legend(loc="lower left", fontsize=7)  # (The upper left holds Post-LN's bound.)
  fig.suptitle("The atlas on both blocks: configs/lm.py:size=small, 2 seeds, 300-step probes "
               f"({made})", fontsize=9)
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)
