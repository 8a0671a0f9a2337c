r"""Decoder-only Transformer LM on real text, any norm placement.

  python -m lnjax.main --config=configs/lm.py:norm=post,size=course --workdir=/tmp/lm_post

Presets (comma-separated after the colon):
  norm=post|pre        Post-LN LN(x + F(x)) or Pre-LN x + F(LN(x)); the optimizer and
                       schedule are the same for both, so they compare alike.
  size=tiny|small|course
                       tiny: 2 layers, D 64; small: 4 layers, D 128, char-level;
                       course: the 8-layer 2.6M-parameter LM of REFERENCE §6
                       (D 128, 4 heads, F 512, SentencePiece 4096, seq 128, batch 32).
  data=tiny_shakespeare|wikitext2_raw
  smoke                a few steps of a tiny model (tests use it).
"""

from lnjax import config_lib

SIZES = {
    # num_layers, d_model, num_heads, d_ff, tokenizer
    "tiny": (2, 64, 2, 256, "char"),
    "small": (4, 128, 4, 512, "char"),
    "course": (8, 128, 4, 512, "sentencepiece"),
}


def get_config(arg=None):
  presets = config_lib.parse_arg(arg, norm=("post", "pre"), size=tuple(SIZES),
                                 data=("tiny_shakespeare", "wikitext2_raw"), smoke=None)
  c = config_lib.lm_config()
  c.model.norm_position = presets.get("norm", "pre")
  c.data.name = presets.get("data", "tiny_shakespeare")
  layers, d, heads, ff, tokenizer = SIZES[presets.get("size", "small")]
  c.model.num_layers, c.model.d_model, c.model.num_heads, c.model.d_ff = layers, d, heads, ff
  c.data.tokenizer = tokenizer
  c.model.max_len = c.data.seq_len = 128
  c.model.dropout_rate = 0.0 if presets.get("size") == "course" else 0.1
  c.opt.learning_rate = 1e-3
  c.opt.warmup_steps = 30 if presets.get("size") == "course" else 0
  c.opt.schedule = "constant"
  c.train.num_steps = 3000 if presets.get("size") == "course" else 2000
  if "smoke" in presets:
    config_lib.apply_smoke(c)
  return c.lock()

