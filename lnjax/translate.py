r"""Translate any text with a trained translation run.

  python -m lnjax.translate --workdir=DIR [--checkpoint=best|latest|STEP|avg:N]
      [--input=FILE|-] [--split=NAME] [--reference=FILE] [--output=FILE]
      [--beam_size=K] [--length_penalty=A] [--max_len=N]

Reads one source sentence per line (standard input by default, raw text as in the
corpus), writes one detokenized translation per line to standard output (or --output),
in the input's order; an empty line gives an empty line. Sentences are decoded in
batches of about data.max_tokens source tokens, sorted by length, exactly as
`--mode=predict` decodes a split: the same lines give the same hypotheses.

`--split=NAME` translates that split of the run's corpus (instead of --input) and
prints sacreBLEU against its references with the signature on stderr; `--reference=FILE`
does the same for your own input. Decode settings given here replace the run's
config.decode ones; an invalid one is refused with one line (exit 2), never ignored.
"""

import sys

from absl import app, flags, logging

from lnjax import allocator
allocator.tune_glibc_malloc()  # glibc malloc for XLA:CPU, before JAX starts
from lnjax import errors

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


def _read_lines(path: str) -> list[str]:
  text = sys.stdin.read() if path == "-" else open(path, encoding="utf-8").read()
  return text.splitlines()


def translate(workdir: str, lines: list[str] | None, checkpoint: str = "best",
              split: str | None = None, references: list[str] | None = None,
              overrides: dict | None = None, max_len: int | None = None) -> dict:
  """{'hypotheses': [...], 'bleu': ..., 'signature': ...} (BLEU with references or a split)."""
  from lnjax import checkpoint as ckpt_lib, evaluate, predict

  config = ckpt_lib.load_config(workdir)
  limit = config.model.max_len if config is not None else None
  if max_len is not None and limit is not None and not 1 <= max_len <= limit:
    raise errors.ConfigError(f"--max_len={max_len} must be in 1..{limit} (model.max_len: the "
                             "position embedding's reach)")
  t = predict.load(workdir, checkpoint, overrides)
  tokenize = "13a"
  if split is not None:
    if split not in t.data.splits:
      raise errors.LnjaxError(f"split {split!r} is not in {t.run.data.name}; available: "
                              f"{', '.join(t.data.splits)}")
    lines = t.data.sources(split)
    tokenize = t.data.sacrebleu_tokenize
    references = (t.data.tokenized_references(split) if tokenize == "none"
                  else t.data.references(split))
  if references is not None and len(references) != len(lines):
    raise errors.LnjaxError(f"{len(references)} references for {len(lines)} input lines")
  keep = [i for i, line in enumerate(lines) if line.strip()]
  hyps = [""] * len(lines)
  for i, h in zip(keep, t.translate([lines[i] for i in keep], max_len=max_len,
                                    desc=f"translating {split or 'input'}")):
    hyps[i] = h
  result = {"hypotheses": hyps, "checkpoint": checkpoint, "steps": t.chosen.steps,
            "beam_size": t.decode.beam_size, "length_penalty": t.decode.length_penalty}
  if references is not None:
    result.update(evaluate.bleu(hyps, references, tokenize))
  return result


def main(argv):
  if len(argv) > 1:
    _fail(f"unexpected arguments: {' '.join(argv[1:])}")
  logging.set_verbosity(logging.FATAL)
  if not _WORKDIR.value:
    _fail("--workdir is required")
  if _SPLIT.value and (_INPUT.present or _REFERENCE.value):
    _fail("--split translates the split's own sources against its references: drop --input "
          "and --reference")
  overrides = {k: v for k, v in (("beam_size", _BEAM.value),
                                 ("length_penalty", _LENPEN.value)) if v is not None}
  try:
    lines = None if _SPLIT.value else _read_lines(_INPUT.value)
    refs = _read_lines(_REFERENCE.value) if _REFERENCE.value else None
    result = translate(_WORKDIR.value, lines, _CHECKPOINT.value, _SPLIT.value, refs,
                       overrides, _MAX_LEN.value)
    text = "".join(h.replace("\n", " ") + "\n" for h in result["hypotheses"])
    if _OUTPUT.value == "-":
      sys.stdout.write(text)
      sys.stdout.flush()
    else:
      with open(_OUTPUT.value, "w", encoding="utf-8") as f:
        f.write(text)
  except errors.LnjaxError as e:
    _fail(str(e), e.exit_code)
  except OSError as e:
    _fail(f"{e.strerror or e}{f': {e.filename}' if e.filename else ''}")
  if "bleu" in result:
    print(f"BLEU {result['bleu']:.2f} ({result['signature']}) on "
          f"{len(result['hypotheses'])} sentences; checkpoint {result['checkpoint']} "
          f"(steps {', '.join(map(str, result['steps']))}), beam {result['beam_size']}",
          file=sys.stderr, flush=True)


def _fail(message: str, code: int = 2):
  print(f"lnjax: error: {message}", file=sys.stderr, flush=True)
  sys.exit(code)


if __name__ == "__main__":
  app.run(main)
