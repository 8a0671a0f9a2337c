r"""`python -m lnjax.cli.stability` (`lnjax stability`): the highest stable learning rate
of each (placement, depth, warm-up) cell, searched (lnjax/sweep/stability.py).

  python -m lnjax.cli.stability --config=configs/lm.py --workdir=/tmp/stab \
      --placements=post,pre --depths=4,8 --warmups=0,500 --seeds=3 --probe_steps=600 \
      [--parallel=2] [--backend=local|slurm|ray] [--config.data.batch_size=16]
  ... the same flags --report_only   # the table so far, while it runs; launches nothing
  ... --state=experiments/atlas/x.json  # the state kept apart: a new workdir continues it
  ... --warmups=500 --range_tests_from=OTHER/search.json  # reuses OTHER's range tests
  ... --depths=6,12 --predict  # no search: each cell's edge predicted from a 20-step run
                               # (one run a placement and depth: 6 layers, a minute on 2 cores)

Exit codes: 0 the search ended (a cell without a stable rate is a result too, with one
line on stderr); 1 a run failed (its error line; the same command retries it); 2 a
refused input; 128 + signal when stopped (the runs saved).
"""

import os
import sys

from lnjax.core import allocator
allocator.tune_glibc_malloc()  # glibc malloc for XLA:CPU, before JAX starts
from absl import app, flags, logging
from ml_collections import config_flags

from lnjax import cli
from lnjax import sweep as sweep_lib
from lnjax.core import errors, fileio
from lnjax.sweep import launcher as launcher_lib, search, stability

_CONFIG = config_flags.DEFINE_config_file("config", None, "Config file[:presets] of the "
                                          "runs (an LM: configs/lm.py).", lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "Folder of the search: search.json, runs/, "
                               "the results.")
_STATE = flags.DEFINE_string("state", None, "The search's state file (default "
                             "WORKDIR/search.json): the brackets and the probes' results. "
                             "Kept apart from WORKDIR, a new WORKDIR continues the search.")
_RANGE_FROM = flags.DEFINE_list("range_tests_from", [], "Other searches' state files whose "
                                "range tests (run with the same config, range steps and "
                                "rates) serve this one: one range test serves every warm-up.")
_PLACEMENTS = flags.DEFINE_list("placements", ["post", "pre"], "model.norm_position values.")
_DEPTHS = flags.DEFINE_list("depths", None, "model.num_layers values (default: the config's).")
_WARMUPS = flags.DEFINE_list("warmups", ["0"], "Linear warm-up lengths in steps.")
_SEEDS = flags.DEFINE_integer("seeds", 3, "Runs per probe (seeds 0..N-1); stable in all.")
_FIRST_SEED_ALONE = flags.DEFINE_bool(
    "first_seed_alone", True, "Run a probe's seed 0 alone and its other seeds only once it "
    "is stable: a failing probe costs one run. False: every seed at once (more workers busy).")
_PROBE_STEPS = flags.DEFINE_integer("probe_steps", None, "Steps of each probe after its "
                                    "warm-up (default: the config's train.num_steps).")
_RANGE_STEPS = flags.DEFINE_integer("range_steps", None, "Steps of the range test (default: "
                                    "--probe_steps).")
_LR_MIN = flags.DEFINE_float("lr_min", 1e-5, "The range test's first rate.")
_LR_MAX = flags.DEFINE_float("lr_max", 1.0, "The range test's last rate.")
_TOLERANCE = flags.DEFINE_float("tolerance", 1.4, "Bisect until the bracket's ends are "
                                "within this factor.")
_WIDEN = flags.DEFINE_float("widen", 10.0, "A bracket end that fails is moved by this "
                            "factor: the low end down to --lr_min, the high end once.")
_MARGIN = flags.DEFINE_float("margin_nats", 0.1, "Stable runs end at least this far below "
                             "the unigram baseline (nats).")
_DIVERGENCE = flags.DEFINE_float("divergence_factor", 2.0, "train.divergence_factor of every "
                                 "run: a loss above this × ln V ends it as diverged.")
