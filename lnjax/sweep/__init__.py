r"""Sweeps: grids of runs, described in Python beside the config they vary.

  python -m lnjax.cli.sweep --config=configs/lm.py:size=course --sweep=course --workdir=/tmp/course
  python -m lnjax.cli.sweep --config=configs/lm.py:size=course --sweep=course \
      --workdir=/tmp/course --report

A config file offers sweeps through `get_sweep(arg)`, which returns a list of override
dicts, one per run ({"model.norm_position": "post", "opt.learning_rate": 1e-3}), built
from the helpers here:

  def get_sweep(arg):
    return sweep.product(sweep.axis("model.norm_position", ["post", "pre"]),
                         sweep.axis("opt.learning_rate", [1e-3, 6e-3]))

Each run trains in ROOT/<name>, its name spelled from its overrides
("norm=post,lr=0.001"). This module only describes runs (no JAX, no processes): the
launcher is `lnjax.sweep.launcher`, the tables and plots `lnjax.sweep.report`.
"""

import copy
import dataclasses
import hashlib
import itertools
import os
import re
import types
from typing import Any, Iterable, Sequence

import ml_collections

from lnjax.core import errors

Overrides = dict[str, Any]

# ---------------------------------------------------------------------------------------
# Building sweeps.


def axis(key: str, values: Iterable[Any]) -> list[Overrides]:
  """One key over its values: axis("opt.learning_rate", [1e-3, 6e-3])."""
  return [{key: v} for v in values]


def product(*sweeps: Sequence[Overrides]) -> list[Overrides]:
  """Every combination, the last sweep varying fastest (like nested for-loops)."""
  return [_merge(combo) for combo in itertools.product(*sweeps)]


def zip_axes(*sweeps: Sequence[Overrides]) -> list[Overrides]:
  """Element-wise: the i-th run of each sweep merged into one; lengths must match."""
  lengths = {len(s) for s in sweeps}
  if len(lengths) > 1:
    raise errors.ConfigError(f"sweep.zip_axes of sweeps of different lengths {sorted(lengths)}")
  return [_merge(combo) for combo in zip(*sweeps)]


def chain(*sweeps: Sequence[Overrides]) -> list[Overrides]:
  """One sweep after the other (extra runs beside a grid)."""
  return [dict(o) for s in sweeps for o in s]


def _merge(parts: Iterable[Overrides]) -> Overrides:
  merged = {}
  for part in parts:
    for key, value in part.items():
      if key in merged and merged[key] != value:
        raise errors.ConfigError(f"sweep sets {key} twice in one run ({merged[key]!r}, {value!r})")
      merged[key] = value
  return merged


# ---------------------------------------------------------------------------------------
# Run names: readable, filesystem-safe, a function of the overrides alone.

SHORT_KEYS = {"model.norm_position": "norm", "opt.learning_rate": "lr",
              "opt.warmup_steps": "warmup", "opt.name": "opt", "train.num_steps": "steps"}
MAX_NAME = 120


def run_name(overrides: Overrides) -> str:
  """'norm=post,lr=0.001,warmup=30': each key shortened (SHORT_KEYS, else its last part),
  values as written (floats by %g), anything but [A-Za-z0-9._+-] replaced by '-'."""
  if not overrides:
    return "base"
  shorts = [SHORT_KEYS.get(k, k.rsplit(".", 1)[-1]) for k in overrides]
  keys = [s if shorts.count(s) == 1 else k for s, k in zip(shorts, overrides)]
  name = ",".join(f"{_safe(k)}={_safe(_name_value(v))}"
                  for k, v in zip(keys, overrides.values()))
  if len(name) > MAX_NAME:  # Keep it a valid file name; the hash keeps it unique.
    digest = hashlib.sha1(name.encode()).hexdigest()[:8]
    name = f"{name[:MAX_NAME - 9]}-{digest}"
  return name


def _name_value(v) -> str:
  if isinstance(v, float):
    return f"{v:g}"
  if isinstance(v, (tuple, list)):
    return "-".join(_name_value(x) for x in v) or "none"
  return "none" if v is None else str(v)


