r"""The edge predicted from the first steps (issue 61, item 3): fitted on the atlas's cells
(experiments/atlas: 14 placements × 6, 12, 24 layers × warm-up 0, 500, the six 300-step
slices), validated leave-one-placement-out, against the search's cost.

  python experiments/edge_predictor.py        # the fit, its report and figure; trains nothing
      # (the features: experiments/edge_predictor_features.py, ~1 h of one core)
  python experiments/edge_predictor.py --save # ... and the fitted coefficients into the
      # package (lnjax/sweep/edge_predictor.json, read by `lnjax stability --predict`)

Written: experiments/edge_predictor/report.md and predicted_vs_searched.png. Each cell's
features come from one 20-step run of its (placement, depth) at lr 1e-3 without warm-up
(experiments/edge_predictor/features.json) and, where present, a second at 1e-2
(features_lr0.01.json, by `... edge_predictor_features.py --lr=0.01`); the warm-up enters as
an input. The model: a ridge regression of log10(edge) on the features
(lnjax/sweep/predict.py). Each candidate's penalty, and for the procedure the candidate
itself, is chosen inside each held-out fold (nested), so no figure below saw the placement
it predicts; the saved fit is the same choice made on every cell. Cells without a stable
rate (< 1e-5: Post-LN at 24 layers, at 12 without warm-up) are left out of the fit and
reported apart. Beside the procedure, two transfers answer another question: a cell whose
placement is already measured on the other block (the modern block's from the 2020 atlas) or
at half the depth, placed by one 20-step run (`shifted`).
"""

import datetime
import itertools
import json
import math
import os
import tempfile

import numpy as np
from absl import app, flags

from lnjax import models
from lnjax.analysis import plotting
from lnjax.sweep import predict, search, stability, stability_report

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

OUT = os.path.join(REPO, "experiments", "edge_predictor")
ATLAS = os.path.join(REPO, "experiments", "atlas")
SLICES = ("d6", "d12", "d24", "w500_d6", "w500_d12", "w500_d24")  # 300-step probes, 2×.
MODERN_ATLAS = os.path.join(REPO, "experiments", "atlas_modern")  # RoPE, SwiGLU, RMSNorm.
MODERN_SLICES = ("d12", "w500_d12")
FEATURES_MODERN = os.path.join(OUT, "features_modern.json")
LAMBDAS = (0.1, 0.3, 1.0, 3.0, 10.0, 30.0, 100.0)
# The features tried (lnjax/sweep/predict.py); 'a*b': a product. Ordered simple to full.
BASE = ["log_depth", "warmup"]
HEALTH = ["init_last_grad", "init_first_share", "end_first_share", "grad_growth",
          "update_per_lr", "logit_growth", "output_logit_growth", "residual_growth",
          "loss_drop"]
SLOPES = [f"slope_{h}" for h in HEALTH] + ["diverged_high"]  # From the second run.
ONE_RUN = {
    "depth and warm-up only": BASE,
    "+ health of the first 20 steps": BASE + HEALTH,
    "+ health, and each × warm-up": BASE + HEALTH + [f"{h}*warmup" for h in HEALTH],
}
TWO_RUNS = {
    "+ the slopes alone (a second run at 10× the rate)": BASE + SLOPES,
    "+ health and its slope (a second run at 10× the rate)": BASE + HEALTH + SLOPES,
    "+ health and slope, and each × warm-up": BASE + HEALTH + SLOPES + [
        f"{h}*warmup" for h in HEALTH + SLOPES],
}
# The Hessian's sharpness at the feature run's last step (experiments/edge_sharpness.py):
# scored on the cells that have it, beside the one-run candidates on the same cells.
SHARP = ["log_adam_edge", "log_sharpness"]
WITH_SHARPNESS = {
    "+ Adam's sharpness at step 20": BASE + SHARP,
    "+ health and Adam's sharpness at step 20": BASE + HEALTH + SHARP,
}
SHARP_PROCEDURE = ("the candidate, one-run or with sharpness, and penalty chosen inside each "
                   "fold (nested)")
SHARPNESS = os.path.join(OUT, "sharpness.json")
# A baseline, not the first steps: the search's own range test (300 steps at a rate rising
# from 1e-5 to 1; Smith's LR range test, arXiv 1506.01186), its bracket as the inputs.
RANGE_TEST = {"baseline: the search's range test (its bracket, and its low end × warm-up)":
              BASE + ["log_range_lo", "log_range_hi", "log_range_lo*warmup"]}
