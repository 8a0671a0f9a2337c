"""train_and_evaluate: a run in its workdir (checks, lock, resume, summary), trained by the
loop of lnjax/core/loop.py with the hooks of lnjax/core/hooks.py on what
lnjax/core/build.py builds."""

import dataclasses
import json
import math
import os
import time

import jax
import ml_collections

from lnjax.core import build as build_lib, checkpoint as ckpt_lib, errors, fileio
from lnjax.core import health_hooks, hooks as hooks_lib, lock as lock_lib, loop as loop_lib
from lnjax.core import metrics as metrics_lib, preemption, run as run_lib, task as task_lib
from lnjax.models import count_params

# Exit statuses of a run (lnjax.main turns them into exit codes).
COMPLETED, DIVERGED, PREEMPTED = hooks_lib.COMPLETED, hooks_lib.DIVERGED, hooks_lib.PREEMPTED
RUNNING = hooks_lib.RUNNING  # summary.json while the run trains (its wall time so far).
FAILED = "failed"  # summary.json of a run ended by a refusal (a save, a data set) or I/O error.

# Keys that may change between an interrupted run and its resumption.
RESUMABLE_KEYS = ("train.num_steps", "train.log_every_steps", "train.eval_every_steps",
                  "train.checkpoint_every_steps", "train.keep_checkpoints", "train.tensorboard",
                  "train.log_grad_norms", "train.divergence_factor", "train.health",
                  "train.compilation_cache_dir", "train.profile_steps", "train.wandb_project",
                  "data.data_dir", "data.cache_dir", "mesh.data", "mesh.fsdp", "mesh.model",
                  "mesh.dcn_data", "mesh.dcn_fsdp", "mesh.dcn_model")


def prepare_workdir(workdir: str, config: ml_collections.ConfigDict, *,
                    tasks: run_lib.TaskLookup) -> bool:
  """Checks the workdir before any compute; returns True if it holds a run to resume
  (`tasks`: the task registry's lookup, lnjax.tasks.get).

  Writes nothing but the folder itself: an unwritable folder, or one holding a run with
  another config, is refused with one line.
  """
  try:
    fileio.makedirs(workdir)
    probe = os.path.join(workdir, f".lnjax_write_probe.{os.getpid()}")
    fileio.write_text(probe, "")
    fileio.remove(probe)
  except OSError as e:
    raise errors.WorkdirError(f"workdir {workdir} is not writable: {e.strerror or e}") from None
  saved = ckpt_lib.load_config(workdir)
  if saved is None:
    return False
  differing = [k for k in _diff_keys(saved.to_dict(), config.to_dict())
               if k not in RESUMABLE_KEYS and k != "model.vocab_size" and k != "opt.decay_steps"
               and not _added_at_default(k, saved, config, tasks)
               # config.json holds decay_epochs resolved into decay_steps (train_and_evaluate).
               and not (k == "opt.decay_epochs" and saved.opt.decay_steps
                        and not saved.opt.decay_epochs)]
  if differing:
    raise errors.WorkdirError(
        f"workdir {workdir} holds a run with a different config ({', '.join(differing[:5])}); "
        "use a new --workdir or the same config to resume")
  return True


SUMMARY_FILE = "summary.json"


def _earlier_summary(workdir: str) -> dict:
  """The summary.json an earlier segment of the run left (written at every log line and
  checkpoint while it trains, and at its end); {} if none is readable."""
  try:
    summary = json.loads(fileio.read_text(os.path.join(workdir, SUMMARY_FILE)) or "{}")
  except (OSError, ValueError):
    return {}
  return summary if isinstance(summary, dict) else {}


def _record_failure(workdir: str, e: BaseException) -> None:
  """A summary.json left saying "running" by the segment a refusal (a failed save, say)
  ends says "failed", with the error's line: nothing trains there any more."""
  summary = _earlier_summary(workdir)
  if summary.get("status") == RUNNING:
    message = f"{e.strerror or e}: {e.filename}" if isinstance(e, OSError) else str(e)
    summary.update(status=FAILED, error=" ".join(message.split()))
    try:
      fileio.write_text(os.path.join(workdir, SUMMARY_FILE), json.dumps(summary, indent=2) + "\n")
    except OSError:
      pass  # (A full disk may refuse this too: the error line still reaches the user.)


def _best_so_far(workdir: str, name: str | None):
  """The best value of metric `name` logged by earlier runs in this workdir (resume)."""
  values = [r[name] for r in metrics_lib.read_metrics(workdir) if name and r.get(name) is not None]
  return max(values) if values else None


