"""One build step: config -> mesh, data, model, optimizer, state and compiled steps.

Training (lnjax/core/train.py), the tools (analyze, translate, predict) and the experiments get
the same objects from `build(config, tasks=...)`, handed the task registry's lookup
(lnjax.tasks.get; the core names no task):

  b = build.build(config, build.one_device_mesh(), tasks=tasks.get)  # a tool, an experiment
  state = b.init_state()                                  # or a restored one
  state, metrics = b.train_step(state, b.global_batch(next(b.data.train_iter())))
  batches = b.eval_batches(4)                             # held-out, as the model reads them

Order: devices (the mesh), then the data (its vocabulary and epoch length complete the
config), then the model, optimizer and compiled steps; the state last (fresh here, or
restored by the caller onto `abstract_state()`).
"""

import dataclasses
import functools
from typing import Any

import jax
import ml_collections
from jax.sharding import Mesh

from lnjax.core import errors, health, optim, progress as progress_lib, run as run_lib, sharding
from lnjax.core import state as state_lib, steps, task as task_lib


@dataclasses.dataclass
class Built:
  config: ml_collections.ConfigDict  # Completed: model.vocab_size, decay boundaries in steps.
  run: run_lib.RunConfig
  mesh: Mesh
  data: task_lib.DataSource
  setup: state_lib.Setup
  state_sharding: Any
  batch_sharding: Any
  train_step: Any  # jitted (state, batch[, lr_scale=s]) -> (state, metrics); state donated.
  eval_step: Any  # jitted (params, batch) -> (NLL sum, target count).
  activation_step: Any  # jitted (params, batch, step) -> the sown health/ statistics.
  data_seconds: float = 0.0  # Time the data took to prepare (corpus, tokenizer).

  def init_state(self) -> state_lib.TrainState:
    """A fresh state in its sharded layout, then the task's starting point (a pre-trained
    encoder for GLUE; never for a resumed run, which restores instead)."""
    state = state_lib.init_state(self.setup, self.mesh, self.run.seed)
    if self.run.task.init_params is None:
      return state
    params = jax.device_put(self.run.task.init_params(self.setup, state.params, self.run),
                            self.state_sharding.params)
    return state.replace(params=params, opt_state=jax.jit(
        self.setup.tx.init, out_shardings=self.state_sharding.opt_state)(params))

  def abstract_state(self) -> state_lib.TrainState:
    """The target a checkpoint is restored onto (shapes, dtypes, shardings)."""
    return state_lib.abstract_state(self.setup, self.mesh)

  def global_batch(self, local_batch: dict) -> dict:
    return sharding.global_batch(local_batch, self.batch_sharding)

  def eval_batches(self, num: int | None = None) -> list[dict]:
    """The first `num` held-out batches (all: None) as the model reads them, on the host:
    without the `index` key that orders sentences for BLEU."""
    return [{k: v for k, v in b.items() if k != "index"}
            for b in self.data.eval_batches()[:num]]


def one_device_mesh() -> Mesh:
  """The first local device: the tools' and experiments' mesh (a run trained on many
  devices is analysed on one)."""
  return sharding.make_mesh(sharding.MeshConfig(data=1), jax.local_devices()[:1])


def build(config: ml_collections.ConfigDict, mesh: Mesh | None = None, *,
          tasks: run_lib.TaskLookup, whole_data: bool = False, log=None,
          data: task_lib.DataSource | None = None) -> Built:
  """The run `config` describes, on `mesh` (default: the config's mesh over every device).

  `tasks`: the task registry's lookup (lnjax.tasks.get). `whole_data`: every batch of the
  data on this process (a tool, an experiment); else this process's rows of every global
  batch (training on many processes). `log`: a function told how long the data took when
  it took 2 s or more. `data`: the data an earlier build of the same data section
  prepared (an experiment measuring several models on it).
  """
  run = run_lib.resolve_config(config, tasks=tasks)
  mesh = mesh or sharding.make_mesh(run.mesh)
  check_devices(run.model, mesh)
  data, seconds = (data, 0.0) if data is not None else _make_data(run, mesh, whole_data)
  if seconds >= 2 and log is not None:
    log(f"Data ready in {seconds:.1f} s ({run.data.name}: corpus, tokenizer; cached "
        "for the next run).")
  config, run = complete_config(config, run, data)
  setup = run_setup(run, data.steps_per_epoch)
  state_sharding, batch_sharding, train_step, eval_step, activation_step = jit_steps(
      run, setup, mesh)
  return Built(config, run, mesh, data, setup, state_sharding, batch_sharding, train_step,
               eval_step, activation_step, seconds)


