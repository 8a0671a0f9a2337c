"""The edge predicted from the first steps (lnjax/sweep/predict.py, `lnjax stability
--predict`): the fit recovers a known law, the features read what the run measured, a
config the fit cannot speak for is refused, and the command runs end to end."""

import json
import math
import os
import sys

import numpy as np
import pytest

import hypothesis
from hypothesis import strategies as st

import lnjax
from lnjax.core import errors
from lnjax.sweep import predict
import forkserver
from conftest import signal_when

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _table(seed=0, groups=6, per_group=6):
  """Rows of two features and a third unused one, and edges with log10(edge) = 0.5 a −
  1.2 b − 2 exactly."""
  rng = np.random.default_rng(seed)
  rows, edges, names = [], [], []
  for g in range(groups):
    for _ in range(per_group):
      a, b, c = rng.normal(size=3)
      rows.append({"a": a, "b": b, "c": c})
      edges.append(10 ** (0.5 * a - 1.2 * b - 2.0))
      names.append(f"placement{g}")
  return rows, edges, names


def test_the_fit_recovers_a_known_law_and_predicts_held_out_groups():
  rows, edges, groups = _table()
  model = predict.fit(rows, edges, ["a", "b", "c"], 1e-6, {}, groups=groups)
  coef = np.asarray(model.coef) / np.asarray(model.scale)  # Back to the raw features' units.
  np.testing.assert_allclose(coef, [0.5, -1.2, 0.0], atol=1e-4)
  x = {"a": 0.3, "b": -0.7, "c": 5.0}
  edge, low, high = model.predict(x)
  assert edge == pytest.approx(10 ** (0.5 * 0.3 + 1.2 * 0.7 - 2.0), rel=1e-4)
  assert low <= edge <= high and high / low < 1.001  # Exact law: no held-out error.
  held = predict.held_out(rows, edges, ["a", "b", "c"], 1e-6, groups)
  s = predict.scores(held, edges)
  assert s == {"median_factor": pytest.approx(1.0, abs=1e-4), "within_2x": 1.0, "cells": 36}


def test_the_interval_and_scores_read_the_held_out_errors():
  """Noise of ±0.5 in log10 (factor ~3): the scores see it, the interval widens to it."""
  rows, edges, groups = _table(seed=1)
  rng = np.random.default_rng(2)
  noisy = [e * 10 ** rng.choice([-0.5, 0.5]) for e in edges]
  model = predict.fit(rows, noisy, ["a", "b"], 1e-3, {}, groups=groups)
  assert model.interval[0] < -0.3 and model.interval[1] > 0.3
  s = predict.scores(predict.held_out(rows, noisy, ["a", "b"], 1e-3, groups), noisy)
  assert s["within_2x"] < 0.5 and s["median_factor"] > 2.0
  assert predict.design([{"a": 2.0, "b": 3.0}], ["a*b", "a"]).tolist() == [[6.0, 2.0]]


def test_the_model_round_trips_through_json(tmp_path):
  rows, edges, groups = _table()
  model = predict.fit(rows, edges, ["a", "b"], 0.1, {"config": "x"}, groups=groups)
  model.save(tmp_path / "m.json")
  again = predict.Model.load(tmp_path / "m.json")
  assert again.predict(rows[0]) == pytest.approx(model.predict(rows[0]))


def _edge_predictor():
  """experiments/edge_predictor.py as a module."""
  sys.path.insert(0, os.path.join(REPO, "experiments"))
  try:
    import edge_predictor
  finally:
    sys.path.remove(os.path.join(REPO, "experiments"))
  return edge_predictor