# This process's programs read back from the persistent cache; None while it uses none.
_cache_hits: int | None = None


def _use_compilation_cache(path: str) -> None:
  """JAX's persistent compilation cache in `path`: every compiled program is kept (the
  default keeps only those that took a second or more to compile); the programs read back
  from it are counted (summary.json's compilation_cache_hits)."""
  jax.config.update("jax_compilation_cache_dir", path)
  jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
  jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
  global _cache_hits
  if _cache_hits is None:  # (One listener a process.)
    _cache_hits = 0
    jax.monitoring.register_event_listener(_count_cache_hit)


def _count_cache_hit(event: str, **kwargs) -> None:
  global _cache_hits
  if event == "/jax/compilation_cache/cache_hits":
    _cache_hits += 1


def log(*args) -> None:
  """A console line from process 0 only."""
  if jax.process_index() == 0:
    print(*args, flush=True)


def _added_at_default(key: str, saved: ml_collections.ConfigDict,
                      config: ml_collections.ConfigDict, tasks: run_lib.TaskLookup) -> bool:
  """True for a `section.field` the saved config lacks (a field lnjax gained after that run
  started) whose value now is the field's default: the run is the same run."""
  section, _, name = key.partition(".")
  if not name or section not in saved or name in saved[section] or section not in config:
    return False
  task = run_lib.resolve_config(config, tasks=tasks).task
  cls = run_lib.SECTIONS.get(section) or task.sections.get(section) or task.data_config
  field = {f.name: f for f in dataclasses.fields(cls)}.get(name)
  if field is None:
    return False
  default = (field.default_factory() if field.default is dataclasses.MISSING
             and field.default_factory is not dataclasses.MISSING else field.default)
  return default == config[section][name]


def _diff_keys(a: dict, b: dict, prefix: str = "") -> list[str]:
  keys = []
  for k in sorted(set(a) | set(b)):
    va, vb = a.get(k), b.get(k)
    if isinstance(va, dict) and isinstance(vb, dict):
      keys += _diff_keys(va, vb, f"{prefix}{k}.")
    elif (list(va) if isinstance(va, (list, tuple)) else va) != (
        list(vb) if isinstance(vb, (list, tuple)) else vb):
      keys.append(prefix + k)
  return keys


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str, *,
                       tasks: run_lib.TaskLookup) -> dict:
  """Trains (or resumes) the run in `workdir`; returns its summary (also summary.json).
  `tasks`: the task registry's lookup (lnjax.tasks.get), handed in by the entry point.

  The workdir is locked while the run trains: a second run on it is refused with one line.
  SIGTERM or SIGUSR1 before the first step raises preemption.Preempted (nothing to save);
  after it, the run saves and returns with status "preempted".
  """
  t_start = time.perf_counter()
  run_lib.resolve_config(config, tasks=tasks)  # A bad key or value is refused before anything else.
  # Its own run (resumed) or a new one, never inside another run (a sweep's root excepted).
  fileio.refuse_run_files("--workdir", workdir, [workdir], own=[workdir])
  created = not fileio.exists(workdir)
  try:
    resuming = prepare_workdir(workdir, config, tasks=tasks)
    if jax.process_index() != 0:  # Process 0 holds the lock for the whole run.
      with preemption.Stop() as stop:
        return _train_and_evaluate(config, workdir, tasks, resuming, None, stop, t_start)
    with lock_lib.workdir_lock(workdir) as lock, preemption.Stop() as stop:
      preemption.on_forced_exit(lambda: lock.__exit__(None, None, None))
      if lock.previous_holder:
        log(f"Taking over the lock of {lock.previous_holder}, which ended without releasing it.")
      try:
        return _train_and_evaluate(config, workdir, tasks, resuming, lock, stop, t_start)
      except (errors.LnjaxError, OSError) as e:
        _record_failure(workdir, e)
        raise
  except errors.LnjaxError:
    # A refused data set or setting leaves no empty workdir behind.
    if created and "://" not in workdir and os.path.isdir(workdir) and not os.listdir(workdir):
      os.rmdir(workdir)
    raise


def _restore_or_init(b: build_lib.Built, checkpoints, train_iter, workdir: str,
                     resuming: bool):
  """(state, the hooks' saved state): resumed from the latest restorable checkpoint (the
  data position with it), else initialized (with the task's starting point)."""
  restored = checkpoints.restore_latest(b.abstract_state())
  if restored is not None:
    state, data_state, saved = restored
    train_iter.set_state(data_state)
    log(f"Resuming {workdir} from step {int(state.step)}.")
    return state, saved
  if resuming:
    log(f"{workdir} holds a config but no checkpoint: starting from step 0.")
  return b.init_state(), {}


