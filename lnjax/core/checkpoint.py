"""Orbax checkpoints in the workdir, automatic resume, and restoring a run for analysis.

Layout of a workdir:
  config.json        the resolved config (model.vocab_size filled in)
  checkpoints/<step>/{state,data,log}   train state, the data iterator's position and the
                     loop's hooks' state (the running sums of the current logging window,
                     an evaluation a SIGTERM interrupted)
  checkpoints/<step>/lnjax_manifest.json   SHA-256 of every file of the step, written
                     once orbax has committed it
  metrics.jsonl, tensorboard/, summary.json, .lnjax.lock (while a run holds the workdir)

Resume order (train.train_and_evaluate): the latest checkpoint whose files match its
manifest and whose restore succeeds; one that fails (corrupt, partial, or altered since it
was written) is reported, moved aside to `corrupt_checkpoints/<step>` and the previous one
is tried; with no checkpoint, a fresh state. Orbax writes each checkpoint to a temporary
folder and renames it when complete, so a run killed mid-save leaves no half checkpoint
that looks finished. A checkpoint without a manifest (a run killed between the commit and
the manifest, or one written before lnjax had manifests) is restored unverified.
"""

import copy
import dataclasses
import json
import os
from typing import Any

import jax
import ml_collections
import orbax.checkpoint as ocp
from etils import epath
from jax.sharding import Mesh

from lnjax.core import build, errors, fileio, run as run_lib, sharding, state as state_lib

CONFIG_FILE = "config.json"
MANIFEST_FILE = "lnjax_manifest.json"


def _save_arrays_from_one_replica() -> None:
  """In a single-process run, orbax saves each array from one replica, as it does on GPUs.

  Orbax's replica-parallel saving (its default off GPUs) splits a replicated array's writes
  across replicas by slicing it on device: one small XLA program per shape. It spreads the
  writes over hosts; within one process the same host writes every slice, and the slicing
  cost the LM smoke run 56 of its 60 compiled programs (2 for its steps; `lnjax.main
  --config=configs/lm.py:smoke` with jax's compiles counted, 2026-12-05). Several processes
  keep orbax's default."""
  if jax.process_count() == 1:
    ocp.type_handlers.register_type_handler(
        jax.Array, ocp.type_handlers.ArrayHandler(use_replica_parallel=False), override=True)


