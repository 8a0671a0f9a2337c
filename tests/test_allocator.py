"""lnjax.core.allocator: glibc's malloc settings for XLA:CPU, and the releases that keep
their freed holes from staying resident."""

import os
import subprocess
import sys
import textwrap

import pytest

from lnjax.core import allocator, hooks

MiB = 1 << 20

linux_glibc = pytest.mark.skipif(not sys.platform.startswith("linux"),
                                 reason="glibc's malloc_trim: Linux only")


@linux_glibc
def test_a_freed_block_below_a_live_one_stays_resident_until_released():
  # The fragmentation the releases exist for, in a process with lnjax's settings: a large
  # block freed below a live allocation is not the heap's top, so no trim gives it back;
  # release_free_memory() does.
  code = textwrap.dedent("""
      import ctypes
      from lnjax.core import allocator
      assert allocator.tune_glibc_malloc()
      libc = ctypes.CDLL("libc.so.6")
      libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
      libc.free.argtypes = [ctypes.c_void_p]
      block = libc.malloc(256 << 20)
      ctypes.memset(block, 1, 256 << 20)
      fence = libc.malloc(1 << 20)
      ctypes.memset(fence, 1, 1 << 20)
      live = allocator.rss_bytes()
      libc.free(block)
      freed = allocator.rss_bytes()
      assert allocator.release_free_memory()
      print(live, freed, allocator.rss_bytes())
      """)
  env = {k: v for k, v in os.environ.items() if k != "LNJAX_MALLOPT"}
  out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                       check=True)
  live, freed, released = map(int, out.stdout.split())
  assert freed > live - 16 * MiB  # Freed, and still resident.
  assert released < freed - 200 * MiB


class FakeProcess:
  """The process's RSS as the test sets it, and the releases Footprint asks for."""

  def __init__(self, monkeypatch, rss_mib: float):
    self.rss, self.released = rss_mib * MiB, 0
    monkeypatch.setattr(allocator, "_applied", True)
    monkeypatch.delenv("LNJAX_MALLOC_RELEASE", raising=False)
    monkeypatch.setattr(allocator, "rss_bytes", lambda: int(self.rss))
    monkeypatch.setattr(allocator, "release_free_memory", self.release)

  def release(self):
    self.released += 1
    self.rss = self.rss * 0.6  # What a release gives back.
    return True


def test_footprint_releases_after_the_first_steps_then_only_when_the_process_grew(monkeypatch):
  proc = FakeProcess(monkeypatch, 3000)
  fp = allocator.Footprint(first_steps=2, growth=0.1, min_bytes=64 * MiB)
  assert fp.after_step() and fp.after_step()  # Compilation's garbage, the first hole.
  assert proc.released == 2
  working_set = 1800 * MiB  # The RSS the last release started from.
  for _ in range(5):
    assert not fp.after_step()  # Steady: a check, no release.
  proc.rss = working_set  # Regrown to the working set (a scratch faulted back in): no cause.
  assert not fp.after_step()
  proc.rss = 1.09 * working_set  # Within 10% of it (162 MiB, above the 64 MiB floor).
  assert not fp.after_step()
  proc.rss = 1.11 * working_set
  assert fp.after_step()
  assert proc.released == 3 and fp.releases == 3
  proc.rss = 1.11 * working_set  # Regrown to the new working set: still no cause.
  assert not fp.after_step()
  fp.after_phase()  # An evaluation or a save: released whatever the growth.
  assert proc.released == 4


def test_footprint_needs_min_bytes_of_growth_in_a_small_process(monkeypatch):
  proc = FakeProcess(monkeypatch, 100)
  fp = allocator.Footprint(first_steps=0, growth=0.1, min_bytes=64 * MiB)
  fp.baseline = int(proc.rss)
  proc.rss += 40 * MiB  # 40% of a small process, but under 64 MiB: not worth a heap walk.
  assert not fp.after_step()
  proc.rss += 30 * MiB
  assert fp.after_step()


@pytest.mark.parametrize("tuned, env", [(False, None), (True, "0")])
def test_footprint_is_off_without_the_settings_or_with_lnjax_malloc_release_0(
    monkeypatch, tuned, env):
  proc = FakeProcess(monkeypatch, 1000)
  monkeypatch.setattr(allocator, "_applied", tuned)
  if env is not None:
    monkeypatch.setenv("LNJAX_MALLOC_RELEASE", env)
  fp = allocator.Footprint()
  for _ in range(3):
    assert not fp.after_step()
  fp.after_phase()
  assert proc.released == 0


def test_the_memory_hook_checks_after_every_step_and_releases_after_each_state_step(
    monkeypatch):
  proc = FakeProcess(monkeypatch, 1000)
  hook = hooks.Memory()
  hook.footprint.first_steps = 1
  for step in range(1, 5):
    assert hook.on_step(None, step, {"train_loss": 1.0}) is None
  assert proc.released == 1
  hook.on_state(None, 4)  # After the evaluation's and the save's on_state.
  assert proc.released == 2
