"""The configs shipped with lnjax, one file each: default, lm, llama, multi30k_de_en,
iwslt14_de_en, wmt14_en_de, bert, glue. Each defines `get_config(arg)` (presets after a
colon: `lm.py:norm=post,smoke`) and may define `get_sweep(arg)`.

In a clone the top-level `configs/` is this folder (a link), so `--config=configs/lm.py`
works there; anywhere else a config is named: `--config=lm:norm=post`. This module only
finds files: it imports no config (they load the data layer).
"""

import os

FOLDER = os.path.dirname(os.path.abspath(__file__))


HELPERS = ("__init__.py", "common.py", "doc.py")  # What the configs share; --print_config.


def names() -> list[str]:
  """The shipped configs: ['bert', 'default', 'glue', ...]."""
  return sorted(f[:-3] for f in os.listdir(FOLDER) if f.endswith(".py") and f not in HELPERS)


def resolve(arg: str) -> str:
  """'lm:norm=post' -> '/…/lnjax/configs/lm.py:norm=post'; a config file's path (or
  anything that is not a shipped config's name) is returned as it is."""
  name, sep, presets = arg.partition(":")
  if os.sep in name or name.endswith(".py") or name not in names() or os.path.exists(name):
    return arg
  return os.path.join(FOLDER, name + ".py") + sep + presets


def resolve_flag(arg: str) -> str:
  """A command-line argument with a config named: '--config=lm:norm=post' ->
  '--config=/…/lnjax/configs/lm.py:norm=post'; any other argument as it is."""
  if not arg.startswith("--config="):
    return arg
  return "--config=" + resolve(arg[len("--config="):])
