r"""The stability search's accuracy and cost against a grid (issue 30, part 2).

  python benchmarks/stability_search.py --workdir=/tmp/stab_bench [--parallel=2] \
      [--keep=experiments/stability_search]  # the results kept apart: resumes anywhere
  python benchmarks/stability_search.py --workdir=/tmp/stab_bench_quick --quick   # a self-check
  ... the same flags, another --workdir, --report_only  # the report so far; launches nothing

For every placement of lnjax.models.placement at two depths of the CPU-size LM
(configs/lm.py, size=small: D 128, character-level Tiny Shakespeare), without warm-up:
  - the search (python -m lnjax.cli.stability, in WORKDIR/search): its highest stable rate;
  - an 11-point log grid of peak rates × 3 seeds (WORKDIR/grid), each run judged by the same
    definition of stable (lnjax.sweep.search.Stable); the grid's answer is its highest rate
    stable in every seed.
Reported (WORKDIR/report.md, report.json, report.png): per cell both answers, their ratio and the
training steps each took (the search's range test and probes, diverged runs counted up to
their divergence); over the cells both have finished, the fraction where the search is
within 1.5× of the grid (goal: ≥ 80%) and the search's steps over the grid's (goal: ≤ 1/3);
the search runs a probe's seed 0 first and its other seeds only once it holds, so the
report gives the steps of a grid with that economy too (its points' seeds in turn, each
only after those before it held), from the same runs. A placement at a time: its search,
then its grid, then the report of every cell so far, so cells are compared as they finish.
Both runs resume: the same command again continues them and only gathers what is
finished. With --keep=DIR, what a new WORKDIR needs to continue lives in DIR (the search's
state, DIR/grid.json with every finished grid run's summary) and the report is written
there too: the measurement goes on on another machine from a clone.

Where the grid's top rate is stable in every seed, the grid knows only "at least the top":
the search counts as within if its answer is at least the top / 1.5.

--quick: the LM smoke preset, Pre-LN at 2 layers, one seed, a 3-point grid, 20-step runs,
a search tolerance of 3×.
"""

