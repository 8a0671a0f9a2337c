r"""Multi30k German→English translation, sized for a CPU.

  python -m lnjax.main --config=configs/multi30k_de_en.py:norm=pre --workdir=/tmp/m30k_pre

A 3+3-layer encoder-decoder (d_model 256, 4 heads, FFN 1024), a joint SentencePiece
vocabulary of 8000 trained on the train split, batches of about 4096 target tokens,
Adam (β₂ 0.98), label smoothing 0.1, dropout 0.1, 1600 steps (about 12 epochs). BLEU (sacreBLEU on detokenized,
cased output) on the validation split at each evaluation, beam 4; the best checkpoint
by BLEU is kept in best_checkpoint/.

Presets (comma-separated after the colon):
  norm=pre     Pre-LN, no warm-up, lr 1e-3 ×0.1 at epoch 10 (the paper's Pre-LN schedule,
               its decay moved from epoch 8 to 10 for a run of 12 epochs)
  norm=post    Post-LN, 1000 warm-up steps then inverse square root, lr 1e-3
  dir=de-en|en-de   translation direction
  quick        a 2+2-layer model (FFN 512, a joint vocabulary of 4000), lr 1.5e-3, 220
               steps (about 1.5 epochs) and one evaluation at the end: test 2016 BLEU
               18.3 in 10 minutes on a 2-core AMD EPYC (REPRODUCTION.md); norm=post
               warms up for 100 steps instead of 1000
  smoke        a few steps of a tiny model (tests use it)

Sweeps of it (python -m lnjax.cli.sweep, see get_sweep): fig2, fig2_paper, fig4, fig2_cpu,
fig4_cpu, zoo.
"""

from lnjax import models, sweep
from lnjax.configs import common as config_lib
from lnjax.core import errors


def get_config(arg=None):
  presets = config_lib.parse_arg(arg, norm=("post", "pre"), dir=("de-en", "en-de"), quick=None,
                                smoke=None)
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
  c.train.num_steps = 1600
  c.train.eval_every_steps = 800
  c.train.checkpoint_every_steps = 800
  config_lib.apply_paper_translation_schedule(c, presets.get("norm", "pre"), post_warmup=1000)
  if c.model.norm_position == "pre":
    c.opt.decay_epochs = (10,)
  if "quick" in presets:  # 2 layers of 3, half the FFN and vocabulary: 2x the tokens a second.
    m.num_layers, m.d_ff, c.data.vocab_size = 2, 512, 4000
    c.opt.learning_rate = 1.5e-3
    c.train.num_steps = c.train.eval_every_steps = c.train.checkpoint_every_steps = 220
    c.opt.warmup_steps = min(c.opt.warmup_steps, 100)
  if "smoke" in presets:
    config_lib.apply_translation_smoke(c)
  return c.lock()


def get_sweep(arg=None):
  """Sweeps of this config (python -m lnjax.cli.sweep --config=configs/multi30k_de_en.py:norm=post
  --sweep=ARG), after Xiong et al. 2020:

    fig2   Fig. 2, Post-LN with the norm=post schedule (linear warm-up, then inverse square
           root), 8000 steps: Adam at peak lr 5e-4 and 1e-3 × warm-up 0, 500, 4000 steps; SGD (momentum
           0.9) at the same peak rates without and with 4000 warm-up steps (arXiv 2002.04745, Fig. 2,
           gives no SGD rate).
    fig2_paper   Fig. 2 at the paper's IWSLT size (6+6 layers, d_model 512, FFN 1024, 4
           heads; with norm=post: label smoothing 0.1, Adam β₂ 0.98, linear warm-up then
           inverse square root): Post-LN at peak lr 5e-4 and 1e-3 × warm-up 0 and 500
           steps, and Pre-LN at 1e-3 without warm-up on the same schedule (only the norm's
           place differs from its Post-LN partner). Batch and length:
           experiments/multi30k_figs.py --fig=2 --size=paper (CPU-sized, or --full).
    fig4   Fig. 4: Pre-LN without warm-up (×0.1 at epoch 10) against Post-LN with 1000
           warm-up steps then inverse square root, each with Adam and with RAdam.
    zoo    every placement of lnjax.models.placement but nGPT (a decoder-only model,
           refused in the encoder-decoder) × peak lr 5e-4 .. 4e-3, Adam, no
           warm-up and a constant rate (which placements train without warm-up, up to which
           rate).
    fig2_cpu, fig4_cpu   the same grids with warm-ups short enough for runs of a few hundred
           steps (experiments/multi30k_figs.py): Fig. 2 with Adam only and warm-up 0, 50, 200
           steps; Fig. 4 with Post-LN's warm-up 200 steps.
  """
  rates = sweep.axis("opt.learning_rate", [5e-4, 1e-3])
  post = sweep.axis("model.norm_position", ["post"])
  if arg == "fig2":
    # 8000 steps: the longest warm-up (4000) then as many steps at the decaying rate.
    steps = sweep.axis("train.num_steps", [8000])
    return sweep.chain(
        sweep.product(post, sweep.axis("opt.name", ["adam"]), rates,
                      sweep.axis("opt.warmup_steps", [0, 500, 4000]), steps),
        sweep.product(post, sweep.axis("opt.name", ["sgd"]), rates,
                      sweep.axis("opt.warmup_steps", [0, 4000]), steps))
  if arg == "fig2_paper":
    iwslt = [{"model.num_layers": 6, "model.d_model": 512, "model.d_ff": 1024,
              "model.num_heads": 4}]
    # The telling pair first (Pre-LN and Post-LN at 1e-3 without warm-up), for a run
    # of the sweep that is stopped early.
    return sweep.product(
        sweep.chain([{"model.norm_position": "pre", "opt.learning_rate": 1e-3,
                      "opt.warmup_steps": 0}],
                    sweep.product(post, sweep.axis("opt.learning_rate", [1e-3, 5e-4]),
                                  sweep.axis("opt.warmup_steps", [0, 500]))),
        iwslt)
  if arg == "fig2_cpu":
    return sweep.product(post, sweep.axis("opt.name", ["adam"]), rates,
                         sweep.axis("opt.warmup_steps", [0, 50, 200]))
  if arg in ("fig4", "fig4_cpu"):
    placements = [
        {"model.norm_position": "pre", "opt.schedule": "step", "opt.warmup_steps": 0,
         "opt.decay_epochs": (10,)},
        {"model.norm_position": "post", "opt.schedule": "inverse_sqrt",
         "opt.warmup_steps": 1000 if arg == "fig4" else 200, "opt.decay_epochs": ()}]
    return sweep.product(placements, sweep.axis("opt.name", ["adam", "radam"]))
  if arg == "zoo":
    return sweep.product(sweep.axis("model.norm_position",
                                    [p for p in models.NORM_POSITIONS if p != "ngpt"]),
                         sweep.axis("opt.learning_rate", [5e-4, 1e-3, 2e-3, 4e-3]),
                         [{"opt.schedule": "constant", "opt.warmup_steps": 0,
                           "opt.decay_epochs": ()}])
  raise errors.ConfigError(f"--sweep={arg!r}: configs/multi30k_de_en.py offers fig2, "
                           "fig2_paper, fig4, fig2_cpu, fig4_cpu, zoo")
