"""TFDS builders for the German-English translation corpora, as array_record.

Like `lnjax.data.builders` (whose machinery these builders reuse): written
without TensorFlow (``GeneratorBasedBuilder`` + ``file_format="array_record"``
+ ``as_data_source()``), generated under ``<cache dir>/tfds/src-<fingerprint>/
<name>/<version>`` keyed by a hash of the raw files, and the raw data dir is
only read.

Every example is ``{'de': str, 'en': str, 'index': int64}``: one line of the
``.de`` file, the same line of the ``.en`` file, and the line number. TFDS
shuffles examples when writing, so ``index`` restores the file order. Lines are
kept verbatim (only the line break, ``\\n`` or ``\\r\\n``, is removed).

Corpora (under the data dir, see `lnjax.data.paths`):

* ``multi30k_de_en``: ``multi30k/{train,val,test_2016_flickr,test_2017_flickr,
  test_2017_mscoco,test_2018_flickr}.{de,en}.gz``: raw, cased, untokenized
  image captions (29,000 / 1,014 / 1,000 / 1,000 / 461 / 1,071 pairs). TFDS
  split names: train, validation (= ``val``), and the test sets by file name.
* ``iwslt14_de_en``: fairseq's ``prepare-iwslt14.sh`` output: Moses-tokenized,
  lowercased TED talks. validation (7,283) and test (6,750) are read from
  ``iwslt14_de-en/fairseq_tok/{valid,test}.{de,en}.gz``. The training split
  (160,239 pairs) is not distributed with the data dir: the user copies
  fairseq's ``iwslt14.tokenized.de-en/tmp/train.{de,en}`` (plain or gzipped)
  into ``iwslt14_de-en/fairseq_tok/``. Without it the builder still prepares
  validation and test; asking for train raises `DataError` saying how to get
  it (`require_split`).
* ``wmt14_de_en``: test = newstest2014 (3,003 pairs, the "full" set), from
  ``wmt14_newstest2014_de-en/newstest2014.{de,en}.gz``; train (optional) from
  ``wmt14_de-en/train.{de,en}[.gz]``, plain text, one sentence per line.

  Getting WMT14 training text: ``python -m lnjax.cli.prepare wmt14_en_de
  --manual_dir=DIR`` writes it from the three WMT14 training archives
  (Europarl v7, Common Crawl, News Commentary v9) downloaded into DIR. The
  TFDS catalog has the same text as
  ``tfds.builder("wmt14_translate/de-en")`` (~4.5M pairs; Europarl v7, Common
  Crawl and News Commentary v9, the set of Vaswani et al. 2017), but that
  builder needs TensorFlow for its own preparation, which lnjax never imports.
  So prepare it on another machine / environment that has TensorFlow and
  network access, e.g.::

      import tensorflow_datasets as tfds
      ds = tfds.load("wmt14_translate/de-en", split="train")
      with open("train.de", "w") as de, open("train.en", "w") as en:
        for ex in tfds.as_numpy(ds):
          # one sentence per line: newlines inside a sentence become spaces
          de.write(" ".join(ex["de"].decode().split()) + "\\n")
          en.write(" ".join(ex["en"].decode().split()) + "\\n")

  and copy ``train.de``/``train.en`` (optionally gzipped) to
  ``<data dir>/wmt14_de-en/``. Any parallel text in that layout works (e.g.
  the concatenated WMT14 release files). newstest2013 (the usual dev set) is
  not available offline, so the builder has no validation split; evaluate on
  the test split or hold out training data yourself.
"""

from __future__ import annotations

import dataclasses
import gzip
import os
import pathlib
from typing import Any, Iterator

import numpy as np
import tensorflow_datasets as tfds

from lnjax.data import builders
from lnjax.data import paths

LANGS = ("de", "en")

