r"""Fine-tunes a BERT pre-training checkpoint on GLUE MRPC or RTE, over several seeds.

  python -m lnjax.finetune --config=configs/glue.py:task=mrpc \
      --config.init.workdir=/tmp/bert_pre --config.init.step=1000 --workdir=/tmp/mrpc_pre

The encoder (`bert/...`) and the pooler come from the pre-training run's checkpoint at
`init.step` (-1: the latest; 0: the run's initialization, i.e. no pre-training); the
classifier on the first token is new. Each seed (classifier init, dropout, batch order)
trains `train.num_epochs` epochs with linear warm-up over `train.warmup_fraction` of the
steps and linear decay, then scores the dev split. Writes into the workdir:
  seeds/<seed>.json   dev accuracy (and F1 for MRPC) of each seed; a re-run skips these
  metrics.jsonl       train loss every train.log_every_steps, per seed
  summary.json        mean, standard deviation and 95% t-interval over the seeds
"""

import dataclasses
import functools
import json
import math
import os
import sys
import time

import lnjax  # noqa: F401  (allocator settings before JAX starts)
from absl import app, flags, logging
from ml_collections import config_flags

from lnjax import config_lib, errors

FINETUNE_CONFIG_FILE = "finetune_config.json"


@dataclasses.dataclass(frozen=True)
class InitConfig:
  workdir: str = ""  # The pre-training run (python -m lnjax.main with configs/bert.py).
  step: int = -1  # Its checkpoint: -1 = latest, 0 = its initialization (no pre-training).

  def __post_init__(self):
    if not self.workdir:
      raise errors.ConfigError("init.workdir is empty: give the pre-training run's workdir")
    if isinstance(self.step, bool) or not isinstance(self.step, int) or self.step < -1:
      raise errors.ConfigError(f"init.step={self.step!r} must be -1 (latest), 0 or a step")


@dataclasses.dataclass(frozen=True)
class GlueDataConfig:
  data_dir: str | None = None  # Holds glue_mrpc/, glue_rte/; None: env, then ../shared/data.
  seq_len: int = 128  # L: [CLS] A [SEP] B [SEP], trimmed longest-first.
  batch_size: int = 32
  train_examples: int = 0  # Only the first N train pairs; 0 = all (smoke runs use a few).

  def __post_init__(self):
    for key, low in (("seq_len", 8), ("batch_size", 1), ("train_examples", 0)):
      errors.check_range(f"data.{key}", getattr(self, key), low=low)


@dataclasses.dataclass(frozen=True)
class FinetuneTrainConfig:
  num_epochs: int = 3
  warmup_fraction: float = 0.1  # Linear warm-up over this fraction of the steps.
  dropout_rate: float = 0.1  # Replaces the pre-training run's model.dropout_rate.
  log_every_steps: int = 20

  def __post_init__(self):
    errors.check_range("train.num_epochs", self.num_epochs, low=1)
    errors.check_range("train.warmup_fraction", self.warmup_fraction, low=0.0, high=1.0,
                       high_open=True)
    errors.check_range("train.dropout_rate", self.dropout_rate, low=0.0, high=1.0, high_open=True)
    errors.check_range("train.log_every_steps", self.log_every_steps, low=1)


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


def classification_metrics(predictions, labels, positive: int | None) -> dict:
  """Accuracy, and F1 of class `positive` when given (MRPC reports both)."""
  import numpy as np

  p, y = np.asarray(predictions), np.asarray(labels)
  scores = {"accuracy": float((p == y).mean())}
  if positive is not None:
    tp = float(((p == positive) & (y == positive)).sum())
    fp = float(((p == positive) & (y != positive)).sum())
    fn = float(((p != positive) & (y == positive)).sum())
    scores["f1"] = 2 * tp / (2 * tp + fp + fn) if tp else 0.0
  return scores


