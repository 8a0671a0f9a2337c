"""Built-in corpora fetched on first use: public URL, sha256, cache folder.

Every file a built-in corpus reads (``<subdir>/<filename>`` in the data-dir
layout, e.g. ``multi30k/train.de.gz``) has an entry in `REMOTE`: the folder URL
it is published under, the path(s) below it, and the sha256 of the bytes served
there. `fetch` downloads it with pooch (a temporary file in the target folder,
moved into place only after its checksum matched, so a mismatch, an HTTP error
or a transfer cut halfway leaves nothing behind) into
``<cache dir>/downloads/<subdir>/``, the last folder `paths.find_corpus_file`
searches.

Mirrors. ``LNJAX_DATA_MIRROR`` (or ``data.mirror``) replaces every entry's folder
URL with ``<mirror>/<subdir>/``, as pip's ``--index-url`` replaces PyPI: a
mirror is a data dir (the layout above, files as published) served over HTTP(S).

Sources, chosen for being byte-identical to the files the checksums were taken
from (each folder of the project's corpus snapshot documents its provenance):
tiny_shakespeare from karpathy/char-rnn (the checksum TFDS records for it),
Multi30k from multi30k/dataset, WikiText-2 raw from a GitHub copy of the
official release split into ten pieces, GLUE RTE/MRPC in GLUE's layout from
GitHub copies, newstest2014 from the WMT14 ``test-full`` SGML files.
"""

from __future__ import annotations

import dataclasses
import gzip
import html
import logging
import os
import pathlib
import re
import shutil
import sys
import tempfile

from lnjax.core import errors

_log = logging.getLogger(__name__)

MIRROR_ENV = "LNJAX_DATA_MIRROR"
# Set (to anything but 0/false/empty) to never download: a missing file is then
# a one-line error naming its URL (the test suite sets it; so may a cluster
# whose hosts must not reach the internet).
OFFLINE_ENV = "LNJAX_DATA_OFFLINE"


def offline() -> bool:
  return os.environ.get(OFFLINE_ENV, "").strip().lower() not in ("", "0", "false", "no")


@dataclasses.dataclass(frozen=True)
class Remote:
  """One local corpus file as published.

  The local file is the concatenation of ``parts`` (most files have one),
  each ``(path below base_url, sha256 of the served bytes)``; with
  ``extract='sgm'`` each part is an SGML file whose ``<seg>`` texts become the
  lines of the local file (whitespace collapsed, entities unescaped, as
  sacreBLEU reads ``.sgm``).
  """

  base_url: str
  parts: tuple[tuple[str, str], ...]
  extract: str | None = None


def _github(repo: str, commit: str, folder: str) -> str:
  return f"https://raw.githubusercontent.com/{repo}/{commit}/{folder}/"


_MULTI30K = _github("multi30k/dataset", "a3d2e0d26b56f3846f66a952536ffed4e401d05a", "data/task1/raw")
_MULTI30K_SHA = {
    "train.de.gz": "726e39b2fa9eb9ffb6dc763fb35a179f80fae06ffc5d28b6ace5faa883de28a6",
    "train.en.gz": "d79cfa999dd4c51d2cb42499b6796d5a882c3a8a961923c25a898c90f8bbd56f",
    "val.de.gz": "f0cba2f995189cf5770f29a8a9a537a3ad3f51657ad873405082ff6863a5e75a",
    "val.en.gz": "14f7d25ddd868909a9213e361768460edcacdd6ab9d1e77b92560dc10c10dc28",
    "test_2016_flickr.de.gz": "9204244e408ccb38d2a55cfcd344df15005fc42a07a6e55ca6c52b6ababb8cc8",
    "test_2016_flickr.en.gz": "611d361c6334bc7246101d48097c13cf5c4413c5befc793cc629934359d532d9",
    "test_2017_flickr.de.gz": "a2c89666db00c495cd8513b9d708d5a3acc205d7de312ef2bf5fb7ebc1540aee",
    "test_2017_flickr.en.gz": "76a444ee25172e72695cddb13ae4a3bda59430617be88e0bb46b60504f054074",
    "test_2017_mscoco.de.gz": "799e4854c25d601cb6cb6be29eabe5667734c61ace2f495e03e429031a0bc338",
    "test_2017_mscoco.en.gz": "aab300bfb4427697987e02cd0aacd44bfe8aa50456231b6474c08038bbed2b58",
    "test_2018_flickr.de.gz": "ddd0130c7d97482dc5197a02141dae8dd79f20f03586c480d675c09a32daf608",
    "test_2018_flickr.en.gz": "ef4f4844037d4c5dea75c9a8ed5fd78905967a26f67c255e230cc9780032654d",
}
_WIKITEXT = _github("wyshi/sdp_transformers", "67f51dacb983f17926a3376ec10b374c0ef0588a",
                    "data/wikitext-2-raw")
