r"""The stability search's accuracy and cost against a grid (issue 30, part 2).

  python benchmarks/stability_search.py --workdir=/tmp/stab_bench [--parallel=2] \
      [--keep=experiments/stability_search]  # the results kept apart: resumes anywhere
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
continues them and only gathers what is finished. With --keep=DIR, what a new WORKDIR
needs to continue lives in DIR (the search's state, DIR/grid.json with every finished grid
run's summary) and the report is written there too: the measurement goes on on another
machine from a clone.

Where the grid's top rate is stable in every seed, the grid knows only "at least the top":
the search counts as within if its answer is at least the top / 1.5.

--quick: the LM smoke preset, Pre-LN at 2 layers, one seed, a 3-point grid, 20-step runs,
a search tolerance of 3×.
"""

import json
import os
import subprocess
import sys

import bench_env  # noqa: F401  (first: lnjax on the path, malloc tuned before JAX)
from absl import app, flags

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
_GRID = flags.DEFINE_list("grid", ["3e-4", "0.3", "11"], "MIN,MAX,POINTS of the log grid.")
_BATCH = flags.DEFINE_integer("batch_size", 16, "LM sequences per batch.")
_TOLERANCE = flags.DEFINE_float("tolerance", 1.4, "The search's --tolerance.")
_PARALLEL = flags.DEFINE_integer("parallel", 1, "Runs at once.")
_KEEP = flags.DEFINE_string("keep", None, "A folder for the search's state, the finished grid "
                            "runs' summaries and the report (default: WORKDIR).")
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


def run_search(root, config, fixed, placements, depths, seeds, steps, margin,
               state=None) -> dict:
  cmd = [sys.executable, "-m", "lnjax.cli.stability", f"--config={config}",
         f"--workdir={root}", f"--placements={','.join(placements)}",
         f"--depths={','.join(map(str, depths))}", "--warmups=0", f"--seeds={seeds}",
         f"--probe_steps={steps}", f"--parallel={_PARALLEL.value}",
         f"--tolerance={3.0 if _QUICK.value else _TOLERANCE.value}",
         f"--margin_nats={margin}", f"--divergence_factor={DIVERGENCE_FACTOR}",
         *([f"--state={state}"] if state else []),
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


# What the verdict reads of a finished run's summary.json: all a ledger keeps.
LEDGER_KEYS = ("status", "step", "num_steps", "eval_loss", "unigram_baseline")


def restore_ledger(path: str, runs: list[sweep.Run], grid_root: str) -> int:
  """Writes the summary.json of each run the ledger at `path` holds and `grid_root` lacks,
  so the launcher skips it; how many it wrote."""
  ledger = launcher.read_json(path) or {}
  written = 0
  for run in runs:
    summary = os.path.join(grid_root, run.name, "summary.json")
    if run.name in ledger and not os.path.exists(summary):
      os.makedirs(os.path.dirname(summary), exist_ok=True)
      with open(summary, "w") as f:
        json.dump(ledger[run.name], f)
      written += 1
  return written


def save_ledger(path: str, runs: list[sweep.Run], grid_root: str) -> None:
  """The ledger at `path`: every finished run's summary (LEDGER_KEYS), old entries kept."""
  ledger = launcher.read_json(path) or {}
  for run in runs:
    if launcher.finished_state(run, os.path.join(grid_root, run.name)):
      summary = launcher.read_json(os.path.join(grid_root, run.name, "summary.json"))
      ledger[run.name] = {k: summary.get(k) for k in LEDGER_KEYS}
  tmp = path + ".tmp"
  with open(tmp, "w") as f:
    json.dump(dict(sorted(ledger.items())), f, indent=1)
  os.replace(tmp, path)


def main(argv):
  del argv
  config, fixed, placements, depths, seeds, steps, rates, margin = setup()
  root = _WORKDIR.value
  keep = _KEEP.value or root
  os.makedirs(keep, exist_ok=True)
  result = run_search(os.path.join(root, "search"), config, fixed, placements, depths,
                      seeds, steps, margin,
                      state=os.path.join(keep, "search_state.json") if _KEEP.value else None)
  runs = grid_runs(config, fixed, placements, depths, seeds, steps, rates)
  grid_root, ledger = os.path.join(root, "grid"), os.path.join(keep, "grid.json")
  if restored := restore_ledger(ledger, runs, grid_root):
    print(f"{restored} grid run(s) finished earlier, from {ledger}", flush=True)
  try:
    launcher.run_to_the_end(config, "grid", runs, grid_root, fixed, parallel=_PARALLEL.value,
                            devices_per_run=None,
                            on_finished=lambda run: save_ledger(ledger, [run], grid_root))
  finally:
    save_ledger(ledger, runs, grid_root)
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
    at_top = grid == rates[-1]  # The grid knows only "at least its top rate".
    ok = ((grid is None and found is None) or (ratio is not None and 1 / WITHIN <= ratio
                                               and (at_top or ratio <= WITHIN)))
    right += ok
    rows.append({"placement": cell["label"], "depth": d, "search": found,
                 "search_status": cell["status"], "grid": grid, "grid_at_top": at_top,
                 "ratio": ratio, "within": ok})
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
                 f"({r['search_status']}) | {'≥ ' * r['grid_at_top']}{fmt(r['grid'])} | "
                 f"{fmt(r['ratio'])} | "
                 f"{'yes' if r['within'] else 'no'} |")
  lines += ["", f"Within 1.5× of the grid: {right}/{len(rows)} cells = {fraction:.0%} "
            "(goal ≥ 80%).",
            f"Training steps: search {search_steps}, grid {grid_steps}: {cost:.2f} of the "
            "grid's (goal ≤ 0.33)."]
  with open(os.path.join(keep, "report.md"), "w") as f:
    f.write("\n".join(lines) + "\n")
  with open(os.path.join(keep, "report.json"), "w") as f:
    json.dump({"rows": rows, "within_fraction": fraction, "search_steps": search_steps,
               "grid_steps": grid_steps, "cost_fraction": cost, "grid_rates": rates}, f,
              indent=2)
  print("\n".join(lines))


if __name__ == "__main__":
  app.run(main)
