"""`python -m lnjax.cli.average` (`lnjax average`): the mean of a run's last N checkpoints
as a new workdir (lnjax/core/averaging.py).

  python -m lnjax.cli.average --workdir=DIR --last=N [--output=DIR_avgN]
"""

from lnjax.core import allocator
allocator.tune_glibc_malloc()  # glibc malloc for XLA:CPU, before JAX starts
from absl import app, flags, logging

from lnjax import cli, tasks
from lnjax.core import averaging, errors

_WORKDIR = flags.DEFINE_string("workdir", None, "The run whose checkpoints to average.",
                               required=True)
_LAST = flags.DEFINE_integer("last", 5, "Average the last N checkpoints (checkpoints/).",
                             lower_bound=1)
_OUTPUT = flags.DEFINE_string("output", None, "The new workdir (default: WORKDIR_avgN).")
cli.number("last", 1)


def main(argv):
  cli.refuse_arguments(argv)
  logging.set_verbosity(logging.FATAL)
  output = _OUTPUT.value or f"{_WORKDIR.value.rstrip('/')}_avg{_LAST.value}"
  try:
    result = averaging.write_average(_WORKDIR.value, _LAST.value, output, tasks=tasks.get)
  except errors.LnjaxError as e:
    cli.fail(str(e), e.exit_code)
  print(f"averaged steps {', '.join(map(str, result['steps']))} of {_WORKDIR.value} into "
        f"{output} (step {result['step']}); use --workdir={output} with any lnjax tool")


if __name__ == "__main__":
  app.run(main, flags_parser=cli.parse_flags)
