"""Where a data set comes from: lnjax's built-in corpora, the TFDS catalog, or Hugging Face.

``data.name`` picks the source:

  tiny_shakespeare, multi30k_de_en, ...   a built-in corpus (`builders`, `mt_builders`):
                                          local files, downloaded with a checksum on first use
  tfds:NAME[/CONFIG][:VERSION]            any TFDS catalog data set, read as array_record
                                          with `tfds.data_source` (no TensorFlow at training
                                          time), from ``data.tfds_data_dir`` (may be gs://)
  hf:PATH[:CONFIG]                        a Hugging Face data set: a folder written by
                                          ``save_to_disk``, or a hub/local data set for
                                          ``datasets.load_dataset``

Every source answers the same four questions the pipelines ask: its ``fingerprint``
(keys the token and tokenizer caches), ``available_splits``, ``require_split(split)``
(a one-line `DataError` when absent) and the split's text: ``texts(split)`` for a
language model, ``pairs(split)`` (de lines, en lines) for translation. The built-in
builders answer them themselves; `TfdsSource` and `HfSource` wrap the two libraries.

Feature names: a language model reads the string feature ``data.text_field`` ("text",
as in lm1b); translation reads the features named by the language codes ("de", "en",
as in ``wmt14_translate/de-en``), nested under ``data.text_field`` when that is set
(Hugging Face's ``{"translation": {"de": ..., "en": ...}}``).
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import os
import re
import socket
import urllib.parse
from typing import Any, Sequence

from lnjax.data import paths

TFDS_PREFIX, HF_PREFIX = "tfds:", "hf:"


def is_external(name: str) -> bool:
  """Whether ``data.name`` names a TFDS or Hugging Face data set."""
  return isinstance(name, str) and name.startswith((TFDS_PREFIX, HF_PREFIX))


def _one_line(e: BaseException) -> str:
  return f"{type(e).__name__}: {' '.join(str(e).split())[:300]}"


def _decode(value) -> str:
  return value.decode("utf-8") if isinstance(value, bytes) else str(value)


class _External:
  """Shared part: split bookkeeping and feature lookup."""

  name: str
  fingerprint: str
  available_splits: tuple[str, ...]

  def require_split(self, split: str) -> None:
    if split not in self.available_splits:
      raise paths.DataError(
          f"{self.name} has no split {split!r}; its splits: {', '.join(self.available_splits)}")

  def _records(self, split: str) -> Sequence[dict]:
    raise NotImplementedError

  def _field(self, record: dict, key: str, split: str):
    if key not in record:
      raise paths.DataError(
          f"{self.name} split {split} has no feature {key!r}; its features:"
          f" {', '.join(map(str, record))} (set data.text_field)")
    return record[key]

  def texts(self, split: str, text_field: str = "text") -> list[str]:
    """The split's documents, in the source's order."""
    self.require_split(split)
    return [_decode(self._field(r, text_field, split)) for r in self._records(split)]

  def pairs(self, split: str, text_field: str = "", langs=("de", "en")) -> tuple[list[str], ...]:
    """(lines of langs[0], lines of langs[1]) of the split, in the source's order."""
    self.require_split(split)
    out: tuple[list[str], ...] = tuple([] for _ in langs)
    for r in self._records(split):
      if text_field:
        r = self._field(r, text_field, split)
      for lang, lines in zip(langs, out):
        lines.append(_decode(self._field(r, lang, split)))
    return out


class TfdsSource(_External):
  """A TFDS catalog data set (``tfds:NAME[/CONFIG][:VERSION]``), prepared as
  array_record in ``data_dir`` (TFDS's default, ``~/tensorflow_datasets``, when None).

  A data set not prepared there is prepared with TFDS's own download manager; when
  that fails (offline, or a builder that needs TensorFlow or Beam), the one-line error
  says how to prepare it elsewhere and where to put it.
  """

  def __init__(self, spec: str, data_dir: str | None = None):
    import tensorflow_datasets as tfds

    self.name = TFDS_PREFIX + spec
    try:
      with paths.tfds_scratch():
        builder = tfds.builder(spec, data_dir=data_dir, file_format="array_record")
    except Exception as e:  # DatasetNotFoundError, a bad config or version
      # Without TensorFlow, TFDS leaves the builders that need it out of its catalog.
      hint = ("; TFDS registers its TensorFlow builders (wmt*_translate, ...) only with"
              " TensorFlow: pip install lnjax[tfds-build]"
              if importlib.util.find_spec("tensorflow") is None else "")
      raise paths.DataError(f"{self.name}: not a TFDS data set ({_one_line(e)[:200]}){hint}") from None
    if not builder.is_prepared():
      from lnjax.data import download

      if importlib.util.find_spec("tensorflow") is None:
        # TFDS's catalog builders (lm1b, wmt*_translate, ...) read their sources with
        # tf.io; reading a prepared array_record data set needs no TensorFlow.
        raise paths.DataError(
            f"{self.name} is not prepared in {builder.data_dir}, and preparing it needs"
            " TensorFlow, which is not installed: pip install lnjax[tfds-build] (or prepare"
            f" it elsewhere with `tfds build {spec} --file_format=array_record"
            " --data_dir=DIR` and set data.tfds_data_dir (or TFDS_DATA_DIR) to DIR)")
      if download.offline():
        raise paths.DataError(
            f"{self.name} is not prepared in {builder.data_dir} and downloads are off"
            f" ({download.OFFLINE_ENV} is set); prepare it with `tfds build {spec}"
            " --file_format=array_record --data_dir=DIR` and set data.tfds_data_dir"
            " (or TFDS_DATA_DIR) to DIR")
      tfds.disable_progress_bar()
      try:
        builder.download_and_prepare(file_format="array_record")
      except Exception as e:
        raise paths.DataError(
            f"{self.name} is not prepared in {builder.data_dir} and could not be prepared"
            f" here ({_one_line(e)}); prepare it where its source is reachable with"
            f" `tfds build {spec} --file_format=array_record --data_dir=DIR` and set"
            " data.tfds_data_dir (or TFDS_DATA_DIR) to DIR") from None
    self._builder = builder
    self._sources: dict[str, Any] = {}
    info = builder.info
    self.available_splits = tuple(sorted(info.splits.keys()))
    key = [self.name, str(info.version)] + [
        f"{s}:{info.splits[s].num_examples}" for s in self.available_splits]
    self.fingerprint = hashlib.sha256("|".join(key).encode()).hexdigest()[:12]

  def _records(self, split: str):
    if split not in self._sources:
      self._sources[split] = self._builder.as_data_source(split=split)
    source = self._sources[split]
    return source.__getitems__(range(len(source)))


