"""The periodic work of the training loop, one small object each (after clu's periodic
actions and levanter's hooks).

The loop (lnjax/core/loop.py) only steps. It hands each step to every hook, in the order of
its list, through one interface; a hook overrides the methods it needs:

  on_start(loop)                    once, with the state restored or initialized (loop.step)
  before_step(loop, step, batch)    before step `step` runs (1-based: the step being taken;
                                    `batch` this process's rows, numpy)
  after_step(loop, step)            once the step is dispatched (it may still be running)
  on_step(loop, step, metrics)      every step, in order, with its metrics as floats; one
                                    step late (the host stays a step ahead of the device),
                                    except at a state step (below)
  wants_state(loop, step) -> bool   asked of every hook after every step: whether the hook
                                    needs the state after `step` (evaluate, save, stop)
  on_state(loop, step)              at such a step, for every hook: loop.state is the state
                                    after `step` and every hook has had on_step(step)
  on_eval(loop, step, scalars)      each evaluation's held-out scalars, for the other hooks
  on_end(loop, status)              once, as the run ends (completed, diverged, preempted)
  state() -> dict, restore(saved)   what the hook carries across a resume: saved with every
                                    checkpoint under the hook's `name`, given back before
                                    on_start (and after a rollback)

on_step, on_state and on_eval may return an `Action`: stop the run with a status, skip the
next batches, roll back to a checkpoint, scale the learning rate. The loop acts on it before
its next step and then calls no further hook for that step (a diverged step is never
logged). A hook that must give up inside a long phase on SIGTERM (an evaluation) calls
`preemption.check()`; the loop then saves the state after the step and stops.

To add a hook, subclass Hook and append an instance to the list train.train_and_evaluate
gives the loop; nothing in the loop changes. A hook reads `loop.state`, `loop.step`,
`loop.num_steps`, writes metrics records with `loop.writer.write(step, scalars)` and console
lines with `loop.log(...)`. For instance a per-layer health hook reads the statistics the
train step adds to its metrics at log steps in on_step, prints warnings and writes records;
a recovery hook returns Action(rollback_steps=K, skip_batches=B, lr_scale=0.5) from
on_step when a loss spikes.
"""

from __future__ import annotations

import dataclasses
import math
import os
import shutil
import tempfile
import time

import jax

from lnjax.core import allocator, fileio, metrics as metrics_lib, preemption
from lnjax.core import progress as progress_lib

# Ends of a run (lnjax.main turns them into exit codes 0, 3 and 143).
COMPLETED, DIVERGED, PREEMPTED = "completed", "diverged", "preempted"
RUNNING = "running"  # summary.json while the run trains.


@dataclasses.dataclass(frozen=True)
class Action:
  """What a hook asks of the loop. Fields left at their defaults ask nothing.

  stop: end the run with this status (DIVERGED, COMPLETED, PREEMPTED).
  rollback_steps: restore the newest checkpoint at least this many steps back (its
    parameters, optimizer state, data position and the hooks' state), then go on from it.
  skip_batches: draw and drop this many train batches before the next step (after a
    rollback: the batches that led to the spike).
  lr_scale: from the next step on, every update is multiplied by this (for the optax
    optimizers lnjax builds, the learning rate is the update's last factor: the same as
    scaling the learning rate); it is saved with the checkpoints. None: unchanged.
  """

  stop: str | None = None
  rollback_steps: int = 0
  skip_batches: int = 0
  lr_scale: float | None = None


class Hook:
  """A no-op for every event; see the module docstring."""

  name = "hook"  # The key of state() in a checkpoint; unique among a loop's hooks.

  def on_start(self, loop) -> None:
    pass

  def before_step(self, loop, step: int, batch: dict) -> None:
    pass

  def after_step(self, loop, step: int) -> None:
    pass

  def on_step(self, loop, step: int, metrics: dict[str, float]) -> Action | None:
    return None

  def wants_state(self, loop, step: int) -> bool:
    return False

  def on_state(self, loop, step: int) -> Action | None:
    return None

  def on_eval(self, loop, step: int, scalars: dict[str, float]) -> Action | None:
    return None

  def on_end(self, loop, status: str) -> None:
    pass

  def state(self) -> dict:
    return {}

  def restore(self, saved: dict) -> None:
    pass


def periodic(step: int, every_steps: int, num_steps: int) -> bool:
  """Every `every_steps` steps and at the last one."""
  return step % every_steps == 0 or step == num_steps


class Preemption(Hook):
  """Stops after a step once SIGTERM/SIGUSR1 arrived (lnjax/core/preemption.py): the state after
  the step is saved (CheckpointHook), then the run ends as preempted. First in the list,
  so that the other hooks' on_state see loop.preempted."""

  name = "preemption"

  def wants_state(self, loop, step):
    return preemption.reached(step)  # (Every process calls it at every step.)

  def on_state(self, loop, step):
    loop.preempted = loop.preempted or preemption.requested() is not None

  def on_end(self, loop, status):
    if status == PREEMPTED:
      loop.log(f"{preemption.requested() or 'SIGTERM'}: saved step {loop.step}; run the "
               "same command to resume.")


