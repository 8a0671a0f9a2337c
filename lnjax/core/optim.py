"""Learning-rate schedules and optimizers, composed from optax pieces.

`config.opt` maps onto `OptConfig`; `make_schedule` is the one place a schedule string
becomes a `step -> lr` function, and `make_optimizer` the one place an optimizer string
becomes an optax chain. Step t counts optimizer updates from 0, as optax does, so the
first update uses lr(0).

Warm-up (Xiong et al. 2020, §2): lr(t) = t / T_warmup · lr_max for t <= T_warmup, then
the named decay; `warmup_steps=0` means no warm-up.
"""

import dataclasses
from typing import Callable

import jax
import jax.numpy as jnp
import optax

from lnjax.core import errors

SCHEDULES = ("constant", "inverse_sqrt", "linear", "step", "cosine", "exponential")
OPTIMIZERS = ("adam", "adamw", "sgd", "radam")


@dataclasses.dataclass(frozen=True)
class OptConfig:
  name: str = "adam"  # adam | adamw | sgd | radam
  learning_rate: float = 1e-3  # Peak learning rate (after warm-up).
  schedule: str = "constant"  # constant | inverse_sqrt | linear | step | cosine | exponential
  warmup_steps: int = 0  # Linear warm-up from 0; 0 = none.
  end_learning_rate: float = 0.0  # Where `linear` and `cosine` end at train.num_steps.
  decay_factor: float = 0.1  # `step`: lr ×= decay_factor at each boundary; `exponential`: every step.
  decay_steps: tuple[int, ...] = ()  # `step`: boundaries in steps (`inverse_sqrt`: hold lr until the first) ...
  decay_epochs: tuple[float, ...] = ()  # ... or in epochs (resolved with steps per epoch).
  b1: float = 0.9  # Adam's β₁.
  b2: float = 0.98  # Adam's β₂: the paper's (fairseq's) for translation.
  eps: float = 1e-8  # Adam's ε.
  weight_decay: float = 0.0  # adamw only (decoupled).
  momentum: float = 0.9  # sgd only; 0 = plain SGD.
  nesterov: bool = False  # sgd only.
  grad_clip_norm: float = 0.0  # Global-norm clipping threshold; 0 = off (the default).

  def __post_init__(self):
    for key in ("decay_steps", "decay_epochs"):  # (None or a bare number: one line.)
      if not isinstance(getattr(self, key), (list, tuple)):
        raise errors.ConfigError(f"opt.{key}={getattr(self, key)!r} must be a tuple of numbers")
      object.__setattr__(self, key, tuple(getattr(self, key)))
    errors.check_choice("opt.name", self.name, OPTIMIZERS)
    errors.check_choice("opt.schedule", self.schedule, SCHEDULES)
    errors.check_range("opt.learning_rate", self.learning_rate, low=0.0, low_open=True)
    errors.check_range("opt.end_learning_rate", self.end_learning_rate, low=0.0)
    if isinstance(self.warmup_steps, bool) or not isinstance(self.warmup_steps, int):
      raise errors.ConfigError(f"opt.warmup_steps={self.warmup_steps!r} must be an integer >= 0")
    errors.check_range("opt.warmup_steps", self.warmup_steps, low=0)
    errors.check_range("opt.decay_factor", self.decay_factor, low=0.0, low_open=True)
    for b in self.decay_steps:
      errors.check_int("opt.decay_steps", b, 1)
    for b in self.decay_epochs:
      errors.check_range("opt.decay_epochs", b, low=0, low_open=True)
    if self.decay_steps and self.decay_epochs:
      raise errors.ConfigError("opt.decay_steps and opt.decay_epochs are both set: give one")
    if self.schedule == "step" and not (self.decay_steps or self.decay_epochs):
      raise errors.ConfigError("opt.schedule='step' needs opt.decay_steps or opt.decay_epochs")
    errors.check_range("opt.b1", self.b1, low=0.0, high=1.0, high_open=True)
    errors.check_range("opt.b2", self.b2, low=0.0, high=1.0, high_open=True)
    errors.check_range("opt.eps", self.eps, low=0.0)
    errors.check_range("opt.weight_decay", self.weight_decay, low=0.0)
    errors.check_range("opt.momentum", self.momentum, low=0.0, high=1.0, high_open=True)
    errors.check_range("opt.grad_clip_norm", self.grad_clip_norm, low=0.0)


def decay_boundaries(cfg: OptConfig, steps_per_epoch: int | None) -> list[int]:
  """`step` schedule boundaries in steps: the one place epochs become steps."""
  if cfg.decay_epochs:
    if not steps_per_epoch:
      raise errors.ConfigError("opt.decay_epochs needs a dataset with a known epoch length")
    return [int(round(e * steps_per_epoch)) for e in cfg.decay_epochs]
  return [int(b) for b in cfg.decay_steps]


