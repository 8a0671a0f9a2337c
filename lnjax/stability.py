r"""The highest stable learning rate of each (placement, depth, warm-up) cell, searched.

  python -m lnjax.stability --config=configs/lm.py --workdir=/tmp/stab \
      --placements=post,pre --depths=4,8 --warmups=0,500 --seeds=3 --probe_steps=600 \
      [--parallel=2] [--backend=local|slurm|ray] [--config.data.batch_size=16]

Per (placement, depth) one learning-rate range test (a run whose rate grows geometrically
from --lr_min to --lr_max) brackets the answer; per cell a bisection in log-space with
short probes (--seeds runs at one peak rate, constant after the cell's linear warm-up)
narrows the bracket to a factor --tolerance (lnjax/sweep/search.py has the rules). Every
run is an ordinary lnjax.main run in WORKDIR/runs/<name>, its name spelled from its
settings, launched through the sweep back ends; WORKDIR/search.json holds the brackets and
the probes' results, so the same command again continues a killed search and never runs
a finished probe again. Results: WORKDIR/stability.md, stability.json, stability.png.

Exit codes: 0 the search ended (a cell without a stable rate is a result too, with one
line on stderr); 1 a run failed (its error line; the same command retries it); 2 a
refused input; 128 + signal when stopped (the runs saved).
"""

import json
import os
import sys

from lnjax import allocator
allocator.tune_glibc_malloc()  # glibc malloc for XLA:CPU, before JAX starts
from absl import app, flags
from ml_collections import config_flags

from lnjax import cli, errors, sections
from lnjax import sweep as sweep_lib
from lnjax.sweep import launcher as launcher_lib
from lnjax.sweep import search

_CONFIG = config_flags.DEFINE_config_file("config", None, "Config file[:presets] of the "
                                          "runs (an LM: configs/lm.py).", lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "Folder of the search: search.json, runs/, "
                               "the results.")
_PLACEMENTS = flags.DEFINE_list("placements", ["post", "pre"], "model.norm_position values.")
_DEPTHS = flags.DEFINE_list("depths", None, "model.num_layers values (default: the config's).")
_WARMUPS = flags.DEFINE_list("warmups", ["0"], "Linear warm-up lengths in steps.")
_SEEDS = flags.DEFINE_integer("seeds", 3, "Runs per probe (seeds 0..N-1); stable in all.")
_PROBE_STEPS = flags.DEFINE_integer("probe_steps", None, "Steps of each probe (default: the "
                                    "config's train.num_steps).")
_RANGE_STEPS = flags.DEFINE_integer("range_steps", None, "Steps of the range test (default: "
                                    "--probe_steps).")
_LR_MIN = flags.DEFINE_float("lr_min", 1e-5, "The range test's first rate.")
_LR_MAX = flags.DEFINE_float("lr_max", 1.0, "The range test's last rate.")
_TOLERANCE = flags.DEFINE_float("tolerance", 1.4, "Bisect until the bracket's ends are "
                                "within this factor.")
_WIDEN = flags.DEFINE_float("widen", 10.0, "A bracket end that fails is moved once by this "
                            "factor.")
_MARGIN = flags.DEFINE_float("margin_nats", 0.1, "Stable runs end at least this far below "
                             "the unigram baseline (nats).")
_DIVERGENCE = flags.DEFINE_float("divergence_factor", 2.0, "train.divergence_factor of every "
                                 "run: a loss above this × ln V ends it as diverged.")
_BACKEND = flags.DEFINE_enum("backend", "local", ["local", "slurm", "ray"], "As lnjax.sweep's.")
_PARALLEL = flags.DEFINE_integer("parallel", 1, "Runs at once (local: each on its own devices).")
_DEVICES_PER_RUN = flags.DEFINE_integer("devices_per_run", None, "local, ray: devices per run.")
_RAY_ADDRESS = flags.DEFINE_string("ray_address", None, "ray: the cluster's HEAD:PORT.")
_SBATCH_ARGS = flags.DEFINE_string("sbatch_args", "", "slurm: sbatch options.")
flags.mark_flags_as_required(["config", "workdir"])
PROG = "lnjax.stability"
STATE = "search.json"