def check_devices(model, mesh: Mesh) -> None:
  """Refuses a kernel the mesh's devices cannot run, before any data or compile: cuDNN
  flash attention (model.attention_impl='cudnn') needs NVIDIA GPUs; elsewhere the first
  step failed inside jax ("cuDNN is not detected", a traceback). `lnjax compile` lowers
  for its target's devices and does not build here."""
  platforms = sorted({d.platform for d in mesh.devices.flat})
  if model.attention_impl == "cudnn" and platforms != ["gpu"]:
    raise errors.ConfigError(f"model.attention_impl='cudnn' needs NVIDIA GPUs, not "
                             f"{', '.join(platforms)}: use 'xla' or 'plain' here")


def run_setup(run: run_lib.RunConfig, steps_per_epoch: int | None) -> state_lib.Setup:
  """The task, model, optimizer and schedule of `run` (what its steps close over)."""
  setup = state_lib.make_setup(run.model, run.opt, run.train.num_steps, steps_per_epoch,
                               task=run.task)
  if run.train.on_instability == "skip":  # The 6σ skip-step rule inside the optimizer.
    setup = dataclasses.replace(setup, tx=health.skip_spikes(setup.tx))
  return setup


def jit_steps(run: run_lib.RunConfig, setup: state_lib.Setup, mesh: Mesh):
  """(state sharding, batch sharding, train_step, eval_step, activation_step) on `mesh`:
  the jitted steps every run trains with, and that `lnjax compile` (lnjax/core/plan.py)
  compiles for a TPU slice."""
  batch_sharding = sharding.batch_sharding(mesh)
  state_sharding = state_lib.state_shardings(setup, mesh)

  def on_mesh(step):  # Traced with the models' activations constrained to `mesh`.
    @functools.wraps(step)  # (the program keeps the step's name: jit_train_step)
    def traced(*args, **kwargs):
      with sharding.activations_on(mesh):
        return step(*args, **kwargs)
    return traced

  @functools.cache
  def compiled(lr_scale: float):  # (jit takes no keyword arguments with in_shardings: one
    return jax.jit(functools.partial(  # program per learning-rate scale.)
        on_mesh(steps.train_step), setup=setup, label_smoothing=run.train.label_smoothing,
        seed=run.seed, log_grad_norms=run.train.log_grad_norms,
        health=run.train.health != "off", lr_scale=lr_scale, dropout_rng=run.train.dropout_rng),
        in_shardings=(state_sharding, batch_sharding),
        out_shardings=(state_sharding, sharding.replicated(mesh)), donate_argnums=0)

  def train_step(state, batch, *, lr_scale: float = 1.0):
    return compiled(float(lr_scale))(state, batch)
  train_step.lower = lambda state, batch: compiled(1.0).lower(state, batch)
  eval_step = jax.jit(functools.partial(on_mesh(steps.eval_step), setup=setup),
                      in_shardings=(state_sharding.params, batch_sharding),
                      out_shardings=sharding.replicated(mesh))
  activation_step = jax.jit(functools.partial(
      on_mesh(steps.activation_step), setup=setup, seed=run.seed,
      dropout_rng=run.train.dropout_rng),
      in_shardings=(state_sharding.params, batch_sharding, sharding.replicated(mesh)),
      out_shardings=sharding.replicated(mesh))
  return state_sharding, batch_sharding, train_step, eval_step, activation_step


def _make_data(run: run_lib.RunConfig, mesh: Mesh, whole: bool):
  """(data, seconds it took): batches that split evenly over the mesh's batch axes."""
  batch_shards = mesh.shape["data"] * mesh.shape["fsdp"]
  if getattr(run.data, "batch_size", 0) % batch_shards:
    raise errors.ConfigError(f"data.batch_size={run.data.batch_size} must be divisible by "
                             f"mesh data×fsdp={batch_shards}")
  index, count = (0, 1) if whole else (jax.process_index(), jax.process_count())
  with progress_lib.Phase(f"preparing {run.data.name} (corpus, tokenizer)") as phase:
    data = run.task.make_data(run.data, run.seed, index, count, batch_shards)
  return data, phase.seconds


def complete_config(config: ml_collections.ConfigDict, run: run_lib.RunConfig,
                     data: task_lib.DataSource):
  """The config with what only the data know: the vocabulary size, and decay boundaries
  given in epochs as steps (config.json keeps them so; a resume compares against it)."""
  if run.model.vocab_size not in (0, data.vocab_size):
    raise errors.ConfigError(f"model.vocab_size={run.model.vocab_size} differs from the "
                             f"tokenizer's {data.vocab_size}; leave it 0")
  config = ml_collections.ConfigDict(config.to_dict())  # An unlocked copy to fill in.
  config.model.vocab_size = data.vocab_size
  if run.opt.decay_epochs:
    config.opt.decay_steps = tuple(optim.decay_boundaries(run.opt, data.steps_per_epoch))
    config.opt.decay_epochs = ()
  return config, run_lib.resolve_config(config, tasks=lambda _: run.task)
