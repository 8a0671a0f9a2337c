"""Errors that end a run with one line and a non-zero exit, and the checks that raise them."""

import math
from typing import Any, Sequence


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
  """Refuses a number outside [low, high] (or the open ends asked for), NaN included."""
  bad = isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value)
  if not bad and low is not None:
    bad = value <= low if low_open else value < low
  if not bad and high is not None:
    bad = value >= high if high_open else value > high
  if bad:
    lo = "-inf" if low is None else f"{low}"
    hi = "inf" if high is None else f"{high}"
    interval = ("(" if low_open else "[") + f"{lo}, {hi}" + (")" if high_open else "]")
    raise ConfigError(f"{key}={value!r} must be a number in {interval}")
