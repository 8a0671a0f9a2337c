r"""IWSLT14 German→English, the paper's translation setting (Xiong et al. 2020, §4).

  python -m lnjax.main --config=configs/iwslt14_de_en.py:norm=pre --workdir=/tmp/iwslt_pre

The paper's model (fairseq's transformer_iwslt_de_en): 6+6 layers, d_model 512, FFN 1024,
4 heads, dropout 0.3, sinusoidal positions, shared embeddings; Adam (β₂ 0.98), label smoothing 0.1, batches of
4096 tokens. Data: fairseq's prepared layout (prepare-iwslt14.sh: Moses-tokenized,
lowercased) with a joint BPE vocabulary of 10,000 (SentencePiece) trained on the train
split. Prepare it once with

  python -m lnjax.cli.prepare iwslt14_de_en

(downloads the TED archive, cleans, tokenizes and splits it as fairseq does). BLEU is tokenized BLEU on that text
(sacreBLEU tokenize='none'), as fairseq's `--scoring bleu` and the paper report, beam 5.

Presets (comma-separated after the colon):
  norm=pre     Pre-LN, no warm-up, lr 5e-4, ×0.1 at epoch 8 (the paper's Pre-LN schedule)
  norm=post    Post-LN, 4000 warm-up steps then inverse square root, lr 5e-4
  dir=de-en|en-de   translation direction
  smoke        a few steps of a tiny model (on the prepared data, as the full run)
"""

from lnjax.configs import common as config_lib


def get_config(arg=None):
  presets = config_lib.parse_arg(arg, norm=("post", "pre"), dir=("de-en", "en-de"), smoke=None)
  c = config_lib.translation_config()
  c.data.name = "iwslt14_de_en"
  c.data.source_lang, _, c.data.target_lang = presets.get("dir", "de-en").partition("-")
  c.data.vocab_size = 10000
  c.data.sp_model_type = "bpe"  # fairseq's joint BPE of 10k.
  c.data.max_tokens = 4096
  c.data.lowercase = True
  c.data.eval_splits = ("validation",)
  c.data.test_split = "test"
  m = c.model
  m.num_layers, m.d_model, m.num_heads, m.d_ff = 6, 512, 4, 1024
  m.dropout_rate = 0.3
  m.pos_emb = "sinusoidal"  # fairseq's, as the paper trained it.
  c.opt.name, c.opt.learning_rate, c.opt.b2 = "adam", 5e-4, 0.98
  c.opt.weight_decay = 0.0
  c.train.label_smoothing = 0.1
  c.train.num_steps = 25_000  # ≈ 22 epochs of the 160k-pair train split at 4096 tokens.
  c.train.eval_every_steps = 1000
  c.train.checkpoint_every_steps = 1000
  c.decode.beam_size = 5
  config_lib.apply_paper_translation_schedule(c, presets.get("norm", "pre"), post_warmup=4000)
  if "smoke" in presets:
    config_lib.apply_translation_smoke(c)
  return c.lock()
