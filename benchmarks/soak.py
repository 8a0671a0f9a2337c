r"""Kill soak: a run interrupted N times at random (kill -9 and SIGTERM, some while a
checkpoint is being written), relaunched with the same command each time, against an
uninterrupted reference of the same config.

  python benchmarks/soak.py --kills=20 [--steps=400] [--seed=0] [--root=/tmp/lnjax_soak]
  python benchmarks/soak.py --task=translation --kills=20 [--steps=120]
  python benchmarks/soak.py --task=translation --quick      # 6 kills, 30 steps

LM: `python -m lnjax.main --config=configs/lm.py:smoke` processes with checkpoints every 7
steps (not a multiple of the logging interval, 5) and dropout on. Each segment is stopped
either when it reaches a random step or as soon as a checkpoint's temporary folder appears
(a save in flight).

Translation: the Multi30k smoke preset (configs/multi30k_de_en.py:smoke) with checkpoints
every 7 steps and an evaluation (held-out loss, then BLEU by beam search) every 10, in a
data cache of the soak's own. Besides the LM's four kinds, segments are stopped during an
evaluation (just after the step line of an evaluation step), during BLEU decoding (while
the decode's progress lines come), and during data preparation (the prepared corpus and
tokenizer are deleted first, so the launch prepares them again). The kinds come in a
shuffled round, so every phase is hit; each segment's line says in which phase the signal
actually landed, from the run's own output.

At the end the soaked run must equal the reference: every metrics.jsonl record (decode
speed aside), the final summary's losses (and BLEU), and the final train state and data
position bit for bit. Exits 1 if anything differs.
"""

import argparse
import glob
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import threading
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
KINDS = ("kill -9 at a random step", "kill -9 during a save", "SIGTERM at a random step",
         "SIGTERM during a save")
MT_KINDS = KINDS + tuple(f"{sig} during {phase}" for phase in
                         ("evaluation", "BLEU decoding", "data preparation")
                         for sig in ("kill -9", "SIGTERM"))
MT_EVAL_EVERY = 10  # Translation: an evaluation (loss, then BLEU) every 10 steps.


def command(task: str, workdir: str, steps: int, jax_cache: str) -> list[str]:
  """The run's command; `jax_cache`: JAX's compilation cache, shared by both runs (each
  relaunch would otherwise compile every shape again)."""
  config = {"lm": ["--config=configs/lm.py:smoke", "--config.train.eval_every_steps=50"],
            "translation": ["--config=configs/multi30k_de_en.py:smoke",
                            f"--config.train.eval_every_steps={MT_EVAL_EVERY}"]}[task]
  return [sys.executable, "-m", "lnjax.main", *config, f"--workdir={workdir}",
          "--config.mesh.data=1", f"--config.train.num_steps={steps}",
          "--config.train.log_every_steps=5", "--config.train.checkpoint_every_steps=7",
          f"--config.train.compilation_cache_dir={jax_cache}"]


def env(cache: str | None = None) -> dict:
  return {**os.environ, "PYTHONUNBUFFERED": "1", "JAX_PLATFORMS": "cpu",
          "LNJAX_PROGRESS_SECONDS": "0.2",  # Progress lines: the phase a signal lands in.
          **({"LNJAX_CACHE_DIR": cache} if cache else {})}


def translation_cache(root: str) -> str:
  """The soak's own data cache, its downloads folder seeded with the test corpora (what
  lnjax finds there counts as downloaded: no network), so data preparation can be
  deleted and interrupted without touching the user's cache."""
  cache = os.path.join(root, "cache")
  shutil.copytree(os.path.join(REPO, "tests", "fixtures", "corpora"),
                  os.path.join(cache, "downloads"))
  return cache


def unprepare(cache: str) -> None:
  """Deletes everything prepared from the downloads (corpus, tokenizer, tokenized splits)."""
  for name in os.listdir(cache):
    if name != "downloads":
      shutil.rmtree(os.path.join(cache, name), ignore_errors=True)


def summary_step(workdir: str) -> int:
  try:
    with open(os.path.join(workdir, "summary.json")) as f:
      return int(json.load(f).get("step") or 0)
  except (OSError, ValueError):
    return 0


def saves_in_flight(workdir: str) -> set[str]:
  """Orbax's temporary folders of checkpoints being written (a kill leaves its own)."""
  return set(glob.glob(os.path.join(workdir, "checkpoints", "*.orbax-checkpoint-tmp*")))