@hypothesis.settings(max_examples=25, deadline=None)
@hypothesis.given(st.integers(0, 2**32 - 1), st.floats(-3.0, 3.0))
def test_a_transfer_moves_with_the_edges_units(seed, log_c):
  """Whatever the features and edges, multiplying every edge (the known ones and those
  predicted) by 10^c moves each transfer's predictions by c in log10, no more: the shift is
  fitted on ratios of edges."""
  edge_predictor = _edge_predictor()
  rng = np.random.default_rng(seed)
  pairs = [((f"placement{i % 4}", 12, 0), {h: rng.normal() for h in edge_predictor.HEALTH},
            10 ** rng.uniform(-4, 0), {h: rng.normal() for h in edge_predictor.HEALTH},
            10 ** rng.uniform(-4, 0)) for i in range(12)]
  scaled = [(k, x, e * 10 ** log_c, xk, ek * 10 ** log_c) for k, x, e, xk, ek in pairs]
  one, other = (edge_predictor.shifted(p, "as it is", "shifted") for p in (pairs, scaled))
  for label in ("as it is", "shifted"):
    np.testing.assert_allclose(np.asarray(other[label][1]) - np.asarray(one[label][1]), log_c,
                               atol=1e-6)


def test_the_transfer_to_the_modern_block_reads_each_features_change():
  """experiments/edge_predictor.py's transfer row: a modern-block cell predicted from the same
  placement's 2020 edge and how its health features changed between the blocks' feature
  runs. With log10(modern / 2020) = 0.8 × the change in grad_growth exactly, the held-out
  shift finds it (the 2020 edge as it is does not); below 3 placements, no row."""
  edge_predictor = _edge_predictor()
  rng = np.random.default_rng(4)
  keys, rows, edges, m_rows, m_edges = [], [], [], [], []
  for p in range(6):
    for w in (0, 500):
      old = {h: rng.normal() for h in edge_predictor.HEALTH}
      moved = dict(old, grad_growth=old["grad_growth"] + rng.normal())
      keys.append((f"placement{p}", 12, w))
      rows.append(old)
      edges.append(10 ** rng.uniform(-3, -1))
      m_rows.append(moved)
      m_edges.append(edges[-1] * 10 ** (0.8 * (moved["grad_growth"] - old["grad_growth"])))
  out = edge_predictor.from_the_2020_atlas(keys, rows, edges, (keys, m_rows, m_edges))
  as_is, shifted = (predict.scores(held, e) for e, held, _ in out.values())
  assert out[edge_predictor.TRANSFER][2] == keys  # The cells, in order.
  assert list(out)[1] == edge_predictor.TRANSFER
  assert shifted["within_2x"] == 1.0 and shifted["median_factor"] < 1.2, shifted
  assert as_is["within_2x"] < 0.9 and as_is["cells"] == shifted["cells"] == 12
  two_placements = (keys[:4], m_rows[:4], m_edges[:4])
  assert edge_predictor.from_the_2020_atlas(keys, rows, edges, two_placements) == {}


def test_the_transfer_from_half_the_depth_pairs_each_cell_with_its_own_placements():
  """experiments/edge_predictor.py's depth transfer: each cell at 12 or 24 layers predicted
  from the same placement's cell at half its depth and warm-up; with log10(edge / that edge)
  = 0.5 − 0.5 × the change in update_per_lr exactly (the constant makes a pairing across two
  doublings wrong), the shift is found, pooled over both doublings and fitted for each."""
  edge_predictor = _edge_predictor()
  rng = np.random.default_rng(5)
  keys, rows, edges = [], [], []
  for p in range(5):
    for w in (0, 500):
      x = {h: rng.normal() for h in edge_predictor.HEALTH}
      edge = 10 ** rng.uniform(-3, -1)
      for d in (6, 12, 24):
        if d > 6:
          x = dict(x, update_per_lr=x["update_per_lr"] + rng.normal())
          edge *= 10 ** (0.5 - 0.5 * (x["update_per_lr"] - rows[-1]["update_per_lr"]))
        keys.append((f"placement{p}", d, w))
        rows.append(x)
        edges.append(edge)
  out = edge_predictor.from_half_the_depth(keys, rows, edges)
  assert sorted(out[edge_predictor.DEPTH_TRANSFER][2]) == sorted(k for k in keys if k[1] > 6)
  for label in (edge_predictor.DEPTH_TRANSFER, edge_predictor.DEPTH_APART):
    s = predict.scores(np.asarray(out[label][1]), out[label][0])
    assert s["within_2x"] == 1.0 and s["median_factor"] < 1.2 and s["cells"] == 20, (label, s)


