r"""The paper's translation data in one command.

  python -m lnjax.cli.prepare iwslt14_de_en [--archive=de-en.tgz] [--data_dir=DIR]
  python -m lnjax.cli.prepare wmt14_en_de --manual_dir=DIR [--data_dir=DIR]
  python -m lnjax.cli.prepare wmt14_en_de [--tfds_data_dir=DIR]    # needs lnjax[tfds-build]

iwslt14_de_en does what fairseq's examples/translation/prepare-iwslt14.sh does, in Python:
the IWSLT'14 TED De-En archive (``de-en.tgz``: ``train.tags.de-en.{de,en}`` and the
``IWSLT14.TED*.xml`` dev/test sets); training talks without their ``<url>``,
``<talkid>`` and ``<keywords>`` lines and with ``<title>``/``<description>`` tags
removed; Moses tokenization (sacremoses, the Python port of tokenizer.perl); pairs kept
with 1-175 tokens a side and a length ratio of at most 1.5 (clean-corpus-n.perl);
lowercased; validation = every 23rd training pair, train = the rest; test = dev2010,
TEDX dev2012, tst2010, tst2011 and tst2012 concatenated. It writes
``<data dir>/iwslt14_de-en/fairseq_tok/{train,valid,test}.{de,en}.gz``, the layout
configs/iwslt14_de_en.py reads (default data dir: the download folder
``<cache dir>/downloads``, which every run searches). The joint BPE of 10k is learned
by the run itself (SentencePiece BPE, ``data.vocab_size=10000``) on this train split.

wmt14_en_de with ``--manual_dir=DIR`` reads the WMT14 De-En training archives as
statmt.org ships them (http://www.statmt.org/wmt14/translation-task.html), from DIR:
``training-parallel-europarl-v7.tgz`` (``training/europarl-v7.de-en.{de,en}``),
``training-parallel-commoncrawl.tgz`` (``commoncrawl.de-en.{de,en}``) and
``training-parallel-nc-v9.tgz`` (``training/news-commentary-v9.de-en.{de,en}``), the
three parts of TFDS's ``wmt14_translate/de-en`` train split, or the same member paths
already extracted under DIR. The line-aligned pairs, in that order, pairs with an empty
side dropped, go to ``<data dir>/wmt14_de-en/train.{de,en}.gz``, the user-supplied train
split that the built-in ``wmt14_de_en`` reads (its test split, newstest2014, is
downloaded on first use).

Without ``--manual_dir``, wmt14_en_de prepares the TFDS catalog's ``wmt14_translate/de-en``
(the same training data; validation newstest2013, test newstest2014) as array_record in
the TFDS data dir, which configs/wmt14_en_de.py reads (``tfds:wmt14_translate/de-en``).
TFDS's WMT builders need TensorFlow, which lnjax's requirements leave out: the extra
``pip install lnjax[tfds-build]`` provides it.
"""

from __future__ import annotations

import contextlib
import gzip
import io
import itertools
import os
import pathlib
import re
import sys
import tarfile
from typing import Iterable, Sequence

from lnjax.core import fileio
from lnjax.data import download
from lnjax.data import paths
from lnjax.data import tokenizers

IWSLT14_URL = "http://dl.fbaipublicfiles.com/fairseq/data/iwslt14/de-en.tgz"
# No sha256 of de-en.tgz could be taken here (no network): the download is then
# unverified and its sha256 is printed so that it can be pinned.
IWSLT14_SHA256: str | None = None
IWSLT14_DIR = "iwslt14_de-en/fairseq_tok"
# fairseq's test set: these five, in this order.
IWSLT14_TEST_SETS = ("IWSLT14.TED.dev2010", "IWSLT14.TEDX.dev2012", "IWSLT14.TED.tst2010",
                     "IWSLT14.TED.tst2011", "IWSLT14.TED.tst2012")
MAX_TOKENS, MAX_RATIO, VALID_EVERY = 175, 1.5, 23
_DROP_TAGS = ("<url>", "<talkid>", "<keywords>")
_STRIP_TAGS = re.compile(r"</?(title|description)>")
_SEG = re.compile(r'<seg id="?\d+"?>\s*(.*?)\s*</seg>')


def train_lines(raw: Iterable[str]) -> list[str]:
  """The text lines of a ``train.tags`` file (fairseq's grep/sed step)."""
  return [_STRIP_TAGS.sub("", line.rstrip("\n")) for line in raw
          if not any(tag in line for tag in _DROP_TAGS)]


