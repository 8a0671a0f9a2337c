r"""The highest stable learning rate of each (placement, depth, warm-up) cell, searched
(the command: lnjax/cli/stability.py).

  python -m lnjax.cli.stability --config=configs/lm.py --workdir=/tmp/stab \
      --placements=post,pre --depths=4,8 --warmups=0,500 --seeds=3 --probe_steps=600 \
      [--parallel=2] [--backend=local|slurm|ray] [--config.data.batch_size=16]

Per (placement, depth) one learning-rate range test (a run whose rate grows geometrically
from --lr_min to --lr_max) brackets the answer; per cell a bisection in log-space with
short probes (--seeds runs at one peak rate, constant after the cell's linear warm-up)
narrows the bracket to a factor --tolerance (lnjax/sweep/search.py has the rules: an
unstable low end is widened ÷ --widen, down to --lr_min); a probe runs the cell's
warm-up, then --probe_steps steps at its rate. A probe's seed 0
runs alone and its other seeds only once it is stable, so a probe that fails costs one
run (--nofirst_seed_alone: every seed at once, for back ends with workers to spare). Every
run is an ordinary lnjax.main run in WORKDIR/runs/<name>, its name spelled from its
settings, launched through the sweep back ends; WORKDIR/search.json holds the brackets and
the probes' results, so the same command again continues a killed search and never runs
a finished probe again. `--state=FILE` keeps that file elsewhere (in a repository, say):
a search's state is all it needs to go on, so a new WORKDIR on another machine continues
it from the probes recorded there, and from the seeds already finished of a probe still
undecided (the state keeps their summaries). Results: WORKDIR/stability.md, stability.json,
stability.png.

Exit codes: 0 the search ended (a cell without a stable rate is a result too, with one
line on stderr); 1 a run failed (its error line; the same command retries it); 2 a
refused input; 128 + signal when stopped (the runs saved).
"""

import dataclasses
import json
import os
from typing import Callable

from lnjax.core import errors, fileio, run as run_lib, sections
from lnjax import sweep as sweep_lib
from lnjax.sweep import launcher as launcher_lib
from lnjax.sweep import search

STATE = "search.json"
# The state's key for the finished seeds of probes not yet decided: run name -> summary.
SEEDS_SO_FAR = "seeds_so_far"
# What `Stable.judge` and a probe's record read from a run's summary.json.
SUMMARY_KEYS = ("status", "step", "num_steps", "eval_loss", "unigram_baseline",
                "instability_actions", "wall_seconds")
# A range test's settings: searches alike in these can share their range tests.
RANGE_SETTINGS = ("config", "fixed", "range_steps", "lr_min", "lr_max")
# How often a probe that does not roll back saves its (one kept) checkpoint.
PROBE_CHECKPOINT_EVERY = 200


