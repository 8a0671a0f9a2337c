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


def batch_shapes(cfg: data_lib.LMDataConfig, batch_multiple: int) -> dict:
  """Every batch: B windows of T tokens (lnjax/data/pipeline.py)."""
  del batch_multiple
  B, T = cfg.batch_size, cfg.seq_len
  return {"inputs": ((B, T), jnp.int32), "targets": ((B, T), jnp.int32),
          "weights": ((B, T), jnp.float32)}


LANGUAGE_MODELING = Task(
    name="lm",
    data_config=data_lib.LMDataConfig,
    make_model=TransformerLM,
    example_inputs=lambda t=8: (jnp.zeros((1, t), jnp.int32),),
    model_inputs=lambda batch: (batch["inputs"],),
    random_inputs=lambda key, vocab, t=8: (jax.random.randint(key, (32, t), 1, vocab),),
    make_data=make_data,
    batch_shapes=batch_shapes,
)

TASKS = (LANGUAGE_MODELING,)