def test_the_nested_procedure_never_sees_the_held_out_placement():
  """Each group's held-out predictions, choice of candidate and penalty included, do not move
  when that group's own edges are changed a thousandfold: nothing of it leaked into its
  fold."""
  rows, edges, groups = _table(seed=3)
  candidates = {"a": ["a"], "a, b": ["a", "b"], "a, b, c": ["a", "b", "c"]}
  held, picks = predict.nested(rows, edges, candidates, (1e-6, 1.0), groups)
  for g in sorted(set(groups)):
    moved = [e * 1e3 if grp == g else e for e, grp in zip(edges, groups)]
    again, again_picks = predict.nested(rows, moved, candidates, (1e-6, 1.0), groups)
    mine = np.array(groups) == g
    np.testing.assert_allclose(again[mine], held[mine], atol=1e-9)
    assert again_picks[g] == picks[g]
    assert not np.allclose(again[~mine], held[~mine])  # The others' folds do see it.


def test_the_nested_selection_recovers_the_true_feature_set():
  """The law reads a and b: every fold chooses them (c alone or a alone cannot fit it), the
  held-out predictions are exact, and the selection on all rows agrees."""
  rows, edges, groups = _table(seed=4)
  candidates = {"a": ["a"], "c": ["c"], "a, b": ["a", "b"]}
  held, picks = predict.nested(rows, edges, candidates, (1e-6, 10.0), groups)
  assert {label for label, _ in picks.values()} == {"a, b"}
  assert predict.scores(held, edges)["median_factor"] == pytest.approx(1.0, abs=1e-4)
  assert predict.select(rows, edges, candidates, (1e-6, 10.0), groups) == ("a, b", 1e-6)


def test_the_interval_comes_from_the_residuals_given():
  rows, edges, groups = _table()
  residuals = np.linspace(-1.0, 1.0, len(rows))  # log10 prediction − log10 edge.
  model = predict.fit(rows, edges, ["a", "b"], 1e-6, {}, groups=groups, residuals=residuals)
  assert model.interval == pytest.approx(tuple(np.quantile(-residuals, [0.1, 0.9])))
  edge, low, high = model.predict(rows[0])
  assert low == pytest.approx(edge * 10 ** model.interval[0])


def _record():
  """A feature run's record: 3 layers, 6 steps, the first layer's gradient collapsing."""
  steps = 6
  return {"step": list(range(1, steps + 1)), "loss": [4.0, 3.8, 3.6, 3.5, 3.4, 3.0],
          "grad_norm": [1.0] * steps, "output_logit_max": [2.0] * (steps - 1) + [8.0],
          "grad_rms": [[1e-2, 1e-2, 2e-2]] + [[1e-5, 1e-2, 2e-2]] * (steps - 1),
          "update_rms": [[1e-3, 1e-3, 1e-3]] * steps,
          "max_logit": [[1.0, 2.0, 4.0]] * (steps - 1) + [[40.0, 2.0, 4.0]],
          "residual_rms": [[1.0, 1.0, 1.0]] * (steps - 1) + [[1.0, 1.0, 3.0]]}


def test_the_features_read_the_run():
  x = predict.features(_record(), depth=12, warmup=500)
  assert x["log_depth"] == pytest.approx(math.log10(12)) and x["warmup"] == 1.0
  assert x["init_last_grad"] == pytest.approx(math.log10(2e-2))
  assert x["init_first_share"] == pytest.approx(math.log10(0.5))
  assert x["end_first_share"] == pytest.approx(math.log10(5e-4))
  assert x["logit_growth"] == pytest.approx(1.0)  # Largest attention logit 4 -> 40.
  assert x["output_logit_growth"] == pytest.approx(math.log10(4))
  assert x["residual_growth"] == pytest.approx(math.log10(3))
  assert x["update_per_lr"] == pytest.approx(0.0)  # Adam's update ~ lr.
  assert x["loss_drop"] == pytest.approx(4.0 - np.mean([3.8, 3.6, 3.5, 3.4, 3.0]))


