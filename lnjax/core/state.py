"""The training state and how it is built and placed: used by training, restore and analysis."""

import dataclasses
import functools
from typing import Any

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
import optax
from jax.sharding import Mesh

from lnjax.core import optim, sharding
from lnjax.models import ModelConfig, init_params, placement
from lnjax.core.task import Task


@flax.struct.dataclass
class TrainState:
  step: jax.Array  # Optimizer updates done; also the schedule's and dropout's clock.
  params: Any
  opt_state: Any


@dataclasses.dataclass(frozen=True)
class Setup:
  """Everything static a run's steps need: the task, model, optimizer and schedule."""

  task: Task
  model: nn.Module
  tx: optax.GradientTransformation
  schedule: optax.Schedule

  @functools.cached_property
  def boxed_shapes(self) -> TrainState:
    """The state's ShapeDtypeStructs, still boxed with the parameters' logical axis names:
    the model's init traced once per setup for the shardings and the restore target (it
    was traced again for each)."""
    return jax.eval_shape(lambda: _init_boxed(self, jax.random.key(0)))


def make_setup(model_cfg: ModelConfig, opt_cfg: optim.OptConfig, num_steps: int,
               steps_per_epoch: int | None = None, *, task: Task) -> Setup:
  schedule = optim.make_schedule(opt_cfg, num_steps, steps_per_epoch)
  tx = optim.make_optimizer(opt_cfg, schedule, placement.unit_sphere_axis(model_cfg))
  return Setup(task, task.make_model(model_cfg), tx, schedule)


EXAMPLE_LEN = 8  # Positions of model.init's inputs; no parameter's shape depends on it.


def init_inputs(setup: Setup) -> tuple[tuple, Any]:
  """(example inputs, random inputs) of models.init_params for `setup`'s model: EXAMPLE_LEN
  positions, or model.max_len when shorter (such a model refuses a longer input)."""
  t = min(EXAMPLE_LEN, setup.model.cfg.max_len)
  random = setup.task.random_inputs
  return setup.task.example_inputs(t), random and (lambda key, vocab: random(key, vocab, t))


def _init_boxed(setup: Setup, key: jax.Array) -> TrainState:
  """Parameters still boxed with their logical axis names (nn.Partitioned)."""
  example, random = init_inputs(setup)
  params = init_params(setup.model, key, *example, random_inputs=random)
  return TrainState(step=jnp.zeros((), jnp.int32), params=params,
                    opt_state=setup.tx.init(params))


def state_shardings(setup: Setup, mesh: Mesh):
  """NamedShardings of every TrainState leaf, from the parameters' logical axis names."""
  abstract = setup.boxed_shapes
  return sharding.logical_shardings(nn.get_partition_spec(abstract), nn.unbox(abstract), mesh)


def init_state(setup: Setup, mesh: Mesh, seed: int) -> TrainState:
  """A fresh state, created directly in its sharded layout. The seed's key is the program's
  argument, not a constant in it: through a persistent compilation cache
  (train.compilation_cache_dir) every seed of a setup reads one compiled init (seeds 0 and 1
  of the smoke LM: one cache entry)."""
  shardings = state_shardings(setup, mesh)
  init = jax.jit(lambda key: nn.unbox(_init_boxed(setup, key)), out_shardings=shardings)
  return init(jax.random.key(seed))


def abstract_state(setup: Setup, mesh: Mesh) -> TrainState:
  """ShapeDtypeStructs with shardings: the target a checkpoint is restored onto."""
  shapes = nn.unbox(setup.boxed_shapes)
  return jax.tree.map(lambda s, sh: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh),
                      shapes, state_shardings(setup, mesh))
