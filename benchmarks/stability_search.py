r"""The stability search's accuracy and cost against a grid (issue 30, part 2).

  python benchmarks/stability_search.py --workdir=/tmp/stab_bench [--parallel=2]
  python benchmarks/stability_search.py --workdir=/tmp/stab_bench_quick --quick   # a self-check

For every placement of lnjax.models.placement at two depths of the CPU-size LM
(configs/lm.py, size=small: D 128, character-level Tiny Shakespeare), without warm-up:
  - the search (python -m lnjax.cli.stability, in WORKDIR/search): its highest stable rate;
  - an 11-point log grid of peak rates × 3 seeds (WORKDIR/grid), each run judged by the same
    definition of stable (lnjax.sweep.search.Stable); the grid's answer is its highest rate
    stable in every seed.
Reported (WORKDIR/report.md, report.json): per cell both answers and their ratio; the
fraction of cells where the search is within 1.5× of the grid (goal: ≥ 80%); the training
steps the search took (range tests and probes, diverged runs counted up to their
divergence) over the grid's (goal: ≤ 1/3). Both runs resume: the same command again
continues them and only gathers what is finished.

--quick: the LM smoke preset, Pre-LN at 2 layers, one seed, a 3-point grid, 20-step runs,
a search tolerance of 3×.
"""

import json
import os
import subprocess
import sys

from absl import app, flags

from lnjax.core import allocator
allocator.tune_glibc_malloc()  # glibc malloc for XLA:CPU, before JAX starts
from lnjax import sweep
from lnjax.sweep import launcher, search

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_WORKDIR = flags.DEFINE_string("workdir", None, "Root of the search, the grid and the report.",
                               required=True)
_QUICK = flags.DEFINE_bool("quick", False, "A tiny self-check (smoke preset, minutes).")
_PLACEMENTS = flags.DEFINE_list("placements", None, "Default: every placement.")
_DEPTHS = flags.DEFINE_list("depths", ["2", "6"], "Two depths of the LM (layers).")
_STEPS = flags.DEFINE_integer("steps", 300, "Steps of every probe, grid run and range test.")
_SEEDS = flags.DEFINE_integer("seeds", 3, "Seeds per grid point and per probe.")
_GRID = flags.DEFINE_list("grid", ["1e-4", "3e-2", "11"], "MIN,MAX,POINTS of the log grid.")
_BATCH = flags.DEFINE_integer("batch_size", 16, "LM sequences per batch.")
_TOLERANCE = flags.DEFINE_float("tolerance", 1.4, "The search's --tolerance.")
_PARALLEL = flags.DEFINE_integer("parallel", 1, "Runs at once.")
WITHIN = 1.5  # The search's answer counts as right within this factor of the grid's.
DIVERGENCE_FACTOR = 2.0  # lnjax.sweep.stability's default.


def setup():
  """(config argument, fixed overrides, placements, depths, seeds, steps, grid rates, margin
  in nats below the unigram baseline of a stable run)."""
  lo, hi, n = float(_GRID.value[0]), float(_GRID.value[1]), int(_GRID.value[2])
  if _QUICK.value:
    # 20 steps do not reach the unigram baseline: stable here means "does not diverge".
    return "configs/lm.py:smoke", {}, ["pre"], [2], 1, 20, [1e-3, 1e-2, 1e-1], -1.0
  from lnjax import models
  rates = [float(f"{lo * (hi / lo) ** (i / (n - 1)):.3g}") for i in range(n)]
  return ("configs/lm.py:size=small", {"data.batch_size": _BATCH.value},
          _PLACEMENTS.value or list(models.NORM_POSITIONS), [int(d) for d in _DEPTHS.value],
          _SEEDS.value, _STEPS.value, rates, 0.1)


def run_search(root, config, fixed, placements, depths, seeds, steps, margin) -> dict:
  cmd = [sys.executable, "-m", "lnjax.cli.stability", f"--config={config}",
         f"--workdir={root}", f"--placements={','.join(placements)}",
         f"--depths={','.join(map(str, depths))}", "--warmups=0", f"--seeds={seeds}",
         f"--probe_steps={steps}", f"--parallel={_PARALLEL.value}",
         f"--tolerance={3.0 if _QUICK.value else _TOLERANCE.value}",
         f"--margin_nats={margin}", f"--divergence_factor={DIVERGENCE_FACTOR}",
         *[f"--config.{k}={sweep.flag_value(v)}" for k, v in fixed.items()]]
  print(" ".join(cmd), flush=True)
  code = subprocess.run(cmd, cwd=REPO).returncode
  if code:
    sys.exit(code)
  with open(os.path.join(root, "stability.json")) as f:
    return json.load(f)


