"""One metrics path: scalars to `metrics.jsonl` in the workdir (the source of truth), mirrored
to TensorBoard event files and, with train.wandb_project, to Weights & Biases; plus the
console progress line. Only process 0 writes.
"""

import json
import math
import os
import secrets
import sys
import tempfile
import time

import jax

from lnjax.core import fileio, progress

METRICS_FILE = "metrics.jsonl"


class MetricWriter:
  """Appends {"step": s, name: value, ...} lines; names carry train_/eval_ prefixes."""

  def __init__(self, workdir: str, tensorboard: bool = True, wandb_project: str = "",
               config: dict | None = None):
    self.enabled = jax.process_index() == 0
    self.path = os.path.join(workdir, METRICS_FILE)
    self._wandb = (_start_wandb(workdir, wandb_project, config)
                   if self.enabled and wandb_project else None)
    self._tb = None
    self._tb_dir = os.path.join(workdir, "tensorboard")
    if self.enabled and tensorboard:
      # Event files are written locally; a bucket workdir gets them when the writer closes.
      self._tb_local = (tempfile.mkdtemp(prefix="lnjax_tb_") if fileio.is_remote(workdir)
                        else self._tb_dir)
      self._tb = _EventWriter(self._tb_local)

  def write(self, step: int, scalars: dict[str, float]) -> None:
    if not self.enabled:
      return
    record = {"step": int(step), **{k: _jsonable(v) for k, v in scalars.items()}}
    fileio.append_text(self.path, json.dumps(record) + "\n")
    if self._wandb is not None:
      self._wandb.log({k: float(v) for k, v in scalars.items()}, step=int(step))
    if self._tb is not None:
      self._tb.add_scalars(int(step), scalars)

  def close(self) -> None:
    if self._wandb is not None:
      self._wandb.finish()
      self._wandb = None
    if self._tb is not None:
      self._tb.close()
      if self._tb_local != self._tb_dir:
        fileio.copy_tree(self._tb_local, self._tb_dir)


class _EventWriter:
  """Scalars to TensorBoard event files with TensorBoard's own writer (the one
  torch.utils.tensorboard uses; no TensorFlow needed). tensorboardX's, used before, imports
  torch where it is installed: 1.8 s of a run's start, against 0.4 s for this one
  (`python -X importtime`, 2026-12-07, 2-core machine)."""

  def __init__(self, logdir: str):
    from tensorboard.compat.proto import event_pb2, summary_pb2
    from tensorboard.summary.writer.event_file_writer import EventFileWriter
    self._event, self._summary = event_pb2.Event, summary_pb2.Summary
    self._writer = EventFileWriter(logdir)

  def add_scalars(self, step: int, scalars: dict[str, float]) -> None:
    values = [self._summary.Value(tag=k, simple_value=float(v)) for k, v in scalars.items()]
    self._writer.add_event(self._event(wall_time=time.time(), step=step,
                                       summary=self._summary(value=values)))

  def close(self) -> None:
    self._writer.close()


WANDB_ID_FILE = "wandb_run_id"


def _start_wandb(workdir: str, project: str, config: dict | None):
  """A Weights & Biases run named after the workdir, with the run's config; a resumed
  run logs on into the same W&B run (its id is kept in the workdir). WANDB_MODE=offline
  writes it under <workdir>/wandb/ for a later `wandb sync`."""
  import wandb

  id_path = os.path.join(workdir, WANDB_ID_FILE)
  run_id = (fileio.read_text(id_path) or "").strip() or secrets.token_hex(4)
  fileio.write_text(id_path, run_id + "\n")
  local = "://" not in workdir  # W&B writes its files locally.
  run = wandb.init(project=project, name=os.path.basename(os.path.normpath(workdir)),
                   id=run_id, resume="allow", config=config or {},
                   dir=workdir if local else None,
                   settings=wandb.Settings(console="off", quiet=True))
  return run


def _jsonable(v) -> float | None:
  v = float(v)
  return v if math.isfinite(v) else None  # JSON has no NaN; None marks it.


def per_weight_norms(tree, prefix: str) -> dict:
  """{'<prefix>/layer_3/ffn/wi/kernel': ‖leaf‖_F, ...} for every leaf of a parameter-shaped
  tree (jittable): per layer and sub-layer, so warm-up can be watched as it happens."""
  flat = jax.tree_util.tree_flatten_with_path(tree)[0]
  return {prefix + "/" + "/".join(str(getattr(k, "key", k)) for k in path):
          jax.numpy.sqrt(jax.numpy.sum(jax.numpy.square(leaf.astype(jax.numpy.float32))))
          for path, leaf in flat}


