r"""The stability atlas (issue 30): the highest stable learning rate of every placement ×
depth × warm-up measured so far, one table and one figure.

  python experiments/atlas.py                      # tables every slice, trains nothing
  python experiments/atlas.py --run=d12 --workdir=/tmp/atlas_d12   # continues one slice
  python experiments/atlas.py --run=w500_d6 --placements=post,pre --workdir=/tmp/w6
                                                   # ... only these placements' cells of it
  python experiments/atlas.py --run=w500_d24 --parallel=2 --workdir=/tmp/w24
                                                   # ... two runs at once, one a core

The atlas is measured in slices, each a `python -m lnjax.cli.stability` search on the
CPU-size LM (configs/lm.py, size=small: D 128, character-level Tiny Shakespeare, batches of
16) whose state lives in experiments/atlas/SLICE.json: a new workdir on another machine
continues it from a clone, and no finished probe is run again; a warm-up slice takes the
range tests of the no-warm-up slice of its depth (a range test serves every warm-up). A
slice is one search per depth, so that each round of probes runs at one depth's pace, and
--placements narrows a run to the cells wanted first (the state is the slice's, whichever
placements continue it); stopping a --run (SIGTERM, Ctrl-C) stops its search and the search
its runs, each saving a checkpoint to resume from. Without --run, each slice's
search is asked for its table (`--report_only`: nothing is launched) and the slices are
merged: experiments/atlas/atlas.md (--report), docs/figures/atlas.png (--figure), and which
cells of the 14 placements × depths 6, 12, 24 × warm-up 0, 500 are measured, which are still
searching (drawn faded at the bounds their probes have set so far) and which not yet.
"""

import datetime
import json
import os
import subprocess
import sys

from absl import app, flags

from lnjax import models
from lnjax.analysis import plotting
from lnjax.sweep import stability_report

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

import atlas_blocks  # noqa: E402  (beside this script)

# The 2020 atlas's 14 placements (measured 2026-12-01 to 12-05); the modern block takes every
# placement lnjax has (HybridNorm and Derf too, and any added later: a new cell of each slice).
PLACEMENTS_2020 = models.NORM_POSITIONS[:14]
ALL = ",".join(PLACEMENTS_2020)
EVERY = ",".join(models.NORM_POSITIONS)
COMMON = ["--config=configs/lm.py:size=small", "--seeds=2", "--config.data.batch_size=16"]
# name: (the search's own flags, what the slice is for). Short probes and a 2× tolerance
# keep 14 placements to a few hours on 2 cores; the claim pair is measured finer, and a
# later slice's cell replaces an earlier one's.
SLICES = {
    "d6": ([f"--placements={ALL}", "--depths=6", "--warmups=0", "--probe_steps=300",
            "--tolerance=2"], "every placement at 6 layers, no warm-up"),
    "d12": ([f"--placements={ALL}", "--depths=12", "--warmups=0", "--probe_steps=300",
             "--tolerance=2"], "every placement at 12 layers, no warm-up"),
    "d24": ([f"--placements={ALL}", "--depths=24", "--warmups=0", "--probe_steps=300",
             "--tolerance=2"], "every placement at 24 layers, no warm-up"),
    **{f"w500_d{d}": ([f"--placements={ALL}", f"--depths={d}", "--warmups=500",
                        "--probe_steps=300", "--tolerance=2"],
                       f"every placement at {d} layers after 500 warm-up steps")
       for d in (6, 12, 24)},
    "claim_d12": (["--placements=post,pre", "--depths=12", "--warmups=0", "--probe_steps=600"],
                  "the paper's claim: Post-LN against Pre-LN at 12 layers, no warm-up"),
}
GRID = {"depths": (6, 12, 24), "warmups": (0, 500)}
# One range test serves every warm-up of its (placement, depth): these slices take the
# brackets the no-warm-up slices measured (--range_tests_from) instead of running them again.
BORROWS = {f"w500_d{d}": (f"d{d}",) for d in (6, 12, 24)}
# The modern block (issue 61): rotary positions (Su et al., arXiv 2104.09864), a SwiGLU
# feed-forward (Shazeer, arXiv 2002.05202), RMSNorm, no biases — Llama's block at the same
# size (D 128, 4 heads, F 512), data and search settings as the 2020 atlas's 12-layer slices.
MODERN = ["--config.model.pos_emb=rope", "--config.model.activation=silu",
          "--config.model.gated_ffn=true", "--config.model.norm_kind=rmsnorm",
          "--config.model.use_bias=false"]
