r"""Compare runs side by side, whatever made them (lnjax.main, a sweep, two machines).

  python -m lnjax.cli.compare DIR1 DIR2 ... [--output=compare]

reads each workdir's metrics.jsonl, summary.json and config.json and writes
  compare.png   train loss, held-out loss and (where any run has it) BLEU against the
                step, a row of panels per task (LM, translation), the unigram baseline
                dashed, runs differing in the seed only as a mean with a min–max band
  compare.md    a Markdown table of each run's final and best values (also printed)
"""

import json
import math
import os

from lnjax.analysis import plotting
from lnjax.core import fileio, metrics as metrics_lib


def load_run(workdir: str) -> dict:
  """{'name', 'records', 'summary', 'config'} of one workdir."""
  records = metrics_lib.read_metrics(workdir)
  summary = json.loads(fileio.read_text(os.path.join(workdir, "summary.json")) or "{}")
  config = json.loads(fileio.read_text(os.path.join(workdir, "config.json")) or "{}")
  if not records and not summary:
    raise FileNotFoundError(f"{workdir} holds no metrics.jsonl or summary.json: not a run")
  return {"workdir": workdir, "records": records, "summary": summary, "config": config}


def _names(workdirs: list[str]) -> list[str]:
  """The shortest distinct tails of the paths ('post', 'runs/a/post' if two end in post)."""
  parts = [os.path.normpath(os.path.abspath(w)).split(os.sep) for w in workdirs]
  for n in range(1, max(map(len, parts)) + 1):
    names = ["/".join(p[-n:]) for p in parts]
    if len(set(names)) == len(names):
      return names
  return workdirs


def series(records: list[dict], key: str) -> tuple[list[int], list[float]]:
  pts = [(r["step"], r[key]) for r in records if r.get(key) is not None]
  return [p[0] for p in pts], [p[1] for p in pts]


def table(runs: list[dict]) -> str:
  """Final and best values of every run (best: lowest loss, highest BLEU)."""
  has_bleu = any(series(r["records"], "eval_bleu")[0] for r in runs)
  head = ["run", "norm", "status", "step", "final train loss", "final eval loss",
          "best eval loss"] + (["final BLEU", "best BLEU"] if has_bleu else [])
  rows = []
  for r in runs:
    s, model = r["summary"], r["config"].get("model", {})
    train = series(r["records"], "train_loss")[1]
    steps, evals = series(r["records"], "eval_loss")
    best_eval = min(range(len(evals)), key=evals.__getitem__) if evals else None
    row = [r["name"], model.get("norm_position", "?"), s.get("status", "?"),
           str(s.get("step", steps[-1] if steps else "?")), _num(train[-1] if train else None),
           _num(evals[-1] if evals else None),
           f"{_num(evals[best_eval])} (step {steps[best_eval]})" if evals else "–"]
    if has_bleu:
      bsteps, bleu = series(r["records"], "eval_bleu")
      best = max(range(len(bleu)), key=bleu.__getitem__) if bleu else None
      row += [_num(bleu[-1] if bleu else None, 2),
              f"{_num(bleu[best], 2)} (step {bsteps[best]})" if bleu else "–"]
    rows.append(row)
  lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
  return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in rows]) + "\n"


def _num(v, digits: int = 4) -> str:
  return "–" if v is None or not math.isfinite(v) else f"{v:.{digits}f}"


def _task(run: dict) -> str:
  return run["config"].get("task", "lm")


def _baseline(run: dict) -> float | None:
  """The held-out unigram baseline of the run's data (summary.json, else the eval records)."""
  value = run["summary"].get("unigram_baseline")
  if value is None:
    value = next((r["eval_unigram_baseline"] for r in reversed(run["records"])
                  if r.get("eval_unigram_baseline") is not None), None)
  return value


def seed_groups(runs: list[dict]) -> list[tuple[str, list[dict]]]:
  """Runs whose configs differ in the seed only, grouped; each group with its legend
  ('Post-LN, warm-up 500'), the run names added where two groups would read the same."""
  groups: dict[tuple[str, int], list[dict]] = {}
  for r in runs:
    key = json.dumps({k: v for k, v in r["config"].items() if k != "seed"}, sort_keys=True)
    n = 0  # Two runs of the same seed are not seeds of one setting: a group each.
    while any(m["config"].get("seed") == r["config"].get("seed") for m in groups.get((key, n), [])):
      n += 1
    groups.setdefault((key, n), []).append(r)
  labels = [plotting.run_label(g[0]["config"]) for g in groups.values()]
  out = []
  for label, members in zip(labels, groups.values()):
    names = "+".join(m["name"] for m in members) if len(members) > 1 else members[0]["name"]
    if not label:
      label = names
    elif labels.count(label) > 1:
      label = f"{label} ({names})"
    out.append((label, members))
  return out


