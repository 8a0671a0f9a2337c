r"""Post-LN and Pre-LN on the 8-layer 2.6M-parameter LM: the recorded runs of the course
workshop "Pre-Norm and Post-Norm" (The Transformer volume, plate 3 of 10).

  python experiments/course_runs.py --workdir=/tmp/course [--steps=3000] [--parallel=1]
      [--size=course|course_reg] [--dropout=RATE]
  python experiments/course_runs.py --workdir=/tmp/course --report_only

configs/lm.py:size=course (8 layers, D 128, 4 heads, F 512, SentencePiece 4096,
sequences of 128, batch 32, dropout 0, Adam at a constant peak lr after a linear warm-up,
no gradient clipping) on tiny_shakespeare, the `course` sweep of configs/lm.py:
  Pre-LN and Post-LN at peak lr 1e-3 and 6e-3 with a 30-step warm-up,
  Post-LN at peak lr 1e-3 with a 1000-step warm-up,
3000 steps each (45–47 minutes a run on one core of a 2-core Xeon; --parallel=2 runs two,
each pinned to a core). The runs go through the sweep launcher (a folder each under
--workdir; finished runs are skipped and interrupted ones resumed when the command is run
again). report.md puts the held-out losses beside
the workshop's and checks the shape to reproduce; loss_curves.png overlays the runs.
`--steps` shortens every run (a 1000-step warm-up then never reaches its peak before
step 1000). `--size=course_reg` runs the same five with dropout 0.1
(configs/lm.py:size=course_reg): without dropout the model memorizes tiny_shakespeare
within a few hundred steps, so only the regularized runs' final held-out losses compare
with the workshop's. `--dropout` sets another rate on the course model (e.g. 0.3), with
`--only` naming a subset of the five runs.
"""

import os

from absl import app, flags, logging

from lnjax.core import allocator
allocator.tune_glibc_malloc()  # glibc malloc for XLA:CPU, before JAX starts
from lnjax import sweep
from lnjax.sweep import launcher, report

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

def config_path(size: str) -> str:
  return os.path.join(REPO, "configs", "lm.py") + f":size={size}"


_WORKDIR = flags.DEFINE_string("workdir", None, "Root folder of the runs and the report.",
                               required=True)
_STEPS = flags.DEFINE_integer("steps", 3000, "Training steps per run.")
_PARALLEL = flags.DEFINE_integer("parallel", 1, "Runs at once, each on its own devices.")
_DEVICES_PER_RUN = flags.DEFINE_integer("devices_per_run", None,
                                        "Devices per run (default: all / --parallel).")
_EVAL_EVERY = flags.DEFINE_integer("eval_every", None, "Held-out evaluation every N steps "
                                   "(default: the config's 500).")
_REPORT_ONLY = flags.DEFINE_bool("report_only", False, "Gather the runs; train nothing.")
_SIZE = flags.DEFINE_enum("size", "course", ["course", "course_reg"],
                          "configs/lm.py size preset: course (dropout 0, as the workshop "
                          "describes it) or course_reg (dropout 0.1).")
_DROPOUT = flags.DEFINE_float("dropout", None, "model.dropout_rate of every run (default: "
                              "the --size preset's); a rate above 0 is reported from the "
                              "final held-out losses, as course_reg is.")
_ONLY = flags.DEFINE_string("only", None, "Only these of the five runs: their names "
                            "(e.g. norm=pre,lr=0.001,warmup=30), separated by ';'.")

# The course workshop's held-out loss in nats after 3000 steps; its unigram baseline is 7.60.
REFERENCE_BASELINE = 7.60
REFERENCE = {
    "norm=pre,lr=0.001,warmup=30": "4.575",
    "norm=pre,lr=0.006,warmup=30": "4.437",
    "norm=post,lr=0.001,warmup=30": "7.58 for all 3000 steps (stuck at the baseline)",
    "norm=post,lr=0.006,warmup=30": "7.58 for all 3000 steps (stuck at the baseline)",
    "norm=post,lr=0.001,warmup=1000": "4.531",
}


