"""The one path layer: every file lnjax reads or writes in a workdir goes through here, so
a workdir (or cache, or data dir) may be a local path or a bucket URL (`gs://bucket/...`).

Bucket paths go through etils.epath with gcsfs, configured by the standard client
settings alone (credentials from the environment; `STORAGE_EMULATOR_HOST` for an
emulator). Orbax reaches gs:// checkpoints through tensorstore by itself.

What differs on a bucket, and how this layer hides it:
  - small run files (config.json, summary.json, reports) are written atomically: locally
    to a temporary file then renamed over the target; on a bucket one upload is atomic;
  - GCS has no append: `append_text` rewrites the object whole (metrics.jsonl: one short
    line per log interval, so the cost stays small);
  - folders do not exist on a bucket: `makedirs` is a no-op there and `walk_files` lists
    objects under a prefix; `move` copies then deletes.
Built-in `open()` never works on gs://: use `read_bytes`/`write_bytes` here.
"""

import hashlib
import json
import os
import shutil
import socket
import threading
import urllib.parse
import uuid


def is_remote(path: str) -> bool:
  """True for a bucket URL (gs://...), False for a local path."""
  return "://" in str(path)


def _remote(path: str):
  from etils import epath  # (gcsfs is imported on the first bucket path only)
  if str(path).startswith("gs://"):
    _require_reachable(storage_endpoint(), path)
  return epath.Path(path)


PROBE_SECONDS = 10.0  # How long the first bucket access waits for the storage endpoint.
_reachable: set[str] = set()


def storage_endpoint() -> str:
  """The URL gs:// paths go to: STORAGE_EMULATOR_HOST (an emulator) or Google's."""
  host = os.environ.get("STORAGE_EMULATOR_HOST", "").strip()
  if not host:
    return "https://storage.googleapis.com"
  return host if "://" in host else f"http://{host}"


def _require_reachable(endpoint: str, path: str) -> None:
  """One connection to `endpoint` (within PROBE_SECONDS, name lookup included) before a
  process's first bucket access: with no network, gcsfs's own retries take about a
  minute and end in an error that names neither the bucket nor the endpoint."""
  if endpoint in _reachable:
    return
  url = urllib.parse.urlsplit(endpoint)
  address = (url.hostname, url.port or (443 if url.scheme == "https" else 80))
  outcome = []

  def connect():
    try:
      socket.create_connection(address, timeout=PROBE_SECONDS).close()
      outcome.append("")
    except OSError as e:
      outcome.append(e.strerror or str(e) or type(e).__name__)

  probe = threading.Thread(target=connect, daemon=True)  # (A name lookup has no timeout.)
  probe.start()
  probe.join(PROBE_SECONDS)
  why = outcome[0] if outcome else f"no answer in {PROBE_SECONDS:.0f} s"
  if why:
    from lnjax.core import errors
    raise errors.LnjaxError(f"{path}: the storage endpoint {endpoint} is not reachable "
                            f"({why}); check the network (or STORAGE_EMULATOR_HOST)")
  _reachable.add(endpoint)


def abspath(path: str) -> str:
  return str(path) if is_remote(path) else os.path.abspath(path)


def join(*parts: str) -> str:
  return os.path.join(*parts)


def exists(path: str) -> bool:
  return _remote(path).exists() if is_remote(path) else os.path.exists(path)


def isdir(path: str) -> bool:
  return _remote(path).is_dir() if is_remote(path) else os.path.isdir(path)


def makedirs(path: str) -> None:
  if not is_remote(path):
    os.makedirs(path, exist_ok=True)


def read_bytes(path: str) -> bytes | None:
  """The file's bytes, or None if there is no such file."""
  try:
    if is_remote(path):
      return _remote(path).read_bytes()
    with open(path, "rb") as f:
      return f.read()
  except FileNotFoundError:
    return None


def read_text(path: str) -> str | None:
  """The file's text, or None if there is no such file."""
  data = read_bytes(path)
  return None if data is None else data.decode("utf-8")


