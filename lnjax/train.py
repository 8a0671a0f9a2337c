"""train_and_evaluate: the training loop of the decoder-only LM, with a pure jitted step."""

import dataclasses
import functools
import json
import math
import os
import signal
import tempfile
import threading
import time

import jax
import ml_collections
import optax
from jax.experimental import multihost_utils

from lnjax import checkpoint as ckpt_lib
from lnjax import errors, fileio, lock as lock_lib, metrics as metrics_lib, optim
from lnjax import progress as progress_lib
from lnjax import run as run_lib, sharding
from lnjax import state as state_lib, task as task_lib, tasks
from lnjax.models import count_params, transformer

# Exit statuses of a run (lnjax.main turns them into exit codes).
COMPLETED, DIVERGED, PREEMPTED = "completed", "diverged", "preempted"
RUNNING = "running"  # summary.json while the run trains (its wall time so far).

# Keys that may change between an interrupted run and its resumption.
RESUMABLE_KEYS = ("train.num_steps", "train.log_every_steps", "train.eval_every_steps",
                  "train.checkpoint_every_steps", "train.keep_checkpoints", "train.tensorboard",
                  "train.log_grad_norms", "train.divergence_factor",
                  "train.compilation_cache_dir", "train.profile_steps", "train.wandb_project",
                  "data.data_dir", "data.cache_dir", "mesh.data", "mesh.fsdp", "mesh.model",
                  "mesh.dcn_data", "mesh.dcn_fsdp", "mesh.dcn_model")


def train_step(state: state_lib.TrainState, batch: dict, *, setup: state_lib.Setup,
               label_smoothing: float, seed: int, log_grad_norms: bool = False):
  """One optimizer update; pure. Dropout's key is a function of (seed, step), so a resumed
  run draws the same masks as an uninterrupted one."""
  dropout_key = jax.random.fold_in(jax.random.key(seed), state.step)

  def loss_fn(params):
    outputs = setup.model.apply({"params": params}, *setup.task.model_inputs(batch),
                                deterministic=False, rngs={"dropout": dropout_key})
    loss_sum, nll_sum, count = setup.task.loss(outputs, batch, label_smoothing)
    return loss_sum / count, nll_sum / count

  (_, nll), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params)
  updates, opt_state = setup.tx.update(grads, state.opt_state, state.params)
  params = optax.apply_updates(state.params, updates)
  metrics = {"train_loss": nll, "learning_rate": setup.schedule(state.step),
             "grad_norm": optax.tree.norm(grads), "param_norm": optax.tree.norm(params)}
  if log_grad_norms:  # ‖∂L/∂W‖_F of every weight, per layer and sub-layer.
    cfg = setup.model.cfg  # Scanned layers: unstacked into layer_0, layer_1, ... first.
    per_layer = transformer.unscan_params(grads, cfg) if cfg.scan_layers else grads
    metrics.update(metrics_lib.per_weight_norms(per_layer, "grad_norm"))
  return state.replace(step=state.step + 1, params=params, opt_state=opt_state), metrics


def eval_step(params, batch: dict, *, setup: state_lib.Setup):
  """Summed NLL (nats) and target count of one held-out batch."""
  outputs = setup.model.apply({"params": params}, *setup.task.model_inputs(batch),
                              deterministic=True)
  _, nll_sum, count = setup.task.loss(outputs, batch, 0.0)
  return nll_sum, count


class _Preemption:
  """SIGTERM, turned into a step at which the loop saves and exits.

  One process: a Python handler sets a flag the loop checks between steps. Many
  processes: they must stop at the same step, so JAX's preemption service (it catches
  SIGTERM itself once jax.distributed is up) agrees on one: the step after the furthest
  any process had reached when the first one was signalled.
  """

  def __init__(self):
    self.requested = False
    self._previous = None

  def __enter__(self):
    if jax.process_count() == 1 and threading.current_thread() is threading.main_thread():
      self._previous = signal.signal(signal.SIGTERM, self._handle)
    return self

  def _handle(self, signum, frame):
    self.requested = True

  def reached(self, step: int) -> bool:
    """Whether to save and stop after `step`; every process calls it at every step."""
    if jax.process_count() > 1:
      self.requested = multihost_utils.reached_preemption_sync_point(step)
    return self.requested

  def __exit__(self, *exc):
    if self._previous is not None:
      signal.signal(signal.SIGTERM, self._previous)


