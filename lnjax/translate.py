r"""Translate any text with a trained translation run.

  python -m lnjax.translate --workdir=DIR [--checkpoint=best|latest|STEP|avg:N]
      [--input=FILE|-] [--split=NAME] [--reference=FILE] [--output=FILE]
      [--beam_size=K] [--length_penalty=A] [--max_len=N]

Reads one source sentence per line (standard input by default, raw text as in the
corpus), writes one detokenized translation per line to standard output (or --output),
in the input's order; an empty line gives an empty line. A line that is not UTF-8 text
(binary or Latin-1 input) gives an empty line too, so that every translation stays
beside its source, and the count of such lines with the first of their numbers is
reported in one warning line on stderr; the valid lines are translated. Lines end at
"\n" only (as `wc -l` counts them; a "\r" before it is dropped). Sentences are decoded in
batches of about data.max_tokens source tokens, sorted by length, exactly as
`--mode=predict` decodes a split: the same lines give the same hypotheses.

`--split=NAME` translates that split of the run's corpus (instead of --input) and
prints sacreBLEU against its references with the signature on stderr; `--reference=FILE`
does the same for your own input. Decode settings given here replace the run's
config.decode ones; an invalid one is refused with one line (exit 2), never ignored.
"""

import contextlib
import sys

from absl import app, flags, logging

from lnjax import allocator
allocator.tune_glibc_malloc()  # glibc malloc for XLA:CPU, before JAX starts
from lnjax import cli, errors


def _define_flags() -> None:
  """The command's flags, defined when it runs only: the module is a library too, and
  a process importing several tools would see flags of the same name twice."""
  global _WORKDIR, _CHECKPOINT, _INPUT, _SPLIT, _REFERENCE, _OUTPUT, _BEAM, _LENPEN, _MAX_LEN
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


def read_lines(path: str) -> tuple[list[str], list[int]]:
  """The lines of `path` (- = stdin) and the numbers (from 1) of those that are not UTF-8
  text, read as empty lines."""
  with (open(path, "rb") if path != "-" else contextlib.nullcontext(sys.stdin.buffer)) as f:
    data = f.read()
  raw = data.split(b"\n")
  if raw[-1] == b"":  # (The newline ending the last line.)
    raw.pop()
  lines, bad = [], []
  for number, line in enumerate(raw, 1):
    try:
      lines.append(line.removesuffix(b"\r").decode("utf-8"))
    except UnicodeDecodeError:
      lines.append("")
      bad.append(number)
  return lines, bad


def _warn_undecodable(path: str, bad: list[int]) -> None:
  if bad:
    first = ", ".join(map(str, bad[:5])) + (", ..." if len(bad) > 5 else "")
    print(f"lnjax: warning: {len(bad)} line(s) of {'stdin' if path == '-' else path} are not "
          f"UTF-8 text (line {first}): left empty in the output", file=sys.stderr, flush=True)


def translate_run(workdir: str, lines: list[str] | None, checkpoint: str = "best",
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
  for i, h in zip(keep, t.translate_lines([lines[i] for i in keep], max_len=max_len,
                                    desc=f"translating {split or 'input'}")):
    hyps[i] = h
  result = {"hypotheses": hyps, "checkpoint": checkpoint, "steps": t.chosen.steps,
            "beam_size": t.decode.beam_size, "length_penalty": t.decode.length_penalty}
  if references is not None:
    result.update(evaluate.bleu(hyps, references, tokenize))
  return result


def main(argv):
  if len(argv) > 1:
    cli.fail(f"unexpected arguments: {' '.join(argv[1:])}")
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
      from lnjax import fileio
      fileio.refuse_run_files("--output", _OUTPUT.value, [_OUTPUT.value])
    lines = refs = None
    if not _SPLIT.value:
      lines, bad = read_lines(_INPUT.value)
      _warn_undecodable(_INPUT.value, bad)
    if _REFERENCE.value:
      refs, bad = read_lines(_REFERENCE.value)
      _warn_undecodable(_REFERENCE.value, bad)
    result = translate_run(_WORKDIR.value, lines, _CHECKPOINT.value, _SPLIT.value, refs,
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
  _define_flags()
  app.run(main, flags_parser=cli.parse_flags)