_PREDICT = flags.DEFINE_bool("predict", False, "No search: predict each cell's highest "
                             "stable rate, with an interval, from a 20-step run at lr 1e-3 "
                             "in WORKDIR/predict (lnjax/sweep/predict.py; fitted on the "
                             "atlas, configs/lm.py:size=small, 2020 block: another task or "
                             "block is refused).")
_BACKEND = flags.DEFINE_enum("backend", "local", ["local", "slurm", "ray"], "As lnjax.sweep's.")
_REPORT_ONLY = flags.DEFINE_bool("report_only", False, "Write the table and figure from the "
                                  "runs finished so far; launch nothing.")
_PARALLEL = flags.DEFINE_integer("parallel", 1, "Runs at once (local: each on its own devices).")
_DEVICES_PER_RUN = flags.DEFINE_integer("devices_per_run", None, "local, ray: devices per run.")
_RAY_ADDRESS = flags.DEFINE_string("ray_address", None, "ray: the cluster's HEAD:PORT.")
_SBATCH_ARGS = flags.DEFINE_string("sbatch_args", "", "slurm: sbatch options.")
flags.mark_flags_as_required(["config", "workdir"])
for _name, _low in (("seeds", 1), ("probe_steps", 1), ("range_steps", 2), ("parallel", 1),
                    ("devices_per_run", 1), ("divergence_factor", 0.0)):
  cli.number(_name, _low)  # (divergence_factor: 0 = NaN/Inf only, as train's.)
for _name, _low in (("lr_min", 0.0), ("lr_max", 0.0), ("tolerance", 1.0), ("widen", 1.0)):
  cli.number(_name, _low, low_open=True)
cli.number("margin_nats")  # Any finite margin (a negative one accepts a loss above the baseline).
PROG = "lnjax.cli.stability"


def launch(s: stability.Search, runs: list[sweep_lib.Run]) -> int:
  """The runs through the chosen sweep back end; its exit code (0: all finished). The state
  records each probe as its last seed finishes, not at the end of the round."""
  view = {"table_every_seconds": 600.0, "on_finished": lambda run: s.record()}
  if _BACKEND.value == "slurm":
    from lnjax.sweep import slurm
    return slurm.SlurmLauncher(s.config_arg, "stability", runs, s.root, s.fixed,
                               sbatch_args=_SBATCH_ARGS.value, parallel=_PARALLEL.value,
                               **view).run()
  if _BACKEND.value == "ray":
    from lnjax.sweep import ray_backend
    return ray_backend.RayLauncher(s.config_arg, "stability", runs, s.root, s.fixed,
                                   address=_RAY_ADDRESS.value, parallel=_PARALLEL.value,
                                   devices_per_run=_DEVICES_PER_RUN.value, **view).run()
  slots = launcher_lib.make_slots("auto", _PARALLEL.value, _DEVICES_PER_RUN.value)
  return launcher_lib.Launcher(s.config_arg, "stability", runs, s.root, slots, s.fixed,
                               **view).run()