def plot(runs: list[dict], path: str, title: str | None = None):
  """compare.png: a row of panels per task (language-model and translation losses are not
  on one scale), train and held-out loss against the step and BLEU where a run has it; the
  unigram baseline dashed; runs that differ in the seed only as their mean and min–max
  band. Returns the (closed) figure."""
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  tasks = list(dict.fromkeys(_task(r) for r in runs))
  columns = [("train_loss", f"train loss ({plotting.LOSS_UNIT})"),
             ("eval_loss", f"held-out loss ({plotting.LOSS_UNIT})")]
  if any(series(r["records"], "eval_bleu")[0] for r in runs):
    columns.append(("eval_bleu", "BLEU (sacreBLEU, 0–100)"))
  fig, axes = plt.subplots(len(tasks), len(columns), squeeze=False,
                           figsize=(5.2 * len(columns), 3.9 * len(tasks) + 0.4))
  colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
  captions = []
  for row, task in zip(axes, tasks):
    members = [r for r in runs if _task(r) == task]
    groups = seed_groups(members)
    row[1].sharey(row[0])  # Train and held-out loss on one scale.
    baselines = sorted({round(b, 4) for b in map(_baseline, members) if b is not None})
    for ax, (key, label) in zip(row, columns):
      for i, (name, group) in enumerate(groups):
        plotting.mean_band(ax, [_finite(series(r["records"], key)) for r in group],
                           label=name + _non_finite_note(group, key),
                           color=colors[i % len(colors)], style=_style(key, i, groups),
                           lw=1.4, ms=3.5)
      if key != "eval_bleu":
        for b in baselines:
          ax.axhline(b, color="grey", ls="--", lw=1, label=f"unigram baseline {b:.2f}")
      elif not any(series(r["records"], key)[0] for r in members):
        ax.text(0.5, 0.5, f"no BLEU ({plotting.task_label(task)})", ha="center",
                va="center", transform=ax.transAxes, color="grey")
        ax.axis("off")
        continue
      ax.set_title(f"{plotting.task_label(task)}: {label.split(' (')[0]}")
      ax.set_xlabel("training step")
      ax.set_ylabel(label)
      plotting.integer_ticks(ax)
      ax.grid(alpha=0.3)
    _fit_losses(row[:2], [y for r in members for key in ("train_loss", "eval_loss")
                          for y in _finite(series(r["records"], key))[1]] + baselines)
    row[0].legend(fontsize=8, loc="best")
    captions += [_run_caption(name, group) for name, group in groups]
  fig.suptitle(title or ", ".join(r["name"] for r in runs))
  fig.tight_layout()
  plotting.add_caption(fig, "\n".join(captions))
  return plotting.save(fig, path)


def _finite(points: tuple[list, list]) -> tuple[list, list]:
  """A curve up to its first non-finite value (a diverged run's NaN or inf)."""
  steps, values = points
  n = next((i for i, v in enumerate(values) if not math.isfinite(v)), len(values))
  return steps[:n], values[:n]


def _non_finite_note(group: list[dict], key: str) -> str:
  steps = [s for r in group for s, v in zip(*series(r["records"], key)) if not math.isfinite(v)]
  return f" (non-finite from step {min(steps)})" if steps else ""


def _style(key: str, i: int, groups) -> str:
  """Train loss a line, held-out loss dots on a line; a group whose curve another group's
  hides (the same values) dashed, so that both show."""
  mine = [series(r["records"], key) for r in groups[i][1]]
  short = any(len(_finite(m)[0]) < 3 for m in mine)  # (a curve of 1 point needs its dot)
  base = "-" if key == "train_loss" and not short else "o-"
  hidden = any([series(r["records"], key) for r in g] == mine for _, g in groups[:i])
  return base.replace("-", "--") if hidden else base


def _fit_losses(axes, values: list[float]) -> None:
  """A loss axis on which every run's curve shows: it spans every finite value of every
  run (none cut off above the others' first loss), logarithmic where they span more than a
  factor of 10 (a run ten times above or below the others keeps the shape of its curve)."""
  values = [v for v in values if math.isfinite(v)]
  if not values:
    return
  lo, hi = min(values), max(values)
  log = lo > 0 and hi / lo > 10
  pad = 0.05 * (hi - lo) or 0.05 * abs(hi) or 0.05
  for ax in axes:  # (train and held-out loss share their y axis)
    if log:
      ax.set_yscale("log")
      ax.set_ylim(lo / 1.15, hi * 1.15)
      plotting.plain_log_ticks(ax)
    else:
      ax.set_ylim(max(0.0, lo - pad) if lo >= 0 else lo - pad, hi + pad)


def _run_caption(name: str, group: list[dict]) -> str:
  """One setup line per run (or per group of seeds): its legend name, size, steps, seeds,
  learning rate and batch size."""
  config = group[0]["config"]
  steps = max((s for r in group for s in series(r["records"], "train_loss")[0][-1:]),
              default=None)
  opt, data = config.get("opt", {}), config.get("data", {})
  extra = "; ".join(p for p in (
      f"lr {opt['learning_rate']:g}" if isinstance(opt.get("learning_rate"), (int, float)) else "",
      f"batch {data['batch_size']}" if data.get("batch_size") else "") if p)
  names = "+".join(r["name"] for r in group)
  return f"{name} [{names}]: " + plotting.setup_caption(config, steps=steps, seeds=len(group),
                                                        extra=extra)


def compare(workdirs: list[str], output: str = "compare", title: str | None = None) -> dict:
  fileio.refuse_run_files("--output", output, [output + ".png", output + ".md"], own=workdirs)
  runs = [load_run(w) for w in workdirs]
  for r, name in zip(runs, _names(workdirs)):
    r["name"] = name
  folder = os.path.dirname(output)
  if folder:
    os.makedirs(folder, exist_ok=True)
  figure = plot(runs, output + ".png", title)
  text = table(runs)
  fileio.write_text(output + ".md", f"# {title or 'Runs compared'}\n\n{text}\n"
                    f"![curves]({os.path.basename(output)}.png)\n")
  return {"png": output + ".png", "markdown": output + ".md", "table": text,
          "runs": [r["name"] for r in runs], "figure": figure}
