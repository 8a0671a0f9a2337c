"""`python -m lnjax.cli.prepare` (`lnjax prepare`): download and tokenize the paper's
translation data ahead of a run (lnjax/data/prepare.py).

  python -m lnjax.cli.prepare iwslt14_de_en [--archive=de-en.tgz] [--data_dir=DIR]
  python -m lnjax.cli.prepare wmt14_en_de --manual_dir=DIR [--data_dir=DIR]
  python -m lnjax.cli.prepare wmt14_en_de [--tfds_data_dir=DIR]    # needs lnjax[tfds-build]
"""

import os
import pathlib
from typing import Sequence

from absl import app, flags

from lnjax import cli
from lnjax.core import errors
from lnjax.data import download, paths, prepare

_DATASET = flags.DEFINE_enum("dataset", None, ["iwslt14_de_en", "wmt14_en_de"],
                             "What to prepare (or give it as the first argument).")
_ARCHIVE = flags.DEFINE_string("archive", None, "iwslt14_de_en: a local de-en.tgz (default: "
                               "download).")
_MANUAL_DIR = flags.DEFINE_string(
    "manual_dir", None, "wmt14_en_de: a folder with the WMT14 training archives"
    " (training-parallel-{europarl-v7,commoncrawl,nc-v9}.tgz); no TFDS, no TensorFlow.")
_DATA_DIR = flags.DEFINE_string("data_dir", None, "iwslt14_de_en, wmt14_en_de --manual_dir: "
                                "where to write (default: $LNJAX_DATA_DIR, else the download "
                                "folder <cache dir>/downloads).")
_CACHE_DIR = flags.DEFINE_string("cache_dir", None, "Cache dir (default $LNJAX_CACHE_DIR, "
                                 "~/.cache/lnjax).")
_TFDS_DATA_DIR = flags.DEFINE_string("tfds_data_dir", None, "wmt14_en_de: TFDS data dir (may be "
                                     "gs://).")


def _out_dir() -> str:
  return (_DATA_DIR.value or os.environ.get(paths.DATA_DIR_ENV)
          or paths.download_dir(_CACHE_DIR.value))


def main(argv: Sequence[str]) -> None:
  name = _DATASET.value or (argv[1] if len(argv) > 1 else None)
  if name not in ("iwslt14_de_en", "wmt14_en_de") or len(argv) > 2:
    cli.fail("usage: python -m lnjax.cli.prepare iwslt14_de_en|wmt14_en_de [flags]")
  try:
    if name == "iwslt14_de_en":
      archive = _ARCHIVE.value or prepare.fetch_iwslt14_archive(_CACHE_DIR.value)
      out = _out_dir()
      counts = prepare.prepare_iwslt14(archive, out)
      print(f"prepared iwslt14_de_en in {pathlib.Path(out) / prepare.IWSLT14_DIR}: "
            + ", ".join(f"{k} {v:,} pairs" for k, v in counts.items()))
    elif _MANUAL_DIR.value:
      out = _out_dir()
      counts = prepare.prepare_wmt14_manual(_MANUAL_DIR.value, out)
      print(f"prepared wmt14_de_en's train split in {pathlib.Path(out) / prepare.WMT14_DIR}: "
            + ", ".join(f"{k} {v:,} pairs" for k, v in counts.items())
            + f"; {sum(counts.values()):,} in all")
    else:
      from lnjax.data import sources

      if prepare.tensorflow_missing():
        raise paths.DataError(
            "wmt14_en_de from TFDS needs TensorFlow (TFDS's wmt14_translate builder), which"
            " is not installed: pip install lnjax[tfds-build], or pass --manual_dir=DIR with"
            " the WMT14 training archives")
      if download.offline():
        raise paths.DataError(f"downloads are off ({download.OFFLINE_ENV} is set)")
      src = sources.TfdsSource("wmt14_translate/de-en", _TFDS_DATA_DIR.value)
      print(f"prepared tfds:wmt14_translate/de-en (splits {', '.join(src.available_splits)})")
  except errors.LnjaxError as e:
    cli.fail(str(e), e.exit_code)


if __name__ == "__main__":
  app.run(main, flags_parser=cli.parse_flags)
