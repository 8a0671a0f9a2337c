"""A run's config, resolved: each section of the ConfigDict mapped onto its dataclass.

`resolve_config` is called before any compute, so a bad key or value ends the run with
one line (errors.ConfigError) and nothing written. The task named by `config.task` comes
from the lookup the caller hands in (`tasks=lnjax.tasks.get` at the entry points): the core
names no task registry or plug-in.
"""

import dataclasses
from typing import Callable

import ml_collections

from lnjax.core import errors, sections
from lnjax.models import ModelConfig
from lnjax.core.optim import OptConfig
from lnjax.core.sharding import MeshConfig
from lnjax.core.task import Task


DROPOUT_RNGS = ("threefry2x32", "rbg", "unsafe_rbg")  # jax.random.key's implementations.


@dataclasses.dataclass(frozen=True)
class TrainConfig:
  num_steps: int = 2000  # Optimizer steps in the whole run.
  label_smoothing: float = 0.0  # ε of label smoothing (the reported loss is the plain NLL).
  dropout_rng: str = "threefry2x32"  # Dropout masks' generator: threefry2x32 (jax's
  # default) | rbg | unsafe_rbg: XLA's RngBitGenerator, as T5X and MaxText use on TPUs
  # (BENCHMARKS.md: libtpu compiled a 4-chip step with dropout in 38 s instead of 84 s).
  log_every_steps: int = 50  # Console line and train_* metrics.
  eval_every_steps: int = 500  # Held-out evaluation (also at the last step).
  checkpoint_every_steps: int = 500  # Orbax checkpoint (also at the last step).
  keep_checkpoints: int = 3  # The most recent ones kept.
  tensorboard: bool = True  # Mirror metrics to TensorBoard event files.
  log_grad_norms: bool = False  # Log ‖∂L/∂W‖ of every weight (grad_norm/<path>), averaged
  # over each log_every_steps window like the other train metrics.
  divergence_factor: float = 1e4  # The run ends as diverged when a train loss is NaN/Inf or
  # above this × ln V (the uniform guess's loss, about the initial one); 0 = NaN/Inf only.
  compilation_cache_dir: str = ""  # JAX's persistent compilation cache (local or gs://):
  # a relaunch, or another run of the same shapes, skips compilation. "" = off.
  profile_steps: str = ""  # "START,END": a jax.profiler trace of steps START..END into
  # <workdir>/profile (TensorBoard's profile plugin). "" = off.
  wandb_project: str = ""  # Weights & Biases project receiving the same scalars and the
  # config (WANDB_MODE=offline: files under <workdir>/wandb/ for `wandb sync`). "" = off.
  health: str = "warn"  # off | log: per-layer health/ statistics at log steps
  # (lnjax/core/health.py) | warn: also the early warning, a line and a metrics record when
  # a layer's update RMS (per unit of learning rate) jumps 3× above its 100-step median.
  on_instability: str = "none"  # none | skip: no update when the loss or grad norm is 6σ
  # above its trailing 128 steps | rollback: on a warning or such a spike, back to the
  # newest checkpoint >= rollback_steps old, then past rollback_skip_batches batches.
  rollback_steps: int = 0  # K; 0 = PaLM's 100 (it restarted ~100 steps before a spike),
  # or num_steps // 20 in a run shorter than 2000 steps (at least 1): see rollback().
  rollback_skip_batches: int = -1  # B: batches dropped after a rollback; -1 = 2K, within
  # the run (PaLM skipped 200-500).
  rollback_lr_factor: float = 1.0  # The learning rate ×= this at each rollback (1 = kept).
  max_rollbacks: int = 3  # R: rollbacks per run; later spikes run their course.
  inject_fault: str = ""  # Tests of recovery only: "garbage:STEP:N" (N batches of random
  # tokens from STEP) or "lr_spike:STEP:N:FACTOR" (lr ×FACTOR for N steps); fires once.

  def __post_init__(self):
    for key in ("num_steps", "log_every_steps", "eval_every_steps", "checkpoint_every_steps",
                "keep_checkpoints"):
      errors.check_int(f"train.{key}", getattr(self, key), 1)
    errors.check_range("train.label_smoothing", self.label_smoothing, low=0.0, high=1.0,
                       high_open=True)
    errors.check_range("train.divergence_factor", self.divergence_factor, low=0.0)
    errors.check_choice("train.health", self.health, ("off", "log", "warn"))
    errors.check_choice("train.dropout_rng", self.dropout_rng, DROPOUT_RNGS)
    errors.check_choice("train.on_instability", self.on_instability,
                        ("none", "skip", "rollback"))
    errors.check_int("train.rollback_steps", self.rollback_steps, 0)
    errors.check_int("train.rollback_skip_batches", self.rollback_skip_batches, -1)
    beyond = [f"train.{key}={value}" for key, value in zip(
        ("rollback_steps", "rollback_skip_batches"), self.rollback()) if value > self.num_steps]
    if self.on_instability == "rollback" and beyond:  # (One line naming every key.)
      raise errors.ConfigError(
          f"{' and '.join(beyond)} exceed{'s' if len(beyond) == 1 else ''} train.num_steps="
          f"{self.num_steps}: set them within the run, or leave them at their defaults "
          "(0 and -1: derived from the run's length)")
    errors.check_range("train.rollback_lr_factor", self.rollback_lr_factor, low=0.0, high=1.0,
                       low_open=True)
    errors.check_int("train.max_rollbacks", self.max_rollbacks, 1)
    self.fault()  # Refuses a malformed one now.
    self.profile_range()  # Refuses a malformed one now, before any compute.

  def rollback(self, num_steps: int | None = None) -> tuple[int, int]:
    """(K, B): rollback_steps and rollback_skip_batches, their defaults resolved for a run
    of `num_steps` (default: this one's): K = min(100, num_steps // 20), at least 1 (the
    20-step smoke run rolls back 1 step or more, a 2000-step run 100 as PaLM, arXiv
    2204.02311, §5.1); B = 2K, within the run."""
    num_steps = num_steps or self.num_steps
    k = self.rollback_steps or min(100, max(1, num_steps // 20))
    b = self.rollback_skip_batches
    return k, (min(2 * k, num_steps) if b == -1 else b)

  def fault(self) -> tuple[str, int, int, float] | None:
    """train.inject_fault as (kind, first step, steps, lr factor); None if unset."""
    if not self.inject_fault:
      return None
    parts = str(self.inject_fault).split(":")
    try:
      kind, step, n = parts[0], int(parts[1]), int(parts[2])
      factor = float(parts[3]) if kind == "lr_spike" else 1.0
      ok = (kind, len(parts)) in (("garbage", 3), ("lr_spike", 4)) and step >= 1 and n >= 1
    except (ValueError, IndexError):
      ok = False
    if not ok:
      raise errors.ConfigError(f"train.inject_fault={self.inject_fault!r} must be "
                               "'garbage:STEP:N' or 'lr_spike:STEP:N:FACTOR' (STEP, N >= 1)")
    return kind, step, n, factor

  def profile_range(self) -> tuple[int, int] | None:
    """train.profile_steps as (first, last) step, both included; None if unset."""
    if not self.profile_steps:
      return None
    parts = str(self.profile_steps).split(",")
    try:
      first, last = (int(p) for p in parts)
    except ValueError:
      first = last = 0
    if len(parts) != 2 or not 1 <= first <= last:
      raise errors.ConfigError(f"train.profile_steps={self.profile_steps!r} must be "
                               "'START,END' with 1 <= START <= END")
    return first, last


@dataclasses.dataclass(frozen=True)
class RunConfig:
  task: Task
  model: ModelConfig
  opt: OptConfig
  data: object  # The task's data config (data.LMDataConfig, data.MTDataConfig).
  train: TrainConfig
  mesh: MeshConfig
  seed: int
  extra: dict = dataclasses.field(default_factory=dict)  # The task's own sections.

  def section(self, cls):
    """The task's own config section of dataclass `cls` (e.g. evaluate.DecodeConfig)."""
    found = [v for v in self.extra.values() if isinstance(v, cls)]
    if len(found) != 1:
      raise errors.ConfigError(f"the run's task {self.task.name} has no {cls.__name__} section")
    return found[0]


SECTIONS = {"model": ModelConfig, "opt": OptConfig, "data": None,
            "train": TrainConfig, "mesh": MeshConfig}
TOP_LEVEL = ("seed", "task")
MAX_SEED = errors.INT64_MAX  # jax.random.key takes an int64.
TaskLookup = Callable[[str], Task]  # A task's name -> the Task (lnjax.tasks.get), refusing
# an unknown name with one line.


def resolve_config(config: ml_collections.ConfigDict, *, tasks: TaskLookup) -> RunConfig:
  """ConfigDict -> RunConfig, refusing unknown keys and invalid values with one line;
  `tasks` gives the Task that `config.task` names."""
  task = tasks(config.get("task", "lm"))
  valid = {*SECTIONS, *TOP_LEVEL, *task.sections}
  unknown = set(config.keys()) - valid
  owned = sorted(unknown & set(task.command_sections))
  if owned:  # A section of another command's config: the task's line names the command.
    raise errors.ConfigError(task.command_sections[owned[0]])
  if unknown:
    raise errors.ConfigError(f"unknown config key {sorted(unknown)[0]}; valid top-level keys: "
                             f"{', '.join(sorted(valid))}")
  for section in [*SECTIONS, *task.sections]:
    if section not in config:
      raise errors.ConfigError(f"config has no section {section!r}")
  seed = config.get("seed", 0)
  errors.check_int("seed", seed, 0, MAX_SEED)
  parts = {name: sections.from_config(cls or task.data_config, name, config[name].to_dict())
           for name, cls in SECTIONS.items()}
  extra = {name: sections.from_config(cls, name, config[name].to_dict())
           for name, cls in task.sections.items()}
  run = RunConfig(task=task, **parts, seed=seed, extra=extra)
  if run.opt.warmup_steps > run.train.num_steps:
    raise errors.ConfigError(
        f"opt.warmup_steps={run.opt.warmup_steps} exceeds train.num_steps="
        f"{run.train.num_steps}: the run would never reach its peak learning rate")
  length = getattr(run.data, "seq_len", None) or getattr(run.data, "max_len", 0)
  if length > run.model.max_len:
    raise errors.ConfigError(f"data's sequence length {length} exceeds "
                             f"model.max_len={run.model.max_len}")
  # What the model derives from the final placement (model.qk_norm=None) and sequence
  # length (model.sliding_window=-1).
  return dataclasses.replace(run, model=run.model.for_placement().for_length(length))