def _safe(text: str) -> str:
  return re.sub(r"[^A-Za-z0-9._+-]", "-", text)


def flag_value(v) -> str:
  """A value as `--config.key=VALUE` spells it for ml_collections' flag parser."""
  if isinstance(v, (tuple, list)):
    return repr(tuple(v))
  if isinstance(v, float):
    return repr(v)
  return str(v)


# ---------------------------------------------------------------------------------------
# Expanding a sweep into runs.


@dataclasses.dataclass(frozen=True)
class Run:
  name: str
  overrides: Overrides  # The sweep's keys for this run, in the sweep's order.
  config: ml_collections.ConfigDict  # The base config with fixed and own overrides applied.

  def setting(self, key: str):
    """A (dotted) key of the run's full config: run.setting("opt.learning_rate")."""
    node = self.config
    for part in key.split("."):
      node = node[part]
    return node


def split_config_arg(config_arg: str) -> tuple[str, str | None]:
  """'configs/lm.py:size=course' -> ('configs/lm.py', 'size=course'), as ml_collections reads it."""
  path, sep, preset = config_arg.partition(":")
  return path, (preset if sep else None)


def load_config_module(path: str):
  if not os.path.isfile(path):
    raise errors.ConfigError(f"config file {path} not found")
  # Compiled from its source every time, never from a cached .pyc: Python trusts a .pyc
  # whose source has the same size and modification second, so a config edited twice
  # within a second could otherwise come back in its earlier version.
  with open(path) as f:
    code = compile(f.read(), path, "exec")
  module = types.ModuleType("lnjax_sweep_config_" + re.sub(r"\W", "_", os.path.abspath(path)))
  module.__file__ = path
  exec(code, module.__dict__)  # noqa: S102  (the user's own config file, as importing it would)
  return module


def base_config(config_arg: str, fixed: Overrides | None = None) -> ml_collections.ConfigDict:
  """get_config(preset) of the config file, with `fixed` overrides applied to every run."""
  path, preset = split_config_arg(config_arg)
  module = load_config_module(path)
  config = module.get_config() if preset is None else module.get_config(preset)
  return _with_overrides(config, fixed or {}, "--config")


def expand(config_arg: str, sweep_arg: str | None, fixed: Overrides | None = None) -> list[Run]:
  """The runs of `get_sweep(sweep_arg)` in the config file, each with its name and config.

  Unknown keys and values of the wrong type are refused here, before any process starts;
  values of the right type that a run would refuse (model.norm_position='middle') are
  refused by the pre-flight, which resolves each run's config (lnjax/sweep/preflight.py).
  """
  path, _ = split_config_arg(config_arg)
  module = load_config_module(path)
  if not hasattr(module, "get_sweep"):
    raise errors.ConfigError(f"{path} defines no get_sweep(arg)")
  overrides_list = module.get_sweep(sweep_arg)
  base = base_config(config_arg, fixed)
  runs, names = [], {}
  for overrides in overrides_list:
    name = run_name(overrides)
    if name in names:
      raise errors.ConfigError(f"sweep {sweep_arg!r} has two runs named {name} "
                               f"({names[name]} and {overrides})")
    names[name] = overrides
    runs.append(Run(name, dict(overrides), _with_overrides(base, overrides, name)))
  if not runs:
    raise errors.ConfigError(f"sweep {sweep_arg!r} of {path} has no runs")
  return runs


def _with_overrides(config: ml_collections.ConfigDict, overrides: Overrides,
                    where: str) -> ml_collections.ConfigDict:
  config = copy.deepcopy(config)
  for key, value in overrides.items():
    try:
      config.update_from_flattened_dict({key: value})
    except KeyError:
      raise errors.ConfigError(f"{where}: unknown config key {key}") from None
    except TypeError as e:
      raise errors.ConfigError(f"{where}: {key}={value!r}: {e}") from None
  return config
