"""Each hook of the training loop alone (lnjax/core/hooks.py), on the real Loop (lnjax/core/loop.py)
stepping a one-number state: its step adds the batch's `delta` to w and reports the
batch's `loss`, so a test scripts the losses and reads the updates off w."""

import json
import math
import os
import signal

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lnjax.core import build, checkpoint, hooks, loop as loop_lib, metrics, preemption, sharding
from lnjax.core import state as state_lib


class Batches:
  """Batch i carries loss losses[i] and delta 1; resumable like the real iterators."""

  def __init__(self, losses):
    self.losses, self.position = list(losses), 0

  def __next__(self):
    i, self.position = self.position, self.position + 1
    return {"inputs": np.zeros((1, 2), np.int32), "weights": np.ones((1, 2), np.float32),
            "loss": np.full((1,), self.losses[i], np.float32),
            "delta": np.ones((1,), np.float32)}

  def get_state(self):
    return {"position": self.position}

  def set_state(self, state):
    self.position = state["position"]


@jax.jit
def _step(state, batch, lr_scale=1.0):
  w = state.params["w"] + lr_scale * batch["delta"][0]
  return (state.replace(step=state.step + 1, params={"w": w}),
          {"train_loss": batch["loss"][0], "learning_rate": jnp.float32(0.1 * lr_scale),
           "grad_norm": jnp.float32(1.0), "param_norm": w})


def _train_step(state, batch, lr_scale=1.0):
  return _step(state, batch, lr_scale)


class Summary:
  """What the hooks record for summary.json (train.Summary writes the file)."""

  def __init__(self):
    self.last_finite = self.first_step_seconds = self.best_value = None
    self.last_eval, self.writes = {}, []

  def write(self, status, step):
    self.writes.append((status, step))


def make_loop(tmp_path, losses, hook_list, num_steps=None, state=None, restore=None):
  lines = []
  writer = metrics.MetricWriter(str(tmp_path), tensorboard=False)
  state = state or state_lib.TrainState(step=jnp.zeros((), jnp.int32),
                                        params={"w": jnp.zeros(())}, opt_state={})
  loop = loop_lib.Loop(state=state, train_step=_train_step, train_iter=Batches(losses),
                       batch_sharding=sharding.batch_sharding(build.one_device_mesh()),
                       num_steps=num_steps or len(losses), hooks=hook_list,
                       workdir=str(tmp_path), writer=writer, summary=Summary(),
                       log=lines.append, restore=restore)
  loop.lines = lines
  return loop


def records(tmp_path):
  return metrics.read_metrics(str(tmp_path))


def test_divergence_stops_at_a_nan_or_a_huge_loss_and_keeps_the_last_finite(tmp_path):
  for bad, why in ((math.nan, "non-finite loss"), (1e6, "above train.divergence_factor")):
    d = hooks.Divergence(max_loss=100.0)
    loop = make_loop(tmp_path / str(bad), [3.0, 2.0, bad, 1.0, 1.0], [d])
    assert loop.run() == hooks.DIVERGED
    assert d.diverged_at == 3 and loop.summary.last_finite == (2, 2.0)
    assert why in loop.lines[-1] and "last finite loss 2.0000 at step 2" in loop.lines[-1]


def test_logging_writes_window_means_and_saves_the_open_window(tmp_path):
  log = hooks.Logging(every_steps=2, num_steps=5, first_step=0)
  seen = []

  class Peek(hooks.Hook):
    def on_step(self, loop, step, metrics):
      seen.append((step, log.state()))

  loop = make_loop(tmp_path, [4.0, 2.0, 3.0, 1.0, 5.0], [log, Peek()])
  assert loop.run() == hooks.COMPLETED
  got = {r["step"]: r["train_loss"] for r in records(tmp_path)}
  assert got == {2: 3.0, 4: 2.0, 5: 5.0}
  assert seen[2] == (3, {"train_loss": 3.0, "learning_rate": pytest.approx(0.1),
                         "grad_norm": 1.0, "param_norm": 3.0, "_n": 1})
  assert [r["param_norm"] for r in records(tmp_path)] == [2.0, 4.0, 5.0]  # Last, not mean.
  assert loop.lines[0].startswith("First step in")
  assert sum(line.startswith("step ") for line in loop.lines) == 3
  assert loop.summary.writes == [("running", 2), ("running", 4), ("running", 5)]


