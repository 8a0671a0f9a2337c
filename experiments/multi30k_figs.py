r"""The paper's Fig. 2 and Fig. 4 on real translation data (Multi30k De→En), at CPU scale.

  python experiments/multi30k_figs.py --fig=2 --workdir=/tmp/fig2 [--steps=300] [--parallel=1]
  python experiments/multi30k_figs.py --fig=4 --workdir=/tmp/fig4 [--steps=260]
  python experiments/multi30k_figs.py --fig=4 --workdir=/tmp/fig4 --report_only
  python experiments/multi30k_figs.py --fig=2 --size=paper --workdir=/tmp/fig2p [--full]
  python experiments/multi30k_figs.py --fig=2 --size=paper --workdir=/tmp/t --time_steps=3

The model is configs/multi30k_de_en.py at the paper's depth and a quarter of its width:
6+6 layers, d_model 128, 4 heads, FFN 512 (3.8 M parameters), batches of 2048 tokens,
dropout 0.1, label smoothing 0.1, Adam β₂ 0.98. BLEU is sacreBLEU on the validation split
with greedy decoding (hypotheses up to the source length + 20): beam 4 would triple the
decoding time of these short runs, and a stuck model decodes to the length limit.

--fig=2  the `fig2_cpu` sweep: Post-LN with Adam at peak lr 5e-4 and 1e-3 × linear warm-up
         of 0, 50 and 200 steps, then inverse square root (the paper: IWSLT14, 6+6 × 512,
         warm-up 0 / 500 / 4000 over ~15 epochs). Held-out loss four times a run, BLEU
         every 300 steps. The report has the stability map (BLEU over lr × warm-up; runs stuck at
         the unigram baseline marked) and the paper's BLEU beside each cell.
--fig=4  the `fig4_cpu` sweep: Pre-LN without warm-up (constant 1e-3; its ×0.1 at epoch 10
         lies beyond these runs) against Post-LN with 200 warm-up steps then inverse square
         root, each with Adam and with RAdam. Held-out loss and BLEU every quarter epoch; the
         report gives them per epoch, draws them, and says at which epoch each Pre-LN run
         reaches its Post-LN partner's final loss and BLEU (the paper: Pre-LN at epoch 9
         ≈ Post-LN at epoch 15; Adam against RAdam makes little difference for Pre-LN).

--size=paper  (Fig. 2 only) the `fig2_paper` sweep: the paper's IWSLT shape, 6+6 × 512,
         FFN 1024, 4 heads (36 M parameters with this vocabulary), Post-LN at peak lr 5e-4
         and 1e-3 × warm-up 0 and 500 steps, and Pre-LN at 1e-3 without warm-up, all with
         the same inverse-square-root schedule, label smoothing 0.1, dropout 0.1, Adam β₂
         0.98. CPU-sized by default (PAPER_CPU: batches of 1024 target tokens, 600 steps,
         greedy BLEU at each of four evaluations: under 40 minutes a run on a 2-core
         Xeon, from the step time --time_steps measured there); --full gives the paper's
         length on a GPU (PAPER_FULL: 4096-token batches, 2000 steps ≈ 15 epochs of
         Multi30k, the config's beam 4). --time_steps=N trains nothing: it times N
         training steps of that model on one real train batch and prints the seconds a
         step and the steps that fit in 40 minutes.

Runs go through the sweep launcher (a folder each under --workdir; re-running skips
finished runs and resumes interrupted ones). The report (report.md, results.csv/json,
loss_curves.png, stability_map.png, and for Fig. 4 fig4_curves.png) goes into --workdir.
"""

import math
import os

from absl import app, flags, logging

from lnjax.core import allocator
allocator.tune_glibc_malloc()  # glibc malloc for XLA:CPU, before JAX starts
from lnjax import sweep
from lnjax.sweep import launcher, report

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIG = os.path.join(REPO, "configs", "multi30k_de_en.py") + ":norm=post"

_FIG = flags.DEFINE_enum("fig", None, ["2", "4"], "Which figure of the paper.", required=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "Root folder of the runs and the report.",
                               required=True)
_STEPS = flags.DEFINE_integer("steps", None, "Training steps per run (default: 300 for "
                              "Fig. 2, 1.2 epochs; 260 for Fig. 4, one epoch).")
_PARALLEL = flags.DEFINE_integer("parallel", 1, "Runs at once, each on its own devices.")
_REPORT_ONLY = flags.DEFINE_bool("report_only", False, "Gather the runs; train nothing.")
_SIZE = flags.DEFINE_enum("size", "cpu", ["cpu", "paper"], "Fig. 2's model: cpu (6+6 × "
                          "128, fig2_cpu) or paper (6+6 × 512, fig2_paper).")
