"""The stability search's results (python -m lnjax.cli.stability): a table per cell in Markdown
and JSON, and the figure of the highest stable rate with its bracket as error bars."""

import json

from lnjax.analysis import plotting
from lnjax.core import fileio
from lnjax.sweep import search


def rows(s) -> list[dict]:
  """One row per cell of the search `s` (lnjax.sweep.stability.Search): its answer, its bracket,
  its probes and the training steps they took."""
  out = []
  for cell in s.cells():
    placement, depth, warmup = cell
    start, outcome = s.bracket(placement, depth), s.outcome(cell)
    probes = s.state["probes"].get("/".join(map(str, cell)), {})
    range_test = s.state["range_tests"].get(f"{placement}/{depth}", {})
    lower, upper = (outcome.lower, outcome.upper) if outcome else (None, None)
    if not (outcome and outcome.status):  # Still searching: the bounds measured so far.
      lower, upper = _so_far(s.results(cell))
    out.append({
        "placement": placement, "label": _label(placement), "depth": depth, "warmup": warmup,
        "status": outcome.status if outcome and outcome.status else "unfinished",
        "highest_stable_lr": lower, "lowest_unstable_lr": upper,
        "next_lr": outcome.next_lr if outcome else None,
        "range_test_bracket": [start.lo, start.hi] if start else None,
        "range_test_note": start.note if start else None,
        "range_test_steps": range_test.get("steps"),
        "probes": [{"lr": float(lr), **p} for lr, p in probes.items()],
        "fails_by": _fails_by(probes, upper),
        "probe_runs": sum(len(p["runs"]) for p in probes.values()),
        "probe_steps_trained": sum(p["steps"] for p in probes.values()),
        "events": list(outcome.events) if outcome else []})
  return out


def _fails_by(probes: dict, upper: float | None) -> str | None:
  """How the probe at the lowest unstable rate failed (None: that end was never probed)."""
  probe = next((p for lr, p in probes.items() if upper is not None and float(lr) == upper), None)
  if not probe:
    return None
  return probe["fails_by"] if "fails_by" in probe else search.how_it_failed(probe["seeds"])


def _so_far(results: dict[float, bool]) -> tuple[float | None, float | None]:
  """An unfinished cell's probes (rate -> stable): the highest stable rate, and the lowest
  unstable rate above it."""
  lower = max((lr for lr, ok in results.items() if ok), default=None)
  upper = min((lr for lr, ok in results.items() if not ok and (lower is None or lr > lower)),
              default=None)
  return lower, upper


def _label(placement: str) -> str:
  return plotting.placement_label(placement)


def _lr(v) -> str:
  return "—" if v is None else f"{v:.3g}"


def answer(row: dict) -> str:
  if row["status"] == search.ABOVE:
    return f"≥ {_lr(row['highest_stable_lr'])}"
  if row["status"] == search.BELOW:
    return f"< {_lr(row['lowest_unstable_lr'])}"
  if row["status"] == "unfinished":
    lower = row["highest_stable_lr"]
    return "—" if lower is None else f"≥ {_lr(lower)} so far"
  return _lr(row["highest_stable_lr"])


def _unfinished(row: dict) -> str:
  if row["range_test_bracket"] is None:
    return "unfinished: range test not yet run"
  return f"unfinished: next probe {row['next_lr']:g}"


def markdown(s, table: list[dict], command: str) -> list[str]:
  lines = [f"# Highest stable learning rate: {s.config_arg}", "",
           f"`{command}`", "", s.stable.describe(s.seeds) + ".", "",
           f"Range test: {s.range_steps} steps, rate ×{search.range_test_growth(s.lr_min, s.lr_max, s.range_steps):.4f} "
           f"a step from {s.lr_min:g} to {s.lr_max:g}; bisection in log-space until the "
           f"bracket's ends are within ×{s.tolerance:g}; an end that fails is moved "
           f"×{s.widen:g} (the low end down to {s.lr_min:g}, the high end once).", "",
           "| placement | layers | warm-up (steps) | highest stable lr | lowest unstable lr "
           "| how it fails there | range-test bracket | probes | runs | steps trained | notes |",
           "|---|---:|---:|---:|---:|---|---|---:|---:|---:|---|"]
  for r in table:
    bracket = r["range_test_bracket"]
    notes = "; ".join(r["events"] + ([_unfinished(r)] if r["status"] == "unfinished" else []))
    lines.append(
        f"| {r['label']} | {r['depth']} | {r['warmup']} | {answer(r)} | "
        f"{_lr(r['lowest_unstable_lr'])} | {r['fails_by'] or '—'} | "
        + (f"{bracket[0]:.3g}–{bracket[1]:.3g}" if bracket else "—")
        + f" | {len(r['probes'])} | {r['probe_runs']} | {r['probe_steps_trained']} | {notes} |")
  range_steps = sum(e.get("steps") or 0 for e in s.state["range_tests"].values())
  probe_steps = sum(r["probe_steps_trained"] for r in table)
  lines += ["", f"Training steps: {range_steps} in {len(s.state['range_tests'])} range "
            f"test(s), {probe_steps} in probes, {range_steps + probe_steps} in all."]
  searching = sum(r["status"] == "unfinished" for r in table)
  if searching:
    lines += ["", f"{len(table) - searching} of {len(table)} cells measured; {searching} "
              "still searching (their bounds so far; the same command goes on). "
              + left(s, table)]
  return lines