def shape_checks(rows: list[dict], final: bool = False) -> list[str]:
  """The course workshop's three claims, each answered from the runs (or 'not yet'). Losses are
  each run's lowest held-out loss (early stopping): without dropout the 2.6 M model
  memorizes tiny_shakespeare within a few hundred steps, and its final held-out loss then
  measures overfitting, not training. `final` (the dropout runs, size=course_reg or
  --dropout): each run's last held-out loss, as the workshop reports it."""
  by_name = {name: {"name": name, "state": "not run", "workdir": None}
             for name in REFERENCE} | {r["name"]: r for r in rows}  # (--only: a subset)
  pre_1, pre_6 = by_name["norm=pre,lr=0.001,warmup=30"], by_name["norm=pre,lr=0.006,warmup=30"]
  post_short = [by_name["norm=post,lr=0.001,warmup=30"], by_name["norm=post,lr=0.006,warmup=30"]]
  post_long = by_name["norm=post,lr=0.001,warmup=1000"]

  pick = last_eval if final else lowest_eval
  best = {r["name"]: pick(r["workdir"]) if r["workdir"] else None
          for r in by_name.values()}  # (step, loss) or None

  def lowest(r) -> float | None:
    return best[r["name"]][1] if best[r["name"]] else None

  def loss(r):
    found = best[r["name"]]
    return f"{found[1]:.3f} at step {found[0]}" if found else r["state"]

  def trains(r) -> bool:
    return lowest(r) is not None and lowest(r) < r["unigram_baseline"] - report.STUCK_NATS

  def stuck_throughout(r) -> bool:
    """Every held-out evaluation within STUCK_NATS of the unigram baseline."""
    evals = [rec["eval_loss"] for rec in launcher.read_metrics(r["workdir"])
             if rec.get("eval_loss") is not None]
    return bool(evals) and all(abs(e - r["unigram_baseline"]) <= report.STUCK_NATS
                               for e in evals)

  checks = [  # (claim, the runs it needs, whether it holds once they have completed)
      ("Post-LN with the 30-step warm-up stays at the unigram baseline at every evaluation "
       f"(lr 1e-3: {loss(post_short[0])}, 6e-3: {loss(post_short[1])})",
       post_short, lambda: all(stuck_throughout(r) for r in post_short)),
      (f"Pre-LN trains at both rates (1e-3: {loss(pre_1)}, 6e-3: {loss(pre_6)}) ...",
       [pre_1, pre_6], lambda: trains(pre_1) and trains(pre_6)),
      ("... and better at 6e-3", [pre_1, pre_6], lambda: lowest(pre_6) < lowest(pre_1)),
      (f"Post-LN with 1000 warm-up steps ({loss(post_long)}) trains about as well as Pre-LN "
       f"at the same rate ({loss(pre_1)}): within {report.STUCK_NATS} nats or better",
       [post_long, pre_1],
       lambda: lowest(post_long) <= lowest(pre_1) + report.STUCK_NATS),
  ]
  verdicts = ["not run" if any(r["state"] == "not run" for r in needs)
              else "not yet (runs unfinished)" if any(r["state"] != "completed" for r in needs)
              else "yes" if holds() else "**no**" for _, needs, holds in checks]
  return ["| claim (course workshop) | reproduced |", "|---|---|",
          *[f"| {claim} | {verdict} |" for (claim, _, _), verdict in zip(checks, verdicts)]]


def lowest_eval(workdir: str) -> tuple[int, float] | None:
  """(step, loss) of the run's lowest held-out loss: after it, the model overfits."""
  evals = [(rec["step"], rec["eval_loss"]) for rec in launcher.read_metrics(workdir)
           if rec.get("eval_loss") is not None]
  return min(evals, key=lambda e: e[1]) if evals else None