class Search:
  """The cells of one search, their runs and its state file (WORKDIR/search.json)."""

  def __init__(self, config_arg: str, fixed: dict, workdir: str, *, placements, depths,
               warmups, seeds: int, range_steps: int, lr_min: float, lr_max: float,
               tolerance: float, widen: float, stable: search.Stable):
    self.config_arg, self.fixed, self.workdir = config_arg, dict(fixed), workdir
    self.placements, self.depths, self.warmups = placements, depths, warmups
    self.seeds, self.range_steps, self.stable = seeds, range_steps, stable
    self.lr_min, self.lr_max, self.tolerance, self.widen = lr_min, lr_max, tolerance, widen
    self.settings = {"config": config_arg, "fixed": {k: _plain(v) for k, v in fixed.items()},
                     "seeds": seeds, "probe_steps": stable.steps, "range_steps": range_steps,
                     "lr_min": lr_min, "lr_max": lr_max, "tolerance": tolerance,
                     "widen": widen, "margin_nats": stable.margin_nats,
                     "divergence_factor": stable.divergence_factor}
    self.root = os.path.join(workdir, "runs")
    self.state = self._load()

  # ---- Cells and runs.

  def cells(self) -> list[tuple[str, int, int]]:
    return [(p, d, w) for p in self.placements for d in self.depths for w in self.warmups]

  def range_run(self, placement: str, depth: int) -> sweep_lib.Run:
    gamma = search.range_test_growth(self.lr_min, self.lr_max, self.range_steps)
    return self._run(f"range_test,norm={placement},layers={depth}", {
        "model.norm_position": placement, "model.num_layers": depth,
        "opt.schedule": "exponential", "opt.learning_rate": self.lr_min,
        "opt.decay_factor": gamma, "opt.warmup_steps": 0, "seed": 0,
        "train.num_steps": self.range_steps, "train.log_every_steps": 1,
        "train.eval_every_steps": self.range_steps,
        "train.checkpoint_every_steps": self.range_steps})

  def probe_runs(self, cell, lr: float) -> list[sweep_lib.Run]:
    placement, depth, warmup = cell
    steps = self.stable.steps
    return [self._run(f"norm={placement},layers={depth},warmup={warmup},lr={lr:g},seed={s}", {
        "model.norm_position": placement, "model.num_layers": depth,
        "opt.learning_rate": lr, "opt.warmup_steps": warmup, "seed": s,
        "train.num_steps": steps, "train.eval_every_steps": steps,
        "train.checkpoint_every_steps": steps}) for s in range(self.seeds)]

  def _run(self, name: str, overrides: dict) -> sweep_lib.Run:
    overrides = {**overrides, "train.divergence_factor": self.stable.divergence_factor}
    config = sweep_lib.base_config(self.config_arg, {**self.fixed, **overrides})
    return sweep_lib.Run(name, overrides, config)

  def summary(self, run: sweep_lib.Run) -> dict:
    return launcher_lib.read_json(os.path.join(self.root, run.name, "summary.json")) or {}

  # ---- The state.

  def _load(self) -> dict:
    state = launcher_lib.read_json(os.path.join(self.workdir, STATE))
    if state is None:
      return {"settings": self.settings, "range_tests": {}, "probes": {}}
    changed = [f"--{k}={state['settings'].get(k)}" for k in self.settings
               if state["settings"].get(k) != self.settings[k]]
    if changed:
      raise errors.WorkdirError(f"{self.workdir} holds a search with {', '.join(changed)}: "
                                "run it with those settings, or use another --workdir")
    return state

  def save(self) -> None:
    os.makedirs(self.workdir, exist_ok=True)
    tmp = os.path.join(self.workdir, f".{STATE}.tmp")
    with open(tmp, "w") as f:
      json.dump(self.state, f, indent=2)
      f.write("\n")
    os.replace(tmp, os.path.join(self.workdir, STATE))

  def bracket(self, placement: str, depth: int) -> search.Bracket | None:
    entry = self.state["range_tests"].get(_key(placement, depth))
    return entry and search.Bracket(entry["lo"], entry["hi"], entry["note"])

  def results(self, cell) -> dict[float, bool]:
    return {float(lr): r["stable"] for lr, r in self.state["probes"].get(_key(*cell), {}).items()}

  def outcome(self, cell) -> search.Outcome | None:
    start = self.bracket(*cell[:2])
    return start and search.replay(start, self.results(cell), self.tolerance, self.widen)

  # ---- One round: the runs the search needs next, then their results.

  def next_runs(self) -> list[sweep_lib.Run]:
    runs = [self.range_run(p, d) for p in self.placements for d in self.depths
            if self.bracket(p, d) is None]
    for cell in self.cells():
      outcome = self.outcome(cell)
      if outcome is not None and outcome.next_lr is not None:
        runs += self.probe_runs(cell, outcome.next_lr)
    return runs

  def record(self) -> None:
    """Records every finished range test and probe that search.json lacks."""
    for p in self.placements:
      for d in self.depths:
        run = self.range_run(p, d)
        if self.bracket(p, d) is None and launcher_lib.finished_state(
            run, os.path.join(self.root, run.name)):
          summary = self.summary(run)
          records = launcher_lib.read_metrics(os.path.join(self.root, run.name))
          found = search.bracket(records, self.lr_max, summary.get("status") == "diverged")
          self.state["range_tests"][_key(p, d)] = {
              "lo": found.lo, "hi": found.hi, "note": found.note, "run": run.name,
              "steps": summary.get("step")}
    for cell in self.cells():
      outcome = self.outcome(cell)
      if outcome is None or outcome.next_lr is None:
        continue
      runs = self.probe_runs(cell, outcome.next_lr)
      judged = [self.stable.judge(self.summary(r)) for r in runs]
      stable = search.probe_result([j for j, _ in judged])
      if stable is not None:
        self.state["probes"].setdefault(_key(*cell), {})[f"{outcome.next_lr:g}"] = {
            "stable": stable, "runs": [r.name for r in runs],
            "seeds": [why for _, why in judged],
            "steps": sum(self.summary(r).get("step") or 0 for r in runs)}
    self.save()