class Search:
  """The cells of one search, their runs and its state file (WORKDIR/search.json, or
  `state_path`)."""

  def __init__(self, config_arg: str, fixed: dict, workdir: str, *, placements, depths,
               warmups, seeds: int, range_steps: int, lr_min: float, lr_max: float,
               tolerance: float, widen: float, stable: search.Stable,
               state_path: str | None = None, first_seed_alone: bool = True):
    self.first_seed_alone = first_seed_alone and seeds > 1
    self.config_arg, self.fixed, self.workdir = config_arg, dict(fixed), workdir
    self.placements, self.depths, self.warmups = placements, depths, warmups
    base = sweep_lib.base_config(config_arg, self.fixed)
    # The probes recover as the config says (train.on_instability); the definition says so.
    stable = dataclasses.replace(stable, recovery=base.train.on_instability)
    self.seeds, self.range_steps, self.stable = seeds, range_steps, stable
    self.train = sections.from_config(run_lib.TrainConfig, "train", base.train.to_dict())
    self.lr_min, self.lr_max, self.tolerance, self.widen = lr_min, lr_max, tolerance, widen
    self.settings = {"config": config_arg, "fixed": {k: _plain(v) for k, v in fixed.items()},
                     "seeds": seeds, "probe_steps": stable.steps, "range_steps": range_steps,
                     "lr_min": lr_min, "lr_max": lr_max, "tolerance": tolerance,
                     "widen": widen, "margin_nats": stable.margin_nats,
                     "divergence_factor": stable.divergence_factor}
    self.root = os.path.join(workdir, "runs")
    self.state_path = state_path or fileio.join(workdir, STATE)
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
        "train.on_instability": "none",  # Its loss must be free to blow up: that is the bracket.
        "train.num_steps": self.range_steps, "train.log_every_steps": 1,
        "train.eval_every_steps": self.range_steps,
        "train.checkpoint_every_steps": self.range_steps})

  def probe_runs(self, cell, lr: float) -> list[sweep_lib.Run]:
    """The probe's runs: the cell's warm-up, then --probe_steps steps at the rate `lr` (every
    cell spends as long at its peak rate)."""
    placement, depth, warmup = cell
    steps = warmup + self.stable.steps
    # A probe that rolls back needs a checkpoint every rollback_steps (and the config's
    # keep_checkpoints); any other keeps one, the latest, every PROBE_CHECKPOINT_EVERY steps,
    # so a probe killed without warning (SIGKILL, a lost machine) resumes, losing few steps.
    if self.stable.recovery == "rollback":
      saving = {"train.checkpoint_every_steps": min(steps, self.train.rollback(steps)[0])}
    else:
      saving = {"train.checkpoint_every_steps": min(steps, PROBE_CHECKPOINT_EVERY),
                "train.keep_checkpoints": 1}
    return [self._run(f"norm={placement},layers={depth},warmup={warmup},lr={lr:g},seed={s}", {
        "model.norm_position": placement, "model.num_layers": depth,
        "opt.learning_rate": lr, "opt.warmup_steps": warmup, "seed": s,
        "train.num_steps": steps, "train.eval_every_steps": steps, **saving})
            for s in range(self.seeds)]

  def _run(self, name: str, overrides: dict) -> sweep_lib.Run:
    overrides = {**overrides, "train.divergence_factor": self.stable.divergence_factor}
    config = sweep_lib.base_config(self.config_arg, {**self.fixed, **overrides})
    return sweep_lib.Run(name, overrides, config)

  def summary(self, run: sweep_lib.Run) -> dict:
    """The run's summary.json; for a seed of a probe still running, the copy the state keeps
    (`record`), so a new WORKDIR (another machine's) need not run that seed again."""
    return (launcher_lib.read_json(os.path.join(self.root, run.name, "summary.json"))
            or self.state.get(SEEDS_SO_FAR, {}).get(run.name) or {})

  # ---- The state.

  def _load(self) -> dict:
    state = read_state(self.state_path)
    self.is_new = state is None
    if state is None:
      return {"settings": self.settings, "range_tests": {}, "probes": {}}
    changed = [f"--{k}={state['settings'].get(k)}" for k in self.settings
               if state["settings"].get(k) != self.settings[k]]
    if changed:
      raise errors.WorkdirError(f"{self.state_path} holds a search with "
                                f"{', '.join(changed)}: run it with those settings, or use "
                                "another --workdir (--state)")
    return state

  def save(self) -> None:
    fileio.write_text(self.state_path, json.dumps(self.state, indent=2) + "\n")

  def borrow_range_tests(self, paths: list[str]) -> list[str]:
    """Brackets from other searches' states: a range test serves every warm-up of its
    (placement, depth), so a search of new warm-ups takes those already run alike. Each
    (placement, depth) of this search without one takes the first state's that has it;
    returns their keys. A state whose range tests ran otherwise is refused."""
    taken = []
    for path in paths:
      other = read_state(path, flag="--range_tests_from")
      if other is None:
        raise errors.ConfigError(f"--range_tests_from={path}: no search state there")
      changed = [f"--{k}={other['settings'].get(k)}" for k in RANGE_SETTINGS
                 if other["settings"].get(k) != self.settings[k]]
      if changed:
        raise errors.ConfigError(f"--range_tests_from={path}: its range tests ran with "
                                 f"{', '.join(changed)}, not as this search's")
      for p in self.placements:
        for d in self.depths:
          key = _key(p, d)
          if key not in self.state["range_tests"] and key in other["range_tests"]:
            self.state["range_tests"][key] = {**other["range_tests"][key],
                                              "from": os.path.basename(path)}
            taken.append(key)
    return taken

  def bracket(self, placement: str, depth: int) -> search.Bracket | None:
    entry = self.state["range_tests"].get(_key(placement, depth))
    return entry and search.Bracket(entry["lo"], entry["hi"], entry["note"])

  def results(self, cell) -> dict[float, bool]:
    return {float(lr): r["stable"] for lr, r in self.state["probes"].get(_key(*cell), {}).items()}

  def outcome(self, cell) -> search.Outcome | None:
    start = self.bracket(*cell[:2])
    return start and search.replay(start, self.results(cell), self.tolerance, self.widen,
                                   floor=self.lr_min)

  # ---- One round: the runs the search needs next, then their results.

  def next_runs(self) -> list[sweep_lib.Run]:
    runs = [self.range_run(p, d) for p in self.placements for d in self.depths
            if self.bracket(p, d) is None]
    for cell in self.cells():
      outcome = self.outcome(cell)
      if outcome is not None and outcome.next_lr is not None:
        runs += self._needed(cell, self.probe_runs(cell, outcome.next_lr))
    return runs

  def _needed(self, cell, runs: list[sweep_lib.Run]) -> list[sweep_lib.Run]:
    """A probe's runs still to launch: with `first_seed_alone`, seed 0 alone until it is
    found stable, then every seed (an unstable probe is known from one run, not `seeds`);
    never a seed whose summary the state keeps."""
    if self.first_seed_alone and not self.stable.judge(self.summary(runs[0]),
                                                       warmup=cell[2]).stable:
      runs = runs[:1]
    kept = self.state.get(SEEDS_SO_FAR, {})
    return [r for r in runs if r.name not in kept]

  def record(self) -> None:
    """Records every finished range test and probe that the state lacks; writes the state
    only if that added something (a --report_only beside a running search never
    overwrites what the search has just written)."""
    before = json.dumps(self.state, sort_keys=True)
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
    kept = self.state.get(SEEDS_SO_FAR, {})  # `summary` reads it while the loop runs.
    for cell in self.cells():
      outcome = self.outcome(cell)
      if outcome is None or outcome.next_lr is None:
        continue
      summaries = [(r, self.summary(r)) for r in self.probe_runs(cell, outcome.next_lr)]
      judged = [self.stable.judge(summary, warmup=cell[2]) for _, summary in summaries]
      stable = search.probe_result([v.stable for v in judged])
      for (run, summary), v in zip(summaries, judged):
        if stable is None and v.stable is not None:  # Undecided: keep its finished seeds.
          kept[run.name] = {k: summary[k] for k in SUMMARY_KEYS if k in summary}
        elif stable is not None:
          kept.pop(run.name, None)
      if stable is not None:  # The runs that started (an unstable probe may skip seeds).
        self.state["probes"].setdefault(_key(*cell), {})[f"{outcome.next_lr:g}"] = {
            "stable": stable, "runs": [r.name for r, summary in summaries if summary],
            "seeds": [v.why if summary else "not run: another seed was unstable"
                      for v, (_, summary) in zip(judged, summaries)],
            "fails_by": search.fails_by(judged),
            "steps": sum(summary.get("step") or 0 for _, summary in summaries),
            "seconds": round(sum(summary.get("wall_seconds") or 0 for _, summary in summaries), 1)}
    self.state.pop(SEEDS_SO_FAR, None)
    if kept:
      self.state[SEEDS_SO_FAR] = kept
    if json.dumps(self.state, sort_keys=True) != before:
      self.save()