_WIKITEXT_TRAIN_SHA = (
    "936a05a2dcb1b205a40d7d3ca445bedd2d1949a50123241134dd040c0ad40441",
    "a954e3b2e91822a15edb2b3dd637f429f7918aa10cf7a6e500578b3f340b7e24",
    "597d141a66fc019ac209b0d665caa67dd5a4297b4cd9a2baf68a19c21f73fc38",
    "f148880d845a4b24ee3360a48903a04bcce11461bfc65e911d32ba0e0713eca9",
    "f7977324a777ffb28d4eabbaa71b781772988daea4993a3b1d0604881670c187",
    "c0a0c4961d778b897bdbc4356cc5da4639884ed6efc43c51c0c1567b27ef6225",
    "0f24e655f52eaea896e4250f35637f7426e172d74a0a041a99c446c22ffb2de6",
    "183227c15cecec638d2f8296eb40386ba2251d8a5f5b50cbc90d89111976f40e",
    "63eeb34f244bc95fdde78c688ee0a99441e6d9b4d5665afc3ad56ecc1164591d",
    "67ced5b949bcdfd2edf5f4426e9ccd24d33382a9d6feaca54fd2d67ff1ffa225",
)
_RTE = _github("marcwww/nlu_eval", "ccd55c37de74ebd86c70ae58f67dceb0aa444f43", "data/RTE")
_MRPC = _github("Nstats/my_bert", "733d79335044b1b7eabb5b47a0eae0cd621dadc0", "data/MRPC")
_NEWSTEST2014 = _github("nyu-mll/jiant", "ad60d996ed865e59969ca71fe156d4a728e0a0ab", "test-full")

# {(subdir, local file name): Remote}
REMOTE: dict[tuple[str, str], Remote] = {
    ("tiny_shakespeare", "input.txt"): Remote(
        "https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/",
        (("input.txt", "86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed"),)),
    **{("multi30k", name): Remote(_MULTI30K, ((name, sha),)) for name, sha in _MULTI30K_SHA.items()},
    ("wikitext-2-raw", "train.txt"): Remote(
        _WIKITEXT,
        tuple((f"train_split_10/train_{i}.txt", sha) for i, sha in enumerate(_WIKITEXT_TRAIN_SHA))),
    ("wikitext-2-raw", "valid.txt"): Remote(
        _WIKITEXT, (("valid.txt", "4cd0f6876d07a413aa911261ff6d363c72d757d47f0fdd6015702014c89cb9c7"),)),
    ("wikitext-2-raw", "test.txt"): Remote(
        _WIKITEXT, (("test.txt", "173c87a53759e0201f33e0ccf978e510c2042d7f2cb78229d9a50d79b9e7dd08"),)),
    # GLUE's RTE.zip train.tsv (the repository's train_copy.tsv; its train.tsv has a byte added).
    ("glue_rte", "train.tsv"): Remote(
        _RTE, (("train_copy.tsv", "41e3a9b063433392343fad9e962cf2f58b681c78d8f71592f4186f0837246c5c"),)),
    ("glue_rte", "dev.tsv"): Remote(
        _RTE, (("dev.tsv", "80230dfa1347282e7b532b06a1004a76a710087541189bf874223ddf0e3819fb"),)),
    ("glue_rte", "test.tsv"): Remote(
        _RTE, (("test.tsv", "6e33f09b5c2bfd5fd5fde217070f3dd49e484e33b9752b5864cf36fc421a213f"),)),
    ("glue_mrpc", "train.tsv"): Remote(
        _MRPC, (("train.tsv", "122becc469405bc16f9defcb8715d2a4b7ce600e9d9381e6dc42bfdd1494c51d"),)),
    ("glue_mrpc", "dev.tsv"): Remote(
        _MRPC, (("dev.tsv", "81c8a1a9e1dfe461dd2c1a4f98f43fe18bece44d2bf9e3d0b245b88e5aa5eaf7"),)),
    ("glue_mrpc", "test.tsv"): Remote(
        _MRPC, (("test.tsv", "4ee428d354c01fa35c2f0f6ab835398abb0bec01f17ed68fbcb6c04265505b0a"),)),
    # The full test set: src and ref files of one language hold the same segments.
    ("wmt14_newstest2014_de-en", "newstest2014.de"): Remote(
        _NEWSTEST2014,
        (("newstest2014-deen-src.de.sgm", "830c9dc32cc8b1ba33896b5693ab5c0b5d6393ad33cc643c96d6bd4f307c6d5b"),),
        extract="sgm"),
    ("wmt14_newstest2014_de-en", "newstest2014.en"): Remote(
        _NEWSTEST2014,
        (("newstest2014-deen-ref.en.sgm", "4c4f48eea4db127fdf600402e4a73a3ec6272e62e767a4fbfc34f5482015a580"),),
        extract="sgm"),
}


def remote_for(subdir: str, filename: str) -> tuple[str, Remote] | None:
  """(local name, entry) for ``<subdir>/<filename>[.gz]``, or None."""
  for name in (filename + ".gz", filename):
    if (subdir, name) in REMOTE:
      return name, REMOTE[(subdir, name)]
  return None


