r"""Fine-tuning a BERT pre-training checkpoint on GLUE MRPC or RTE, several seeds.

  python -m lnjax.cli.finetune --config=configs/glue.py:task=mrpc \
      --config.data.init_workdir=/tmp/bert_pre --config.data.init_step=1000 \
      --workdir=/tmp/mrpc_pre

BERT's recipe (Devlin et al. 2019): AdamW, linear warm-up over the first 10% of the
steps then linear decay, batch 32, 3 epochs, dropout 0.1; lr 1e-4 (the upper end of
BERT's range, as small models want). Each seed is one run of task `glue` on the usual
training loop (lnjax/tasks/glue.py); lnjax.tasks.finetune fills in the pre-training run's
model section and the run's length (finetune.*), then reports dev accuracy (and F1 for
MRPC) per seed, and the mean with its 95% t-interval over the seeds.

Presets (comma-separated after the colon):
  task=mrpc|rte
  smoke      2 seeds, 1 epoch over the first 256 train pairs, sequences of 32 tokens
             (tests use it)
"""

import ml_collections

from lnjax.configs import common as config_lib
from lnjax.core import sections
from lnjax.tasks.finetune import FinetuneConfig
from lnjax.core.optim import OptConfig
from lnjax.core.run import TrainConfig
from lnjax.core.sharding import MeshConfig
from lnjax.tasks.glue import GlueDataConfig


def get_config(arg=None):
  presets = config_lib.parse_arg(arg, task=("mrpc", "rte"), smoke=None)
  c = ml_collections.ConfigDict()
  c.task = "glue"  # lnjax/tasks/glue.py; the seed comes from finetune.seeds.
  # Resolved by lnjax.tasks.finetune into each seed's run config (and not part of it).
  c.finetune = sections.section(FinetuneConfig)
  # The GLUE task, the pre-training run to start from (init_workdir, init_step), batches.
  c.data = sections.section(GlueDataConfig, name=presets.get("task", "mrpc"))
  c.opt = sections.section(
      OptConfig, name="adamw", learning_rate=1e-4,
      schedule="linear",  # Linear decay to end_learning_rate after the warm-up.
      b1=0.9, b2=0.999, eps=1e-6, weight_decay=0.01,
      grad_clip_norm=1.0)  # BERT clips at global norm 1. (warmup_steps: from finetune.)
  c.train = sections.section(
      TrainConfig,
      num_steps=0,  # 0: finetune.num_epochs passes over the train split.
      log_every_steps=20, eval_every_steps=50, checkpoint_every_steps=50,
      keep_checkpoints=1)  # (The best, by dev accuracy, is kept in best_checkpoint/.)
  c.mesh = sections.section(MeshConfig)
  if "smoke" in presets:
    c.finetune.seeds = (0, 1)
    c.finetune.num_epochs = 1
    c.data.seq_len = 32
    c.data.train_examples = 256
    c.opt.learning_rate = 1e-3
    c.train.tensorboard = False
  return c.lock()
