"""One run per workdir: an exclusive lock held while a run trains there.

Locally the lock is `fcntl.flock` on `<workdir>/.lnjax.lock`: the kernel releases it when
its holder ends, however it ends (kill -9 included), so a lock left by a dead process is
simply taken over. The file names its holder (host and PID) for the refusal's one line; it
is removed when the holder releases the lock cleanly.

A bucket has no flock: there the lock is an object naming its holder and the time it last
refreshed it (at every summary write). It is taken over when its holder is a process of
this host that no longer exists, or when it has not been refreshed for STALE_SECONDS (a
holder on another host that died). Two launches within the same second can both pass the
check; the later write wins and the other launch, reading the lock back, stops.
"""

import errno
import fcntl
import json
import os
import socket
import stat
import time

from lnjax.core import errors, fileio

LOCK_FILE = ".lnjax.lock"  # (The sweep launcher's own lock on a run is ROOT/<run>/.lock.)


class WorkdirLock:
  """`with WorkdirLock(workdir):` trains alone in `workdir` or raises WorkdirError."""

  def __init__(self, workdir: str):
    self.path = os.path.join(workdir, LOCK_FILE)
    self._fd = None
    self.previous_holder = None  # The holder named by a stale lock that was taken over.

  def __enter__(self):
    while True:
      fd = open_lock_file(self.path)
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

  def refresh(self) -> None:
    """(The kernel keeps a flock: nothing to refresh.)"""

  def __exit__(self, *exc):
    if self._fd is not None:
      try:
        os.remove(self.path)  # Before unlocking: a waiter then sees a new file.
      except OSError:
        pass
      os.close(self._fd)
      self._fd = None


def open_lock_file(path: str) -> int:
  """An fd on the lock file `path`, created if absent, never through a symbolic link (a
  link there would have the lock line written into whatever it points to): a link, or
  anything but a plain file, is refused with one line (WorkdirError)."""
  try:
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK, 0o644)
  except OSError as e:
    if e.errno not in (errno.ELOOP, errno.EISDIR, errno.ENXIO):
      raise
    fd = None
  if fd is not None and stat.S_ISREG(os.fstat(fd).st_mode):
    return fd
  if fd is not None:
    os.close(fd)
  kind = "a symbolic link" if os.path.islink(path) else "not a plain file"
  raise errors.WorkdirError(f"lock file {path} is {kind}; a lock is never a link: remove "
                            "it and launch again")


def _read_holder(fd: int) -> str:
  return os.pread(fd, 200, 0).decode(errors="replace").strip()


STALE_SECONDS = 900  # A bucket lock not refreshed for this long is a dead holder's.


def workdir_lock(workdir: str):
  """The lock for `workdir`: flock locally, a refreshed object on a bucket."""
  return BucketLock(workdir) if fileio.is_remote(workdir) else WorkdirLock(workdir)


class BucketLock:
  """`with BucketLock("gs://..."):` as WorkdirLock, for a workdir on a bucket."""

  def __init__(self, workdir: str):
    self.path = fileio.join(workdir, LOCK_FILE)
    self.previous_holder = None
    self._me = {"host": socket.gethostname(), "pid": os.getpid()}
    self._held = False

  def __enter__(self):
    holder = self._holder()
    if holder is not None:
      name = f"host {holder.get('host')} PID {holder.get('pid')}"
      if holder_alive(holder):
        raise errors.WorkdirError(f"workdir {os.path.dirname(self.path)} is in use by {name}; "
                                  "wait for that run to end or stop it")
      self.previous_holder = name
    self.refresh()
    time.sleep(1.0)  # Another launch that passed the check at the same time writes too:
    holder = self._holder()  # the last write wins, the other launch stops here.
    if holder is None or {k: holder.get(k) for k in self._me} != self._me:
      raise errors.WorkdirError(f"workdir {os.path.dirname(self.path)} was locked by another "
                                "launch at the same moment")
    self._held = True
    return self

  def refresh(self) -> None:
    fileio.write_text(self.path, json.dumps({**self._me, "time": time.time()}) + "\n")

  def _holder(self) -> dict | None:
    try:
      holder = json.loads(fileio.read_text(self.path) or "null")
    except ValueError:
      return None
    return holder if isinstance(holder, dict) else None

  def __exit__(self, *exc):
    if self._held:
      try:
        fileio.remove(self.path)
      except OSError:
        pass
      self._held = False


def holder_alive(holder: dict) -> bool:
  """Whether the lock file's holder still runs: its process on this host, or, from
  another host, a holder that refreshed the file within STALE_SECONDS."""
  if holder.get("host") == socket.gethostname():
    try:
      os.kill(int(holder.get("pid")), 0)
    except ProcessLookupError:
      return False
    except (PermissionError, TypeError, ValueError):
      return True
    return True
  return time.time() - float(holder.get("time") or 0) < STALE_SECONDS
