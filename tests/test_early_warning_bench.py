"""benchmarks/early_warning.py's definitions, on runs written by hand: what counts as failed,
where its event is, and each score (precision, recall by kind, lead, false warnings), and
the replay of lnjax's rules on a run's logged statistics."""

import math

import pytest

from conftest import import_benchmark
from lnjax.core import metrics


@pytest.fixture(scope="module")
def ew():
  return import_benchmark("early_warning")


def run(name, loss, *, eval_loss, status="completed", unigram=3.3, warnings=()):
  steps = list(range(1, len(loss) + 1))
  return {"name": name, "status": status, "steps": steps, "loss": loss,
          "grad_norm": [1.0] * len(loss), "unigram": unigram, "eval_loss": eval_loss,
          "diverged_at": steps[-1] if status == "diverged" else None,
          "firings": list(warnings)}


def test_outcome_and_scores_by_hand(ew):
  blow_up = run("blow_up", [3.0] * 30 + [math.nan], eval_loss=None, status="diverged",
                warnings=[25])  # NaN at step 31: event 31, warned 6 steps before.
  spike = run("spike", [3.0] * 20 + [4.5] + [3.0] * 9, eval_loss=2.5)  # +1.5 nats at 21.
  # At the baseline from step 6: the 10-step mean reaches it at step 15 (5.3 out of the window).
  collapse = run("collapse", [5.3] * 5 + [3.3] * 35, eval_loss=3.25, warnings=[1])
  trained = run("trained", [3.0 - 0.01 * i for i in range(50)], eval_loss=2.5,
                warnings=[7, 30])  # Two false warnings in 50 steps.
  quiet = run("quiet", [3.0] * 50, eval_loss=2.9)
  assert ew.outcome(blow_up) == (True, 31, True)
  assert ew.outcome(spike) == (True, 21, True)
  assert ew.outcome(collapse) == (True, 15, False)  # Warned 14 steps before.
  assert ew.outcome(trained)[0] is False and ew.outcome(quiet)[0] is False
  # Adam's first-step transient (+2 nats before the loss was ever below the baseline) is
  # no divergence: this run collapsed, at the step it settled.
  transient = run("transient", [4.9, 6.9, 4.7] + [3.3] * 20, eval_loss=3.31)
  assert ew.outcome(transient) == (True, 13, False)
  s = ew.score([blow_up, spike, collapse, trained, quiet], lambda r: r["firings"])
  assert s["failed_runs"] == 3 and s["trained_runs"] == 2
  assert s["precision"] == pytest.approx(2 / 3)  # Warned: blow_up, collapse, trained.
  assert s["recall"] == pytest.approx(2 / 3)
  assert s["blow_ups_warned"] == [1, 2] and s["collapses_warned"] == [1, 1]
  assert s["median_lead_blow_ups"] == 6 and s["median_lead_steps"] == (6 + 14) / 2
  assert s["false_per_1000_steps"] == pytest.approx(1000 * 2 / 100)


def test_a_collapse_settles_after_its_last_dip_below_the_baseline(ew):
  """Learning, then back up to the baseline for good: the event is where it settled."""
  curve = [4.0, 3.5, 3.2, 3.0, 2.9, 3.1, 3.35, 3.3, 3.0, 3.32, 3.3, 3.31]
  steps = list(range(1, 13))
  assert ew.settled_at_baseline(steps, curve, 3.3, window=1) == 10  # 3.0 at 9: 0.3 below.
  # Means of the last 2 steps: 3.325 at 8, 3.15 at 9, 3.16 at 10, 3.31 at 11.
  assert ew.settled_at_baseline(steps, curve, 3.3, window=2) == 11
  assert ew.settled_at_baseline([1, 2, 3], [4.0, 3.9, 3.8], 3.3) is None  # Never reached it.
  # One batch's noise (±0.12 nat) does not undo a settling that the 10-step mean keeps.
  noisy, noisy_steps = [5.0] + [3.42, 3.18] * 20, list(range(1, 42))
  assert ew.settled_at_baseline(noisy_steps, noisy, 3.3) == 11
  assert ew.settled_at_baseline(noisy_steps, noisy, 3.3, window=1) is None
  never = run("never", [4.0, 3.9, 3.8], eval_loss=3.5)
  assert ew.outcome(never) == (True, 3, False)  # The last step, then.


def test_a_warning_after_the_event_does_not_count(ew):
  late = run("late", [3.0] * 30 + [math.nan], eval_loss=None, status="diverged",
             warnings=[31])
  assert ew.score([late], lambda r: r["firings"])["recall"] == 0


