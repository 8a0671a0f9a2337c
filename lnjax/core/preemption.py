"""SIGTERM (and SLURM's SIGUSR1) as a request to stop: a checkpoint, then exit 143.

`Stop` installs the handlers for a whole run, data preparation included. Before the
training loop starts, a signal raises `Preempted` where the main thread is (nothing to
save yet: the command exits 143 with one line). Once the loop runs, it only sets a flag:
the loop checks it between steps (`reached`), and the long host-side phases inside a step's
periodic work (evaluation batches, BLEU decoding) call `check()`, which raises
`Preempted` so the loop can save the state after the step and stop within seconds.

Many processes: they must stop at the same step, so JAX's preemption service (it catches
SIGTERM itself once jax.distributed is up) agrees on one at a step boundary: the step after
the furthest any process had reached when the first one was signalled. Phases inside a
step are not interrupted there (the processes' collectives must stay in step).
"""

import signal
import threading

import jax
from jax.experimental import multihost_utils

SIGNALS = (signal.SIGTERM, signal.SIGUSR1)


class Preempted(Exception):
  """A stop was requested (SIGTERM or SIGUSR1) during a phase that cannot finish first."""

  exit_code = 143


_state = {"signal": None, "raise": False}


def requested() -> str | None:
  """The name of the signal that asked this process to stop, or None."""
  return _state["signal"]


def check() -> None:
  """Raises Preempted if a stop was requested (one process; a no-op with many)."""
  if _state["signal"] and jax.process_count() == 1:
    raise Preempted(_state["signal"])


def reached(step: int) -> bool:
  """Whether to save and stop after `step`; every process calls it at every step."""
  if jax.process_count() > 1:
    if multihost_utils.reached_preemption_sync_point(step):
      _state["signal"] = _state["signal"] or "SIGTERM"
    return _state["signal"] is not None
  return _state["signal"] is not None


def _handle(signum, frame):
  _state["signal"] = signal.Signals(signum).name
  if _state["raise"]:
    raise Preempted(_state["signal"])


class Stop:
  """`with Stop() as stop:` handles SIGTERM/SIGUSR1 for the block (one process, main thread);
  `stop.raising(False)` once there is a loop that saves before it stops."""

  def __init__(self):
    self._previous, self._outer = {}, {}

  def __enter__(self):
    # Nested in another Stop (a driver around its runs: lnjax.tasks.finetune), a signal that came
    # before this block still counts: it raises here.
    self._outer = dict(_state)
    self.raising(True)
    if jax.process_count() == 1 and threading.current_thread() is threading.main_thread():
      self._previous = {s: signal.signal(s, _handle) for s in SIGNALS}
    return self

  def raising(self, on: bool) -> None:
    """True: a signal raises Preempted at once; False: it only sets the flag."""
    _state["raise"] = on
    if on:
      check()

  def __exit__(self, *exc):
    for s, previous in self._previous.items():
      signal.signal(s, previous)
    nested = self._outer["raise"]  # The outer block keeps a stop requested in this one.
    _state.update({"signal": _state["signal"] if nested else None, "raise": nested})
    return False