class Checkpoints:
  """Saves every `every_steps` (and when forced), keeps the last `keep`."""

  def __init__(self, workdir: str, every_steps: int, keep: int, folder: str = "checkpoints"):
    _save_arrays_from_one_replica()
    self.workdir = workdir
    self.every_steps = every_steps
    self._unsealed = None  # The step saved last, until its manifest is written.
    self.manager = ocp.CheckpointManager(
        os.path.join(fileio.abspath(workdir), folder),
        # (cleanup: the temporary folders of saves a kill interrupted.)
        options=ocp.CheckpointManagerOptions(max_to_keep=keep, create=True,
                                             cleanup_tmp_directories=True))

  def save(self, step: int, state: state_lib.TrainState, data_state: dict,
           force: bool = False, replace: bool = False, log: dict | None = None) -> bool:
    """`replace`: drop every older checkpoint first (the best-so-far folder keeps one).
    `log`: the training loop's hooks' state (the running sums of the current logging
    window, an evaluation a stop interrupted), restored with the state."""
    if not force and step % self.every_steps:
      return False
    if step in self.manager.all_steps():
      return False
    with _saving(step, self.manager.directory):
      self.wait()
      if replace:
        for old in self.manager.all_steps():
          self.manager.delete(old)
      self._unsealed = step
      # Copies: orbax writes JSON items after save() returns, while the loop goes on
      # adding to the same window dict (a kept reference saved step 17's sums as 16's).
      data_state, log = copy.deepcopy(data_state), copy.deepcopy(log or {})
      return self.manager.save(step, args=ocp.args.Composite(
          state=ocp.args.StandardSave(state), data=ocp.args.JsonSave(data_state),
          log=ocp.args.JsonSave(log)), force=True)

  def seal(self) -> None:
    """Writes the manifest of the last save once orbax has committed it; cheap otherwise
    (the loop calls it at every step)."""
    if self._unsealed is not None and not self.manager.is_saving_in_progress():
      with _saving(self._unsealed, self.manager.directory):
        self.manager.check_for_errors()
      step, self._unsealed = self._unsealed, None
      if jax.process_index() == 0:
        write_manifest(os.path.join(str(self.manager.directory), str(step)))

  def restore_latest(self, target: state_lib.TrainState, max_step: int | None = None):
    """(state, data_state, log) of the newest restorable checkpoint (at or before
    `max_step` if given), or None if there is none.

    Newer checkpoints that fail to restore are moved aside once an older one succeeds,
    so that training can save those steps again; if none succeeds, nothing is moved.
    """
    steps = sorted((s for s in self.manager.all_steps() if max_step is None or s <= max_step),
                   reverse=True)
    failed = []
    for step in steps:
      step_dir = os.path.join(str(self.manager.directory), str(step))
      items = dict(state=ocp.args.StandardRestore(target), data=ocp.args.JsonRestore())
      has_log = fileio.isdir(os.path.join(step_dir, "log"))
      if has_log:
        items["log"] = ocp.args.JsonRestore()
      try:
        mismatch = verify_manifest(step_dir)
        if mismatch:
          raise errors.CheckpointError(mismatch)
        restored = self.manager.restore(step, args=ocp.args.Composite(**items))
      except Exception as e:  # Orbax raises many kinds for a damaged checkpoint.
        reason = f"{type(e).__name__}: {str(e).splitlines()[0][:160] if str(e) else ''}"
        print(f"warning: checkpoint at step {step} in {self.workdir} is corrupt or partial "
              f"({reason}); trying the previous one", flush=True)
        failed.append(step)
        continue
      for bad in failed:
        self._move_aside(bad)
      return restored.state, restored.data, (restored.log if has_log else {})
    if steps:
      raise errors.CheckpointError(
          f"no checkpoint in {self.manager.directory} could be restored (tried steps "
          f"{', '.join(map(str, steps))}); move them away to start afresh")
    return None

  def drop_after(self, step: int) -> None:
    """Deletes the checkpoints after `step` (a rollback: training saves those steps anew)."""
    self.wait()
    for newer in [s for s in self.manager.all_steps() if s > step]:
      self.manager.delete(newer)

  def _move_aside(self, step: int) -> None:
    if jax.process_index() != 0:
      return
    src = os.path.join(str(self.manager.directory), str(step))
    dst = os.path.join(self.workdir, "corrupt_checkpoints", str(step))
    fileio.move(src, dst)
    print(f"moved the unreadable checkpoint to {dst}", flush=True)
    self.manager.reload()

  def wait(self) -> None:
    """Waits for the save in flight, then writes its manifest."""
    if self._unsealed is not None:
      with _saving(self._unsealed, self.manager.directory):
        self.manager.wait_until_finished()
      self.seal()

  def close(self) -> None:
    self.wait()
    self.manager.close()


class _saving:
  """Turns a failed save (disk full, quota, permissions) into one line: CheckpointError."""

  def __init__(self, step: int, directory):
    self.step, self.directory = step, directory

  def __enter__(self):
    return self

  def __exit__(self, kind, e, tb):
    if e is None or isinstance(e, errors.LnjaxError) or not _is_io_error(e):
      return False
    self._remove_partial()
    raise errors.CheckpointError(
        f"could not save the checkpoint of step {self.step} in {self.directory}: "
        f"{_io_reason(e)}; free space (or fix the folder) and run the same command to resume "
        "from the last saved step") from None

  def _remove_partial(self) -> None:
    """Deletes what the failed save wrote (orbax's `<step>.orbax-checkpoint-tmp*` folder):
    it gives the space back, so that the run's summary can still say "failed", and no
    partial step is left for the next run to try."""
    if jax.process_index() != 0:
      return
    for partial in epath.Path(self.directory).glob(f"{self.step}.orbax-checkpoint-tmp*"):
      try:
        partial.rmtree()
      except OSError:
        pass  # (The error line names the cause; the next run's orbax clears tmp folders.)


_IO_MESSAGES = ("No space left on device", "Disk quota exceeded", "File too large",
                "Read-only file system", "Permission denied")


def _is_io_error(e: BaseException) -> bool:
  while e is not None:
    if isinstance(e, OSError) or any(m in str(e) for m in _IO_MESSAGES):
      return True
    e = e.__cause__ or e.__context__
  return False


def _io_reason(e: BaseException) -> str:
  chain = []
  while e is not None:
    chain.append(e)
    e = e.__cause__ or e.__context__
  for c in chain:
    for m in _IO_MESSAGES:
      if m in str(c):
        return m
  c = next((c for c in chain if isinstance(c, OSError)), chain[0])
  return f"{type(c).__name__}: {str(c).splitlines()[0][:200] if str(c) else ''}"


def write_manifest(step_dir: str) -> None:
  """SHA-256 of every file of a committed checkpoint, beside them."""
  if not fileio.isdir(step_dir):  # Already deleted (max_to_keep) or moved aside.
    return
  files = _hash_files(step_dir)
  fileio.write_text(os.path.join(step_dir, MANIFEST_FILE),
                    json.dumps({"sha256": files}, indent=0, sort_keys=True) + "\n")