def test_rules_replayed_on_logged_statistics(ew, tmp_path):
  """A run whose layer 0 gradient vanishes from step 5 and whose layer 1 update spikes
  10× at steps 50 and 120: the replay finds the vanishing-gradient warning at step 7 (3
  steps below) and the spike at 120 (the rule's 100 steps of history), as the Health hook
  would."""
  writer = metrics.MetricWriter(str(tmp_path), tensorboard=False)
  for step in range(1, 131):
    g0 = 1e-3 if step < 5 else 1e-9
    update = 1e-3 * (10.0 if step in (50, 120) else 1.0)
    writer.write(step, {"train_loss": 3.0, "learning_rate": 1e-3, "grad_norm": 1.0})
    writer.write(step, {"health/layer_0/ffn/grad_rms": g0, "health/layer_1/ffn/grad_rms": 1e-3,
                        "health/layer_1/ffn/update_rms": update})
  writer.close()
  replayed = ew.replay_rules(metrics.read_metrics(str(tmp_path)))
  assert (replayed["spike_warnings"], replayed["depth_warnings"]) == ([120], [7])
  ratio = dict(replayed["first_layer_ratio"])  # The vanishing rule's input, as plotted.
  assert ratio[4] == 1.0 and ratio[5] == pytest.approx(1e-6) and len(ratio) == 130


def test_the_report_has_a_row_per_rule_and_per_run(ew):
  collapse = {**run("collapse", [5.3] * 5 + [3.3] * 35, eval_loss=3.31),
              "spike_warnings": [12], "depth_warnings": [4]}  # Settled at step 15.
  trained = {**run("trained", [3.0 - 0.01 * i for i in range(50)], eval_loss=2.5),
             "spike_warnings": [], "depth_warnings": []}
  table, scores = ew.report([collapse, trained], planned=5)
  lines = table.splitlines()
  assert lines[0] == "2 of the grid's 5 runs."
  assert "| collapse | collapsed | 15 | +0.010 | 12 | 4 | – |" in lines
  assert "| trained | trained | – | -0.800 | – | – | – |" in lines
  # The 6σ rule never fires on these flat losses: nothing to pair; 15 − 4 against 0 steps.
  assert ("train.health=warn against the 6σ rule: no failure that both warned of; over all 1 "
          "failures, a missed one counted as 0, median lead 11 against 0 steps.") in lines
  assert [line.split(" | ")[0] for line in lines if line.startswith("| lnjax") or "6σ" in line[:8]] \
      == ["| lnjax, spikes (health.EarlyWarning)",
          "| lnjax, vanishing gradient (health.VanishingGradient)",
          "| lnjax, either (train.health=warn)", "| 6σ loss/grad-norm rule"]
  assert scores["lnjax, either (train.health=warn)"]["recall"] == 1.0


def test_every_run_of_the_grid_resolves(ew):
  """The grid's settings are keys of its configs and their values are accepted (a typo would
  otherwise surface hours into the grid): 36 LM runs and 8 Multi30k runs, names unique."""
  from lnjax import tasks
  from lnjax.core import run as run_lib
  specs = ew.grid(quick=False)
  assert len(specs) == 44 and len({s["name"] for s in specs}) == 44
  assert sum(s.get("config") == "mt" for s in specs) == 8
  for spec in specs:
    c = ew.make_config(spec)
    run_lib.resolve_config(c, tasks=tasks.get)
    assert c.train.log_every_steps == 1 and c.train.health == "warn"
  mt = ew.make_config(next(s for s in specs if s.get("config") == "mt"))
  # Seeds 0 and 1 of the LM, Multi30k's seed 0, the LM's seed 2, Multi30k's seed 1.
  kinds = [s.get("config") for s in specs]
  assert kinds == [None] * 24 + ["mt"] * 4 + [None] * 12 + ["mt"] * 4
  assert [s["name"].endswith("_s2") for s in specs[28:40]] == [True] * 12
  # The held-out part of the sensitivity table: exactly the runs after the first 28.
  assert [ew.held_out(s["name"]) for s in specs] == [False] * 28 + [True] * 16
  assert (mt.data.name, mt.model.num_layers, mt.decode.bleu_in_training) == (
      "multi30k_de_en", 3, False)


def test_the_figure_draws_the_lm_runs_and_leaves_out_multi30k(ew, tmp_path):
  collapse = {**run("collapse", [5.3] * 5 + [3.3] * 35, eval_loss=3.31),
              "first_layer_ratio": [(s, 10.0 ** -s) for s in range(1, 41)]}
  trained = {**run("trained", [3.0 - 0.01 * i for i in range(50)], eval_loss=2.5),
             "first_layer_ratio": [(s, 0.5) for s in range(1, 51)]}
  mt = {**run("mt_post", [9.0] * 10, eval_loss=None, unigram=None), "first_layer_ratio": []}
  path = str(tmp_path / "ew.png")
  ew.plot([collapse, trained, mt], path)
  assert open(path, "rb").read(8) == b"\x89PNG\r\n\x1a\n"
