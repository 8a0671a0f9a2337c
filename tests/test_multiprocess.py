"""A real two-process run: two `python -m lnjax.main` processes joined by jax.distributed
on loopback, 4 virtual CPU devices each, against the same run in one process on 8.

The mesh is (data 1, fsdp 4, model 2): parameters and optimizer state are split over
both processes (FSDP across hosts: fsdp 2 × dcn_fsdp 2, a process being the unit of the
slower network), heads and FFN within each (tensor parallel). The
first launch gets SIGTERM and both processes stop at one agreed step (JAX's preemption
service) and save; the second resumes: every process restores its shards, and both roll
back together past a non-finite loss.

Per-host input: every process iterates the same seeded global batches and reads only
its rows of each (lnjax/data: `process_index * B` to `(process_index + 1) * B`), so over
an epoch the processes' shards are disjoint and together the epoch, and a run may resume
with another process count. Checked here over a whole epoch, for the LM and the
translation pipelines.
"""

import collections
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time

import jax
import numpy as np
import pytest

from lnjax import tasks
from lnjax.configs import common as config_lib
from lnjax.core import checkpoint, metrics, run as run_lib, train
import forkserver

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STEPS = 6  # Rolled back from 5 to 3 (below), then steps 4-6 again.
# The run's settings, as flags for the processes and as overrides for the one-process run.
SETTINGS = {"opt.name": "sgd", "opt.learning_rate": 0.1,  # Adam: see test_sharding.py.
            # One block, not the smoke model's two: the same kinds of sharded parameters
            # (embeddings, attention, FFN, norms), compiled in two thirds of the time by
            # each of the five processes: the test 41.4, 40.4 -> 29.8, 29.9 CPU s with an
            # empty compilation cache (34.2 -> 24.9 warm; 2026-12-07, 2-core machine).
            "model.num_layers": 1,
            "train.num_steps": STEPS, "train.log_every_steps": 1,
            "train.eval_every_steps": STEPS, "train.checkpoint_every_steps": 3,
            "data.eval_batches": 1, "mesh.data": 1, "mesh.fsdp": 4, "mesh.model": 2}
# The same mesh built from two granules (the processes) of 1×2×2 devices each.
ACROSS_PROCESSES = {"mesh.fsdp": 2, "mesh.dcn_fsdp": 2}
CONSOLE = ("Model:", "step ", "eval ", "Resuming", "SIGTERM", "==")


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