def test_a_second_run_gives_each_features_slope_per_decade_of_rate():
  low = _record()
  high = {**_record(), "update_rms": [[1e-3, 1e-3, 1e-3]] * 6,  # Not grown with the rate.
          "loss": [4.0, 3.9, 3.9, 3.9, 3.9, 3.9], "status": "diverged"}
  x = predict.features(low, 6, 0, lr=1e-3, second=high, second_lr=1e-1)  # Two decades.
  one = predict.features(low, 6, 0)
  assert {k: x[k] for k in one} == one  # The first run's features unchanged.
  assert x["slope_update_per_lr"] == pytest.approx((math.log10(1e-3 / 1e-1) - 0.0) / 2)  # -1.
  assert x["slope_loss_drop"] == pytest.approx((0.1 - one["loss_drop"]) / 2)
  assert x["slope_init_last_grad"] == 0.0 and x["diverged_high"] == 1.0
  assert sorted(k for k in x if k not in one) == sorted(
      [f"slope_{n}" for n in predict.RUN_FEATURES] + ["diverged_high"])


def test_the_saved_fit_reads_only_features_its_runs_give():
  """lnjax/sweep/edge_predictor.json: every column is a feature of its one or two runs, its
  interval brackets 1, and a prediction from a plausible record is a finite rate."""
  model = predict.Model.load()
  second_lr = model.fitted_for.get("second_lr")
  x = predict.features(_record(), 6, 500, model.fitted_for["lr"],
                       _record() if second_lr else None, second_lr or predict.SECOND_LR)
  assert all(n.partition("*")[0] in x and (n.partition("*")[2] or "warmup") in x
             for n in model.names)
  assert model.interval[0] < 0 < model.interval[1]
  edge, low, high = model.predict(x)
  assert 0 < low < edge < high < math.inf


def _fitted(**over):
  config = lnjax.get_config("lm", "size=small")
  return predict.Model(["log_depth"], [1.0], [0.3], [0.1], -2.0, 1.0, (-0.3, 0.3), {
      "config": "configs/lm.py:size=small", "keys": predict.describe_config(config),
      "placements": ["post", "pre"], "depths": [6, 24], "warmups": [0, 500], "steps": 20,
      "lr": 1e-3, **over})


@pytest.mark.parametrize("preset, overrides, message", [
    ("size=small", {"model.pos_emb": "sinusoidal"}, "--predict: model.pos_emb=sinusoidal"),
    ("size=small", {"model.norm_kind": "rmsnorm"}, "--predict: model.norm_kind=rmsnorm"),
    ("size=small", {"model.num_layers": 48}, "--predict: --depths=48"),
    ("size=small", {"opt.b1": 0.5}, "--predict: opt.b1=0.5"),  # Adam's threshold moves.
    ("size=small", {"model.embed_norm": True}, "--predict: model.embed_norm=True"),
    ("size=small", {"model.dtype": "bfloat16"}, "--predict: model.dtype=bfloat16"),
    ("size=small", {"opt.schedule": "cosine"}, "--predict: opt.schedule=cosine"),
])
def test_a_block_or_depth_the_fit_has_not_seen_is_refused(preset, overrides, message):
  config = lnjax.get_config("lm", preset).unlock()
  for key, value in overrides.items():
    section, name = key.split(".")
    config[section][name] = value
  with pytest.raises(errors.ConfigError) as refused:
    predict.check_fitted(_fitted(), config, "pre", config.model.num_layers, 0)
  assert str(refused.value).startswith(message)