def write_bytes(path: str, data: bytes) -> None:
  """Replaces `path` by `data` atomically (temporary file + rename; one upload)."""
  if is_remote(path):
    _remote(path).write_bytes(data)
    return
  folder = os.path.dirname(os.path.abspath(path))
  os.makedirs(folder, exist_ok=True)
  tmp = os.path.join(folder, f".{os.path.basename(path)}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")
  fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)  # (The umask applies.)
  try:
    with os.fdopen(fd, "wb") as f:
      f.write(data)
      f.flush()
      os.fsync(f.fileno())
    os.replace(tmp, path)
  except BaseException:
    try:
      os.remove(tmp)
    except OSError:
      pass
    raise


def check_output_file(flag: str, path: str) -> None:
  """Before a long computation whose result goes to the file `path`: refuses, in one
  errors.ConfigError line, a path that is not (or does not lead to) a regular file and one
  whose folder cannot be made or written. (write_bytes renames over its target, which would
  replace a device such as /dev/full.) The folder is made; a bucket path is not checked."""
  from lnjax.core import errors

  if is_remote(path):
    return
  if os.path.lexists(path) and not os.path.isfile(path):
    raise errors.ConfigError(f"{flag}={path} is not a regular file: name a file to write")
  folder = os.path.dirname(os.path.realpath(path))
  if os.path.exists(folder) and not os.path.isdir(folder):
    raise errors.ConfigError(f"{flag}={path}: {folder} is a file, not a folder")
  try:
    os.makedirs(folder, exist_ok=True)
    probe = os.path.join(folder, f".{os.path.basename(path)}.{os.getpid()}.probe")
    os.close(os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
    os.remove(probe)
  except OSError as e:
    raise errors.ConfigError(f"{flag}={path} cannot be written: {e.strerror or e}") from None


def write_text(path: str, text: str) -> None:
  write_bytes(path, text.encode("utf-8"))


def json_text(obj, indent: int = 1) -> str:
  """Strict JSON (what jq and JavaScript read): a NaN or ±inf float, which Python's json
  writes as the bare words NaN and Infinity, becomes null."""
  import math

  def finite(x):
    if isinstance(x, float):
      return x if math.isfinite(x) else None
    if isinstance(x, dict):
      return {k: finite(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
      return [finite(v) for v in x]
    return x
  return json.dumps(finite(obj), indent=indent, allow_nan=False)


def append_text(path: str, text: str) -> None:
  if is_remote(path):  # No append on GCS: the object is rewritten whole.
    write_text(path, (read_text(path) or "") + text)
    return
  with open(path, "a", encoding="utf-8") as f:
    f.write(text)


def sha256(path: str) -> str:
  """SHA-256 of a file's bytes, read in chunks."""
  digest = hashlib.sha256()
  with (_remote(path).open("rb") if is_remote(path) else open(path, "rb")) as f:
    for chunk in iter(lambda: f.read(1 << 20), b""):
      digest.update(chunk)
  return digest.hexdigest()


def remove(path: str) -> None:
  if is_remote(path):
    _remote(path).unlink()
  else:
    os.remove(path)


def walk_files(root: str) -> list[str]:
  """Paths of every file under `root`, relative to it, sorted."""
  if not is_remote(root):
    return sorted(os.path.relpath(os.path.join(folder, f), root)
                  for folder, _, files in os.walk(root) for f in files)
  out, stack = [], [(_remote(root), "")]
  while stack:  # (etils refuses ** globs on buckets: walk level by level.)
    folder, prefix = stack.pop()
    for child in folder.iterdir():
      rel = prefix + child.name
      if child.is_dir():
        stack.append((child, rel + "/"))
      else:
        out.append(rel)
  return sorted(out)


def rmtree(path: str) -> None:
  if is_remote(path):
    _remote(path).rmtree()
  else:
    shutil.rmtree(path)


def copy_tree(src: str, dst: str) -> None:
  """Copies every file under `src` (local or bucket) to `dst` (local or bucket)."""
  for rel in walk_files(src):
    write_bytes(join(dst, rel), read_bytes(join(src, rel)))


def move(src: str, dst: str) -> None:
  """Moves a file or folder (across buckets and disks too)."""
  if not is_remote(src) and not is_remote(dst):
    os.makedirs(os.path.dirname(os.path.abspath(dst)), exist_ok=True)
    shutil.move(src, dst)
    return
  copy_tree(src, dst)
  rmtree(src)


# A run's own files and folders in its workdir (what training writes and resumes from;
# averaged_from.json: an averaged run; finetune_config.json, seeds/: a fine-tuning driver's,
# sweep.json, log.txt, .lock: a sweep's and its runs').
RUN_FILES = ("config.json", "summary.json", "metrics.jsonl", "checkpoints", "best_checkpoint",
             "corrupt_checkpoints", "tensorboard", "profile", "wandb", ".lnjax.lock",
             "averaged_from.json", "finetune_config.json", "seeds", "sweep.json", "log.txt",
             ".lock")
# Folders of runs: the file that marks one, and the sub-folder its runs are in ("" = the
# folder itself): a sweep's root, a fine-tuning driver's seeds/, a stability search's runs/.
CONTAINERS = {"sweep.json": "", "finetune_config.json": "seeds", "search.json": "runs"}
# What marks a folder as a run's workdir (an export's config.json holds "lnjax_config").
_RUN_MARKS = ("summary.json", "metrics.jsonl", "checkpoints", *CONTAINERS)


def is_run_workdir(path: str) -> bool:
  """Whether `path` holds a run (a training run, an average, a fine-tuning, a sweep or a
  stability search)."""
  if any(exists(join(path, mark)) for mark in _RUN_MARKS):
    return True
  text = read_text(join(path, "config.json")) if isdir(path) else None
  return text is not None and '"lnjax_config"' not in text


def resolve(path: str) -> str:
  """The path the guard compares: symbolic links resolved (a link to a run's checkpoints/ is
  that folder); a bucket URL, which has no links, with '.', '..' and '//' folded."""
  if not is_remote(path):
    return os.path.realpath(path)
  scheme, rest = str(path).split("://", 1)
  return f"{scheme}://{os.path.normpath('/' + rest).lstrip('/')}"


def _folders_up(path: str):
  """`path`, then every folder above it, up to the root (or the bucket)."""
  while True:
    yield path
    parent = os.path.dirname(path)
    if parent == path or (is_remote(path) and not is_remote(parent)):
      return
    path = parent


def _runs_folder(folder: str) -> str | None:
  """The sub-folder a folder of runs keeps its runs in ("": itself); None: not one."""
  return next((sub for mark, sub in CONTAINERS.items() if exists(join(folder, mark))), None)


def refuse_run_files(flag: str, value: str, targets: list[str], own=()) -> None:
  """The one guard of every command's output and workdir: no command writes into a run that
  is not its own. Each of `targets` (what the command given `flag`=`value` would write),
  its symbolic links resolved, may not be
    - a run's folder, unless one of `own` (train resuming its workdir, a sweep its root);
    - inside a run's own files (RUN_FILES: checkpoints/, metrics.jsonl, ... of any run);
    - inside the folder of a run not in `own` (analyze writes analysis/ into the run it
      reads; a folder of runs, CONTAINERS, takes new runs where it keeps its own).
  A refusal is one line (errors.WorkdirError, exit 2) before anything is written."""
  from lnjax.core import errors

  owned = {resolve(o) for o in own}
  for target in targets:
    path = resolve(target)
    for folder in _folders_up(path):
      if not is_run_workdir(folder):
        continue
      rel = path[len(folder):].lstrip("/") or "."
      first, runs_in = rel.split("/")[0], _runs_folder(folder)
      if rel == ".":
        if folder in owned:
          continue
        what = "is the folder of"
      elif runs_in is not None and (first == runs_in if runs_in else first not in RUN_FILES):
        continue  # A run where a folder of runs keeps them (checked as a run itself).
      elif first in RUN_FILES:
        what = f"would write {rel} of"
      elif folder not in owned:
        what = "is inside"
      else:
        continue
      raise errors.WorkdirError(
          f"{flag}={value} {what} the run in {folder}: a run's own files are never "
          "overwritten; choose an output outside them (a new folder)")