def last_eval(workdir: str) -> tuple[int, float] | None:
  """(step, loss) of the run's last held-out evaluation."""
  evals = [(rec["step"], rec["eval_loss"]) for rec in launcher.read_metrics(workdir)
           if rec.get("eval_loss") is not None]
  return max(evals) if evals else None


def notes(rows: list[dict], steps: int, dropout: float = 0.0) -> list[str]:
  final = dropout > 0
  baselines = sorted({round(r["unigram_baseline"], 3) for r in rows if r["unigram_baseline"]})
  lines = ["## Beside the course workshop's runs", "",
           "| run | workshop held-out loss | here | here, below the unigram baseline | "
           "here, lowest held-out loss (step) |", "|---|---|---|---|---|"]
  for r in rows:
    here = f"{r['eval_loss']:.3f}" if r["eval_loss"] is not None else r["state"]
    gap = f"{r['below_baseline']:+.3f}" if r["below_baseline"] is not None else "—"
    lowest = lowest_eval(r["workdir"])
    best = f"{lowest[1]:.3f} ({lowest[0]})" if lowest else "—"
    lines.append(f"| {r['name']} | {REFERENCE[r['name']]} | {here} | {gap} | {best} |")
  lines += ["", f"Unigram baseline: workshop {REFERENCE_BASELINE:.2f} nats (its tokenizer); "
            f"here {', '.join(map(str, baselines)) or '—'} nats (SentencePiece 4096 on "
            "tiny_shakespeare), so absolute losses differ; the shape is what compares.", ""]
  if steps != 3000:
    lines += [f"Shortened: {steps} steps a run instead of the workshop's 3000.", ""]
  if final:
    lines += ["The workshop's claims, each answered from the final held-out loss of the runs "
              f"(dropout {dropout:g}):", ""]
  else:
    lines += ["The workshop's claims, each answered from the lowest held-out loss of the runs "
              "(the model overfits tiny_shakespeare without dropout; the final losses are "
              "above):", ""]
  lines += shape_checks(rows, final)
  return lines


def main(argv):
  del argv
  logging.set_verbosity(logging.WARNING)
  root, fixed = _WORKDIR.value, {"train.num_steps": _STEPS.value}
  if _EVAL_EVERY.value:
    fixed["train.eval_every_steps"] = _EVAL_EVERY.value
  if _DROPOUT.value is not None:
    fixed["model.dropout_rate"] = _DROPOUT.value
  config = config_path(_SIZE.value)
  runs = sweep.expand(config, "course", fixed)
  dropout = runs[0].setting("model.dropout_rate")  # The preset's, or --dropout.
  if _ONLY.value:
    wanted = _ONLY.value.split(";")
    unknown = sorted(set(wanted) - {r.name for r in runs})
    if unknown:
      raise app.UsageError(f"--only: no run named {', '.join(unknown)}; the five: "
                           + "; ".join(r.name for r in runs))
    runs = [r for r in runs if r.name in wanted]
  if not _REPORT_ONLY.value:
    launcher.run_to_the_end(config, "course", runs, root, fixed, parallel=_PARALLEL.value,
                            devices_per_run=_DEVICES_PER_RUN.value)
  rows = report.gather(root, runs)
  reg = f" (dropout {dropout:g})" if dropout else ""
  result = report.write(
      root, runs, title=f"Course runs (course workshop): Post-LN vs Pre-LN, 8-layer LM{reg}",
      command=f"python experiments/course_runs.py --workdir={root} --steps={_STEPS.value}"
      + (f" --size={_SIZE.value}" if _SIZE.value != "course" else "")
      + (f" --dropout={_DROPOUT.value:g}" if _DROPOUT.value is not None else "")
      + (f" --only='{';'.join(r.name for r in runs)}'" if _ONLY.value else "")
      + (f" --eval_every={_EVAL_EVERY.value}" if _EVAL_EVERY.value else ""),
      notes=tuple(notes(rows, _STEPS.value, dropout=dropout)))
  print("\n".join(result["markdown"]))
  print(f"\nReport: {result['paths']['report.md']}")


if __name__ == "__main__":
  app.run(main)