def read_state(path: str, flag: str = "") -> dict | None:
  """The search state in the file `path`; None if there is none. A file that is not one
  (not JSON, or not the shape read here: _malformed) is refused in one line, never
  replaced: it may hold a search's results. `flag`: the flag that named it, if any."""
  try:
    text = fileio.read_text(path)
    state = None if text is None else json.loads(text)
    why = None if text is None else _malformed(state)
  except (OSError, ValueError) as e:  # (A folder, not JSON, not UTF-8.)
    why = getattr(e, "strerror", None) or str(e).splitlines()[0]
  if why:
    hint = "" if flag else ": move it away and the same command starts a search afresh"
    raise errors.WorkdirError(f"{flag + '=' if flag else ''}{path} is not a search state "
                              f"({why}){hint}")
  return state


def _malformed(state) -> str | None:
  """What a search reading `state` would trip on (None: nothing): it reads an object of
  its settings, the range tests' brackets, the probes' results by cell then rate, and
  perhaps the summaries of the seeds so far."""
  def number(x):
    return isinstance(x, (int, float)) and not isinstance(x, bool)

  def probe(lr: str, p) -> bool:
    try:
      float(lr)  # (The key is the probe's rate.)
    except ValueError:
      return False
    return (isinstance(p, dict) and isinstance(p.get("stable"), bool)
            and isinstance(p.get("runs"), list) and number(p.get("steps"))
            and isinstance(p.get("seeds", []), list))
  if not isinstance(state, dict):
    return "not a JSON object"
  for key in ("settings", "range_tests", "probes", SEEDS_SO_FAR):
    if not isinstance(state.get(key, {} if key == SEEDS_SO_FAR else None), dict):
      return f'no "{key}" object'
  for key, e in state["range_tests"].items():
    if not (isinstance(e, dict) and number(e.get("lo")) and number(e.get("hi"))
            and isinstance(e.get("note"), str)):
      return f'range test "{key}" is not a bracket (lo, hi, note)'
  for key, probes in state["probes"].items():
    if not (isinstance(probes, dict) and all(probe(lr, p) for lr, p in probes.items())):
      return f'the probes of "{key}" are not rates with their results'
  if not all(isinstance(v, dict) for v in state.get(SEEDS_SO_FAR, {}).values()):
    return f'"{SEEDS_SO_FAR}" is not run summaries'
  return None