class _Run:
  """Both processes of one run (4 of the 8 virtual devices each), their output read as
  it comes by a thread per process."""

  def __init__(self, workdir: str, settings: dict | None = None):
    port = _free_port()
    flags = [f"--config.{k}={v}"
             for k, v in {**SETTINGS, **ACROSS_PROCESSES, **(settings or {})}.items()]
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "JAX_PLATFORMS": "cpu", "XLA_FLAGS": " ".join(
        [f for f in os.environ.get("XLA_FLAGS", "").split()
         if not f.startswith("--xla_force_host_platform_device_count")]
        + ["--xla_force_host_platform_device_count=4"])}
    self.procs = [forkserver.Popen(  # (Forked as the tests' command lines are.)
        [sys.executable, "-m", "lnjax.main", "--config=configs/lm.py:smoke",
         f"--workdir={workdir}", *flags, f"--coordinator_address=127.0.0.1:{port}",
         "--num_processes=2", f"--process_id={i}"], cwd=REPO, env=env,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
        for i in range(2)]
    self.lines = [[], []]
    self.readers = [threading.Thread(target=lambda p=p, out=out: out.extend(p.stdout), daemon=True)
                    for p, out in zip(self.procs, self.lines)]
    for r in self.readers:
      r.start()

  def wait_for(self, prefix: str, timeout: float) -> None:
    """Until process 0 prints a line starting with `prefix` (or ends, or time is up)."""
    deadline = time.time() + timeout
    while (time.time() < deadline and self.procs[0].poll() is None
           and not any(l.startswith(prefix) for l in self.lines[0])):
      time.sleep(0.05)

  def wait(self, timeout: float = 300) -> list[str]:
    """Both outputs once the processes end; killed if they outlast `timeout`."""
    deadline = time.time() + timeout
    for p in self.procs:
      try:
        p.wait(max(deadline - time.time(), 1))
      except subprocess.TimeoutExpired:
        pass
    self.kill()
    for r in self.readers:
      r.join(10)
    return ["".join(out) for out in self.lines]

  def kill(self) -> None:
    for p in self.procs:
      if p.poll() is None:
        os.killpg(p.pid, signal.SIGKILL)


def _console(output: str) -> list[str]:
  return [l for l in output.splitlines() if l.startswith(CONSOLE)]


def _read_one_epoch_in_halves(run, examples):
  """One epoch of `run`'s train data read as one process and, alongside, as processes
  0 and 1 of two (4 devices): checks that every global batch is the two halves side by
  side, and returns the one-process data and, per process, a Counter of `examples(half)`."""
  parts = [run.task.make_data(run.data, run.seed, i, 2, 4) for i in range(2)]
  whole = run.task.make_data(run.data, run.seed, 0, 1, 4)
  part_iters, whole_iter = [p.train_iter() for p in parts], whole.train_iter()
  read = [collections.Counter(), collections.Counter()]
  for _ in range(whole.steps_per_epoch):
    batch, halves = next(whole_iter), [next(it) for it in part_iters]
    for key in batch:
      np.testing.assert_array_equal(np.concatenate([h[key] for h in halves]), batch[key])
    for counter, h in zip(read, halves):
      counter.update(examples(h))
  return whole, read


def _one_process_run(workdir: str, settings: dict | None = None):
  """The same run in this process, on its 8 devices: the reference. (config, summary)."""
  c = config_lib.lm_config()
  config_lib.apply_smoke(c)
  c.model.norm_position = "pre"
  for key, value in {**SETTINGS, **(settings or {})}.items():
    section, name = key.split(".")
    c[section][name] = value
  summary = train.train_and_evaluate(c, workdir, tasks=tasks.get)
  assert summary["status"] == "completed", summary
  return c, summary


# The learning rate ×1e30 for step 4: the loss of step 5 is not finite, a spike for
# train.on_instability=rollback however short the history (health.SigmaRule).
ROLLBACK = {"train.inject_fault": "lr_spike:4:1:1e30", "train.on_instability": "rollback",
            "train.rollback_steps": 1, "train.rollback_skip_batches": 1}


@pytest.mark.slow
def test_two_processes_stop_resume_and_roll_back_like_one(tmp_path):
  """One two-process run against the same run in one process: SIGTERM to both processes
  once training starts: they save at one agreed step and exit 143; the same command
  again: both restore their shards and train on. Recovery too: both processes see the
  same (replicated) metrics, so both roll back to step 3's checkpoint after step 5's
  non-finite loss, skip the same batch and finish, as the one-process run did. (A
  process that decided alone would restore, or skip, without the other: the collectives
  of its next step would hang or the losses part.) Every logged loss and the final
  parameters are the one-process run's."""
  one = str(tmp_path / "one")
  c, summary = _one_process_run(one, ROLLBACK)
  expected = summary["instability_actions"]
  assert [(a["step"], a["rollback_to_step"]) for a in expected] == [(5, 3)], expected

  # Each process reads only its half of every global batch (the halves, side by side,
  # are the one-process batch), and over a whole epoch the two halves are disjoint and
  # together the epoch: every window read once, by one process.
  run = run_lib.resolve_config(c, tasks=tasks.get)
  whole, read = _read_one_epoch_in_halves(run, lambda h: map(
      bytes, np.concatenate([h["inputs"], h["targets"][:, -1:]], 1)))
  L1 = run.data.seq_len + 1
  corpus = collections.Counter(map(bytes, whole.train_tokens_N[
      :whole.num_train_windows * L1].reshape(-1, L1)))
  epoch = whole.steps_per_epoch * run.data.batch_size
  # Windows are told apart by their text, which the corpus holds once but for a few.
  assert [sum(r.values()) for r in read] == [epoch // 2, epoch // 2]  # Together, the epoch.
  assert all(corpus[w] > 1 for w in read[0] & read[1])  # Disjoint: no window read by both,
  assert not (read[0] + read[1]) - corpus  # nor any read twice.

  # Two processes: SIGTERM to both once training starts; they save at one step and stop
  # (before the spike: the rollback below is the resumed launch's).
  two = str(tmp_path / "two")
  run = _Run(two, ROLLBACK)
  try:
    run.wait_for("Model:", timeout=240)
    for p in run.procs:
      p.send_signal(signal.SIGTERM)
    outs = run.wait()
  finally:
    run.kill()
  assert [p.returncode for p in run.procs] == [143, 143], outs[0][-3000:] + outs[1][-3000:]
  summary = json.load(open(os.path.join(two, "summary.json")))
  stopped = summary["step"]
  assert summary["status"] == "preempted" and 1 <= stopped <= 3, summary
  assert f"SIGTERM: saved step {stopped}" in outs[0]
  # Process 1 wrote its own shards of the checkpoint; only process 0 printed.
  assert os.path.isdir(os.path.join(two, "checkpoints", str(stopped), "state",
                                    "ocdbt.process_1"))
  assert _console(outs[0]) and not _console(outs[1]), outs[1][-3000:]

  # The same command again: both processes restore, roll back together and finish.
  run = _Run(two, ROLLBACK)
  try:
    outs = run.wait()
  finally:
    run.kill()
  assert [p.returncode for p in run.procs] == [0, 0], outs[0][-3000:] + outs[1][-3000:]
  assert f"from step {stopped}" in outs[0] and not _console(outs[1])
  assert "back to step 3, skipping the next 1 batches" in outs[0]
  summary = json.load(open(os.path.join(two, "summary.json")))
  assert summary["status"] == "completed" and summary["instability_actions"] == expected

  # Losses of every step as in one process, logged in the same order (once per launch:
  # only process 0 writes metrics; steps 4 and 5 again after the rollback), and the
  # final checkpoint holds the same parameters.
  records = [r for r in metrics.read_metrics(two) if "train_loss" in r]
  reference = [r for r in metrics.read_metrics(one) if "train_loss" in r]
  assert [r["step"] for r in records] == [r["step"] for r in reference]
  assert sorted({r["step"] for r in records}) == list(range(1, STEPS + 1))
  final = {r["step"]: r["train_loss"] for r in records}  # The later record of a step.
  assert all(np.isfinite(list(final.values()))), final
  np.testing.assert_allclose([r["train_loss"] for r in records],
                             [r["train_loss"] for r in reference], rtol=1e-5, atol=1e-5)
  a, b = checkpoint.restore_run(one, tasks=tasks.get), checkpoint.restore_run(two, tasks=tasks.get)
  assert a.step == b.step == STEPS
  for x, y in zip(jax.tree.leaves(a.state), jax.tree.leaves(b.state)):
    np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-5)


def test_translation_processes_read_disjoint_halves_of_every_epoch():
  """The encoder-decoder's input (the smoke Multi30k pipeline) split over two processes
  as lnjax.main splits it: over one epoch, every training pair is read once, by one of
  the two, and each global batch is the two halves side by side."""
  c = config_lib.translation_config()
  config_lib.apply_translation_smoke(c)
  run = run_lib.resolve_config(c, tasks=tasks.get)
  whole, read = _read_one_epoch_in_halves(run, lambda h: (
      (tuple(s[s != 0]), tuple(t[t != 0]))  # Empty rows pad a batch.
      for s, t in zip(h["inputs"], h["targets"]) if t.any()))
  # The training pairs (those within max_len), encoded as the pipeline encodes them.
  tok, max_len = whole.tokenizer, run.data.max_len
  pairs = [(tuple(tok.encode(s, add_eos=True)), tuple(tok.encode(t, add_eos=True)))
           for s, t in zip(whole.sources("train"), whole.references("train"))]
  corpus = collections.Counter(p for p in pairs if max(map(len, p)) <= max_len)
  assert sum(corpus.values()) == whole.num_train_pairs
  assert all(read)  # Both processes read pairs.
  assert all(corpus[p] > 1 for p in read[0] & read[1])  # Disjoint (but for repeated pairs),
  assert read[0] + read[1] == corpus  # and together the epoch, every pair once.
