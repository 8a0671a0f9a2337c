"""config.json's fields, each read with its type checked: a value of the wrong type (5 for
"architectures", 2.5 layers, a string for a width) is refused in one line naming the field,
not left to fail later as a TypeError inside the model."""

import math
import numbers

from lnjax.hf.weights import HFError


class Fields:
  """Typed reads of one config.json object (`where` names it in messages: 'config.json',
  'config.json: rope_parameters')."""

  def __init__(self, config: dict, where: str = "config.json"):
    self.config, self.where = config, where

  def get(self, key: str, default=None):
    value = self.config.get(key)
    return default if value is None else value

  def is_null(self, key: str) -> bool:
    """`key` written as null, which is not `key` left out: a configuration class takes
    null as none (no window, no cap) and an absent key as its default."""
    return key in self.config and self.config[key] is None

  def refuse(self, key: str, value, accepted: str):
    return HFError(f"{self.where}: {key}={value!r} is not supported (lnjax imports {accepted})")

  def integer(self, key: str, default=None, low: int = 1) -> int:
    value = self.get(key, default)
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < low:
      raise HFError(f"{self.where}: {key}={value!r} must be an integer >= {low}")
    return int(value)

  def number(self, key: str, default=None, low: float = 0.0, positive: bool = False) -> float:
    value = self.get(key, default)
    if (isinstance(value, bool) or not isinstance(value, numbers.Real)
        or not math.isfinite(value) or value < low or (positive and value <= low)):
      bound = f"> {low:g}" if positive else f">= {low:g}"
      raise HFError(f"{self.where}: {key}={value!r} must be a finite number {bound}")
    return float(value)

  def flag(self, key: str, default: bool) -> bool:
    value = self.get(key, default)
    if not isinstance(value, bool):
      raise HFError(f"{self.where}: {key}={value!r} must be true or false")
    return value

  def choice(self, key: str, allowed, default=None):
    """A string (or bool, or None) among `allowed`."""
    value = self.config.get(key, default)
    if not isinstance(value, (str, bool, type(None))) or value not in allowed:
      raise self.refuse(key, value, " or ".join(map(repr, allowed)))
    return value

  def strings(self, key: str, length: int | None = None) -> list[str] | None:
    value = self.config.get(key)
    if value is None:
      return None
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
      raise HFError(f"{self.where}: {key}={value!r} must be a list of strings")
    if length is not None and len(value) != length:
      raise HFError(f"{self.where}: {key} has {len(value)} entries, one per layer "
                    f"({length}) expected")
    return value

  def obj(self, key: str) -> dict | None:
    value = self.config.get(key)
    if value is not None and not isinstance(value, dict):
      raise HFError(f"{self.where}: {key}={value!r} must be a JSON object")
    return value


def architecture(config: dict, known, path: str = "config.json") -> str:
  """The one architecture named by config.json's "architectures", if lnjax knows it."""
  value = config.get("architectures")
  names = ", ".join(known)
  if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
    raise HFError(f"{path}: architectures={value!r} must be a list holding one architecture "
                  f"name (lnjax imports {names})")
  if len(value) != 1 or value[0] not in known:
    raise HFError(f"{path}: architectures={value} is not supported (lnjax imports {names})")
  return value[0]
