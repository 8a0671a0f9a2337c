"""`python -m lnjax.cli.compare` (`lnjax compare`): curves and a table of several runs,
whatever made them (lnjax/analysis/compare.py).

  python -m lnjax.cli.compare DIR1 DIR2 ... [--output=compare] [--title=TITLE]
"""

from absl import app, flags

from lnjax import cli
from lnjax.analysis import compare
from lnjax.core import errors

_OUTPUT = flags.DEFINE_string("output", "compare", "Stem of the PNG and Markdown files.")
_TITLE = flags.DEFINE_string("title", None, "Title of the figure.")


def main(argv):
  workdirs = argv[1:]
  if not workdirs:
    cli.fail("give the workdirs to compare: python -m lnjax.cli.compare DIR1 DIR2 ...")
  try:
    result = compare.compare(workdirs, _OUTPUT.value, _TITLE.value)
  except (OSError, ValueError, errors.LnjaxError) as e:
    cli.fail(str(e))
  print(result["table"])
  print(f"curves in {result['png']}, table in {result['markdown']}")


if __name__ == "__main__":
  app.run(main, flags_parser=cli.parse_flags)
