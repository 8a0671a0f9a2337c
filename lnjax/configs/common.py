"""Helpers shared by the files in configs/: the LM's default keys, preset parsing, and
mapping a config section onto its dataclass with one-line errors.

Every run is described by one `ml_collections.ConfigDict` with the sections
`model` (-> models.ModelConfig), `opt` (-> optim.OptConfig), `data` (-> data.LMDataConfig),
`train` (-> train.TrainConfig), `mesh` (-> sharding.MeshConfig) and a top-level `seed`.
"""

from typing import Any

import ml_collections

from lnjax.core import errors, sections


def lm_config() -> ml_collections.ConfigDict:
  """Every key a decoder-only LM run reads, at the values of a small Pre-LN model."""
  from lnjax.data.config import LMDataConfig  # (the data layer, loaded by configs only)

  c = _common("lm")
  c.data = sections.section(LMDataConfig)
  return c


def translation_config() -> ml_collections.ConfigDict:
  """Every key an encoder-decoder translation run reads."""
  from lnjax.data.config import MTDataConfig
  from lnjax.inference.evaluate import DecodeConfig

  c = _common("translation")
  c.model.tie_embeddings = True  # Output projection = the shared embedding (joint vocab).
  c.data = sections.section(MTDataConfig)
  c.decode = sections.section(DecodeConfig)
  return c


def bert_config() -> ml_collections.ConfigDict:
  """Every key a BERT pre-training run reads (task mlm_nsp: masked LM + next sentence)."""
  from lnjax.data.config import MLMDataConfig

  c = _common("mlm_nsp")
  c.model.max_len = 128
  c.model.activation = "gelu"
  c.model.tie_embeddings = True  # BERT's MLM head reads the input embedding (always tied).
  c.model.norm_eps = 1e-12  # BERT's LayerNorm ε.
  c.data = sections.section(MLMDataConfig)
  c.opt.name, c.opt.b2, c.opt.eps = "adamw", 0.999, 1e-6  # BERT's Adam.
  c.opt.weight_decay = 0.01
  c.opt.schedule = "linear"  # Linear decay to 0 at train.num_steps.
  return c


def apply_bert_smoke(c: ml_collections.ConfigDict) -> None:
  """The BERT `smoke` preset: a tiny character-level model, a few steps, seconds on a CPU."""
  c.model.num_layers, c.model.d_model, c.model.num_heads, c.model.d_ff = 2, 32, 2, 64
  c.model.max_len = c.data.seq_len = 32
  c.data.tokenizer = "char"
  c.data.batch_size = 8
  c.data.eval_batches = 2
  c.opt.learning_rate, c.opt.warmup_steps = 3e-3, 0
  c.train.num_steps = 20
  c.train.log_every_steps = 5
  c.train.eval_every_steps = 10
  c.train.checkpoint_every_steps = 10
  c.train.tensorboard = False


def _common(task: str) -> ml_collections.ConfigDict:
  """The sections every task has: model, opt, train, mesh, each at its dataclass's defaults."""
  from lnjax.models import ModelConfig
  from lnjax.core.optim import OptConfig
  from lnjax.core.run import TrainConfig
  from lnjax.core.sharding import MeshConfig

  c = ml_collections.ConfigDict()
  c.task = task  # lm | translation | mlm | mlm_nsp
  c.seed = 0  # Parameters, dropout and data order all derive from it.
  c.model = sections.section(ModelConfig)
  c.opt = sections.section(OptConfig)
  c.train = sections.section(TrainConfig)
  c.mesh = sections.section(MeshConfig)
  return c


def apply_smoke(c: ml_collections.ConfigDict) -> None:
  """The `smoke` preset every config offers: a few steps of a tiny model, seconds on a CPU."""
  c.model.num_layers, c.model.d_model, c.model.num_heads, c.model.d_ff = 2, 32, 2, 64
  c.model.max_len = c.data.seq_len = 32
  c.data.batch_size = 8
  c.data.eval_batches = 2
  c.data.tokenizer = "char"
  c.train.num_steps = 20
  c.opt.warmup_steps = min(c.opt.warmup_steps, c.train.num_steps)
  c.train.log_every_steps = 5
  c.train.eval_every_steps = 10
  c.train.checkpoint_every_steps = 10
  c.train.tensorboard = False


def apply_translation_smoke(c: ml_collections.ConfigDict) -> None:
  """The translation `smoke` preset: a tiny model, a small vocabulary, a few steps."""
  c.model.num_layers, c.model.d_model, c.model.num_heads, c.model.d_ff = 1, 32, 2, 64
  c.data.vocab_size = 500
  c.data.max_tokens = 1024
  c.data.max_len = 64
  c.data.buckets_per_octave = 1  # 8, 16, 32, 64: 3-4 shapes to compile, not 10.
  c.decode.beam_size = 2
  c.decode.max_extra_len = 10
  c.train.num_steps = 20
  c.opt.warmup_steps = min(c.opt.warmup_steps, c.train.num_steps)
  c.train.log_every_steps = 5
  c.train.eval_every_steps = 20
  c.train.checkpoint_every_steps = 10
  c.train.tensorboard = False


def apply_paper_translation_schedule(c: ml_collections.ConfigDict, norm: str, *,
                                     post_warmup: int) -> None:
  """Xiong et al. §4 (IWSLT14): Pre-LN without warm-up, lr ×0.1 at epoch 8; Post-LN with
  `post_warmup` linear warm-up steps, then inverse square root."""
  c.model.norm_position = norm
  if norm == "pre":
    c.opt.schedule, c.opt.warmup_steps = "step", 0
    c.opt.decay_epochs, c.opt.decay_factor = (8,), 0.1
  else:
    c.opt.schedule, c.opt.warmup_steps = "inverse_sqrt", post_warmup


def parse_arg(arg: str | None, **choices: tuple | None) -> dict[str, Any]:
  """Parses a config argument 'norm=post,size=small,smoke' into {'norm': 'post', ...}.

  `choices` maps each preset name to its valid values, or to None for a bare switch.
  """
  presets = {}
  for item in filter(None, (arg or "").split(",")):
    name, _, value = item.partition("=")
    if name not in choices:
      raise errors.ConfigError(
          f"config argument {item!r}: unknown preset {name!r}; valid: {', '.join(choices)}")
    if name in presets:
      raise errors.ConfigError(f"config argument {arg!r}: preset {name!r} given twice")
    valid = choices[name]
    if valid is None:
      if value:
        raise errors.ConfigError(f"config argument {item!r}: {name!r} takes no value")
      presets[name] = True
    elif value not in valid:
      raise errors.ConfigError(
          f"config argument {item!r}: {name} must be one of: {', '.join(valid)}")
    else:
      presets[name] = value
  return presets


def refuse_smoke_with_size(arg: str | None, presets: dict[str, Any]) -> None:
  """`smoke` sets the model's size itself: a `size=` beside it would be dropped silently."""
  if "smoke" in presets and presets.get("size", "smoke") != "smoke":
    raise errors.ConfigError(f"config argument {arg!r}: smoke sets its own tiny model; "
                             f"give smoke or size={presets['size']}, not both")


# (configs and tests name these through config_lib.)
section = sections.section
from_config = sections.from_config
