r"""Launches a sweep of a config file's `get_sweep(arg)`, or gathers its report.

  python -m lnjax.cli.sweep --config=configs/lm.py:size=course --sweep=course --workdir=/tmp/c \
      [--parallel=2] [--devices_per_run=N] [--platform=auto|cpu|gpu|tpu] \
      [--config.train.num_steps=300]          # fixed overrides: every run, not in names
  python -m lnjax.cli.sweep --config=configs/lm.py:size=course --sweep=course --workdir=/tmp/c \
      --report
  python -m lnjax.cli.sweep ... --dry_run         # the runs and their commands; launches nothing
  python -m lnjax.cli.sweep --config=configs/lm.py:smoke --workdir=/tmp/grid \
      --grid='model.norm_position=pre,post opt.learning_rate=1e-3,3e-3'   # no get_sweep needed
  python -m lnjax.cli.sweep ... --backend=slurm [--nodes_per_run=2] \
      [--sbatch_args="--gpus-per-node=8"]
                                              # a SLURM job array (lnjax/sweep/slurm.py)
  python -m lnjax.cli.sweep ... --backend=ray --ray_address=HEAD:6379 \
      [--platform=gpu --devices_per_run=8]
                                              # Ray tasks on a cluster (lnjax/sweep/ray_backend.py)

Each run trains in WORKDIR/<name> (lnjax.main, its output in WORKDIR/<name>/log.txt);
the same command again skips finished runs and resumes the others. Exit codes: 0 every run
completed or diverged; 1 some run failed or is unfinished; 2 a refused sweep (among them one
with a run whose config lnjax.main would refuse: refused before any run starts, under
--dry_run too); 128+signal when stopped (the runs saved checkpoints).
"""

import shlex
import sys

from lnjax.core import allocator
allocator.tune_glibc_malloc()  # glibc malloc for XLA:CPU, before JAX starts
from absl import app, flags, logging
from ml_collections import config_flags

from lnjax import cli
from lnjax.core import errors, fileio
from lnjax import sweep as sweep_lib
from lnjax.sweep import launcher as launcher_lib

_CONFIG = config_flags.DEFINE_config_file("config", None, "Config file[:presets] whose "
                                          "get_sweep(arg) gives the runs.", lock_config=True)
_SWEEP = flags.DEFINE_string("sweep", None, "The argument of get_sweep: which sweep.")
_GRID = flags.DEFINE_string("grid", None, "Instead of --sweep: every combination of "
                            "'KEY=V1,V2 KEY=V1,V2' on the base config (lnjax/sweep/grid.py).")
_WORKDIR = flags.DEFINE_string("workdir", None, "Root folder: one folder per run, the report.")
_BACKEND = flags.DEFINE_enum("backend", "local", ["local", "slurm", "ray"],
                             "local: runs on this machine's devices; slurm: a job array; "
                             "ray: tasks on a Ray cluster.")
_PARALLEL = flags.DEFINE_integer("parallel", 1, "Runs at once, each on its own devices "
                                 "(slurm: array tasks at once; default as many as fit).")
_DEVICES_PER_RUN = flags.DEFINE_integer(
    "devices_per_run", None, "Devices (CPU cores, GPUs, TPU chips) per run; default: all "
    "devices / --parallel.")
_PLATFORM = flags.DEFINE_enum("platform", "auto", ["auto", "cpu", "gpu", "tpu"],
                              "What the devices are; auto: TPU chips, else GPUs, else cores.")
_NODES_PER_RUN = flags.DEFINE_integer("nodes_per_run", 1, "slurm, ray: nodes per run, one "
                                      "process each (jax.distributed).")
_RAY_ADDRESS = flags.DEFINE_string("ray_address", None, "ray: the cluster's HEAD:PORT "
                                   "(default $RAY_ADDRESS).")
_RAY_CONNECT = flags.DEFINE_float("ray_connect_seconds", 30.0, "ray: how long an address "
                                  "that does not answer is tried before giving up.")
_SBATCH_ARGS = flags.DEFINE_string("sbatch_args", "", "slurm: sbatch options, e.g. "
                                   "'--partition=gpu --gpus-per-node=8 --time=04:00:00'.")
_WAIT = flags.DEFINE_bool("wait", True, "slurm: wait for the job array and report.")
_REPORT = flags.DEFINE_bool("report", False, "Gather the runs' results (report.md, "
                            "results.csv/json, PNG plots in --workdir); launch nothing.")
_DRY_RUN = flags.DEFINE_bool("dry_run", False, "Print the runs and their commands only "
                             "(each run's config resolved first, as the run will).")
_TOPOLOGY = flags.DEFINE_string("topology", None, "The TPU slice the runs are for (v5e-16, "
                                "v5p-8, ...): the grid's largest run is compiled for it "
                                "first and a run that cannot fit is refused (lnjax/sweep/"
                                "preflight.py).")
_NUM_SLICES = flags.DEFINE_integer("num_slices", 1, "--topology: slices per run (multislice).")
_SKIP_PREFLIGHT = flags.DEFINE_bool("skip_preflight", False, "--topology: queue the runs "
                                    "without compiling the largest one first.")
_REFRESH = flags.DEFINE_float("refresh_seconds", 2.0, "Progress table redraw (terminal).")
_TABLE_EVERY = flags.DEFINE_float("table_every_seconds", 60.0,
                                  "Progress table period when the output is not a terminal.")
