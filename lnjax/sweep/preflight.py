"""The pre-flight of a sweep, before any back end (local, SLURM, Ray or KubeRay) queues a
run, --dry_run included: every run's config is resolved as lnjax.main will resolve it, and
a run it would refuse (an override invalid at one grid point: model.qk_norm=True beside
model.norm_position=olmo2) refuses the sweep in one line naming the run (`resolve`).

Bound for TPU slices (`lnjax sweep ... --topology=v5e-16`), the grid's largest run is also
compiled for the slice by libtpu's compiler here (lnjax/core/plan.py); a run that cannot
fit a chip's HBM is refused in one line (`check`). --skip_preflight launches anyway.

The largest run: the most parameters, then the most activations (batch × length × width
× depth), then no rematerialization (counted from the config, compiled for one run only:
a 7B compile takes minutes on two cores).
"""

from lnjax import sweep as sweep_lib, tasks
from lnjax.core import errors, plan, run as run_lib, tpu


def resolve(runs: list) -> None:
  """Each run's config resolved as lnjax.main resolves it (run_lib.resolve_config): a
  ConfigError naming the first run refused, and how many are, if any is."""
  refused = []
  for run in runs:
    try:
      run_lib.resolve_config(run.config, tasks=tasks.get)
    except errors.ConfigError as e:
      refused.append((run.name, e))
  if refused:
    name, e = refused[0]
    raise errors.ConfigError(f"run {name} would be refused: {e} ({len(refused)} of the "
                             f"{len(runs)} runs; none started)")


def _size(run: sweep_lib.Run) -> tuple:
  m, d = run.config.model, run.config.data
  layers = m.num_layers + m.get("num_decoder_layers", 0)
  vocab = m.vocab_size or d.get("vocab_size", 0)
  params = layers * m.d_model * (4 * m.d_model + 2 * m.d_ff) + vocab * m.d_model
  tokens = d.get("batch_size", 0) * d.get("seq_len", 0) or d.get("max_tokens", 0)
  return params, tokens * m.d_model * layers, m.remat_policy == "none"


def largest(runs: list) -> sweep_lib.Run:
  return max(runs, key=_size)


def check(runs: list, topology: str, num_slices: int = 1, log=print) -> dict:
  """Compiles the largest of `runs` for `topology`; its train step's report, or a
  ConfigError naming the run and by how much it misses."""
  slice_ = tpu.parse_topology(topology, num_slices)
  run = largest(runs)
  log(f"Pre-flight: compiling {run.name} (the grid's largest run) for {slice_.name} ...")
  try:
    report = plan.plan_run(run.config, slice_, with_eval=False, tasks=tasks.get)["train"]
  except errors.ConfigError as e:
    raise errors.ConfigError(f"pre-flight: run {run.name} on {slice_.name}: {e}") from None
  if not report["fits"]:
    need = report.get("hbm_required_bytes", report.get("hbm_total_bytes", 0))
    raise errors.ConfigError(
        f"pre-flight: run {run.name} needs {need / tpu.GiB:.2f} GiB per chip of "
        f"{slice_.name} ({report['verdict']}); nothing queued (--skip_preflight launches anyway)")
  log(f"Pre-flight: {run.name} fits ({report['hbm_total_bytes'] / tpu.GiB:.2f} GiB of "
      f"{report['hbm_capacity_bytes'] / tpu.GiB:.2f} GiB per chip).")
  return report