def read_metrics(workdir: str) -> list[dict]:
  """The records of `metrics.jsonl`, in order. A line that is not a JSON record (the last
  one cut by a kill or a full disk) is left out with a warning."""
  path = os.path.join(workdir, METRICS_FILE)
  text = fileio.read_text(path)
  if text is None:
    return []
  records = []
  for number, line in enumerate(text.splitlines(), 1):
    if not line.strip():
      continue
    try:
      record = json.loads(line)
      if not isinstance(record, dict) or not isinstance(record.get("step"), int):
        raise ValueError("not a record with a step")
    except ValueError:
      print(f"warning: {path} line {number} is not a JSON record (cut by an interrupted "
            f"write?): {line[:60]!r}; left out", file=sys.stderr, flush=True)
      continue
    records.append(record)
  return records


def truncate_metrics(workdir: str, step: int) -> None:
  """Drops the records logged after `step` (and any unreadable line): a run resumed from
  the checkpoint of `step` logs those steps again, so its metrics.jsonl then equals an
  uninterrupted run's record for record."""
  if jax.process_index() != 0:
    return
  path = os.path.join(workdir, METRICS_FILE)
  text = fileio.read_text(path)
  if text is None:
    return
  kept = [r for r in read_metrics(workdir) if r["step"] <= step]
  new = "".join(json.dumps(r) + "\n" for r in kept)
  if new != text:
    fileio.write_text(path, new)


# The time jax spends preparing programs (tracing, lowering, XLA compiling, or reading them
# from the compilation cache), as jax.monitoring reports it: kept out of tokens/s and the ETA.
_PREPARING_EVENTS = ("/jax/core/compile/jaxpr_trace_duration",
                     "/jax/core/compile/jaxpr_to_mlir_module_duration",
                     "/jax/core/compile/backend_compile_duration")
_preparing_seconds = [0.0]


def _count_preparing(event: str, seconds: float, **_) -> None:
  if event in _PREPARING_EVENTS:
    _preparing_seconds[0] += seconds


jax.monitoring.register_event_duration_secs_listener(_count_preparing)


class Progress:
  """The console line: step, loss, lr, gradient norm, target tokens/s, ETA. Every program
  jax prepares meanwhile is kept out of tokens/s and the ETA: the first step of each batch
  shape (a translation run has one shape per length bucket), the health statistics'
  forward pass (at the first log step), a recovery's scaled step."""

  def __init__(self, num_steps: int, first_step: int, num_shapes: int = 1):
    self.num_steps = num_steps
    self.num_shapes = num_shapes
    self._shapes = set()
    self.restart_clock(first_step)

  def compiling(self, shape: tuple) -> str | None:
    """'compiling bucket 3/7 (128×16)' the first time a batch shape comes, else None."""
    if shape in self._shapes:
      return None
    self._shapes.add(shape)
    if self.num_shapes <= 1:
      return "compiling the train step"
    return (f"compiling bucket {len(self._shapes)}/{self.num_shapes} "
            f"({'×'.join(map(str, shape))})")

  def restart_clock(self, step: int) -> None:
    """Excludes time spent outside training steps (evaluation, checkpoints) from the rate."""
    self._t0, self._s0, self._tokens = time.perf_counter(), step, 0.0
    self._preparing0 = _preparing_seconds[0]

  def add_tokens(self, n: float) -> None:
    """Real (unpadded) target tokens of one step, over all processes."""
    self._tokens += n

  def line(self, step: int, loss: float, lr: float, grad_norm: float) -> str:
    elapsed = time.perf_counter() - self._t0 - (_preparing_seconds[0] - self._preparing0)
    steps = step - self._s0
    rate = steps / elapsed if steps > 0 and elapsed > 0 else float("nan")
    tokens_per_s = self._tokens / elapsed if steps > 0 and elapsed > 0 else float("nan")
    eta = (self.num_steps - step) / rate if rate == rate and rate > 0 else float("nan")
    self.restart_clock(step)
    speed = f"{tokens_per_s:9.0f}" if tokens_per_s == tokens_per_s else f"{'--':>9}"
    return (f"step {step:>6}/{self.num_steps}  loss {loss:7.4f}  lr {lr:.3e}  "
            f"grad_norm {grad_norm:8.3f}  {speed} tok/s  ETA {progress.hms(eta)}")