def _key(*parts) -> str:
  return "/".join(str(p) for p in parts)


def _plain(v):
  return list(v) if isinstance(v, tuple) else v


class RunsFailed(errors.LnjaxError):
  """A round's run failed; the same command retries it."""

  exit_code = 1


def run_search(s: Search, launch: Callable[[Search, list], int]) -> None:
  """Rounds of runs until every cell's search has ended, each round's runs through
  `launch(s, runs)` (a sweep back end; its exit code): raises RunsFailed on a failed run,
  SystemExit(128 + signal) on a stopped one (the runs saved)."""
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
      raise SystemExit(code)
    if code:
      s.record()
      manifest = (launcher_lib.read_json(os.path.join(s.root, launcher_lib.MANIFEST))
                  or {}).get("runs", {})
      failed = [(r.name, manifest.get(r.name, {}).get("error")) for r in runs
                if manifest.get(r.name, {}).get("state") == launcher_lib.FAILED]
      name, error = failed[0] if failed else (runs[0].name, "unfinished")
      raise RunsFailed(f"{len(failed) or 'some'} run(s) failed, first {name}: {error} "
                       "(the same command retries them)")


def cell_name(cell) -> str:
  placement, depth, warmup = cell
  return f"{search.LABELS.get(placement, placement)}, {depth} layers, warm-up {warmup}"


def check_inputs(config_arg: str, fixed: dict, placements, depths, warmups) -> None:
  """Refuses, before any run starts, what cannot be searched (one line, exit 2)."""
  from lnjax import models  # The model's own checks: a depth it cannot build.
  if not placements:
    raise errors.ConfigError("--placements is empty: name at least one, e.g. post,pre")
  for p in placements:
    errors.check_choice("--placements", p, models.NORM_POSITIONS)
  if not depths or not warmups:
    raise errors.ConfigError("--depths and --warmups need at least one value each")
  for w in warmups:
    if w < 0:
      raise errors.ConfigError(f"--warmups={w}: a warm-up is a number of steps, >= 0")
  for p in placements:
    for d in depths:
      config = sweep_lib.base_config(config_arg, {
          **fixed, "model.norm_position": p, "model.num_layers": d})
      try:
        sections.from_config(models.ModelConfig, "model", config.model)
      except errors.ConfigError as e:
        raise errors.ConfigError(f"--depths={d}: the model cannot be built with "
                                 f"{search.LABELS.get(p, p)}: {e}") from None
