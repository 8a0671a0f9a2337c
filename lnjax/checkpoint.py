"""Orbax checkpoints in the workdir, automatic resume, and restoring a run for analysis.

Layout of a workdir:
  config.json        the resolved config (model.vocab_size filled in)
  checkpoints/<step>/{state,data}   train state and the data iterator's position
  metrics.jsonl, tensorboard/, summary.json

Resume order (train.train_and_evaluate): the latest checkpoint whose restore succeeds;
one that fails (corrupt or partial) is reported, moved aside to
`corrupt_checkpoints/<step>` and the previous one is tried; with no checkpoint, a fresh
state. Orbax writes each checkpoint to a temporary folder and renames it when complete,
so a run killed mid-save leaves no half checkpoint that looks finished.
"""

import dataclasses
import json
import os
import shutil
from typing import Any

import jax
import ml_collections
import orbax.checkpoint as ocp
from jax.sharding import Mesh

from lnjax import errors, run as run_lib, sharding, state as state_lib

CONFIG_FILE = "config.json"


class Checkpoints:
  """Saves every `every_steps` (and when forced), keeps the last `keep`."""

  def __init__(self, workdir: str, every_steps: int, keep: int, folder: str = "checkpoints"):
    self.workdir = workdir
    self.every_steps = every_steps
    self.manager = ocp.CheckpointManager(
        os.path.join(os.path.abspath(workdir), folder),
        options=ocp.CheckpointManagerOptions(max_to_keep=keep, create=True))

  def save(self, step: int, state: state_lib.TrainState, data_state: dict,
           force: bool = False, replace: bool = False) -> bool:
    """`replace`: drop every older checkpoint first (the best-so-far folder keeps one)."""
    if not force and step % self.every_steps:
      return False
    if step in self.manager.all_steps():
      return False
    if replace:
      self.manager.wait_until_finished()
      for old in self.manager.all_steps():
        self.manager.delete(old)
    return self.manager.save(step, args=ocp.args.Composite(
        state=ocp.args.StandardSave(state), data=ocp.args.JsonSave(data_state)), force=True)

  def restore_latest(self, target: state_lib.TrainState):
    """(state, data_state) of the newest restorable checkpoint, or None if there is none.

    Newer checkpoints that fail to restore are moved aside once an older one succeeds,
    so that training can save those steps again; if none succeeds, nothing is moved.
    """
    steps = sorted(self.manager.all_steps(), reverse=True)
    failed = []
    for step in steps:
      try:
        restored = self.manager.restore(step, args=ocp.args.Composite(
            state=ocp.args.StandardRestore(target), data=ocp.args.JsonRestore()))
      except Exception as e:  # Orbax raises many kinds for a damaged checkpoint.
        reason = f"{type(e).__name__}: {str(e).splitlines()[0][:160] if str(e) else ''}"
        print(f"warning: checkpoint at step {step} in {self.workdir} is corrupt or partial "
              f"({reason}); trying the previous one", flush=True)
        failed.append(step)
        continue
      for bad in failed:
        self._move_aside(bad)
      return restored.state, restored.data
    if steps:
      raise errors.CheckpointError(
          f"no checkpoint in {self.manager.directory} could be restored (tried steps "
          f"{', '.join(map(str, steps))}); move them away to start afresh")
    return None

  def _move_aside(self, step: int) -> None:
    if jax.process_index() != 0:
      return
    src = os.path.join(str(self.manager.directory), str(step))
    dst = os.path.join(self.workdir, "corrupt_checkpoints", str(step))
    os.makedirs(os.path.dirname(dst), exist_ok=True)
    shutil.move(src, dst)
    print(f"moved the unreadable checkpoint to {dst}", flush=True)
    self.manager.reload()

  def wait(self) -> None:
    self.manager.wait_until_finished()

  def close(self) -> None:
    self.manager.close()


def save_config(workdir: str, config: ml_collections.ConfigDict) -> None:
  if jax.process_index() == 0:
    with open(os.path.join(workdir, CONFIG_FILE), "w") as f:
      f.write(config.to_json_best_effort(indent=2, sort_keys=True) + "\n")


def load_config(workdir: str) -> ml_collections.ConfigDict | None:
  path = os.path.join(workdir, CONFIG_FILE)
  if not os.path.exists(path):
    return None
  with open(path) as f:
    return ml_collections.ConfigDict(json.load(f))


@dataclasses.dataclass
class RestoredRun:
  config: ml_collections.ConfigDict
  run: run_lib.RunConfig
  setup: state_lib.Setup
  state: state_lib.TrainState
  data_state: dict[str, Any]
  step: int


def restore_run(workdir: str, step: int | None = None, mesh: Mesh | None = None,
                folder: str = "checkpoints") -> RestoredRun:
  """Restores a run (config, parameters, optimizer state) from `workdir` onto `mesh`.

  `mesh` defaults to a mesh over the first local device only, so a run trained on many
  devices can be analysed on one CPU. `step` defaults to the latest checkpoint;
  `folder="best_checkpoint"` restores the best one by the task's metric (BLEU).
  """
  config = load_config(workdir)
  if config is None:
    raise errors.CheckpointError(f"{workdir} holds no {CONFIG_FILE}: not an lnjax workdir")
  run = run_lib.resolve_config(config)
  mesh = mesh or sharding.make_mesh(sharding.MeshConfig(data=1), jax.local_devices()[:1])
  setup = state_lib.make_setup(run.model, run.opt, run.train.num_steps, task=run.task)
  target = state_lib.abstract_state(setup, mesh)
  manager = ocp.CheckpointManager(os.path.join(os.path.abspath(workdir), folder))
  steps = manager.all_steps()
  if not steps:
    raise errors.CheckpointError(f"{workdir} holds no checkpoint in {folder}/")
  step = max(steps) if step is None else step
  if step not in steps:
    raise errors.CheckpointError(
        f"{workdir} has no checkpoint at step {step}; steps: {', '.join(map(str, sorted(steps)))}")
  restored = manager.restore(step, args=ocp.args.Composite(
      state=ocp.args.StandardRestore(target), data=ocp.args.JsonRestore()))
  manager.close()
  return RestoredRun(config, run, setup, restored.state, restored.data, step)
