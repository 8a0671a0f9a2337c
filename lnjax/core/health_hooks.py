"""The stability instrument's hooks on the training loop (lnjax/core/hooks.py's interface):
`Health` records the per-layer statistics and runs the early warning, `Recovery` acts on
instabilities (train.on_instability), `FaultInjection` makes them on purpose (tests).
The statistics themselves and the rules are lnjax/core/health.py's."""

import numpy as np

from lnjax.core import health as health_lib
from lnjax.core.hooks import Action, Hook, periodic


class Health(Hook):
  """Takes the health/ scalars out of each step's metrics (so the window means of the
  train_* record do not average them): writes them as one record at each log step (the
  values of that step, the sown activations with them), and with `warn` feeds every step to
  `health.EarlyWarning` (spikes) and `health.VanishingGradient` (lower layers that stopped
  learning), printing one line and writing one record per warning (`warning/<statistic>`:
  its ratio to the trailing median, or to the top layer's gradient). `wrap(train_step,
  activation_step)` adds the sown statistics at log steps only: a forward pass of their own
  before the update, from the same parameters, batch and dropout masks (at every step their
  extra attention-logit pass would cost more than the 3% budget; inside the train step they
  needed a second train-step program, compiled at the first log step)."""

  name = "health"

  def __init__(self, mode: str, every_steps: int, num_steps: int,
               rule: health_lib.EarlyWarning | None = None,
               depth_rule: health_lib.VanishingGradient | None = None):
    self.mode, self.every_steps, self.num_steps = mode, every_steps, num_steps
    self.rule = rule or health_lib.EarlyWarning()
    self.depth_rule = depth_rule or health_lib.VanishingGradient()
    self.warnings: list[dict] = []  # This step's, for Recovery.
    self._log_next = False

  def wrap(self, train_step, activation_step):
    def step(state, batch, **kw):
      sown = activation_step(state.params, batch, state.step) if self._log_next else {}
      state, metrics = train_step(state, batch, **kw)  # (state donated: the forward first)
      return state, {**metrics, **sown}
    return step

  def before_step(self, loop, step, batch):
    self._log_next = periodic(step, self.every_steps, self.num_steps)

  def on_step(self, loop, step, metrics):
    stats = {k: metrics.pop(k) for k in [k for k in metrics if k.startswith("health/")]}
    self.warnings = []
    if self.mode == "warn":
      self.warnings = (self.rule(step, stats, metrics["learning_rate"])
                       + self.depth_rule(step, stats))
      for w in self.warnings:
        loop.log(w["line"])
      if self.warnings:
        loop.writer.write(step, {"warning/" + w["name"][len("health/"):]: w["ratio"]
                                 for w in self.warnings})
    if periodic(step, self.every_steps, self.num_steps) and stats:
      loop.writer.write(step, stats)
    return None

  def state(self):
    if self.mode != "warn":
      return {}
    return {"history": self.rule.history(), "depth": self.depth_rule.history()}

  def restore(self, saved):
    self.rule.set_history(saved.get("history", {}))
    self.depth_rule.set_history(saved.get("depth", {}))