def test_another_task_placement_or_warmup_is_refused_and_another_size_noted():
  model = _fitted()
  mt = lnjax.get_config("multi30k_de_en", "")
  with pytest.raises(errors.ConfigError, match="^--predict: task=translation"):
    predict.check_fitted(model, mt, "pre", 12, 0)
  small = lnjax.get_config("lm", "size=small")
  with pytest.raises(errors.ConfigError, match="^--predict: placement dyt"):
    predict.check_fitted(model, small, "dyt", 12, 0)
  with pytest.raises(errors.ConfigError, match="^--predict: --warmups=2000"):
    predict.check_fitted(model, small, "pre", 12, 2000)
  assert predict.check_fitted(model, small, "pre", 12, 0) == []
  mine = small.unlock()  # The cell's own keys, and how values are computed: not the fit's.
  mine.opt.learning_rate, mine.opt.warmup_steps, mine.model.scan_layers = 0.5, 100, True
  assert predict.check_fitted(model, mine, "pre", 12, 0) == []
  mine.opt.eps = 0.0
  with pytest.raises(errors.ConfigError, match="^--predict: opt.eps=0.0"):  # The saved fit.
    predict.check_fitted(predict.Model.load(), mine, "pre", 12, 0)
  notes = predict.check_fitted(model, lnjax.get_config("lm", "smoke"), "pre", 12, 0)
  assert "model.d_model=32 (fitted: 128)" in notes


def _stability(tmp_path, *flags):
  return forkserver.run(
      [sys.executable, "-m", "lnjax.cli.stability", f"--workdir={tmp_path / 'p'}", "--predict",
       *flags], cwd=REPO, capture_output=True, text=True, timeout=600)


@pytest.mark.slow
@pytest.mark.parametrize("flags, message", [
    (["--config=configs/lm.py:size=small", "--placements=nope"],
     "lnjax.cli.stability: error: --placements='nope'"),
    (["--config=configs/lm.py:size=small", "--placements=pre",
      "--config.model.pos_emb=sinusoidal"],
     "lnjax.cli.stability: error: --predict: model.pos_emb=sinusoidal"),
    (["--config=configs/multi30k_de_en.py:smoke", "--placements=pre"],
     "lnjax.cli.stability: error: --predict: task=translation"),
    (["--config=configs/lm.py:size=small", "--placements=pre", "--report_only"],
     "lnjax.cli.stability: error: --predict runs no search"),
    (["--config=configs/lm.py:size=small", "--placements=pre", "--workdir="],  # Not the cwd.
     "lnjax.cli.stability: error: --workdir='' is invalid"),
])
def test_the_commands_refusals_are_one_line_exit_2(tmp_path, flags, message):
  out = _stability(tmp_path, *flags)
  assert out.returncode == 2, out.stderr
  lines = out.stderr.strip().splitlines()
  assert len(lines) == 1 and lines[0].startswith(message), out.stderr


@pytest.mark.slow
def test_the_prediction_runs_end_to_end_on_the_smoke_config(tmp_path):
  out = _stability(tmp_path, "--config=configs/lm.py:smoke", "--placements=pre",
                   "--depths=6", "--warmups=0,500")
  assert out.returncode == 0, out.stderr
  lines = [l for l in out.stdout.splitlines() if "predicted highest stable lr" in l]
  assert [l.split(":")[0] for l in lines] == ["pre, 6 layers, warm-up 0",
                                              "pre, 6 layers, warm-up 500"]
  edges = [float(l.split("lr ")[1].split()[0]) for l in lines]
  assert all(1e-6 < e < 10 for e in edges)
  assert "note: an extrapolation" in out.stdout
  record = predict.read_run(str(tmp_path / "p" / "predict" / "norm=pre,layers=6"))
  assert len(record["step"]) == predict.STEPS and len(record["grad_rms"][0]) == 6