def make_schedule(cfg: OptConfig, num_steps: int,
                  steps_per_epoch: int | None = None) -> optax.Schedule:
  """The learning rate at each optimizer step, warm-up included."""
  peak, w = cfg.learning_rate, cfg.warmup_steps
  after_w = max(num_steps - w, 1)  # Length of the phase after warm-up.
  if cfg.schedule == "constant":
    decay = optax.constant_schedule(peak)
  elif cfg.schedule == "inverse_sqrt":
    # Vaswani et al. / fairseq: lr = lr_max · √(T_warmup / t) after warm-up (t >= T_warmup).
    # join_schedules hands the decay s = t - T_warmup; with no warm-up the reference is 1
    # step, i.e. lr = lr_max / √(t + 1). A decay boundary T_d (opt.decay_steps/epochs)
    # holds lr_max until T_d, then lr_max · √(T_d / t): the paper's WMT14 Pre-LN schedule.
    ref = max(w, 1)
    hold = max([ref] + decay_boundaries(cfg, steps_per_epoch)[:1])
    decay = lambda s: peak * jnp.sqrt(hold / jnp.maximum(s + ref, hold).astype(jnp.float32))
  elif cfg.schedule == "linear":
    # BERT: linear warm-up, then linear decay to end_learning_rate at num_steps.
    decay = optax.linear_schedule(peak, cfg.end_learning_rate, after_w)
  elif cfg.schedule == "step":
    # ×γ at each boundary (the paper's Pre-LN schedule: ×0.1 at epoch 8); boundaries
    # are absolute steps, shifted because the decay starts counting after warm-up.
    bounds = decay_boundaries(cfg, steps_per_epoch)
    decay = optax.piecewise_constant_schedule(
        peak, {max(b - w, 0): cfg.decay_factor for b in sorted(set(bounds))})
  elif cfg.schedule == "cosine":
    decay = optax.cosine_decay_schedule(peak, after_w, alpha=cfg.end_learning_rate / peak)
  elif cfg.schedule == "exponential":
    # lr(t) = learning_rate · γ^t after warm-up; with γ > 1 the learning-rate range test
    # (Smith, arXiv:1506.01186; fastai's lr_find): the rate grows geometrically
    # (lnjax/sweep/stability.py).
    decay = optax.exponential_decay(peak, transition_steps=1, decay_rate=cfg.decay_factor)
  else:
    raise errors.ConfigError(
        f"opt.schedule={cfg.schedule!r} is not one of: {', '.join(SCHEDULES)}")
  if w == 0:
    return decay
  warmup = optax.linear_schedule(0.0, peak, w)  # lr(t) = t / T_warmup · lr_max
  return optax.join_schedules([warmup, decay], [w])


def keep_params_on_unit_sphere(
    unit_axis: Callable[[tuple[str, ...]], int | None]) -> optax.GradientTransformation:
  """Modifies the updates so that each parameter for which `unit_axis(its path's keys)`
  names an axis ends every step with unit norm along it: u ← (p + u)/‖p + u‖ − p, the
  manner of optax.keep_params_nonnegative; last in a chain. nGPT's renormalization of its
  matrices after each optimizer step (Loshchilov et al. 2024, arXiv 2410.01131;
  NVIDIA/ngpt's normalize_matrices)."""

  def init_fn(params):
    del params
    return optax.EmptyState()

  def update_fn(updates, state, params=None):
    if params is None:
      raise ValueError("keep_params_on_unit_sphere needs the parameters: tx.update(g, s, params)")

    def project(path, u, p):
      axis = unit_axis(tuple(k.key for k in path))
      if axis is None:
        return u
      new = p + u
      return new / jnp.linalg.norm(new, axis=axis, keepdims=True) - p

    return jax.tree_util.tree_map_with_path(project, updates, params), state

  return optax.GradientTransformation(init_fn, update_fn)


def make_optimizer(cfg: OptConfig, schedule: optax.Schedule,
                   unit_axis: Callable | None = None) -> optax.GradientTransformation:
  """The optimizer as an optax chain: [global-norm clipping] -> update rule with lr(t) ->
  [the parameters `unit_axis` names kept on the unit sphere (nGPT's, from
  models.placement.unit_sphere_axis)]."""
  if cfg.name == "adam":
    rule = optax.adam(schedule, b1=cfg.b1, b2=cfg.b2, eps=cfg.eps)
  elif cfg.name == "adamw":
    rule = optax.adamw(schedule, b1=cfg.b1, b2=cfg.b2, eps=cfg.eps, weight_decay=cfg.weight_decay)
  elif cfg.name == "sgd":
    rule = optax.sgd(schedule, momentum=cfg.momentum or None, nesterov=cfg.nesterov)
  elif cfg.name == "radam":
    rule = optax.radam(schedule, b1=cfg.b1, b2=cfg.b2, eps=cfg.eps)
  else:
    raise errors.ConfigError(f"opt.name={cfg.name!r} is not one of: {', '.join(OPTIMIZERS)}")
  if unit_axis is not None:
    if cfg.weight_decay:  # nGPT trains without: its matrices are renormalized each step.
      raise errors.ConfigError(f"opt.weight_decay={cfg.weight_decay} with "
                               "model.norm_position='ngpt', which has no weight decay: set 0")
    rule = optax.chain(rule, keep_params_on_unit_sphere(unit_axis))
  if cfg.grad_clip_norm > 0:
    return optax.chain(optax.clip_by_global_norm(cfg.grad_clip_norm), rule)
  return rule


__all__ = ["OptConfig", "make_schedule", "make_optimizer", "SCHEDULES",
           "OPTIMIZERS", "decay_boundaries", "keep_params_on_unit_sphere"]
