"""What every command shares on the command line: a bad flag, like any refusal, is one line
on stderr and exit code 2 (absl's own report is a usage hint and exit 1)."""

import sys

from absl import flags


def fail(message: str, code: int = 2):
  print(f"lnjax: error: {message}", file=sys.stderr, flush=True)
  sys.exit(code)


def parse_flags(argv: list[str]) -> list[str]:
  argv = [_named_config(a) for a in argv]
  """absl's parsing with its errors as one line: `app.run(main, flags_parser=parse_flags)`."""
  try:
    return flags.FLAGS(argv)
  except flags.Error as e:
    lines = [l.strip() for l in str(e).splitlines() if l.strip()]
    fail(lines[0] if lines else "invalid flags")


def _named_config(arg: str) -> str:
  """--config=lm:norm=post names a config shipped in lnjax/configs: its file's path then,
  so the name works from any directory (a path is left as it is)."""
  if not arg.startswith("--config="):
    return arg
  from lnjax import configs
  return "--config=" + configs.resolve(arg[len("--config="):])