def prepare_workdir(workdir: str, config: ml_collections.ConfigDict) -> bool:
  """Checks the workdir before any compute; returns True if it holds a run to resume.

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
               and not _added_at_default(k, saved, config)
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


def _best_so_far(workdir: str, name: str | None):
  """The best value of metric `name` logged by earlier runs in this workdir (resume)."""
  values = [r[name] for r in metrics_lib.read_metrics(workdir) if name and r.get(name) is not None]
  return max(values) if values else None


def _use_compilation_cache(path: str) -> None:
  """JAX's persistent compilation cache in `path`: every compiled program is kept (the
  default keeps only those that took a second or more to compile)."""
  jax.config.update("jax_compilation_cache_dir", path)
  jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
  jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)


def log(*args) -> None:
  """A console line from process 0 only."""
  if jax.process_index() == 0:
    print(*args, flush=True)


def _added_at_default(key: str, saved: ml_collections.ConfigDict,
                      config: ml_collections.ConfigDict) -> bool:
  """True for a `section.field` the saved config lacks (a field lnjax gained after that run
  started) whose value now is the field's default: the run is the same run."""
  section, _, name = key.partition(".")
  if not name or section not in saved or name in saved[section] or section not in config:
    return False
  task = tasks.get(config.get("task", "lm"))
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


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str) -> dict:
  """Trains (or resumes) the run in `workdir`; returns its summary (also summary.json).

  The workdir is locked while the run trains: a second run on it is refused with one line.
  """
  run = run_lib.resolve_config(config)
  created = not fileio.exists(workdir)
  try:
    resuming = prepare_workdir(workdir, config)
    if jax.process_index() != 0:  # Process 0 holds the lock for the whole run.
      return _train_and_evaluate(config, run, workdir, resuming, None)
    with lock_lib.workdir_lock(workdir) as lock:
      if lock.previous_holder:
        log(f"Taking over the lock of {lock.previous_holder}, which ended without releasing it.")
      return _train_and_evaluate(config, run, workdir, resuming, lock)
  except errors.LnjaxError:
    # A refused data set or setting leaves no empty workdir behind.
    if created and "://" not in workdir and os.path.isdir(workdir) and not os.listdir(workdir):
      os.rmdir(workdir)
    raise


def _make_data(run: run_lib.RunConfig, mesh) -> task_lib.DataSource:
  """This process's slice of every global batch, in batches that split evenly over the
  mesh's batch axes."""
  batch_shards = mesh.shape["data"] * mesh.shape["fsdp"]
  if getattr(run.data, "batch_size", 0) % batch_shards:
    raise errors.ConfigError(f"data.batch_size={run.data.batch_size} must be divisible by "
                             f"mesh data×fsdp={batch_shards}")
  with progress_lib.Phase(f"preparing {run.data.name} (corpus, tokenizer)") as phase:
    data = run.task.make_data(run.data, run.seed, jax.process_index(), jax.process_count(),
                              batch_shards)
  if phase.seconds >= 2:
    log(f"Data ready in {phase.seconds:.1f} s ({run.data.name}: corpus, tokenizer; cached "
        "for the next run).")
  return data


def _complete_config(config: ml_collections.ConfigDict, run: run_lib.RunConfig,
                     data: task_lib.DataSource):
  """The config with what only the data know: the vocabulary size, and decay boundaries
  given in epochs as steps (config.json keeps them so; a resume compares against it)."""
  if run.model.vocab_size not in (0, data.vocab_size):
    raise errors.ConfigError(f"model.vocab_size={run.model.vocab_size} differs from the "
                             f"tokenizer's {data.vocab_size}; leave it 0")
  config = ml_collections.ConfigDict(config.to_dict())  # An unlocked copy to fill in.
  config.model.vocab_size = data.vocab_size
  if run.opt.decay_epochs:
    config.opt.decay_steps = tuple(optim.decay_boundaries(run.opt, data.steps_per_epoch))
    config.opt.decay_epochs = ()
  return config, run_lib.resolve_config(config)


