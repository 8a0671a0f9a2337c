r"""WMT14 English→German, Transformer base (Vaswani et al. 2017; Xiong et al. 2020, §4).

  python -m lnjax.main --config=configs/wmt14_en_de.py:norm=pre --workdir=/tmp/wmt_pre

6+6 layers, d_model 512, 8 heads, FFN 2048, dropout 0.1, sinusoidal positions, shared
embeddings, a joint SentencePiece vocabulary of 32,000; Adam (β₂ 0.98), label smoothing
0.1, about 25k target tokens per step (fairseq's 8 GPUs × 3584). A GPU/TPU-slice run (see BUILD.md);
on a CPU use the `smoke` preset or Multi30k.

Data: the TFDS catalog's `wmt14_translate/de-en` (Europarl v7, Common Crawl, News
Commentary v9: 4.5M pairs; validation newstest2013, test newstest2014), read as
array_record from the TFDS data dir. Prepare it once where the WMT sites are reachable:

  python -m lnjax.cli.prepare wmt14_en_de [--tfds_data_dir=gs://bucket/tfds]

then point data.tfds_data_dir (or TFDS_DATA_DIR) at that dir. BLEU is sacreBLEU on
detokenized, cased output.

Presets (comma-separated after the colon):
  norm=pre     Pre-LN, no warm-up, lr 7e-4 held until epoch 6, then inverse square root
               (the paper's WMT14 Pre-LN schedule; lr=1.5e-3 is its other setting)
  norm=post    Post-LN, 4000 warm-up steps then inverse square root, lr 7e-4
  dir=en-de|de-en   translation direction
  smoke        a few steps of a tiny model (on the prepared data, as the full run)
"""

from lnjax.configs import common as config_lib


def get_config(arg=None):
  presets = config_lib.parse_arg(arg, norm=("post", "pre"), dir=("en-de", "de-en"), smoke=None)
  c = config_lib.translation_config()
  c.data.name = "tfds:wmt14_translate/de-en"
  c.data.source_lang, _, c.data.target_lang = presets.get("dir", "en-de").partition("-")
  c.data.vocab_size = 32000
  c.data.sp_model_type = "bpe"
  c.data.max_tokens = 25_000
  c.data.eval_splits = ("validation",)  # newstest2013
  c.data.test_split = "test"
  m = c.model
  m.num_layers, m.d_model, m.num_heads, m.d_ff = 6, 512, 8, 2048
  m.dropout_rate = 0.1
  m.pos_emb = "sinusoidal"  # fairseq's transformer_wmt_en_de, as the paper trained it.
  m.dtype = "bfloat16"  # Accelerators; parameters and optimizer state stay float32.
  c.opt.name, c.opt.learning_rate, c.opt.b2 = "adam", 7e-4, 0.98
  c.train.label_smoothing = 0.1
  c.train.num_steps = 100_000
  c.train.eval_every_steps = 5000
  c.train.checkpoint_every_steps = 5000
  c.decode.beam_size = 4
  c.decode.length_penalty = 0.6
  if presets.get("norm", "pre") == "pre":
    m.norm_position = "pre"
    c.opt.schedule, c.opt.warmup_steps = "inverse_sqrt", 0
    c.opt.decay_epochs = (6,)
  else:
    m.norm_position = "post"
    c.opt.schedule, c.opt.warmup_steps = "inverse_sqrt", 4000
  if "smoke" in presets:
    config_lib.apply_translation_smoke(c)
    m.dtype = "float32"
  return c.lock()
