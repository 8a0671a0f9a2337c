r"""Fine-tunes a BERT pre-training checkpoint on GLUE MRPC or RTE, over several seeds
(the command: lnjax/cli/finetune.py).

  python -m lnjax.cli.finetune --config=configs/glue.py:task=mrpc \
      --config.data.init_workdir=/tmp/bert_pre --config.data.init_step=1000 \
      --workdir=/tmp/mrpc_pre

Each seed is one run of the GLUE task (lnjax/tasks/glue.py) on the training loop every
task uses (lnjax.core.train.train_and_evaluate: sharding, resume, SIGTERM, the workdir lock),
in `<workdir>/seeds/<seed>/`. This driver only writes each seed's run config: the
pre-training run's model section with `finetune.dropout_rate`, `finetune.num_epochs`
epochs when train.num_steps is 0, a linear warm-up over `finetune.warmup_fraction` of
the steps; then it summarizes the seeds' dev scores at their last step. Writes:
  seeds/<seed>/       each seed's run (checkpoints, metrics.jsonl, summary.json)
  finetune_config.json  this config
  summary.json        dev accuracy (and F1 for MRPC) per seed; mean, standard deviation
                      and 95% t-interval over the seeds
The same command resumes: finished seeds are skipped, an interrupted one resumes from its
last checkpoint. Exit codes as lnjax.main's (143: stopped by SIGTERM after saving).
"""

import dataclasses
import json
import math
import os

import ml_collections

from lnjax.core import errors, fileio, sections

FINETUNE_CONFIG_FILE = "finetune_config.json"


@dataclasses.dataclass(frozen=True)
class FinetuneConfig:
  """`config.finetune`: what the driver resolves before each seed's run."""

  seeds: tuple[int, ...] = (0, 1, 2, 3, 4)  # One run each: classifier init, dropout, order.
  num_epochs: int = 3  # The run's length when train.num_steps is 0 (BERT: 3).
  warmup_fraction: float = 0.1  # opt.warmup_steps = this × the run's steps (BERT: 10%).
  dropout_rate: float = 0.1  # Replaces the pre-training run's model.dropout_rate.

  def __post_init__(self):
    if not self.seeds:
      raise errors.ConfigError("finetune.seeds is empty: give at least one seed")
    for seed in self.seeds:
      errors.check_int("finetune.seeds", seed, low=0)
    errors.check_int("finetune.num_epochs", self.num_epochs, low=1)
    errors.check_range("finetune.warmup_fraction", self.warmup_fraction, low=0.0, high=1.0,
                       high_open=True)
    errors.check_range("finetune.dropout_rate", self.dropout_rate, low=0.0, high=1.0,
                       high_open=True)