def _key(*parts) -> str:
  return "/".join(str(p) for p in parts)


def _plain(v):
  return list(v) if isinstance(v, tuple) else v


def launch(s: Search, runs: list[sweep_lib.Run]) -> int:
  """The runs through the chosen sweep back end; its exit code (0: all finished)."""
  view = {"table_every_seconds": 600.0}
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


def run_search(s: Search) -> None:
  """Rounds of runs until every cell's search has ended; exits on a failed or stopped run."""
  said = set()
  while True:
    s.record()
    for cell in s.cells():
      outcome = s.outcome(cell)
      for event in (outcome.events if outcome else ()):
        if (cell, event) not in said:
          said.add((cell, event))
          print(f"{cell_name(cell)}: {event}", flush=True)
    runs = s.next_runs()
    if not runs:
      return
    print(f"-- round: {len(runs)} runs in {s.root}", flush=True)
    code = launch(s, runs)
    if code >= 128:
      sys.exit(code)
    if code:
      s.record()
      manifest = (launcher_lib.read_json(os.path.join(s.root, launcher_lib.MANIFEST))
                  or {}).get("runs", {})
      failed = [(r.name, manifest.get(r.name, {}).get("error")) for r in runs
                if manifest.get(r.name, {}).get("state") == launcher_lib.FAILED]
      name, error = failed[0] if failed else (runs[0].name, "unfinished")
      cli.fail(f"{len(failed) or 'some'} run(s) failed, first {name}: {error} "
               "(the same command retries them)", 1, prog=PROG)


def cell_name(cell) -> str:
  placement, depth, warmup = cell
  return f"{search.LABELS.get(placement, placement)}, {depth} layers, warm-up {warmup}"