class Recovery(Hook):
  """train.on_instability. `skip`: the optimizer skips (health.skip_spikes); this hook
  says so, one line and one record (`skipped_step`) per skipped update. `rollback`: on an
  early warning (Health) or a 6σ spike of the loss or gradient norm (health.SigmaRule),
  restores the newest checkpoint at least `rollback_steps` back, drops the next
  `skip_batches` batches and scales the learning rate by `lr_factor` (cumulative), at most
  `max_rollbacks` times; with no such checkpoint it says so and goes on. Every action is
  one line and one record (`skipped_step`; `rollback_to_step` with `rollback_from_step`,
  written at the step rolled back to, which the rollback keeps in metrics.jsonl) and is
  listed in `actions` (the summary's `instability_actions`). Deterministic: the decisions depend on the metrics
  only, identical on every process and on a rerun.

  Placed before Divergence, so that a NaN loss can still be rolled back."""

  name = "recovery"

  def __init__(self, mode: str, health: Health | None, checkpoint_steps, *,
               rollback_steps: int, skip_batches: int, lr_factor: float, max_rollbacks: int):
    self.mode, self.health, self.checkpoint_steps = mode, health, checkpoint_steps
    self.rollback_steps, self.skip_batches = rollback_steps, skip_batches
    self.lr_factor, self.max_rollbacks = lr_factor, max_rollbacks
    self.sigma = health_lib.SigmaRule()
    self.actions: list[dict] = []
    self._pending = None  # A rollback's metrics record, written after the rollback.

  def before_step(self, loop, step, batch):
    if self._pending:
      loop.writer.write(self._pending["rollback_to_step"], self._pending)
      self._pending = None

  def on_step(self, loop, step, metrics):
    if self.mode == "skip":
      if metrics.get("train_skipped"):
        loop.log(f"skip: step {step}: loss {metrics['train_loss']:.4g} or grad norm "
                 f"{metrics['grad_norm']:.4g} 6σ above its trailing 128 steps; update skipped")
        self._record(loop, step, {"skipped_step": step})
      return None
    if self.mode != "rollback":
      return None
    spikes = self.sigma(loss=metrics["train_loss"], grad_norm=metrics["grad_norm"])
    warned = [w["name"] for w in (self.health.warnings if self.health else [])]
    if not (spikes or warned):
      return None
    why = ", ".join([f"{s} 6σ spike" for s in spikes] + [f"warning on {w}" for w in warned])
    rollbacks = sum(1 for a in self.actions if "rollback_to_step" in a)
    if rollbacks >= self.max_rollbacks:
      return None  # (Said once, when the last one was taken.)
    target = [s for s in self.checkpoint_steps() if s <= step - self.rollback_steps]
    if not target:
      loop.log(f"rollback: step {step}: {why}, but no checkpoint at or before step "
               f"{step - self.rollback_steps}; continuing without recovery")
      self._record(loop, step, {"rollback_unavailable": step})
      return None
    scale = self.lr_factor ** (rollbacks + 1)  # (loop.lr_scale may hold a fault's spike.)
    last = rollbacks + 1 == self.max_rollbacks
    loop.log(f"rollback: step {step}: {why}; back to step {max(target)}, skipping the next "
             f"{self.skip_batches} batches" + (f", learning rate ×{scale:.3g}" if scale != 1 else "")
             + f" ({rollbacks + 1}/{self.max_rollbacks}"
             + ("; later instabilities run their course)" if last else ")"))
    self.actions.append({"step": step, "rollback_to_step": max(target),
                         "skip_batches": self.skip_batches, "lr_scale": scale, "why": why})
    loop.summary.instability_actions = self.actions
    # The record goes in once the rollback has cut metrics.jsonl back to the target step
    # (train.py: the steps after it are logged anew), at that step: see before_step.
    self._pending = {"rollback_from_step": step, "rollback_to_step": max(target),
                     "skip_batches": self.skip_batches, "lr_scale": scale}
    return Action(rollback_steps=step - max(target), skip_batches=self.skip_batches,
                  lr_scale=scale if self.lr_factor != 1 else None)

  def _record(self, loop, step, record):
    self.actions.append({"step": step, **record})
    loop.summary.instability_actions = self.actions
    loop.writer.write(step, record)

  def state(self):
    return {"actions": self.actions, "sigma": self.sigma.history()}

  def restore(self, saved):
    # On resume: the run's actions so far. On a rollback: the actions are kept (the
    # restored checkpoint predates the newest), the 6σ windows go back with the state.
    if len(saved.get("actions", [])) > len(self.actions):
      self.actions = list(saved["actions"])
    self.sigma.set_history(saved.get("sigma", {}))


class FaultInjection(Hook):
  """train.inject_fault, for the recovery tests: from step `first`, for `n` steps, either
  replaces the batch by random tokens (`garbage`) or multiplies the learning rate by
  `factor` (`lr_spike`). Fires once per process, as a transient fault does (a rollback
  over it does not bring it back)."""

  name = "fault"

  def __init__(self, kind: str, first: int, n: int, factor: float, vocab_size: int,
               seed: int):
    self.kind, self.first, self.n, self.factor = kind, first, n, factor
    self.vocab_size, self.seed = vocab_size, seed
    self._fired, self._spiking = set(), False

  def before_step(self, loop, step, batch):
    if not self.first <= step < self.first + self.n or step in self._fired:
      return
    self._fired.add(step)
    if self.kind == "garbage":
      rng = np.random.default_rng([self.seed, step])
      for key in ("inputs", "targets", "decoder_inputs"):
        if key in batch:
          batch[key] = rng.integers(1, self.vocab_size, batch[key].shape).astype(
              batch[key].dtype)  # (A new array: the data's own may be shared.)
    elif not self._spiking:
      loop.lr_scale *= self.factor
      self._spiking = True

  def after_step(self, loop, step):
    if self._spiking and step >= self.first + self.n - 1:
      loop.lr_scale /= self.factor
      self._spiking = False

  def restore(self, saved):
    self._spiking = False  # (A rollback restored the learning-rate scale from before it.)
