"""The one path layer: every file lnjax reads or writes in a workdir goes through here.

Small run files (config.json, summary.json, reports) are written atomically: to a temporary
file beside the target, then renamed over it, so a run killed at any moment leaves either
the old file or the new one, never a cut one.
"""

import os
import uuid


def join(*parts: str) -> str:
  return os.path.join(*parts)


def exists(path: str) -> bool:
  return os.path.exists(path)


def isdir(path: str) -> bool:
  return os.path.isdir(path)


def makedirs(path: str) -> None:
  os.makedirs(path, exist_ok=True)


def read_text(path: str) -> str | None:
  """The file's text, or None if there is no such file."""
  try:
    with open(path, encoding="utf-8") as f:
      return f.read()
  except FileNotFoundError:
    return None


def write_text(path: str, text: str) -> None:
  """Replaces `path` by `text` atomically (temporary file + rename)."""
  folder = os.path.dirname(os.path.abspath(path))
  os.makedirs(folder, exist_ok=True)
  tmp = os.path.join(folder, f".{os.path.basename(path)}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")
  fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)  # (The umask applies.)
  try:
    with os.fdopen(fd, "w", encoding="utf-8") as f:
      f.write(text)
      f.flush()
      os.fsync(f.fileno())
    os.replace(tmp, path)
  except BaseException:
    try:
      os.remove(tmp)
    except OSError:
      pass
    raise


def append_text(path: str, text: str) -> None:
  with open(path, "a", encoding="utf-8") as f:
    f.write(text)
