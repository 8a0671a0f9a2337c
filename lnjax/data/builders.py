"""TFDS builders for the raw-text LM corpora, stored as array_record.

Written without TensorFlow: ``GeneratorBasedBuilder`` + ``file_format=
"array_record"`` + ``as_data_source()`` only need numpy/array_record.

Every example is ``{'text': str, 'index': int64}``. TFDS shuffles examples by a
hash of their key when writing, so ``index`` (the document's position in the
original file) is what restores the original order: concatenating a split's
texts sorted by ``index`` reproduces that split's text byte for byte.

Documents:
* tiny_shakespeare: one example per paragraph (a speaker turn; paragraphs are
  separated by blank lines, and each keeps its trailing newlines). The corpus
  has no official split: train is the first ~90% of characters, validation the
  rest, cut at the first line boundary at or after 90%.
* wikitext2_raw: one example per article, cut at the top-level headings
  (`` = Title = `` lines; `` = = Section = = `` lines stay inside). The blank
  line before a heading starts the article, so every article reads
  `` \\n = Title = \\n \\n ...``.

Generated files go to ``<cache dir>/tfds/src-<fingerprint>/<name>/<version>``:
the fingerprint is a hash of the raw files, so a changed corpus gets a fresh
build instead of stale data. The raw data dir is never written to.
"""

from __future__ import annotations

import logging
import os
import pathlib
import re
from typing import Any, Callable, Iterator

import numpy as np
import tensorflow_datasets as tfds

from lnjax.data import paths

_log = logging.getLogger(__name__)

SHAKESPEARE_HOW_TO_GET = (
    "download tiny_shakespeare input.txt from github.com/karpathy/char-rnn"
    " (data/tinyshakespeare/input.txt), gzip it to"
    " {data_dir}/tiny_shakespeare/input.txt.gz (plain input.txt also works), or"
    " point --config.data.data_dir / LNJAX_DATA_DIR at a folder holding it"
)
WIKITEXT_HOW_TO_GET = (
    "download WikiText-2 raw v1 (Merity et al. 2016; wikitext-2-raw-v1.zip,"
    " files wiki.{train,valid,test}.raw), save them as"
    " {data_dir}/wikitext-2-raw/{train,valid,test}.txt.gz (gzipped or plain"
    " .txt), or point --config.data.data_dir / LNJAX_DATA_DIR at a folder"
    " holding them"
)

# Fraction of tiny_shakespeare's characters that goes to the train split.
SHAKESPEARE_TRAIN_FRACTION = 0.9


# ---------------------------------------------------------------------------
# Pure text splitting (unit-testable without TFDS).
# ---------------------------------------------------------------------------


def shakespeare_split_point(text: str) -> int:
  """Character offset where validation starts: just after the first newline
  at or after 90% of the text (so neither split starts mid-line)."""
  target = int(len(text) * SHAKESPEARE_TRAIN_FRACTION)
  newline = text.find("\n", target)
  return len(text) if newline < 0 else newline + 1


# A zero-width position right after a blank line ("\n\n") and before the next
# non-newline character: the start of a new paragraph. Splitting there keeps
# all separating newlines at the end of the previous paragraph.
_PARAGRAPH_START = re.compile(r"(?<=\n\n)(?=[^\n])")


def split_paragraphs(text: str) -> list[str]:
  """Splits at blank lines; ``''.join(result) == text``."""
  return [p for p in _PARAGRAPH_START.split(text) if p]


# A top-level wikitext heading: " = Valkyria Chronicles III = " on its own
# line, with a blank (whitespace-only) line before it (or the start of the
# file) and after it. Second-level headings (" = = Gameplay = = ") are excluded
# by the (?!=); the blank-line context excludes table legends such as
# " = Position ; GP = " that sit between ordinary lines.
_TOP_HEADING = re.compile(
    r"(?:\A|(?<=\n))"  # at a line start ...
    r"(?P<blank>[ \t]*\n)?"  # ... of the blank line before the heading
    r"(?P<heading> = (?!=)[^\n]* = *\n)"
    r"(?=[ \t]*(?:\n|\Z))"  # followed by a blank line
)


def split_articles(text: str) -> list[str]:
  """Splits wikitext at top-level headings; ``''.join(result) == text``.

  An article starts at the blank line just before its heading, so the
  separator belongs to the article it introduces. Text before the first
  heading (none in the real files) becomes its own document.
  """
  starts = [
      m.start()
      for m in _TOP_HEADING.finditer(text)
      if m.group("blank") is not None or m.start() == 0
  ]
  bounds = sorted(set([0] + starts + [len(text)]))
  return [text[a:b] for a, b in zip(bounds[:-1], bounds[1:])]