def load_pretrained(init: InitConfig):
  """(pre-training RunConfig, its parameters) at init.step, on one device."""
  from lnjax import checkpoint, run as run_lib, sharding, state as state_lib
  import jax

  if init.step == 0:
    config = checkpoint.load_config(init.workdir)
    if config is None:
      raise errors.CheckpointError(f"{init.workdir} holds no config.json: not an lnjax workdir")
    run = run_lib.resolve_config(config)
    mesh = sharding.make_mesh(sharding.MeshConfig(data=1), jax.local_devices()[:1])
    setup = state_lib.make_setup(run.model, run.opt, run.train.num_steps, task=run.task)
    params = state_lib.init_state(setup, mesh, run.seed).params
  else:
    restored = checkpoint.restore_run(init.workdir, None if init.step == -1 else init.step)
    run, params = restored.run, restored.state.params
  if "bert" not in params:
    raise errors.CheckpointError(f"{init.workdir} is a {run.task.name!r} run, not a BERT "
                                 "pre-training run (configs/bert.py)")
  return run, params


def finetune(config, workdir: str) -> dict:
  """Fine-tunes every seed not finished in `workdir`; returns (and writes) the summary."""
  import jax
  import jax.numpy as jnp
  import numpy as np
  import optax
  import flax.linen as nn

  from lnjax import losses, metrics as metrics_lib, optim
  from lnjax.data import glue, mlm
  from lnjax.models.bert import BertClassifier

  task = config.task
  errors.check_choice("task", task, tuple(glue.TASKS))
  init = config_lib.from_config(InitConfig, "init", config.init.to_dict())
  data_cfg = config_lib.from_config(GlueDataConfig, "data", config.data.to_dict())
  train_cfg = config_lib.from_config(FinetuneTrainConfig, "train", config.train.to_dict())
  opt_cfg = config_lib.from_config(optim.OptConfig, "opt", config.opt.to_dict())
  seeds = [int(s) for s in config.seeds]
  if not seeds:
    raise errors.ConfigError("seeds is empty: give at least one seed")
  os.makedirs(os.path.join(workdir, "seeds"), exist_ok=True)
  with open(os.path.join(workdir, FINETUNE_CONFIG_FILE), "w") as f:
    f.write(config.to_json_best_effort(indent=2, sort_keys=True) + "\n")

  run, pretrained = load_pretrained(init)
  if data_cfg.seq_len > run.model.max_len:
    raise errors.ConfigError(f"data.seq_len={data_cfg.seq_len} exceeds the pre-trained "
                             f"model's max_len={run.model.max_len}")
  data = glue.GlueData(task, mlm.make_vocab(run.data), data_cfg.seq_len, data_cfg.batch_size,
                       data_cfg.data_dir, data_cfg.train_examples)
  model = BertClassifier(dataclasses.replace(run.model, dropout_rate=train_cfg.dropout_rate),
                         data.num_classes)
  num_steps = train_cfg.num_epochs * data.steps_per_epoch
  opt_cfg = dataclasses.replace(opt_cfg, warmup_steps=round(train_cfg.warmup_fraction * num_steps))
  schedule = optim.make_schedule(opt_cfg, num_steps)
  tx = optim.make_optimizer(opt_cfg, schedule)

  def loss_fn(params, batch, dropout_key):
    logits_BxC = model.apply({"params": params}, batch["inputs"], batch["segment_ids"],
                             deterministic=False, rngs={"dropout": dropout_key})
    _, nll_sum, count = losses.cross_entropy(logits_BxC[:, None], batch["labels"][:, None],
                                            batch["weights"][:, None])
    return nll_sum / count

  @functools.partial(jax.jit, donate_argnums=(0, 1))
  def train_step(params, opt_state, batch, dropout_key):
    loss, grads = jax.value_and_grad(loss_fn)(params, batch, dropout_key)
    updates, opt_state = tx.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss

  @jax.jit
  def predict(params, batch):
    return model.apply({"params": params}, batch["inputs"], batch["segment_ids"]).argmax(-1)

  print(f"Fine-tuning {init.workdir} (step {init.step if init.step >= 0 else 'latest'}, "
        f"norm_position={run.model.norm_position}) on {task}: {len(data.splits['train']['labels'])}"
        f" train / {len(data.splits['dev']['labels'])} dev pairs, {num_steps} steps per seed, "
        f"seeds {seeds}", flush=True)
  writer = metrics_lib.MetricWriter(workdir, tensorboard=False)
  example = (jnp.ones((1, 8), jnp.int32), jnp.zeros((1, 8), jnp.int32))
  results = {}
  for seed in seeds:
    path = os.path.join(workdir, "seeds", f"{seed}.json")
    if os.path.exists(path):
      with open(path) as f:
        results[seed] = json.load(f)
      print(f"seed {seed}: done earlier ({_format(results[seed])})", flush=True)
      continue
    t0 = time.perf_counter()
    params = nn.unbox(model.init(jax.random.key(seed), *example)["params"])
    # The pre-trained encoder and pooler replace their fresh copies; the classifier is new.
    params = {**params, **{k: v for k, v in pretrained.items() if k in ("bert", "pooler")}}
    params = jax.tree.map(jnp.array, params)  # Own copies: the step donates its buffers.
    opt_state = tx.init(params)
    window_losses = []
    for step, batch in enumerate(data.train_batches(seed, train_cfg.num_epochs), start=1):
      key = jax.random.fold_in(jax.random.key(seed), step)
      params, opt_state, loss = train_step(params, opt_state, batch, key)
      window_losses.append(loss)
      if step % train_cfg.log_every_steps == 0 or step == num_steps:
        mean = float(np.mean(jax.device_get(window_losses)))
        writer.write(step, {"seed": seed, "train_loss": mean})
        window_losses = []
        if not math.isfinite(mean):
          break
    predictions, labels = [], []
    for batch in data.dev_batches():
      real = batch["weights"] > 0
      predictions.append(np.asarray(predict(params, batch))[real])
      labels.append(batch["labels"][real])
    scores = classification_metrics(np.concatenate(predictions), np.concatenate(labels),
                                    data.spec.positive)
    results[seed] = {"seed": seed, **scores, "steps": num_steps,
                     "seconds": round(time.perf_counter() - t0, 1)}
    writer.write(num_steps, {"seed": seed, **{f"dev_{k}": v for k, v in scores.items()}})
    with open(path, "w") as f:
      json.dump(results[seed], f, indent=2)
    print(f"seed {seed}: {_format(results[seed])} ({results[seed]['seconds']:.0f} s)", flush=True)
  writer.close()

  summary = {"task": task, "init_workdir": os.path.abspath(init.workdir),
             "init_step": init.step, "norm_position": run.model.norm_position,
             "seeds": seeds, "steps_per_seed": num_steps}
  for metric in ("accuracy", "f1"):
    values = [results[s][metric] for s in seeds if metric in results[s]]
    if values:
      summary[metric] = t_interval(values)
  with open(os.path.join(workdir, "summary.json"), "w") as f:
    json.dump(summary, f, indent=2)
    f.write("\n")
  return summary


