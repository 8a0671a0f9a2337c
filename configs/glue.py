r"""Fine-tuning a BERT pre-training checkpoint on GLUE MRPC or RTE, several seeds.

  python -m lnjax.finetune --config=configs/glue.py:task=mrpc \
      --config.init.workdir=/tmp/bert_pre --config.init.step=1000 --workdir=/tmp/mrpc_pre

BERT's recipe (Devlin et al. 2019): AdamW, linear warm-up over the first 10% of the
steps then linear decay, batch 32, 3 epochs, dropout 0.1; lr 1e-4 (the upper end of
BERT's range, as small models want). Dev accuracy (and F1 for MRPC) per seed, and the
mean with its 95% t-interval over the seeds.

Presets (comma-separated after the colon):
  task=mrpc|rte
  smoke      2 seeds, 1 epoch over the first 256 train pairs, sequences of 32 tokens
             (tests use it)
"""

import ml_collections

from lnjax import config_lib


def get_config(arg=None):
  presets = config_lib.parse_arg(arg, task=("mrpc", "rte"), smoke=None)
  c = ml_collections.ConfigDict()
  c.task = presets.get("task", "mrpc")  # mrpc | rte
  c.seeds = (0, 1, 2, 3, 4)  # Classifier init, dropout and batch order of each run.

  c.init = i = ml_collections.ConfigDict()
  i.workdir = ""  # The pre-training run's workdir (configs/bert.py).
  i.step = -1  # Its checkpoint: -1 = latest, 0 = its initialization (no pre-training).

  c.data = d = ml_collections.ConfigDict()
  d.data_dir = ml_collections.FieldReference(None, field_type=str)  # Holds glue_mrpc/,
  # glue_rte/; None: $LNJAX_DATA_DIR, then ../shared/data beside the repository.
  d.seq_len = 128  # [CLS] A [SEP] B [SEP], trimmed longest-first; <= the model's max_len.
  d.batch_size = 32
  d.train_examples = 0  # Only the first N train pairs; 0 = all.

  c.train = t = ml_collections.ConfigDict()
  t.num_epochs = 3
  t.warmup_fraction = 0.1  # Linear warm-up over this fraction of the steps.
  t.dropout_rate = 0.1  # Replaces the pre-training run's model.dropout_rate.
  t.log_every_steps = 20

  c.opt = o = ml_collections.ConfigDict()
  o.name = "adamw"  # adam | adamw | sgd | radam
  o.learning_rate = 1e-4
  o.schedule = "linear"  # Linear decay to end_learning_rate after the warm-up.
  o.end_learning_rate = 0.0
  o.b1, o.b2, o.eps = 0.9, 0.999, 1e-6
  o.weight_decay = 0.01
  o.grad_clip_norm = 1.0  # BERT clips at global norm 1.
  if "smoke" in presets:
    c.seeds = (0, 1)
    d.seq_len = 32
    d.train_examples = 256
    t.num_epochs = 1
    t.log_every_steps = 50
    o.learning_rate = 1e-3
  return c.lock()
