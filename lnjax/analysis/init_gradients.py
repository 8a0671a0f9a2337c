"""Gradient norms at initialization on real batches (Xiong et al. 2020, arXiv 2002.04745,
§3.3 and Fig. 3): the models the paper's Fig. 3 measures, and a Measurer of many
initializations of one model shape.

  m = Measurer(make_config("translation", "post"))
  norms = m.grad_norms(m.init(seed))        # {'decoder/layer_5/ffn/wo/kernel': ‖∂L/∂W‖_F, ...}
  m2 = Measurer(make_config("translation", "pre"), data=m.data)   # the same data and batches

experiments/fig3_init_gradients.py and fig3_magnitudes.py use them.
"""

import importlib

import ml_collections
import numpy as np

from lnjax import tasks
from lnjax.core import build as build_lib
from lnjax.core import state as state_lib


def make_config(model: str, norm: str, total_layers: int | None = None, *,
                smoke: bool = False, batch_tokens: int = 2048) -> ml_collections.ConfigDict:
  """The measured model's config: `translation` the paper's IWSLT shape (6+6 layers,
  d_model 512, FFN 1024, 4 heads) on Multi30k, batches of `batch_tokens` target tokens;
  `lm` the course LM (configs/lm.py:size=course). Dropout off (it is measured
  deterministically anyway), a constant schedule (a warm-up run sets its own).
  `total_layers`: the depth (translation: half encoder, half decoder)."""
  suffix = ",smoke" if smoke else ""
  if model == "translation":
    c = _shipped("multi30k_de_en").get_config(f"norm={norm}{suffix}")
    with c.unlocked():
      if not smoke:
        c.model.num_layers, c.model.d_model, c.model.num_heads, c.model.d_ff = 6, 512, 4, 1024
        c.data.max_tokens = batch_tokens
      if total_layers:
        c.model.num_layers = total_layers // 2
      c.decode.bleu_in_training = False
  else:
    c = _shipped("lm").get_config(f"norm={norm},size=course{suffix}")
    with c.unlocked():
      if total_layers:
        c.model.num_layers = total_layers
  with c.unlocked():
    c.model.norm_position = norm
    c.model.dropout_rate = 0.0
    c.opt.schedule, c.opt.warmup_steps, c.opt.decay_epochs = "constant", 0, ()
    c.train.tensorboard = False
  return c


def _shipped(name: str):
  return importlib.import_module(f"lnjax.configs.{name}")


class Measurer:
  """Gradient norms of many initializations of one model shape on `num_batches` fixed
  held-out batches, spread over the split's length buckets."""

  def __init__(self, config: ml_collections.ConfigDict, data=None, num_batches: int = 2):
    """`data`: the data of an earlier Measurer (or build) of the same data section."""
    import flax.linen as nn
    import jax

    from lnjax import models
    from lnjax.analysis import probes

    b = build_lib.build(config, build_lib.one_device_mesh(), tasks=tasks.get, whole_data=True,
                        data=data)
    self.data, self.run, self.setup = b.data, b.run, b.setup
    every = b.eval_batches() if num_batches else []
    picks = (len(every) - 1) * (0.5 + np.arange(num_batches)) / max(num_batches, 1)
    self.batches = [every[int(i)] for i in picks]
    setup = self.setup
    # The run's own initialization (models.init_params: Admin's profiling pass included),
    # compiled once for all seeds.
    example, random = state_lib.init_inputs(setup)
    self._init = jax.jit(lambda key: nn.unbox(models.init_params(
        setup.model, key, *example, random_inputs=random)))
    self._grad = jax.jit(jax.grad(lambda p, bs: probes.mean_loss(p, setup, bs)))
    self._probes = probes

  def init(self, seed: int):
    import jax
    return self._init(jax.random.key(seed))

  def grad_norms(self, params) -> dict:
    return self._probes.gradient_norms(self._grad(params, self.batches))
