r"""`python -m lnjax.cli.finetune` (`lnjax finetune`): fine-tune a BERT pre-training run on a
GLUE task over several seeds (lnjax/tasks/finetune.py).

  python -m lnjax.cli.finetune --config=configs/glue.py:task=mrpc \
      --config.data.init_workdir=/tmp/bert_pre --config.data.init_step=1000 --workdir=/tmp/mrpc
"""

import os
import sys

from lnjax.core import allocator
allocator.tune_glibc_malloc()  # glibc malloc for XLA:CPU, before JAX starts
from absl import app, flags, logging
from ml_collections import config_flags

from lnjax import cli
from lnjax.core import errors
from lnjax.tasks import finetune

PROG = "lnjax.cli.finetune"  # The errors' prefix.
_CONFIG = config_flags.DEFINE_config_file("config", None, "configs/glue.py[:presets].",
                                          lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "Where the results go.", required=True)


def main(argv):
  cli.refuse_arguments(argv, prog=PROG)
  logging.set_verbosity(logging.WARNING)
  from lnjax.core import preemption  # Imported late: JAX starts after flags.
  try:
    with preemption.Stop():  # Each seed's run saves on a stop; before one, a clean exit.
      summary = finetune.finetune(_CONFIG.value, _WORKDIR.value)
  except preemption.Preempted as e:
    print(f"{e}: stopped before a seed's first step; run the same command to resume.",
          file=sys.stderr, flush=True)
    os._exit(e.exit_code)
  except errors.LnjaxError as e:
    cli.fail(str(e), e.exit_code, prog=PROG)
  except OSError as e:
    cli.fail(f"{e.strerror or e}{f': {e.filename}' if e.filename else ''}", prog=PROG)
  if summary["status"] == "preempted":
    print(f"\n== stopped by SIGTERM during seed {summary['seeds'][-1]}; run the same command "
          "to resume", flush=True)
    sys.exit(143)
  print(f"\n== {finetune.format_summary(summary)}\n   results in {_WORKDIR.value}: seeds/<seed>/, "
        "summary.json")


if __name__ == "__main__":
  app.run(main, flags_parser=lambda argv: cli.parse_flags(argv, prog=PROG))
