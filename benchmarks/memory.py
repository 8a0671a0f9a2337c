"""Where lnjax's host memory goes, phase by phase, under three allocator settings.

  python benchmarks/memory.py --out BENCHMARKS.md     # ~15 min on 2 cores
  python benchmarks/memory.py --models lm --steps 10 --no_default_run   # one model, ~3 min

For each suite model (benchmarks/suite.py's lm, mt, mlm: the same models, batches and
train step) and each setting, one worker process reports its resident set (VmRSS) and
its peak so far (VmHWM) after each phase:

  import      python, JAX and its CPU backend, lnjax
  state       parameters and Adam state initialized
  compile     the train step traced, lowered and compiled by XLA
  eval        the eval step compiled and run once
  first step  the first train step
  steady      --steps more steps (and their median time)
  checkpoint  the state saved with orbax

Settings (lnjax/core/allocator.py):
  glibc            LNJAX_MALLOPT=0: glibc's defaults (the step's scratch mmapped per step)
  tuned            LNJAX_MALLOC_RELEASE=0: one arena, no mmap, no trim (before 2026-12-01)
  tuned + release  the default: the same, and allocator.Footprint after each step
The settings' workers alternate model by model, so the machine's load falls on all three.
Then the README's default run (`lnjax train --config=default`, --default_steps steps) runs
once per setting as its own process; its peak is the process's ru_maxrss.

The PyTorch peers' peaks are benchmarks/suite.py's (its table's peak RSS column): run it
in the same session for the ratio.
"""

import os
import sys

import bench_env  # noqa: E402,F401  (first: lnjax on the path, malloc tuned before JAX)

import argparse  # noqa: E402
import json  # noqa: E402
import subprocess  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402

SETTINGS = {"glibc": {"LNJAX_MALLOPT": "0"}, "tuned": {"LNJAX_MALLOC_RELEASE": "0"},
            "tuned + release": {}}
PHASES = ("import", "state", "compile", "eval", "first step", "steady", "checkpoint")


def status_mib(pid="self") -> dict:
  """{'VmRSS': MiB, 'VmHWM': MiB} of a process (this one by default); {} once it is gone."""
  out = {}
  try:
    with open(f"/proc/{pid}/status") as f:
      for line in f:
        if line.startswith(("VmRSS:", "VmHWM:")):
          out[line[:5]] = int(line.split()[1]) / 1024
  except (FileNotFoundError, ProcessLookupError):
    pass
  return out


def worker(name: str, steps: int) -> None:
  """One model under the allocator setting of this process's environment: prints one JSON
  line with {phase: [rss, hwm]}, the steady steps' median ms and the settings in effect."""
  import jax
  import numpy as np
  import orbax.checkpoint as ocp

  import lm_step
  import suite
  from lnjax.core import allocator

  jax.numpy.zeros(1).block_until_ready()
  phases = {}

  def mark(phase):
    status = status_mib()
    phases.setdefault(phase, [status["VmRSS"], status["VmHWM"]])

  mark("import")
  cfg = suite.model_config(name, "pre")
  step = lm_step.TrainStep(cfg, suite.make_batch(name, cfg), suite.TASKS[name],
                           keep_initial_params=False, phase=mark)
  step.run(1)
  mark("first step")
  times = step.run(steps)
  mark("steady")
  with tempfile.TemporaryDirectory(prefix="lnjax_memory_") as tmp:
    checkpointer = ocp.StandardCheckpointer()
    checkpointer.save(os.path.join(tmp, "state"),
                      {"params": step.state.params, "opt_state": step.state.opt_state})
    checkpointer.wait_until_finished()
    step.footprint.after_phase()  # (As the trainer's Memory hook after a save.)
  mark("checkpoint")
  print(json.dumps({"phases": phases, "step_ms": 1e3 * float(np.median(times)),
                    "tuned": allocator.tune_glibc_malloc(),
                    "releases": step.footprint.releases, "xla_temp_mib": step.xla_temp_mib}))


def _env(setting: str) -> dict:
  """This process's environment with `setting`'s allocator variables, and no others."""
  env = {k: v for k, v in os.environ.items()
         if k not in ("LNJAX_MALLOPT", "LNJAX_MALLOC_RELEASE")}
  return {**env, **SETTINGS[setting]}


def run_worker(name: str, setting: str, steps: int) -> dict:
  env = _env(setting)
  out = subprocess.run([sys.executable, os.path.abspath(__file__), "--worker", name,
                        "--steps", str(steps)], env=env, capture_output=True, text=True)
  if out.returncode:
    raise SystemExit(f"{name} / {setting} worker failed:\n{out.stderr[-3000:]}")
  return json.loads(out.stdout.strip().splitlines()[-1])


