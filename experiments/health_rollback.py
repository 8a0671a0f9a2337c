r"""What the early warning and rollback (issue 29) do to the paper's own failure: Post-LN
without warm-up, on the course LM at CPU size.

  python experiments/health_rollback.py --workdir=/tmp/health_rollback [--steps=120] \
      [--lr=1e-2] [--batch_size=8]

Three runs of configs/lm.py:size=course (8 layers, D 128, SentencePiece 4096, dropout 0)
without warm-up at one peak learning rate, train.health=warn: Post-LN with
train.on_instability=none, Post-LN with rollback (back ≥ steps/12 steps, as many batches
skipped, at most 3 times), Pre-LN with none. Each run has its own workdir under --workdir
(re-running resumes or skips finished runs); report.md and update_rms.png go beside them:
per-layer update RMS of the attention sub-layers over time for Post-LN and Pre-LN, each
early warning marked.
"""

import os

from absl import app, flags, logging

from lnjax.core import allocator
allocator.tune_glibc_malloc()  # glibc malloc for XLA:CPU, before JAX starts

_WORKDIR = flags.DEFINE_string("workdir", None, "Root folder of the runs and the report.",
                               required=True)
_STEPS = flags.DEFINE_integer("steps", 120, "Training steps per run.")
_LR = flags.DEFINE_float("lr", 1e-2, "Peak (constant) learning rate of every run.")
_BATCH = flags.DEFINE_integer("batch_size", 8, "Sequences of 128 tokens per batch.")


