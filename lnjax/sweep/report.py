"""A sweep's results, gathered from its run folders: one row per run (results.csv,
results.json and the table of report.md), the runs' loss curves overlaid
(loss_curves.png), and a stability map per placement (stability_map.png): the final
held-out loss (translation: best BLEU) over learning rate × warm-up, with diverged,
failed and stuck-at-baseline cells marked as such. They are written in the sweep's root,
a local folder or gs:// (lnjax.core.fileio).

A run is *stuck at the unigram baseline* when its final held-out loss is within
STUCK_NATS of the loss of predicting every token by its training-set frequency
(summary.json's `unigram_baseline`): it learned token frequencies and nothing else, which
is what Post-LN does with too little warm-up (the course workshop's runs). A run ending more than
STUCK_NATS *above* it (worse than token frequencies) is marked apart.
"""

import collections
import csv
import dataclasses
import io
import json
import math
import textwrap

from lnjax.analysis import plotting
from lnjax.core import fileio
from lnjax.sweep import Run, run_name
from lnjax.sweep.launcher import (COMPLETED, DIVERGED, FAILED, INTERRUPTED, MANIFEST, PENDING,
                                  RUNNING, read_json, read_metrics)

STUCK_NATS = 0.1
STUCK, ABOVE, OK = "stuck", "above", "ok"  # Cell states beside the launcher's run states.
# Which state a cell of several runs (seeds) shows: the first present in this order.
CELL_PRIORITY = (FAILED, DIVERGED, ABOVE, STUCK, INTERRUPTED, RUNNING, PENDING, OK)
DESCRIPTIONS = {OK: "completed", STUCK: "stuck at the unigram baseline",
                ABOVE: "above the unigram baseline"}
# Axes of the stability map; the other varying keys but the seed split it into panels.
MAP_AXES = ("opt.learning_rate", "opt.warmup_steps")
COLUMNS = {"model.norm_position": "norm_position", "opt.name": "optimizer",
           "opt.learning_rate": "learning_rate", "opt.warmup_steps": "warmup_steps",
           "seed": "seed", "train.num_steps": "num_steps"}


# ---------------------------------------------------------------------------------------
# Rows.


def gather(root: str, runs: list[Run]) -> list[dict]:
  """One row per run: its settings, state and final results."""
  manifest = (read_json(fileio.join(root, MANIFEST)) or {}).get("runs", {})
  extra_keys = [k for r in runs for k in r.overrides if k not in COLUMNS]
  extra_keys = list(dict.fromkeys(extra_keys))
  rows = []
  for run in runs:
    workdir = fileio.join(root, run.name)
    summary = read_json(fileio.join(workdir, "summary.json")) or {}
    entry = manifest.get(run.name, {})
    row = {"name": run.name, "state": _state(run, summary, entry)}
    row.update({column: run.setting(key) for key, column in COLUMNS.items()})
    row.update({key: _plain(run.setting(key)) for key in extra_keys})
    loss, baseline = summary.get("eval_loss"), summary.get("unigram_baseline")
    below = (baseline - loss) if loss is not None and baseline is not None else None
    judged = row["state"] == COMPLETED and below is not None
    row.update(
        step=summary.get("step"), eval_loss=loss, unigram_baseline=baseline,
        below_baseline=below, stuck=judged and abs(below) <= STUCK_NATS,
        above_baseline=judged and below < -STUCK_NATS,
        eval_bleu=summary.get("eval_bleu"), best_eval_bleu=summary.get("best_eval_bleu"),
        last_finite_train_loss=summary.get("last_finite_train_loss"),
        wall_seconds=summary.get("wall_seconds"),
        exit_code=entry.get("exit_code"), error=entry.get("error"), workdir=workdir)
    rows.append(row)
  return rows


def _state(run: Run, summary: dict, entry: dict) -> str:
  status = summary.get("status")
  if status == DIVERGED:
    return DIVERGED
  if status == COMPLETED and summary.get("num_steps") == run.setting("train.num_steps"):
    return COMPLETED
  if entry.get("state") in (FAILED, RUNNING):
    return entry["state"]
  return INTERRUPTED if summary else PENDING