class Summary:
  """summary.json: the run's end (or progress), written at log steps, saves and the end.
  Its wall_seconds is the run's over every segment (those ended by kill -9 too, up to
  their last write), not the last segment's."""

  def __init__(self, b: build_lib.Built, workdir: str, first_step: int, num_params: int,
               earlier: dict, lock, t_start: float):
    self.b, self.workdir, self.first_step, self.num_params = b, workdir, first_step, num_params
    self.earlier, self.lock, self.t_start = earlier, lock, t_start
    self.last_finite = self.first_step_seconds = self.best_value = None
    self.last_eval = {}
    self.instability_actions = []  # Recovery's (train.on_instability), in order.

  def summary(self, status: str, step: int) -> dict:
    run, earlier = self.b.run, self.earlier
    finished_before = self.first_step >= run.train.num_steps and earlier
    lf = ((earlier.get("last_finite_step"), earlier.get("last_finite_train_loss"))
          if finished_before else self.last_finite or (None, None))
    best = run.task.best_metric
    return {
        "status": status,
        "step": step,
        "num_steps": run.train.num_steps,
        "norm_position": run.model.norm_position,
        "num_params": self.num_params,
        "last_finite_train_loss": lf[1],
        "last_finite_step": lf[0],
        "eval_loss": self.last_eval.get("eval_loss"),
        "eval_perplexity": self.last_eval.get("eval_perplexity"),
        "unigram_baseline": self.b.data.unigram_entropy,
        "steps_per_epoch": self.b.data.steps_per_epoch,  # None for streams without epochs.
        **({best: self.last_eval.get(best), f"best_{best}": self.best_value} if best else {}),
        # A finished run asked again only re-evaluates: its wall time stays the training's.
        "wall_seconds": round(float(earlier.get("wall_seconds") or 0.0) + (
            0.0 if finished_before else time.perf_counter() - self.t_start), 1),
        # This segment's first step, compilation included (a compilation cache shortens it).
        "first_step_seconds": self.first_step_seconds,
        **({"compilation_cache_hits": _cache_hits} if _cache_hits is not None else {}),
        **({"instability_actions": self.instability_actions}
           if self.instability_actions else {}),
        "workdir": fileio.abspath(self.workdir),
    }

  def write(self, status: str, step: int) -> dict:
    s = self.summary(status, step)
    if jax.process_index() == 0:
      fileio.write_text(os.path.join(self.workdir, SUMMARY_FILE), json.dumps(s, indent=2) + "\n")
      if self.lock is not None:
        self.lock.refresh()
    return s


def evaluate(b: build_lib.Built, params, step: int, eval_batches: list) -> dict:
  """The held-out scalars at `step`: the loss, perplexity and unigram baseline, then the
  task's evaluators (BLEU). Stops between batches on SIGTERM (preemption.check)."""
  nll, count = 0.0, 0.0
  for batch in eval_batches:
    preemption.check()
    n, c = jax.device_get(b.eval_step(params, batch))
    nll, count = nll + float(n), count + float(c)
  loss = nll / max(count, 1.0)
  scalars = {"eval_loss": loss, "eval_perplexity": math.exp(min(loss, 700.0))}
  if b.data.unigram_entropy:
    scalars["eval_unigram_baseline"] = b.data.unigram_entropy
  context = task_lib.EvalContext(b.setup, params, b.data, b.run, b.mesh, step,
                                 final=step >= b.run.train.num_steps)
  for evaluator in b.run.task.evaluators:
    preemption.check()
    scalars.update(evaluator(context))
  return scalars


