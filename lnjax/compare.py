r"""Compare runs side by side, whatever made them (lnjax.main, a sweep, two machines).

  python -m lnjax.compare DIR1 DIR2 ... [--output=compare]

reads each workdir's metrics.jsonl, summary.json and config.json and writes
  compare.png   train loss, held-out loss and (where any run has it) BLEU against the
                step, every run in each panel on shared axes
  compare.md    a Markdown table of each run's final and best values (also printed)
"""

import io
import json
import math
import os
import sys

from absl import app, flags

from lnjax import api, cli, errors, fileio, metrics as metrics_lib


def _define_flags() -> None:
  """The command's flags, defined when it runs only: the module is a library too, and
  a process importing several tools would see flags of the same name twice."""
  global _OUTPUT, _TITLE
  _OUTPUT = flags.DEFINE_string("output", "compare", "Stem of the PNG and Markdown files.")
  _TITLE = flags.DEFINE_string("title", None, "Title of the figure.")


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


def plot(runs: list[dict], path: str, title: str | None = None) -> None:
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  import matplotlib.ticker

  panels = [("train_loss", "train loss (nats/token)"), ("eval_loss", "held-out loss (nats/token)")]
  if any(series(r["records"], "eval_bleu")[0] for r in runs):
    panels.append(("eval_bleu", "BLEU"))
  fig, axes = plt.subplots(1, len(panels), figsize=(5.2 * len(panels), 4.0), sharex=True)
  axes[1].sharey(axes[0])  # Train and held-out loss on one scale.
  colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
  # Losses: the top of the axes at the highest first value of any run (about ln V), so a
  # diverged run does not flatten the others.
  firsts = [series(r["records"], "train_loss")[1][:1] for r in runs]
  top = max((f[0] for f in firsts if f), default=None)
  for ax, (key, label) in zip(axes, panels):
    for i, r in enumerate(runs):
      x, y = series(r["records"], key)
      if x:
        style = "-" if key == "train_loss" else "o-"
        norm = r["config"].get("model", {}).get("norm_position")
        ax.plot(x, y, style, color=colors[i % len(colors)], lw=1.4, ms=3.5,
                label=f"{r['name']} ({norm})" if norm else r["name"])
    if key != "eval_bleu" and top is not None:
      low = min((min(y) for r in runs for y in [series(r["records"], key)[1]] if y),
                default=0.0)
      ax.set_ylim(max(0.0, low - 0.05 * (top - low)), top * 1.05)
    ax.set_title(label)
    ax.set_xlabel("step")
    ax.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
    ax.grid(alpha=0.3)
  axes[0].legend(fontsize=8, loc="upper right")
  fig.suptitle(title or ", ".join(r["name"] for r in runs))
  fig.tight_layout()
  png = io.BytesIO()
  fig.savefig(png, format="png", dpi=110)
  plt.close(fig)
  with open(path, "wb") as f:
    f.write(png.getvalue())


def compare(workdirs: list[str], output: str = "compare", title: str | None = None) -> dict:
  fileio.refuse_run_files("--output", output, [output + ".png", output + ".md"])
  runs = [load_run(w) for w in workdirs]
  for r, name in zip(runs, _names(workdirs)):
    r["name"] = name
  folder = os.path.dirname(output)
  if folder:
    os.makedirs(folder, exist_ok=True)
  plot(runs, output + ".png", title)
  text = table(runs)
  with open(output + ".md", "w") as f:
    f.write(f"# {title or 'Runs compared'}\n\n{text}\n![curves]({os.path.basename(output)}.png)\n")
  return {"png": output + ".png", "markdown": output + ".md", "table": text,
          "runs": [r["name"] for r in runs]}


def main(argv):
  workdirs = argv[1:]
  if not workdirs:
    print("lnjax: error: give the workdirs to compare: python -m lnjax.compare DIR1 DIR2 ...",
          file=sys.stderr)
    sys.exit(2)
  try:
    result = compare(workdirs, _OUTPUT.value, _TITLE.value)
  except (OSError, ValueError, errors.LnjaxError) as e:
    print(f"lnjax: error: {e}", file=sys.stderr)
    sys.exit(2)
  print(result["table"])
  print(f"curves in {result['png']}, table in {result['markdown']}")


api.callable_module(__name__, compare)  # lnjax.compare(workdirs, ...): the Python API.


if __name__ == "__main__":
  _define_flags()
  app.run(main, flags_parser=cli.parse_flags)
