"""The training loop: it steps, and hands each step to its hooks (lnjax/core/hooks.py), which do
all the periodic work (logging, evaluation, checkpoints, preemption, divergence, profiling).
"""

from __future__ import annotations

import jax

from lnjax.core import hooks as hooks_lib, preemption, sharding


class Loop:
  """Steps `state` to `num_steps` with the compiled `train_step(state, batch)`.

  Hooks see: state, step, num_steps, workdir, train_iter, writer (metrics records),
  summary (the run's summary.json), log (console lines), preempted (a stop was asked).
  `restore(max_step)` gives (state, data position, hooks' saved states) of the newest
  checkpoint at or before `max_step`, for a hook's rollback.
  """

  def __init__(self, *, state, train_step, train_iter, batch_sharding, num_steps: int,
               hooks: list, workdir: str, writer, summary, log, restore=None):
    self.state, self.step, self.num_steps = state, int(state.step), num_steps
    self.train_step, self.train_iter, self.batch_sharding = train_step, train_iter, batch_sharding
    self.hooks, self.workdir, self.writer, self.summary, self.log = hooks, workdir, writer, summary, log
    self._restore = restore
    self.preempted = False  # A stop was asked: the next save is forced, then the run ends.
    self.lr_scale = 1.0  # Action.lr_scale: every update is scaled by it.
    self._skip = self._rollbacks = 0

  def run(self) -> str:
    """Trains; returns the run's status (hooks.COMPLETED, DIVERGED or PREEMPTED)."""
    status = None
    try:
      for h in self.hooks:
        status = status or self._act(h.on_start(self), self.step)
      pending = None  # (step, metrics) not yet handed to the hooks: one step of lag.
      while status is None and self.step < self.num_steps:
        for _ in range(self._skip):
          next(self.train_iter)
        self._skip = 0
        local_batch = next(self.train_iter)
        step = self.step + 1
        for h in self.hooks:
          h.before_step(self, step, local_batch)
        batch = sharding.global_batch(local_batch, self.batch_sharding)
        self.state, metrics = (self.train_step(self.state, batch) if self.lr_scale == 1.0 else
                               self.train_step(self.state, batch, lr_scale=self.lr_scale))
        self.step = step
        for h in self.hooks:
          h.after_step(self, step)
        rollbacks = self._rollbacks
        if pending is not None:
          status = self._metrics(*pending)
        pending = (step, metrics) if rollbacks == self._rollbacks else None
        if pending and status is None and any([h.wants_state(self, step) for h in self.hooks]):
          pending, status = None, self._metrics(step, metrics)
          status = status or self._state(step)
      if status is None and pending is not None:  # (No hook wanted the last step's state.)
        status = self._metrics(*pending)
    except preemption.Preempted:  # On start (an evaluation run again): its step is saved.
      status = hooks_lib.PREEMPTED
    status = status or hooks_lib.COMPLETED
    for h in self.hooks:
      h.on_end(self, status)
    return status

  def _metrics(self, step: int, metrics) -> str | None:
    """Hands step `step`'s metrics to the hooks; a status if one of them stops the run."""
    metrics = {k: float(v) for k, v in jax.device_get(metrics).items()}
    for h in self.hooks:
      action = h.on_step(self, step, metrics)
      if action is not None:
        return self._act(action, step)
    return None

  def _state(self, step: int) -> str | None:
    """Every hook's on_state; a hook stopped by SIGTERM (preemption.check) leaves the others
    to save the state after `step`, and the run ends as preempted."""
    interrupted, status = False, None
    for h in self.hooks:
      try:
        status = status or self._act(h.on_state(self, step), step)
      except preemption.Preempted:
        interrupted = self.preempted = True
    if interrupted or (self.preempted and step < self.num_steps):
      return hooks_lib.PREEMPTED
    return status

  def on_eval(self, step: int, scalars: dict):
    """Called by the evaluating hook: hands the scalars to the others; the first Action."""
    for h in self.hooks:
      action = h.on_eval(self, step, scalars)
      if action is not None:
        return action
    return None

  def hook_states(self) -> dict:
    """What a checkpoint saves of the hooks (and the loop's learning-rate scale)."""
    states = {h.name: h.state() for h in self.hooks if h.state()}
    return {**states, **({"loop": {"lr_scale": self.lr_scale}} if self.lr_scale != 1.0 else {})}

  def restore_hooks(self, saved: dict) -> None:
    for h in self.hooks:
      h.restore(saved.get(h.name, {}))
    self.lr_scale = float(saved.get("loop", {}).get("lr_scale", 1.0))

  def _act(self, action: hooks_lib.Action | None, step: int) -> str | None:
    """Carries out a hook's Action about `step`; its stop status, if any."""
    if action is None:
      return None
    if action.rollback_steps:
      state, data_state, saved = self._restore(step - action.rollback_steps)
      self.state, self.step = state, int(state.step)
      self.train_iter.set_state(data_state)
      self.restore_hooks(saved)
      self._rollbacks += 1
      self.log(f"Rolled back to step {self.step}.")
    self._skip += action.skip_batches
    if action.lr_scale is not None:
      self.lr_scale = action.lr_scale
    return action.stop