# ---------------------------------------------------------------------------
# Builders.
# ---------------------------------------------------------------------------


class _TextDocsBuilder(tfds.core.GeneratorBasedBuilder, skip_registration=True):
  """Shared part: raw-file lookup, fingerprinted data dir, quiet prepare.

  Args:
    source_dir: the raw data dir (holding ``tiny_shakespeare/`` etc.); None
      uses `paths.resolve_data_dir`'s order.
    cache_dir: root of generated data; only used when ``data_dir`` is not
      given, to default it to ``<cache>/tfds/src-<fingerprint>``.
    **kwargs: passed to TFDS (``data_dir``, ``file_format``...). The file
      format defaults to array_record (random access, no TensorFlow).
  """

  # Bump when the document splitting changes: prepared data is cached per
  # (raw-file fingerprint, version).
  VERSION = tfds.core.Version("1.0.0")
  RELEASE_NOTES = {"1.0.0": "Initial release."}

  # Subclasses: the raw folder, its files (without .gz) per TFDS split, how to
  # get them, and a description.
  SUBDIR: str = ""
  HOW_TO_GET: str = ""
  DESCRIPTION: str = ""

  def __init__(
      self,
      *,
      source_dir: str | os.PathLike | None = None,
      cache_dir: str | os.PathLike | None = None,
      mirror: str | None = None,
      **kwargs: Any,
  ):
    # Resolve (and validate) the raw files first: a missing corpus must fail
    # with DataError before TFDS creates any directory.
    self.source_files = self.find_source_files(source_dir, cache_dir, mirror)
    self.fingerprint = paths.fingerprint_files(list(self.source_files.values()))
    if kwargs.get("data_dir") is None:
      kwargs["data_dir"] = str(self.default_data_dir(cache_dir, self.fingerprint))
    kwargs.setdefault("file_format", "array_record")
    super().__init__(**kwargs)

  @classmethod
  def _raw_filenames(cls) -> list[str]:
    raise NotImplementedError

  @classmethod
  def find_source_files(
      cls, source_dir: str | os.PathLike | None, cache_dir=None, mirror: str | None = None
  ) -> dict[str, pathlib.Path]:
    """{raw file name: path found or downloaded}; `DataError` if missing or empty."""
    return {
        fname: paths.find_corpus_file(source_dir, cls.SUBDIR, fname, cls.HOW_TO_GET,
                                      cache_dir, mirror)
        for fname in cls._raw_filenames()
    }

  @staticmethod
  def default_data_dir(
      cache_dir: str | os.PathLike | None, fingerprint: str
  ) -> pathlib.Path:
    return paths.resolve_cache_dir(cache_dir) / "tfds" / f"src-{fingerprint}"

  # TFDS derives this from the package via importlib.resources, which fails
  # for a namespace package (`lnjax/` may have no __init__.py) without the
  # `importlib_resources` backport. The source file is all it needs (it looks
  # for a checksums file next to it; we download nothing).
  @tfds.core.utils.classproperty
  @classmethod
  def code_path(cls):
    from etils import epath

    return epath.Path(__file__)

  def _info(self) -> tfds.core.DatasetInfo:
    return tfds.core.DatasetInfo(
        builder=self,
        description=self.DESCRIPTION,
        features=tfds.features.FeaturesDict({
            "text": tfds.features.Text(),
            # Position of the document in the original file.
            "index": tfds.features.Scalar(dtype=np.int64),
        }),
        supervised_keys=None,
    )

  def _split_generators(self, dl_manager):
    del dl_manager  # the raw files are found (or downloaded) before this
    splits = self.split_documents()
    for split, docs in splits.items():
      if not "".join(docs).strip():
        sizes = ", ".join(f"{s} {sum(map(len, d)):,}" for s, d in splits.items())
        raise paths.DataError(
            f"{self.name}: the {split} split is empty (characters per split: {sizes}); the"
            f" corpus in {', '.join(map(str, self.source_files.values()))} is too small to"
            " split: use the real file")
    return {split: self._generate_examples(docs=docs) for split, docs in splits.items()}

  def _generate_examples(self, docs: list[str]) -> Iterator[tuple[int, dict]]:
    for i, doc in enumerate(docs):
      yield i, {"text": doc, "index": i}

  def split_documents(self) -> dict[str, list[str]]:
    """{split: documents in file order}, straight from the raw files."""
    raise NotImplementedError

  def texts(self, split: str, text_field: str = "text") -> list[str]:
    """The prepared split's documents in file order (`lnjax.data.sources`'s
    interface; ``text_field`` is the only feature here)."""
    del text_field
    return load_split_texts(self, split)

  # TFDS prints two bold lines to stdout on every preparation; route them to
  # the (quiet by default) Python logger instead.
  def _log_download_bytes(self) -> None:
    _log.info("preparing %s in %s", self.name, self.data_dir)

  def _log_download_done(self) -> None:
    _log.info("prepared %s in %s", self.name, self.data_dir)


