r"""Translate any text with a trained translation run (the command: lnjax/cli/translate.py).

`python -m lnjax.cli.translate` reads one source sentence per line (standard input by
default, raw text as in the corpus), writes one detokenized translation per line to
standard output (or --output), in the input's order; an empty line gives an empty line. A
line that is not UTF-8 text (binary or Latin-1 input) gives an empty line too, so that
every translation stays beside its source, and the count of such lines with the first of
their numbers is reported in one warning line on stderr; the valid lines are translated.
Lines end at "\n" only (as `wc -l` counts them; a "\r" before it is dropped). Sentences
are decoded in batches of about data.max_tokens source tokens, sorted by length, exactly
as `--mode=predict` decodes a split: the same lines give the same hypotheses.

`--split=NAME` translates that split of the run's corpus (instead of --input) and
prints sacreBLEU against its references with the signature on stderr; `--reference=FILE`
does the same for your own input. Decode settings given here replace the run's
config.decode ones; an invalid one is refused with one line (exit 2), never ignored.
"""

import contextlib
import sys

from lnjax.core import errors


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


def warn_undecodable(path: str, bad: list[int]) -> None:
  if bad:
    first = ", ".join(map(str, bad[:5])) + (", ..." if len(bad) > 5 else "")
    print(f"lnjax: warning: {len(bad)} line(s) of {'stdin' if path == '-' else path} are not "
          f"UTF-8 text (line {first}): left empty in the output", file=sys.stderr, flush=True)


def translate_run(workdir: str, lines: list[str] | None, checkpoint: str = "best",
                  split: str | None = None, references: list[str] | None = None,
                  overrides: dict | None = None, max_len: int | None = None) -> dict:
  """{'hypotheses': [...], 'bleu': ..., 'signature': ...} (BLEU with references or a split)."""
  from lnjax.core import checkpoint as ckpt_lib
  from lnjax.inference import evaluate, predict

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