MULTI30K_HOW_TO_GET = (
    "download the Multi30k task 1 raw files from github.com/multi30k/dataset"
    " (data/task1/raw/<split>.{de,en}.gz) into {data_dir}/multi30k/, or point"
    " --config.data.data_dir / LNJAX_DATA_DIR at a folder holding them"
)
IWSLT_HOW_TO_GET = (
    "run fairseq's examples/translation/prepare-iwslt14.sh and copy"
    " iwslt14.tokenized.de-en/tmp/{valid,test}.{de,en} (plain or gzipped) into"
    " {data_dir}/iwslt14_de-en/fairseq_tok/, or point --config.data.data_dir /"
    " LNJAX_DATA_DIR at a folder holding them"
)
IWSLT_TRAIN_HOW_TO_GET = (
    "run `python -m lnjax.cli.prepare iwslt14_de_en` (fairseq's prepare-iwslt14.sh in"
    " Python: downloads the TED archive, writes {train,valid,test}.{de,en}.gz), or copy"
    " fairseq's iwslt14.tokenized.de-en/tmp/train.{de,en} (160,239 lines each; plain or"
    " gzipped) into {data_dir}/iwslt14_de-en/fairseq_tok/"
)
NEWSTEST_HOW_TO_GET = (
    "save WMT14 newstest2014 (the full de-en set, 3,003 lines; e.g."
    " `sacrebleu -t wmt14/full -l de-en --echo src` / `--echo ref`) as"
    " {data_dir}/wmt14_newstest2014_de-en/newstest2014.{de,en}.gz (gzipped or"
    " plain), or point --config.data.data_dir / LNJAX_DATA_DIR at a folder"
    " holding them"
)
WMT_TRAIN_HOW_TO_GET = (
    "write the WMT14 de-en training text, one sentence per line (line i of"
    " train.de translating line i of train.en), to"
    " {data_dir}/wmt14_de-en/train.{de,en} (plain or gzipped): from the WMT14"
    " training archives in a folder, `python -m lnjax.cli.prepare wmt14_en_de"
    " --manual_dir=FOLDER --data_dir={data_dir}` writes them"
)


@dataclasses.dataclass(frozen=True)
class SplitSource:
  """Where one split's parallel files live: ``<subdir>/<stem>.{de,en}[.gz]``.

  ``required=False``: the split is optional (user-supplied); when neither
  file is there the builder simply lacks the split. One file without the
  other is always an error.
  """

  subdir: str
  stem: str
  how_to_get: str
  required: bool = True

  def filename(self, lang: str) -> str:
    return f"{self.stem}.{lang}"


def _split_lines(path: pathlib.Path) -> Iterator[str]:
  """Streams the lines of a (gzipped) UTF-8 file without line breaks.

  Splits on ``\\n`` only (not on the other code points `str.splitlines` treats
  as breaks, such as U+2028, which can occur inside a sentence), so the line
  count matches ``wc -l`` (plus a last line without a newline). Streams so
  that a multi-GB training file never sits in memory whole.
  """
  opener = gzip.open if path.suffix == ".gz" else open
  try:
    with opener(path, "rb") as f:
      for number, raw in enumerate(f, start=1):
        try:
          line = raw.decode("utf-8")
        except UnicodeDecodeError as e:
          raise paths.DataError(
              f"corpus file {path} line {number} is not UTF-8 ({e.reason} at"
              f" byte {e.start}); re-encode the file as UTF-8"
          ) from e
        yield line.rstrip("\n").rstrip("\r")
  except (OSError, EOFError) as e:  # corrupt gzip, permission...
    raise paths.DataError(f"cannot read corpus file {path}: {e}") from e


def count_lines(path: pathlib.Path) -> int:
  return sum(1 for _ in _split_lines(path))


