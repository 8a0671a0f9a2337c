"""What every command shares on the command line, one error contract: a bad flag, an
unknown config key or preset, a config file that fails to load, and any refusal while the
command runs are one line on stderr and exit code 2 (absl's own report is a usage hint and
exit 1, config_flags' a traceback).

  app.run(main, flags_parser=cli.parse_flags)   # every `python -m lnjax.…` command
"""

import gc
import os
import sys

from absl import flags
from ml_collections.config_flags import config_flags  # is_config_flag is not re-exported.

from lnjax import configs
from lnjax.core import errors, tpu


def fail(message: str, code: int = 2, prog: str = "lnjax"):
  """One line on stderr, then exit `code` at once: no interpreter teardown, where
  background writers a failed save left behind (orbax, tensorstore) would print their own
  tracebacks. Every run file is complete by then (atomic writes), the workdir lock released."""
  print(f"{prog}: error: {message}", file=sys.stderr, flush=True)
  sys.stdout.flush()
  os._exit(code)


def freeze_imports() -> None:
  """Leaves the objects alive now, the imported modules' (jax, flax, orbax, tensorflow_datasets:
  ~200,000), out of every later garbage collection (gc.freeze), then turns collection on
  (a command may turn it off while it imports). Every full collection walked them, and
  the interpreter's teardown: a smoke run's process spent ~0.5 s of CPU on it."""
  gc.freeze()
  gc.enable()


HELP_FLAGS = ("--help", "-help", "-h", "-?", "--helpshort", "--helpfull", "--helpxml")


def parse_flags(argv: list[str], prog: str = "lnjax") -> list[str]:
  """absl's parsing with any error of a flag or a config file as one line. Every command
  passes here first: on a host with libtpu but no accelerator, JAX is kept to the CPU
  (lnjax/core/tpu.py's cpu_unless_accelerated; the run's subprocesses inherit it). What
  the command's imports and its config file made so far is then left out of later garbage
  collections (gc.freeze, as freeze_imports: a sweep launcher's `--dry_run` of two runs
  2.06-2.11 -> 1.80-1.91 CPU s)."""
  tpu.cpu_unless_accelerated()
  try:
    argv = parse(argv)
  except errors.ConfigError as e:
    fail(str(e), prog=prog)
  gc.freeze()
  return argv


def parse(argv: list[str]) -> list[str]:
  """parse_flags without the exit: an error is a one-line errors.ConfigError."""
  argv = [configs.resolve_flag(a) for a in argv]  # --config=lm:norm=post
  try:
    remaining = flags.FLAGS(argv)
  except Exception as e:  # Flag, config-file and config-value errors all land here.
    raise errors.ConfigError(_parsing_error(e, argv)) from None
  except SystemExit:  # absl's --help (-h, --helpfull): its text, then exit 1; asked, it is 0.
    if any(a.split("=")[0] in HELP_FLAGS for a in argv[1:]):
      sys.stdout.flush()
      sys.exit(0)
    raise
  for name in _config_flags():
    try:  # A file that failed to load is a placeholder that raises on first use.
      flags.FLAGS[name].value.keys()
    except OSError as e:
      lines = [l.strip() for l in str(e.__cause__ or e).splitlines() if l.strip()]
      raise errors.ConfigError(f"--{name}: {lines[-1] if lines else e}") from None
    except errors.LnjaxError as e:
      raise errors.ConfigError(str(e)) from None
  return remaining


INT64_MAX = 2**63 - 1


def number(name: str, low=None, high=None, *, low_open: bool = False) -> None:
  """The domain of the numeric flag --`name`, checked while the flags are parsed (a value
  outside it is one line, exit 2, before the command starts): [low, high], (low, high]
  with `low_open`; an integer flag at most the largest int64, a float one finite (absl's
  own bounds let NaN through). Unset (None) passes."""
  flag = flags.FLAGS[name]
  integer = isinstance(flag.parser, flags.IntegerParser)

  def check(value) -> bool:
    if value is None:
      return True
    try:
      if integer:
        errors.check_int(f"--{name}", value, low, INT64_MAX if high is None else high)
      else:
        errors.check_range(f"--{name}", value, low=low, high=high, low_open=low_open)
    except errors.ConfigError as e:
      raise flags.ValidationError(str(e).split(" ", 1)[1]) from None
    return True

  flags.register_validator(name, check)


def int_list(name: str, values) -> list[int]:
  """A list flag's integers, each once (in the order given); an empty list refused."""
  if not values:
    raise errors.ConfigError(f"--{name} is empty: give at least one value")
  try:
    return list(dict.fromkeys(int(v) for v in values))
  except ValueError:
    raise errors.ConfigError(f"--{name}={','.join(values)}: integers expected") from None


def refuse_arguments(argv: list[str], prog: str = "lnjax") -> None:
  """For a command that takes flags only: any positional argument is one line, exit 2."""
  if len(argv) > 1:
    fail(f"unexpected arguments: {' '.join(argv[1:])}", prog=prog)


def config_and_overrides(name: str = "config") -> tuple[str, dict]:
  """The --config flag's FILE[:presets] and its --config.KEY=VALUE overrides ({key: value}),
  which a sweep gives each of its runs."""
  return (flags.FLAGS[name].config_filename,
          config_flags.get_override_values(flags.FLAGS[name]))


def _config_flags() -> list[str]:
  """The names of the command's config-file flags that were given a file."""
  return [name for name in flags.FLAGS if config_flags.is_config_flag(flags.FLAGS[name])
          and flags.FLAGS[name].value is not None]


def _parsing_error(e: Exception, argv: list[str]) -> str:
  cause = e
  while cause is not None and not isinstance(cause, errors.LnjaxError):
    cause = cause.__cause__ or cause.__context__
  if cause is not None:  # A refusal raised by get_config (an unknown preset).
    return _last_error_line(str(cause))
  override = _unknown_override(argv)
  return f"unknown config key {override}" if override else _last_error_line(str(e))


def _last_error_line(message: str) -> str:
  """config_flags reports an error raised in get_config as a formatted traceback inside
  its own message; its last line is the error itself ('pkg.Error: text')."""
  lines = [l.strip() for l in message.splitlines() if l.strip()]
  if len(lines) > 1 and any(l.startswith("Traceback") for l in lines):
    kind, _, text = lines[-1].partition(": ")
    return text if kind.startswith("lnjax.") and text else lines[-1]
  return lines[0] if lines else "invalid flags"


def _unknown_override(argv: list[str]) -> str | None:
  """The first --NAME.a.b=v whose key NAME's loaded config lacks (for the error line)."""
  for arg in argv[1:]:
    if not (arg.startswith("--") and "." in arg.split("=", 1)[0]):
      continue
    name, path = arg[2:].split("=", 1)[0].split(".", 1)
    if name not in flags.FLAGS or not config_flags.is_config_flag(flags.FLAGS[name]):
      continue
    node = flags.FLAGS[name].value if flags.FLAGS[name].present else None
    for part in path.split("."):
      if node is None or not hasattr(node, "keys") or part not in node.keys():
        return path
      node = node[part]
  return None