def _format(scores: dict) -> str:
  return "  ".join(f"dev {k} {scores[k]:.4f}" for k in ("accuracy", "f1") if k in scores)


def format_summary(s: dict) -> str:
  parts = []
  for metric in ("accuracy", "f1"):
    if metric in s:
      m = s[metric]
      ci = f" ± {m['ci95']:.4f} (95% t-interval, n={m['n']})" if m["ci95"] is not None else ""
      parts.append(f"dev {metric} {m['mean']:.4f}{ci}")
  return f"{s['task']} from step {s['init_step']}: " + "; ".join(parts)


def main(argv):
  if len(argv) > 1:
    sys.exit(f"lnjax.finetune: error: unexpected arguments: {' '.join(argv[1:])}")
  logging.set_verbosity(logging.WARNING)
  try:
    summary = finetune(_CONFIG.value, _WORKDIR.value)
  except errors.LnjaxError as e:
    print(f"lnjax.finetune: error: {e}", file=sys.stderr, flush=True)
    sys.exit(e.exit_code)
  print(f"\n== {format_summary(summary)}\n   results in {os.path.abspath(_WORKDIR.value)}: "
        "seeds/, metrics.jsonl, summary.json")


if __name__ == "__main__":
  # Flags only for the command line: importing this module (experiments) defines none.
  _CONFIG = config_flags.DEFINE_config_file("config", None, "configs/glue.py[:presets].",
                                            lock_config=True)
  _WORKDIR = flags.DEFINE_string("workdir", None, "Where the results go.", required=True)
  app.run(main)