def test_each_line_counts_the_tokens_of_its_own_steps(tmp_path, monkeypatch):
  """A step's metrics reach the hooks one step late, or at once when a hook wants its
  state (an evaluation step): either way a line counts its window's tokens (2 a step
  here), not the next step's or none. The first step is out of the rate (its line, at
  every_steps=1, has none)."""
  counted = []

  def line(progress, step, *unused):
    counted.append((step, progress._tokens))
    progress.restart_clock(step)
    return ""

  monkeypatch.setattr(metrics.Progress, "line", line)

  class WantsState(hooks.Hook):
    def wants_state(self, loop, step):
      return step in (2, 3)

  log = hooks.Logging(every_steps=1, num_steps=5, first_step=0)
  loop = make_loop(tmp_path, [1.0] * 5, [log, WantsState()])
  assert loop.run() == hooks.COMPLETED
  assert counted == [(1, 0.0), (2, 2.0), (3, 2.0), (4, 2.0), (5, 2.0)]


def test_evaluation_every_n_steps_and_the_best_checkpoint(tmp_path):
  got = []

  class Listener(hooks.Hook):
    def on_eval(self, loop, step, scalars):
      got.append((step, scalars["eval_bleu"]))

  best = checkpoint.Checkpoints(str(tmp_path), 1, 1, folder="best_checkpoint")
  bleu = {2: 5.0, 4: 7.0, 5: 6.0}
  ev = hooks.Evaluation(lambda params, step: {"eval_loss": float(params["w"]),
                                              "eval_bleu": bleu[step]},
                        every_steps=2, num_steps=5, best=best, best_metric="eval_bleu")
  loop = make_loop(tmp_path, [1.0] * 5, [ev, Listener()])
  assert loop.run() == hooks.COMPLETED
  assert got == [(2, 5.0), (4, 7.0), (5, 6.0)]
  assert [(r["step"], r["eval_loss"]) for r in records(tmp_path)] == [(2, 2.0), (4, 4.0), (5, 5.0)]
  assert os.listdir(tmp_path / "best_checkpoint") == ["4"] and ev.best_value == 7.0
  assert loop.summary.best_value == 7.0 and loop.summary.last_eval["eval_bleu"] == 6.0


def test_an_evaluation_stopped_by_sigterm_is_saved_as_pending_and_runs_again(tmp_path):
  """preemption.check() inside the evaluation: the step is saved with the evaluation
  pending, the run ends as preempted, and the resumed loop evaluates that step first."""
  calls = []

  def evaluate(params, step):
    calls.append(step)
    if len(calls) == 2:  # The second evaluation (step 4) is interrupted.
      raise preemption.Preempted("SIGTERM")
    return {"eval_loss": float(params["w"])}

  ckpts = checkpoint.Checkpoints(str(tmp_path), 10, 3)
  loop = make_loop(tmp_path, [1.0] * 6, [hooks.Preemption(), hooks.Evaluation(evaluate, 2, 6),
                                         hooks.Checkpointing(ckpts, 6)])
  assert loop.run() == hooks.PREEMPTED and loop.step == 4
  state, data, saved = checkpoint.Checkpoints(str(tmp_path), 10, 3).restore_latest(loop.state)
  assert int(state.step) == 4 and data == {"position": 4} and saved == {"eval": {"pending_step": 4}}

  ckpts = checkpoint.Checkpoints(str(tmp_path), 10, 3)
  ev = hooks.Evaluation(evaluate, 2, 6)
  again = make_loop(tmp_path, [1.0] * 6, [ev, hooks.Checkpointing(ckpts, 6)], state=state)
  again.train_iter.set_state(data)
  again.restore_hooks(saved)
  assert again.run() == hooks.COMPLETED
  assert calls == [2, 4, 4, 6]
  assert [r["step"] for r in records(tmp_path)] == [2, 4, 6]


def test_checkpointing_saves_periodically_at_the_end_and_on_a_stop(tmp_path):
  ckpts = checkpoint.Checkpoints(str(tmp_path), 2, 5)
  loop = make_loop(tmp_path, [1.0] * 5, [hooks.Logging(3, 5, 0), hooks.Checkpointing(ckpts, 5)])
  assert loop.run() == hooks.COMPLETED
  steps = sorted(int(s) for s in os.listdir(tmp_path / "checkpoints"))
  assert steps == [2, 4, 5]
  assert os.path.exists(tmp_path / "checkpoints" / "4" / checkpoint.MANIFEST_FILE)
  _, _, saved = checkpoint.Checkpoints(str(tmp_path), 2, 5).restore_latest(loop.state, max_step=4)
  assert saved == {"window": {"train_loss": 1.0, "learning_rate": pytest.approx(0.1),
                              "grad_norm": 1.0, "param_norm": 4.0, "_n": 1}}