def default_run(setting: str, num_steps: int) -> dict:
  """The README's first run (`lnjax train --config=default`) for `num_steps` steps, its
  evaluation and checkpoint at the last one: the process's peak RSS and wall time."""
  env = _env(setting)
  with tempfile.TemporaryDirectory(prefix="lnjax_memory_run_") as workdir, \
       tempfile.TemporaryFile("w+") as log:
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, "-m", "lnjax.main", "--config=default", f"--workdir={workdir}",
         f"--config.train.num_steps={num_steps}", f"--config.train.eval_every_steps={num_steps}",
         f"--config.train.checkpoint_every_steps={num_steps}"],
        env=env, cwd=bench_env.REPO, stdout=subprocess.DEVNULL, stderr=log)
    _, status, usage = os.wait4(proc.pid, 0)  # (Popen.wait would reap it without its rusage.)
    proc.returncode = os.waitstatus_to_exitcode(status)
    wall = time.perf_counter() - t0
    if proc.returncode:
      log.seek(0)
      raise SystemExit(f"default run / {setting} failed:\n{log.read()[-3000:]}")
    with open(os.path.join(workdir, "summary.json")) as f:
      summary = json.load(f)
  return {"wall_s": wall, "peak_mib": usage.ru_maxrss / 1024, "summary": summary}


def main() -> None:
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
  p.add_argument("--models", default="lm,mt,mlm")
  p.add_argument("--steps", type=int, default=20)
  p.add_argument("--settings", default=",".join(SETTINGS),
                 help="a comma-separated subset of: " + ", ".join(SETTINGS))
  p.add_argument("--default_steps", type=int, default=500)
  p.add_argument("--no_default_run", action="store_true")
  p.add_argument("--out", help="Markdown file whose `memory` section gets the tables")
  p.add_argument("--json")
  p.add_argument("--worker", help=argparse.SUPPRESS)
  args = p.parse_args()
  if args.worker:
    return worker(args.worker, args.steps)
  settings = args.settings.split(",")
  if set(settings) - set(SETTINGS):
    p.error(f"--settings={args.settings}: not among {', '.join(SETTINGS)}")
  results = {}
  for name in args.models.split(","):
    for setting in settings:
      r = results.setdefault(name, {})[setting] = run_worker(name, setting, args.steps)
      print(f"{name} / {setting}: peak {r['phases']['checkpoint'][1]:.0f} MiB, steady RSS "
            f"{r['phases']['steady'][0]:.0f} MiB, step {r['step_ms']:.0f} ms", flush=True)
  runs = {}
  if not args.no_default_run:
    for setting in settings:
      runs[setting] = default_run(setting, args.default_steps)
      print(f"default run / {setting}: peak {runs[setting]['peak_mib']:.0f} MiB, "
            f"{runs[setting]['wall_s']:.0f} s", flush=True)
  lines = render(results, runs, args)
  print(f"Command: `{command(args)}`", "", *lines, sep="\n")
  if args.json:
    with open(args.json, "w") as f:
      json.dump({"models": results, "default_run": runs}, f, indent=1)
  if args.out:
    import lm_step  # noqa: PLC0415  (imports JAX: only here, never in the workers' parent)
    lm_step.update_section(args.out, lm_step.section_text(
        "memory", "benchmarks/memory.py", "Memory phase by phase", lm_step.machine_info(),
        command(args), lines), "memory")


def command(args) -> str:
  """The command line that measured it, flags at their defaults left out."""
  return (f"python benchmarks/memory.py --models {args.models} --steps {args.steps}"
          + ("" if args.settings == ",".join(SETTINGS) else f" --settings '{args.settings}'")
          + ("" if args.no_default_run else f" --default_steps {args.default_steps}"))


def render(results: dict, runs: dict, args) -> list[str]:
  """The tables' lines: each phase's resident set per model and setting, then the default
  run's."""
  lines = ["Resident set after each phase, MiB (peak so far in brackets):", "",
           "| model | setting | " + " | ".join(PHASES) + " | step ms | releases |",
           "|---|---|" + "---:|" * (len(PHASES) + 2)]
  for name, by_setting in results.items():
    for setting, r in by_setting.items():
      cells = [f"{r['phases'][ph][0]:.0f} ({r['phases'][ph][1]:.0f})" for ph in PHASES]
      lines.append(f"| {name} | {setting} | " + " | ".join(cells)
                   + f" | {r['step_ms']:.0f} | {r['releases']} |")
  if runs:
    lines += ["", f"The README's default run, {args.default_steps} steps with its evaluation "
              "and checkpoint at the last one, one process per setting:", "",
              "| setting | peak RSS MiB | wall s | held-out loss |", "|---|---:|---:|---:|"]
    for setting, r in runs.items():
      lines.append(f"| {setting} | {r['peak_mib']:.0f} | {r['wall_s']:.0f} | "
                   f"{r['summary'].get('eval_loss', float('nan')):.4f} |")
  return lines


if __name__ == "__main__":
  main()