def left(s, table: list[dict]) -> str:
  """What the unfinished cells still need, from their brackets so far: at least the probes of
  a bisection to the tolerance (⌈log₂⌉ of each bracket's log-width over the tolerance's,
  one at least), each one run if it fails and `seeds` if it holds; in time, at the pace of
  the probes recorded with their wall-clock seconds."""
  probes, unbracketed = 0, []
  for r in table:
    if r["status"] != "unfinished":
      continue
    if r["range_test_bracket"] is None:  # (One range test serves a depth's warm-ups.)
      unbracketed.append((r["placement"], r["depth"]))
      continue
    lo = r["highest_stable_lr"] or r["range_test_bracket"][0]
    hi = r["lowest_unstable_lr"] or r["range_test_bracket"][1]
    probes += max(1, search.predicted_probes(lo, hi, s.tolerance))
  span = lambda a, b: f"{a}" if a == b else f"{a}-{b}"
  range_tests = (f"{len(set(unbracketed))} range test(s) for {len(unbracketed)} cell(s)"
                 if unbracketed else "")
  if not probes:  # No cell bracketed yet: nothing to count but the range tests.
    return f"{range_tests} left, then their cells' probes."
  text = (f"At least {probes} probe(s) left ({span(probes, probes * s.seeds)} runs)"
          + (f", and {range_tests} with their probes" if unbracketed else ""))
  timed = [p for r in table for p in r["probes"] if p.get("seconds")]
  if not timed:
    return text + "."
  pace = sum(p["seconds"] for p in timed) / sum(len(p["runs"]) for p in timed)
  hours = span(f"{probes * pace / 3600:.1f}", f"{probes * s.seeds * pace / 3600:.1f}")
  return (text + f"; at {pace / 60:.1f} min a run (the {len(timed)} probe(s) timed so far), "
          f"{hours} h.")


def write(s, command: str) -> dict:
  table = rows(s)
  md = markdown(s, table, command)
  paths = {name: fileio.join(s.workdir, name)
           for name in ("stability.md", "stability.json", "stability.png")}
  fileio.write_text(paths["stability.md"], "\n".join(md) + "\n")
  fileio.write_text(paths["stability.json"], json.dumps({
      "command": command, "definition": s.stable.describe(s.seeds), "settings": s.settings,
      "left": left(s, table) if any(r["status"] == "unfinished" for r in table) else None,
      "cells": table}, indent=2) + "\n")
  settings = s.settings
  plot(paths["stability.png"], table,
       caption=f"config {settings['config']}; probes of {settings['probe_steps']:,} steps"
               " after the warm-up,"
               f" {settings['seeds']} seed{'s' if settings['seeds'] != 1 else ''} each (stable"
               " in all); range tests of"
               f" {settings['range_steps']:,} steps")
  below = [((r["placement"], r["depth"], r["warmup"]), r) for r in table
           if r["status"] == search.BELOW]
  return {"markdown": md, "paths": paths, "below": below}


# The mark at a bar's top: how the probe there failed (it diverged, or it finished without
# getting the margin below the unigram baseline).
_FAILS = {True: {"marker": "x", "markersize": 6},
          False: {"marker": "o", "markersize": 6, "markerfacecolor": "none"}}
_FAIL_NAMES = {True: "bar's top: diverged", False: "bar's top: too little learnt"}
# A cell still searching: its bounds so far, faded and hollow (▲ a stable rate and no
# unstable one above it yet, ▼ an unstable rate and no stable one below it yet).
_SO_FAR = {"alpha": 0.45, "markerfacecolor": "none"}
_SO_FAR_NAME = "still searching: bounds so far"


def _diverged(row: dict) -> bool | None:
  """Whether the probe at the row's lowest unstable rate diverged (True) or finished short of
  the margin (False); None where that is not known."""
  how = row.get("fails_by") or ""
  return True if how.startswith("diverged") else False if how.startswith("held-out") else None