def check_inputs(config_arg: str, fixed: dict, placements, depths, warmups,
                 probe_steps: int) -> None:
  """Refuses, before any run starts, what cannot be searched (one line, exit 2)."""
  from lnjax import models  # The model's own checks: a depth it cannot build.
  if not placements:
    raise errors.ConfigError("--placements is empty: name at least one, e.g. post,pre")
  for p in placements:
    errors.check_choice("--placements", p, models.NORM_POSITIONS)
  if not depths or not warmups:
    raise errors.ConfigError("--depths and --warmups need at least one value each")
  for w in warmups:
    if w < 0 or w >= probe_steps:
      raise errors.ConfigError(f"--warmups={w}: a warm-up must be >= 0 and shorter than "
                               f"--probe_steps={probe_steps}, or the probes never reach "
                               "their rate")
  for p in placements:
    for d in depths:
      config = sweep_lib.base_config(config_arg, {
          **fixed, "model.norm_position": p, "model.num_layers": d})
      try:
        sections.from_config(models.ModelConfig, "model", config.model)
      except errors.ConfigError as e:
        raise errors.ConfigError(f"--depths={d}: the model cannot be built with "
                                 f"{search.LABELS.get(p, p)}: {e}") from None


def _ints(name: str, values) -> list[int]:
  try:
    return [int(v) for v in values]
  except ValueError:
    raise errors.ConfigError(f"--{name}={','.join(values)}: integers expected") from None


def main(argv):
  if len(argv) > 1:
    cli.fail(f"unexpected arguments: {' '.join(argv[1:])}", prog=PROG)
  config_arg = flags.FLAGS["config"].config_filename
  fixed = config_flags.get_override_values(flags.FLAGS["config"])
  config = _CONFIG.value
  try:
    placements = [p for p in _PLACEMENTS.value if p]
    depths = _ints("depths", _DEPTHS.value or [config.model.num_layers])
    warmups = _ints("warmups", _WARMUPS.value)
    probe_steps = _PROBE_STEPS.value or config.train.num_steps
    range_steps = _RANGE_STEPS.value or probe_steps
    for name, value, low in (("seeds", _SEEDS.value, 1), ("probe_steps", probe_steps, 1),
                             ("range_steps", range_steps, 2)):
      errors.check_int(f"--{name}", value, low)
    if not 0 < _LR_MIN.value < _LR_MAX.value:
      raise errors.ConfigError(f"--lr_min={_LR_MIN.value:g} and --lr_max={_LR_MAX.value:g} "
                               "must satisfy 0 < lr_min < lr_max")
    for name, value in (("tolerance", _TOLERANCE.value), ("widen", _WIDEN.value)):
      if not value > 1:
        raise errors.ConfigError(f"--{name}={value:g} must be > 1")
    check_inputs(config_arg, fixed, placements, depths, warmups, probe_steps)
    stable = search.Stable(probe_steps, _DIVERGENCE.value, _MARGIN.value)
    s = Search(config_arg, fixed, _WORKDIR.value, placements=placements, depths=depths,
               warmups=warmups, seeds=_SEEDS.value, range_steps=range_steps,
               lr_min=_LR_MIN.value, lr_max=_LR_MAX.value, tolerance=_TOLERANCE.value,
               widen=_WIDEN.value, stable=stable)
    s.save()
    print(stable.describe(s.seeds), flush=True)
    run_search(s)
  except errors.LnjaxError as e:
    cli.fail(str(e), e.exit_code, prog=PROG)
  from lnjax.sweep import stability_report  # matplotlib only at the end.
  result = stability_report.write(s, command=" ".join(["python -m lnjax.stability",
                                                        *sys.argv[1:]]))
  print("\n".join(result["markdown"]))
  print(f"\nResults: {', '.join(result['paths'].values())}", flush=True)
  for cell, row in result["below"]:
    print(f"{PROG}: {cell_name(cell)}: the bracket's low end {row['lowest_unstable_lr']:g} "
          "is unstable after widening once; no stable rate found, this cell's search "
          "stopped", file=sys.stderr, flush=True)


if __name__ == "__main__":
  app.run(main, flags_parser=lambda argv: cli.parse_flags(argv, prog=PROG))
