"""`python -m lnjax.cli.export` (`lnjax export`): a run's parameters as safetensors or a
Hugging Face folder (lnjax/inference/export.py).

  python -m lnjax.cli.export --workdir=DIR --format=safetensors|hf [--dtype=float32|bfloat16]
      [--checkpoint=best|latest|STEP|avg:N] [--output=DIR/export]
"""

import os

from lnjax.core import allocator
allocator.tune_glibc_malloc()  # glibc malloc for XLA:CPU, before JAX starts
from absl import app, flags, logging

from lnjax import cli
from lnjax.core import errors
from lnjax.inference import export

_WORKDIR = flags.DEFINE_string("workdir", None, "The run to export.", required=True)
_FORMAT = flags.DEFINE_string("format", "safetensors", "safetensors (lnjax's names) | hf (a "
                              "Hugging Face GPT-2 or BertForMaskedLM folder).")
_DTYPE = flags.DEFINE_string("dtype", "float32", "float32 | bfloat16")
_CHECKPOINT = flags.DEFINE_string("checkpoint", "best", "best (latest for runs without one) | "
                                  "latest | a step | avg:N")
_OUTPUT = flags.DEFINE_string("output", None, "The export folder (default WORKDIR/export).")


def main(argv):
  cli.refuse_arguments(argv)
  logging.set_verbosity(logging.FATAL)
  output = _OUTPUT.value or os.path.join(_WORKDIR.value, "export")
  try:
    result = export.export(_WORKDIR.value, output, _CHECKPOINT.value, _DTYPE.value,
                           _FORMAT.value)
  except errors.LnjaxError as e:
    cli.fail(str(e), e.exit_code)
  except OSError as e:
    cli.fail(f"{e.strerror or e}{f': {e.filename}' if e.filename else ''}")
  print(f"{result['num_parameters']:,} parameters ({result['dtype']}, checkpoint "
        f"{result['checkpoint']}, steps {', '.join(map(str, result['steps']))}) in {output}: "
        f"{', '.join(result['files'])}; load with "
        f"{result.get('load', f'lnjax.inference.export.load({output!r})')}")


if __name__ == "__main__":
  app.run(main, flags_parser=cli.parse_flags)
