"""GLUE fine-tuning (MRPC, RTE): a BERT pre-training run's encoder and pooler with a new
classifier on the first token, cross-entropy over the labels, dev accuracy (and F1 for
MRPC) at every evaluation, the best checkpoint kept by dev accuracy.

A run starts from the pre-training run in `data.init_workdir` (its checkpoint at
`data.init_step`) through `Task.init_params`; its vocabulary is that run's. Its `model`
section must be that run's (dropout aside): `python -m lnjax.cli.finetune` copies it, sizes
the run in epochs and runs several seeds (lnjax/tasks/finetune.py).
"""

import dataclasses
import functools

import jax
import jax.numpy as jnp

from lnjax.core import errors, losses, sharding
from lnjax.data import glue as glue_data
from lnjax.data import mlm as mlm_data
from lnjax.models.bert import BertClassifier
from lnjax.core.task import EvalContext, Task

NUM_CLASSES = 2  # MRPC: paraphrase or not; RTE: entailment or not.
# Model fields that change how the model computes, not what it computes or its
# parameters: free to differ from the pre-training run's.
FREE_MODEL_FIELDS = ("dropout_rate", "attention_dropout_rate", "dtype", "remat_policy",
                     "weight_grad", "attention_impl")


@dataclasses.dataclass(frozen=True)
class GlueDataConfig:
  """`config.data` of GLUE runs."""

  name: str = "mrpc"  # mrpc | rte
  init_workdir: str = ""  # The BERT pre-training run (configs/bert.py): vocabulary, encoder.
  init_step: int = -1  # Its checkpoint: -1 = the latest, 0 = its initialization (no
  # pre-training).
  data_dir: str | None = None  # Holds glue_mrpc/, glue_rte/; None: $LNJAX_DATA_DIR, then
  # the download folder (fetched on first use).
  seq_len: int = 128  # L: [CLS] A [SEP] B [SEP], trimmed longest-first; <= model.max_len.
  batch_size: int = 32  # B: pairs per step, over all devices and hosts.
  train_examples: int = 0  # Only the first N train pairs; 0 = all (smoke runs use a few).

  def __post_init__(self):
    errors.check_choice("data.name", self.name, tuple(glue_data.TASKS))
    if not self.init_workdir:
      raise errors.ConfigError("data.init_workdir is empty: give the BERT pre-training run's "
                               "workdir")
    errors.check_int("data.init_step", self.init_step, low=-1)
    errors.check_path("data.data_dir", self.data_dir)
    errors.check_int("data.seq_len", self.seq_len, low=8)
    errors.check_int("data.batch_size", self.batch_size, low=1)
    errors.check_int("data.train_examples", self.train_examples, low=0)


def pretraining_run(cfg: GlueDataConfig):
  """The pre-training run's RunConfig, from its config.json."""
  from lnjax import tasks
  from lnjax.core import checkpoint, run as run_lib

  config = checkpoint.load_config(cfg.init_workdir)
  if config is None:
    raise errors.CheckpointError(f"{cfg.init_workdir} holds no config.json: not an lnjax "
                                 "workdir")
  run = run_lib.resolve_config(config, tasks=tasks.get)
  if run.task.name not in ("mlm", "mlm_nsp"):
    raise errors.CheckpointError(f"{cfg.init_workdir} is a {run.task.name!r} run, not a BERT "
                                 "pre-training run (configs/bert.py)")
  return run


def make_data(cfg: GlueDataConfig, seed: int, process_index: int, process_count: int,
              batch_multiple: int) -> glue_data.GlueData:
  del batch_multiple  # Pairs are all one shape; the last dev batch is padded.
  vocab = mlm_data.make_vocab(pretraining_run(cfg).data)
  data = glue_data.GlueData(cfg.name, vocab, cfg.seq_len, cfg.batch_size, cfg.data_dir,
                            cfg.train_examples, seed=seed, process_index=process_index,
                            process_count=process_count)
  assert data.num_classes == NUM_CLASSES, data.num_classes
  return data


def classification_loss(logits_BxC, batch: dict, label_smoothing: float):
  """(smoothed loss sum, NLL sum, example count) of the labels under logits [B, C]."""
  loss_sum, nll_sum, count = losses.cross_entropy(logits_BxC[:, None], batch["labels"][:, None],
                                                  batch["weights"][:, None], label_smoothing)
  return loss_sum, nll_sum, count