PROCEDURE = "the one-run candidate and penalty chosen inside each fold (nested; saved)"
TWO_PROCEDURE = "the candidate, one- or two-run, and penalty chosen inside each fold (nested)"
SECOND = os.path.join(OUT, f"features_lr{predict.SECOND_LR:g}.json")
TODAY = f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d}"  # The report's date.
_SAVE = flags.DEFINE_bool("save", False, "Save the chosen fit into the package.")


def atlas_cells(folder: str = ATLAS, slices=SLICES) -> dict:
  """{(placement, depth, warmup): the search's row} of the slices' finished cells in
  `folder` (the six 300-step slices of experiments/atlas by default); a slice not started
  is skipped."""
  cells = {}
  for name in slices:
    path = os.path.join(folder, f"{name}.json")
    if not os.path.exists(path):
      continue
    with open(path) as f:
      st = json.load(f)["settings"]
    keys = {tuple(k.split("/")) for k in json.load(open(path))["probes"]}
    s = stability.Search(
        st["config"], st["fixed"], tempfile.mkdtemp(), placements=sorted({k[0] for k in keys}),
        depths=sorted({int(k[1]) for k in keys}), warmups=sorted({int(k[2]) for k in keys}),
        seeds=st["seeds"], range_steps=st["range_steps"], lr_min=st["lr_min"],
        lr_max=st["lr_max"], tolerance=st["tolerance"], widen=st["widen"],
        stable=search.Stable(st["probe_steps"], st["divergence_factor"], st["margin_nats"]),
        state_path=path)
    for row in stability_report.rows(s):
      if row["status"] != "unfinished":  # A cell still searching has bounds, not an edge.
        cells[row["placement"], row["depth"], row["warmup"]] = row
  return cells


def modern_cells() -> tuple[list, list, list]:
  """The modern block's cells with an edge and features (experiments/atlas_modern's slices,
  `edge_predictor_features.py --block=modern`): (keys, feature rows, edges)."""
  if not os.path.exists(FEATURES_MODERN):
    return [], [], []
  with open(FEATURES_MODERN) as f:
    features = json.load(f)
  keys, rows, edges = [], [], []
  for (p, d, w), c in sorted(atlas_cells(MODERN_ATLAS, MODERN_SLICES).items()):
    if f"{p}/{d}" in features and c["highest_stable_lr"] is not None:
      keys.append((p, d, w))
      rows.append(predict.features(features[f"{p}/{d}"], d, w))
      edges.append(c["highest_stable_lr"])
  return keys, rows, edges


def both_blocks(rows, edges, groups, model, modern) -> dict:
  """The modern block's cells (`modern`: `modern_cells()`): the saved fit (2020 block)
  applied to them as it is, and the one-run procedure held out by placement over both
  blocks' cells (a placement's cells of both blocks left out together), the block an input.
  {label: (edges, log10 predictions)}; {} until 3 placements of the modern block have both."""
  m_keys, m_rows, m_edges = modern
  m_rows = [{**x, "modern": 1.0} for x in m_rows]
  m_groups = [p for p, _, _ in m_keys]
  if len(set(m_groups)) < 3:
    return {}
  held, _ = predict.nested([{**x, "modern": 0.0} for x in rows] + m_rows, edges + m_edges,
                           {k: v + ["modern"] for k, v in ONE_RUN.items()}, LAMBDAS,
                           groups + m_groups)
  return {"the saved fit (2020 block) on the modern block's cells, as it is":
              (m_edges, np.array([model.log_edge(x) for x in m_rows])),
          "the one-run procedure over both blocks' cells, the block an input (nested)":
              (edges + m_edges, held)}


TRANSFER = "the 2020 block's edge shifted by the change in the first steps' health (nested)"
DEPTH_TRANSFER = ("the edge at half the depth shifted by the change in the first steps' health "
                  "(nested)")
DEPTH_APART = DEPTH_TRANSFER[:-len("(nested)")] + "(nested), a fit for each doubling"


def shifted(pairs, as_is: str, label: str) -> dict:
  """Cells predicted from a known cell of the same placement: pairs of (cell, its features,
  its edge, the known cell's features, the known edge). The known edge as it is (`as_is`),
  and shifted by a ridge fit of log10(edge / known edge) on how each health feature changed
  between the two cells' feature runs (`label`; the penalty chosen inside each fold, held out
  by placement). {label: (edges, log10 predictions, cells)}; {} below 3 placements."""
  if len({k[0] for k, *_ in pairs}) < 3:
    return {}
  cells, new_edges = [k for k, *_ in pairs], [e for _, _, e, _, _ in pairs]
  base = np.log10([known for *_, known in pairs])
  change = [{h: x[h] - x_known[h] for h in HEALTH} for _, x, _, x_known, _ in pairs]
  shift, _ = predict.nested(change, list(np.array(new_edges) / 10 ** base), {label: HEALTH},
                            LAMBDAS, [k[0] for k in cells])
  return {as_is: (new_edges, base, cells), label: (new_edges, base + shift, cells)}


