"""Language modeling: a decoder-only Transformer on packed token windows."""

import jax
import jax.numpy as jnp

from lnjax import data as data_lib
from lnjax.models import TransformerLM
from lnjax.core.task import Task


def make_data(cfg: data_lib.LMDataConfig, seed: int, process_index: int, process_count: int,
              batch_multiple: int) -> data_lib.LMData:
  del batch_multiple  # Windows are all one shape: any global batch divides evenly.
  return data_lib.make_lm_data(cfg, seed, process_index, process_count)


LANGUAGE_MODELING = Task(
    name="lm",
    data_config=data_lib.LMDataConfig,
    make_model=TransformerLM,
    example_inputs=lambda t=8: (jnp.zeros((1, t), jnp.int32),),
    model_inputs=lambda batch: (batch["inputs"],),
    random_inputs=lambda key, vocab, t=8: (jax.random.randint(key, (32, t), 1, vocab),),
    make_data=make_data,
)

TASKS = (LANGUAGE_MODELING,)