def runs(steps: int):
  """(name, overrides) of each run."""
  back = max(1, steps // 12)
  return [
      ("post_none", {"model.norm_position": "post", "train.on_instability": "none"}),
      ("post_rollback", {"model.norm_position": "post", "train.on_instability": "rollback",
                         "train.rollback_steps": back, "train.rollback_skip_batches": back}),
      ("pre_none", {"model.norm_position": "pre", "train.on_instability": "none"}),
  ]


def main(argv):
  del argv
  logging.set_verbosity(logging.WARNING)  # orbax logs each save at INFO.
  from lnjax.configs import lm
  from lnjax import tasks
  from lnjax.core import metrics, train

  results = []
  back = max(1, _STEPS.value // 12)
  for name, overrides in runs(_STEPS.value):
    config = lm.get_config("size=course")
    with config.unlocked():
      settings = {"opt.warmup_steps": 0, "opt.learning_rate": _LR.value,
                  "data.batch_size": _BATCH.value, "train.num_steps": _STEPS.value,
                  "train.log_every_steps": 5, "train.eval_every_steps": _STEPS.value,
                  "train.checkpoint_every_steps": back, "train.keep_checkpoints": 20,
                  "train.health": "warn", "train.tensorboard": False, **overrides}
      config.update_from_flattened_dict(settings)
    workdir = os.path.join(_WORKDIR.value, name)
    print(f"\n=== {name}: {overrides}", flush=True)
    summary = train.train_and_evaluate(config, workdir, tasks=tasks.get)
    results.append((name, summary, metrics.read_metrics(workdir)))
  write_report(_WORKDIR.value, results, config.to_dict())


def warnings_of(records) -> list[tuple[int, str]]:
  """(step, statistic) of every early warning a run recorded."""
  return [(r["step"], k[len("warning/"):]) for r in records for k in r if k.startswith("warning/")]


def attn_update_rms(records) -> dict[int, list[tuple[int, float]]]:
  """{layer: [(step, update RMS of its attention sub-layer)]} at the log steps."""
  out: dict[int, list] = {}
  for r in records:
    for k, v in r.items():
      parts = k.split("/")
      if len(parts) == 4 and parts[0] == "health" and parts[2] == "self_attn" and \
          parts[3] == "update_rms":
        out.setdefault(int(parts[1][len("layer_"):]), []).append((r["step"], v))
  return out


def plot_update_rms(path: str, by_name: dict, config: dict, lr: float, batch: int) -> None:
  """Per-layer attention update RMS of the Post-LN and Pre-LN runs without rollback, a
  colour per layer (the colour bar), each early warning a vertical line."""
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  from matplotlib.cm import ScalarMappable
  from matplotlib.colors import Normalize
  from matplotlib.lines import Line2D

  from lnjax.analysis import plotting

  fig, ax = plt.subplots(figsize=(8.5, 4.5))
  n_layers = max(1, len(attn_update_rms(by_name["post_none"][1])))
  colors = ScalarMappable(Normalize(1, max(2, n_layers)), plt.get_cmap("viridis"))
  handles = []
  for name, norm, style, mark in (("post_none", "post", "-", "red"),
                                  ("pre_none", "pre", "--", "blue")):
    _, records = by_name[name]
    for layer, points in sorted(attn_update_rms(records).items()):
      ax.plot(*zip(*points), style, color=colors.to_rgba(layer + 1), lw=1.2)
    for step, _ in warnings_of(records):
      ax.axvline(step, color=mark, ls=style, lw=0.8, alpha=0.7)
    label = plotting.legend_label({"model.norm_position": norm, "opt.warmup_steps": 0})
    handles.append(Line2D([], [], color="black", ls=style, label=label))
    handles.append(Line2D([], [], color=mark, ls=style, lw=0.8,
                          label=f"{label}: early warning ({len(warnings_of(records))})"))
  ax.set_yscale("log")
  plotting.plain_log_ticks(ax)
  ax.set_xlabel("training step")
  ax.set_ylabel("attention update RMS per step\n(parameter units, log scale)")
  ax.legend(handles=handles, fontsize=8, loc="best")
  ax.set_title("Per-layer update RMS of the attention sub-layers, no warm-up", fontsize=10)
  ax.grid(alpha=0.3)
  bar = fig.colorbar(colors, ax=ax, pad=0.02)
  bar.set_label("layer")
  plotting.integer_ticks(bar.ax, "y")
  fig.tight_layout()
  plotting.add_caption(fig, plotting.setup_caption(
      config, seeds=1, extra=f"tiny_shakespeare, Adam at constant lr {lr:g}, batch {batch}×128 "
      "tokens"))
  plotting.save(fig, path, dpi=120)


def write_report(root: str, results, config: dict) -> None:
  by_name = {name: (summary, records) for name, summary, records in results}
  plot_update_rms(os.path.join(root, "update_rms.png"), by_name, config, _LR.value, _BATCH.value)

  lines = ["# Early warning and rollback on Post-LN without warm-up", "",
           f"Command: `python experiments/health_rollback.py --workdir={root} "
           f"--steps={_STEPS.value} --lr={_LR.value:g} --batch_size={_BATCH.value}`", "",
           "| run | status | held-out loss (nats) | vs unigram baseline | warnings | "
           "first warning | rollbacks |", "|---|---|---|---|---|---|---|"]
  for name, s, records in results:
    w = warnings_of(records)
    rollbacks = [a for a in s.get("instability_actions", []) if "rollback_to_step" in a]
    loss = f"{s['eval_loss']:.4f}" if s.get("eval_loss") is not None else "—"
    gap = (f"{s['eval_loss'] - s['unigram_baseline']:+.4f}" if s.get("eval_loss") is not None
           else "—")
    first = f"step {w[0][0]}: {w[0][1]}" if w else "—"
    lines.append(f"| {name} | {s['status']} | {loss} | {gap} | {len(w)} | {first} | "
                 f"{', '.join(str(a['step']) + '→' + str(a['rollback_to_step']) for a in rollbacks) or '—'} |")
  lines += ["", f"Unigram baseline: {results[0][1]['unigram_baseline']:.4f} nats.", "",
            "![update RMS](update_rms.png)", ""]
  from lnjax.core import fileio  # Atomic, and a bucket's path works too.

  report = os.path.join(root, "report.md")
  fileio.write_text(report, "\n".join(lines))
  print("\n".join(lines) + f"\nReport: {report}")


if __name__ == "__main__":
  app.run(main)
