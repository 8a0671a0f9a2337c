"""Where raw corpora are read from and where generated data is written.

Two directories matter:

* the *data dir* holds the raw corpora as downloaded (``tiny_shakespeare/
  input.txt.gz``, ``wikitext-2-raw/train.txt.gz`` ...). It may be read-only, so
  nothing is ever written there.
* the *cache dir* holds everything we generate from them: TFDS array_record
  files, trained tokenizer models and cached token arrays.

Where a corpus file ``<subdir>/<filename>`` is looked for, in order:

1. the data dir: the configured value or ``LNJAX_DATA_DIR`` when set (then
   only there); otherwise the corpora shipped inside the package
   (``lnjax/data/corpora``: tiny_shakespeare, the embedded default). No other
   folder is searched: a run reads the same files wherever it is started;
2. the download folder ``<cache dir>/downloads``;
3. a download from the file's public URL (`lnjax.data.download`), verified
   against the sha256 kept there, into the download folder.

The cache dir: configured value, ``LNJAX_CACHE_DIR``, else ``~/.cache/lnjax``.
"""

from __future__ import annotations

import contextlib
import fcntl
import gzip
import hashlib
import os
import pathlib
import shutil
import tempfile
from typing import Iterator, Sequence

from lnjax.core import errors, fileio
from lnjax.data import download

DATA_DIR_ENV = "LNJAX_DATA_DIR"
CACHE_DIR_ENV = "LNJAX_CACHE_DIR"

# Corpora shipped as package data (each folder with its README and licence).
EMBEDDED_DIR = pathlib.Path(__file__).resolve().parent / "corpora"


class DataError(errors.LnjaxError):
  """A corpus is missing or unusable. The message is one line saying which
  paths were searched and how to obtain the data."""


def _default_data_dirs() -> list[pathlib.Path]:
  """The corpora shipped in the package (a data dir nobody configured)."""
  return [EMBEDDED_DIR]


def data_dir_candidates(configured: str | os.PathLike | None) -> list[pathlib.Path]:
  """All directories that may hold the raw corpora, in priority order.

  An explicitly configured directory (argument or environment variable) is the
  only candidate: when the user names a place, silently reading another one
  would hide mistakes.
  """
  if configured:
    return [pathlib.Path(configured).expanduser()]
  env = os.environ.get(DATA_DIR_ENV)
  if env:
    return [pathlib.Path(env).expanduser()]
  return _default_data_dirs()


def resolve_data_dir(configured: str | os.PathLike | None = None) -> pathlib.Path:
  """The directory holding raw corpora (see the module docstring for order).

  Returns the first candidate that exists, or the first candidate when none
  does (the corpus lookup then raises `DataError` listing every candidate).
  """
  candidates = data_dir_candidates(configured)
  for c in candidates:
    if c.is_dir():
      return c
  return candidates[0]


def resolve_cache_dir(configured: str | os.PathLike | None = None) -> pathlib.Path:
  """Writable directory for generated data: configured, LNJAX_CACHE_DIR, or
  ~/.cache/lnjax. Created if missing."""
  if configured:
    path, what = pathlib.Path(configured).expanduser(), "data.cache_dir"
  elif os.environ.get(CACHE_DIR_ENV):
    path, what = pathlib.Path(os.environ[CACHE_DIR_ENV]).expanduser(), CACHE_DIR_ENV
  else:
    path, what = pathlib.Path.home() / ".cache" / "lnjax", "the default cache dir"
  try:
    path.mkdir(parents=True, exist_ok=True)
  except (FileExistsError, NotADirectoryError):
    raise DataError(f"cache dir {path} ({what}) is not a directory; point {what} at a folder") from None
  except OSError as e:
    raise DataError(f"cannot create cache dir {path} ({what}): {e.strerror or e}") from None
  return path


def download_dir(cache_dir: str | os.PathLike | None = None) -> pathlib.Path:
  """Where downloaded corpus files go: ``<cache dir>/downloads/<subdir>/``."""
  return resolve_cache_dir(cache_dir) / "downloads"


def find_corpus_file(
    data_dir: str | os.PathLike | None,
    subdir: str,
    filename: str,
    how_to_get: str,
    cache_dir: str | os.PathLike | None = None,
    mirror: str | None = None,
) -> pathlib.Path:
  """Finds ``<subdir>/<filename>[.gz]`` (see the module docstring for the
  order), downloading it when it has a public URL and is nowhere local.

  Prefers the gzipped file, accepts the plain one. Raises `DataError` (one
  line) naming every path searched or the URL that failed, or saying the file
  found is empty. ``how_to_get`` may contain ``{data_dir}``, replaced by the
  first candidate.
  """
  bucket = data_dir or os.environ.get(DATA_DIR_ENV)
  if bucket and fileio.is_remote(str(bucket)):
    return _stage_from_bucket(str(bucket), subdir, filename, cache_dir, how_to_get)
  candidates = data_dir_candidates(data_dir) + [download_dir(cache_dir)]
  how_to_get = how_to_get.replace("{data_dir}", str(candidates[0]))
  searched: list[str] = []
  for base in candidates:
    for name in (filename + ".gz", filename):
      path = base / subdir / name
      searched.append(str(path))
      if path.is_file():
        if is_empty_text_file(path):
          raise DataError(
              f"{subdir} corpus file {path} is empty (no text); replace it"
              f" with the real file. To get it: {how_to_get}"
          )
        return path
  try:
    fetched = download.fetch(subdir, filename, download_dir(cache_dir), mirror)
  except download.DownloadError as e:
    raise DataError(
        f"{subdir} corpus file {filename} not found in {', '.join(map(str, candidates))}; {e}"
    ) from None
  if fetched is not None:
    return fetched
  raise DataError(
      f"{subdir} corpus file not found; looked for: {', '.join(searched)}"
      f" (data dirs searched: {', '.join(map(str, candidates))}). To get it:"
      f" {how_to_get}"
  )


