"""Trains a model: python -m lnjax.main --config=configs/default.py --workdir=/tmp/lnjax_default

Presets go in the config argument (--config=configs/lm.py:norm=post,smoke), one-off
changes in flags (--config.opt.learning_rate=3e-4). Exit codes: 0 completed, 2 a bad
config, workdir, data set or checkpoint, or a failed write such as a full disk (one line
on stderr), 3 diverged (a NaN/Inf loss, or one above train.divergence_factor × ln V), 143
stopped by SIGTERM after saving a checkpoint.
"""

import gc
import os
import re
import sys

from lnjax.core import allocator
allocator.tune_glibc_malloc()  # glibc malloc for XLA:CPU, before JAX starts
from absl import app, flags, logging
from ml_collections import config_flags

from lnjax import cli
from lnjax.core import errors, fileio

_CONFIG = config_flags.DEFINE_config_file("config", None, "Config file[:presets].",
                                          lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "Directory for checkpoints, metrics and summary.")
_DISTRIBUTED = flags.DEFINE_bool(
    "distributed", False, "Join a multi-process run with jax.distributed.initialize(): "
    "SLURM and Cloud TPU VMs are detected from the environment; elsewhere also give "
    "--coordinator_address, --num_processes and --process_id.")
_COORDINATOR = flags.DEFINE_string("coordinator_address", None, "host:port of process 0.")
_NUM_PROCESSES = flags.DEFINE_integer("num_processes", None, "Processes in the run.")
_PROCESS_ID = flags.DEFINE_integer("process_id", None, "This process's index.")
cli.number("num_processes", 1)
cli.number("process_id", 0)
_MODE = flags.DEFINE_enum("mode", "train", ["train", "predict"],
                          "train: train (or resume) the run in --workdir; predict: decode "
                          "--split with the run's --checkpoint and score it (translation).")
_SPLIT = flags.DEFINE_string("split", None, "predict: the split (default data.test_split).")
_CHECKPOINT = flags.DEFINE_string("checkpoint", "best", "predict: best | latest | a step | "
                                  "avg:N (the mean of the last N checkpoints' parameters). "
                                  "Decode settings: --config.decode.beam_size=K, ... (no "
                                  "--config: the run's own config.json is used).")
_PRINT_CONFIG = flags.DEFINE_bool("print_config", False, "Print every key of --config with "
                                  "its value and comment, and exit.")
_DECODE_OVERRIDES = {}  # --mode=predict: the --config.decode.KEY=VALUE flags (no --config).

EXIT_CODES = {"completed": 0, "diverged": 3, "preempted": 143}
# What a run may write in its workdir; the summary lists those it wrote.
RESULTS = ("metrics.jsonl", "tensorboard", "checkpoints", "best_checkpoint", "summary.json")
RESULT_FOLDERS = ("tensorboard", "checkpoints", "best_checkpoint")


def _parse_flags(argv):
  """absl's parsing, with any error reported as one line (no traceback, no usage text)."""
  if not any(a == "--config" or a.startswith("--config=") for a in argv):
    # Without --config, --config.decode.* are predict's decode settings (config_flags
    # would refuse them as keys of a config it does not have).
    for arg in [a for a in argv if a.startswith("--config.decode.") and "=" in a]:
      key, value = arg[len("--config.decode."):].split("=", 1)
      _DECODE_OVERRIDES[key] = _literal(value)
      argv = [a for a in argv if a != arg]
  return cli.parse_flags(argv)


def _literal(text: str):
  """'4' -> 4, '0.6' -> 0.6, 'true' -> True, anything else the string itself."""
  for kind in (int, float):
    try:
      return kind(text)
    except ValueError:
      pass
  return {"true": True, "false": False}.get(text.lower(), text)


def _quiet_closed_loop(unraisable, _default=sys.unraisablehook):
  """A failed orbax save (a full disk) closes its asyncio loop while tensorstore still
  holds writes of that save; as they fail too, their callbacks report 'Event loop is
  closed'. The save's own error reaches the loop, which reports it in one line."""
  value = unraisable.exc_value
  if isinstance(value, RuntimeError) and str(value) == "Event loop is closed":
    return
  _default(unraisable)