def verify_manifest(step_dir: str) -> str | None:
  """Why the checkpoint's files differ from its manifest, or None if they match (or it
  has no manifest)."""
  text = fileio.read_text(os.path.join(step_dir, MANIFEST_FILE))
  if text is None:
    return None
  try:
    expected = json.loads(text)["sha256"]
  except (ValueError, KeyError, TypeError):
    return f"its {MANIFEST_FILE} is unreadable"
  actual = _hash_files(step_dir, only=expected)
  for name, digest in sorted(expected.items()):
    if actual.get(name) != digest:
      what = "is missing" if name not in actual else "differs from its checksum"
      return f"file {name} {what}"
  return None


def _hash_files(root: str, only: dict | None = None) -> dict[str, str]:
  out = {}
  for rel in fileio.walk_files(root):
    if rel == MANIFEST_FILE or rel.endswith(".tmp") or (only is not None and rel not in only):
      continue
    out[rel] = fileio.sha256(os.path.join(root, rel))
  return out


def save_config(workdir: str, config: ml_collections.ConfigDict) -> None:
  """Writes config.json (atomically, and only if it changed)."""
  if jax.process_index() == 0:
    path = os.path.join(workdir, CONFIG_FILE)
    text = config.to_json_best_effort(indent=2, sort_keys=True) + "\n"
    if fileio.read_text(path) != text:
      fileio.write_text(path, text)


def load_config(workdir: str) -> ml_collections.ConfigDict | None:
  """The run's config.json, None if there is none; an unreadable one is refused."""
  path = os.path.join(workdir, CONFIG_FILE)
  try:
    text = fileio.read_text(path)
  except (OSError, UnicodeDecodeError) as e:
    raise errors.WorkdirError(f"{path} is unreadable ({e}); restore it or use a new --workdir")
  if text is None:
    return None
  try:
    values = json.loads(text)
    if not isinstance(values, dict):
      raise ValueError("not a JSON object")
  except ValueError as e:
    raise errors.WorkdirError(
        f"{path} is {'empty' if not text.strip() else f'not valid JSON ({e})'}; restore it "
        "from a copy or use a new --workdir") from None
  return ml_collections.ConfigDict(values)


@dataclasses.dataclass
class RestoredRun:
  config: ml_collections.ConfigDict
  run: run_lib.RunConfig
  setup: state_lib.Setup
  state: state_lib.TrainState
  data_state: dict[str, Any]
  step: int


def restore_run(workdir: str, step: int | None = None, mesh: Mesh | None = None,
                folder: str = "checkpoints", *, tasks: run_lib.TaskLookup) -> RestoredRun:
  """Restores a run (config, parameters, optimizer state) from `workdir` onto `mesh`;
  `tasks`: the task registry's lookup (lnjax.tasks.get) for the run's task.

  `mesh` defaults to a mesh over the first local device only, so a run trained on many
  devices can be analysed on one CPU. `step` defaults to the latest checkpoint;
  `folder="best_checkpoint"` restores the best one by the task's metric (BLEU).
  """
  config = load_config(workdir)
  if config is None:
    raise errors.CheckpointError(f"{workdir} holds no {CONFIG_FILE}: not an lnjax workdir")
  run = run_lib.resolve_config(config, tasks=tasks)
  mesh = mesh or sharding.make_mesh(sharding.MeshConfig(data=1), jax.local_devices()[:1])
  setup = build.run_setup(run, None)  # The optimizer it trained with (skip_spikes' state too).
  target = state_lib.abstract_state(setup, mesh)
  directory = os.path.join(fileio.abspath(workdir), folder)
  if not fileio.isdir(directory):  # (A manager would create the folder.)
    raise errors.CheckpointError(f"{workdir} holds no checkpoint in {folder}/")
  manager = ocp.CheckpointManager(directory)
  steps = manager.all_steps()
  if not steps:
    raise errors.CheckpointError(f"{workdir} holds no checkpoint in {folder}/")
  step = max(steps) if step is None else step
  if step not in steps:
    raise errors.CheckpointError(
        f"{workdir} has no checkpoint at step {step}; steps: {', '.join(map(str, sorted(steps)))}")
  mismatch = verify_manifest(os.path.join(directory, str(step)))
  if mismatch:
    raise errors.CheckpointError(f"the checkpoint at step {step} in {directory} is corrupt: "
                                 f"{mismatch}")
  restored = manager.restore(step, args=ocp.args.Composite(
      state=ocp.args.StandardRestore(target), data=ocp.args.JsonRestore()))
  manager.close()
  return RestoredRun(config, run, setup, restored.state, restored.data, step)