def searching(row: dict) -> bool:
  """Whether the row is a cell still searching with a bound measured."""
  return row["status"] == "unfinished" and (row["highest_stable_lr"] is not None
                                            or row["lowest_unstable_lr"] is not None)


def plot(path: str, table: list[dict], caption: str = ""):
  """A panel per warm-up; per placement, the highest stable rate over depth, the bracket
  (up to the lowest unstable rate) as error bars, × or ○ at the top for how the probe there
  failed (diverged, or finished short of the margin); ▲ stable at the widened top, ▼ none
  found; a cell still searching, faded and hollow, its bounds so far."""
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  from matplotlib.lines import Line2D
  warmups = sorted({r["warmup"] for r in table})
  depths = sorted({r["depth"] for r in table})
  placements = list(dict.fromkeys(r["placement"] for r in table))
  kinds = {_diverged(r) for r in table if r["status"] == search.FOUND}
  fails = {d: _FAIL_NAMES[d] for d in (True, False) if d in kinds}  # Legend entries.
  so_far = any(searching(r) for r in table)
  # The legend's width: its longest name at about 0.09 in a character, the marker's 0.6 in.
  legend_in = 0.6 + 0.09 * max([len(_label(p)) for p in placements]
                               + [len(n) for n in fails.values()]
                               + [len(_SO_FAR_NAME)] * so_far, default=0)
  # Tall enough for the legend (about 0.27 in an entry) beside the axes, above the caption.
  height = max(4.0, 0.27 * (len(placements) + len(fails) + so_far) + 1.6)
  fig, axes = plt.subplots(1, len(warmups), figsize=(4.5 * len(warmups) + legend_in, height),
                           sharey=True, squeeze=False)
  width = 0.6 / max(len(placements), 1)
  style = {p: (plotting.placement_color(p, k), "osDPXhp"[k % 7]) for k, p in enumerate(placements)}
  drawn = set()  # The placements with a mark in some panel: one legend entry each.
  for ax, warmup in zip(axes[0], warmups):
    for k, placement in enumerate(placements):
      color, marker = style[placement]
      for r in table:
        if r["placement"] != placement or r["warmup"] != warmup:
          continue
        x = depths.index(r["depth"]) + (k - (len(placements) - 1) / 2) * width
        low, high = r["highest_stable_lr"], r["lowest_unstable_lr"]
        unfinished = r["status"] == "unfinished"
        if low is None and high is None:
          continue  # Still searching, nothing measured yet.
        look = {"color": color, **(_SO_FAR if unfinished else {})}
        if low is not None and high is not None:  # Found, or bounded so far.
          ax.errorbar([x], [low], yerr=[[0.0], [high - low]], fmt=marker, capsize=3, **look)
          if not unfinished and (diverged := _diverged(r)) is not None:  # How the top failed.
            ax.plot([x], [high], **_FAILS[diverged], color=color)
        else:  # ▼ no stable rate (found: BELOW), ▲ no unstable one (found: ABOVE).
          ax.plot([x], [high if low is None else low], "v" if low is None else "^", **look)
        drawn.add(placement)
    ax.set_xticks(range(len(depths)), [str(d) for d in depths])
    ax.set_xlim(-0.5, len(depths) - 0.5)  # Room for every placement's offset at each depth.
    for edge in range(1, len(depths)):  # Each depth a band, each placement at its place in it.
      ax.axvline(edge - 0.5, color="0.85", linewidth=0.8)
    ax.set_xlabel("depth (layers)")
    ax.set_yscale("log")
    ax.set_title(f"warm-up {warmup} steps" if warmup else "no warm-up")
    ax.grid(True, which="both", axis="y", alpha=0.3)
  axes[0][0].set_ylabel("highest stable peak learning rate\n(bar: up to the lowest unstable)")
  order = [_label(p) for p in placements if p in drawn]  # The sweep's order.
  handles = {_label(p): Line2D([], [], linestyle="none", color=style[p][0], marker=style[p][1])
             for p in drawn}
  for diverged, name in fails.items():
    handles[name] = Line2D([], [], linestyle="none", color="0.3", **_FAILS[diverged])
    order.append(name)
  if so_far:
    handles[_SO_FAR_NAME] = Line2D([], [], linestyle="none", marker="o", color="0.3", **_SO_FAR)
    order.append(_SO_FAR_NAME)
  right = 1 - legend_in / fig.get_figwidth()
  fig.tight_layout(rect=(0, 0, right, 1))
  plotting.add_caption(fig, caption)
  top = axes[0][0].get_position().y1  # The legend from the axes' top down, clear of the caption.
  fig.legend([handles[n] for n in order], order, loc="upper left", bbox_to_anchor=(right, top),
             frameon=False)
  return plotting.save(fig, path, dpi=120)
