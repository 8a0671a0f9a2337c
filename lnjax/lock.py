"""One run per workdir: an exclusive lock held while a run trains there.

The lock is `fcntl.flock` on `<workdir>/.lnjax.lock`: the kernel releases it when its
holder ends, however it ends (kill -9 included), so a lock left by a dead process is simply
taken over. The file names its holder (host and PID) for the refusal's one line; it is
removed when the holder releases the lock cleanly.
"""

import fcntl
import os
import socket

from lnjax import errors

LOCK_FILE = ".lnjax.lock"  # (The sweep launcher's own lock on a run is ROOT/<run>/.lock.)


class WorkdirLock:
  """`with WorkdirLock(workdir):` trains alone in `workdir` or raises WorkdirError."""

  def __init__(self, workdir: str):
    self.path = os.path.join(workdir, LOCK_FILE)
    self._fd = None
    self.previous_holder = None  # The holder named by a stale lock that was taken over.

  def __enter__(self):
    while True:
      fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
      try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
      except BlockingIOError:
        holder = _read_holder(fd)
        os.close(fd)
        raise errors.WorkdirError(
            f"workdir {os.path.dirname(self.path)} is in use by "
            f"{holder or 'another process'}; wait for that run to end or stop it") from None
      try:  # The holder may have released (and removed) the file between open and flock.
        same = os.fstat(fd).st_ino == os.stat(self.path).st_ino
      except FileNotFoundError:
        same = False
      if same:
        break
      os.close(fd)
    self.previous_holder = _read_holder(fd)
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"host {socket.gethostname()} PID {os.getpid()}\n".encode(), 0)
    self._fd = fd
    return self

  def __exit__(self, *exc):
    if self._fd is not None:
      try:
        os.remove(self.path)  # Before unlocking: a waiter then sees a new file.
      except OSError:
        pass
      os.close(self._fd)
      self._fd = None


def _read_holder(fd: int) -> str:
  return os.pread(fd, 200, 0).decode(errors="replace").strip()