def _plain(v):
  return list(v) if isinstance(v, tuple) else v


def metric(rows: list[dict]) -> tuple[str, str, bool]:
  """(row key, label, lower is better): BLEU for translation, else the held-out loss."""
  if any(r["best_eval_bleu"] is not None for r in rows):
    return "best_eval_bleu", "best validation BLEU", False
  return "eval_loss", "final held-out loss (nats/token)", True


def cell_state(row: dict) -> str:
  if row["state"] == COMPLETED:
    return STUCK if row["stuck"] else ABOVE if row["above_baseline"] else OK
  return row["state"]


# ---------------------------------------------------------------------------------------
# Stability maps.


@dataclasses.dataclass
class Cell:
  state: str  # The state the cell shows (CELL_PRIORITY).
  value: float | None  # Mean metric of its completed runs.
  runs: list[str]
  count: int  # Runs of the cell in `state`.

  def label(self) -> str:
    parts = [] if self.value is None else [f"{self.value:.3f}"]
    if self.state != OK:
      parts.append(self.state + (f" {self.count}/{len(self.runs)}" if len(self.runs) > 1 else ""))
    return " ".join(parts)


@dataclasses.dataclass
class StabilityMap:
  panel: str  # "norm=post" (or "norm=post,opt=sgd" when more keys vary).
  learning_rates: list[float]
  warmups: list[int]
  cells: dict  # (warmup_steps, learning_rate) -> Cell; a pair the sweep lacks is absent.
  label: str = ""  # The panel in words: "Post-LN" ("Post-LN, opt sgd").
  row_labels: list[str] | None = None  # by_rows' map: the placements' words, row by row.


def stability_maps(runs: list[Run], rows: list[dict]) -> list[StabilityMap]:
  """A map per placement (and per value of any other varying key but the seed)."""
  key, _, _ = metric(rows)
  varying = [k for k in dict.fromkeys(k for r in runs for k in r.overrides)
             if len({repr(r.setting(k)) for r in runs}) > 1]
  panel_keys = ["model.norm_position"] + [k for k in varying if k not in
                                          (*MAP_AXES, "model.norm_position", "seed")]
  panels: dict[str, list[tuple[Run, dict]]] = {}
  labels: dict[str, str] = {}
  for run, row in zip(runs, rows):
    settings = {k: run.setting(k) for k in panel_keys}
    panel = run_name(settings)
    panels.setdefault(panel, []).append((run, row))
    labels[panel] = plotting.legend_label(settings)
  maps = []
  for panel, members in panels.items():
    groups: dict[tuple, list[dict]] = {}
    for run, row in members:
      groups.setdefault((row["warmup_steps"], row["learning_rate"]), []).append(row)
    cells = {}
    for pair, group in groups.items():
      states = [cell_state(r) for r in group]
      state = next(s for s in CELL_PRIORITY if s in states)
      values = [r[key] for r in group if r["state"] == COMPLETED and r[key] is not None]
      cells[pair] = Cell(state, sum(values) / len(values) if values else None,
                         [r["name"] for r in group], states.count(state))
    maps.append(StabilityMap(panel, sorted({lr for _, lr in cells}),
                             sorted({w for w, _ in cells}), cells, labels[panel]))
  return maps


def by_rows(maps: list[StabilityMap]) -> tuple[list[StabilityMap], str]:
  """The maps to draw and their row label: when every panel has the one warm-up (the zoo
  sweeps), a single map with a row per panel; else the maps as they are, rows = warm-up."""
  warmups = {w for m in maps for w in m.warmups}
  if len(maps) < 2 or len(warmups) != 1 or any(len(m.warmups) != 1 for m in maps):
    return maps, "warm-up steps"
  (w,) = warmups
  cells = {(m.panel, lr): cell for m in maps for (_, lr), cell in m.cells.items()}
  return [StabilityMap(f"warm-up {w} steps", sorted({lr for m in maps for lr in
                                                     m.learning_rates}),
                       [m.panel for m in maps], cells, plotting.override_label("opt.warmup_steps", w),
                       [m.label or m.panel for m in maps])], "placement"


