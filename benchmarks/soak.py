r"""Kill soak: a run interrupted N times at random (kill -9 and SIGTERM, some while a
checkpoint is being written), relaunched with the same command each time, against an
uninterrupted reference of the same config.

  python benchmarks/soak.py --kills=20 [--steps=400] [--seed=0] [--root=/tmp/lnjax_soak]

Both runs are `python -m lnjax.main --config=configs/lm.py:smoke` processes with
checkpoints every 7 steps (not a multiple of the logging interval, 5) and dropout on. Each
segment is stopped either when it reaches a random step or as soon as a checkpoint's
temporary folder appears (a save in flight). At the end the soaked run must equal the
reference: every metrics.jsonl record, the final summary's losses, and the final train
state and data position bit for bit. Exits 1 if anything differs.
"""

import argparse
import glob
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
KINDS = ("kill -9 at a random step", "kill -9 during a save", "SIGTERM at a random step",
         "SIGTERM during a save")


def command(workdir: str, steps: int) -> list[str]:
  return [sys.executable, "-m", "lnjax.main", "--config=configs/lm.py:smoke",
          f"--workdir={workdir}", "--config.mesh.data=1", f"--config.train.num_steps={steps}",
          "--config.train.log_every_steps=5", "--config.train.checkpoint_every_steps=7",
          "--config.train.eval_every_steps=50"]


def env() -> dict:
  return {**os.environ, "PYTHONUNBUFFERED": "1", "JAX_PLATFORMS": "cpu"}


def summary_step(workdir: str) -> int:
  try:
    with open(os.path.join(workdir, "summary.json")) as f:
      return int(json.load(f).get("step") or 0)
  except (OSError, ValueError):
    return 0


def saves_in_flight(workdir: str) -> set[str]:
  """Orbax's temporary folders of checkpoints being written (a kill leaves its own)."""
  return set(glob.glob(os.path.join(workdir, "checkpoints", "*.orbax-checkpoint-tmp*")))


def one_segment(workdir: str, steps: int, kind: str, rng: random.Random, log) -> dict:
  """Launches the run and interrupts it as `kind` says; the segment's record."""
  start = summary_step(workdir)
  left = saves_in_flight(workdir)
  saving = lambda: bool(saves_in_flight(workdir) - left)
  target = start + rng.randint(1, 12)
  proc = subprocess.Popen(command(workdir, steps), cwd=REPO, env=env(), stdout=log,
                          stderr=subprocess.STDOUT)
  sig = signal.SIGKILL if kind.startswith("kill") else signal.SIGTERM
  during_save = kind.endswith("save")
  t0 = time.time()
  while proc.poll() is None and time.time() - t0 < 600:
    if (saving() if during_save else summary_step(workdir) >= target):
      break
    time.sleep(0.002)
  in_save = saving()
  at = summary_step(workdir)
  if proc.poll() is None:
    if not during_save:
      time.sleep(rng.uniform(0.0, 0.05))  # Anywhere inside the step, not just after a log.
    proc.send_signal(sig)
  code = proc.wait()
  return dict(kind=kind, from_step=start, near_step=at, save_in_flight=in_save, exit_code=code)


def compare(reference: str, soaked: str) -> list[str]:
  """What differs between the two workdirs' results (empty: nothing)."""
  import jax
  import numpy as np

  from lnjax import checkpoint, metrics

  problems = []
  a, b = metrics.read_metrics(reference), metrics.read_metrics(soaked)
  if a != b:
    diff = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    problems.append(f"metrics.jsonl: {len(a)} vs {len(b)} records, first difference at "
                    f"record {diff}: {a[diff] if diff < len(a) else None} vs "
                    f"{b[diff] if diff < len(b) else None}")
  sa, sb = (json.load(open(os.path.join(w, "summary.json"))) for w in (reference, soaked))
  for key in ("status", "step", "eval_loss", "last_finite_train_loss", "last_finite_step"):
    if sa.get(key) != sb.get(key):
      problems.append(f"summary {key}: {sa.get(key)} vs {sb.get(key)}")
  ra, rb = checkpoint.restore_run(reference), checkpoint.restore_run(soaked)
  leaves_a, leaves_b = jax.tree.leaves(ra.state), jax.tree.leaves(rb.state)
  if ra.step != rb.step or any(not np.array_equal(x, y) for x, y in zip(leaves_a, leaves_b)):
    problems.append(f"final train state differs (steps {ra.step} and {rb.step})")
  if ra.data_state != rb.data_state:
    problems.append(f"data position: {ra.data_state} vs {rb.data_state}")
  return problems


def main() -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--kills", type=int, default=20)
  parser.add_argument("--steps", type=int, default=400)
  parser.add_argument("--seed", type=int, default=0)
  parser.add_argument("--root", default="/tmp/lnjax_soak")
  args = parser.parse_args()
  shutil.rmtree(args.root, ignore_errors=True)
  os.makedirs(args.root)
  reference, soaked = os.path.join(args.root, "reference"), os.path.join(args.root, "soaked")
  rng = random.Random(args.seed)
  t0 = time.time()
  with open(os.path.join(args.root, "log.txt"), "w") as log:
    r = subprocess.run(command(reference, args.steps), cwd=REPO, env=env(), stdout=log,
                       stderr=subprocess.STDOUT)
    if r.returncode:
      print(f"the reference run failed (exit {r.returncode}); see {args.root}/log.txt")
      return 1
    segments = []
    while len(segments) < args.kills:
      kind = rng.choices(KINDS, weights=(4, 3, 2, 2))[0]
      seg = one_segment(soaked, args.steps, kind, rng, log)
      if seg["exit_code"] == 0:  # Finished before the signal: the soak needs more steps.
        print(f"the run finished after {len(segments)} interruptions; use more --steps")
        return 1
      segments.append(seg)
      print(f"{len(segments):>3}  {seg['kind']:<26} near step {seg['near_step']:>4} "
            f"(segment from {seg['from_step']:>4})  save in flight: "
            f"{'yes' if seg['save_in_flight'] else 'no ':<3}  exit {seg['exit_code']}",
            flush=True)
    r = subprocess.run(command(soaked, args.steps), cwd=REPO, env=env(), stdout=log,
                       stderr=subprocess.STDOUT)
  moved = sorted(os.listdir(os.path.join(soaked, "corrupt_checkpoints"))) if os.path.isdir(
      os.path.join(soaked, "corrupt_checkpoints")) else []
  problems = [] if r.returncode == 0 else [f"the final relaunch exited {r.returncode}"]
  problems += compare(reference, soaked)
  kinds = {k: sum(s["kind"] == k for s in segments) for k in KINDS}
  in_save = sum(s["save_in_flight"] for s in segments)
  summary = json.load(open(os.path.join(soaked, "summary.json")))
  print(f"\n{len(segments)} interruptions ({'; '.join(f'{n} {k}' for k, n in kinds.items())}; "
        f"{in_save} with a checkpoint being written), {args.steps} steps, "
        f"{time.time() - t0:.0f} s; checkpoints moved aside: {moved or 'none'}")
  print(f"final eval loss {summary['eval_loss']!r}, final train loss "
        f"{summary['last_finite_train_loss']!r}, "
        f"{len(open(os.path.join(soaked, 'metrics.jsonl')).readlines())} metrics records")
  if problems:
    print("DIFFERENT from the uninterrupted run:\n  " + "\n  ".join(problems))
    return 1
  print("equal to the uninterrupted run: every metrics record, the summary's losses, the "
        "final train state and data position (bit for bit)")
  return 0


if __name__ == "__main__":
  sys.exit(main())