class Output:
  """The lines a launch prints (stdout and stderr), kept in order and copied to the log."""

  def __init__(self, proc: subprocess.Popen, log):
    self.lines: list[str] = []
    self._thread = threading.Thread(target=self._read, args=(proc, log), daemon=True)
    self._thread.start()

  def _read(self, proc, log):
    for line in iter(proc.stdout.readline, ""):
      self.lines.append(line)
      log.write(line)
    log.flush()

  def join(self):
    self._thread.join()

  def since(self, pattern: str) -> str:
    """The output after the last line matching `pattern` (all of it if none does)."""
    lines = list(self.lines)
    last = max((i for i, l in enumerate(lines) if re.match(pattern, l)), default=-1)
    return "".join(lines[last + 1:])

  def phase(self) -> str:
    """Where the run is, from its last lines: data preparation, evaluation (after an
    evaluation step's line, before its decode), BLEU decoding, or training."""
    text = "".join(self.lines)
    if "preparing " in text and "Data ready" not in text:
      return "data preparation"
    last_step = max((i for i, l in enumerate(self.lines) if STEP_LINE.match(l)), default=-1)
    last_eval = max((i for i, l in enumerate(self.lines) if l.startswith("eval  step")),
                    default=-1)
    decoding = max((i for i, l in enumerate(self.lines) if l.startswith("decoding ")),
                   default=-1)
    if decoding > max(last_step, last_eval):
      return "BLEU decoding"
    if last_step > last_eval and last_step >= 0 and _is_eval_step(self.lines[last_step]):
      return "evaluation"
    return "training"


STEP_LINE = re.compile(r"^step\s+(\d+)/(\d+)\s")


def _is_eval_step(line: str) -> bool:
  step, num_steps = map(int, STEP_LINE.match(line).groups())
  return step % MT_EVAL_EVERY == 0 or step == num_steps


