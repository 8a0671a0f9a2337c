r"""The embedded default: a small Pre-LN LM without warm-up on tiny_shakespeare.

  python -m lnjax.main --config=configs/default.py --workdir=/tmp/lnjax_default

4 layers, D 128, 4 heads, F 512, character-level, sequences of 128, batch 32, Adam at
a constant 2e-3 with no warm-up: Pre-LN trains without it (Xiong et al. 2020). About
four minutes on 2 CPU cores; ends with the held-out loss beside the unigram baseline.
Presets: `smoke` (a few steps of a tiny model).
"""

from lnjax.configs import common as config_lib


def get_config(arg=None):
  presets = config_lib.parse_arg(arg, smoke=None)
  c = config_lib.lm_config()
  c.model.norm_position = "pre"
  c.model.num_layers, c.model.d_model, c.model.num_heads, c.model.d_ff = 4, 128, 4, 512
  c.model.max_len = c.data.seq_len = 128
  c.model.dropout_rate = 0.1
  c.data.name = "tiny_shakespeare"
  c.data.tokenizer = "char"
  c.data.batch_size = 32
  c.opt.name = "adam"
  c.opt.learning_rate = 2e-3
  c.opt.schedule = "constant"
  c.opt.warmup_steps = 0
  c.train.num_steps = 1000
  c.train.eval_every_steps = 500
  c.train.checkpoint_every_steps = 500
  if "smoke" in presets:
    config_lib.apply_smoke(c)
  return c.lock()