# ---------------------------------------------------------------------------------------
# Files.


def write(root: str, runs: list[Run], *, title: str, command: str = "",
          notes: tuple[str, ...] = ()) -> dict:
  """results.csv, results.json, report.md, loss_curves.png, stability_map.png in `root`.

  `notes` (Markdown lines) go between the summary line and the table. Returns the rows,
  the maps and the paths written.
  """
  fileio.makedirs(root)
  rows = gather(root, runs)
  maps = stability_maps(runs, rows)
  paths = {name: fileio.join(root, name) for name in
           ("results.csv", "results.json", "report.md", "loss_curves.png", "stability_map.png")}
  table = io.StringIO(newline="")
  writer = csv.DictWriter(table, fieldnames=list(rows[0]))
  writer.writeheader()
  writer.writerows({k: json.dumps(v) if isinstance(v, list) else v for k, v in r.items()}
                   for r in rows)
  fileio.write_text(paths["results.csv"], table.getvalue())
  fileio.write_text(paths["results.json"], json.dumps(rows, indent=2) + "\n")
  plot_loss_curves(paths["loss_curves.png"], runs, rows)
  plot_stability_maps(paths["stability_map.png"], maps, rows, runs)
  lines = markdown(rows, maps, title=title, command=command, notes=notes)
  fileio.write_text(paths["report.md"], "\n".join(lines) + "\n")
  return {"rows": rows, "maps": maps, "paths": paths, "markdown": lines}


def _fmt(v, spec: str = ".4f") -> str:
  return "—" if v is None else format(v, spec)


def markdown(rows: list[dict], maps: list[StabilityMap], *, title: str, command: str = "",
             notes: tuple[str, ...] = ()) -> list[str]:
  key, label, _ = metric(rows)
  counts = {}
  for r in rows:
    counts[cell_state(r)] = counts.get(cell_state(r), 0) + 1
  lines = [f"# {title}", ""]
  if command:
    lines += [f"Command: `{command}`", ""]
  lines += [f"{len(rows)} runs: " + ", ".join(
      f"{n} {DESCRIPTIONS.get(s, s)}"
      for s, n in counts.items()) + ".", ""]
  lines += [*notes, ""] if notes else []
  extra = [k for k in rows[0] if "." in k]  # Override keys beyond the standard columns.
  header = ["run", "state", "norm", "optimizer", "peak lr", "warm-up", "seed", *extra, "step",
            "held-out loss", "below unigram", "BLEU (best)", "minutes"]
  lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
  for r in rows:
    state = r["state"] + (f", {DESCRIPTIONS[cell_state(r)]}" if cell_state(r) in (STUCK, ABOVE)
                          else "")
    if r["state"] == FAILED and r["error"]:
      state += f" (exit {r['exit_code']}: {r['error'][:80]})"
    bleu = (f"{_fmt(r['eval_bleu'], '.2f')} ({_fmt(r['best_eval_bleu'], '.2f')})"
            if r["best_eval_bleu"] is not None else "—")
    cells = [r["name"], state, r["norm_position"], r["optimizer"], f"{r['learning_rate']:g}",
             str(r["warmup_steps"]), str(r["seed"]), *[str(r[k]) for k in extra],
             f"{_fmt(r['step'], 'd')}/{r['num_steps']}", _fmt(r["eval_loss"]),
             _fmt(r["below_baseline"], "+.4f"), bleu,
             _fmt(r["wall_seconds"] / 60 if r["wall_seconds"] is not None else None, ".1f")]
    lines.append("| " + " | ".join(c.replace("|", "/") for c in cells) + " |")
  baselines = {round(r["unigram_baseline"], 4) for r in rows if r["unigram_baseline"]}
  if baselines:
    lines += ["", f"Unigram baseline: {', '.join(map(str, sorted(baselines)))} nats. A run is "
              f"*stuck* when its final held-out loss is within {STUCK_NATS} nats of it, "
              f"*above* it when more than {STUCK_NATS} nats worse."]
  drawn, rows_label = by_rows(maps)
  lines += ["", f"## Stability maps: {label} over peak learning rate × {rows_label}", ""]
  for m in drawn:
    lines += [f"**{m.panel}**", "",
              f"| {rows_label} \\ lr | " + " | ".join(f"{lr:g}" for lr in m.learning_rates) + " |",
              "|---|" + "---|" * len(m.learning_rates)]
    for w in m.warmups:
      cells = [m.cells[(w, lr)].label() if (w, lr) in m.cells else "·" for lr in m.learning_rates]
      lines.append(f"| {w} | " + " | ".join(cells) + " |")
    lines.append("")
  lines += ["![stability maps](stability_map.png)", "", "![loss curves](loss_curves.png)"]
  return lines


