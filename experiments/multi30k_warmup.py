r"""Warm-up dependence on real translation data: Multi30k De→En, Pre-LN vs Post-LN.

  python experiments/multi30k_warmup.py --workdir=/tmp/m30k_warmup [--steps=N] [--only=RUN]
  python experiments/multi30k_warmup.py --workdir=/tmp/m30k_warmup --report_only

Three runs of configs/multi30k_de_en.py at the same peak learning rate (1e-3, Adam β₂ 0.98):
  pre_ln_no_warmup     Pre-LN, no warm-up, ×0.1 at epoch 10 (the paper's Pre-LN schedule)
  post_ln_no_warmup    Post-LN, no warm-up, the same schedule as Pre-LN
  post_ln_warmup1000   Post-LN, 1000 linear warm-up steps, then inverse square root
Each run has its own workdir (re-running resumes or skips finished runs); after training,
the best checkpoint by validation BLEU decodes test_2016_flickr (beam 4, sacreBLEU). The
report (report.md: table of validation loss, BLEU and test BLEU) and plots (curves.png:
validation loss and BLEU against step) go into --workdir. `--only` trains one run (start
several processes to run them side by side); `--report_only` only gathers.
"""

import json
import os

from absl import app, flags, logging

from lnjax.core import allocator
allocator.tune_glibc_malloc()  # glibc malloc for XLA:CPU, before JAX starts

_WORKDIR = flags.DEFINE_string("workdir", None, "Root folder of the runs and the report.",
                               required=True)
_STEPS = flags.DEFINE_integer("steps", None, "Training steps per run (default: the config's).")
_ONLY = flags.DEFINE_string("only", None, "Train only this run.")
_REPORT_ONLY = flags.DEFINE_bool("report_only", False, "Gather finished runs; train nothing.")
TEST_SPLIT = "test_2016_flickr"


def runs() -> list[tuple[str, str, dict]]:
  """(name, preset, overrides) of each run."""
  return [
      ("pre_ln_no_warmup", "norm=pre", {}),
      ("post_ln_no_warmup", "norm=pre", {"model.norm_position": "post"}),
      ("post_ln_warmup1000", "norm=post", {}),
  ]


def train_one(name: str, preset: str, overrides: dict, root: str) -> None:
  from lnjax.configs import multi30k_de_en
  from lnjax import tasks
  from lnjax.core import train
  from lnjax.inference import predict

  config = multi30k_de_en.get_config(preset)
  with config.unlocked():
    if _STEPS.value:
      config.train.num_steps = _STEPS.value
    config.update_from_flattened_dict(overrides)
  workdir = os.path.join(root, name)
  print(f"\n=== {name}: {preset} {overrides}", flush=True)
  summary = train.train_and_evaluate(config, workdir, tasks=tasks.get)
  if summary["status"] == "completed" and summary.get("best_eval_bleu") is not None:
    result = predict.predict(workdir, TEST_SPLIT, "best")
    print(f"{name}: {TEST_SPLIT} BLEU {result['bleu']:.2f} (best checkpoint, step "
          f"{result['step']})", flush=True)


def _test_result(workdir: str) -> dict | None:
  folder = os.path.join(workdir, "predictions")
  if not os.path.isdir(folder):
    return None
  found = [f for f in os.listdir(folder) if f.startswith(TEST_SPLIT) and f.endswith(".json")]
  if not found:
    return None
  return json.load(open(os.path.join(folder, sorted(found)[-1])))


# Legends of the runs whose workdir has no config.json yet.
LABELS = {"pre_ln_no_warmup": "Pre-LN, no warm-up", "post_ln_no_warmup": "Post-LN, no warm-up",
          "post_ln_warmup1000": "Post-LN, warm-up 1000"}