def from_the_2020_atlas(keys, rows, edges, modern) -> dict:
  """Another question than the procedure's: a modern-block cell (`modern`: `modern_cells()`)
  predicted from the same placement's cell of the 2020 atlas (its depth and warm-up) and the
  modern block's own 20-step feature run (`shifted`)."""
  old = dict(zip(keys, zip(rows, edges)))
  return shifted([(k, x, e, *old[k]) for k, x, e in zip(*modern) if k in old],
                 "the 2020 block's edge of the same placement, depth and warm-up, as it is",
                 TRANSFER)


def from_half_the_depth(keys, rows, edges) -> dict:
  """Another question again: a 2020-block cell at 12 or 24 layers predicted from the same
  placement's cell at half its depth (its warm-up) and its own 20-step feature run
  (`shifted`)."""
  known = dict(zip(keys, zip(rows, edges)))
  pairs = [((p, d, w), x, e, *known[p, d // 2, w])
           for (p, d, w), x, e in zip(keys, rows, edges) if (p, d // 2, w) in known]
  out = shifted(pairs, "the edge at half the depth (same placement and warm-up), as it is",
                DEPTH_TRANSFER)
  apart = [shifted([t for t in pairs if t[0][1] == d], "", DEPTH_APART).get(DEPTH_APART)
           for d in (12, 24)]
  if out and all(apart):  # The same, a fit for each doubling on its own cells.
    out[DEPTH_APART] = tuple([*at_12, *at_24] for at_12, at_24 in zip(*apart))
  return out


def best_subset(rows, edges, groups, pool: list[str]):
  """An optimistic figure, not a predictor: of every set of up to three features of `pool`
  (with depth and warm-up, alone or also × warm-up, at penalties 0.1, 1, 10), the one whose
  leave-one-placement-out score is best, the choice made on every fold. Returns (label,
  predictions, sets tried)."""
  y, tried, best = np.log10(edges), 0, None
  for k in (1, 2, 3):
    for combo in itertools.combinations(pool, k):
      for product in (False, True):
        names = BASE + list(combo) + ([f"{h}*warmup" for h in combo] if product else [])
        for lam in (0.1, 1.0, 10.0):
          held = predict.held_out(rows, edges, names, lam, groups)
          factor = np.abs(held - y)
          score = (np.mean(factor <= math.log10(2)), -np.median(factor))
          tried += 1
          if best is None or score > best[0]:
            best = (score, names, held)
  return ", ".join(best[1][len(BASE):]), best[2], tried


def nearest(rows, edges, groups, names) -> np.ndarray:
  """The nearest-placement rule: each cell takes the edge of the cell of another placement,
  same depth and warm-up, whose standardized health features are nearest."""
  X = predict.design(rows, names)
  X = (X - X.mean(0)) / np.where(X.std(0) > 0, X.std(0), 1.0)
  out = np.empty(len(rows))
  for i, x in enumerate(rows):
    same = [j for j, y in enumerate(rows) if groups[j] != groups[i]
            and y["log_depth"] == x["log_depth"] and y["warmup"] == x["warmup"]]
    j = min(same, key=lambda j: float(np.sum((X[j] - X[i]) ** 2)))
    out[i] = math.log10(edges[j])
  return out


def diverges(cell: dict) -> bool | None:
  """How the cell's lowest unstable rate failed: True, it diverged; False, it trained
  without learning (held-out loss not 0.1 nats under the unigram baseline); None, not
  known (a verdict recorded without its seeds' details)."""
  fails = cell.get("fails_by") or ""
  return True if "diverged" in fails else False if "vs unigram" in fails else None


def failure_modes(cells: dict, keys) -> list[bool]:
  """Each cell's `diverges`; where not known, the mode of the placement's other cells at
  the same warm-up (NormFormer and OLMo 2 at 6 layers: both diverge at 12 and 24)."""
  out = []
  for p, d, w in keys:
    mode = diverges(cells[(p, d, w)])
    if mode is None:
      others = [m for (q, e, v), c in cells.items() if q == p and v == w and e != d
                and (m := diverges(c)) is not None]
      mode = bool(others) and 2 * sum(others) > len(others)
    out.append(mode)
  return out


def _classifier(X: np.ndarray, labels: np.ndarray, lam: float = 1.0):
  """L2-penalized logistic regression on standardized X (Newton's method): a function
  giving each row's class, True or False."""
  mean, scale = X.mean(0), np.where(X.std(0) > 1e-9, X.std(0), 1.0)
  A = np.c_[np.ones(len(X)), (X - mean) / scale]
  w, penalty = np.zeros(A.shape[1]), lam * np.diag([0.0] + [1.0] * X.shape[1])
  for _ in range(50):
    p = 1 / (1 + np.exp(-A @ w))
    w -= np.linalg.solve(A.T @ (A * (p * (1 - p))[:, None]) + penalty,
                         A.T @ (p - labels) + penalty @ w)
  return lambda Xn: np.c_[np.ones(len(Xn)), (Xn - mean) / scale] @ w > 0


def by_failure_mode(rows, edges, groups, modes, names, known: bool):
  """One ridge model per failure mode (diverging, not learning), each with its penalty
  chosen inside the fold; a held-out cell is predicted by the model of its mode, the mode
  `known` (the search's answer: a bound, not a predictor) or classified from the same
  features by a logistic regression fitted on the fold. Returns (log10 predictions, the
  classifier's held-out accuracy)."""
  X, groups, modes = predict.design(rows, names), np.asarray(groups), np.asarray(modes)
  out, guessed = np.empty(len(rows)), np.empty(len(rows), bool)
  for g in np.unique(groups):
    test, models_ = groups == g, {}
    guessed[test] = modes[test] if known else _classifier(X[~test], modes[~test])(X[test])
    for mode in (False, True):
      on = np.flatnonzero(~test & (modes == mode))
      sub, sub_edges = [rows[i] for i in on], [edges[i] for i in on]
      _, lam = predict.select(sub, sub_edges, {"": names}, LAMBDAS, groups[on])
      models_[mode] = predict.fit(sub, sub_edges, names, lam, {})
    for i in np.flatnonzero(test):
      out[i] = models_[bool(guessed[i])].log_edge(rows[i])
  return out, float(np.mean(guessed == modes))


def costs(cells: dict, features: dict, second: dict | None = None) -> dict:
  """Training steps and seconds: the search's (probes, and each range test once for both
  warm-ups) against the feature runs' (one per placement and depth, for both warm-ups; two
  with `second`, the 10× runs, where the predictor reads them)."""
  range_steps = sum({(c["placement"], c["depth"]): c["range_test_steps"] or 0
                     for c in cells.values()}.values())
  search_steps = sum(c["probe_steps_trained"] for c in cells.values()) + range_steps
  seconds = [p.get("seconds") for c in cells.values() for p in c["probes"]]
  timed = [s for s in seconds if s is not None]
  used = {f"{c['placement']}/{c['depth']}" for c in cells.values()}
  features = {k: r for k, r in features.items() if k in used}
  features.update({f"{k}@{predict.SECOND_LR:g}": r for k, r in (second or {}).items()
                   if k in used})
  feature_steps = sum(len(r["step"]) for r in features.values())
  pace = [p["seconds"] / p["steps"] for c in cells.values() for p in c["probes"]
          if p.get("seconds") and p["steps"] >= 300]
  per_step = float(np.median(pace)) if pace else float("nan")
  search_runs = sum(c["probe_runs"] for c in cells.values()) + len(
      {(c["placement"], c["depth"]) for c in cells.values() if c["range_test_steps"]})
  return {"search_steps": search_steps, "range_steps": range_steps,
          "feature_steps": feature_steps,
          "search_runs": search_runs, "feature_runs": len(features),
          "search_probes_timed": len(timed), "search_probes": len(seconds),
          "search_seconds_timed": sum(timed),
          "feature_seconds": sum(r["seconds"] for r in features.values()),
          "feature_median_seconds": float(np.median([r["seconds"] for r in features.values()])),
          "search_seconds_per_step": per_step, "search_hours": search_steps * per_step / 3600}


def figure(path: str, keys, edges, predicted_log, censored) -> None:
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  fig, ax = plt.subplots(figsize=(6.2, 5.6))
  lo, hi = 1e-6, 1.0
  line = np.array([lo, hi])
  ax.plot(line, line, color="k", lw=1)
  ax.fill_between(line, line / 2, line * 2, color="0.85", label="within 2×")
  markers = {6: "o", 12: "s", 24: "^"}
  for (p, d, w), e, y in zip(keys, edges, predicted_log):
    ax.scatter(e, 10 ** y, marker=markers[d], s=28, edgecolor="k", linewidth=0.4,
               color="tab:orange" if w else "tab:blue")
  for (p, d, w), upper, y in censored:
    ax.scatter(upper, 10 ** y, marker=markers[d], s=28, facecolor="none",
               edgecolor="tab:red")
  for d, m in markers.items():
    ax.scatter([], [], marker=m, color="0.5", label=f"{d} layers")
  ax.scatter([], [], color="tab:blue", label="no warm-up")
  ax.scatter([], [], color="tab:orange", label="500 warm-up steps")
  ax.scatter([], [], facecolor="none", edgecolor="tab:red", label="no stable rate (< 1e-5)")
  ax.set(xscale="log", yscale="log", xlim=(lo, hi), ylim=(lo, hi),
         xlabel="searched highest stable lr (experiments/atlas)",
         ylabel="predicted from 20-step runs (held out by placement)")
  ax.legend(fontsize=7, loc="upper left")
  ax.set_title(f"python experiments/edge_predictor.py ({TODAY})", fontsize=9)
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)


def main(argv):
  del argv
  with open(os.path.join(OUT, "features.json")) as f:
    features = json.load(f)
  second = {}
  if os.path.exists(SECOND):
    with open(SECOND) as f:
      second = json.load(f)
  sharp = {}
  if os.path.exists(SHARPNESS):
    with open(SHARPNESS) as f:
      sharp = {k: e for k, e in json.load(f).items() if e.get("status") == "completed"}
  cells = atlas_cells()
  keys, rows, edges, groups, censored_keys = [], [], [], [], []
  for (p, d, w), c in sorted(cells.items(), key=lambda kv: (kv[0][1], kv[0][2], kv[0][0])):
    if f"{p}/{d}" not in features:
      continue
    x = predict.features(features[f"{p}/{d}"], d, w, second=second.get(f"{p}/{d}"),
                         sharpness=sharp.get(f"{p}/{d}"))
    if c.get("range_test_bracket"):
      x.update(zip(("log_range_lo", "log_range_hi"), np.log10(c["range_test_bracket"])))
    if c["highest_stable_lr"] is None:
      censored_keys.append(((p, d, w), c["lowest_unstable_lr"], x))
      continue
    keys.append((p, d, w))
    rows.append(x)
    edges.append(c["highest_stable_lr"])
    groups.append(p)
  # The cells with both runs: where the two-run candidates are scored.
  both = [i for i, x in enumerate(rows) if "diverged_high" in x]
  every = list(range(len(rows)))
  sub = lambda xs, on: [xs[i] for i in on]
  results = {}

  def nested(label, on, candidates):
    held, picks = predict.nested(sub(rows, on), sub(edges, on), candidates, LAMBDAS,
                                 sub(groups, on))
    results[label] = (on, held)
    return held, picks

  for label, names in ONE_RUN.items():
    nested(label, every, {label: names})
  ranged = [i for i, x in enumerate(rows) if "log_range_lo" in x]
  spent = costs({k: cells[k] for k in sub(keys, ranged)}, features)
  for label, names in RANGE_TEST.items():
    held_r, _ = predict.nested(sub(rows, ranged), sub(edges, ranged), {label: names}, LAMBDAS,
                               sub(groups, ranged))
    results[f"{label}; {spent['search_steps'] / spent['range_steps']:.0f}× fewer steps than "
            "the search"] = (
        ranged, held_r)
  results["nearest placement (health features)"] = (every, nearest(rows, edges, groups, HEALTH))
  modes = failure_modes(cells, keys)
  for known in (True, False):
    held_mode, accuracy = by_failure_mode(rows, edges, groups, modes, BASE + HEALTH, known)
    results[("two models by failure mode, each cell's mode known (a bound)" if known else
             f"two models by failure mode, the mode classified from the health features "
             f"({accuracy:.0%} right held out)")] = (every, held_mode)
  label, bound, tried = best_subset(rows, edges, groups, HEALTH)
  results[f"bound: the best of {tried} small sets of health features, chosen on every fold "
          f"({label})"] = (every, bound)
  if both:
    for label, names in TWO_RUNS.items():
      nested(label, both, {label: names})
    label, bound, tried = best_subset(sub(rows, both), sub(edges, both), sub(groups, both),
                                      HEALTH + SLOPES)
    results[f"bound: the best of {tried} small sets of health and slope features, chosen on "
            f"every fold ({label})"] = (both, bound)
    nested(TWO_PROCEDURE, both, {**ONE_RUN, **TWO_RUNS})
  measured = [i for i, x in enumerate(rows) if "log_adam_edge" in x]
  if len({groups[i] for i in measured}) >= 3:
    for label, names in {**ONE_RUN, **WITH_SHARPNESS}.items():
      nested(f"{label} (cells with sharpness)", measured, {label: names})
    nested(SHARP_PROCEDURE, measured, {**ONE_RUN, **WITH_SHARPNESS})
    for known in (True, False):
      held_mode, accuracy = by_failure_mode(
          sub(rows, measured), sub(edges, measured), sub(groups, measured),
          sub(modes, measured), BASE + HEALTH + SHARP, known)
      results[("two models by failure mode on health and sharpness, each cell's mode known "
               "(a bound; cells with sharpness)" if known else
               "two models by failure mode on health and sharpness, the mode classified "
               f"from them ({accuracy:.0%} right held out; cells with sharpness)")] = (
                   measured, held_mode)
  # The procedure quoted and saved: the choice among the one-run candidates (one run costs
  # half of two; the choice among all, two-run ones included, is reported beside it).
  held, picks = nested(PROCEDURE, every, ONE_RUN)
  scored = {k: predict.scores(v[1], sub(edges, v[0])) for k, v in results.items()}
  best, lam = predict.select(rows, edges, ONE_RUN, LAMBDAS, groups)
  names = ONE_RUN[best]
  fitted_for = {"config": "configs/lm.py:size=small, batches of 16 (the atlas)",
                "keys": predict.describe_config(_atlas_config()),
                "placements": sorted({k[0] for k in keys}),
                "depths": [min(k[1] for k in keys), max(k[1] for k in keys)],
                "warmups": [0, 500], "steps": predict.STEPS, "lr": predict.REFERENCE_LR,
                "second_lr": None, "command": "python experiments/edge_predictor.py --save"}
  # The interval: the procedure's held-out errors (its choice made without the placement).
  model = predict.fit(rows, edges, names, lam, fitted_for, residuals=held - np.log10(edges))
  if _SAVE.value:
    model.save(predict.COEFFICIENTS)
  modern = modern_cells()  # Read once: both_blocks and the transfer to the modern block.
  transfers = {**from_the_2020_atlas(keys, rows, edges, modern),
               **from_half_the_depth(keys, rows, edges)}
  scored.update({label: predict.scores(held_b, edges_b) for label, (edges_b, held_b, *_) in {
      **both_blocks(rows, edges, groups, model, modern), **transfers}.items()})
  censored = [(k, upper, model.log_edge(x)) for k, upper, x in censored_keys]
  figure(os.path.join(OUT, "predicted_vs_searched.png"), keys, edges, held, censored)
  measured = {k: cells[k] for k in keys + [c[0] for c in censored]}  # Features and edge.
  two_cost = costs({k: cells[k] for k in sub(keys, both)}, features, second) if both else None
  report = render(keys, edges, held, scored, picks, best, lam, model, censored,
                  costs(measured, features), two_cost, len(cells), transfers)
  with open(os.path.join(OUT, "report.md"), "w") as f:
    f.write(report)
  print(report)


def _atlas_config():
  import lnjax
  c = lnjax.get_config("lm", "size=small").unlock()
  c.data.batch_size = 16
  return c


def _misses(edges, held, cells) -> str:
  """The cells a transfer places more than 2× from the searched edge, worst first."""
  factor = 10 ** np.abs(np.asarray(held) - np.log10(edges))
  return ", ".join(f"{plotting.placement_label(p)} at {d} layers, warm-up {w} ({f:.1f}×)"
                   for f, (p, d, w) in sorted(zip(factor, cells), reverse=True) if f > 2)


def render(keys, edges, held, scored, picks, best, lam, model, censored, cost, two_cost,
           total, transfers) -> str:
  factor = 10 ** np.abs(held - np.log10(edges))
  runs = "one 20-step run at 1e-3"
  out = ["# The edge predicted from the first steps", "",
         f"`python experiments/edge_predictor.py` ({TODAY}), features by "
         "`nice -n 19 python experiments/edge_predictor_features.py` (2026-12-05) and, for "
         "the second runs, `nice -n 10 python experiments/edge_predictor_features.py "
         "--depths=6 --lr=0.01` (2026-12-05). Each cell's prediction comes from a model "
         "fitted without its placement (leave-one-placement-out: the ridge penalty, and for "
         "the procedures the candidate, chosen inside the fold by a leave-one-placement-out "
         "on the other placements alone). Cells: "
         f"{len(keys)} with a searched edge, {len(censored)} without a "
         f"stable rate, of the atlas's {total}.", "",
         "| predictor | median error factor | within 2× | cells |", "|---|---:|---:|---:|"]
  for label, s in scored.items():
    out.append(f"| {label} | {s['median_factor']:.2f}× | {100 * s['within_2x']:.0f}% | "
               f"{s['cells']} |")
  s = scored[PROCEDURE]
  chosen = {}
  for label, _ in picks.values():
    chosen[label] = chosen.get(label, 0) + 1
  steps_ratio = cost["search_steps"] / max(cost["feature_steps"], 1)
  out += ["", "The figures to quote are the saved procedure's row: the choice among the "
          "one-run candidates included, held out by placement. Each candidate row's feature "
          "set was fixed before its score was seen, so picking the best of those rows by "
          "its score would be a choice made on every fold; the bound rows are such a choice "
          "over many sets, optimistic (their score flatters them), not predictors. "
          f"Chosen inside the {len(picks)} folds: " + ", ".join(
              f"{label} ({n}×)" for label, n in sorted(chosen.items(), key=lambda kv: -kv[1]))
          + f". The saved fit (lnjax/sweep/edge_predictor.json): the same choice on every "
          f"cell, {best}, penalty {lam:g}; its 10%-90% interval, from the procedure's "
          f"held-out errors: ×{10 ** model.interval[0]:.2f} to ×{10 ** model.interval[1]:.2f}.",
          "", f"Goal ≥ 80% within 2× at ≥ 20× less compute: {100 * s['within_2x']:.0f}% "
          f"within 2× ({'met' if s['within_2x'] >= 0.8 else 'missed'}), median error "
          f"{s['median_factor']:.2f}×, at {steps_ratio:.0f}× fewer training steps ({runs} "
          "per placement and depth)."]
  if two_cost:
    two = scored[TWO_PROCEDURE]
    out += ["", "The second run (the same 20 steps at 1e-2, ten times the rate; each health "
            "feature's change per decade of rate, 'slope_...'): "
            f"the choice among all candidates, two-run ones included, scores "
            f"{100 * two['within_2x']:.0f}% within 2× (median {two['median_factor']:.2f}×) on "
            f"its {two['cells']} cells, at "
            f"{two_cost['search_steps'] / max(two_cost['feature_steps'], 1):.0f}× fewer "
            "steps. The saved procedure is the one-run one: the default before the second "
            "runs were made, and cheaper; that the two-run choice scores no better was seen "
            "on every fold (a choice between two procedures made on their scores)."]
  if SHARP_PROCEDURE in scored:
    sh = scored[SHARP_PROCEDURE]
    out += ["", "The Hessian's sharpness at the feature run's step 20 (`nice -n 10 python "
            "experiments/edge_sharpness.py`, 2026-12-06: λ_max(H) and λ_max(P⁻¹H) with "
            "Adam's preconditioner P by 20 Lanczos iterations; log10 of 38/λ_max(P⁻¹H), "
            "the rate at Adam's stability threshold, Cohen et al., arXiv 2207.14484, and "
            f"of λ_max(H)), on the {sh['cells']} cells measured so far: the choice among "
            "the one-run candidates and those with sharpness scores "
            f"{100 * sh['within_2x']:.0f}% within 2× (median {sh['median_factor']:.2f}×); "
            "the rows '(cells with sharpness)' above score each candidate on the same "
            "cells. Not in the saved procedure: measured on part of the atlas."]
  transfer = [label for label in scored if label.startswith("the saved fit (2020 block)")]
  if transfer:
    out += ["", "The modern block (RoPE, SwiGLU, RMSNorm, no biases; experiments/atlas_modern, "
            "its features by `nice -n 10 python experiments/edge_predictor_features.py "
            "--block=modern --depths=12`): the saved fit applied to its cells as it is scores "
            f"{100 * scored[transfer[0]]['within_2x']:.0f}% within 2× on "
            f"{scored[transfer[0]]['cells']}; refitted over both blocks' cells with the block "
            "as an input, each placement's cells of both blocks held out together, the row "
            "after it."]
  if TRANSFER in scored:
    t = scored[TRANSFER]
    out += ["", "From the 2020 atlas to the modern block (another question: the same "
            "placement's edge measured on the 2020 block is known): its 2020 edge as it is, "
            "and that edge shifted by a ridge fit on how each health feature of the 20-step "
            "feature run changed between the blocks (the table's rows 'the 2020 block's "
            "edge ...'). The shifted one scores "
            f"{100 * t['within_2x']:.0f}% within 2× (median {t['median_factor']:.2f}×) on "
            f"{t['cells']} cells, held out by placement, at the cost of one 20-step run on the "
            "new block; it needs the placement measured on the old block, at the same depth "
            "and warm-up, and both warm-ups share one shift (one feature run serves both). "
            f"Beyond 2×: {_misses(*transfers[TRANSFER])}."]
  if DEPTH_TRANSFER in scored:
    new_edges, held_d, cells_d = transfers[DEPTH_TRANSFER]
    by = {d: predict.scores(held_d[on], np.array(new_edges)[on]) for d in (12, 24)
          if len(on := [i for i, k in enumerate(cells_d) if k[1] == d])}
    out += ["", "From half the depth (the 2020 block; another question again: the same "
            "placement's edge at half the depth, same warm-up, is known): that edge as it is, "
            "and shifted as above by how the health features of the two depths' 20-step runs "
            "differ (the table's rows 'the edge at half the depth ...': "
            + "; ".join(f"at {d} layers from {d // 2}: {100 * v['within_2x']:.0f}% of "
                        f"{v['cells']} within 2×, median {v['median_factor']:.2f}×"
                        for d, v in by.items())
            + ", one fit over both; and fitted for each doubling on its own cells). "
            "Beyond 2×: " + _misses(*transfers[DEPTH_TRANSFER]) + "."]
  out += ["",
          "## Cost", "",
          f"- The search (the slices' probes, and each range test once): "
          f"{cost['search_steps']} training steps in {cost['search_runs']} runs (each run "
          "a process that compiles its model).",
          f"- The features: {cost['feature_steps']} steps in {cost['feature_runs']} runs "
          f"({runs} per placement and depth, serving both warm-ups).",
          f"- The search takes {steps_ratio:.0f}× the features' training steps (its compute: "
          "the same model, the same batch) and "
          f"{cost['search_runs'] / max(cost['feature_runs'], 1):.0f}× their runs. In wall time "
          "a 20-step run is mostly fixed costs (start, compilation, evaluation): the feature "
          f"runs took {cost['feature_seconds'] / 60:.0f} min here (median "
          f"{cost['feature_median_seconds']:.0f} s a run) at nice 19 on 2 cores shared with "
          "five other jobs (load average 15-20); the search's steps at its recorded pace "
          f"({cost['search_seconds_per_step']:.3f} s a step, its timed probes' median, "
          f"compilation included) take {cost['search_hours']:.1f} h: "
          f"{60 * cost['search_hours'] / max(cost['feature_seconds'] / 60, 1e-9):.0f}× the "
          "features' wall time as measured, under unequal loads.", "",
          "## Where it errs (the procedure's held-out factor per cell, worst first)", "",
          "| placement | layers | warm-up | searched | predicted | factor |",
          "|---|---:|---:|---:|---:|---:|"]
  for i in np.argsort(-factor)[:20]:
    p, d, w = keys[i]
    out.append(f"| {plotting.placement_label(p)} | {d} | {w} | {edges[i]:.3g} | "
               f"{10 ** held[i]:.3g} | {factor[i]:.1f}× |")
  by_placement = {}
  for (p, _, _), f in zip(keys, factor):
    by_placement.setdefault(p, []).append(f)
  out += ["", "Median factor by placement (its cells held out together):", "",
          "| placement | median factor | within 2× |", "|---|---:|---:|"]
  for p in models.NORM_POSITIONS:
    if p in by_placement:
      f = np.array(by_placement[p])
      out.append(f"| {plotting.placement_label(p)} | {np.median(f):.1f}× | "
                 f"{int(np.sum(f <= 2))}/{len(f)} |")
  if censored:
    out += ["", "Cells without a stable rate (the search's lowest unstable rate, and the "
            "saved fit's prediction, in-sample for the other cells):", ""]
  out += [f"- {plotting.placement_label(p)}, {d} layers, warm-up {w}: < {upper:.3g}; "
          f"predicted {10 ** y:.3g}" for (p, d, w), upper, y in censored]
  out += ["", "Figure: experiments/edge_predictor/predicted_vs_searched.png", ""]
  return "\n".join(out)


if __name__ == "__main__":
  app.run(main)