def xml_segments(text: str) -> list[str]:
  """The ``<seg id=N>`` texts of an IWSLT xml file, ’ replaced by ' (fairseq's sed)."""
  return [m.group(1).replace("\u2019", "'") for m in map(_SEG.search, text.splitlines()) if m]


def clean_pairs(src: Sequence[str], tgt: Sequence[str], lo: int = 1, hi: int = MAX_TOKENS,
                ratio: float = MAX_RATIO) -> tuple[list[str], list[str]]:
  """clean-corpus-n.perl: whitespace collapsed; pairs with a side outside [lo, hi]
  tokens, or a token ratio above ``ratio`` either way, dropped."""
  out_s, out_t = [], []
  for s, t in zip(src, tgt):
    s, t = " ".join(s.split()), " ".join(t.split())
    ns, nt = len(s.split()), len(t.split())
    if not (lo <= ns <= hi and lo <= nt <= hi) or ns / nt > ratio or nt / ns > ratio:
      continue
    out_s.append(s)
    out_t.append(t)
  return out_s, out_t


def _tokenize(lines: Sequence[str], lang: str, what: str) -> list[str]:
  from sacremoses import MosesTokenizer

  tok = MosesTokenizer(lang=lang)
  out = []
  for i, line in enumerate(lines):
    out.append(tok.tokenize(line, return_str=True, escape=True))
    if (i + 1) % 20000 == 0 or i + 1 == len(lines):
      print(f"  tokenizing {what}.{lang}: {i + 1:,}/{len(lines):,} lines", file=sys.stderr, flush=True)
  return out


def _read_member(archive: tarfile.TarFile, suffix: str) -> str:
  for m in archive.getmembers():
    if m.isfile() and m.name.endswith(suffix):
      return archive.extractfile(m).read().decode("utf-8")
  raise paths.DataError(f"the IWSLT14 archive has no file ending in {suffix!r}")


def _write_gz(path: pathlib.Path, lines: Sequence[str]) -> None:
  data = "".join(line + "\n" for line in lines).encode("utf-8")
  tokenizers._atomic_write_bytes(path, gzip.compress(data, mtime=0))


def prepare_iwslt14(archive_path: str | os.PathLike, out_dir: str | os.PathLike) -> dict[str, int]:
  """Writes ``<out_dir>/iwslt14_de-en/fairseq_tok/{train,valid,test}.{de,en}.gz`` from
  the TED archive; returns the pair count of each split."""
  try:
    archive = tarfile.open(archive_path, "r:*")
  except (OSError, tarfile.TarError) as e:
    raise paths.DataError(f"cannot read the IWSLT14 archive {archive_path}: {e}") from None
  with archive:
    print("lnjax: reading the IWSLT14 archive", file=sys.stderr, flush=True)
    raw = {lang: train_lines(io.StringIO(_read_member(archive, f"train.tags.de-en.{lang}")))
           for lang in ("de", "en")}
    if len(raw["de"]) != len(raw["en"]):
      raise paths.DataError(
          f"the IWSLT14 archive's train.tags files differ in length ({len(raw['de'])} de lines,"
          f" {len(raw['en'])} en lines)")
    tests = {lang: [seg for name in IWSLT14_TEST_SETS
                    for seg in xml_segments(_read_member(archive, f"{name}.de-en.{lang}.xml"))]
             for lang in ("de", "en")}
  tok = {lang: _tokenize(raw[lang], lang, "train") for lang in ("de", "en")}
  de, en = clean_pairs(tok["de"], tok["en"])
  de, en = [s.lower() for s in de], [s.lower() for s in en]
  splits = {
      # awk 'NR % 23 == 0' (1-based line numbers) for valid, the rest for train.
      "train": ([s for i, s in enumerate(de, 1) if i % VALID_EVERY],
                [s for i, s in enumerate(en, 1) if i % VALID_EVERY]),
      "valid": ([s for i, s in enumerate(de, 1) if not i % VALID_EVERY],
                [s for i, s in enumerate(en, 1) if not i % VALID_EVERY]),
      "test": tuple([s.lower() for s in _tokenize(tests[lang], lang, "test")] for lang in ("de", "en")),
  }
  folder = pathlib.Path(out_dir) / IWSLT14_DIR
  for split, (d, e) in splits.items():
    _write_gz(folder / f"{split}.de.gz", d)
    _write_gz(folder / f"{split}.en.gz", e)
  return {split: len(d) for split, (d, _) in splits.items()}