class _ParallelBuilder(builders._TextDocsBuilder, skip_registration=True):
  """A de-en parallel corpus: per split, one ``.de`` and one ``.en`` file with
  the same number of lines. Subclasses set ``SOURCES`` ({TFDS split:
  `SplitSource`}).

  Construction validates the raw files (missing / empty -> `DataError`,
  before anything is written); preparation also checks that both sides of
  every split have the same line count.
  """

  VERSION = tfds.core.Version("1.0.0")
  RELEASE_NOTES = {"1.0.0": "Initial release."}
  SOURCES: dict[str, SplitSource] = {}

  def __init__(self, *, source_dir: str | os.PathLike | None = None, **kwargs: Any):
    self._source_dir = source_dir  # for require_split's message
    self._cache_dir = kwargs.get("cache_dir")
    super().__init__(source_dir=source_dir, **kwargs)
    # The splits whose files were found (required ones always are).
    self.available_splits: tuple[str, ...] = tuple(
        split for split in self.SOURCES
        if f"{split}.{LANGS[0]}" in self.source_files
    )

  @classmethod
  def find_source_files(
      cls, source_dir: str | os.PathLike | None, cache_dir=None, mirror: str | None = None
  ) -> dict[str, pathlib.Path]:
    """{'<split>.<lang>': path}; optional splits only when present.

    `DataError` (from `paths.find_corpus_file`) for a missing or empty file
    of a required split, or for one side of an optional split without the
    other.
    """
    found: dict[str, pathlib.Path] = {}
    for split, src in cls.SOURCES.items():
      if not src.required and not any(
          _exists(source_dir, cache_dir, src.subdir, src.filename(lang)) for lang in LANGS
      ):
        continue  # optional split not supplied
      for lang in LANGS:
        found[f"{split}.{lang}"] = paths.find_corpus_file(
            source_dir, src.subdir, src.filename(lang), src.how_to_get, cache_dir, mirror
        )
    return found

  def _info(self) -> tfds.core.DatasetInfo:
    return tfds.core.DatasetInfo(
        builder=self,
        description=self.DESCRIPTION,
        features=tfds.features.FeaturesDict({
            "de": tfds.features.Text(),
            "en": tfds.features.Text(),
            # Line number (0-based) of the pair in the raw files.
            "index": tfds.features.Scalar(dtype=np.int64),
        }),
        supervised_keys=None,
    )

  def check_line_counts(self, split: str) -> int:
    """Both sides' line count (equal, > 0) or a one-line `DataError`."""
    de_path = self.source_files[f"{split}.de"]
    en_path = self.source_files[f"{split}.en"]
    n_de, n_en = count_lines(de_path), count_lines(en_path)
    if n_de != n_en:
      raise paths.DataError(
          f"corrupt line pair count in {self.name} split {split}: {de_path}"
          f" has {n_de} lines but {en_path} has {n_en}; line i of one file must"
          " be the translation of line i of the other"
      )
    if n_de == 0:  # whitespace-only files are already refused on lookup
      raise paths.DataError(
          f"{self.name} split {split} is empty: {de_path} and {en_path} have"
          " no lines"
      )
    return n_de

  def _split_generators(self, dl_manager):
    del dl_manager  # local files only, nothing is downloaded
    # Check every split before generating any, so a corrupt pair of files
    # fails fast instead of after writing the other splits.
    for split in self.available_splits:
      self.check_line_counts(split)
    return {split: self._generate_examples(split=split) for split in self.available_splits}

  def _generate_examples(self, split: str) -> Iterator[tuple[int, dict]]:
    de_lines = _split_lines(self.source_files[f"{split}.de"])
    en_lines = _split_lines(self.source_files[f"{split}.en"])
    for i, (de, en) in enumerate(zip(de_lines, en_lines)):
      yield i, {"de": de, "en": en, "index": i}

  def require_split(self, split: str) -> None:
    """`DataError` naming the files searched and how to get them, when
    ``split`` is one of this corpus's splits but its files were not found."""
    if split in self.available_splits:
      return
    if split not in self.SOURCES:
      raise paths.DataError(
          f"{self.name} has no split {split!r}; splits: {', '.join(self.SOURCES)}"
      )
    src = self.SOURCES[split]
    candidates = paths.data_dir_candidates(self._source_dir) + [
        paths.download_dir(self._cache_dir)]
    searched = [
        str(base / src.subdir / src.filename(lang)) + suffix
        for base in candidates
        for lang in LANGS
        for suffix in (".gz", "")
    ]
    how = src.how_to_get.replace("{data_dir}", str(candidates[0]))
    raise paths.DataError(
        f"{self.name} {split} split not found; looked for: {', '.join(searched)}."
        f" To get it: {how}"
    )

  def pairs(self, split: str, text_field: str = "", langs=LANGS) -> tuple[list[str], ...]:
    """The split's lines per language in ``langs`` order, in file order
    (`lnjax.data.sources`'s interface)."""
    del text_field
    lines = dict(zip(LANGS, load_split_pairs(self, split)))
    return tuple(lines[lang] for lang in langs)

  @classmethod
  def _raw_filenames(cls) -> list[str]:  # unused: find_source_files is overridden
    return [s.filename(lang) for s in cls.SOURCES.values() for lang in LANGS]