def one_segment(task: str, workdir: str, steps: int, kind: str, rng: random.Random, log,
                cache: str | None, jax_cache: str) -> dict:
  """Launches the run and interrupts it as `kind` says; the segment's record."""
  start = summary_step(workdir)
  left = saves_in_flight(workdir)
  saving = lambda: bool(saves_in_flight(workdir) - left)
  target = start + rng.randint(1, 12)
  if kind.endswith("data preparation"):
    unprepare(cache)
  proc = subprocess.Popen(command(task, workdir, steps, jax_cache), cwd=REPO, env=env(cache),
                          text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
  out = Output(proc, log)
  sig = signal.SIGKILL if kind.startswith("kill") else signal.SIGTERM
  # When to send it, and how long after that moment (anywhere in the phase, not only at
  # its first line).
  if kind.endswith("save"):
    ready, delay = saving, 0.0
  elif kind.endswith("random step"):
    ready, delay = (lambda: summary_step(workdir) >= target), rng.uniform(0.0, 0.05)
  elif kind.endswith("evaluation"):  # The step line of an evaluation step, no decode yet.
    ready, delay = (lambda: out.phase() == "evaluation"), rng.uniform(0.0, 0.3)
  elif kind.endswith("BLEU decoding"):
    ready, delay = (lambda: out.phase() == "BLEU decoding"), rng.uniform(0.0, 2.0)
  else:  # Data preparation: the corpus read, the tokenizer trained, the splits tokenized.
    ready, delay = (lambda: out.phase() == "data preparation"), rng.uniform(0.0, 3.0)
  t0 = time.time()
  while proc.poll() is None and time.time() - t0 < 1800 and not ready():
    time.sleep(0.002)
  if delay:
    time.sleep(delay)
  in_save = saving()
  at, phase = summary_step(workdir), out.phase()
  if proc.poll() is None:
    proc.send_signal(sig)
  code = proc.wait()
  out.join()
  return dict(kind=kind, from_step=start, near_step=at, save_in_flight=in_save, exit_code=code,
              phase="saving" if in_save else phase)


def compare(reference: str, soaked: str) -> list[str]:
  """What differs between the two workdirs' results (empty: nothing)."""
  import jax
  import numpy as np

  from lnjax import tasks
  from lnjax.core import checkpoint, metrics

  problems = []
  # (Decode speed, eval_decode_sentences_per_second, is the one timing in the records.)
  a, b = ([{k: v for k, v in r.items() if "second" not in k} for r in metrics.read_metrics(w)]
          for w in (reference, soaked))
  if a != b:
    diff = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    problems.append(f"metrics.jsonl: {len(a)} vs {len(b)} records, first difference at "
                    f"record {diff}: {a[diff] if diff < len(a) else None} vs "
                    f"{b[diff] if diff < len(b) else None}")
  sa, sb = (json.load(open(os.path.join(w, "summary.json"))) for w in (reference, soaked))
  for key in ("status", "step", "eval_loss", "last_finite_train_loss", "last_finite_step",
              "eval_bleu", "best_eval_bleu"):
    if sa.get(key) != sb.get(key):
      problems.append(f"summary {key}: {sa.get(key)} vs {sb.get(key)}")
  ra, rb = (checkpoint.restore_run(w, tasks=tasks.get) for w in (reference, soaked))
  leaves_a, leaves_b = jax.tree.leaves(ra.state), jax.tree.leaves(rb.state)
  if ra.step != rb.step or any(not np.array_equal(x, y) for x, y in zip(leaves_a, leaves_b)):
    problems.append(f"final train state differs (steps {ra.step} and {rb.step})")
  if ra.data_state != rb.data_state:
    problems.append(f"data position: {ra.data_state} vs {rb.data_state}")
  return problems


def main() -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--task", choices=("lm", "translation"), default="lm")
  parser.add_argument("--kills", type=int, default=None, help="default 20 (--quick: 6)")
  parser.add_argument("--steps", type=int, default=None,
                      help="default: lm 400, translation 120 (--quick: 60 and 30)")
  parser.add_argument("--quick", action="store_true", help="a short self-check")
  parser.add_argument("--seed", type=int, default=0)
  parser.add_argument("--root", default="/tmp/lnjax_soak")
  args = parser.parse_args()
  kills = args.kills or (6 if args.quick else 20)
  steps = args.steps or {"lm": (400, 60), "translation": (120, 30)}[args.task][args.quick]
  shutil.rmtree(args.root, ignore_errors=True)
  os.makedirs(args.root)
  reference, soaked = os.path.join(args.root, "reference"), os.path.join(args.root, "soaked")
  cache = translation_cache(args.root) if args.task == "translation" else None
  jax_cache = os.path.join(args.root, "jax_cache")
  rng = random.Random(args.seed)
  t0 = time.time()
  with open(os.path.join(args.root, "log.txt"), "w") as log:
    r = subprocess.run(command(args.task, reference, steps, jax_cache), cwd=REPO,
                       env=env(cache), stdout=log, stderr=subprocess.STDOUT)
    if r.returncode:
      print(f"the reference run failed (exit {r.returncode}); see {args.root}/log.txt")
      return 1
    segments, round_ = [], []
    while len(segments) < kills:
      if args.task == "lm":
        kind = rng.choices(KINDS, weights=(4, 3, 2, 2))[0]
      else:  # Every kind once per round, in a shuffled order.
        round_ = round_ or rng.sample(MT_KINDS, len(MT_KINDS))
        kind = round_.pop()
      seg = one_segment(args.task, soaked, steps, kind, rng, log, cache, jax_cache)
      if seg["exit_code"] == 0:  # Finished before the signal: the soak needs more steps.
        print(f"the run finished after {len(segments)} interruptions; use more --steps")
        return 1
      segments.append(seg)
      print(f"{len(segments):>3}  {seg['kind']:<33} landed in {seg['phase']:<16} near step "
            f"{seg['near_step']:>4} (segment from {seg['from_step']:>4})  exit "
            f"{seg['exit_code']}", flush=True)
    r = subprocess.run(command(args.task, soaked, steps, jax_cache), cwd=REPO,
                       env=env(cache), stdout=log, stderr=subprocess.STDOUT)
  moved = sorted(os.listdir(os.path.join(soaked, "corrupt_checkpoints"))) if os.path.isdir(
      os.path.join(soaked, "corrupt_checkpoints")) else []
  problems = [] if r.returncode == 0 else [f"the final relaunch exited {r.returncode}"]
  problems += compare(reference, soaked)
  kinds = {k: sum(s["kind"] == k for s in segments) for k in KINDS + MT_KINDS[len(KINDS):]}
  phases = {}
  for seg in segments:
    phases[seg["phase"]] = phases.get(seg["phase"], 0) + 1
  summary = json.load(open(os.path.join(soaked, "summary.json")))
  print(f"\n{len(segments)} interruptions ({'; '.join(f'{n} {k}' for k, n in kinds.items() if n)})"
        f"; landed in: {', '.join(f'{p} {n}' for p, n in sorted(phases.items()))}; {steps} "
        f"steps, {time.time() - t0:.0f} s; checkpoints moved aside: {moved or 'none'}")
  print(f"final eval loss {summary['eval_loss']!r}, "
        + (f"final BLEU {summary['eval_bleu']!r}, " if "eval_bleu" in summary else "")
        + f"final train loss {summary['last_finite_train_loss']!r}, "
        f"{len(open(os.path.join(soaked, 'metrics.jsonl')).readlines())} metrics records")
  if problems:
    print("DIFFERENT from the uninterrupted run:\n  " + "\n  ".join(problems))
    return 1
  print("equal to the uninterrupted run: every metrics record, the summary's losses"
        f"{' and BLEU' if args.task == 'translation' else ''}, the final train state and data "
        "position (bit for bit)")
  return 0


if __name__ == "__main__":
  sys.exit(main())
