r"""Post-LN against Pre-LN on a character-level LM, with and without warm-up.

  python experiments/post_vs_pre_lm.py --workdir=/tmp/post_vs_pre [--steps=1500] [--lr=3e-3]

Trains the default model (4 layers, D 128, tiny_shakespeare) three ways at one peak
learning rate: Pre-LN without warm-up, Post-LN without warm-up, Post-LN with a linear
warm-up over a fifth of the run. Each run has its own workdir under --workdir (re-running
resumes or skips finished runs); the report (report.md) and plot (loss_curves.png) go
beside them. The paper's claim (Xiong et al. 2020): Pre-LN needs no warm-up, Post-LN
without it trains worse or stalls at the unigram baseline.
"""

import os

from absl import app, flags, logging

from lnjax.core import allocator
allocator.tune_glibc_malloc()  # glibc malloc for XLA:CPU, before JAX starts

_WORKDIR = flags.DEFINE_string("workdir", None, "Root folder of the runs and the report.",
                               required=True)
_STEPS = flags.DEFINE_integer("steps", 1500, "Training steps per run.")
_LR = flags.DEFINE_float("lr", 3e-3, "Peak learning rate of every run.")


def runs(steps: int, lr: float):
  """(name, overrides) of each run."""
  warmup = steps // 5
  return [
      ("pre_ln_no_warmup", {"model.norm_position": "pre", "opt.warmup_steps": 0}),
      ("post_ln_no_warmup", {"model.norm_position": "post", "opt.warmup_steps": 0}),
      (f"post_ln_warmup{warmup}", {"model.norm_position": "post", "opt.warmup_steps": warmup}),
  ]


def main(argv):
  del argv
  logging.set_verbosity(logging.WARNING)  # orbax logs each save at INFO.
  from lnjax.configs import default as default_config
  from lnjax import tasks
  from lnjax.core import metrics, train

  results = []
  for name, overrides in runs(_STEPS.value, _LR.value):
    config = default_config.get_config()
    with config.unlocked():
      config.train.num_steps = _STEPS.value
      config.opt.learning_rate = _LR.value
      config.update_from_flattened_dict(overrides)
    workdir = os.path.join(_WORKDIR.value, name)
    print(f"\n=== {name}: {overrides}", flush=True)
    summary = train.train_and_evaluate(config, workdir, tasks=tasks.get)
    results.append((name, summary, metrics.read_metrics(workdir)))
  write_report(_WORKDIR.value, results, config.to_dict())


def plot_losses(path: str, results, labels: dict, config: dict, lr: float) -> None:
  """Train and held-out loss of each run against the step, the unigram baseline dashed."""
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  from lnjax.analysis import plotting

  unit = "nats/character"  # The default config's tokenizer is characters.
  fig, (ax_train, ax_eval) = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
  for name, summary, records in results:
    label = labels.get(name, name)
    if summary["status"] != "completed":
      label += f" ({summary['status']})"
    train_pts = {r["step"]: r["train_loss"] for r in records if r.get("train_loss") is not None}
    eval_pts = {r["step"]: r["eval_loss"] for r in records if r.get("eval_loss") is not None}
    (line,) = ax_train.plot(*zip(*sorted(train_pts.items())), label=label)
    ax_eval.plot(*zip(*sorted(eval_pts.items())), marker="o", label=label,
                 color=line.get_color())
  baseline = results[0][1]["unigram_baseline"]
  for ax, title in ((ax_train, "train loss"), (ax_eval, "held-out loss")):
    ax.axhline(baseline, color="grey", linestyle="--", label=f"unigram baseline {baseline:.2f}")
    ax.set_xlabel("training step")
    ax.set_ylabel(f"loss ({unit})")
    ax.set_title(title)
    ax.grid(alpha=0.3)
  ax_eval.legend(fontsize=8)
  fig.tight_layout()
  plotting.add_caption(fig, plotting.setup_caption(
      config, seeds=1, extra=f"tiny_shakespeare characters, peak lr {lr:g}"))
  plotting.save(fig, path, dpi=120)


def write_report(root: str, results, config: dict) -> None:
  from lnjax.analysis import plotting

  labels = {name: plotting.legend_label(o) for name, o in runs(_STEPS.value, _LR.value)}
  plot_losses(os.path.join(root, "loss_curves.png"), results, labels, config, _LR.value)
  baseline = results[0][1]["unigram_baseline"]
  lines = ["# Post-LN vs Pre-LN, character-level LM on tiny_shakespeare", "",
           f"Command: `python experiments/post_vs_pre_lm.py --workdir={root} "
           f"--steps={_STEPS.value} --lr={_LR.value}`", "",
           "| run | status | held-out loss (nats) | vs unigram baseline | steps |",
           "|---|---|---|---|---|"]
  for name, s, _ in results:
    loss = f"{s['eval_loss']:.4f}" if s["eval_loss"] is not None else "—"
    gap = (f"{s['unigram_baseline'] - s['eval_loss']:+.4f}" if s["eval_loss"] is not None
           else "—")
    lines.append(f"| {name} | {s['status']} | {loss} | {gap} | {s['step']} |")
  lines += ["", f"Unigram baseline: {baseline:.4f} nats.", "", "![loss curves](loss_curves.png)", ""]
  from lnjax.core import fileio  # Atomic, and a bucket's path works too.

  report = os.path.join(root, "report.md")
  fileio.write_text(report, "\n".join(lines))
  print("\n".join(lines) + f"\nReport: {report}")


if __name__ == "__main__":
  app.run(main)