@pytest.mark.slow
def test_a_fit_that_reads_a_second_run_makes_the_command_run_it(tmp_path):
  """fitted_for.second_lr: a second feature run at that rate, its own folder, and the
  prediction reads its slope."""
  model = _fitted(second_lr=1e-2)
  model.names, model.coef = ["slope_loss_drop"], [0.1]
  lines = predict.predict_cells("configs/lm.py:smoke", {}, ["pre"], [6], [0], str(tmp_path),
                                model=model)
  assert "a 20-step run at lr 0.001 and one at 0.01" in lines[0]
  assert lines[-1].startswith("pre, 6 layers, warm-up 0: predicted highest stable lr")
  low = predict.read_run(str(tmp_path / "predict" / "norm=pre,layers=6"))
  high = predict.read_run(str(tmp_path / "predict" / "norm=pre,layers=6,lr=0.01"))
  assert len(low["step"]) == len(high["step"]) == predict.STEPS
  for folder, lr in (("norm=pre,layers=6", 1e-3), ("norm=pre,layers=6,lr=0.01", 1e-2)):
    with open(tmp_path / "predict" / folder / "config.json") as f:
      assert json.load(f)["opt"]["learning_rate"] == lr
  x = predict.features(low, 6, 0, second=high)
  edge = float(lines[-1].split("lr ")[1].split()[0])
  assert edge == pytest.approx(model.predict(x)[0], rel=1e-2)


def test_a_feature_run_that_diverged_keeps_its_last_finite_values(tmp_path):
  """A step that diverged writes its health statistics as null (metrics.jsonl holds no
  NaN): its layers are left out, and the features are those of the steps before it."""
  rows = [{"step": 1, "train_loss": 4.2, "grad_norm": 1.0, "health/output_logit_max": 2.0,
           **{f"health/layer_{i}/ffn/grad_rms": 0.1 * (i + 1) for i in range(3)},
           **{f"health/layer_{i}/ffn/update_rms": 1e-3 for i in range(3)}},
          {"step": 2, "train_loss": 3.9, "grad_norm": 2.0, "health/output_logit_max": 4.0,
           **{f"health/layer_{i}/ffn/grad_rms": 0.2 * (i + 1) for i in range(3)},
           **{f"health/layer_{i}/ffn/update_rms": 2e-3 for i in range(3)}},
          {"step": 3, "train_loss": None, "grad_norm": None, "health/output_logit_max": None,
           **{f"health/layer_{i}/ffn/grad_rms": None for i in range(3)},
           **{f"health/layer_{i}/ffn/update_rms": None for i in range(3)}}]
  with open(tmp_path / "metrics.jsonl", "w") as f:
    f.writelines(json.dumps(r) + "\n" for r in rows)
  with open(tmp_path / "summary.json", "w") as f:
    json.dump({"status": "diverged"}, f)
  record = predict.read_run(str(tmp_path))
  assert record["grad_rms"] == [[0.1, 0.2, 0.3], [0.2, 0.4, 0.6], None]
  x = predict.features(record, 3, 0)
  assert x["grad_growth"] == pytest.approx(math.log10((0.3 + 0.6) / 2 / 0.3))  # Steps 1-2.
  assert x["update_per_lr"] == pytest.approx(math.log10((1e-3 + 2e-3) / 2 / 1e-3))


@pytest.mark.slow
def test_sigterm_stops_a_prediction_in_one_line_and_the_same_command_finishes_it(tmp_path):
  """SIGTERM during a feature run: exit 143 within 10 s, one line, no prediction printed
  (a cut-short run would give a wrong one); the same command then predicts as if
  uninterrupted (the stopped run resumes to its 20 steps)."""
  cmd = [sys.executable, "-m", "lnjax.cli.stability", f"--workdir={tmp_path / 'p'}",
         "--predict", "--config=configs/lm.py:smoke", "--placements=post,pre", "--depths=6"]
  metrics = tmp_path / "p" / "predict" / "norm=post,layers=6" / "metrics.jsonl"
  code, out, err, seconds = signal_when(
      cmd, lambda: metrics.exists() and metrics.read_text().count("\n") >= 2, timeout=300)
  assert code == 143 and seconds < 10, (code, seconds, err[-2000:])
  assert "predicted highest stable lr" not in out
  assert err.strip().splitlines()[-1].endswith("stopped; the same command resumes (finished "
                                               "feature runs are read again)"), err[-2000:]
  again = forkserver.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=600)
  assert again.returncode == 0, again.stderr[-2000:]
  assert len([l for l in again.stdout.splitlines() if "predicted highest" in l]) == 2
  record = predict.read_run(str(metrics.parent))
  assert record["step"] == list(range(1, predict.STEPS + 1)) and record["status"] == "completed"