def grid_runs(config, fixed, placements, depths, seeds, steps, rates) -> list[sweep.Run]:
  runs = []
  for p in placements:
    for d in depths:
      for lr in rates:
        for s in range(seeds):
          overrides = {"model.norm_position": p, "model.num_layers": d,
                       "opt.learning_rate": lr, "opt.warmup_steps": 0, "seed": s,
                       "train.num_steps": steps, "train.eval_every_steps": steps,
                       "train.checkpoint_every_steps": steps,
                       "train.divergence_factor": DIVERGENCE_FACTOR}
          runs.append(sweep.Run(f"norm={p},layers={d},lr={lr:g},seed={s}", overrides,
                                sweep.base_config(config, {**fixed, **overrides})))
  return runs


def main(argv):
  del argv
  config, fixed, placements, depths, seeds, steps, rates, margin = setup()
  root = _WORKDIR.value
  result = run_search(os.path.join(root, "search"), config, fixed, placements, depths,
                      seeds, steps, margin)
  runs = grid_runs(config, fixed, placements, depths, seeds, steps, rates)
  grid_root = os.path.join(root, "grid")
  launcher.run_to_the_end(config, "grid", runs, grid_root, fixed, parallel=_PARALLEL.value,
                          devices_per_run=None)
  stable = search.Stable(steps, DIVERGENCE_FACTOR, margin)
  summaries = {r.name: launcher.read_json(os.path.join(grid_root, r.name, "summary.json")) or {}
               for r in runs}
  grid_steps = sum(s.get("step") or 0 for s in summaries.values())
  search_steps = (sum(c["probe_steps_trained"] for c in result["cells"])
                  + sum({(c["placement"], c["depth"]): c["range_test_steps"] or 0
                         for c in result["cells"]}.values()))
  rows, right = [], 0
  for cell in result["cells"]:
    p, d = cell["placement"], cell["depth"]
    stable_rates = [lr for lr in rates if all(
        stable.judge(summaries[f"norm={p},layers={d},lr={lr:g},seed={s}"])[0]
        for s in range(seeds))]
    grid = max(stable_rates) if stable_rates else None
    found = cell["highest_stable_lr"]
    ratio = found / grid if grid and found else None
    ok = (grid is None and found is None) or (ratio is not None and 1 / WITHIN <= ratio <= WITHIN)
    right += ok
    rows.append({"placement": cell["label"], "depth": d, "search": found,
                 "search_status": cell["status"], "grid": grid, "ratio": ratio, "within": ok})
  fraction, cost = right / len(rows), search_steps / max(grid_steps, 1)
  lines = [f"# The stability search against a grid: {config}", "",
           f"Grid: {len(rates)} peak rates {rates[0]:g}–{rates[-1]:g} × {seeds} seed(s), "
           f"{steps} steps a run, no warm-up; search: `python -m lnjax.cli.stability` with the "
           "same steps and seeds.", "", result["definition"] + ".", "",
           "| placement | layers | search | grid | search / grid | within 1.5× |",
           "|---|---:|---:|---:|---:|---|"]
  for r in rows:
    fmt = lambda v: "none" if v is None else f"{v:.3g}"
    lines.append(f"| {r['placement']} | {r['depth']} | {fmt(r['search'])} "
                 f"({r['search_status']}) | {fmt(r['grid'])} | {fmt(r['ratio'])} | "
                 f"{'yes' if r['within'] else 'no'} |")
  lines += ["", f"Within 1.5× of the grid: {right}/{len(rows)} cells = {fraction:.0%} "
            "(goal ≥ 80%).",
            f"Training steps: search {search_steps}, grid {grid_steps}: {cost:.2f} of the "
            "grid's (goal ≤ 0.33)."]
  with open(os.path.join(root, "report.md"), "w") as f:
    f.write("\n".join(lines) + "\n")
  with open(os.path.join(root, "report.json"), "w") as f:
    json.dump({"rows": rows, "within_fraction": fraction, "search_steps": search_steps,
               "grid_steps": grid_steps, "cost_fraction": cost, "grid_rates": rates}, f,
              indent=2)
  print("\n".join(lines))


if __name__ == "__main__":
  app.run(main)