def plot_curves(path: str, curves: list[dict]) -> None:
  """Training loss, validation loss (unigram baseline dashed) and validation BLEU against
  the step; `curves`: per run its label, config, summary and (step, value) lists."""
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  from lnjax.analysis import plotting

  fig, (ax_train, ax_loss, ax_bleu) = plt.subplots(1, 3, figsize=(16, 4.2))
  for i, c in enumerate(curves):
    label = c["label"] + ("" if c["summary"]["status"] == "completed"
                          else f" ({c['summary']['status']})")
    for ax, key, marker in ((ax_train, "train", None), (ax_loss, "loss", "o"),
                            (ax_bleu, "bleu", "o")):
      if c[key]:
        ax.plot(*zip(*c[key]), marker=marker, ms=3, color=f"C{i}", label=label)
  baselines = [c["summary"]["unigram_baseline"] for c in curves
               if c["summary"].get("unigram_baseline")]
  if baselines:
    ax_loss.axhline(baselines[0], color="grey", ls="--", label=f"unigram baseline {baselines[0]:.2f}")
  ax_train.set_yscale("log")
  plotting.plain_log_ticks(ax_train)
  for ax, title, ylabel in (
      (ax_train, "training loss (label-smoothed, dropout)", f"loss ({plotting.LOSS_UNIT}, log scale)"),
      (ax_loss, "validation loss", f"loss ({plotting.LOSS_UNIT})"),
      (ax_bleu, "validation BLEU (beam 4, sacreBLEU)", "BLEU")):
    ax.set_xlabel("training step")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(alpha=0.3)
  if curves:  # One legend: the panels share their runs and colours.
    ax_loss.legend(fontsize=8)
  fig.tight_layout()
  if curves:
    plotting.add_caption(fig, plotting.setup_caption(
        curves[0]["config"], seeds=1, extra="Multi30k De→En, Adam peak lr 1e-3, β₂ 0.98"))
  plotting.save(fig, path, dpi=120)


def write_report(root: str) -> None:
  from lnjax.analysis import plotting
  from lnjax.core import metrics

  rows, curves = [], []
  for name, preset, overrides in runs():
    workdir = os.path.join(root, name)
    summary_path = os.path.join(workdir, "summary.json")
    if not os.path.exists(summary_path):
      rows.append(f"| {name} | not run | | | | | |")
      continue
    summary = json.load(open(summary_path))
    records = metrics.read_metrics(workdir)
    config_path = os.path.join(workdir, "config.json")
    config = json.load(open(config_path)) if os.path.exists(config_path) else {}
    curves.append({
        "label": plotting.run_label(config) or LABELS.get(name, name), "config": config,
        "summary": summary,
        "train": sorted((r["step"], r["train_loss"]) for r in records
                        if r.get("train_loss") is not None),
        "loss": sorted((r["step"], r["eval_loss"]) for r in records
                       if r.get("eval_loss") is not None),
        "bleu": sorted((r["step"], r["eval_bleu"]) for r in records
                       if r.get("eval_bleu") is not None)})
    test = _test_result(workdir)
    fmt = lambda v: "—" if v is None else f"{v:.2f}"
    rows.append(
        f"| {name} | {summary['status']} | {summary['step']} | {fmt(summary['eval_loss'])} | "
        f"{fmt(summary.get('best_eval_bleu'))} | {fmt(test['bleu'] if test else None)} | "
        f"{summary['wall_seconds'] / 60:.0f} |")
  plot_curves(os.path.join(root, "curves.png"), curves)

  lines = ["# Warm-up dependence on Multi30k De→En (Pre-LN vs Post-LN, same peak lr)", "",
           f"Command: `python experiments/multi30k_warmup.py --workdir={root}"
           + (f" --steps={_STEPS.value}" if _STEPS.value else "") + "`", "",
           "| run | status | steps | final val loss | best val BLEU | test 2016 BLEU | "
           "minutes |", "|---|---|---|---|---|---|---|", *rows, "",
           f"Test BLEU: the best checkpoint by validation BLEU decoding {TEST_SPLIT} "
           "(beam 4, length penalty 1.0; sacreBLEU 13a, detokenized, cased).", "",
           "![curves](curves.png)", ""]
  from lnjax.core import fileio  # Atomic, and a bucket's path works too.

  report = os.path.join(root, "report.md")
  fileio.write_text(report, "\n".join(lines))
  print("\n".join(lines) + f"\nReport: {report}")


def main(argv):
  del argv
  logging.set_verbosity(logging.WARNING)
  root = _WORKDIR.value
  names = [name for name, _, _ in runs()]
  if _ONLY.value and _ONLY.value not in names:
    raise app.UsageError(f"--only={_ONLY.value!r} is not one of: {', '.join(names)}")
  if not _REPORT_ONLY.value:
    for name, preset, overrides in runs():
      if _ONLY.value in (None, name):
        train_one(name, preset, overrides, root)
  write_report(root)


if __name__ == "__main__":
  app.run(main)