def seed_config(config: ml_collections.ConfigDict, seed: int) -> ml_collections.ConfigDict:
  """The run config of one seed: `config` without its `finetune` section, with the
  pre-training run's model section, train.num_steps (0: num_epochs epochs) and
  opt.warmup_steps resolved, and `seed`."""
  from lnjax.core import checkpoint
  from lnjax.data import glue as glue_data
  from lnjax.tasks import glue

  ft = sections.from_config(FinetuneConfig, "finetune", config.finetune.to_dict())
  values = config.to_dict()
  del values["finetune"]
  data = sections.from_config(glue.GlueDataConfig, "data", values["data"])
  pre = glue.pretraining_run(data)  # Refuses a workdir that is not a BERT run.
  values["model"] = {**checkpoint.load_config(data.init_workdir).model.to_dict(),
                     "dropout_rate": ft.dropout_rate}
  if not values["train"]["num_steps"]:
    pairs = len(glue_data.load_split(data.name, "train", data.data_dir)[2])
    pairs = min(pairs, data.train_examples or pairs)
    values["train"]["num_steps"] = ft.num_epochs * (pairs // data.batch_size)
  values["opt"]["warmup_steps"] = round(ft.warmup_fraction * values["train"]["num_steps"])
  values["seed"] = seed
  if data.seq_len > pre.model.max_len:
    raise errors.ConfigError(f"data.seq_len={data.seq_len} exceeds the pre-trained model's "
                             f"max_len={pre.model.max_len}")
  return ml_collections.ConfigDict(values)


def t_interval(values, confidence: float = 0.95) -> dict:
  """Mean, sample standard deviation and the half-width of the Student-t confidence
  interval of the mean, mean ± t_{(1+c)/2, n-1} · s/√n (None for one value)."""
  import numpy as np
  import scipy.stats

  x = np.asarray(values, np.float64)
  n = len(x)
  mean = float(x.mean())
  if n < 2:
    return {"mean": mean, "std": None, "ci95": None, "n": n}
  std = float(x.std(ddof=1))
  half = float(scipy.stats.t.ppf((1 + confidence) / 2, n - 1) * std / math.sqrt(n))
  return {"mean": mean, "std": std, "ci95": half, "n": n}


def _finished(workdir: str, config: ml_collections.ConfigDict) -> dict | None:
  """The summary of the seed run in `workdir` if it has ended (trained to its last step,
  or diverged); None if it is to train or resume. Refuses a run with another config."""
  from lnjax import tasks
  from lnjax.core import train

  if not train.prepare_workdir(workdir, config, tasks=tasks.get):
    return None
  try:
    summary = json.loads(fileio.read_text(os.path.join(workdir, train.SUMMARY_FILE)) or "{}")
  except (OSError, ValueError):
    return None
  ended = (summary.get("status") == train.DIVERGED or summary.get("status") == train.COMPLETED
           and summary.get("step") == config.train.num_steps)
  return summary if ended else None


def _seed_result(seed: int, workdir: str, summary: dict) -> dict:
  """A seed's dev scores at its last step (from its metrics.jsonl), and its status."""
  from lnjax.core import metrics

  last = [r for r in metrics.read_metrics(workdir)
          if "eval_accuracy" in r and r["step"] == summary["step"]]
  scores = {k[len("eval_"):]: last[-1][k] for k in ("eval_accuracy", "eval_f1")
            if last and k in last[-1]}
  return {"seed": seed, "status": summary["status"], "step": summary["step"], **scores,
          "best_accuracy": summary.get("best_eval_accuracy"),
          "wall_seconds": summary.get("wall_seconds")}


def finetune(config: ml_collections.ConfigDict, workdir: str) -> dict:
  """Trains (or resumes) every seed's run in `workdir`/seeds/; returns (and writes) the
  summary. Stops at the first seed stopped by SIGTERM (status 'preempted')."""
  import jax

  from lnjax import tasks
  from lnjax.core import train

  ft = sections.from_config(FinetuneConfig, "finetune", config.finetune.to_dict())
  configs = {seed: seed_config(config, seed) for seed in ft.seeds}
  fileio.refuse_run_files("--workdir", workdir, [workdir], own=[workdir])
  if jax.process_index() == 0:
    fileio.makedirs(workdir)
    fileio.write_text(os.path.join(workdir, FINETUNE_CONFIG_FILE),
                      config.to_json_best_effort(indent=2, sort_keys=True) + "\n")
  first = next(iter(configs.values()))
  step = {-1: "latest", 0: "initialization"}.get(config.data.init_step, config.data.init_step)
  train.log(f"Fine-tuning {config.data.init_workdir} (checkpoint: {step}, norm_position="
            f"{first.model.norm_position}) on {config.data.name}: {first.train.num_steps} "
            f"steps per seed, seeds {list(ft.seeds)}")
  results, status = {}, train.COMPLETED
  for seed, cfg in configs.items():
    wd = os.path.join(workdir, "seeds", str(seed))
    summary = _finished(wd, cfg)
    if summary:
      train.log(f"seed {seed}: done earlier ({_format(_seed_result(seed, wd, summary))})")
    else:
      summary = train.train_and_evaluate(cfg, wd, tasks=tasks.get)
    results[seed] = _seed_result(seed, wd, summary)
    train.log(f"seed {seed}: {_format(results[seed])}")
    if summary["status"] == train.PREEMPTED:
      status = train.PREEMPTED
      break

  summary = {"status": status, "task": config.data.name,
             "init_workdir": config.data.init_workdir,
             "init_step": config.data.init_step, "norm_position": first.model.norm_position,
             "seeds": list(results), "steps_per_seed": first.train.num_steps,
             "diverged_seeds": [s for s, r in results.items() if r["status"] == train.DIVERGED],
             "per_seed": list(results.values())}
  for metric in ("accuracy", "f1"):
    values = [r[metric] for r in results.values()
              if r["status"] == train.COMPLETED and metric in r]
    if values:
      summary[metric] = t_interval(values)
  if jax.process_index() == 0:
    fileio.write_text(os.path.join(workdir, "summary.json"), json.dumps(summary, indent=2) + "\n")
  return summary


def _format(r: dict) -> str:
  if r["status"] != "completed":
    return f"{r['status']} at step {r['step']}"
  return "  ".join(f"dev {k} {r[k]:.4f}" for k in ("accuracy", "f1") if k in r)


def format_summary(s: dict) -> str:
  parts = []
  for metric in ("accuracy", "f1"):
    if metric in s:
      m = s[metric]
      ci = f" ± {m['ci95']:.4f} (95% t-interval, n={m['n']})" if m["ci95"] is not None else ""
      parts.append(f"dev {metric} {m['mean']:.4f}{ci}")
  if s["diverged_seeds"]:
    parts.append(f"diverged seeds {s['diverged_seeds']}")
  return f"{s['task']} from step {s['init_step']}: " + "; ".join(parts)