def init_params(setup, params, run):
  """The fresh parameters with `bert/...` and `pooler` replaced by the pre-training run's
  at data.init_step (0: its initialization); the classifier stays fresh."""
  from lnjax import tasks
  from lnjax.core import checkpoint, state as state_lib

  cfg = run.data
  pre = pretraining_run(cfg)
  differing = [f.name for f in dataclasses.fields(run.model) if f.name not in FREE_MODEL_FIELDS
               and getattr(run.model, f.name) != getattr(pre.model, f.name)]
  if differing:
    raise errors.ConfigError(
        f"model.{differing[0]}={getattr(run.model, differing[0])!r} differs from the "
        f"pre-training run's {getattr(pre.model, differing[0])!r} ({cfg.init_workdir}); "
        "python -m lnjax.cli.finetune copies that run's model section")
  if cfg.init_step == 0:
    mesh = sharding.make_mesh(sharding.MeshConfig(data=1), jax.local_devices()[:1])
    setup = state_lib.make_setup(pre.model, pre.opt, pre.train.num_steps, task=pre.task)
    pretrained = state_lib.init_state(setup, mesh, pre.seed).params
  else:
    pretrained = checkpoint.restore_run(
        cfg.init_workdir, None if cfg.init_step == -1 else cfg.init_step,
        tasks=tasks.get).state.params
  # As host arrays: the loop places them on its mesh (every process holds the same values).
  return {**params, **jax.device_get({k: pretrained[k] for k in ("bert", "pooler")})}


@functools.partial(jax.jit, static_argnames=("model", "positive"))
def _dev_counts(params, batch: dict, *, model, positive: int | None) -> dict:
  """Weighted counts of one dev batch: examples, correct predictions, and the true
  positives, false positives and false negatives of class `positive`."""
  predictions_B = model.apply({"params": params}, batch["inputs"], batch["segment_ids"]
                              ).argmax(-1)
  labels_B, weights_B = batch["labels"], batch["weights"]
  count = lambda hits_B: (hits_B * weights_B).sum()
  counts = {"examples": weights_B.sum(), "correct": count(predictions_B == labels_B)}
  if positive is not None:
    said, true = predictions_B == positive, labels_B == positive
    counts.update(tp=count(said & true), fp=count(said & ~true), fn=count(~said & true))
  return counts


def dev_scores(ctx: EvalContext) -> dict:
  """Dev accuracy, and F1 of the positive class for MRPC (GLUE reports both)."""
  positive = ctx.data.spec.positive
  batch_sharding = sharding.batch_sharding(ctx.mesh)
  totals = {}
  for batch in ctx.data.eval_batches():
    counts = _dev_counts(ctx.params, sharding.global_batch(batch, batch_sharding),
                         model=ctx.setup.model, positive=positive)
    for k, v in jax.device_get(counts).items():
      totals[k] = totals.get(k, 0.0) + float(v)
  scores = {"eval_accuracy": totals["correct"] / totals["examples"]}
  if positive is not None:
    tp, fp, fn = totals["tp"], totals["fp"], totals["fn"]
    scores["eval_f1"] = 2 * tp / (2 * tp + fp + fn) if tp else 0.0
  return scores


GLUE = Task(
    name="glue",
    data_config=GlueDataConfig,
    make_model=functools.partial(BertClassifier, num_classes=NUM_CLASSES),
    example_inputs=lambda t=8: (jnp.ones((1, t), jnp.int32), jnp.zeros((1, t), jnp.int32)),
    model_inputs=lambda batch: (batch["inputs"], batch["segment_ids"]),
    make_data=make_data,
    loss=classification_loss,
    evaluators=(dev_scores,),
    best_metric="eval_accuracy",
    init_params=init_params,
    # configs/glue.py's finetune section: seeds of runs from a pre-trained BERT run.
    command_sections={"finetune": "this config's finetune section is lnjax finetune's, which "
                      "makes one run per seed from a pre-trained BERT run: run "
                      "`lnjax finetune --config=...` (lnjax.cli.finetune)"},
)

TASKS = (GLUE,)