def _compile_steps(setup, run: run_lib.RunConfig, mesh, state_sharding, batch_sharding):
  """The jitted train and eval steps, with explicit shardings and the state donated."""
  p_train_step = jax.jit(
      functools.partial(train_step, setup=setup, label_smoothing=run.train.label_smoothing,
                        seed=run.seed, log_grad_norms=run.train.log_grad_norms),
      in_shardings=(state_sharding, batch_sharding),
      out_shardings=(state_sharding, sharding.replicated(mesh)),
      donate_argnums=0)
  p_eval_step = jax.jit(functools.partial(eval_step, setup=setup),
                        in_shardings=(state_sharding.params, batch_sharding),
                        out_shardings=sharding.replicated(mesh))
  return p_train_step, p_eval_step


def _restore_or_init(checkpoints, train_iter, setup, run: run_lib.RunConfig, mesh,
                     state_sharding, workdir: str, resuming: bool):
  """(state, running sums of the logging window): resumed from the latest restorable
  checkpoint (the data position with it), else initialized (then the task's starting
  point, e.g. a pre-trained encoder; never on resume)."""
  restored = checkpoints.restore_latest(state_lib.abstract_state(setup, mesh))
  if restored is not None:
    state, data_state, train_sums = restored
    train_iter.set_state(data_state)
    log(f"Resuming {workdir} from step {int(state.step)}.")
    return state, train_sums
  if resuming:
    log(f"{workdir} holds a config but no checkpoint: starting from step 0.")
  state = state_lib.init_state(setup, mesh, run.seed)
  if run.task.init_params is not None:
    params = jax.device_put(run.task.init_params(setup, state.params, run),
                            state_sharding.params)
    state = state.replace(params=params, opt_state=jax.jit(
        setup.tx.init, out_shardings=state_sharding.opt_state)(params))
  return state, {}