import json
import math
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
_REPORT_ONLY = flags.DEFINE_bool("report_only", False, "The report from what has finished; "
                                 "launches nothing (beside a running measurement, say).")
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
               state=None, report_only=False) -> dict:
  cmd = [sys.executable, "-m", "lnjax.cli.stability", f"--config={config}",
         f"--workdir={root}", f"--placements={','.join(placements)}",
         f"--depths={','.join(map(str, depths))}", "--warmups=0", f"--seeds={seeds}",
         f"--probe_steps={steps}", f"--parallel={_PARALLEL.value}",
         f"--tolerance={3.0 if _QUICK.value else _TOLERANCE.value}",
         f"--margin_nats={margin}", f"--divergence_factor={DIVERGENCE_FACTOR}",
         *([f"--state={state}"] if state else []),
         *(["--report_only"] if report_only else []),
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


def compare(cells: list[dict], summaries: dict, rates, seeds: int,
            stable: search.Stable) -> list[dict]:
  """Per cell of the search's table (stability.json's cells): its answer against the grid's,
  and the training steps of each (the search's: its probes and its range test; diverged runs
  up to their divergence). A cell is compared once both have finished."""
  rows = []
  for cell in cells:
    p, d = cell["placement"], cell["depth"]
    names = {lr: [f"norm={p},layers={d},lr={lr:g},seed={s}" for s in range(seeds)]
             for lr in rates}
    judged = {lr: [stable.judge(summaries.get(n) or {}).stable for n in ns]
              for lr, ns in names.items()}
    grid_done = all(j is not None for js in judged.values() for j in js)
    stable_rates = [lr for lr, js in judged.items() if all(js)]
    grid = max(stable_rates) if grid_done and stable_rates else None
    found = cell["highest_stable_lr"]
    ratio = found / grid if grid and found else None
    at_top = grid == rates[-1]  # The grid knows only "at least its top rate".
    done = grid_done and cell["status"] != "unfinished"
    within = done and ((grid is None and found is None) or (
        ratio is not None and 1 / WITHIN <= ratio and (at_top or ratio <= WITHIN)))
    # Each side's bracket of the edge: from its highest stable rate up to the lowest unstable
    # one it saw above (the grid's: its next rate; 11 rates over three decades step 2×, so a
    # grid cannot place the edge finer). They agree when the brackets overlap.
    above = [lr for lr in rates if lr > (grid or 0)]
    grid_upper = above[0] if grid_done and above else None
    upper = cell.get("lowest_unstable_lr")
    consistent = done and (max(grid or 0.0, found or 0.0)
                           < min(grid_upper or math.inf, upper or math.inf))
    rows.append({
        "placement": cell["label"], "depth": d, "search": found,
        "search_status": cell["status"], "grid": grid, "grid_at_top": at_top,
        "grid_runs_finished": sum(j is not None for js in judged.values() for j in js),
        "grid_runs": len(rates) * seeds, "ratio": ratio, "done": done, "within": within,
        "grid_upper": grid_upper, "consistent": consistent,
        "search_steps": cell["probe_steps_trained"] + (cell["range_test_steps"] or 0),
        "grid_steps": sum(_steps(summaries, n) for ns in names.values() for n in ns),
        "lean_grid_steps": sum(_lean_steps(summaries, ns, js)
                               for ns, js in zip(names.values(), judged.values()))})
  return rows


def _steps(summaries: dict, name: str) -> int:
  return (summaries.get(name) or {}).get("step") or 0


def _lean_steps(summaries: dict, names: list[str], judged: list) -> int:
  """A grid point's steps had it run its seeds in turn, each only once those before it held
  (the economy the search's probes have: one unstable seed decides)."""
  steps = 0
  for name, stable in zip(names, judged):
    steps += _steps(summaries, name)
    if not stable:
      break
  return steps


def report(rows: list[dict], config: str, rates, seeds: int, steps: int,
           definition: str) -> tuple[list[str], dict]:
  """The Markdown lines and the JSON of the comparison; the fraction within 1.5× and the
  cost are over the cells both have finished."""
  done = [r for r in rows if r["done"]]
  right = sum(r["within"] for r in done)
  consistent = sum(r["consistent"] for r in done)
  search_steps = sum(r["search_steps"] for r in done)
  grid_steps = sum(r["grid_steps"] for r in done)
  lean_steps = sum(r["lean_grid_steps"] for r in done)
  fraction = right / len(done) if done else None
  cost = search_steps / grid_steps if grid_steps else None
  fmt = lambda v: "none" if v is None else f"{v:.3g}"
  lines = [f"# The stability search against a grid: {config}", "",
           f"Grid: {len(rates)} peak rates {rates[0]:g}–{rates[-1]:g} × {seeds} seed(s), "
           f"{steps} steps a run, no warm-up; search: `python -m lnjax.cli.stability` with the "
           "same steps and seeds.", "", definition + ".", "",
           "| placement | layers | search | grid | search / grid | within 1.5× | "
           "brackets agree | training steps: search / grid |",
           "|---|---:|---:|---:|---:|---|---|---:|"]
  for r in rows:
    if r["done"]:
      lines.append(f"| {r['placement']} | {r['depth']} | {fmt(r['search'])} "
                   f"({r['search_status']}) | {'≥ ' * r['grid_at_top']}{fmt(r['grid'])} | "
                   f"{fmt(r['ratio'])} | {'yes' if r['within'] else 'no'} | "
                   f"{'yes' if r['consistent'] else 'no'} | "
                   f"{r['search_steps']} / {r['grid_steps']} |")
    else:
      search_part = ("searching" if r["search_status"] == "unfinished"
                     else f"{fmt(r['search'])} ({r['search_status']})")
      lines.append(f"| {r['placement']} | {r['depth']} | {search_part} | "
                   f"{r['grid_runs_finished']} of {r['grid_runs']} runs | — | not yet | — | — |")
  if done:
    lines += ["", f"Within 1.5× of the grid: {right}/{len(done)} cells = {fraction:.0%} "
              "(goal ≥ 80%). Brackets agree (the search's, from its highest stable to its "
              "lowest unstable rate, overlaps the grid's, from its highest stable rate to the "
              f"next grid rate): {consistent}/{len(done)}.",
              f"Training steps: search {search_steps}, grid {grid_steps}: {cost:.2f} of the "
              "grid's (goal ≤ 0.33). Against a grid that runs a rate's other seeds only once "
              f"seed 0 holds, as the search's probes do ({lean_steps} steps): "
              f"{search_steps / max(lean_steps, 1):.2f}."]
  lines += ["", f"Cells compared: {len(done)} of {len(rows)}."]
  return lines, {"rows": rows, "cells_compared": len(done), "within_fraction": fraction,
                 "brackets_agree": consistent,
                 "search_steps": search_steps, "grid_steps": grid_steps,
                 "lean_grid_steps": lean_steps,
                 "cost_fraction": cost, "grid_rates": rates}


def plot(rows: list[dict], path: str, caption: str) -> None:
  """Per compared cell the search's highest stable rate against the grid's, log-log: the
  diagonal, the 1.5× band, a colour per placement and a marker per depth; a cell whose grid
  was stable at its top rate (the grid knows only "at least") hollow. Cells where either
  found no stable rate are not drawn (the caption counts them)."""
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  from matplotlib.lines import Line2D

  from lnjax.analysis import plotting

  drawn = [r for r in rows if r["done"] and r["grid"] and r["search"]]
  values = [v for r in drawn for v in (r["grid"], r["search"])] or [1e-3, 1e-1]
  lo, hi = min(values) / 3, max(values) * 3
  placements = list(dict.fromkeys(r["placement"] for r in drawn))
  depths = sorted({r["depth"] for r in drawn})
  fig, ax = plt.subplots(figsize=(7.5, 5))
  ax.fill_between([lo, hi], [lo / WITHIN, hi / WITHIN], [lo * WITHIN, hi * WITHIN],
                  color="0.9", lw=0)
  ax.plot([lo, hi], [lo, hi], color="0.5", lw=0.8)
  for r in drawn:
    color = plotting.placement_color(r["placement"], placements.index(r["placement"]))
    ax.plot([r["grid"]], [r["search"]], "osD^v"[depths.index(r["depth"]) % 5], ms=7,
            color=color, mfc="none" if r["grid_at_top"] else color)
  ax.set(xscale="log", yscale="log", xlim=(lo, hi), ylim=(lo, hi),
         xlabel="grid: highest peak rate stable in every seed",
         ylabel="search: highest stable peak rate")
  plotting.plain_log_ticks(ax)
  handles = ([Line2D([], [], color=plotting.placement_color(p, k), marker="o", ls="", label=p)
              for k, p in enumerate(placements)]
             + [Line2D([], [], color="0.3", marker="osD^v"[k % 5], ls="",
                       label=plotting.layers(d)) for k, d in enumerate(depths)]
             + [Line2D([], [], color="0.3", marker="o", mfc="none", ls="",
                       label="grid stable at its top: ≥")]
             + [plt.Rectangle((0, 0), 1, 1, color="0.9", label=f"within {WITHIN:g}×")])
  ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.02, 1), frameon=False)
  fig.tight_layout()
  left_out = sum(r["done"] for r in rows) - len(drawn)
  plotting.add_caption(fig, caption + (f"; {left_out} compared cell(s) without a stable rate "
                                       "in the grid or the search not drawn" if left_out else ""))
  plotting.save(fig, path)


