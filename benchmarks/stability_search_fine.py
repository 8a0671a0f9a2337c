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

The bound the 2× grid sets (`agreement`, printed with the table): were every cell's edge
sharp and the same in every seed, and uniform in log between the grid's rates and within
the search's final bracket, the search's answer (its bracket's stable end) would be within
1.5× of the grid's in P = Pr(|X − U| ≤ ln 1.5), X ~ U[0, ln r) (r: the grid's step, 1.995),
U ~ U[0, ln t) (t: the cell's final bracket, highest stable to lowest unstable). An exact
search (t = 1) gets ln 1.5 / ln 1.995 = 58.7%; over the 28 cells' own brackets the expected
count is the sum of their P.
"""

import json
import math
import os
import sys

import bench_env  # noqa: F401  (first: lnjax on the path, malloc tuned before JAX)
import numpy as np
import argparse

import lnjax
from lnjax.sweep import search

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
KEEP = os.path.join(REPO, "experiments", "stability_search")
FINE = [float(f"{3e-4 * 1.5 ** k:.3g}") for k in range(18)]
SEEDS, STEPS, WITHIN = 3, 300, 1.5
STABLE = search.Stable(STEPS, 2.0, 0.1)
LEDGER = os.path.join(KEEP, "fine_grid.json")


def agreement(grid_step: float, bracket: float, within: float = WITHIN, n: int = 2001) -> float:
  """Pr(|X − U| ≤ ln within), X ~ U[0, ln grid_step), U ~ U[0, ln bracket): the chance that
  an ideal search's answer lies within `within` of an ideal grid's (midpoint rule)."""
  x = (np.arange(n) + 0.5) / n * math.log(grid_step)
  if bracket <= 1.0:
    return float(np.mean(np.abs(x) <= math.log(within)))
  u = (np.arange(n) + 0.5) / n * math.log(bracket)
  return float(np.mean(np.abs(x[:, None] - u[None, :]) <= math.log(within)))


def bound_lines(rows: list[dict]) -> list[str]:
  """The expected agreement of an ideal search with the 2× grid, per cell and in all."""
  step = (rows and max(r["grid_upper"] / r["grid"] for r in rows if r["grid_upper"]
                       and r["grid"])) or 2.0
  ps = [agreement(step, r["bracket"]) for r in rows]
  return [f"The bound the 2× grid sets (grid step {step:.3f}×): an exact search is within 1.5× "
          f"of it with probability {100 * agreement(step, 1.0):.1f}%; with each cell's own "
          f"final bracket (mean {np.mean([r['bracket'] for r in rows]):.2f}×) the expected "
          f"count is {sum(ps):.1f} of {len(rows)} ({100 * np.mean(ps):.0f}%), measured "
          f"{sum(r['within'] for r in rows)} of {len(rows)}."]


def run_name(placement: str, depth: int, lr: float, seed: int) -> str:
  return f"norm={placement},layers={depth},lr={lr:g},seed={seed}"


def train(placement: str, depth: int, lr: float, seed: int) -> dict:
  """One run as the 2× grid's (benchmarks/stability_search.py grid_runs); its summary."""
  c = lnjax.get_config("lm", "size=small").unlock()
  c.data.batch_size, c.model.norm_position, c.model.num_layers = 16, placement, depth
  c.opt.learning_rate, c.opt.warmup_steps, c.seed = lr, 0, seed
  c.train.num_steps = c.train.eval_every_steps = c.train.checkpoint_every_steps = STEPS
  c.train.divergence_factor = 2.0
  summary = lnjax.train(c, os.path.join(ARGS.workdir, run_name(placement, depth, lr, seed)))
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


def search_brackets() -> dict:
  """{(placement, depth): the search's final bracket, lowest unstable / highest stable rate}
  from its state (experiments/stability_search/search_state.json)."""
  import tempfile
  from lnjax.sweep import stability, stability_report
  path = os.path.join(KEEP, "search_state.json")
  with open(path) as f:
    state = json.load(f)
  st, keys = state["settings"], [k.split("/") for k in state["probes"]]
  s = stability.Search(
      st["config"], st["fixed"], tempfile.mkdtemp(), placements=sorted({k[0] for k in keys}),
      depths=sorted({int(k[1]) for k in keys}), warmups=[0], seeds=st["seeds"],
      range_steps=st["range_steps"], lr_min=st["lr_min"], lr_max=st["lr_max"],
      tolerance=st["tolerance"], widen=st["widen"],
      stable=search.Stable(st["probe_steps"], st["divergence_factor"], st["margin_nats"]),
      state_path=path)
  return {(r["placement"], r["depth"]): r["lowest_unstable_lr"] / r["highest_stable_lr"]
          for r in stability_report.rows(s)}


def parse(argv=None) -> argparse.Namespace:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--workdir", default="/tmp/lnjax_fine_grid", help="The runs' folders.")
  p.add_argument("--placements", default="", help="Placements (comma-separated) to run.")
  p.add_argument("--depths", default="2", help="Depths (comma-separated) to run.")
  p.add_argument("--report_only", action="store_true", help="Only the table so far.")
  return p.parse_args(argv)


ARGS = parse([])


def main(argv=None):
  global ARGS
  ARGS = parse(argv)
  from lnjax import models
  from lnjax.analysis import plotting
  with open(os.path.join(KEEP, "report.json")) as f:
    rows = json.load(f)["rows"]
  label = {plotting.placement_label(p): p for p in models.NORM_POSITIONS}
  brackets = search_brackets()
  for row in rows:
    row["bracket"] = brackets[label[row["placement"]], row["depth"]]
  ledger = json.load(open(LEDGER)) if os.path.exists(LEDGER) else {}
  wanted = {(p, int(d)) for p in ARGS.placements.split(",") if p
            for d in ARGS.depths.split(",")}
  lines = ["| placement | layers | search | 2× grid | 1.5× grid | search / 1.5× grid | "
           "within 1.5× | fine runs |", "|---|---:|---:|---:|---:|---:|---|---:|"]
  within, done = 0, 0
  for row in rows:
    p, d = label[row["placement"]], row["depth"]
    run = (p, d) in wanted and not ARGS.report_only
    if row["grid"] is None:
      continue
    verdicts = {}
    for lr in [] if row["grid_at_top"] else fine_rates(row):
      verdicts[lr] = stable_at(ledger, p, d, lr, run)
      if verdicts[lr] is not True:
        break  # Above an unstable (or unknown) rate nothing is decided by running.
    if (not verdicts and not row["grid_at_top"]) or None in verdicts.values():
      continue
    # Stable at the 2× grid's top (nGPT): so is every fine rate up to it, and none above
    # it is run: the fine grid's answer is its highest rate there, as the 2× grid's is.
    below = [r for r in FINE if r <= row["grid"]] if row["grid_at_top"] else [
        r for r in FINE if r < row["grid"]]
    fine = max([lr for lr, ok in verdicts.items() if ok] or below[-1:])
    ratio = row["search"] / fine
    ok = 1 / WITHIN <= ratio <= WITHIN
    within, done = within + ok, done + 1
    runs = sum(run_name(p, d, lr, s) in ledger for lr in verdicts for s in range(SEEDS))
    top = "≥ " if row["grid_at_top"] else ""
    lines.append(f"| {row['placement']} | {d} | {row['search']:.3g} | {top}{row['grid']:.3g} | "
                 f"{top}{fine:.3g} | {ratio:.2f} | {'yes' if ok else 'no'} | {runs} |")
  lines.append(f"\nWithin 1.5× of the 1.5× grid: {within}/{done} cells measured.")
  lines += ["", *bound_lines(rows)]
  with open(os.path.join(KEEP, "fine_grid.md"), "w") as f:
    f.write("\n".join(lines) + "\n")
  print("\n".join(lines))


if __name__ == "__main__":
  main()