def _stage_from_bucket(bucket: str, subdir: str, filename: str, cache_dir,
                       how_to_get: str) -> pathlib.Path:
  """A data dir on a bucket (gs://...): ``<subdir>/<filename>[.gz]`` copied once into
  ``<cache dir>/buckets/<bucket path>/`` and read from there."""
  searched = []
  for name in (filename + ".gz", filename):
    remote = f"{bucket.rstrip('/')}/{subdir}/{name}"
    searched.append(remote)
    local = resolve_cache_dir(cache_dir) / "buckets" / remote.replace("://", "/", 1)
    if not local.is_file():
      data = fileio.read_bytes(remote)
      if data is None:
        continue
      fileio.write_bytes(str(local), data)
    if is_empty_text_file(local):
      raise DataError(f"{subdir} corpus file {remote} is empty (no text); replace it with the"
                      f" real file. To get it: {how_to_get.replace('{data_dir}', bucket)}")
    return local
  raise DataError(f"{subdir} corpus file not found; looked for: {', '.join(searched)}. To get"
                  f" it: {how_to_get.replace('{data_dir}', bucket)}")


def is_empty_text_file(path: pathlib.Path) -> bool:
  """True for a 0-byte or whitespace-only file (gzipped or plain)."""
  if path.stat().st_size == 0:
    return True
  return not read_text(path).strip()


def read_text(path: str | os.PathLike) -> str:
  """Reads a UTF-8 text file, gunzipping ``*.gz``. Newlines are kept verbatim
  (no universal-newline translation) so documents round-trip byte-exactly."""
  path = pathlib.Path(path)
  try:
    if path.suffix == ".gz":
      with gzip.open(path, "rb") as f:
        data = f.read()
    else:
      data = path.read_bytes()
  except (OSError, EOFError) as e:  # corrupt gzip, permission...
    raise DataError(f"cannot read corpus file {path}: {e}") from None
  try:
    return data.decode("utf-8")
  except UnicodeDecodeError as e:
    raise DataError(
        f"corpus file {path} is not UTF-8 text ({e.reason} at byte {e.start});"
        " re-encode it as UTF-8") from None


def fingerprint_files(paths: Sequence[pathlib.Path]) -> str:
  """Short content hash of the raw files: keys every cache entry derived from
  them, so replacing a corpus can never silently reuse stale prepared data."""
  h = hashlib.sha256()
  for p in paths:
    h.update(p.name.encode())
    h.update(b"\0")
    h.update(p.read_bytes())  # hashing the (gzipped) bytes: ~10 ms for 4 MB
    h.update(b"\0")
  return h.hexdigest()[:12]


TFDS_INCOMPLETE_PREFIX = "incomplete."  # tensorflow_datasets.core.constants.INCOMPLETE_PREFIX


def remove_incomplete(data_dir: str | os.PathLike) -> list[str]:
  """Removes the `incomplete.*` folders beside `data_dir` (TFDS prepares a data set in
  such a folder and renames it when complete: one left there is a killed preparation's).
  Call it holding the preparation's `file_lock`, so that no live preparation owns one.
  Returns the names removed."""
  parent = pathlib.Path(data_dir).parent
  stale = sorted(p for p in parent.glob(TFDS_INCOMPLETE_PREFIX + "*") if p.is_dir())
  for p in stale:
    shutil.rmtree(p, ignore_errors=True)
  return [p.name for p in stale]


@contextlib.contextmanager
def tfds_scratch() -> Iterator[None]:
  """Around the making of a TFDS builder: TFDS 4.9's DatasetBuilder, for a data set not yet
  prepared, makes an empty folder with `tempfile.mkdtemp("tfds")`
  (DatasetInfo.initialize_from_bucket) and never removes it (56 of them in /tmp after
  one run of the test suite, 4.9.10). Made in here, it goes into a folder removed at the end."""
  before = tempfile.tempdir  # (Process-wide: builders are made on the main thread.)
  with tempfile.TemporaryDirectory(prefix="lnjax_tfds_") as scratch:
    tempfile.tempdir = scratch
    try:
      yield
    finally:
      tempfile.tempdir = before


@contextlib.contextmanager
def file_lock(lock_path: pathlib.Path) -> Iterator[None]:
  """Exclusive inter-process lock (several hosts/processes may share a cache
  dir and prepare the same dataset at the same time)."""
  lock_path.parent.mkdir(parents=True, exist_ok=True)
  with open(lock_path, "a") as f:
    fcntl.flock(f, fcntl.LOCK_EX)
    try:
      yield
    finally:
      fcntl.flock(f, fcntl.LOCK_UN)