def main(argv):
  del argv
  config, fixed, placements, depths, seeds, steps, rates, margin = setup()
  root = _WORKDIR.value
  keep = _KEEP.value or root
  os.makedirs(keep, exist_ok=True)
  state = os.path.join(keep, "search_state.json") if _KEEP.value else None
  runs = grid_runs(config, fixed, placements, depths, seeds, steps, rates)
  grid_root, ledger = os.path.join(root, "grid"), os.path.join(keep, "grid.json")
  if restored := restore_ledger(ledger, runs, grid_root):
    print(f"{restored} grid run(s) finished earlier, from {ledger}", flush=True)

  def search_of(which: list[str], report_only: bool = False) -> dict:
    return run_search(os.path.join(root, "search"), config, fixed, which, depths, seeds,
                      steps, margin, state=state, report_only=report_only)

  def write_report() -> None:
    """The report of every cell from what has finished (in --keep, else WORKDIR: report.md,
    .json, .png): the search's state tabled without launching a run, the grid's summaries."""
    result = search_of(placements, report_only=True)
    summaries = {r.name: launcher.read_json(os.path.join(grid_root, r.name, "summary.json"))
                 or {} for r in runs}
    rows = compare(result["cells"], summaries, rates, seeds,
                   search.Stable(steps, DIVERGENCE_FACTOR, margin))
    lines, data = report(rows, config, rates, seeds, steps, result["definition"])
    with open(os.path.join(keep, "report.md"), "w") as f:
      f.write("\n".join(lines) + "\n")
    with open(os.path.join(keep, "report.json"), "w") as f:
      json.dump(data, f, indent=2)
    batch = f", batches of {fixed['data.batch_size']}" if "data.batch_size" in fixed else ""
    summary = (f"{data['cells_compared']} of {len(rows)} cells compared"
               + (f", {data['within_fraction']:.0%} within {WITHIN:g}×, the search at "
                  f"{data['cost_fraction']:.2f} of the grid's steps"
                  if data["cells_compared"] else ""))
    plot(rows, os.path.join(keep, "report.png"),
         f"{config}{batch}, no warm-up; grid "
         f"{rates[0]:g}–{rates[-1]:g}, {len(rates)} rates × {seeds} seeds, {steps} steps a "
         f"run; {summary}")
    print("\n".join(lines) + f"\nFigure: {os.path.join(keep, 'report.png')}", flush=True)

  if _REPORT_ONLY.value:
    write_report()
    return
  # A placement at a time, its search then its grid, the report rewritten after each: the
  # cells are compared as they finish, not once every search has.
  for p in placements:
    search_of([p])
    mine = [r for r in runs if r.overrides["model.norm_position"] == p]
    try:
      launcher.run_to_the_end(config, "grid", mine, grid_root, fixed,
                              parallel=_PARALLEL.value, devices_per_run=None,
                              on_finished=lambda run: save_ledger(ledger, [run], grid_root))
    finally:
      save_ledger(ledger, mine, grid_root)
    write_report()


if __name__ == "__main__":
  app.run(main)