class HfSource(_External):
  """A Hugging Face data set (``hf:PATH[:CONFIG]``): a ``save_to_disk`` folder
  (local or on a bucket), else ``datasets.load_dataset(PATH, CONFIG)`` (the hub,
  with its cache and ``HF_DATASETS_OFFLINE``)."""

  def __init__(self, spec: str):
    import datasets

    self.name = HF_PREFIX + spec
    path, _, config = spec.partition(":")
    datasets.disable_progress_bars()
    try:
      if os.path.isdir(path) and (
          os.path.exists(os.path.join(path, "dataset_dict.json"))
          or os.path.exists(os.path.join(path, "dataset_info.json"))):
        loaded = datasets.load_from_disk(path)
      else:
        unreachable = _hub_unreachable()
        with _hub_offline(bool(unreachable)):
          loaded = datasets.load_dataset(path, config or None)
    except Exception as e:
      where = (f"; the hub is not reachable ({unreachable}): only the local Hugging Face "
               "cache was searched" if unreachable else "")
      raise paths.DataError(f"{self.name}: cannot load the Hugging Face data set "
                            f"({_one_line(e)}){where}") from None
    if isinstance(loaded, datasets.Dataset):  # a single split saved on its own
      loaded = datasets.DatasetDict({"train": loaded})
    self._dict = loaded
    self.available_splits = tuple(sorted(loaded.keys()))
    key = [self.name] + [f"{s}:{loaded[s]._fingerprint}" for s in self.available_splits]
    self.fingerprint = hashlib.sha256("|".join(key).encode()).hexdigest()[:12]

  def _records(self, split: str):
    return self._dict[split]


HUB_PROBE_SECONDS = 3.0  # One connection attempt to the hub before any download.


def _hub_unreachable() -> str:
  """Why the Hugging Face hub cannot be used ("" if it can): downloads turned off, or no
  connection to HF_ENDPOINT within HUB_PROBE_SECONDS. (Unprobed, an unreachable hub costs
  huggingface_hub's retries: 23 warning lines over ~26 s before the error.)"""
  from lnjax.data import download

  if download.offline() or os.environ.get("HF_HUB_OFFLINE", "0") not in ("", "0"):
    return "downloads are off"
  url = urllib.parse.urlsplit(os.environ.get("HF_ENDPOINT") or "https://huggingface.co")
  try:
    socket.create_connection((url.hostname, url.port or (443 if url.scheme == "https" else 80)),
                             timeout=HUB_PROBE_SECONDS).close()
  except OSError as e:
    return f"{url.scheme}://{url.netloc}: {e.strerror or type(e).__name__}"
  return ""


@contextlib.contextmanager
def _hub_offline(offline: bool):
  """datasets and huggingface_hub reading their cache only (no request, no retry)."""
  import datasets.config
  import huggingface_hub.constants as hub

  saved = datasets.config.HF_HUB_OFFLINE, hub.HF_HUB_OFFLINE
  if offline:
    datasets.config.HF_HUB_OFFLINE = hub.HF_HUB_OFFLINE = True
  try:
    yield
  finally:
    datasets.config.HF_HUB_OFFLINE, hub.HF_HUB_OFFLINE = saved


def cache_name(name: str) -> str:
  """``data.name`` as a file-name part of cache entries (``tfds:lm1b`` -> ``tfds_lm1b``)."""
  return re.sub(r"[^A-Za-z0-9_.-]+", "_", name)


def open_external(name: str, tfds_data_dir: str | None = None) -> _External:
  """The source for a ``tfds:`` or ``hf:`` name."""
  if name.startswith(TFDS_PREFIX):
    return TfdsSource(name[len(TFDS_PREFIX):], tfds_data_dir)
  return HfSource(name[len(HF_PREFIX):])


def check_name(name: str, field: str, builtin: Sequence[str]) -> None:
  """`ConfigError` unless ``name`` is a built-in corpus or a well-formed
  ``tfds:``/``hf:`` name."""
  from lnjax.core import errors

  if is_external(name) and name.partition(":")[2]:
    return
  if name not in builtin:
    raise errors.ConfigError(
        f"{field}={name!r} is not one of: {', '.join(builtin)}, tfds:NAME[/CONFIG],"
        " hf:PATH[:CONFIG]")