def _train_and_evaluate(config: ml_collections.ConfigDict, run: run_lib.RunConfig,
                        workdir: str, resuming: bool, lock) -> dict:
  t_start = time.perf_counter()
  # The summary's wall_seconds is the run's, over every segment (those ended by kill -9
  # too, up to their last log line), not the last segment's.
  earlier = _earlier_summary(workdir) if resuming else {}
  earlier_seconds = float(earlier.get("wall_seconds") or 0.0)
  if run.train.compilation_cache_dir:
    _use_compilation_cache(run.train.compilation_cache_dir)

  # Devices, then data (its vocabulary and epoch length complete the config), then the
  # model, optimizer and compiled steps, then the state.
  mesh = sharding.make_mesh(run.mesh)
  data = _make_data(run, mesh)
  config, run = _complete_config(config, run, data)
  steps_per_epoch = data.steps_per_epoch
  setup = state_lib.make_setup(run.model, run.opt, run.train.num_steps, steps_per_epoch,
                               task=run.task)
  batch_sharding = sharding.batch_sharding(mesh)
  state_sharding = state_lib.state_shardings(setup, mesh)
  p_train_step, p_eval_step = _compile_steps(setup, run, mesh, state_sharding, batch_sharding)
  checkpoints = ckpt_lib.Checkpoints(workdir, run.train.checkpoint_every_steps,
                                     run.train.keep_checkpoints)
  train_iter = data.train_iter()
  state, train_sums = _restore_or_init(checkpoints, train_iter, setup, run, mesh,
                                       state_sharding, workdir, resuming)
  # Records after the checkpoint are logged again, as an uninterrupted run logged them.
  metrics_lib.truncate_metrics(workdir, int(state.step))
  ckpt_lib.save_config(workdir, config)
  writer = metrics_lib.MetricWriter(workdir, run.train.tensorboard, run.train.wandb_project,
                                    config.to_dict())
  num_params = count_params(state.params)
  first_step = int(state.step)
  unigram = data.unigram_entropy
  log(f"Model: {run.task.name}, {run.model.num_layers} layers, norm_position="
      f"{run.model.norm_position}, {num_params:,} parameters; devices: {dict(mesh.shape)}; "
      f"data: {run.data.name} ({data.vocab_size} tokens)"
      + (f"; held-out unigram baseline {unigram:.4f} nats." if unigram else "."))
  best = (ckpt_lib.Checkpoints(workdir, 1, 1, folder="best_checkpoint")
          if run.task.best_metric else None)
  best_value = _best_so_far(workdir, run.task.best_metric)

  eval_batches = [sharding.global_batch(b, batch_sharding) for b in data.eval_batches()]

  def evaluate(step: int, record: bool = True) -> dict:
    nonlocal best_value
    nll, count = 0.0, 0.0
    for batch in eval_batches:
      n, c = jax.device_get(p_eval_step(state.params, batch))
      nll, count = nll + float(n), count + float(c)
    loss = nll / max(count, 1.0)
    scalars = {"eval_loss": loss, "eval_perplexity": math.exp(min(loss, 700.0))}
    if unigram:
      scalars["eval_unigram_baseline"] = unigram
    context = task_lib.EvalContext(setup, state.params, data, run, mesh, step,
                                   final=step >= run.train.num_steps)
    for evaluator in run.task.evaluators:
      scalars.update(evaluator(context))
    if record:
      writer.write(step, scalars)
    log(f"eval  step {step:>6}  " + "  ".join(
        f"{k[5:]} {v:.4f}" for k, v in scalars.items()))
    metric = scalars.get(run.task.best_metric) if best else None
    if metric is not None and (best_value is None or metric > best_value):
      best_value = metric
      best.save(step, state, {}, force=True, replace=True)
      log(f"      new best {run.task.best_metric} {metric:.4f}: saved to best_checkpoint/")
    return scalars

  # ---- The loop. Metrics of step s are fetched while step s+1 runs (one step of lag keeps
  # the host ahead of the device); every step's loss is checked for NaN/Inf.
  progress = metrics_lib.Progress(run.train.num_steps, first_step,
                                  task_lib.num_train_shapes(data))
  status, last_finite, diverged_at, last_eval = COMPLETED, None, None, {}
  pending, diverged_loss, first_step_seconds = None, None, None
  profile = run.train.profile_range()
  trace_dir = os.path.join(workdir, "profile")
  # jax.profiler writes local files: a bucket workdir's trace is uploaded when it ends.
  local_trace_dir = tempfile.mkdtemp(prefix="lnjax_profile_") if (
      profile and fileio.is_remote(workdir)) else trace_dir
  # Divergence: a NaN/Inf loss, or one `divergence_factor` times the uniform guess's ln V
  # (about the loss at initialization), which no run that is still learning reaches.
  max_loss = (run.train.divergence_factor * math.log(data.vocab_size)
              if run.train.divergence_factor else math.inf)

  def absorb(step: int, m) -> bool:
    """Host-side handling of step `step`'s metrics; False if the loss diverged."""
    nonlocal last_finite, train_sums, diverged_loss
    m = {k: float(v) for k, v in jax.device_get(m).items()}
    if not math.isfinite(m["train_loss"]) or m["train_loss"] > max_loss:
      diverged_loss = m["train_loss"]
      return False
    last_finite = (step, m["train_loss"])
    for k, v in m.items():
      train_sums[k] = train_sums.get(k, 0.0) + v
    train_sums["_n"] = train_sums.get("_n", 0) + 1
    if step % run.train.log_every_steps == 0 or step == run.train.num_steps:
      n = train_sums.pop("_n")
      means = {k: v / n for k, v in train_sums.items()}
      means["learning_rate"], means["param_norm"] = m["learning_rate"], m["param_norm"]
      writer.write(step, means)
      log(progress.line(step, means["train_loss"], m["learning_rate"], m["grad_norm"]))
      train_sums = {}
      write_summary(RUNNING, step)
    return True

  def summary(status: str, step: int) -> dict:
    finished_before = first_step >= run.train.num_steps and earlier
    lf = ((earlier.get("last_finite_step"), earlier.get("last_finite_train_loss"))
          if finished_before else last_finite or (None, None))
    return {
        "status": status,
        "step": step,
        "num_steps": run.train.num_steps,
        "norm_position": run.model.norm_position,
        "num_params": num_params,
        "last_finite_train_loss": lf[1],
        "last_finite_step": lf[0],
        "eval_loss": last_eval.get("eval_loss"),
        "eval_perplexity": last_eval.get("eval_perplexity"),
        "unigram_baseline": unigram,
        "steps_per_epoch": steps_per_epoch,  # None for streams without epochs.
        **({run.task.best_metric: last_eval.get(run.task.best_metric),
            f"best_{run.task.best_metric}": best_value} if run.task.best_metric else {}),
        # A finished run asked again only re-evaluates: its wall time stays the training's.
        "wall_seconds": round(earlier_seconds + (0.0 if finished_before else
                                                 time.perf_counter() - t_start), 1),
        # This segment's first step, compilation included (a compilation cache shortens it).
        "first_step_seconds": first_step_seconds,
        "workdir": fileio.abspath(workdir),
    }

  def write_summary(status: str, step: int) -> dict:
    s = summary(status, step)
    if jax.process_index() == 0:
      fileio.write_text(os.path.join(workdir, SUMMARY_FILE), json.dumps(s, indent=2) + "\n")
      if lock is not None:
        lock.refresh()
    return s

  with _Preemption() as preemption:
    step = first_step
    while step < run.train.num_steps:
      checkpoints.seal()
      local_batch = next(train_iter)
      progress.add_tokens(float(local_batch["weights"].sum()) * jax.process_count())
      batch = sharding.global_batch(local_batch, batch_sharding)
      if profile and step + 1 == profile[0]:
        jax.profiler.start_trace(local_trace_dir)
      t_step = time.perf_counter()
      compiling = progress.compiling(tuple(batch["inputs"].shape))
      if compiling:  # (jit compiles in the call; the step itself runs asynchronously.)
        with progress_lib.Phase(compiling):
          state, step_metrics = p_train_step(state, batch)
        progress.exclude(time.perf_counter() - t_step)
        if step > first_step:  # (The first step has its own line below.)
          log(f"{compiling[0].upper()}{compiling[1:]}: {time.perf_counter() - t_step:.1f} s, "
              "kept out of tok/s and the ETA.")
      else:
        state, step_metrics = p_train_step(state, batch)
      step += 1
      if step == first_step + 1:
        jax.block_until_ready(step_metrics)
        first_step_seconds = round(time.perf_counter() - t_step, 3)
        log(f"First step in {first_step_seconds:.2f} s (compilation included).")
      if profile and step == profile[1]:
        jax.block_until_ready(state)
        jax.profiler.stop_trace()
        if local_trace_dir != trace_dir:
          fileio.copy_tree(local_trace_dir, trace_dir)
        log(f"Profile of steps {profile[0]}..{profile[1]} in {trace_dir} (TensorBoard: profile).")
      if pending is not None and not absorb(*pending):
        diverged_at = pending[0]
        break
      pending = (step, step_metrics)
      at_end = step == run.train.num_steps
      stop = preemption.reached(step)
      if at_end or step % run.train.eval_every_steps == 0 or step % run.train.checkpoint_every_steps == 0 or stop:
        if not absorb(*pending):  # Never evaluate or save a diverged state.
          diverged_at = step
          break
        pending = None
        if at_end or step % run.train.eval_every_steps == 0:
          last_eval = evaluate(step)
        if checkpoints.save(step, state, train_iter.get_state(), force=at_end or stop,
                            window=train_sums):
          write_summary(RUNNING, step)
        progress.restart_clock(step)
        if stop and not at_end:
          status = PREEMPTED
          log(f"SIGTERM: saved step {step}; run the same command to resume.")
          break
    if first_step >= run.train.num_steps:  # Nothing left to train: report where it stands.
      log(f"{workdir} is already trained to step {first_step}.")
      logged = any("eval_loss" in r and r["step"] == first_step
                   for r in metrics_lib.read_metrics(workdir))
      last_eval = evaluate(first_step, record=not logged)
    if diverged_at is not None:
      status = DIVERGED
      lf = f"{last_finite[1]:.4f} at step {last_finite[0]}" if last_finite else "none"
      why = ("non-finite loss" if not math.isfinite(diverged_loss) else
             f"loss {diverged_loss:.4g} above train.divergence_factor × ln V = {max_loss:.4g}")
      log(f"Diverged: {why} at step {diverged_at}; last finite loss {lf}.")

  checkpoints.wait()
  checkpoints.close()
  if best:
    best.wait()
    best.close()
  writer.close()
  return write_summary(status, diverged_at if status == DIVERGED else step)