_FULL = flags.DEFINE_bool("full", False, "--size=paper at the paper's length (a GPU's run): "
                          "4096-token batches, 2000 steps, beam 4.")
_TIME_STEPS = flags.DEFINE_integer("time_steps", 0, "Time this many training steps of the "
                                   "first run's model on one train batch; train nothing.")

# The paper's depth at a quarter of its width, half this config's batch.
CPU_SIZE = {"model.num_layers": 6, "model.d_model": 128, "model.num_heads": 4,
            "model.d_ff": 512, "data.max_tokens": 2048,
            "decode.beam_size": 1, "decode.max_extra_len": 20}
DEFAULT_STEPS = {"2": 300, "4": 260}
# --size=paper: the shape comes from the fig2_paper sweep; these size the batch and length.
PAPER_CPU = {"data.max_tokens": 1024, "decode.beam_size": 1, "decode.max_extra_len": 20}
PAPER_CPU_STEPS = 600
PAPER_FULL = {"data.max_tokens": 4096}
PAPER_FULL_STEPS = 2000
# Fig. 2 decodes every 300 steps (the held-out loss is its measure at these lengths); a
# fixed interval lets `--steps=600` continue the 300-step runs (a run's workdir refuses a
# changed decode config).
FIG2_BLEU_EVERY = 300
# 2048-token batches make 259 steps an epoch (summary.json's steps_per_epoch); Fig. 4
# evaluates every quarter epoch.
EPOCH_STEPS = 259
FIG4_EVAL_EVERY = 65

# Xiong et al. 2020, arXiv 2002.04745, Fig. 2 (IWSLT14 De-En, Post-LN, Adam): BLEU by (warm-up, lr),
# with this experiment's warm-up in the paper's place.
PAPER_FIG2 = {
    (0, 5e-4): "8.45 (no warm-up; val loss stalls ≈7)",
    (0, 1e-3): "8.45 (no warm-up; val loss stalls ≈7)",
    (50, 5e-4): "31.16 (500 steps)",
    (50, 1e-3): "2.77 (500 steps)",
    (200, 5e-4): "≈34 (4000 steps)",
    (200, 1e-3): "≈34 (4000 steps)",
    (500, 5e-4): "31.16",
    (500, 1e-3): "2.77",
}


