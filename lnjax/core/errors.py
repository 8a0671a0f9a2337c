"""Errors that end a run with one line and a non-zero exit, and the checks that raise them."""

import math
import numbers
from typing import Any, Sequence


INT64_MAX = 2**63 - 1


class LnjaxError(Exception):
  """An error the user can fix; `lnjax.main` prints its message as one line."""

  exit_code = 2


class ConfigError(LnjaxError, ValueError):
  """A config key or value that is refused before any compute."""


class WorkdirError(LnjaxError):
  """A workdir that cannot be used (unwritable, or holding another run)."""


class CheckpointError(LnjaxError):
  """No checkpoint in the workdir could be restored."""


def check_choice(key: str, value: Any, choices: Sequence[Any]) -> None:
  if value not in choices:
    raise ConfigError(f"{key}={value!r} is not one of: {', '.join(map(str, choices))}")


def check_range(key: str, value: Any, *, low=None, high=None, low_open=False,
                high_open=False) -> None:
  """Refuses a number outside [low, high] (or the open ends asked for), NaN and ±inf
  included: an end left None is open (no setting takes an infinite value), and an integer
  past int64 (what JAX and numpy hold) is refused too."""
  bad = (isinstance(value, bool) or not isinstance(value, (int, float))
         or not math.isfinite(value) or (isinstance(value, int) and abs(value) > INT64_MAX))
  if not bad and low is not None:
    bad = value <= low if low_open else value < low
  if not bad and high is not None:
    bad = value >= high if high_open else value > high
  if bad:
    lo = "-inf" if low is None else f"{low}"
    hi = "inf" if high is None else f"{high}"
    interval = (("(" if low_open or low is None else "[") + f"{lo}, {hi}"
                + (")" if high_open or high is None else "]"))
    raise ConfigError(f"{key}={value!r} must be a number in {interval}")


def check_int(key: str, value: Any, low: int, high: int | None = None) -> None:
  """Refuses a non-integer (a bool included: True as a batch size is a mistake) or one
  outside [low, high] (high None: the largest int64)."""
  ok = isinstance(value, numbers.Integral) and not isinstance(value, bool)  # numpy's too
  if not ok or value < low or value > (INT64_MAX if high is None else high):
    rng = f">= {low}" if high is None else f"in [{low}, {high}]"
    raise ConfigError(f"{key}={value!r} is invalid: must be an integer {rng}")


def check_path(key: str, value: Any) -> None:
  """None, or a non-empty path string (a local path or a bucket URL)."""
  if value is not None and not (isinstance(value, str) and value):
    raise ConfigError(f"{key}={value!r} is invalid: must be a non-empty path string or None")


def check_bool(key: str, value: Any) -> None:
  if not isinstance(value, bool):
    raise ConfigError(f"{key}={value!r} is invalid: must be true or false")
