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

Compiling: Python runs a signal handler only between bytecodes, and XLA's compiler holds
the main thread in C++ for as long as it takes (minutes for a deep unrolled model), so the
handler would wait for it. The C-level handler also writes the signal's number to a pipe
(`signal.set_wakeup_fd`), which a watcher thread reads at once. If, GRACE_SECONDS later,
the process is still there and either no step has started (nothing to save) or the main
thread is preparing a program (a jit call that missed jax's cache: tracing, lowering,
compiling), the watcher ends the process itself: one line, the `on_forced_exit` cleanups
(the workdir lock), exit 143. The run keeps its last checkpoint (orbax writes one under a
temporary name until it is complete) and the relaunch goes on from it, or from step 0,
as an uninterrupted run would.

Where Python drops exceptions: a signal whose handler runs inside a garbage-collection
callback (jax registers one) or a finalizer raises Preempted where nothing can catch it;
Python hands it to `sys.unraisablehook` ("Exception ignored in ...") and goes on. The
outermost Stop block's hook takes such a stop back silently and delivers the signal again
a moment later, when the main thread is back in ordinary code.
"""

import contextlib
import os
import signal
import sys
import threading

import jax
from jax.experimental import multihost_utils

SIGNALS = (signal.SIGTERM, signal.SIGUSR1)


class Preempted(BaseException):
  """A stop was requested (SIGTERM or SIGUSR1) during a phase that cannot finish first.

  A BaseException, as KeyboardInterrupt is: libraries' `except Exception` (TFDS's feature
  parser adds "Error wile parsing feature index: " to what it catches) let it through."""

  exit_code = 143

  def __init__(self, signal_name: str):
    super().__init__(signal_name)
    self.signal = signal_name  # (Kept apart from args, which a library may rewrite.)


_state = {"signal": None, "raise": False}
GRACE_SECONDS = 2.0  # The time a stop gets to end by itself before the watcher ends it.
# The frames of a jit call preparing its program: jax/_src/pjit.py's `cache_miss` (tracing,
# lowering, compiling), jax/_src/compiler.py's `compile_or_get_cached` (XLA's compiler).
_PREPARING = {("pjit.py", "cache_miss"), ("compiler.py", "compile_or_get_cached")}


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


def _compiling() -> bool:
  """Whether the main thread is preparing a jit program now (tracing, lowering, compiling)."""
  frame = sys._current_frames().get(threading.main_thread().ident)
  while frame is not None:
    code = frame.f_code
    if (os.path.basename(code.co_filename), code.co_name) in _PREPARING and (
        f"jax{os.sep}_src" in code.co_filename):
      return True
    frame = frame.f_back
  return False


REDELIVER_SECONDS = 0.01  # A dropped stop's signal comes again after this.


def _unraisable_hook(previous):
  """sys.unraisablehook for a Stop block: a Preempted raised where Python drops exceptions
  (a gc callback, a finalizer) is delivered again from a timer thread; the rest as before."""
  def hook(unraisable):
    if not isinstance(unraisable.exc_value, Preempted):
      return previous(unraisable)
    signum = signal.Signals[unraisable.exc_value.signal]
    main = threading.main_thread().ident
    again = threading.Timer(REDELIVER_SECONDS, signal.pthread_kill, (main, signum))
    again.daemon = True
    again.start()
  return hook


class _Watcher:
  """The watcher thread of the outermost Stop block (see the module docstring)."""

  def __init__(self, line: str | None = None):
    self.cleanups = []  # on_forced_exit's.
    self.line = line  # The line it ends the process with ({signal}: the name), if not a run's.
    self._read, self._write = os.pipe()
    os.set_blocking(self._write, False)  # (set_wakeup_fd's requirement.)
    self._previous_fd = signal.set_wakeup_fd(self._write, warn_on_full_buffer=False)
    self._previous_hook = sys.unraisablehook
    sys.unraisablehook = _unraisable_hook(self._previous_hook)
    self._ended = threading.Event()
    threading.Thread(target=self._watch, daemon=True, name="lnjax-stop-watcher").start()

  def close(self) -> None:
    self._ended.set()
    signal.set_wakeup_fd(self._previous_fd)
    sys.unraisablehook = self._previous_hook
    os.close(self._write)  # (The thread reads the pipe's end, closes it and returns.)

  def _watch(self) -> None:
    while numbers := os.read(self._read, 64):
      names = [signal.Signals(n).name for n in numbers if n in SIGNALS]
      if not names or self._ended.wait(GRACE_SECONDS):
        continue
      while not self._ended.is_set():  # (A stop that ends by itself ends this thread too.)
        if _state["raise"] or _compiling():
          self._exit(_state["signal"] or names[0])
        self._ended.wait(0.2)
    os.close(self._read)

  def _exit(self, name: str) -> None:
    sys.stderr.write(  # (One write: the progress ticker's thread may print too.)
        self.line.format(signal=name) + "\n" if self.line else
        f"{name}: stopped before the first step; run the same command to start.\n"
        if _state["raise"] else f"{name}: stopped without waiting for XLA to compile; the "
        "steps since the last checkpoint are not kept: run the same command to resume.\n")
    for cleanup in self.cleanups:
      try:
        cleanup()
      except Exception:  # (Ending now matters more: the next run takes a stale lock over.)
        pass
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(Preempted.exit_code)


_watcher: list[_Watcher] = []  # The outermost Stop block's, while it runs.


def on_forced_exit(cleanup) -> None:
  """`cleanup()` (releasing a lock) runs if the watcher ends the process in this Stop block."""
  if _watcher:
    _watcher[0].cleanups.append(cleanup)


def _handle(signum, frame):
  _state["signal"] = signal.Signals(signum).name
  if _state["raise"]:
    raise Preempted(_state["signal"])


class Stop:
  """`with Stop() as stop:` handles SIGTERM/SIGUSR1 for the block (one process, main thread);
  `stop.raising(False)` once there is a loop that saves before it stops. `line`: what the
  watcher prints when it ends a command that is not a training run (lnjax compile)."""

  def __init__(self, line: str | None = None):
    self._line = line
    self._previous, self._outer = {}, {}
    self._watcher, self._cleanups = None, None

  def __enter__(self):
    # Nested in another Stop (a driver around its runs: lnjax.tasks.finetune), a signal that came
    # before this block still counts: it raises here.
    self._outer = dict(_state)
    self.raising(True)
    if jax.process_count() == 1 and threading.current_thread() is threading.main_thread():
      self._previous = {s: signal.signal(s, _handle) for s in SIGNALS}
      if not _watcher:  # (The outermost block.)
        self._watcher = _Watcher(self._line)
        _watcher.append(self._watcher)
      self._cleanups = len(_watcher[0].cleanups)  # (Those of this block go at its end.)
    return self

  def raising(self, on: bool) -> None:
    """True: a signal raises Preempted at once; False: it only sets the flag."""
    _state["raise"] = on
    if on:
      check()

  def __exit__(self, *exc):
    for s, previous in self._previous.items():
      signal.signal(s, previous)
    if _watcher and self._cleanups is not None:
      del _watcher[0].cleanups[self._cleanups:]
    if self._watcher is not None:
      self._watcher.close()
      _watcher.clear()
      self._watcher = None
    nested = self._outer["raise"]  # The outer block keeps a stop requested in this one.
    _state.update({"signal": _state["signal"] if nested else None, "raise": nested})
    return False


@contextlib.contextmanager
def ends_in_one_line(line: str):
  """A Stop block for a command with nothing to save (lnjax compile, a sweep's pre-flight
  compile): a stop in it, libtpu's compile included, prints `line` ({signal}: the signal's
  name) and exits 143 at once, from the main thread or from the watcher."""
  try:
    with Stop(line=line):
      yield
  except Preempted as e:
    print(line.format(signal=e.signal), file=sys.stderr, flush=True)
    os._exit(e.exit_code)  # (Nothing to save, no teardown.)
