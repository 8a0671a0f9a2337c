"""What differs between a language model and a translation model, in one place.

A task names its data config, builds its model and data, turns a batch into logits, and
may add held-out metrics beyond the loss (BLEU for translation). The training loop,
checkpoints and analysis take a task and know nothing else about it. `config.task`
selects one: 'lm' | 'translation'.
"""

import dataclasses
from typing import Any, Callable

import flax.linen as nn
import jax.numpy as jnp

from lnjax import data as data_lib
from lnjax import errors, evaluate
from lnjax.models import EncoderDecoder, ModelConfig, TransformerLM


@dataclasses.dataclass(frozen=True)
class Task:
  name: str
  data_config: type  # The dataclass `config.data` maps onto.
  make_model: Callable[[ModelConfig], nn.Module]
  example_inputs: Callable[[], tuple]  # Arguments of model.init (shapes only matter).
  model_inputs: Callable[[dict], tuple]  # A batch -> the model's positional arguments.
  make_data: Callable[..., Any]  # (data_cfg, seed, process_index, process_count,
  #                                 batch_multiple) -> data
  sections: dict = dataclasses.field(default_factory=dict)  # Extra config sections.
  # (setup, params, data, run, mesh, step, final) -> extra held-out scalars, e.g. BLEU.
  extra_eval: Callable[..., dict] | None = None
  best_metric: str | None = None  # A scalar of extra_eval to keep the best checkpoint by.


LANGUAGE_MODELING = Task(
    name="lm",
    data_config=data_lib.LMDataConfig,
    make_model=TransformerLM,
    example_inputs=lambda: (jnp.zeros((1, 8), jnp.int32),),
    model_inputs=lambda batch: (batch["inputs"],),
    make_data=lambda cfg, seed, process_index, process_count, batch_multiple:
        data_lib.make_lm_data(cfg, seed, process_index, process_count),
)

def _bleu_eval(setup, params, data, run, mesh, step: int, final: bool) -> dict:
  """BLEU of the decoded bleu split (config.decode), at the steps it asks for."""
  cfg = run.extra["decode"]
  if cfg.bleu_every_steps and step % cfg.bleu_every_steps and not final:
    return {}
  split = cfg.bleu_split or data.cfg.eval_splits[0]
  result = evaluate.score_split(setup, params, data, split, cfg, mesh)
  return {"eval_bleu": result["bleu"],
          "eval_decode_sentences_per_second": result["sentences_per_second"]}


TRANSLATION = Task(
    name="translation",
    data_config=data_lib.MTDataConfig,
    make_model=EncoderDecoder,
    example_inputs=lambda: (jnp.ones((1, 8), jnp.int32), jnp.ones((1, 8), jnp.int32)),
    model_inputs=lambda batch: (batch["inputs"], batch["decoder_inputs"]),
    make_data=data_lib.make_mt_data,
    sections={"decode": evaluate.DecodeConfig},
    extra_eval=_bleu_eval,
    best_metric="eval_bleu",
)

TASKS = {t.name: t for t in (LANGUAGE_MODELING, TRANSLATION)}


def get(name: str) -> Task:
  errors.check_choice("task", name, tuple(TASKS))
  return TASKS[name]