def main(argv):
  sys.unraisablehook = _quiet_closed_loop
  cli.refuse_arguments(argv)
  # No absl log lines: orbax logs a failed background save (a full disk) with its
  # traceback; the error then reaches the loop, which reports it in one line.
  logging.set_verbosity(logging.FATAL)
  if _PRINT_CONFIG.value:
    if _CONFIG.value is None:
      cli.fail("--print_config needs --config=FILE[:presets]")
    from lnjax.configs import doc as config_doc
    print(config_doc.describe(_CONFIG.value,
                              config_flags.get_config_filename(flags.FLAGS["config"])))
    return
  if not _WORKDIR.value:
    cli.fail("--workdir is required")
  if _MODE.value == "predict" and _CONFIG.value is not None:
    cli.fail("--mode=predict decodes with the run's own config.json: drop --config (decode "
          "settings: --config.decode.beam_size=K, --config.decode.length_penalty=A, "
          "--config.decode.max_extra_len=N)")
  if _DISTRIBUTED.value or _COORDINATOR.value:
    _initialize_distributed()
  from lnjax import tasks
  from lnjax.core import preemption, train  # Imported late: JAX starts after flags.
  from lnjax.inference import predict
  cli.freeze_imports()
  try:
    if _MODE.value == "predict":
      result = predict.predict(_WORKDIR.value, _SPLIT.value, _CHECKPOINT.value,
                               _DECODE_OVERRIDES)
      steps = ", ".join(map(str, result["steps"]))
      print(f"{result['split']}: BLEU {result['bleu']:.2f} ({result['signature']}), "
            f"checkpoint {_CHECKPOINT.value} (step{'s' if len(result['steps']) > 1 else ''} "
            f"{steps}), beam {result['beam_size']}, length penalty {result['length_penalty']}, "
            f"{result['sentences_per_second']:.1f} sentences/s; "
            f"hypotheses in {result['hypotheses_file']}")
      return
    if _CONFIG.value is None:
      cli.fail("--config is required to train")
    summary = train.train_and_evaluate(_CONFIG.value, _WORKDIR.value, tasks=tasks.get)
  except preemption.Preempted as e:  # Before the first step: nothing to save yet.
    print(f"{e}: stopped before the first step; run the same command to start.",
          file=sys.stderr, flush=True)
    os._exit(e.exit_code)
  except errors.LnjaxError as e:
    cli.fail(str(e), e.exit_code)
  except OSError as e:  # A full disk, a lost mount: the run resumes from its last checkpoint.
    cli.fail(f"{e.strerror or e}{f': {e.filename}' if e.filename else ''}; fix it and run the "
          "same command to resume")
  import jax
  if jax.process_index() == 0:
    print_summary(summary)
  if summary["status"] == "preempted" and jax.process_count() == 1:
    # A stop has a deadline (SLURM's kill follows the signal): the checkpoint, metrics and
    # summary are written and closed, so skip the interpreter's teardown, which frees every
    # compiled executable and buffer (3 s of a 5-8 s stop at load 18). Many processes
    # exit normally: jax.distributed's shutdown at exit keeps the others in step.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(EXIT_CODES["preempted"])
  sys.exit(EXIT_CODES[summary["status"]])


def _initialize_distributed() -> None:
  """One process per host (or per GPU): all of them run this same command."""
  import jax
  if jax.config.jax_platforms in (None, "", "cpu") and not _on_accelerator():
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
  jax.distributed.initialize(coordinator_address=_COORDINATOR.value,
                             num_processes=_NUM_PROCESSES.value, process_id=_PROCESS_ID.value,
                             local_device_ids=_node_gpus_under_slurm())


def _node_gpus_under_slurm() -> list[int] | None:
  """Under SLURM, jax.distributed gives each process the one GPU of its local rank: right
  for a task per GPU. A lone task on its node (--ntasks-per-node=1) drives all the GPUs
  SLURM gave the node instead. None: jax's own choice (or JAX_LOCAL_DEVICE_IDS)."""
  tasks_here = os.environ.get("SLURM_STEP_TASKS_PER_NODE", "")
  gpus = [g for g in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if g.strip()]
  if (re.fullmatch(r"1(\(x\d+\))?", tasks_here) and len(gpus) > 1
      and "JAX_LOCAL_DEVICE_IDS" not in os.environ):
    return list(range(len(gpus)))
  return None


def _on_accelerator() -> bool:
  import importlib.util
  return any(importlib.util.find_spec(m) for m in ("jax_cuda12_plugin", "jax_cuda13_plugin",
                                                   "libtpu"))


def print_summary(s: dict) -> None:
  print(f"\n== {s['status']} at step {s['step']}/{s['num_steps']} "
        f"(norm_position={s['norm_position']}, {s['num_params']:,} parameters, "
        f"{s['wall_seconds']:.0f} s)")
  if s["eval_loss"] is not None:
    line = f"   held-out loss {s['eval_loss']:.4f} nats (perplexity {s['eval_perplexity']:.2f})"
    if s.get("unigram_baseline") is not None:
      gap = s["unigram_baseline"] - s["eval_loss"]
      line += (f"; unigram baseline {s['unigram_baseline']:.4f}: {gap:+.4f} nats "
               f"{'better' if gap > 0 else 'not better'} than token frequencies alone")
    print(line)
  if s.get("eval_bleu") is not None:
    print(f"   BLEU {s['eval_bleu']:.2f} (best {s['best_eval_bleu']:.2f}, kept in best_checkpoint/)")
  if s["status"] == "diverged":
    print(f"   last finite train loss {s['last_finite_train_loss']} at step {s['last_finite_step']}")
  written = [name for name in RESULTS if fileio.exists(os.path.join(s["workdir"], name))]
  print(f"   results in {s['workdir']}: "
        f"{', '.join(n + '/' if n in RESULT_FOLDERS else n for n in written)}")


if __name__ == "__main__":
  gc.disable()  # While the flags' config file and main() import jax, flax...: cli.freeze_imports.
  app.run(main, flags_parser=_parse_flags)
