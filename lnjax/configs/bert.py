r"""BERT pre-training (masked LM + next sentence) on WikiText-2, any norm placement.

  python -m lnjax.main --config=configs/bert.py:norm=pre,size=cpu --workdir=/tmp/bert_pre

Presets (comma-separated after the colon), the paper's BERT recipes (Xiong et al. 2020, §4;
arXiv 2002.04745):
  norm=post     Post-LN, lr 1e-4, linear warm-up then linear decay to 0. BERT warms up
                for 10k of 1M steps; a shorter run keeps that 1% (size=cpu: 10 steps of
                1000; experiments/bert_prepost.py sets its own).
  norm=pre      Pre-LN, no warm-up, linear decay from 3e-4.
  size=cpu      4 layers, D 256, 4 heads, FFN 1024, seq 128, batch 32, SentencePiece 8000,
                no dropout (a short run underfits): a few seconds a step on 2 CPU cores.
  size=base     BERT base: 12 layers, D 768, 12 heads, FFN 3072, seq 128, batch 256,
                dropout 0.1, 1M steps (10k warm-up for norm=post).
  objective=mlm_nsp|mlm   with (default) or without next-sentence prediction.
  smoke         a few steps of a tiny character-level model (tests use it).
"""

from lnjax.configs import common as config_lib

BERT_STEPS, BERT_WARMUP_STEPS = 1_000_000, 10_000  # Devlin et al. 2019.

SIZES = {
    # num_layers, d_model, num_heads, d_ff, batch_size, dropout, num_steps
    "cpu": (4, 256, 4, 1024, 32, 0.0, 1000),
    "base": (12, 768, 12, 3072, 256, 0.1, BERT_STEPS),
}


def get_config(arg=None):
  presets = config_lib.parse_arg(arg, norm=("post", "pre"), size=tuple(SIZES),
                                 objective=("mlm_nsp", "mlm"), smoke=None)
  config_lib.refuse_smoke_with_size(arg, presets)
  c = config_lib.bert_config()
  c.task = presets.get("objective", "mlm_nsp")
  m = c.model
  m.num_layers, m.d_model, m.num_heads, m.d_ff, c.data.batch_size, m.dropout_rate, steps = (
      SIZES[presets.get("size", "cpu")])
  m.max_len = c.data.seq_len = 128
  c.train.num_steps = steps
  c.train.eval_every_steps = c.train.checkpoint_every_steps = max(steps // 10, 1)
  c.train.keep_checkpoints = 20  # Fine-tuning reads checkpoints from several stages.
  m.norm_position = presets.get("norm", "pre")
  if m.norm_position == "post":
    c.opt.learning_rate = 1e-4
    c.opt.warmup_steps = max(round(steps * BERT_WARMUP_STEPS / BERT_STEPS), 1)
  else:
    c.opt.learning_rate = 3e-4
    c.opt.warmup_steps = 0
  if "smoke" in presets:
    config_lib.apply_bert_smoke(c)
  return c.lock()