def test_preemption_stops_after_the_step_with_a_saved_checkpoint(tmp_path):
  class Signal(hooks.Hook):
    def after_step(self, loop, step):
      if step == 3:
        os.kill(os.getpid(), signal.SIGUSR1)

  ckpts = checkpoint.Checkpoints(str(tmp_path), 100, 3)
  with preemption.Stop() as stop:
    stop.raising(False)
    loop = make_loop(tmp_path, [1.0] * 8, [hooks.Preemption(), Signal(),
                                           hooks.Checkpointing(ckpts, 8)])
    assert loop.run() == hooks.PREEMPTED
  assert loop.step == 3 and os.listdir(tmp_path / "checkpoints") == ["3"]
  assert loop.lines[-1] == "SIGUSR1: saved step 3; run the same command to resume."


def test_before_the_loop_a_signal_raises_preempted_at_once():
  with preemption.Stop():
    with pytest.raises(preemption.Preempted, match="SIGTERM"):
      os.kill(os.getpid(), signal.SIGTERM)
      for _ in range(1000):
        pass


def test_profiler_traces_the_steps_asked(tmp_path):
  loop = make_loop(tmp_path, [1.0] * 4, [hooks.Profiler(2, 3, str(tmp_path))])
  assert loop.run() == hooks.COMPLETED
  assert any(files for _, _, files in os.walk(tmp_path / "profile"))
  assert loop.lines == [f"Profile of steps 2..3 in {tmp_path / 'profile'} (TensorBoard: profile)."]


def test_a_hook_can_roll_back_skip_batches_and_scale_the_learning_rate(tmp_path):
  """A loss spike at step 5: back to the checkpoint of step 2 (at least 3 steps back), the
  two batches after it skipped, the rest at half the learning rate."""
  ckpts = checkpoint.Checkpoints(str(tmp_path), 2, 5)

  class Recovery(hooks.Hook):
    done = False

    def on_step(self, loop, step, metrics):
      if metrics["train_loss"] > 10 and not self.done:
        self.done = True
        return hooks.Action(rollback_steps=3, skip_batches=2, lr_scale=0.5)
      return None

  def restore(max_step):
    restored = ckpts.restore_latest(loop.state, max_step)
    ckpts.drop_after(int(restored[0].step))
    return restored

  loop = make_loop(tmp_path, [1.0, 1.0, 1.0, 1.0, 50.0, 1.0, 1.0, 1.0, 1.0, 1.0],
                   [Recovery(), hooks.Checkpointing(ckpts, 6)], num_steps=6, restore=restore)
  assert loop.run() == hooks.COMPLETED
  # w: 2 after the restored step 2, then steps 3..6 at lr ×0.5 on batches 5.. (3, 4 skipped).
  assert float(loop.state.params["w"]) == 2.0 + 4 * 0.5 and loop.step == 6
  assert loop.train_iter.position == 2 + 2 + 4
  assert "Rolled back to step 2." in loop.lines
  assert sorted(os.listdir(tmp_path / "checkpoints")) == ["2", "4", "6"]  # 4 saved anew.
  assert json.loads(json.dumps(loop.hook_states())) == {"loop": {"lr_scale": 0.5}}


def _rollback_run(tmp_path, max_rollbacks):
  """115 steps of loss 1.0 with a spike at step 75 and one at step 110, checkpoints every
  35 steps, rollback (≥ 1 step back, past 5 batches) at rate factor 0.5, health's 6σ rule
  deciding (health_hooks.Recovery): (loop, the rollbacks' actions)."""
  from lnjax.core import health_hooks
  ckpts = checkpoint.Checkpoints(str(tmp_path), 35, 5)
  losses = [1.0] * 130
  losses[74] = losses[114] = 50.0  # Step 75's batch; step 110's after one rollback.
  recovery = health_hooks.Recovery("rollback", None, ckpts.manager.all_steps,
                                   rollback_steps=1, skip_batches=5, lr_factor=0.5,
                                   max_rollbacks=max_rollbacks)

  def restore(max_step):
    ckpts.wait()
    restored = ckpts.restore_latest(loop.state, max_step)
    ckpts.drop_after(int(restored[0].step))
    return restored

  loop = make_loop(tmp_path, losses, [recovery, hooks.Checkpointing(ckpts, 115)],
                   num_steps=115, restore=restore)
  assert loop.run() == hooks.COMPLETED
  return loop, [a for a in recovery.actions if "rollback_to_step" in a]


def test_two_rollbacks_at_factor_one_half_scale_the_rate_by_one_half_then_one_quarter(tmp_path):
  """factor^(r+1) at the r-th rollback (r from 0), set, not compounded: the second rollback
  restores a checkpoint saved at ×0.5 (step 105) and the rate is then ×0.25, not ×0.125."""
  loop, rollbacks = _rollback_run(tmp_path, max_rollbacks=3)
  assert [(a["step"], a["rollback_to_step"], a["lr_scale"]) for a in rollbacks] == [
      (75, 70, 0.5), (110, 105, 0.25)]
  assert loop.lr_scale == 0.25 and loop.hook_states()["loop"] == {"lr_scale": 0.25}
  # w: 70 steps at ×1, 35 (71..105) at ×0.5, 10 (106..115) at ×0.25.
  assert float(loop.state.params["w"]) == 70 + 35 * 0.5 + 10 * 0.25


