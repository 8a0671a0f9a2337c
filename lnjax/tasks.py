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
from lnjax import errors
from lnjax.models import ModelConfig, TransformerLM


@dataclasses.dataclass(frozen=True)
class Task:
  name: str
  data_config: type  # The dataclass `config.data` maps onto.
  make_model: Callable[[ModelConfig], nn.Module]
  example_inputs: Callable[[], tuple]  # Arguments of model.init (shapes only matter).
  model_inputs: Callable[[dict], tuple]  # A batch -> the model's positional arguments.
  make_data: Callable[..., Any]  # (data_cfg, seed, process_index, process_count) -> data


LANGUAGE_MODELING = Task(
    name="lm",
    data_config=data_lib.LMDataConfig,
    make_model=TransformerLM,
    example_inputs=lambda: (jnp.zeros((1, 8), jnp.int32),),
    model_inputs=lambda batch: (batch["inputs"],),
    make_data=data_lib.make_lm_data,
)

TASKS = {t.name: t for t in (LANGUAGE_MODELING,)}


def get(name: str) -> Task:
  errors.check_choice("task", name, tuple(TASKS))
  return TASKS[name]


