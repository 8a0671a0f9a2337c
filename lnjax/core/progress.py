"""Progress of the long phases (data preparation, compiling, decoding, analysis) on stderr.

On a terminal: a tqdm bar (a counted phase) or a ticking timer (a phase of unknown
length). Elsewhere (a log file, a pipe, CI): quiet, except for one plain line every
`LNJAX_PROGRESS_SECONDS` seconds (default 30) while a phase lasts, so a log shows the
run is alive and how far it is without a line per item. Only process 0 reports.
"""

import math
import os
import sys
import threading
import time

import jax


def _interval() -> float:
  return float(os.environ.get("LNJAX_PROGRESS_SECONDS", "30"))


def _terminal() -> bool:
  return sys.stderr.isatty()


def _say(text: str) -> None:
  print(text, file=sys.stderr, flush=True)


def hms(seconds: float) -> str:
  """'01:05', '1:02:03'; '--:--' for a duration not known (NaN, inf)."""
  if not math.isfinite(seconds):
    return "--:--"
  m, s = divmod(int(seconds), 60)
  h, m = divmod(m, 60)
  return f"{h}:{m:02d}:{s:02d}" if h else f"{m:02d}:{s:02d}"


class Bar:
  """`total` items done one `update(n)` at a time: a tqdm bar on a terminal, else a line
  '<desc>: 320/1000 sentences (32%), 00:12 elapsed, ETA 00:25' every interval."""

  def __init__(self, total: int, desc: str, unit: str = "items"):
    self.total, self.desc, self.unit, self.done = total, desc, unit, 0
    self._t0 = self._last = time.perf_counter()
    self._bar = None
    self._on = jax.process_index() == 0
    if self._on and _terminal():
      from tqdm import tqdm
      self._bar = tqdm(total=total, desc=desc, unit=f" {unit}", file=sys.stderr, leave=False,
                       dynamic_ncols=True)

  def update(self, n: int = 1) -> None:
    self.done += n
    if self._bar is not None:
      self._bar.update(n)
      return
    now = time.perf_counter()
    if self._on and now - self._last >= _interval() and self.done < self.total:
      self._last = now
      elapsed = now - self._t0
      eta = elapsed / self.done * (self.total - self.done) if self.done else float("nan")
      _say(f"{self.desc}: {self.done}/{self.total} {self.unit} "
           f"({100 * self.done / max(self.total, 1):.0f}%), {hms(elapsed)} elapsed"
           + (f", ETA {hms(eta)}" if eta == eta else ""))

  def close(self) -> None:
    if self._bar is not None:
      self._bar.close()
      self._bar = None


class Phase:
  """A phase of unknown length (`with Phase("preparing multi30k_de_en"): ...`): a ticking
  timer on a terminal, else a line '<desc>: still running, 00:30 elapsed' every interval.
  `seconds` holds its duration once it ends."""

  def __init__(self, desc: str):
    self.desc = desc
    self.seconds = 0.0
    self._stop = threading.Event()
    self._thread = None

  def __enter__(self):
    self._t0 = time.perf_counter()
    if jax.process_index() == 0:
      self._thread = threading.Thread(target=self._tick, daemon=True)
      self._thread.start()
    return self

  def _tick(self) -> None:
    terminal = _terminal()
    period = 0.5 if terminal else _interval()
    while not self._stop.wait(period):
      elapsed = hms(time.perf_counter() - self._t0)
      if terminal:
        print(f"\r{self.desc} ... {elapsed}", end="", file=sys.stderr, flush=True)
      else:
        _say(f"{self.desc}: still running, {elapsed} elapsed")

  def __exit__(self, *exc):
    self.seconds = time.perf_counter() - self._t0
    self._stop.set()
    if self._thread is not None:
      self._thread.join()
      if _terminal():
        print("\r\033[K", end="", file=sys.stderr, flush=True)  # Clear the timer's line.
    return False