def fixed_overrides(fig: str, steps: int, size: str = "cpu", full: bool = False) -> dict:
  if size == "paper":
    every = max(steps // 4, 1)
    return {**(PAPER_FULL if full else PAPER_CPU), "train.num_steps": steps,
            "train.eval_every_steps": every, "train.checkpoint_every_steps": every,
            "decode.bleu_every_steps": every}
  fixed = {**CPU_SIZE, "train.num_steps": steps}
  if fig == "2":
    every = max(steps // 4, 1)
    fixed.update({"train.eval_every_steps": every, "train.checkpoint_every_steps": every,
                  "decode.bleu_every_steps": FIG2_BLEU_EVERY})
  else:
    fixed.update({"train.eval_every_steps": FIG4_EVAL_EVERY,
                  "train.checkpoint_every_steps": FIG4_EVAL_EVERY})
  return fixed


def evaluations(workdir: str) -> list[dict]:
  """{step, eval_loss, eval_bleu} per evaluation of a run, by step."""
  by_step: dict[int, dict] = {}
  for record in launcher.read_metrics(workdir):
    for key in ("eval_loss", "eval_bleu"):
      if record.get(key) is not None:
        by_step.setdefault(record["step"], {"step": record["step"]})[key] = record[key]
  return [by_step[s] for s in sorted(by_step)]


def first_reaching(evals: list[dict], key: str, target: float, lower_better: bool,
                   steps_per_epoch: float) -> str:
  """The epoch of the first evaluation at or past `target` ('not within the run' if none)."""
  for e in evals:
    value = e.get(key)
    if value is not None and (value <= target if lower_better else value >= target):
      return f"{e['step'] / steps_per_epoch:.2f}"
  return "not within the run"


def fig2_notes(rows: list[dict], steps: int, size: str = "cpu") -> list[str]:
  if size == "paper":
    lines = ["Beside the paper's Fig. 2 (arXiv 2002.04745: IWSLT14 6+6 × 512, ~15 epochs; here "
             f"Multi30k, the same shape and warm-ups, {steps} steps):"]
  else:
    lines = ["Beside the paper's Fig. 2 (arXiv 2002.04745: IWSLT14 6+6 × 512, warm-up 0 / 500 / "
             f"4000 over ~15 epochs; here 0 / 50 / 200 over {steps / EPOCH_STEPS:.1f} "
             "epochs):"]
  lines += ["", "| norm | lr | warm-up here (paper) | final val loss | val BLEU | "
            "state | paper BLEU |", "|---|---|---|---:|---:|---|---|"]
  for r in sorted(rows, key=lambda r: (r["norm_position"] != "post", r["learning_rate"],
                                       r["warmup_steps"])):
    paper = (PAPER_FIG2.get((r["warmup_steps"], r["learning_rate"]), "—")
             if r["norm_position"] == "post" else "— (Fig. 4: Pre-LN without warm-up ≈34)")
    value = lambda v, spec: "—" if v is None else format(v, spec)
    lines.append(f"| {r['norm_position']} | {r['learning_rate']:g} | {r['warmup_steps']} | "
                 f"{value(r['eval_loss'], '.3f')} | {value(r['eval_bleu'], '.2f')} | "
                 f"{report.cell_state(r)} | {paper} |")
  if size == "paper":
    lines += ["", "Per evaluation (val loss / BLEU; the unigram baseline is each run's "
              "summary.json unigram_baseline):", ""]
    for r in rows:
      evals = evaluations(r["workdir"])
      lines.append(f"- {r['name']}: " + ("; ".join(
          f"step {e['step']}: {e.get('eval_loss', math.nan):.3f} / "
          f"{e.get('eval_bleu', math.nan):.2f}" for e in evals) or "not run yet"))
  return lines


def time_steps(config, n: int) -> None:
  """Compiles the training step of `config` (a run of the sweep), runs it n times on the
  first train batch and prints the seconds per step."""
  import time

  import jax
  import numpy as np

  from lnjax import tasks
  from lnjax.core import build

  b = build.build(config, build.one_device_mesh(), tasks=tasks.get, whole_data=True)
  state, batch = b.init_state(), b.global_batch(next(iter(b.data.train_iter())))
  t0 = time.perf_counter()
  state, m = b.train_step(state, batch)
  jax.block_until_ready(m)
  compile_s = time.perf_counter() - t0
  t0 = time.perf_counter()
  for _ in range(n):
    state, m = b.train_step(state, batch)
  jax.block_until_ready(m)
  per_step = (time.perf_counter() - t0) / n
  params = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(state.params))
  print(f"{params / 1e6:.1f} M parameters, batch {batch['targets'].shape} "
        f"({int(batch['weights'].sum())} target tokens): first step (compiling) "
        f"{compile_s:.1f} s, then {per_step:.2f} s a step over {n} steps "
        f"(train loss {float(m['train_loss']):.3f}); {int(2400 / per_step)} steps in 40 min")


OPTIMIZERS = {"adam": "Adam", "radam": "RAdam", "sgd": "SGD"}


def plot_fig4(path: str, runs_by: dict, evals_by: dict, spe: dict) -> None:
  """Held-out loss (unigram baseline dashed) and BLEU of each run against the epoch:
  Pre-LN solid, Post-LN dashed, a colour per optimizer."""
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  from lnjax.analysis import plotting

  fig, (ax_loss, ax_bleu) = plt.subplots(1, 2, figsize=(12, 4.2))
  for (norm, opt), (run, row) in runs_by.items():
    per_epoch = spe[(norm, opt)] or math.nan
    label = plotting.legend_label(
        {"model.norm_position": norm, "opt.warmup_steps": run.setting("opt.warmup_steps")})
    label += f", {OPTIMIZERS.get(opt, opt)}"
    for ax, key in ((ax_loss, "eval_loss"), (ax_bleu, "eval_bleu")):
      points = [(e["step"] / per_epoch, e[key]) for e in evals_by[(norm, opt)] if key in e]
      if points:
        ax.plot(*zip(*points), "-" if norm == "pre" else "--", marker="o", ms=4,
                color="C0" if opt == "adam" else "C1", label=label)
  baselines = [row.get("unigram_baseline") for _, row in runs_by.values()
               if row.get("unigram_baseline")]
  if baselines:
    ax_loss.axhline(baselines[0], color="grey", ls="--", lw=1,
                    label=f"unigram baseline {baselines[0]:.2f}")
  for ax, title, ylabel in ((ax_loss, "validation loss", f"loss ({plotting.LOSS_UNIT})"),
                            (ax_bleu, "validation BLEU (greedy, sacreBLEU)", "BLEU")):
    ax.set_xlabel("training epoch")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(alpha=0.3)
  if ax_loss.get_legend_handles_labels()[0]:
    ax_loss.legend(fontsize=8)
  fig.suptitle("Fig. 4 at CPU scale: Pre-LN without warm-up against Post-LN with warm-up")
  fig.tight_layout()
  runs = [run for run, _ in runs_by.values()]
  if runs:
    plotting.add_caption(fig, plotting.setup_caption(
        runs[0].config.to_dict(), seeds=1, extra="Multi30k De→En"))
  plotting.save(fig, path, dpi=120)


def fig4_section(root: str, runs: list[sweep.Run], rows: list[dict]) -> list[str]:
  """Per-epoch table, epochs-to-reach, and fig4_curves.png."""
  runs_by = {(r.setting("model.norm_position"), r.setting("opt.name")): (r, row)
             for r, row in zip(runs, rows)}
  spe = {k: (launcher.read_json(os.path.join(row["workdir"], "summary.json")) or {}).get(
      "steps_per_epoch") for k, (_, row) in runs_by.items()}
  evals_by = {k: evaluations(row["workdir"]) for k, (_, row) in runs_by.items()}
  steps = sorted({e["step"] for evals in evals_by.values() for e in evals})
  known = [v for v in spe.values() if v]
  when = lambda s: f"step {s}" + (f" (epoch {s / known[0]:.2f})" if known else "")
  lines = ["## Per epoch (held-out loss / greedy BLEU on the validation split)", "",
           "| run | " + " | ".join(when(s) for s in steps) + " |",
           "|---|" + "---:|" * len(steps)]
  for (norm, opt), (run, row) in runs_by.items():
    evals = {e["step"]: e for e in evals_by[(norm, opt)]}
    cells = []
    for s in steps:
      e = evals.get(s, {})
      cells.append("—" if "eval_loss" not in e else
                   f"{e['eval_loss']:.3f} / {e.get('eval_bleu', math.nan):.2f}")
    lines.append(f"| {run.name} | " + " | ".join(cells) + " |")
  plot_fig4(os.path.join(root, "fig4_curves.png"), runs_by, evals_by, spe)

  lines += ["", "## Epochs each needs to reach the other's final level", "",
            "| optimizer | Pre-LN reaches Post-LN's final loss / BLEU at epoch | "
            "Post-LN reaches Pre-LN's final loss / BLEU at epoch |", "|---|---|---|"]
  for opt in ("adam", "radam"):
    if ("pre", opt) not in runs_by or ("post", opt) not in runs_by:
      continue
    pre, post = evals_by[("pre", opt)], evals_by[("post", opt)]
    if not pre or not post:
      lines.append(f"| {opt} | not run yet | not run yet |")
      continue
    cols = []
    for mine, other, norm in ((pre, post, "pre"), (post, pre, "post")):
      per_epoch = spe[(norm, opt)] or math.nan
      final = other[-1]
      cols.append(" / ".join(
          first_reaching(mine, key, final[key], lower, per_epoch) if key in final else "—"
          for key, lower in (("eval_loss", True), ("eval_bleu", False))))
    lines.append(f"| {opt} | {cols[0]} | {cols[1]} |")
  lines += ["", "![Fig. 4 curves](fig4_curves.png)"]
  return lines


def main(argv):
  del argv
  logging.set_verbosity(logging.WARNING)
  fig, size = _FIG.value, _SIZE.value
  if size == "paper" and fig != "2":
    raise app.UsageError("--size=paper is Fig. 2's (the fig2_paper sweep)")
  if size == "paper":
    steps = _STEPS.value or (PAPER_FULL_STEPS if _FULL.value else PAPER_CPU_STEPS)
    sweep_arg = "fig2_paper"
  else:
    steps = _STEPS.value or DEFAULT_STEPS[fig]
    sweep_arg = f"fig{fig}_cpu"
  fixed = fixed_overrides(fig, steps, size, _FULL.value)
  runs = sweep.expand(CONFIG, sweep_arg, fixed)
  root = _WORKDIR.value
  if _TIME_STEPS.value:
    time_steps(runs[0].config, _TIME_STEPS.value)
    return
  if not _REPORT_ONLY.value:
    launcher.run_to_the_end(CONFIG, sweep_arg, runs, root, fixed, parallel=_PARALLEL.value,
                            devices_per_run=None)
  command = (f"python experiments/multi30k_figs.py --fig={fig} --workdir={root}"
             + (" --size=paper" if size == "paper" else "") + (" --full" if _FULL.value else "")
             + (f" --steps={steps}" if _STEPS.value else ""))
  rows = report.gather(root, runs)
  notes = fig2_notes(rows, steps, size) if fig == "2" else []
  width = 512 if size == "paper" else 128
  scale = "the paper's size" if size == "paper" else "CPU scale"
  result = report.write(root, runs, title=f"Fig. {fig} at {scale}: Multi30k De→En, 6+6 × "
                        f"{width}, {steps} steps", command=command, notes=tuple(notes))
  lines = result["markdown"]
  if fig == "4":
    lines = lines + [""] + fig4_section(root, runs, result["rows"])
    with open(result["paths"]["report.md"], "w") as f:
      f.write("\n".join(lines) + "\n")
  print("\n".join(lines))
  print(f"\nReport: {result['paths']['report.md']}")


if __name__ == "__main__":
  app.run(main)
