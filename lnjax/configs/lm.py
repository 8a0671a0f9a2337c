r"""Decoder-only Transformer LM on real text, any norm placement.

  python -m lnjax.main --config=configs/lm.py:norm=post,size=course --workdir=/tmp/lm_post

Presets (comma-separated after the colon):
  norm=post|pre        Post-LN LN(x + F(x)) or Pre-LN x + F(LN(x)); the optimizer and
                       schedule are the same for both, so they compare alike.
  size=tiny|small|course|course_reg
                       tiny: 2 layers, D 64; small: 4 layers, D 128, char-level;
                       course: the 8-layer 2.6M-parameter LM of the course workshop
                       (D 128, 4 heads, F 512, SentencePiece 4096, seq 128, batch 32,
                       dropout 0); course_reg: the same with dropout 0.1 (without it the
                       model memorizes tiny_shakespeare long before step 3000).
  data=tiny_shakespeare|wikitext2_raw
  smoke                a few steps of a tiny model (tests use it).

Sweeps of it (python -m lnjax.cli.sweep, see get_sweep): course, stability, seeds, optimizers, zoo.
"""

from lnjax import models, sweep
from lnjax.configs import common as config_lib
from lnjax.core import errors

SIZES = {
    # num_layers, d_model, num_heads, d_ff, tokenizer
    "tiny": (2, 64, 2, 256, "char"),
    "small": (4, 128, 4, 512, "char"),
    "course": (8, 128, 4, 512, "sentencepiece"),
    "course_reg": (8, 128, 4, 512, "sentencepiece"),
}
COURSE_SIZES = ("course", "course_reg")


def get_config(arg=None):
  presets = config_lib.parse_arg(arg, norm=("post", "pre"), size=tuple(SIZES),
                                 data=("tiny_shakespeare", "wikitext2_raw"), smoke=None)
  config_lib.refuse_smoke_with_size(arg, presets)
  c = config_lib.lm_config()
  c.model.norm_position = presets.get("norm", "pre")
  c.data.name = presets.get("data", "tiny_shakespeare")
  layers, d, heads, ff, tokenizer = SIZES[presets.get("size", "small")]
  c.model.num_layers, c.model.d_model, c.model.num_heads, c.model.d_ff = layers, d, heads, ff
  c.data.tokenizer = tokenizer
  c.model.max_len = c.data.seq_len = 128
  course = presets.get("size") in COURSE_SIZES
  c.model.dropout_rate = 0.0 if presets.get("size") == "course" else 0.1
  c.opt.learning_rate = 1e-3
  c.opt.warmup_steps = 30 if course else 0
  c.opt.schedule = "constant"
  c.train.num_steps = 3000 if course else 2000
  if "smoke" in presets:
    config_lib.apply_smoke(c)
  return c.lock()


def get_sweep(arg=None):
  """Sweeps of this config (python -m lnjax.cli.sweep --config=configs/lm.py:... --sweep=ARG):

    course      the course workshop's runs with size=course (or course_reg): Pre-LN and Post-LN at peak lr 1e-3 and 6e-3
                with the preset's 30-step warm-up, and Post-LN at 1e-3 with 1000 steps.
    stability   Post-LN and Pre-LN over peak lr 1e-4 .. 1e-2 × warm-up 0 .. 2000 steps.
    seeds       Post-LN and Pre-LN at the config's own lr and warm-up, seeds 0, 1, 2.
    optimizers  Post-LN and Pre-LN with Adam, RAdam and SGD (momentum 0.9).
    zoo         every placement of lnjax.models.placement × peak lr 3e-4 .. 1e-2, no warm-up
                (which placements train without warm-up, up to which rate).
  """
  choices = ("course", "stability", "seeds", "optimizers", "zoo")
  if arg not in choices:
    raise errors.ConfigError(f"--sweep={arg!r}: configs/lm.py offers {', '.join(choices)}")
  norms = sweep.axis("model.norm_position", ["pre", "post"])
  if arg == "course":
    return sweep.chain(
        sweep.product(norms, sweep.axis("opt.learning_rate", [1e-3, 6e-3]),
                      sweep.axis("opt.warmup_steps", [30])),
        [{"model.norm_position": "post", "opt.learning_rate": 1e-3, "opt.warmup_steps": 1000}])
  if arg == "stability":
    return sweep.product(sweep.axis("model.norm_position", ["post", "pre"]),
                         sweep.axis("opt.learning_rate", [1e-4, 3e-4, 1e-3, 3e-3, 1e-2]),
                         sweep.axis("opt.warmup_steps", [0, 100, 500, 2000]))
  if arg == "zoo":
    return sweep.product(sweep.axis("model.norm_position", list(models.NORM_POSITIONS)),
                         sweep.axis("opt.learning_rate", [3e-4, 1e-3, 3e-3, 1e-2]),
                         sweep.axis("opt.warmup_steps", [0]))
  if arg == "seeds":
    return sweep.product(norms, sweep.axis("seed", [0, 1, 2]))
  return sweep.product(norms, sweep.axis("opt.name", ["adam", "radam", "sgd"]))