def main(argv):
  cli.refuse_arguments(argv, prog=PROG)
  # No INFO lines between the progress lines (gcsfs logs each read of a gs:// workdir).
  logging.set_verbosity(logging.WARNING)
  config_arg, fixed = cli.config_and_overrides()
  config = _CONFIG.value
  try:
    placements = [p for p in _PLACEMENTS.value if p]
    depths = cli.int_list("depths", [config.model.num_layers] if _DEPTHS.value is None
                          else _DEPTHS.value)
    warmups = cli.int_list("warmups", _WARMUPS.value)
    # (0 is a value, refused below, not "unset".)
    probe_steps = config.train.num_steps if _PROBE_STEPS.value is None else _PROBE_STEPS.value
    range_steps = probe_steps if _RANGE_STEPS.value is None else _RANGE_STEPS.value
    for name, value, low in (("seeds", _SEEDS.value, 1), ("probe_steps", probe_steps, 1),
                             ("range_steps", range_steps, 2)):
      errors.check_int(f"--{name}", value, low)
    if not 0 < _LR_MIN.value < _LR_MAX.value:
      raise errors.ConfigError(f"--lr_min={_LR_MIN.value:g} and --lr_max={_LR_MAX.value:g} "
                               "must satisfy 0 < lr_min < lr_max")
    errors.check_path("--workdir", _WORKDIR.value)
    if _PREDICT.value and (_REPORT_ONLY.value or _RANGE_FROM.value):
      raise errors.ConfigError("--predict runs no search: it takes neither --report_only nor "
                               "--range_tests_from")
    stability.check_inputs(config_arg, fixed, placements, depths, warmups)
    workdir = _WORKDIR.value
    if fileio.exists(workdir) and not fileio.isdir(workdir):
      raise errors.WorkdirError(f"--workdir={workdir} is a file, not a folder: name a folder "
                                "(a new one starts a search)")
    # The workdir is this command's own only if a search's: its state there, and none of the
    # files of another run (a training run's folder, with or without a search.json, is not).
    own = fileio.exists(fileio.join(workdir, stability.STATE)) and not any(
        fileio.exists(fileio.join(workdir, name)) for name in fileio.RUN_FILES)
    fileio.refuse_run_files("--workdir", workdir,
                            [workdir, *([_STATE.value] if _STATE.value else [])],
                            own=[workdir] if own else [])
    if _PREDICT.value:
      _predict(config_arg, fixed, placements, depths, warmups)
      return
    stable = search.Stable(probe_steps, _DIVERGENCE.value, _MARGIN.value)
    s = stability.Search(config_arg, fixed, _WORKDIR.value, placements=placements,
                         depths=depths, warmups=warmups, seeds=_SEEDS.value,
                         range_steps=range_steps, lr_min=_LR_MIN.value, lr_max=_LR_MAX.value,
                         tolerance=_TOLERANCE.value,
                         widen=_WIDEN.value, stable=stable, state_path=_STATE.value,
                         first_seed_alone=_FIRST_SEED_ALONE.value)
    if not _REPORT_ONLY.value and (taken := s.borrow_range_tests(_RANGE_FROM.value)):
      print(f"{len(taken)} range test(s) from {', '.join(_RANGE_FROM.value)}: "
            f"{', '.join(taken)}", flush=True)
    if s.is_new or not _REPORT_ONLY.value:  # (--report_only never rewrites a search's state.)
      s.save()
    print(s.stable.describe(s.seeds), flush=True)  # (With the probes' recovery.)
    if _REPORT_ONLY.value:
      s.record()
      if not s.state["range_tests"]:  # (No probe runs before its cell's range test.)
        print(f"Nothing measured yet in {_WORKDIR.value}: no range test has finished; the "
              "same command without --report_only runs the search.", flush=True)
        return
    else:
      stability.run_search(s, launch)
  except errors.LnjaxError as e:
    cli.fail(str(e), e.exit_code, prog=PROG)
  from lnjax.sweep import stability_report  # matplotlib only at the end.
  result = stability_report.write(s, command=" ".join(["python -m lnjax.cli.stability",
                                                        *sys.argv[1:]]))
  print("\n".join(result["markdown"]))
  print(f"\nResults: {', '.join(result['paths'].values())}", flush=True)
  for cell, row in result["below"]:
    print(f"{PROG}: {stability.cell_name(cell)}: the bracket's low end "
          f"{row['lowest_unstable_lr']:g} "
          "is unstable, widened down to --lr_min; no stable rate found, this cell's search "
          "stopped", file=sys.stderr, flush=True)


def _predict(config_arg, fixed, placements, depths, warmups) -> None:
  """--predict: the lines of lnjax/sweep/predict.py; stopped by SIGTERM (a feature run keeps
  its checkpoint, the finished ones their records), exit 143 in one line, as lnjax.main."""
  from lnjax.core import preemption
  from lnjax.sweep import predict
  try:
    lines = predict.predict_cells(config_arg, fixed, placements, depths, warmups,
                                  _WORKDIR.value)
  except preemption.Preempted as e:
    print(f"{PROG}: {e.signal}: stopped; the same command resumes (finished feature runs are "
          "read again)", file=sys.stderr, flush=True)
    os._exit(e.exit_code)  # (No teardown: a stop has a deadline; everything is written.)
  print("\n".join(lines), flush=True)


if __name__ == "__main__":
  app.run(main, flags_parser=lambda argv: cli.parse_flags(argv, prog=PROG))