MODERN_SLICES = {
    "d12": ([f"--placements={EVERY}", "--depths=12", "--warmups=0", "--probe_steps=300",
             "--tolerance=2"], "every placement at 12 layers, no warm-up, modern block"),
    "w500_d12": ([f"--placements={EVERY}", "--depths=12", "--warmups=500", "--probe_steps=300",
                  "--tolerance=2"], "every placement at 12 layers after 500 warm-up steps, "
                 "modern block"),
}
# block: (its slices, the (depth, warm-up) grid, the borrowed range tests, its config flags,
# the folder of its states under experiments/, its figure under docs/figures/, its placements).
BLOCKS = {
    "2020": (SLICES, GRID, BORROWS, [], "atlas", "atlas.png", PLACEMENTS_2020),
    "modern": (MODERN_SLICES, {"depths": (12,), "warmups": (0, 500)},
               {"w500_d12": ("d12",)}, MODERN, "atlas_modern", "atlas_modern.png",
               models.NORM_POSITIONS),
}

_BLOCK = flags.DEFINE_enum("block", "2020", list(BLOCKS), "The Transformer block: 2020 "
                           "(the paper's: learned positions, ReLU, LayerNorm, biases) or "
                           "modern (RoPE, SwiGLU, RMSNorm, no biases); each its own states.")
_RUN = flags.DEFINE_string("run", None, "Continue one slice of the block (2020: "
                           f"{', '.join(SLICES)}; modern: {', '.join(MODERN_SLICES)}) in "
                           "--workdir; without it, table every slice.")
_PLACEMENTS = flags.DEFINE_list("placements", None, "With --run: continue only these "
                                 "placements' cells of the slice (default: all of them).")
_PARALLEL = flags.DEFINE_integer("parallel", 1, "With --run: runs at once, each on its share "
                                 "of this process's cores (one slice a core; 2 for the last "
                                 "slice left on 2 cores).", lower_bound=1)
_WORKDIR = flags.DEFINE_string("workdir", "/tmp/lnjax_atlas", "The search's run folders "
                               "(--run), or each slice's own report (tables).")
_STATES = flags.DEFINE_string("states", None, "The folder of the slices' states (default: "
                              "experiments/atlas, experiments/atlas_modern for the modern "
                              "block).")
_FIGURE = flags.DEFINE_string("figure", None, "Where the merged figure goes (default: "
                              "docs/figures/atlas.png, atlas_modern.png).")
_REPORT = flags.DEFINE_string("report", None, "Where the merged table goes (default: "
                              "atlas.md in --states, beside the slices' states).")


def states_dir(block: str) -> str:
  if _STATES.value and block == _BLOCK.value:
    return _STATES.value
  return os.path.join(REPO, "experiments", BLOCKS[block][4])


def state_path(name: str, block: str = "2020") -> str:
  return os.path.join(states_dir(block), f"{name}.json")


def search_command(name: str, workdir: str, report_only: bool,
                   placements: list[str] | None = None, block: str = "2020") -> list[str]:
  slices, _, borrows, extra = BLOCKS[block][:4]
  borrowed = [state_path(n, block) for n in borrows.get(name, ())
              if os.path.exists(state_path(n, block))]
  flags_ = [f"--placements={','.join(placements)}" if placements and f.startswith(
      "--placements=") else f for f in slices[name][0]]
  return [sys.executable, "-m", "lnjax.cli.stability", *COMMON, *extra, *flags_,
          f"--parallel={_PARALLEL.value}", f"--workdir={workdir}",
          f"--state={state_path(name, block)}",
          *(["--report_only"] if report_only else
            [f"--range_tests_from={','.join(borrowed)}"] if borrowed else [])]


def verdict(cell: dict) -> str:
  """A measured cell in a word: its highest stable rate, or where no stable or no unstable
  rate was found, the bound the search reached."""
  low, high = cell["highest_stable_lr"], cell["lowest_unstable_lr"]
  if low is None:
    return f"< {high:.3g}"
  return f"{low:.3g}" if high is not None else f"≥ {low:.3g}"