# ---------------------------------------------------------------------------------------
# Plots.

STATE_COLORS = {DIVERGED: "#d62728", STUCK: "#9e9e9e", ABOVE: "#c7c7c7", FAILED: "#222222",
                INTERRUPTED: "#ffffff", RUNNING: "#ffffff", PENDING: "#ffffff"}


def _pyplot():
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  return plt


def plot_stability_maps(path: str, maps: list[StabilityMap], rows: list[dict],
                        runs: list[Run] | None = None):
  plt = _pyplot()
  from matplotlib.patches import Rectangle
  import numpy as np

  key, label, lower_better = metric(rows)
  maps, rows_label = by_rows(maps)
  values = [c.value for m in maps for c in m.cells.values()
            if c.state == OK and c.value is not None]
  vmin, vmax = (min(values), max(values)) if values else (0.0, 1.0)
  cmap = plt.get_cmap("viridis_r" if lower_better else "viridis")
  cols = min(len(maps), 3)
  nrows = math.ceil(len(maps) / cols)
  width = max(6.5, 1.3 * max(len(m.learning_rates) for m in maps) + 2)
  height = 0.7 * max(len(m.warmups) for m in maps) + 2
  fig, axes = plt.subplots(nrows, cols, squeeze=False, layout="constrained",
                           figsize=(width * cols, height * nrows))
  image = None
  for ax, m in zip(axes.flat, maps):
    grid = np.full((len(m.warmups), len(m.learning_rates)), np.nan)
    for (w, lr), cell in m.cells.items():
      if cell.state == OK and cell.value is not None:
        grid[m.warmups.index(w), m.learning_rates.index(lr)] = cell.value
    # Warm-up grows upwards; placements read top-down in the sweep's order.
    image = ax.imshow(np.ma.masked_invalid(grid), cmap=cmap, vmin=vmin, vmax=vmax,
                      origin="upper" if rows_label == "placement" else "lower", aspect="auto")
    for (w, lr), cell in m.cells.items():
      x, y = m.learning_rates.index(lr), m.warmups.index(w)
      if cell.state != OK:
        ax.add_patch(Rectangle((x - 0.5, y - 0.5), 1, 1, facecolor=STATE_COLORS[cell.state],
                               hatch={STUCK: "//", ABOVE: "xx"}.get(cell.state),
                               edgecolor="#555555", linewidth=0.5))
      ax.text(x, y, cell.label().replace(" ", "\n", 1), ha="center", va="center", fontsize=7,
              color=_text_color(cell, vmin, vmax, lower_better))
    ax.set_xticks(range(len(m.learning_rates)), [f"{lr:g}" for lr in m.learning_rates])
    ax.set_yticks(range(len(m.warmups)), m.row_labels or [str(w) for w in m.warmups])
    ax.set_xlabel("peak learning rate")
    ax.set_ylabel(rows_label)
    ax.set_title(m.label or m.panel)
  for ax in list(axes.flat)[len(maps):]:
    ax.axis("off")
  if image is not None and values:
    fig.colorbar(image, ax=axes.ravel().tolist(), label=label, shrink=0.8)
  fig.suptitle(textwrap.fill(f"{label}: red diverged, black failed, white unfinished; grey // "
                             f"stuck within {STUCK_NATS} nats of the unigram baseline, grey xx "
                             "above it", 8 * width), fontsize=9)
  _caption(fig, runs, constrained=True)
  return plotting.save(fig, path, dpi=120)