def fetch_iwslt14_archive(cache_dir=None, mirror: str | None = None) -> pathlib.Path:
  """de-en.tgz in the download folder, downloaded on first use (with pooch)."""
  folder = paths.download_dir(cache_dir) / "iwslt14_de-en"
  mirror = download.resolve_mirror(mirror)
  url = f"{mirror.rstrip('/')}/iwslt14_de-en/de-en.tgz" if mirror else IWSLT14_URL
  if (folder / "de-en.tgz").is_file():
    return folder / "de-en.tgz"
  if download.offline():
    raise paths.DataError(
        f"downloads are off ({download.OFFLINE_ENV} is set): download {url} and pass it as"
        f" --archive, or put it into {folder}/")
  folder.mkdir(parents=True, exist_ok=True)
  path = download.retrieve(url, IWSLT14_SHA256, "de-en.tgz", folder,
                           f"put de-en.tgz into {folder}/ or pass --archive")
  if IWSLT14_SHA256 is None:
    print(f"lnjax: de-en.tgz is not verified (no checksum recorded); its sha256 is"
          f" {fileio.sha256(str(path))}", file=sys.stderr)
  return path


# The WMT14 De-En training corpora: (archive, member path of the .de file, of the .en file),
# in the order of TFDS's wmt14_translate/de-en train split.
WMT14_DIR = "wmt14_de-en"
WMT14_TRAIN_PARTS = (
    ("training-parallel-europarl-v7.tgz", "training/europarl-v7.de-en.de",
     "training/europarl-v7.de-en.en"),
    ("training-parallel-commoncrawl.tgz", "commoncrawl.de-en.de", "commoncrawl.de-en.en"),
    ("training-parallel-nc-v9.tgz", "training/news-commentary-v9.de-en.de",
     "training/news-commentary-v9.de-en.en"),
)


@contextlib.contextmanager
def _open_part(manual_dir: pathlib.Path, archive: str, member: str):
  """A text stream of ``member``: extracted under ``manual_dir``, else inside ``archive``."""
  if (manual_dir / member).is_file():
    with open(manual_dir / member, encoding="utf-8", newline="\n") as f:
      yield f
    return
  if not (manual_dir / archive).is_file():
    raise paths.DataError(
        f"{manual_dir} has neither {archive} nor {member}: download {archive} from"
        " http://www.statmt.org/wmt14/translation-task.html into it")
  try:
    with tarfile.open(manual_dir / archive, "r:*") as tar:
      try:
        raw = tar.extractfile(member)
      except KeyError:
        raise paths.DataError(f"{manual_dir / archive} has no member {member}") from None
      yield io.TextIOWrapper(raw, encoding="utf-8", newline="\n")
  except (OSError, tarfile.TarError) as e:
    raise paths.DataError(f"cannot read {manual_dir / archive}: {e}") from None


def prepare_wmt14_manual(manual_dir: str | os.PathLike, out_dir: str | os.PathLike) -> dict[str, int]:
  """Writes ``<out_dir>/wmt14_de-en/train.{de,en}.gz`` from the WMT14 training archives
  in ``manual_dir``; returns the pair count of each corpus."""
  manual_dir, folder = pathlib.Path(manual_dir), pathlib.Path(out_dir) / WMT14_DIR
  folder.mkdir(parents=True, exist_ok=True)
  tmp = {lang: folder / f".train.{lang}.gz.tmp{os.getpid()}" for lang in ("de", "en")}
  counts: dict[str, int] = {}
  try:
    with gzip.GzipFile(tmp["de"], "wb", mtime=0) as out_de, \
         gzip.GzipFile(tmp["en"], "wb", mtime=0) as out_en:
      for archive, de_member, en_member in WMT14_TRAIN_PARTS:
        corpus = pathlib.PurePosixPath(de_member).name.rsplit(".", 2)[0]
        print(f"lnjax: reading {corpus}", file=sys.stderr, flush=True)
        n = 0
        with _open_part(manual_dir, archive, de_member) as de, \
             _open_part(manual_dir, archive, en_member) as en:
          for line_de, line_en in itertools.zip_longest(de, en):
            if line_de is None or line_en is None:
              raise paths.DataError(
                  f"{de_member} and {en_member} differ in length (not line-aligned)")
            line_de, line_en = line_de.strip(), line_en.strip()
            if line_de and line_en:
              out_de.write((line_de + "\n").encode("utf-8"))
              out_en.write((line_en + "\n").encode("utf-8"))
              n += 1
        counts[corpus] = n
    for lang, path in tmp.items():
      os.replace(path, folder / f"train.{lang}.gz")
  finally:
    for path in tmp.values():
      path.unlink(missing_ok=True)
  return counts


def tensorflow_missing() -> bool:
  import importlib.util

  return importlib.util.find_spec("tensorflow") is None