def resolve_mirror(configured: str | None = None) -> str | None:
  """``data.mirror``, else ``LNJAX_DATA_MIRROR``, else None (the public URLs)."""
  return configured or os.environ.get(MIRROR_ENV) or None


def part_urls(subdir: str, remote: Remote, mirror: str | None) -> list[str]:
  base = f"{mirror.rstrip('/')}/{subdir}/" if mirror else remote.base_url
  return [base + path for path, _ in remote.parts]


def _describe(urls: list[str]) -> str:
  """One URL, or the first and last of several parts (to be concatenated)."""
  if len(urls) == 1:
    return urls[0]
  return f"the {len(urls)} parts {urls[0]} ... {urls[-1]} (concatenated)"


_SEG = re.compile(r"<seg[^>]*>(.*)</seg>", re.IGNORECASE)


def sgm_segments(text: str) -> list[str]:
  """The ``<seg>`` texts of an SGML test set, in file order (sacreBLEU's
  reading: entities unescaped, whitespace runs collapsed)."""
  return [" ".join(html.unescape(m.group(1)).split()) for m in map(_SEG.search, text.splitlines()) if m]


class DownloadError(errors.LnjaxError):
  """A corpus file that could not be downloaded (one line: URL, file, folder)."""


def retrieve(url: str, sha256: str | None, fname: str, folder: pathlib.Path,
             hint: str) -> pathlib.Path:
  """``url`` downloaded with pooch into ``folder/fname`` (announced on stderr; checked
  against ``sha256`` where one is recorded) and its path. Any failure is a one-line
  `DownloadError` naming the URL and the reason, ending with ``hint`` (what to do instead).
  """
  import pooch  # (imported here: only a first use downloads)

  logging.getLogger("pooch").setLevel(logging.WARNING)
  print(f"lnjax: downloading {url}", file=sys.stderr, flush=True)
  try:
    return pathlib.Path(pooch.retrieve(
        url, known_hash=sha256 and f"sha256:{sha256}", fname=fname, path=folder,
        progressbar=sys.stderr.isatty()))
  except Exception as e:  # requests' HTTP/connection errors, pooch's checksum ValueError
    reason = " ".join(str(e).split())
    if isinstance(e, ValueError) and "hash" in reason.lower():
      reason = f"checksum mismatch: the file served is not the published one (expected sha256 {sha256})"
    raise DownloadError(f"cannot download {url} ({type(e).__name__}: {reason[:200]}); {hint}") from None


def fetch(subdir: str, filename: str, downloads: pathlib.Path,
          mirror: str | None = None) -> pathlib.Path | None:
  """Downloads ``<subdir>/<filename>`` (``filename`` may lack its ``.gz``) into
  ``<downloads>/<subdir>/`` and returns its path; None if it has no `REMOTE` entry.

  `DownloadError` (one line naming the URL, the file and the folder to put it
  in) when a part cannot be downloaded or its checksum does not match.
  """
  found = remote_for(subdir, filename)
  if found is None:
    return None
  name, remote = found
  folder = downloads / subdir
  target = folder / name
  mirror = resolve_mirror(mirror)
  urls = part_urls(subdir, remote, mirror)
  if offline():
    raise DownloadError(
        f"downloads are off ({OFFLINE_ENV} is set): download {_describe(urls)} and put"
        f" {name} into {folder}/ or into <data dir>/{subdir}/")
  parts_dir = folder / ".parts"
  try:
    parts_dir.mkdir(parents=True, exist_ok=True)
  except OSError as e:
    raise DownloadError(f"cannot create the download folder {parts_dir}: {e}") from None
  hint = (f"put {name} (from that URL{', set ' + MIRROR_ENV + ' to a mirror' if not mirror else ''})"
          f" into {folder}/ or into <data dir>/{subdir}/")
  part_files = [retrieve(url, sha, path.replace("/", "__"), parts_dir, hint)
                for url, (path, sha) in zip(urls, remote.parts)]
  _assemble(part_files, target, remote.extract)
  shutil.rmtree(parts_dir, ignore_errors=True)
  return target


def _assemble(part_files: list[pathlib.Path], target: pathlib.Path, extract: str | None) -> None:
  """Writes the local file from its verified parts, atomically."""
  fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=target.name + ".", suffix=".tmp")
  try:
    with os.fdopen(fd, "wb") as raw:
      out = gzip.GzipFile(fileobj=raw, mode="wb", mtime=0) if (
          target.suffix == ".gz" and extract) else raw
      for part in part_files:
        if extract == "sgm":
          out.write("".join(s + "\n" for s in sgm_segments(part.read_text("utf-8"))).encode())
        else:
          with open(part, "rb") as f:
            shutil.copyfileobj(f, out)
      if out is not raw:
        out.close()
    os.replace(tmp, target)
  except BaseException:
    pathlib.Path(tmp).unlink(missing_ok=True)
    raise
