"""The Task protocol: all the core (state, checkpoints, the training loop, analysis) knows
about a task. The tasks themselves are plug-ins in lnjax/tasks/, loaded by name by the
registry (lnjax.tasks.get), which the entry points hand to the core: the core never
imports it.

A task names the dataclass `config.data` maps onto and any sections of its own, builds
its model and its data, turns a batch into the model's arguments and the model's outputs
into a loss, and may add held-out metrics beyond the loss (BLEU for translation).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Iterator, Protocol

import flax.linen as nn
import jax

from lnjax.core import losses
from lnjax.models import ModelConfig


class DataSource(Protocol):
  """What a task's `make_data` returns (lnjax.data's LMData, MTData, MLMData, ...)."""

  vocab_size: int
  steps_per_epoch: int | None  # Optimizer steps per pass over the train split, if known.
  unigram_entropy: float | None  # Held-out loss of token frequencies alone, if known.

  def train_iter(self) -> Iterator[dict]:
    """Endless train batches; get_state()/set_state() make it resumable."""

  def eval_batches(self) -> list[dict]:
    """The held-out batches, the same every call."""

  # Optional: `train_shapes`, the distinct (rows, length) shapes of the train batches
  # (translation's token-budget buckets), each one compilation of the train step; a
  # source without it has one shape. Read through `num_train_shapes`.


def num_train_shapes(data: DataSource) -> int:
  """How many train-step compilations `data`'s batches need (the progress line says so)."""
  return len(getattr(data, "train_shapes", ())) or 1


@dataclasses.dataclass(frozen=True)
class EvalContext:
  """What an evaluator sees at an evaluation."""

  setup: Any  # lnjax.core.state.Setup: the task, model, optimizer.
  params: Any
  data: DataSource
  run: Any  # lnjax.core.run.RunConfig.
  mesh: jax.sharding.Mesh
  step: int
  final: bool  # The run's last evaluation.

  def section(self, cls):
    """The run's config section of dataclass `cls` (a task's own, e.g. DecodeConfig)."""
    return self.run.section(cls)


Evaluator = Callable[[EvalContext], dict]  # -> held-out scalars, e.g. {"eval_bleu": ...}


@dataclasses.dataclass(frozen=True)
class Task:
  name: str
  data_config: type  # The dataclass `config.data` maps onto.
  make_model: Callable[[ModelConfig], nn.Module]
  # (length T) -> arguments of model.init, T positions long (shapes only matter; the core
  # asks for min(8, model.max_len): state.init_inputs).
  example_inputs: Callable[[int], tuple]
  model_inputs: Callable[[dict], tuple]  # A batch -> the model's positional arguments.
  # (data config, seed, process index, process count, batch multiple) -> DataSource.
  make_data: Callable[[Any, int, int, int, int], DataSource]
  sections: dict = dataclasses.field(default_factory=dict)  # Extra config sections.
  evaluators: tuple[Evaluator, ...] = ()  # Held-out metrics beyond the loss.
  best_metric: str | None = None  # A scalar of the evaluators to keep the best checkpoint by.
  # (model outputs, batch, label_smoothing) -> (objective sum, NLL sum, count): the step
  # minimizes objective sum / count and reports NLL sum / count as the loss.
  loss: Callable[..., tuple] = losses.token_cross_entropy
  # (key, vocab_size, length T) -> a batch of random model inputs for a data-dependent init
  # (Admin's profiling pass, models.init_params); None: the example inputs.
  random_inputs: Callable[[jax.Array, int, int], tuple] | None = None
  # (setup, fresh params, run) -> the params a new run starts from (GLUE: the encoder of a
  # pre-training run); applied once before step 0, never on resume. None: the fresh ones.
  init_params: Callable[[Any, Any, Any], Any] | None = None
  # (data config, batch multiple) -> {key: (shape, dtype)} of the largest global train
  # batch, known from the config alone: what `lnjax compile` (lnjax/core/plan.py) compiles
  # the steps for without reading a corpus. None: the task cannot say (no plan).
  batch_shapes: Callable[[Any, int], dict] | None = None
  # {section: one line}: sections that this task's configs hold for a command other than
  # training (glue's finetune, lnjax finetune's); resolving such a config for a run refuses
  # it with the line, which names that command.
  command_sections: dict = dataclasses.field(default_factory=dict)