def so_far(cell: dict) -> str:
  """A cell still searching in a word: the bounds its probes have set so far."""
  low, high = cell["highest_stable_lr"], cell["lowest_unstable_lr"]
  both = low is not None and high is not None
  return "searching: " + (f"{low:.3g}–{high:.3g}" if both else verdict(cell))


def lift(before: dict | None, after: dict | None) -> str:
  """What the warm-up does to one (placement, depth)'s edge: the highest stable rate after
  it over the highest without it; a bound where the cell without it has no stable rate."""
  if before is None or after is None or after["highest_stable_lr"] is None:
    return "—"
  if before["highest_stable_lr"] is None:
    return f"> {after['highest_stable_lr'] / before['lowest_unstable_lr']:.2g}×"
  return f"{after['highest_stable_lr'] / before['highest_stable_lr']:.2g}×"


def merged(block: str, only: tuple[str, ...] = (), placements: list[str] | None = None
           ) -> tuple[dict, dict, list[str], list[str]]:
  """Every slice of `block` (or those named in `only`) asked for its table (`--report_only`:
  nothing is launched) over its placements (or `placements`): (measured cells, cells still
  searching, a line per slice, each slice's settings); a later slice's cell replaces an
  earlier one's."""
  slice_defs = BLOCKS[block][0]
  cells, searching, lines, slices = {}, {}, [], []
  for name in [n for n in slice_defs if not only or n in only]:
    if not os.path.exists(state_path(name, block)):
      lines.append(f"- {name} ({slice_defs[name][1]}): not started")
      continue
    out = os.path.join(_WORKDIR.value, block, name)
    subprocess.run(search_command(name, out, True, placements, block), cwd=REPO, check=True,
                   stdout=subprocess.DEVNULL)
    with open(os.path.join(out, "stability.json")) as f:
      result = json.load(f)
    steps = result["settings"]["probe_steps"]
    done = [c for c in result["cells"] if c["status"] != "unfinished"]
    lines.append(f"- {name} ({slice_defs[name][1]}; probes of {steps} steps): "
                 f"{len(done)} of {len(result['cells'])} cells measured"
                 + (f". {result['left']}" if result.get("left") else ""))
    slices.append(f"{name}: {steps}-step probes, tolerance {result['settings']['tolerance']:g}×")
    for c in done:
      cells[(c["placement"], c["depth"], c["warmup"])] = {**c, "probe_steps": steps,
                                                          "slice": name}
    for c in filter(stability_report.searching, result["cells"]):  # Bounded so far.
      searching[(c["placement"], c["depth"], c["warmup"])] = c
  searching = {k: c for k, c in searching.items() if k not in cells}  # Measured elsewhere.
  return cells, searching, lines, slices


