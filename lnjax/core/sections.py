"""Config sections <-> dataclasses: each `config.<section>` ConfigDict is built from its
dataclass's defaults (`section`: a default is written once, in the dataclass) and mapped
back onto it with one-line errors (`from_config`)."""

import dataclasses
import typing
from typing import Any, Mapping

import ml_collections

from lnjax.core import errors


# Each dataclass a section was built from, by its field names (what --print_config reads
# the fields' comments from, for configs that only their own entry point resolves).
_BUILT_FROM: dict[frozenset, type] = {}


def built_from(keys) -> type | None:
  """The dataclass whose fields are exactly `keys`, if a section was built from one."""
  return _BUILT_FROM.get(frozenset(keys))


def section(cls, **overrides) -> ml_collections.ConfigDict:
  """A config section holding every field of dataclass `cls` at its default (the one
  place a default is written), then `overrides`. A None or tuple default becomes a typed
  FieldReference so that `--config.<section>.<key>=...` can set it."""
  hints = typing.get_type_hints(cls)
  d = ml_collections.ConfigDict()
  for f in dataclasses.fields(cls):
    value = overrides.pop(f.name, f.default)
    if value is None or isinstance(value, tuple):
      kinds = [t for t in typing.get_args(hints[f.name]) if t is not type(None)]
      kind = typing.get_origin(hints[f.name]) if isinstance(value, tuple) else kinds[0]
      value = ml_collections.FieldReference(value, field_type=kind or tuple)
    d[f.name] = value
  if overrides:
    raise errors.ConfigError(f"{cls.__name__} has no field {sorted(overrides)[0]!r}")
  keys = frozenset(d.keys())
  if _BUILT_FROM.setdefault(keys, cls) is not cls:  # --print_config finds a class by its keys.
    raise TypeError(f"{cls.__name__} and {_BUILT_FROM[keys].__name__} have the same field"
                    " names: a config section could not say which it was built from")
  return d


def from_config(cls, section: str, values: Mapping[str, Any], **extra):
  """cls(**values) where an unknown key is a one-line ConfigError naming the valid keys."""
  fields = {f.name for f in dataclasses.fields(cls)}
  for key in values:
    if key not in fields:
      raise errors.ConfigError(
          f"unknown config key {section}.{key}; valid keys: {', '.join(sorted(fields))}")
  return cls(**{**dict(values), **extra})
