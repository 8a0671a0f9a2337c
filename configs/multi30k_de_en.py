r"""Multi30k German→English translation, sized for a CPU.

  python -m lnjax.main --config=configs/multi30k_de_en.py:norm=pre --workdir=/tmp/m30k_pre

A 3+3-layer encoder-decoder (d_model 256, 4 heads, FFN 1024), a joint SentencePiece
vocabulary of 8000 trained on the train split, batches of about 4096 target tokens,
Adam (β₂ 0.98), label smoothing 0.1, dropout 0.1, 1800 steps (about 14 epochs). BLEU (sacreBLEU on detokenized,
cased output) on the validation split at each evaluation, beam 4; the best checkpoint
by BLEU is kept in best_checkpoint/.

Presets (comma-separated after the colon):
  norm=pre     Pre-LN, no warm-up, lr 1e-3 ×0.1 at epoch 10 (the paper's Pre-LN schedule,
               its decay moved from epoch 8 to 10 for a run of 14 epochs)
  norm=post    Post-LN, 1000 warm-up steps then inverse square root, lr 1e-3
  dir=de-en|en-de   translation direction
  smoke        a few steps of a tiny model (tests use it)
"""

from lnjax import config_lib


def get_config(arg=None):
  presets = config_lib.parse_arg(arg, norm=("post", "pre"), dir=("de-en", "en-de"), smoke=None)
  c = config_lib.translation_config()
  c.data.name = "multi30k_de_en"
  c.data.source_lang, _, c.data.target_lang = presets.get("dir", "de-en").partition("-")
  c.data.vocab_size = 8000
  c.data.max_tokens = 4096
  c.data.eval_splits = ("validation",)
  c.data.test_split = "test_2016_flickr"
  m = c.model
  m.num_layers, m.d_model, m.num_heads, m.d_ff = 3, 256, 4, 1024
  m.dropout_rate = 0.1
  c.opt.name, c.opt.learning_rate, c.opt.b2 = "adam", 1e-3, 0.98
  c.train.label_smoothing = 0.1
  c.train.num_steps = 1800
  c.train.eval_every_steps = 600
  c.train.checkpoint_every_steps = 600
  config_lib.apply_paper_translation_schedule(c, presets.get("norm", "pre"), post_warmup=1000)
  if c.model.norm_position == "pre":
    c.opt.decay_epochs = (10,)
  if "smoke" in presets:
    config_lib.apply_translation_smoke(c)
  return c.lock()
