"""What every command shares on the command line: a bad flag, like any refusal, is one line
on stderr and exit code 2 (absl's own report is a usage hint and exit 1)."""

import sys

from absl import flags


def fail(message: str, code: int = 2):
  print(f"lnjax: error: {message}", file=sys.stderr, flush=True)
  sys.exit(code)


def parse_flags(argv: list[str]) -> list[str]:
  """absl's parsing with its errors as one line: `app.run(main, flags_parser=parse_flags)`."""
  try:
    return flags.FLAGS(argv)
  except flags.Error as e:
    lines = [l.strip() for l in str(e).splitlines() if l.strip()]
    fail(lines[0] if lines else "invalid flags")
