"""glibc allocator settings that XLA:CPU needs to run at full speed.

XLA:CPU's step scratch (hundreds of MiB for a small Transformer) is allocated on worker
threads. glibc gives each thread its own arena and serves large blocks with mmap, so the
scratch is mapped, page-faulted and unmapped on every step. One arena, no mmap and no
trimming keep it resident. Measured on a 2-core CPU: -30 to -40% step time for the
8-layer 2.6M-parameter LM. Set LNJAX_MALLOPT=0 to leave glibc's defaults alone.

The price is fragmentation. XLA:CPU's scratch is one block per step (the buffer
assignment's "preallocated-temp", 497 MiB for that LM); once small allocations land in the
hole a freed block leaves, the next step's block no longer fits there and the heap grows by
another block, every freed byte staying resident: the LM's peak RSS went from 1.0 GB after
its first step to 2.0-3.1 GB within 30 steps. `Footprint` gives those holes' pages back
(malloc_trim, which madvises free chunks away and keeps the heap's top, where the scratch
sits) after the first steps, after each evaluation and save, and after a step that grew
the process past the size the last release started from. In 20 steps the LM peaked at
1.0 GB with the releases, 3.0 GB without, 1.1 GB under glibc's defaults, with no loss of
step time (`python benchmarks/memory.py`, 2026-12-01; BENCHMARKS.md, "Memory").
LNJAX_MALLOC_RELEASE=0 turns the releases off (the settings alone).
"""

import ctypes
import ctypes.util
import functools
import os
import sys

# From glibc's malloc.h.
_M_TRIM_THRESHOLD = -1
_M_MMAP_MAX = -4
_M_ARENA_MAX = -8
_TRIM_THRESHOLD = 2**30  # Bytes of free heap top kept resident (the step's scratch).

_applied = False


@functools.cache
def _glibc_function(name: str, *argtypes):
  """glibc's `name` with its argument types, or None (musl or another libc). Looked up
  once: find_library runs ldconfig, and a release may come after every step."""
  try:
    function = getattr(ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6"), name)
  except (OSError, AttributeError):
    return None
  function.argtypes = list(argtypes)
  return function


def tune_glibc_malloc() -> bool:
  """Applies the settings once per process; returns whether they are in effect."""
  global _applied
  if _applied:
    return True
  if os.environ.get("LNJAX_MALLOPT", "1") == "0" or not sys.platform.startswith("linux"):
    return False
  mallopt = _glibc_function("mallopt", ctypes.c_int, ctypes.c_int)
  if mallopt is None:  # musl or another libc: nothing to tune.
    return False
  ok = mallopt(_M_ARENA_MAX, 1) == 1
  ok &= mallopt(_M_MMAP_MAX, 0) == 1
  ok &= mallopt(_M_TRIM_THRESHOLD, _TRIM_THRESHOLD) == 1
  _applied = bool(ok)
  return _applied


def rss_bytes() -> int:
  """This process's resident set now (/proc/self/statm; 0 where there is none)."""
  try:
    with open("/proc/self/statm", "rb") as f:
      return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
  except (OSError, ValueError, IndexError):
    return 0


def release_free_memory() -> bool:
  """Gives the pages of the heap's free chunks back to the OS (glibc's malloc_trim); the
  free top of the heap up to the trim threshold stays. False where there is no glibc."""
  trim = _glibc_function("malloc_trim", ctypes.c_size_t)
  if trim is None:
    return False
  trim(_TRIM_THRESHOLD)
  return True


class Footprint:
  """Keeps the heap's freed holes from staying resident (see the module docstring).

  Call `after_step()` once a step has finished. It releases free memory after each of the
  first `first_steps` steps (compilation's garbage, the first scratch's hole) and after any
  step that left the RSS more than `growth` (a fraction) and `min_bytes` above the RSS
  the last release started from. Not above what it left: a step that lands its scratch
  in a released hole faults it back in, and the RSS regrows to its working set, which is
  no reason to release again (releasing each such step would fault the scratch in every
  step). A check reads /proc/self/statm (microseconds); a release walks the heap (about
  10 ms for a 1 GB heap), so a steady run releases nothing.
  """

  def __init__(self, first_steps: int = 2, growth: float = 0.1, min_bytes: int = 64 << 20):
    self.first_steps, self.growth, self.min_bytes = first_steps, growth, min_bytes
    self.steps = 0
    self.baseline = 0
    self.releases = 0
    self.enabled = _applied and os.environ.get("LNJAX_MALLOC_RELEASE", "1") != "0"

  def after_step(self) -> bool:
    """Returns whether it released memory."""
    if not self.enabled:
      return False
    self.steps += 1
    rss = rss_bytes()
    if (self.steps > self.first_steps
        and rss <= self.baseline + max(self.min_bytes, self.growth * self.baseline)):
      return False
    release_free_memory()
    self.baseline = rss
    self.releases += 1
    return True

  def after_phase(self) -> None:
    """After evaluation, a checkpoint or a new compilation: one release, then as after a
    step."""
    if self.enabled:
      self.baseline = rss_bytes()
      release_free_memory()
      self.releases += 1
