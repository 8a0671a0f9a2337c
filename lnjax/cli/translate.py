"""`python -m lnjax.cli.translate` (`lnjax translate`): translate text with a trained
translation run (lnjax/inference/translate.py).

  python -m lnjax.cli.translate --workdir=DIR [--checkpoint=best|latest|STEP|avg:N]
      [--input=FILE|-] [--split=NAME] [--reference=FILE] [--output=FILE]
      [--beam_size=K] [--length_penalty=A] [--max_len=N]
"""

import sys

from lnjax.core import allocator
allocator.tune_glibc_malloc()  # glibc malloc for XLA:CPU, before JAX starts
from absl import app, flags, logging

from lnjax import cli
from lnjax.core import errors, fileio
from lnjax.inference import translate

_WORKDIR = flags.DEFINE_string("workdir", None, "A translation run's workdir.")
_CHECKPOINT = flags.DEFINE_string("checkpoint", "best", "best | latest | a step | avg:N (the "
                                  "mean of the last N checkpoints' parameters).")
_INPUT = flags.DEFINE_string("input", "-", "Source sentences, one per line; - = stdin.")
_SPLIT = flags.DEFINE_string("split", None, "Translate this split of the run's corpus and "
                             "score it against its references (instead of --input).")
_REFERENCE = flags.DEFINE_string("reference", None, "References of --input, one per line: "
                                 "print sacreBLEU on stderr.")
_OUTPUT = flags.DEFINE_string("output", "-", "Where the translations go; - = stdout.")
_BEAM = flags.DEFINE_integer("beam_size", None, "Beam size (1 = greedy); default the run's "
                             "decode.beam_size.")
_LENPEN = flags.DEFINE_float("length_penalty", None, "α in log p / length^α; default the "
                             "run's decode.length_penalty.")
_MAX_LEN = flags.DEFINE_integer("max_len", None, "Longest hypothesis in tokens (EOS "
                                "included); default source length + decode.max_extra_len. "
                                "At most model.max_len.")
cli.number("beam_size", 1)
cli.number("length_penalty", 0.0)  # As decode.length_penalty.
cli.number("max_len", 1)


def main(argv):
  cli.refuse_arguments(argv)
  logging.set_verbosity(logging.FATAL)
  if not _WORKDIR.value:
    cli.fail("--workdir is required")
  if _SPLIT.value and (_INPUT.present or _REFERENCE.value):
    cli.fail("--split translates the split's own sources against its references: drop --input "
             "and --reference")
  overrides = {k: v for k, v in (("beam_size", _BEAM.value),
                                 ("length_penalty", _LENPEN.value)) if v is not None}
  try:
    if _OUTPUT.value != "-":
      fileio.refuse_run_files("--output", _OUTPUT.value, [_OUTPUT.value], own=[_WORKDIR.value])
    lines = refs = None
    if not _SPLIT.value:
      lines, bad = translate.read_lines(_INPUT.value)
      translate.warn_undecodable(_INPUT.value, bad)
    if _REFERENCE.value:
      refs, bad = translate.read_lines(_REFERENCE.value)
      translate.warn_undecodable(_REFERENCE.value, bad)
    result = translate.translate_run(_WORKDIR.value, lines, _CHECKPOINT.value, _SPLIT.value, refs,
                                     overrides, _MAX_LEN.value)
    text = "".join(h.replace("\n", " ") + "\n" for h in result["hypotheses"])
    if _OUTPUT.value == "-":
      sys.stdout.write(text)
      sys.stdout.flush()
    else:
      with open(_OUTPUT.value, "w", encoding="utf-8") as f:
        f.write(text)
  except errors.LnjaxError as e:
    cli.fail(str(e), e.exit_code)
  except OSError as e:
    cli.fail(f"{e.strerror or e}{f': {e.filename}' if e.filename else ''}")
  if "bleu" in result:
    print(f"BLEU {result['bleu']:.2f} ({result['signature']}) on "
          f"{len(result['hypotheses'])} sentences; checkpoint {result['checkpoint']} "
          f"(steps {', '.join(map(str, result['steps']))}), beam {result['beam_size']}",
          file=sys.stderr, flush=True)


if __name__ == "__main__":
  app.run(main, flags_parser=cli.parse_flags)
