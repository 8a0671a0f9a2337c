"""`python -m lnjax.cli.analyze` (`lnjax analyze`): a run's gradients, norms and norm
Jacobians at a step, or a Hugging Face checkpoint's (--hf); lnjax/analysis/report.py.

  python -m lnjax.cli.analyze --workdir=DIR [--step=N|init|latest|best|avg:N] [--batches=4]
  python -m lnjax.cli.analyze --hf=gpt2 --text=FILE
  python -m lnjax.cli.analyze --hf=DIR --text=FILE --tokenizer=DIR_OR_NAME
  python -m lnjax.cli.analyze --hf=DIR --token_ids=FILE
"""

from lnjax.core import allocator
allocator.tune_glibc_malloc()  # glibc malloc for XLA:CPU, before JAX starts
from absl import app, flags, logging

from lnjax import cli
from lnjax.analysis import report

_WORKDIR = flags.DEFINE_string("workdir", None, "The run's workdir (or --hf).")
_STEP = flags.DEFINE_string("step", "latest", "init | latest | best | a checkpoint step | "
                            "avg:N (the mean of the last N checkpoints' parameters).")
_BATCHES = flags.DEFINE_integer("batches", 4, "Held-out batches to average over.")
_LR = flags.DEFINE_float("lr", None, "Learning rate of the update ratios (default: the "
                         "run's peak opt.learning_rate).")
cli.number("batches", 1)
cli.number("lr", 0.0, low_open=True)
_SHARPNESS = flags.DEFINE_integer(
    "sharpness", 0, "Lanczos iterations for the loss's sharpness: the Hessian's largest "
    "eigenvalue, raw and under Adam's preconditioner (the checkpoint's second moment), and "
    "the learning rate at Adam's stability threshold 38/λ (at β₁ 0.9), or SGD's; 0: not "
    "measured (each iteration costs about two gradients of the batches; at most 1000, the "
    "basis kept in memory).")
cli.number("sharpness", 0, 1000)
_HF = flags.DEFINE_string("hf", None, "Instead of a run: a Hugging Face model folder (GPT-2, "
                          "BERT, Llama, Qwen3, Gemma 2/3, OLMo 2), or a hub name (gpt2, "
                          "bert-base-uncased: fetched when online).")
_TEXT = flags.DEFINE_string("text", None, "With --hf: the UTF-8 text file its loss is on.")
_TOKENIZER = flags.DEFINE_string("tokenizer", None, "With --hf and --text: the folder (or hub "
                                 "name) of the tokenizer, for a model folder without one.")
_TOKEN_IDS = flags.DEFINE_string("token_ids", None, "With --hf, instead of --text: token ids, "
                                 "a .npy integer array or integers separated by white space.")
_OUTPUT = flags.DEFINE_string("output", None, "With --hf: the report's folder (default "
                              "hf_analysis/NAME).")


def main(argv):
  del argv
  logging.set_verbosity(logging.WARNING)
  from lnjax.core import errors, fileio, progress  # Imported late: JAX starts after flags.
  try:
    if _HF.value is not None and _SHARPNESS.value:
      raise errors.LnjaxError("--sharpness measures a run's checkpoint (--workdir), not a "
                              "Hugging Face folder (--hf)")
    if _HF.value is not None or _WORKDIR.value is None:  # lnjax/hf/analyze.py
      # Its report's folder (default ./hf_analysis/NAME) is in no run.
      fileio.refuse_run_files("--output", _OUTPUT.value, [_OUTPUT.value or "hf_analysis"])
      from lnjax.hf import analyze as hf_analyze
      with progress.Phase(f"analyzing {_HF.value}"):
        result, out = hf_analyze.analyze_flags(
            _HF.value, _TEXT.value, _OUTPUT.value, _BATCHES.value, _LR.value,
            report=report.figures, tokenizer=_TOKENIZER.value, token_ids=_TOKEN_IDS.value)
      print(f"{result['architecture']} as {result['placement']}: loss "
            f"{result['loss']:.4f}; report, JSON and plots in {out}")
      return
    with progress.Phase(f"analyzing {_WORKDIR.value} at {_STEP.value}"):
      result, out = report.analyze(_WORKDIR.value, _STEP.value, _BATCHES.value, _LR.value,
                                   _SHARPNESS.value)
  except errors.LnjaxError as e:
    cli.fail(str(e), e.exit_code)
  except OSError as e:
    cli.fail(f"{e.strerror or e}{f': {e.filename}' if e.filename else ''}")
  print(f"step {result['step']}: loss {result['loss']:.4f}; report, JSON and plots in {out}")


if __name__ == "__main__":
  app.run(main, flags_parser=cli.parse_flags)