class Divergence(Hook):
  """Ends the run at a NaN/Inf train loss, or one above `max_loss` (divergence_factor ×
  ln V, about the loss at initialization, which no run that is still learning reaches).
  Records the last finite loss in the summary."""

  name = "divergence"

  def __init__(self, max_loss: float):
    self.max_loss = max_loss
    self.diverged_at = self.loss = None

  def on_step(self, loop, step, metrics):
    loss = metrics["train_loss"]
    if not math.isfinite(loss) or loss > self.max_loss:
      self.diverged_at, self.loss = step, loss
      return Action(stop=DIVERGED)
    loop.summary.last_finite = (step, loss)
    return None

  def on_end(self, loop, status):
    if status != DIVERGED:
      return
    lf = loop.summary.last_finite
    lf = f"{lf[1]:.4f} at step {lf[0]}" if lf else "none"
    why = ("non-finite loss" if not math.isfinite(self.loss) else
           f"loss {self.loss:.4g} above train.divergence_factor × ln V = {self.max_loss:.4g}")
    loop.log(f"Diverged: {why} at step {self.diverged_at}; last finite loss {lf}.")


class Logging(Hook):
  """The train_* records (means over each window of `every_steps` steps, the learning rate
  and parameter norm at its last step), the console line (the same numbers as the record,
  which a header line says once), the first step's time and each
  first-time compilation (kept out of tok/s and the ETA). The open window's sums are saved
  with the checkpoints, so a resumed run logs the records an uninterrupted one logs."""

  name = "window"

  def __init__(self, every_steps: int, num_steps: int, first_step: int, num_shapes: int = 1):
    self.every_steps, self.num_steps, self.first_step = every_steps, num_steps, first_step
    self.progress = metrics_lib.Progress(num_steps, first_step, num_shapes)
    self.window: dict = {}
    self.first_step_seconds = None
    self._compiling = self._restart = None
    self._header_logged = False
    self._step_tokens: dict[int, float] = {}

  def before_step(self, loop, step, batch):
    if self._restart:  # Time outside steps (evaluation, saving) is not in the rate.
      self.progress.restart_clock(step - 1)
      self._restart = False
    # (Counted when the step's metrics arrive: a step's line may come before or after
    # the next step starts.)
    self._step_tokens[step] = float(batch["weights"].sum()) * jax.process_count()
    self._t = time.perf_counter()
    shape = (batch["inputs"].shape[0] * jax.process_count(), *batch["inputs"].shape[1:])
    what = self.progress.compiling(tuple(shape))
    if what:  # (jit compiles in the call; the step itself runs asynchronously.)
      self._compiling = (what, progress_lib.Phase(what).__enter__())

  def after_step(self, loop, step):
    if self._compiling:
      what, phase = self._compiling
      phase.__exit__(None, None, None)
      self._compiling = None
      if step > self.first_step + 1:  # (The first step has its own line below.)
        loop.log(f"{what[0].upper()}{what[1:]}: {time.perf_counter() - self._t:.1f} s, "
                 "kept out of tok/s and the ETA.")
    if step == self.first_step + 1:
      jax.block_until_ready(loop.state)
      self.first_step_seconds = round(time.perf_counter() - self._t, 3)
      loop.summary.first_step_seconds = self.first_step_seconds
      loop.log(f"First step in {self.first_step_seconds:.2f} s (compilation included).")
      # The rate starts after it: its data loader start-up and first run are not steady.
      self._step_tokens.pop(step, None)
      self.progress.restart_clock(step)

  def on_step(self, loop, step, metrics):
    for s in [s for s in self._step_tokens if s <= step]:
      self.progress.add_tokens(self._step_tokens.pop(s))
    for k, v in metrics.items():
      self.window[k] = self.window.get(k, 0.0) + v
    self.window["_n"] = self.window.get("_n", 0) + 1
    if periodic(step, self.every_steps, self.num_steps):
      n = self.window.pop("_n")
      means = {k: v / n for k, v in self.window.items()}
      means["learning_rate"], means["param_norm"] = metrics["learning_rate"], metrics["param_norm"]
      loop.writer.write(step, means)
      if not self._header_logged:
        self._header_logged = True
        loop.log(f"Every {self.every_steps} steps: loss and grad_norm are their means over "
                 "those steps (metrics.jsonl's train_loss and grad_norm), lr the last step's.")
      loop.log(self.progress.line(step, means["train_loss"], means["learning_rate"],
                                  means["grad_norm"]))
      self.window = {}
      loop.summary.write(RUNNING, step)

  def on_state(self, loop, step):
    self._restart = True

  def state(self):
    return dict(self.window)

  def restore(self, saved):
    self.window = dict(saved)