# skip_registration: TFDS's own catalog has a (TensorFlow-based)
# `tiny_shakespeare`; ours must not clash with it in the global registry.
class TinyShakespeare(_TextDocsBuilder, skip_registration=True):
  """Tiny Shakespeare (karpathy/char-rnn): train = first ~90%, validation =
  last ~10% of the characters; one example per paragraph."""

  name = "tiny_shakespeare"
  SUBDIR = "tiny_shakespeare"
  HOW_TO_GET = SHAKESPEARE_HOW_TO_GET
  DESCRIPTION = __doc__

  @classmethod
  def _raw_filenames(cls) -> list[str]:
    return ["input.txt"]

  def split_documents(self) -> dict[str, list[str]]:
    text = paths.read_text(self.source_files["input.txt"])
    cut = shakespeare_split_point(text)
    return {
        "train": split_paragraphs(text[:cut]),
        "validation": split_paragraphs(text[cut:]),
    }


class Wikitext2Raw(_TextDocsBuilder, skip_registration=True):
  """WikiText-2 raw v1: train/validation/test; one example per article."""

  name = "wikitext2_raw"
  SUBDIR = "wikitext-2-raw"
  HOW_TO_GET = WIKITEXT_HOW_TO_GET
  DESCRIPTION = __doc__
  # TFDS split name -> raw file name (without .gz).
  SPLIT_FILES = {"train": "train.txt", "validation": "valid.txt", "test": "test.txt"}

  @classmethod
  def _raw_filenames(cls) -> list[str]:
    return list(cls.SPLIT_FILES.values())

  def split_documents(self) -> dict[str, list[str]]:
    return {
        split: split_articles(paths.read_text(self.source_files[fname]))
        for split, fname in self.SPLIT_FILES.items()
    }


BUILDERS: dict[str, type[_TextDocsBuilder]] = {
    TinyShakespeare.name: TinyShakespeare,
    Wikitext2Raw.name: Wikitext2Raw,
}
SPLITS: dict[str, tuple[str, ...]] = {
    "tiny_shakespeare": ("train", "validation"),
    "wikitext2_raw": ("train", "validation", "test"),
}


def prepare(
    name: str,
    data_dir: str | os.PathLike | None = None,
    cache_dir: str | os.PathLike | None = None,
    mirror: str | None = None,
) -> _TextDocsBuilder:
  """Builds (first call) or reopens (later calls) dataset ``name``."""
  if name not in BUILDERS:
    raise ValueError(f"unknown dataset {name!r}; valid: {', '.join(BUILDERS)}")
  return prepared(lambda: BUILDERS[name](source_dir=data_dir, cache_dir=cache_dir,
                                         mirror=mirror))


def prepared(make: Callable[[], tfds.core.DatasetBuilder]) -> tfds.core.DatasetBuilder:
  """The builder `make()` returns, its data set built once under the data dir's lock (a
  killed preparation's folder removed first). Made again under the lock: a builder made
  while another process (a host of a multi-process run, an xdist worker) was still
  preparing the data set knows none of its splits."""
  tfds.disable_progress_bar()  # no tqdm bars in training logs

  def made() -> tfds.core.DatasetBuilder:
    with paths.tfds_scratch():
      return make()

  with paths.file_lock(pathlib.Path(made().data_dir).parent.parent / ".lock"):
    builder = made()
    paths.remove_incomplete(builder.data_dir)
    builder.download_and_prepare()
  return builder


def load_split_texts(builder: _TextDocsBuilder, split: str) -> list[str]:
  """The split's documents in original file order (sorted by ``index``)."""
  source = builder.as_data_source()[split]
  records = source.__getitems__(range(len(source)))
  records.sort(key=lambda r: int(r["index"]))
  return [r["text"].decode("utf-8") for r in records]