def _hooks(b: build_lib.Built, workdir: str, first_step: int, checkpoints) -> list:
  """The loop's hooks, in the order they act at a step (lnjax/core/hooks.py)."""
  run, data = b.run, b.data
  eval_batches = [b.global_batch(x) for x in b.eval_batches()]
  best = (ckpt_lib.Checkpoints(workdir, 1, 1, folder="best_checkpoint")
          if run.task.best_metric else None)
  logged = {r["step"] for r in metrics_lib.read_metrics(workdir) if "eval_loss" in r}
  # Divergence: a NaN/Inf loss, or one `divergence_factor` times the uniform guess's ln V.
  max_loss = (run.train.divergence_factor * math.log(data.vocab_size)
              if run.train.divergence_factor else math.inf)
  profile = run.train.profile_range()
  health = (health_hooks.Health(run.train.health, run.train.log_every_steps,
                                run.train.num_steps) if run.train.health != "off" else None)
  fault = run.train.fault()
  return [
      *([health_hooks.FaultInjection(*fault, data.vocab_size, run.seed)] if fault else []),
      hooks_lib.Preemption(),
      *([health] if health else []),
      *([health_hooks.Recovery(
          run.train.on_instability, health, checkpoints.manager.all_steps,
          rollback_steps=run.train.rollback()[0], skip_batches=run.train.rollback()[1],
          lr_factor=run.train.rollback_lr_factor, max_rollbacks=run.train.max_rollbacks)]
        if run.train.on_instability != "none" else []),
      hooks_lib.Divergence(max_loss),
      hooks_lib.Logging(run.train.log_every_steps, run.train.num_steps, first_step,
                        task_lib.num_train_shapes(data)),
      *([hooks_lib.Profiler(*profile, workdir)] if profile else []),
      hooks_lib.Evaluation(lambda params, step: evaluate(b, params, step, eval_batches),
                           run.train.eval_every_steps, run.train.num_steps, best,
                           run.task.best_metric, _best_so_far(workdir, run.task.best_metric),
                           logged),
      hooks_lib.Checkpointing(checkpoints, run.train.num_steps),
      hooks_lib.Memory(),
  ]


def _train_and_evaluate(config: ml_collections.ConfigDict, workdir: str,
                        tasks: run_lib.TaskLookup, resuming: bool, lock, stop: preemption.Stop,
                        t_start: float) -> dict:
  earlier = _earlier_summary(workdir) if resuming else {}
  cache_dir = run_lib.resolve_config(config, tasks=tasks).train.compilation_cache_dir
  if cache_dir:
    _use_compilation_cache(cache_dir)
  b = build_lib.build(config, tasks=tasks, log=log)
  config, run = b.config, b.run
  checkpoints = ckpt_lib.Checkpoints(workdir, run.train.checkpoint_every_steps,
                                     run.train.keep_checkpoints)
  train_iter = b.data.train_iter()
  state, saved = _restore_or_init(b, checkpoints, train_iter, workdir, resuming)
  # Records after the checkpoint are logged again, as an uninterrupted run logged them.
  metrics_lib.truncate_metrics(workdir, int(state.step))
  ckpt_lib.save_config(workdir, config)
  writer = metrics_lib.MetricWriter(workdir, run.train.tensorboard, run.train.wandb_project,
                                    config.to_dict())
  num_params, first_step, unigram = count_params(state.params), int(state.step), b.data.unigram_entropy
  log(f"Model: {run.task.name}, {run.model.num_layers} layers, norm_position="
      f"{run.model.norm_position}, {num_params:,} parameters; devices: {dict(b.mesh.shape)}; "
      f"data: {run.data.name} ({b.data.vocab_size} tokens)"
      + (f"; held-out unigram baseline {unigram:.4f} nats." if unigram else "."))
  summary = Summary(b, workdir, first_step, num_params, earlier, lock, t_start)

  def restore(max_step: int):  # A hook's rollback: the newest checkpoint up to max_step.
    checkpoints.wait()
    restored = checkpoints.restore_latest(b.abstract_state(), max_step)
    if restored is None:
      raise errors.CheckpointError(f"no checkpoint at or before step {max_step} to roll back to")
    checkpoints.drop_after(int(restored[0].step))  # Those steps are trained (and saved) anew,
    metrics_lib.truncate_metrics(workdir, int(restored[0].step))  # and logged anew.
    return restored

  hooks = _hooks(b, workdir, first_step, checkpoints)
  health = next((h for h in hooks if isinstance(h, health_hooks.Health)), None)
  train_step = health.wrap(b.train_step, b.activation_step) if health else b.train_step
  loop = loop_lib.Loop(state=state, train_step=train_step, train_iter=train_iter,
                       batch_sharding=b.batch_sharding, num_steps=run.train.num_steps,
                       hooks=hooks, workdir=workdir, writer=writer, summary=summary, log=log,
                       restore=restore)
  loop.restore_hooks(saved)
  stop.raising(False)  # From here a signal is honoured by saving first (lnjax/core/preemption.py).
  try:
    status = loop.run()
  except OSError:
    # A full disk often fails the checkpoint being written in the background first: that
    # save's error (CheckpointError, its partial folder removed) is the one to report.
    checkpoints.wait()
    raise
  writer.close()
  diverged = next(h for h in hooks if isinstance(h, hooks_lib.Divergence)).diverged_at
  return summary.write(status, diverged if status == hooks_lib.DIVERGED else loop.step)
