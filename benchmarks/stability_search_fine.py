r"""The stability search against a grid 1.5× apart (issue 61, item 4): is the search's
64% within 1.5× of the 11-point grid (points 2× apart; benchmarks/stability_search.py) the
grid's resolution or a real disagreement?

  nice -n 19 python benchmarks/stability_search_fine.py --workdir=/tmp/fine \
      --placements=pre,peri,admin --depths=2      # the cells chosen; resumes
  python benchmarks/stability_search_fine.py --workdir=/tmp/fine --report_only

The fine grid is 3e-4 × 1.5^k (k = 0..17, up to 0.295). Each cell's 2× grid (in
experiments/stability_search/grid.json) already places the edge between its highest stable
rate G and the next rate 2G; a rate below a rate stable in every seed is taken as stable and
one above an unstable rate as unstable (the 2× grid's runs agree: no cell of it is stable
above a rate that failed, but Mix-LN at 6 layers), so only the fine rates in [G, 2G) are run,
each as the 2× grid's runs were (same config, 300 steps, seeds 0, 1, 2; a rate's other seeds
only once seed 0 holds). The fine grid's answer F is the highest fine rate stable in every
seed. Written: experiments/stability_search/fine_grid.json (each finished run's summary:
resumable from a clone) and fine_grid.md.
"""

import json
import math
import os
import sys

import bench_env  # noqa: F401  (first: lnjax on the path, malloc tuned before JAX)
from absl import app, flags

import lnjax
from lnjax.sweep import search

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
KEEP = os.path.join(REPO, "experiments", "stability_search")
_WORKDIR = flags.DEFINE_string("workdir", "/tmp/lnjax_fine_grid", "The runs' folders.")
_PLACEMENTS = flags.DEFINE_list("placements", [], "Placements (model.norm_position) to run.")
_DEPTHS = flags.DEFINE_list("depths", ["2"], "Depths to run.")
_REPORT_ONLY = flags.DEFINE_bool("report_only", False, "Only the table of what has finished.")
FINE = [float(f"{3e-4 * 1.5 ** k:.3g}") for k in range(18)]
SEEDS, STEPS, WITHIN = 3, 300, 1.5
STABLE = search.Stable(STEPS, 2.0, 0.1)
LEDGER = os.path.join(KEEP, "fine_grid.json")


def run_name(placement: str, depth: int, lr: float, seed: int) -> str:
  return f"norm={placement},layers={depth},lr={lr:g},seed={seed}"


def train(placement: str, depth: int, lr: float, seed: int) -> dict:
  """One run as the 2× grid's (benchmarks/stability_search.py grid_runs); its summary."""
  c = lnjax.get_config("lm", "size=small").unlock()
  c.data.batch_size, c.model.norm_position, c.model.num_layers = 16, placement, depth
  c.opt.learning_rate, c.opt.warmup_steps, c.seed = lr, 0, seed
  c.train.num_steps = c.train.eval_every_steps = c.train.checkpoint_every_steps = STEPS
  c.train.divergence_factor = 2.0
  summary = lnjax.train(c, os.path.join(_WORKDIR.value, run_name(placement, depth, lr, seed)))
  return {k: summary.get(k) for k in ("status", "step", "num_steps", "eval_loss",
                                       "unigram_baseline")}


def fine_rates(row: dict) -> list[float]:
  """The fine rates the 2× grid leaves open: those in [G, the next 2× rate)."""
  return [r for r in FINE if row["grid"] <= r < (row["grid_upper"] or math.inf)]


def stable_at(ledger: dict, placement: str, depth: int, lr: float, run: bool) -> bool | None:
  """Whether every seed at `lr` is stable (seeds in turn, stopping at the first failure);
  None when a seed is missing and `run` is false."""
  for seed in range(SEEDS):
    name = run_name(placement, depth, lr, seed)
    if name not in ledger:
      if not run:
        return None
      ledger[name] = train(placement, depth, lr, seed)
      with open(LEDGER + ".tmp", "w") as f:
        json.dump(dict(sorted(ledger.items())), f, indent=1)
      os.replace(LEDGER + ".tmp", LEDGER)
    if not STABLE.judge(ledger[name]).stable:
      return False
  return True


def main(argv):
  del argv
  from lnjax import models
  from lnjax.analysis import plotting
  with open(os.path.join(KEEP, "report.json")) as f:
    rows = json.load(f)["rows"]
  label = {plotting.placement_label(p): p for p in models.NORM_POSITIONS}
  ledger = json.load(open(LEDGER)) if os.path.exists(LEDGER) else {}
  wanted = {(p, int(d)) for p in _PLACEMENTS.value for d in _DEPTHS.value}
  lines = ["| placement | layers | search | 2× grid | 1.5× grid | search / 1.5× grid | "
           "within 1.5× | fine runs |", "|---|---:|---:|---:|---:|---:|---|---:|"]
  within, done = 0, 0
  for row in rows:
    p, d = label[row["placement"]], row["depth"]
    run = (p, d) in wanted and not _REPORT_ONLY.value
    if row["grid"] is None or row["grid_at_top"]:
      continue
    verdicts = {}
    for lr in fine_rates(row):
      verdicts[lr] = stable_at(ledger, p, d, lr, run)
      if verdicts[lr] is not True:
        break  # Above an unstable (or unknown) rate nothing is decided by running.
    if not verdicts or None in verdicts.values():
      continue
    below = [r for r in FINE if r < row["grid"]]
    fine = max([lr for lr, ok in verdicts.items() if ok] or below[-1:])
    ratio = row["search"] / fine
    ok = 1 / WITHIN <= ratio <= WITHIN
    within, done = within + ok, done + 1
    runs = sum(run_name(p, d, lr, s) in ledger for lr in verdicts for s in range(SEEDS))
    lines.append(f"| {row['placement']} | {d} | {row['search']:.3g} | {row['grid']:.3g} | "
                 f"{fine:.3g} | {ratio:.2f} | {'yes' if ok else 'no'} | {runs} |")
  lines.append(f"\nWithin 1.5× of the 1.5× grid: {within}/{done} cells measured.")
  with open(os.path.join(KEEP, "fine_grid.md"), "w") as f:
    f.write("\n".join(lines) + "\n")
  print("\n".join(lines))


if __name__ == "__main__":
  app.run(main)