_GRACE = flags.DEFINE_float("grace_seconds", 600.0, "After SIGINT/SIGTERM, how long runs "
                            "may take to save before they are killed.")
flags.mark_flags_as_required(["config", "workdir"])
for _name in ("parallel", "devices_per_run", "nodes_per_run", "num_slices"):
  cli.number(_name, 1)
for _name in ("ray_connect_seconds", "refresh_seconds", "table_every_seconds"):
  cli.number(_name, 0.0, low_open=True)
cli.number("grace_seconds", 0.0)
PROG = "lnjax.cli.sweep"  # The errors' prefix.
PREFLIGHT_STOPPED = PROG + ": {signal}: stopped during the pre-flight compile; nothing queued"


def main(argv):
  cli.refuse_arguments(argv, prog=PROG)
  # No INFO lines between the progress lines (gcsfs logs each read of a gs:// workdir).
  logging.set_verbosity(logging.WARNING)
  config_arg, fixed = cli.config_and_overrides()
  root = _WORKDIR.value
  try:
    fileio.refuse_run_files("--workdir", root, [root], own=[root])
    runs = _runs(config_arg, fixed)
    if _REPORT.value:
      from lnjax.sweep import report  # matplotlib only when asked for.
      result = report.write(root, runs, title=f"Sweep {config_arg} {_what()}",
                            command=_command_line())
      print("\n".join(result["markdown"]))
      print(f"\nReport: {result['paths']['report.md']} (with results.csv, results.json, "
            "loss_curves.png, stability_map.png)")
      return
    from lnjax.sweep import preflight
    preflight.resolve(runs)  # Before anything is queued or listed.
    if _TOPOLOGY.value and not _SKIP_PREFLIGHT.value:
      _preflight(runs)
    view = {"refresh_seconds": _REFRESH.value, "table_every_seconds": _TABLE_EVERY.value}
    if _BACKEND.value == "slurm":
      from lnjax.sweep import slurm
      launcher = slurm.SlurmLauncher(
          config_arg, _SWEEP.value, runs, root, fixed, nodes_per_run=_NODES_PER_RUN.value,
          sbatch_args=_SBATCH_ARGS.value, wait=_WAIT.value,
          parallel=_PARALLEL.value if flags.FLAGS["parallel"].present else 0, **view)
    elif _BACKEND.value == "ray":
      from lnjax.sweep import ray_backend
      launcher = ray_backend.RayLauncher(
          config_arg, _SWEEP.value, runs, root, fixed, address=_RAY_ADDRESS.value,
          platform=_PLATFORM.value, devices_per_run=_DEVICES_PER_RUN.value,
          nodes_per_run=_NODES_PER_RUN.value, grace_seconds=_GRACE.value,
          connect_seconds=_RAY_CONNECT.value,
          parallel=_PARALLEL.value if flags.FLAGS["parallel"].present else 0, **view)
    else:
      slots = [] if _DRY_RUN.value else launcher_lib.make_slots(
          _PLATFORM.value, _PARALLEL.value, _DEVICES_PER_RUN.value)
      launcher = launcher_lib.Launcher(config_arg, _SWEEP.value, runs, root, slots, fixed,
                                       grace_seconds=_GRACE.value, **view)
    if _DRY_RUN.value:
      for run in runs:
        print(f"{run.name}\n  {shlex.join(launcher.command(run))}")
      if _BACKEND.value == "slurm":
        print(f"\nThe job array's script:\n{launcher.script(runs)}")
      return
    code = launcher.run()
  except errors.LnjaxError as e:
    cli.fail(str(e), e.exit_code, prog=PROG)
  print(f"Report: {_command_line()} --report")
  sys.exit(code)


def _preflight(runs: list) -> None:
  """The grid's largest run compiled for --topology (libtpu: minutes for a large model). A
  stop meanwhile is one line and exit 143, nothing queued, not libtpu's own handler's
  stack dump (lnjax/core/preemption.py's watcher ends a compile it cannot interrupt)."""
  from lnjax.core import preemption
  from lnjax.sweep import preflight
  with preemption.ends_in_one_line(PREFLIGHT_STOPPED):
    preflight.check(runs, _TOPOLOGY.value, _NUM_SLICES.value)


def _runs(config_arg: str, fixed: dict) -> list:
  """The runs of --grid, or of the config's get_sweep(--sweep) (get_sweep(None) without
  --sweep: a config whose get_sweep takes no argument needs none)."""
  if _SWEEP.value is not None and _GRID.value is not None:
    raise errors.ConfigError("give --sweep=NAME (the config's get_sweep) or "
                             "--grid='KEY=V1,V2 ...', not both")
  if _GRID.value is not None:
    from lnjax.sweep import grid
    return grid.runs(config_arg, _GRID.value, fixed)
  return sweep_lib.expand(config_arg, _SWEEP.value, fixed)


def _what() -> str:
  return f"--sweep={_SWEEP.value}" if _GRID.value is None else f"--grid={shlex.quote(_GRID.value)}"


def _command_line() -> str:
  return shlex.join(["python", "-m", "lnjax.cli.sweep",
                     *[a for a in sys.argv[1:] if a not in ("--report", "--noreport")]])


if __name__ == "__main__":
  app.run(main, flags_parser=lambda argv: cli.parse_flags(argv, prog=PROG))