def _exists(source_dir, cache_dir, subdir: str, filename: str) -> bool:
  """Whether ``<subdir>/<filename>[.gz]`` is in any data-dir candidate or the
  download folder."""
  return any(
      (base / subdir / name).is_file()
      for base in paths.data_dir_candidates(source_dir) + [paths.download_dir(cache_dir)]
      for name in (filename + ".gz", filename)
  )


class Multi30kDeEn(_ParallelBuilder, skip_registration=True):
  """Multi30k task 1 (Elliott et al. 2016), German-English image captions,
  raw cased text; train 29,000 pairs, validation 1,014, four test sets."""

  name = "multi30k_de_en"
  HOW_TO_GET = MULTI30K_HOW_TO_GET
  DESCRIPTION = __doc__
  SOURCES = {
      split: SplitSource("multi30k", stem, MULTI30K_HOW_TO_GET)
      for split, stem in [
          ("train", "train"),
          ("validation", "val"),
          ("test_2016_flickr", "test_2016_flickr"),
          ("test_2017_flickr", "test_2017_flickr"),
          ("test_2017_mscoco", "test_2017_mscoco"),
          ("test_2018_flickr", "test_2018_flickr"),
      ]
  }


class Iwslt14DeEn(_ParallelBuilder, skip_registration=True):
  """IWSLT'14 German-English TED talks in fairseq's preparation (Moses-
  tokenized, lowercased): train (user-supplied, 160,239 pairs), validation
  (7,283), test (6,750)."""

  name = "iwslt14_de_en"
  HOW_TO_GET = IWSLT_HOW_TO_GET
  DESCRIPTION = __doc__
  SOURCES = {
      "train": SplitSource(
          "iwslt14_de-en/fairseq_tok", "train", IWSLT_TRAIN_HOW_TO_GET, required=False
      ),
      "validation": SplitSource("iwslt14_de-en/fairseq_tok", "valid", IWSLT_HOW_TO_GET),
      "test": SplitSource("iwslt14_de-en/fairseq_tok", "test", IWSLT_HOW_TO_GET),
  }


class Wmt14DeEn(_ParallelBuilder, skip_registration=True):
  """WMT14 German-English: train (user-supplied text files) and test =
  newstest2014 (full, 3,003 pairs)."""

  name = "wmt14_de_en"
  HOW_TO_GET = NEWSTEST_HOW_TO_GET
  DESCRIPTION = __doc__
  SOURCES = {
      "train": SplitSource("wmt14_de-en", "train", WMT_TRAIN_HOW_TO_GET, required=False),
      "test": SplitSource("wmt14_newstest2014_de-en", "newstest2014", NEWSTEST_HOW_TO_GET),
  }


MT_BUILDERS: dict[str, type[_ParallelBuilder]] = {
    b.name: b for b in (Multi30kDeEn, Iwslt14DeEn, Wmt14DeEn)
}
# Every split each corpus can have (optional ones included).
MT_SPLITS: dict[str, tuple[str, ...]] = {
    name: tuple(b.SOURCES) for name, b in MT_BUILDERS.items()
}


def prepare(
    name: str,
    data_dir: str | os.PathLike | None = None,
    cache_dir: str | os.PathLike | None = None,
    mirror: str | None = None,
) -> _ParallelBuilder:
  """Builds (first call) or reopens (later calls) translation corpus ``name``
  with the splits whose files are present (downloading those with a public
  URL)."""
  if name not in MT_BUILDERS:
    raise ValueError(f"unknown dataset {name!r}; valid: {', '.join(MT_BUILDERS)}")
  return builders.prepared(lambda: MT_BUILDERS[name](source_dir=data_dir, cache_dir=cache_dir,
                                                     mirror=mirror))


def load_split_pairs(builder: _ParallelBuilder, split: str) -> tuple[list[str], list[str]]:
  """(de lines, en lines) of ``split`` in original file order.

  `DataError` when the split's files were not supplied (`require_split`).
  """
  builder.require_split(split)
  source = builder.as_data_source()[split]
  records = source.__getitems__(range(len(source)))
  records.sort(key=lambda r: int(r["index"]))
  de = [r["de"].decode("utf-8") for r in records]
  en = [r["en"].decode("utf-8") for r in records]
  return de, en