def _caption(fig, runs: list[Run] | None, constrained: bool = False) -> None:
  """The setup line: the task and size of the sweep's first run, its steps, the seeds
  of each setting."""
  if not runs:
    return
  seeds = collections.Counter(plotting.legend_label(r.overrides, drop=("seed",))
                              for r in runs).most_common(1)[0][1]
  text = plotting.setup_caption(runs[0].config.to_dict(), seeds=seeds)
  if constrained:  # constrained layout makes room for a figure-level x label.
    fig.supxlabel(text, fontsize=8, color="#333333")
  else:
    plotting.add_caption(fig, text)


def _text_color(cell: Cell, vmin: float, vmax: float, lower_better: bool) -> str:
  """White on the dark cells: diverged, failed, and the worse half of the colour map."""
  if cell.state in (DIVERGED, FAILED):
    return "white"
  if cell.state != OK or cell.value is None:
    return "black"
  worse_half = (cell.value - vmin) / ((vmax - vmin) or 1.0) > 0.5
  return "white" if worse_half == lower_better else "black"


def plot_loss_curves(path: str, runs: list[Run], rows: list[dict]):
  """Train loss (lines) and held-out loss (dots) of every setting, a panel per placement;
  runs that differ in the seed only as their mean with the min–max band."""
  plt = _pyplot()
  placements = list(dict.fromkeys(r["norm_position"] for r in rows))
  cols = min(len(placements), 5)
  nrows = math.ceil(len(placements) / cols)
  fig, axes = plt.subplots(nrows, cols, squeeze=False, sharey=True,
                           figsize=(6.5 * cols, 4.5 * nrows + 0.4))
  baselines = [r["unigram_baseline"] for r in rows if r["unigram_baseline"]]
  for ax, placement in zip(axes.flat, placements):
    settings: dict[str, list[tuple[Run, dict]]] = {}
    for run, row in zip(runs, rows):
      if row["norm_position"] == placement:
        label = plotting.legend_label(run.overrides, drop=("model.norm_position", "seed"))
        settings.setdefault(label, []).append((run, row))
    for i, (label, members) in enumerate(settings.items()):
      states = collections.Counter(cell_state(row) for _, row in members)
      if set(states) != {OK}:
        label += "; " + ", ".join(f"{n} {s}" for s, n in states.items())
      records = [read_metrics(row["workdir"]) for _, row in members]
      line = plotting.mean_band(ax, [tuple(zip(*_by_step(r, "train_loss"))) or ((), ())
                                     for r in records], label=label, color=f"C{i % 10}",
                                linewidth=1)
      plotting.mean_band(ax, [tuple(zip(*_by_step(r, "eval_loss"))) or ((), ())
                              for r in records], label="_nolegend_", style="o",
                         color=line.get_color() if line else f"C{i % 10}", markersize=3)
    if baselines:
      ax.axhline(baselines[0], color="grey", linestyle="--", linewidth=1,
                 label=f"unigram baseline {baselines[0]:.2f}")
    ax.set_title(plotting.placement_label(placement))
    ax.set_xlabel("training step")
    plotting.integer_ticks(ax)
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
      ax.legend(fontsize=7)
  for ax in list(axes.flat)[len(placements):]:
    ax.axis("off")
  for ax in axes[:, 0]:
    ax.set_ylabel(f"loss ({plotting.LOSS_UNIT}): lines train, dots held-out")
  fig.tight_layout()
  _caption(fig, runs)
  return plotting.save(fig, path, dpi=120)


def _by_step(records: list[dict], key: str) -> list[tuple[int, float]]:
  """(step, value) of `key`, the last record of a step winning (a resumed run rewrites)."""
  points = {r["step"]: r[key] for r in records if r.get(key) is not None}
  return sorted(points.items())