def test_max_rollbacks_1_allows_exactly_one(tmp_path):
  loop, rollbacks = _rollback_run(tmp_path, max_rollbacks=1)
  assert [a["step"] for a in rollbacks] == [75]
  assert any(line.endswith("(1/1; later instabilities run their course)") for line in loop.lines)
  assert loop.lr_scale == 0.5



UPDATE_RMS = "health/layer_0/self_attn/update_rms"


SOWN = "health/layer_0/self_attn/max_logit"


@jax.jit
def _step_with_health(state, batch, lr_scale=1.0):
  """_step, and an update RMS (per unit of learning rate) equal to the batch's loss."""
  state, metrics = _step(state, batch, lr_scale)
  return state, {**metrics, UPDATE_RMS: metrics["train_loss"] * metrics["learning_rate"]}


def _activation_step(params, batch, step):
  """A sown statistic equal to the state's step it was taken at."""
  return {SOWN: jnp.asarray(step, jnp.float32)}


@pytest.mark.parametrize("mode", ["log", "warn"])
def test_health_log_records_the_statistics_and_warn_also_warns(tmp_path, mode):
  """An update RMS 50× its median at step 21 of 30: both modes write the health/ record of
  every log step (5, 10, ... 30), with the sown statistics of a forward pass taken at log
  steps only, before the update (from the state of step 4 at step 5); only warn prints the
  warning and writes its record."""
  from lnjax.core import health, health_hooks
  rule = health.EarlyWarning(factor=3.0, window=100, min_history=10)
  hook = health_hooks.Health(mode, 5, 30, rule=rule)
  loop = make_loop(tmp_path, [1.0] * 20 + [50.0] + [1.0] * 9, [hook])
  forwards = []
  loop.train_step = hook.wrap(lambda state, batch, **kw: _step_with_health(state, batch, **kw),
                              lambda *args: forwards.append(int(args[2])) or
                              _activation_step(*args))
  assert loop.run() == hooks.COMPLETED
  assert [r["step"] for r in records(tmp_path) if UPDATE_RMS in r] == [5, 10, 15, 20, 25, 30]
  assert [(r["step"], r[SOWN]) for r in records(tmp_path) if SOWN in r] == [
      (s, s - 1.0) for s in (5, 10, 15, 20, 25, 30)]
  assert forwards == [4, 9, 14, 19, 24, 29]
  warned = [r["step"] for r in records(tmp_path) if "warning/layer_0/self_attn/update_rms" in r]
  assert warned == ([21] if mode == "warn" else [])
  assert any(line.startswith("warning: step 21:") for line in loop.lines) == (mode == "warn")



def test_the_rate_leaves_out_the_first_step_and_a_program_compiled_later(tmp_path):
  """Step 3 of 4 calls a program jax has not compiled yet (as the health statistics' forward
  pass does at the first log step): neither its compilation nor the first step is in
  the line's tok/s (2 tokens a step; steps 2-4 counted)."""
  import functools
  import time
  unrolled = jax.jit(lambda x: functools.reduce(lambda a, i: jnp.sin(a) * i, range(300), x))
  took = []

  def train_step(state, batch, lr_scale=1.0):
    if int(state.step) == 2:
      t0 = time.perf_counter()
      unrolled(jnp.ones(3)).block_until_ready()
      took.append(time.perf_counter() - t0)
    return _step(state, batch, lr_scale)

  loop = make_loop(tmp_path, [1.0] * 4, [hooks.Logging(4, 4, 0)])
  loop.train_step = train_step
  assert loop.run() == hooks.COMPLETED
  fields = loop.lines[-1].split()
  assert float(fields[fields.index("tok/s") - 1]) > 3 * 6 / took[0], (loop.lines, took)


def test_the_first_line_shows_its_rate_as_not_known_and_the_next_a_number(tmp_path):
  """The first step (its compilation) is left out of the rate, so its line has none: '--',
  not 'nan'; the second line's rate is a number."""
  loop = make_loop(tmp_path, [1.0] * 3, [hooks.Logging(1, 3, 0)])
  assert loop.run() == hooks.COMPLETED
  steps = [line.split() for line in loop.lines if line.startswith("step")]
  assert steps[0][steps[0].index("tok/s") - 1:] == ["--", "tok/s", "ETA", "--:--"], loop.lines
  assert float(steps[1][steps[1].index("tok/s") - 1]) > 0, loop.lines