class Evaluation(Hook):
  """Held-out evaluation every `every_steps` steps and at the last one: `evaluate(params,
  step)` gives the scalars, written as one eval_* record and a console line; with
  `best_metric`, the checkpoint with its highest value is kept in `best`.

  An evaluation stopped by SIGTERM is saved as pending with the checkpoint of its step,
  and runs again first thing on resume, so the run's records equal an uninterrupted run's.
  A run resumed at its last step (already trained) evaluates again and records it if no
  record of that step exists.
  """

  name = "eval"

  def __init__(self, evaluate, every_steps: int, num_steps: int, best=None,
               best_metric: str | None = None, best_value: float | None = None,
               logged_steps=()):
    self.evaluate, self.every_steps, self.num_steps = evaluate, every_steps, num_steps
    self.best, self.best_metric, self.best_value = best, best_metric, best_value
    self.logged_steps = set(logged_steps)  # Steps with an eval record already written.
    self.pending = None

  def on_start(self, loop):
    if self.pending == loop.step or loop.step >= self.num_steps:
      if loop.step >= self.num_steps:
        loop.log(f"{loop.workdir} is already trained to step {loop.step}.")
      return self.run(loop, loop.step, record=loop.step not in self.logged_steps)
    return None

  def wants_state(self, loop, step):
    return periodic(step, self.every_steps, self.num_steps)

  def on_state(self, loop, step):
    return self.run(loop, step) if self.wants_state(loop, step) else None

  def run(self, loop, step: int, record: bool = True) -> Action | None:
    self.pending = step
    scalars = self.evaluate(loop.state.params, step)  # May raise preemption.Preempted.
    self.pending = None
    if record:
      loop.writer.write(step, scalars)
    loop.log(f"eval  step {step:>6}  " + "  ".join(
        f"{k[5:]} {v:.4f}" for k, v in scalars.items()))
    loop.summary.last_eval = scalars
    metric = scalars.get(self.best_metric) if self.best else None
    if metric is not None and (self.best_value is None or metric > self.best_value):
      self.best_value = metric
      self.best.save(step, loop.state, {}, force=True, replace=True)
      loop.log(f"      new best {self.best_metric} {metric:.4f}: saved to best_checkpoint/")
    loop.summary.best_value = self.best_value
    return loop.on_eval(step, scalars)

  def on_end(self, loop, status):
    if self.best is not None:
      self.best.close()

  def state(self):
    return {} if self.pending is None else {"pending_step": self.pending}

  def restore(self, saved):
    self.pending = saved.get("pending_step")


class Checkpointing(Hook):
  """Saves every `checkpoints.every_steps` steps, at the last step and when the run is
  stopped (lnjax/core/checkpoint.py): the state, the data position and every hook's state()."""

  name = "checkpoint"

  def __init__(self, checkpoints, num_steps: int):
    self.checkpoints, self.num_steps = checkpoints, num_steps

  def before_step(self, loop, step, batch):
    self.checkpoints.seal()

  def wants_state(self, loop, step):
    return periodic(step, self.checkpoints.every_steps, self.num_steps)

  def on_state(self, loop, step):
    if self.checkpoints.save(step, loop.state, loop.train_iter.get_state(),
                             force=step == self.num_steps or loop.preempted,
                             log=loop.hook_states()):
      loop.summary.write(RUNNING, step)

  def on_end(self, loop, status):
    self.checkpoints.close()


class Memory(Hook):
  """Gives the heap's freed holes back to the OS after the first steps, after any step
  that grew the process, and after each evaluation and save (allocator.Footprint): under
  the malloc settings XLA:CPU runs fast with, they would otherwise stay resident. Last in
  the list, so that its on_state follows the evaluation's and the save's."""

  name = "memory"

  def __init__(self):
    self.footprint = allocator.Footprint()

  def on_step(self, loop, step, metrics):
    self.footprint.after_step()

  def on_state(self, loop, step):
    self.footprint.after_phase()


class Profiler(Hook):
  """A jax.profiler trace of steps first..last (both included) into <workdir>/profile;
  jax.profiler writes local files, so a bucket workdir's trace is uploaded when it ends."""

  name = "profiler"

  def __init__(self, first: int, last: int, workdir: str):
    self.first, self.last = first, last
    self.trace_dir = os.path.join(workdir, "profile")
    self.local_dir = self.trace_dir

  def before_step(self, loop, step, batch):
    if step == self.first:
      if fileio.is_remote(self.trace_dir):  # Traced locally, uploaded and removed at the end.
        self.local_dir = tempfile.mkdtemp(prefix="lnjax_profile_")
      jax.profiler.start_trace(self.local_dir)

  def after_step(self, loop, step):
    if step == self.last:
      jax.block_until_ready(loop.state)
      jax.profiler.stop_trace()
      if self.local_dir != self.trace_dir:
        fileio.copy_tree(self.local_dir, self.trace_dir)
        shutil.rmtree(self.local_dir, ignore_errors=True)
      loop.log(f"Profile of steps {self.first}..{self.last} in {self.trace_dir} "
               "(TensorBoard: profile).")