def main(argv):
  del argv
  block = _BLOCK.value
  slice_defs, grid, placements = BLOCKS[block][0], BLOCKS[block][1], BLOCKS[block][6]
  if _RUN.value and _RUN.value not in slice_defs:
    raise app.UsageError(f"--run={_RUN.value}: no such slice of the {block} block; its "
                         f"slices: {', '.join(slice_defs)}")
  if _PLACEMENTS.value and not _RUN.value:
    raise app.UsageError("--placements narrows a --run; the tables take every placement")
  if _RUN.value:
    # The search in this process's place: a signal to it (SIGTERM, Ctrl-C) stops the search,
    # which stops its runs, each saving a checkpoint.
    command = search_command(_RUN.value, _WORKDIR.value, False, _PLACEMENTS.value, block)
    os.chdir(REPO)
    os.execv(command[0], command)
  cells, searching, lines, slices = merged(block)
  table = [cells[k] for k in sorted(cells, key=lambda k: (
      k[2], k[1], list(models.NORM_POSITIONS).index(k[0])))]
  fmt = lambda v: "—" if v is None else f"{v:.3g}"
  md = ["| placement | layers | warm-up | highest stable lr | lowest unstable lr | "
        "how it fails there | probe steps | slice |", "|---|---:|---:|---:|---:|---|---:|---|"]
  md += [f"| {c['label']} | {c['depth']} | {c['warmup']} | {fmt(c['highest_stable_lr'])} | "
         f"{fmt(c['lowest_unstable_lr'])} | {c.get('fails_by') or '—'} | {c['probe_steps']} | "
         f"{c['slice']} |" for c in table]
  # Which cells are measured: a placement per row, a (depth, warm-up) per column.
  columns = [(d, w) for w in grid["warmups"] for d in grid["depths"]]
  coverage = ["| placement | " + " | ".join(f"{d} layers, warm-up {w}" for d, w in columns)
              + " |", "|---|" + "---|" * len(columns)]
  for p in placements:
    marks = [verdict(cells[(p, d, w)]) if (p, d, w) in cells else
             so_far(searching[(p, d, w)]) if (p, d, w) in searching else "not yet"
             for d, w in columns]
    coverage.append(f"| {plotting.placement_label(p)} | " + " | ".join(marks) + " |")
  # The warm-up's lift: a placement per row, a depth per column ("—": a cell not measured,
  # or no stable rate after the warm-up).
  (cold, warm), depths = grid["warmups"], grid["depths"]
  lifts = ["| placement | " + " | ".join(f"{d} layers" for d in depths) + " |",
           "|---|" + "---:|" * len(depths)]
  for p in placements:
    lifts.append(f"| {plotting.placement_label(p)} | " + " | ".join(
        lift(cells.get((p, d, cold)), cells.get((p, d, warm))) for d in depths) + " |")
  total = len(placements) * len(grid["depths"]) * len(grid["warmups"])
  lines.append(f"Cells measured: {len(table)} of the atlas's {total} "
               f"({len(placements)} placements × depths "
               f"{', '.join(map(str, grid['depths']))} × warm-up "
               f"{', '.join(map(str, grid['warmups']))}).")
  title = "# The stability atlas" + (", modern block" if block == "modern" else "")
  made = (f"`python experiments/atlas.py{' --block=modern' if block == 'modern' else ''}` "
          f"({datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC)")
  report = "\n".join([title, "", f"Tabled by {made} from the slices' states in "
                      f"experiments/{BLOCKS[block][4]}/; each slice measured by `python "
                      "experiments/atlas.py" + (" --block=modern" if block == "modern" else "")
                      + " --run=SLICE --workdir=DIR`.", "", *md, "", *lines, "",
                      "Highest stable rate by cell (searching: the bounds its probes have "
                      "set so far; not yet: no probe yet):", "",
                      *coverage, "",
                      f"The warm-up's lift: the highest stable rate after {warm} warm-up "
                      f"steps over the highest without warm-up, by depth:", "", *lifts]) + "\n"
  path = _REPORT.value or os.path.join(states_dir(block), "atlas.md")
  with open(path, "w") as f:
    f.write(report)
  caption = ("configs/lm.py:size=small" + (" (RoPE, SwiGLU, RMSNorm, no biases)" if block ==
              "modern" else "") + ", batches of 16, 2 seeds a probe; stable: every seed "
             "finishes without diverging, held-out loss ≥ 0.1 nats below the unigram "
             "baseline; " + "; ".join(slices) + f"; {made.replace('`', '')}")
  if searching:
    caption += (f"; faded: {len(searching)} cell(s) still searching, at the bounds their "
                "probes have set so far")
  figure = _FIGURE.value or os.path.join(REPO, "docs", "figures", BLOCKS[block][5])
  if table or searching:  # (Nothing to draw before a slice's first probe.)
    stability_report.plot(figure, table + list(searching.values()), caption)
  if block == "modern":  # Both blocks' 12-layer edges side by side.
    # The same slices and settings over every placement: the 2025 ones were searched on the
    # 2020 block after its atlas (--run=d12 --placements=hybridnorm,derf).
    older, older_searching = merged("2020", only=tuple(MODERN_SLICES),
                                    placements=list(models.NORM_POSITIONS))[:2]
    pending = tuple({k: so_far(c) for k, c in cells_of.items()}
                    for cells_of in (older_searching, searching))
    report += "\n" + "\n".join(atlas_blocks.comparison(older, cells, pending=pending)) + "\n"
    atlas_blocks.figure(os.path.join(REPO, "docs", "figures", "atlas_blocks.png"), older, cells,
                        made=made.replace("`", ""))
    with open(path, "w") as f:
      f.write(report)
  print(report + f"Table: {path}\nFigure: {figure}")


if __name__ == "__main__":
  app.run(main)
