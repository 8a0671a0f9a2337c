r"""Which parameters of a run to use, by name: best, latest, a step, or the average of the
last N checkpoints (fairseq's scripts/average_checkpoints.py, standard WMT practice).

  python -m lnjax.cli.average --workdir=DIR --last=N [--output=DIR_avgN]

writes the average of DIR's last N checkpoints as a new workdir (config.json and one
checkpoint at the latest step), which every tool reads as any run with its default
checkpoint: lnjax translate, lnjax train --mode=predict, lnjax analyze, lnjax export
(their `best` is that one checkpoint). The same average is computed on the fly by
`--checkpoint=avg:N` of those tools.

The average is the element-wise mean of the parameters, accumulated in float32 and cast
back to each parameter's dtype, as fairseq does. The optimizer state and the data
position kept with the averaged checkpoint are the latest checkpoint's (an average of
Adam's moments has no use), so training does not resume from it meaningfully: it is
for decoding and analysis.
"""

import dataclasses
import json
import os
import re

import jax
import jax.numpy as jnp

from lnjax.core import checkpoint as ckpt_lib, errors, fileio, run as run_lib, sharding

AVERAGE_FILE = "averaged_from.json"


@dataclasses.dataclass
class Chosen:
  """A run's parameters picked by `restore`."""

  restored: ckpt_lib.RestoredRun  # The (latest, for an average) checkpoint restored whole.
  params: object
  label: str  # 'step20', or 'avg2-step20' for the mean of the 2 checkpoints up to step 20.
  steps: list[int]  # The checkpoints the parameters come from.


def parse_spec(spec: str, flag: str = "--checkpoint",
               also: str = "") -> tuple[str, int | None]:
  """'best' | 'latest' | 'STEP' | 'avg:N' -> (kind, number); the numbers in ASCII digits
  only (str.isdigit also takes '²', which int() then refuses). `also`: the caller's own
  choices, handled before this, named first in the refusal (lnjax analyze's 'init')."""
  if spec in ("best", "latest"):
    return spec, None
  if isinstance(spec, str) and re.fullmatch(r"[0-9]+", spec):
    return "step", int(spec)
  if isinstance(spec, str) and re.fullmatch(r"avg:0*[1-9][0-9]*", spec):
    return "avg", int(spec[4:])
  choices = f"{also}, " if also else ""
  raise errors.LnjaxError(f"{flag}={spec!r} must be {choices}best, latest, a step or avg:N "
                          "(the mean of the last N checkpoints' parameters)")


def checkpoint_steps(workdir: str, folder: str = "checkpoints") -> list[int]:
  """The steps saved in `workdir/folder`, ascending (orbax's step folders)."""
  directory = os.path.join(workdir, folder)
  if not fileio.isdir(directory):
    return []
  return sorted(int(n) for n in os.listdir(directory) if re.fullmatch(r"[0-9]+", n))


def restore(workdir: str, spec: str = "latest", mesh=None, flag: str = "--checkpoint", *,
            tasks: run_lib.TaskLookup, also: str = "") -> Chosen:
  """The parameters named by `spec` (parse_spec, `also` as there), restored onto `mesh`
  (default: one local device); `tasks`: the task registry's lookup (lnjax.tasks.get)."""
  kind, number = parse_spec(spec, flag, also)
  if kind == "best" and fileio.exists(os.path.join(workdir, AVERAGE_FILE)):
    kind = "latest"  # An average (write_average) is its run's one checkpoint: the best too.
  if kind in ("best", "latest", "step"):
    folder = "best_checkpoint" if kind == "best" else "checkpoints"
    restored = ckpt_lib.restore_run(workdir, step=number, mesh=mesh, folder=folder,
                                     tasks=tasks)
    return Chosen(restored, restored.state.params, f"step{restored.step}", [restored.step])
  steps = checkpoint_steps(workdir)
  if len(steps) < number:
    raise errors.CheckpointError(
        f"{flag}=avg:{number}: {workdir} keeps {len(steps)} checkpoint(s) "
        f"({', '.join(map(str, steps)) or 'none'}); raise train.keep_checkpoints to keep more")
  steps = steps[-number:]
  total, restored = None, None
  for step in steps:  # One checkpoint in memory at a time beside the running sum.
    restored = ckpt_lib.restore_run(workdir, step=step, mesh=mesh, tasks=tasks)
    params = jax.tree.map(lambda x: x.astype(jnp.float32), restored.state.params)
    total = params if total is None else jax.tree.map(jnp.add, total, params)
  last = restored.state.params
  mean = jax.tree.map(lambda s, x: (s / len(steps)).astype(x.dtype), total, last)
  return Chosen(restored, mean, f"avg{len(steps)}-step{steps[-1]}", steps)


def write_average(workdir: str, last: int, output: str, *, tasks: run_lib.TaskLookup) -> dict:
  """Writes the mean of `workdir`'s last `last` checkpoints as the run in `output`
  (`tasks`: as restore's)."""
  errors.check_int("--last", last, 1)
  fileio.refuse_run_files("--output", output, [output])
  if ckpt_lib.load_config(output) is not None or checkpoint_steps(output):
    raise errors.WorkdirError(f"{output} already holds a run; choose a new --output")
  steps = checkpoint_steps(workdir)
  if len(steps) < last:
    raise errors.CheckpointError(
        f"--last={last}: {workdir} keeps {len(steps)} checkpoint(s) "
        f"({', '.join(map(str, steps)) or 'none'}); raise train.keep_checkpoints to keep more")
  mesh = sharding.make_mesh(sharding.MeshConfig(data=1), jax.local_devices()[:1])
  chosen = restore(workdir, f"avg:{last}", mesh, tasks=tasks)
  r = chosen.restored
  fileio.makedirs(output)
  ckpt_lib.save_config(output, r.config)
  saver = ckpt_lib.Checkpoints(output, every_steps=1, keep=1)
  saver.save(r.step, r.state.replace(params=chosen.params), r.data_state, force=True)
  saver.close()
  record = {"workdir": os.path.abspath(workdir), "steps": chosen.steps,
            "method": "element-wise mean of the parameters (float32), fairseq's "
                      "average_checkpoints; optimizer state and data position of the latest"}
  fileio.write_text(os.path.join(output, AVERAGE_FILE), json.dumps(record, indent=2) + "\n")
  return {**record, "output": output, "step": r.step}
