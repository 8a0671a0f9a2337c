r"""A sweep written on the command line: every combination of a few keys' values, on the
base config, with no get_sweep in a file.

  python -m lnjax.cli.sweep --config=configs/lm.py:smoke --workdir=/tmp/grid \
      --grid='model.norm_position=pre,post opt.learning_rate=1e-3,3e-3'

Items are separated by spaces, values by commas; each value is read as the type the base
config has at that key (a float key reads 3e-3 as 0.003, an int key refuses 0.5), so a
run is never refused for a value's spelling after the sweep has started.
"""

import copy

from lnjax.core import errors
from lnjax import sweep as sweep_lib

_BOOLS = {"true": True, "false": False, "1": True, "0": False}


def parse(text: str, base) -> list[dict]:
  """'model.norm_position=pre,post opt.learning_rate=1e-3,3e-3' -> the overrides of the
  4 runs (sweep.product of one axis per item, the last varying fastest)."""
  axes = []
  for item in text.split():
    key, sep, values = item.partition("=")
    if not sep or not key or not values or "" in values.split(","):
      raise errors.ConfigError(f"--grid item {item!r} must be KEY=VALUE[,VALUE...]")
    current, kind = _setting(base, key)
    axes.append(sweep_lib.axis(key, [_value(key, v, current, kind)
                                     for v in values.split(",")]))
  if not axes:
    raise errors.ConfigError("--grid is empty; give KEY=VALUE[,VALUE...] items")
  return sweep_lib.product(*axes)


def runs(config_arg: str, text: str, fixed: dict | None = None) -> list[sweep_lib.Run]:
  """The grid's runs on the config (with the fixed overrides), named as a sweep's are."""
  base = sweep_lib.base_config(config_arg, fixed)
  out = []
  for overrides in parse(text, base):
    config = copy.deepcopy(base)
    config.update_from_flattened_dict(overrides)
    out.append(sweep_lib.Run(sweep_lib.run_name(overrides), overrides, config))
  names = [r.name for r in out]
  if len(set(names)) < len(names):
    raise errors.ConfigError(f"--grid gives two runs the same name: {', '.join(names)}")
  return out


def _setting(config, key: str) -> tuple:
  """(the key's value, its type: a None's placeholder type, e.g. model.qk_norm's bool)."""
  node, kind = config, None
  for part in key.split("."):
    if not hasattr(node, "keys") or part not in node.keys():
      raise errors.ConfigError(f"--grid: unknown config key {key}")
    node, kind = node[part], node.get_type(part)
  if hasattr(node, "keys"):
    raise errors.ConfigError(f"--grid: {key} is a section; give one of its keys")
  return node, kind


def _value(key: str, text: str, current, kind: type):
  """`text` as the key's type (a None key without one: int, float or text)."""
  try:
    if issubclass(kind, bool):
      return _BOOLS[text.lower()]
    if issubclass(kind, int):
      return int(text)
    if issubclass(kind, float):
      return float(text)
    if issubclass(kind, (tuple, list)):
      raise errors.ConfigError(f"--grid: {key} is a tuple; sweep it with get_sweep in a "
                               "config file")
    if current is None and not issubclass(kind, str):
      for cast in (int, float):
        try:
          return cast(text)
        except ValueError:
          pass
    return text
  except (ValueError, KeyError):
    raise errors.ConfigError(f"--grid: {key}={text!r} is not a {kind.__name__} "
                             f"(the config has {current!r})") from None
