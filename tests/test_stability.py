"""The stability search (python -m lnjax.cli.stability, lnjax/sweep/search.py): the bisection
against a pure-Python oracle whose threshold is known, the range test's bracket, the
definition of a stable run, refusals, and one search on the LM smoke preset killed and
resumed."""

import json
import math
import os
import signal
import subprocess
import sys
import time

import pytest

import hypothesis
from hypothesis import strategies as st

from lnjax.sweep import search
import forkserver

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def search_with_oracle(threshold: float, start: search.Bracket, tolerance=1.4, widen=10.0,
                       results=None, stop_after=None, floor=1e-5):
  """Runs the search against `stable(lr) = lr <= threshold`; returns (outcome, the rates
  probed in order). A probe asked twice fails the test."""
  results = {} if results is None else results
  asked = []
  while True:
    outcome = search.replay(start, results, tolerance, widen, floor=floor)
    if outcome.next_lr is None or (stop_after is not None and len(asked) == stop_after):
      return outcome, asked
    assert outcome.next_lr not in results, f"probe {outcome.next_lr} asked again"
    asked.append(outcome.next_lr)
    results[outcome.next_lr] = outcome.next_lr <= threshold


@pytest.mark.parametrize("threshold", [1.3e-4, 4.2e-4, 1e-3, 2.7e-3, 8.1e-3])
def test_bisection_finds_the_threshold_within_tolerance_in_the_predicted_probes(threshold):
  start, tolerance = search.Bracket(1e-4, 1e-2), 1.4
  outcome, asked = search_with_oracle(threshold, start, tolerance)
  assert outcome.status == search.FOUND
  assert outcome.lower <= threshold < outcome.upper
  assert outcome.upper / outcome.lower <= tolerance
  # ⌈log₂(ln 100 / ln 1.4)⌉ = 4 bisections; a threshold in the bracket's lowest or highest
  # final interval also probes the end the bisection never tested.
  n = search.predicted_probes(1e-4, 1e-2, tolerance)
  assert n == 4
  bisection = [lr <= threshold for lr in asked[:n]]
  untested_end = all(bisection) or not any(bisection)
  assert len(asked) == n + untested_end
  assert all(a < b for a, b in zip(sorted(asked), sorted(asked)[1:]))  # No rate twice.


def test_a_low_end_that_fails_is_widened_down_to_lr_min_then_the_cell_stops():
  start = search.Bracket(1e-4, 1e-2)
  outcome, asked = search_with_oracle(3e-5, start)  # Below the bracket, above its widening.
  assert outcome.status == search.FOUND and outcome.lower <= 3e-5 < outcome.upper
  assert outcome.events == ("the bracket's low end 0.0001 is unstable: widened to 1e-05",)
  outcome, asked = search_with_oracle(5e-6, start)  # Below the floor (lr_min) 1e-5.
  assert outcome.status == search.BELOW and outcome.lower is None and outcome.upper == 1e-5
  assert asked[-1] == 1e-5
  assert len(asked) == 4 + 1 + 3 + 1  # Bisection, low end, bisection of [1e-5, 1e-4], its low end.
  # With a lower floor the same edge is found after a second widening ...
  outcome, asked = search_with_oracle(5e-6, start, floor=1e-7)
  assert outcome.status == search.FOUND and outcome.lower <= 5e-6 < outcome.upper
  assert outcome.upper / outcome.lower <= 1.4 and len(outcome.events) == 2
  # ... and the last widening stops at the floor itself, where the cell ends.
  outcome, asked = search_with_oracle(1e-8, start, floor=3e-7)
  assert outcome.status == search.BELOW and outcome.upper == 3e-7 == min(asked)
  assert outcome.events[-1] == "the bracket's low end 1e-06 is unstable: widened to 3e-07"
  assert len(asked) == len(set(asked))
  # A floor between two rounded rates, or a widening factor too small to move a rate at 3
  # significant digits, still ends (the rates asked only fall).
  for floor, widen in ((1.00004e-4, 10.0), (1e-6, 1.0001)):
    outcome, asked = search_with_oracle(1e-9, start, floor=floor, widen=widen)
    assert outcome.status == search.BELOW and outcome.upper == min(asked)



def test_a_widened_low_end_becomes_the_upper_end():
  """The low end 1e-4 found unstable: the bracket becomes [1e-5, 1e-4], its upper end
  the rate just found unstable (not the upper end bisection had reached above it), so
  the next probe is their geometric mean and nothing at or above 1e-4 is asked again."""
  outcome, asked = search_with_oracle(3e-5, search.Bracket(1e-4, 1e-2))
  after = asked[asked.index(1e-4) + 1:]
  assert after[0] == search.rounded(math.sqrt(1e-5 * 1e-4)) and max(after) < 1e-4
  assert outcome.lower <= 3e-5 < outcome.upper <= 1e-4

@hypothesis.settings(max_examples=200, derandomize=True, deadline=None, database=None)
@hypothesis.given(lo_exp=st.floats(-5, -1), span=st.floats(0.3, 3), edge_exp=st.floats(-9, 1),
                  floor_exp=st.floats(-8, -2), tolerance=st.sampled_from([1.4, 2.0, 3.0]),
                  widen=st.sampled_from([2.0, 10.0, 100.0]))
def test_the_search_ends_and_brackets_any_edge_above_its_floor(lo_exp, span, edge_exp,
                                                               floor_exp, tolerance, widen):
  """Against `stable(lr) = lr <= edge`, from any bracket and floor: the search ends without
  asking a rate twice; an edge between the floor and the widened high end is bracketed to
  the tolerance, one below the floor ends with no stable rate, one above the widened high
  end with a stable high end."""
  lo = 10 ** lo_exp
  start, edge, floor = search.Bracket(lo, lo * 10 ** span), 10 ** edge_exp, 10 ** floor_exp
  outcome, asked = search_with_oracle(edge, start, tolerance, widen, floor=floor)
  assert len(asked) < 200
  # The lowest rate the search may probe (the floor, or the bracket's low end if below it)
  # and the highest (the high end widened once).
  lowest = search.rounded(floor) if start.lo > floor else search.rounded(start.lo)
  highest = search.rounded(search.rounded(start.hi) * widen)
  assert (outcome.status == search.FOUND) == (lowest <= edge < highest)
  if outcome.status == search.FOUND:
    assert outcome.lower <= edge < outcome.upper
    assert outcome.upper / outcome.lower <= tolerance * 1.01  # Rates have 3 digits.
  elif outcome.status == search.BELOW:
    assert edge < outcome.upper == lowest == min(asked)
  else:
    assert outcome.status == search.ABOVE and edge >= outcome.lower == highest == max(asked)


def test_a_high_end_that_holds_is_widened_once():
  start = search.Bracket(1e-4, 1e-2)
  outcome, _ = search_with_oracle(0.03, start)
  assert outcome.status == search.FOUND and outcome.lower <= 0.03 < outcome.upper
  outcome, _ = search_with_oracle(5.0, start)
  assert outcome.status == search.ABOVE and outcome.lower == 0.1 and outcome.upper is None


@pytest.mark.parametrize("killed_after", [0, 1, 2, 3, 4])
def test_a_killed_search_resumes_without_repeating_a_probe(killed_after):
  """The recorded results alone (what search.json keeps) continue the search: the
  probes after the kill and before it are disjoint and together the uninterrupted ones."""
  start, threshold = search.Bracket(1e-4, 1e-2), 6e-4
  full, full_asked = search_with_oracle(threshold, start)
  results = {}
  _, before = search_with_oracle(threshold, start, results=results, stop_after=killed_after)
  recorded = json.loads(json.dumps({f"{k:g}": v for k, v in results.items()}))
  resumed, after = search_with_oracle(threshold, start,
                                      results={float(k): v for k, v in recorded.items()})
  assert not set(before) & set(after)
  assert before + after == full_asked and resumed == full


def test_predicted_probes():
  assert search.predicted_probes(1e-3, 1e-2, 1.5) == math.ceil(math.log2(math.log(10) / math.log(1.5)))
  assert search.predicted_probes(1e-3, 1.2e-3, 1.5) == 0


def test_the_range_test_bracket_is_where_the_loss_stops_improving_and_where_it_blows_up():
  gamma = search.range_test_growth(1e-5, 1.0, 101)
  assert gamma == pytest.approx(10 ** 0.05)
  rates = [1e-5 * gamma ** t for t in range(101)]
  # A loss that falls until lr 1e-2 (t = 60), then climbs back past its initial value.
  losses = [4.0 - 2.0 * t / 60 if t <= 60 else 2.0 + 0.2 * (t - 60) for t in range(101)]
  records = [{"step": t + 1, "learning_rate": lr, "train_loss": loss}
             for t, (lr, loss) in enumerate(zip(rates, losses))]
  b = search.bracket(records, 1.0, diverged=False)
  assert 1e-2 <= b.lo <= 1.3e-2  # The smoothed minimum lags the true one by a step or two.
  assert 1.3e-2 < b.hi < 1e-1 and "half-way" in b.note
  # A run that ends diverged with NaN: the high end is the first non-finite step's rate.
  records[70]["train_loss"] = float("nan")
  b = search.bracket(records[:71], 1.0, diverged=True)
  assert b.hi <= rates[70] * 1.001
  # A loss that never blows up: the high end is lr_max.
  calm = [{"step": t, "learning_rate": lr, "train_loss": 4.0 - t / 100}
          for t, lr in enumerate(rates)]
  b = search.bracket(calm, 1.0, diverged=False)
  assert b.hi == 1.0 and b.lo <= 0.5 and "never blew up" in b.note


def test_the_definition_of_stable():
  stable = search.Stable(steps=100, divergence_factor=2.0, margin_nats=0.1)
  text = stable.describe(3)
  assert "3 seed(s)" in text and "100 steps" in text and "0.1 nats" in text and "2 × ln V" in text
  ok = {"status": "completed", "num_steps": 100, "eval_loss": 3.0, "unigram_baseline": 3.3}
  assert stable.judge(ok).stable is True
  assert stable.judge({**ok, "eval_loss": 3.25}) == (
      False, "held-out loss 3.250 is 0.050 nats below the unigram baseline 3.300, not 0.1 below",
      "held-out -0.050 nats vs unigram")
  assert stable.judge({**ok, "eval_loss": 3.31}) == (
      False, "held-out loss 3.310 is 0.010 nats above the unigram baseline 3.300, not 0.1 below",
      "held-out +0.010 nats vs unigram")  # Above the baseline: a stall.
  assert stable.judge({**ok, "status": "diverged", "step": 4}) == (
      False, "diverged at step 4", "diverged at step 4")
  assert stable.judge({**ok, "num_steps": 50}).stable is None  # Another length: not judged.
  assert stable.judge({**ok, "status": "running"}).stable is None
  # A warm-up cell's probe: its warm-up, then the 100 steps at the peak rate.
  assert stable.judge({**ok, "num_steps": 150}, warmup=50).stable is True
  assert stable.judge(ok, warmup=50).stable is None
  # Probes that recover: the definition says so, and a stable run's reason counts the actions.
  assert "on_instability" not in text
  recovering = search.Stable(steps=100, divergence_factor=2.0, margin_nats=0.1, recovery="rollback")
  assert "train.on_instability=rollback" in recovering.describe(3)
  assert recovering.judge({**ok, "instability_actions": [{}, {}]}) == (
      True, "held-out loss 3.000, 0.300 nats below the unigram baseline, after 2 recovery action(s)",
      None)
  # An unstable probe's failure in a few words: a divergence first, else the first failure.
  stall, slow = stable.judge({**ok, "eval_loss": 3.31}), stable.judge({**ok, "eval_loss": 3.25})
  diverged, unfinished = stable.judge({**ok, "status": "diverged", "step": 4}), stable.judge({})
  assert search.fails_by([stall, unfinished]) == "held-out +0.010 nats vs unigram"
  assert search.fails_by([slow, diverged]) == "diverged at step 4"
  assert search.fails_by([stable.judge(ok), unfinished]) is None
  # Read back from the seeds' sentences (probes recorded before they stored it): the same.
  skipped = "not run: another seed was unstable"
  for verdicts in ([stall], [slow], [slow, diverged]):
    assert search.how_it_failed([v.why for v in verdicts] + [skipped]) == search.fails_by(verdicts)
  assert search.how_it_failed([skipped]) is None
  assert search.probe_result([True, True, True]) is True
  assert search.probe_result([True, None, False]) is False
  assert search.probe_result([True, None]) is None


# A search with one probe left (one_probe_left): its bracket and low end recorded.
ONE_PROBE_FLAGS = ["--config=configs/lm.py:smoke", "--placements=pre", "--depths=2",
                   "--seeds=1", "--probe_steps=5", "--range_steps=5", "--tolerance=1000",
                   "--margin_nats=-1"]


def one_probe_left(tmp_path):
  """(state file, workdir) of a search (ONE_PROBE_FLAGS) whose state holds Pre-LN's bracket
  0.2-100 and 0.2 stable: it asks for one probe, the high end, which diverges; the search
  then ends between the two. test_slurm and test_ray run it through their back ends."""
  state = tmp_path / "state.json"
  state.write_text(json.dumps({
      "settings": {"config": "configs/lm.py:smoke", "fixed": {}, "seeds": 1, "probe_steps": 5,
                   "range_steps": 5, "lr_min": 1e-05, "lr_max": 1.0, "tolerance": 1000.0,
                   "widen": 10.0, "margin_nats": -1.0, "divergence_factor": 2.0},
      "range_tests": {"pre/2": {"lo": 0.2, "hi": 100.0, "note": "given", "run": "r",
                                "steps": 5}},
      "probes": {"pre/2/0": {"0.2": {"stable": True, "runs": ["r"], "seeds": ["given"],
                                     "steps": 5}}}}))
  return state, tmp_path / "search"


def check_the_last_probe(state, workdir) -> dict:
  """The search of one_probe_left ran its probe, recorded it and ended; the probe's entry
  in the back end's manifest."""
  entry = json.load(open(workdir / "runs" / "sweep.json"))["runs"][
      "norm=pre,layers=2,warmup=0,lr=100,seed=0"]
  assert entry["state"] == "diverged", entry
  (cell,) = json.load(open(workdir / "stability.json"))["cells"]
  assert (cell["status"], cell["highest_stable_lr"], cell["lowest_unstable_lr"]) == (
      search.FOUND, 0.2, 100.0)
  assert list(json.loads(state.read_text())["probes"]["pre/2/0"]) == ["0.2", "100"]
  return entry


def _stability(workdir, *flags, **kw):
  return forkserver.run(
      [sys.executable, "-m", "lnjax.cli.stability", "--config=configs/lm.py:smoke",
       f"--workdir={workdir}", *flags], cwd=REPO, capture_output=True, text=True, **kw)


def test_every_cell_probes_as_long_at_its_peak_rate(tmp_path):
  """A probe of a warm-up cell runs the warm-up, then --probe_steps steps at its rate."""
  from lnjax.sweep import stability
  s = stability.Search(f"{REPO}/configs/lm.py:smoke", {}, str(tmp_path), placements=["pre"], depths=[2],
                       warmups=[0, 50], seeds=2, range_steps=20, lr_min=1e-4, lr_max=1.0,
                       tolerance=2.0, widen=10.0, stable=search.Stable(30, 2.0, 0.1))
  for warmup in (0, 50):
    runs = s.probe_runs(("pre", 2, warmup), 1e-3)
    assert [r.overrides["train.num_steps"] for r in runs] == [warmup + 30] * 2
    assert {r.overrides["opt.warmup_steps"] for r in runs} == {warmup}


@pytest.mark.parametrize("recovery", ["none", "skip", "rollback"])
def test_range_tests_never_recover_and_probes_that_roll_back_keep_checkpoints(tmp_path, recovery):
  """A range test's loss must blow up to bracket the edge, whatever train.on_instability the
  probes use; a probe that rolls back needs a checkpoint every rollback_steps, any other
  keeps one, its latest, saved every PROBE_CHECKPOINT_EVERY steps (or at its end)."""
  from lnjax.sweep import stability
  fixed = {"train.on_instability": recovery, "train.rollback_steps": 10}
  s = stability.Search(f"{REPO}/configs/lm.py:smoke", fixed, str(tmp_path), placements=["pre"],
                       depths=[2], warmups=[0], seeds=1, range_steps=20, lr_min=1e-4,
                       lr_max=1.0, tolerance=2.0, widen=10.0,
                       stable=search.Stable(30, 2.0, 0.1))
  assert s.stable.recovery == recovery  # The config's, one source.
  assert s.range_run("pre", 2).config.train.on_instability == "none"
  probe = s.probe_runs(("pre", 2, 0), 1e-3)[0].config.train
  assert probe.on_instability == recovery
  assert probe.checkpoint_every_steps == (10 if recovery == "rollback" else 30)
  assert probe.keep_checkpoints == (3 if recovery == "rollback" else 1)
  long_probe = s.probe_runs(("pre", 2, 500), 1e-3)[0].config.train  # 500 + 30 steps.
  assert long_probe.checkpoint_every_steps == (10 if recovery == "rollback"
                                               else stability.PROBE_CHECKPOINT_EVERY)


def test_an_unfinished_search_reports_its_bounds_so_far_and_its_next_probe(tmp_path):
  """The table of a search still running (--report_only, or a killed one): each cell's
  highest stable and lowest unstable rate probed so far, the probe it runs next, and how
  many cells are measured; the figure is drawn all the same."""
  from lnjax.sweep import stability, stability_report
  s = stability.Search(f"{REPO}/configs/lm.py:smoke", {}, str(tmp_path),
                       placements=["pre", "post"], depths=[2], warmups=[0, 50], seeds=2,
                       range_steps=20, lr_min=1e-4, lr_max=1.0, tolerance=1.4, widen=10.0,
                       stable=search.Stable(30, 2.0, 0.1))
  s.state["range_tests"]["pre/2"] = {"lo": 1e-3, "hi": 1e-1, "note": "n", "run": "r",
                                     "steps": 20}
  # Pre-LN, no warm-up: the bisection's probes at √(1e-3 · 1e-1) = 0.01 and √(0.01 · 0.1)
  # held, at √(0.0316 · 0.1) failed.
  s.state["probes"]["pre/2/0"] = {
      f"{lr:g}": {"stable": ok, "runs": ["a"], "seeds": [why], "steps": 30, "seconds": 720}
      for lr, ok, why in ((0.01, True, "why"), (0.0316, True, "why"),
                          (0.0562, False, "diverged at step 5"))}
  rows = {(r["placement"], r["warmup"]): r for r in stability_report.rows(s)}
  pre = rows["pre", 0]
  assert pre["status"] == "unfinished" and pre["next_lr"] == 0.0421  # √(0.0316 · 0.0562)
  assert (pre["highest_stable_lr"], pre["lowest_unstable_lr"]) == (0.0316, 0.0562)
  assert rows["pre", 50]["next_lr"] == 0.01 and rows["pre", 50]["highest_stable_lr"] is None
  assert rows["post", 0]["range_test_bracket"] is None
  result = stability_report.write(s, command="python -m lnjax.cli.stability --report_only")
  md = "\n".join(result["markdown"])
  assert "| Pre-LN | 2 | 0 | ≥ 0.0316 so far | 0.0562 | diverged at step 5 |" in md
  assert "unfinished: next probe 0.0421" in md and "unfinished: next probe 0.01 |" in md
  assert md.count("unfinished: range test not yet run") == 2  # Post-LN's two cells.
  assert "0 of 4 cells measured; 4 still searching" in md
  # What is left: Pre-LN's bisections, 1 for [0.0316, 0.0562) and 4 for [1e-3, 0.1) at a
  # tolerance of 1.4 (⌈log₂(ln(hi/lo) / ln 1.4)⌉), 1 or 2 runs each (2 seeds), 12 min a run.
  # Post-LN's one range test serves both its cells.
  assert ("At least 5 probe(s) left (5-10 runs), and 1 range test(s) for 2 cell(s) with their "
          "probes; at 12.0 min a run (the 3 probe(s) timed so far), 1.0-2.0 h.") in md
  with open(result["paths"]["stability.json"]) as f:
    assert json.load(f)["left"].startswith("At least 5 probe(s) left")
  assert os.path.getsize(result["paths"]["stability.png"]) > 0
  # Before any range test has bracketed a cell, only the range tests are counted.
  s.state["range_tests"].clear()
  assert stability_report.left(s, stability_report.rows(s)) == (
      "2 range test(s) for 4 cell(s) left, then their cells' probes.")


def test_a_probe_is_recorded_as_its_last_seed_finishes(tmp_path):
  """The launchers call on_finished as each run finishes; the search records a probe then,
  so a search stopped mid-round keeps in its state every probe whose seeds all finished."""
  import io
  from lnjax.sweep import launcher as launcher_lib, stability
  s = stability.Search(f"{REPO}/configs/lm.py:smoke", {}, str(tmp_path / "w"),
                       placements=["pre"], depths=[2], warmups=[0], seeds=2, range_steps=20,
                       lr_min=1e-4, lr_max=1.0, tolerance=1.4, widen=10.0,
                       stable=search.Stable(30, 2.0, 0.1),
                       state_path=str(tmp_path / "kept.json"), first_seed_alone=False)
  s.state["range_tests"]["pre/2"] = {"lo": 1e-3, "hi": 1e-1, "note": "n", "run": "r",
                                     "steps": 20}
  s.save()
  runs = s.next_runs()
  for run, loss in zip(runs, (2.9, 3.0)):  # Both seeds finished, 0.49 and 0.39 below 3.39.
    os.makedirs(os.path.join(s.root, run.name))
    with open(os.path.join(s.root, run.name, "summary.json"), "w") as f:
      json.dump({"status": "completed", "step": 30, "num_steps": 30, "eval_loss": loss,
                 "unigram_baseline": 3.39}, f)
  seen = []
  code = launcher_lib.Launcher(s.config_arg, "stability", runs, s.root,
                               launcher_lib.make_slots("auto", 1, None), out=io.StringIO(),
                               on_finished=lambda run: (seen.append(run.name), s.record())).run()
  assert code == 0 and seen == [r.name for r in runs]
  kept = json.loads((tmp_path / "kept.json").read_text())
  assert kept["probes"]["pre/2/0"]["0.01"]["stable"] is True  # On disk, no round's end needed.
  assert kept["probes"]["pre/2/0"]["0.01"]["runs"] == [r.name for r in runs]


def _finish(s, run, **summary):
  os.makedirs(os.path.join(s.root, run.name), exist_ok=True)
  with open(os.path.join(s.root, run.name, "summary.json"), "w") as f:
    json.dump(summary, f)


@pytest.mark.parametrize("first_seed_alone", [True, False])
def test_a_probe_runs_seed_0_alone_and_its_other_seeds_once_it_holds(tmp_path,
                                                                     first_seed_alone):
  """A probe is stable only if every seed is, so seed 0 runs first: found unstable, the probe
  is recorded from it alone (the other seeds never run, the cost counts its steps only);
  found stable, every seed runs. --nofirst_seed_alone launches every seed at once."""
  from lnjax.sweep import stability, stability_report
  s = stability.Search(f"{REPO}/configs/lm.py:smoke", {}, str(tmp_path), placements=["pre"],
                       depths=[2], warmups=[0], seeds=3, range_steps=20, lr_min=1e-4,
                       lr_max=1.0, tolerance=1.4, widen=10.0,
                       stable=search.Stable(30, 2.0, 0.1), first_seed_alone=first_seed_alone)
  s.state["range_tests"]["pre/2"] = {"lo": 1e-3, "hi": 1e-1, "note": "n", "run": "r",
                                     "steps": 20}
  seeds = lambda runs: [(r.overrides["opt.learning_rate"], r.overrides["seed"]) for r in runs]
  runs = s.next_runs()
  assert seeds(runs) == ([(0.01, 0)] if first_seed_alone else [(0.01, 0), (0.01, 1), (0.01, 2)])
  _finish(s, runs[0], status="diverged", step=7, num_steps=30)
  s.record()
  probe = s.state["probes"]["pre/2/0"]["0.01"]
  assert probe["stable"] is False and probe["steps"] == 7
  assert probe["fails_by"] == "diverged at step 7"  # Stored; the report's column reads it.
  assert stability_report.rows(s)[0]["fails_by"] == "diverged at step 7"
  if first_seed_alone:
    assert probe["runs"] == [runs[0].name]
    assert probe["seeds"] == ["diverged at step 7"] + ["not run: another seed was unstable"] * 2
    assert stability_report.rows(s)[0]["probe_runs"] == 1
  runs = s.next_runs()  # Below 0.01: √(1e-3 · 0.01).
  assert seeds(runs)[0] == (0.00316, 0) and len(runs) == (1 if first_seed_alone else 3)
  _finish(s, runs[0], status="completed", step=30, num_steps=30, eval_loss=2.9,
          unigram_baseline=3.39)
  s.record()
  assert "0.00316" not in s.state["probes"]["pre/2/0"]  # Seeds 1 and 2 still to run.
  assert seeds(s.next_runs()) == [(0.00316, 1), (0.00316, 2)]  # Seed 0 is in the state.


def test_a_state_kept_apart_continues_in_a_new_workdir(tmp_path):
  """--state: the search's state outlives its WORKDIR (a repository keeps it); a new WORKDIR
  with no runs in it asks for the next probe, never one the state records, and keeps
  every recorded result."""
  from lnjax.sweep import stability

  def make(workdir):
    return stability.Search(f"{REPO}/configs/lm.py:smoke", {}, str(workdir),
                            placements=["pre"], depths=[2], warmups=[0], seeds=2,
                            range_steps=20, lr_min=1e-4, lr_max=1.0, tolerance=1.4,
                            widen=10.0, stable=search.Stable(30, 2.0, 0.1),
                            state_path=str(tmp_path / "kept" / "atlas.json"))
  first = make(tmp_path / "machine_a")
  first.state["range_tests"]["pre/2"] = {"lo": 1e-3, "hi": 1e-1, "note": "n", "run": "r",
                                         "steps": 20}
  first.state["probes"]["pre/2/0"] = {"0.01": {"stable": True, "runs": ["a"],
                                               "seeds": ["why"], "steps": 60}}
  first.save()
  assert not (tmp_path / "machine_a" / stability.STATE).exists()
  second = make(tmp_path / "machine_b")
  second.record()  # No run folder: nothing to add, nothing lost.
  assert second.state == first.state
  (run,) = second.next_runs()  # The range test is recorded: the next probe's seed 0 only.
  assert run.overrides["opt.learning_rate"] == 0.0316
  assert run.name == "norm=pre,layers=2,warmup=0,lr=0.0316,seed=0"


def test_a_new_workdir_keeps_the_finished_seeds_of_a_probe_still_undecided(tmp_path):
  """A probe's seed 0 held and seeds 1-2 have not run when the machine is lost: the state
  keeps seed 0's summary, so a new WORKDIR launches seeds 1-2 only, and the probe, once
  decided, is recorded from all three (its steps counted once) and the kept copy dropped."""
  from lnjax.sweep import stability

  def make(workdir):
    return stability.Search(f"{REPO}/configs/lm.py:smoke", {}, str(workdir),
                            placements=["pre"], depths=[2], warmups=[0], seeds=3,
                            range_steps=20, lr_min=1e-4, lr_max=1.0, tolerance=1.4,
                            widen=10.0, stable=search.Stable(30, 2.0, 0.1),
                            state_path=str(tmp_path / "kept.json"))
  first = make(tmp_path / "machine_a")
  first.state["range_tests"]["pre/2"] = {"lo": 1e-3, "hi": 1e-1, "note": "n", "run": "r",
                                         "steps": 20}
  first.save()
  (seed_0,) = first.next_runs()
  _finish(first, seed_0, status="completed", step=30, num_steps=30, eval_loss=2.9,
          unigram_baseline=3.39, wall_seconds=12.5, extra="not kept")
  first.record()
  assert first.state["probes"] == {}  # Undecided: seeds 1 and 2 have not run.
  kept = json.loads((tmp_path / "kept.json").read_text()).get(stability.SEEDS_SO_FAR)
  assert kept == {seed_0.name: {"status": "completed", "step": 30, "num_steps": 30,
                                "eval_loss": 2.9, "unigram_baseline": 3.39,
                                "wall_seconds": 12.5}}
  second = make(tmp_path / "machine_b")  # No run folder: seed 0 is known from the state.
  runs = second.next_runs()
  assert [r.overrides["seed"] for r in runs] == [1, 2]
  for run in runs:
    _finish(second, run, status="completed", step=30, num_steps=30, eval_loss=3.0,
            unigram_baseline=3.39, wall_seconds=10.0)
  second.record()
  probe = second.state["probes"]["pre/2/0"]["0.01"]
  assert probe["stable"] is True and probe["steps"] == 90 and probe["seconds"] == 32.5
  assert probe["runs"] == [seed_0.name] + [r.name for r in runs]
  assert stability.SEEDS_SO_FAR not in second.state  # Decided: the copy is dropped.
  assert [r.overrides["opt.learning_rate"] for r in second.next_runs()] == [0.0316]


def test_a_search_of_new_warmups_takes_the_range_tests_run_alike(tmp_path):
  """--range_tests_from: one range test serves every warm-up of its (placement, depth), so a
  search of a new warm-up takes the brackets another search's state holds and runs only
  the range tests it lacks; a state whose range tests ran otherwise is refused."""
  from lnjax.core import errors
  from lnjax.sweep import stability

  def make(name, depths, warmups, range_steps=20):
    return stability.Search(f"{REPO}/configs/lm.py:smoke", {}, str(tmp_path / name),
                            placements=["pre", "post"], depths=depths, warmups=warmups,
                            seeds=1, range_steps=range_steps, lr_min=1e-4, lr_max=1.0,
                            tolerance=1.4, widen=10.0, stable=search.Stable(30, 2.0, 0.1))
  first = make("no_warmup", [2], [0])
  first.state["range_tests"]["pre/2"] = {"lo": 1e-3, "hi": 1e-1, "note": "n",
                                         "run": "range_test,norm=pre,layers=2", "steps": 20}
  first.save()
  later = make("warmup", [2, 4], [50])
  assert later.borrow_range_tests([first.state_path]) == ["pre/2"]
  assert later.bracket("pre", 2) == search.Bracket(1e-3, 1e-1, "n")
  assert later.state["range_tests"]["pre/2"]["from"] == "search.json"
  assert sorted(r.name for r in later.next_runs() if r.name.startswith("range_test")) == [
      "range_test,norm=post,layers=2", "range_test,norm=post,layers=4",
      "range_test,norm=pre,layers=4"]
  assert later.borrow_range_tests([first.state_path]) == []  # Nothing left to take.
  with pytest.raises(errors.ConfigError, match="its range tests ran with --range_steps=20"):
    make("longer", [2], [50], range_steps=40).borrow_range_tests([first.state_path])


@pytest.mark.parametrize("inputs, message", [
    ({"placements": []}, "--placements is empty: name at least one, e.g. post,pre"),
    ({"depths": [0]}, "--depths=0: the model cannot be built with Post-LN: "
     "model.num_layers=0"),
    ({"warmups": [-5]}, "--warmups=-5: a warm-up is a number of steps, >= 0"),
])
def test_inputs_that_cannot_be_searched_are_refused_before_any_run(inputs, message):
  """stability.check_inputs, what the command checks before it writes or starts anything:
  no placement, a depth the model refuses (its own error), a negative warm-up."""
  from lnjax.core import errors
  from lnjax.sweep import stability
  args = {"placements": ["post", "pre"], "depths": [2], "warmups": [0], **inputs}
  with pytest.raises(errors.ConfigError) as refused:
    stability.check_inputs(f"{REPO}/configs/lm.py:smoke", {}, **args)
  assert str(refused.value).startswith(message)


@pytest.mark.slow
def test_a_refusal_is_one_line_exit_2_and_writes_nothing(tmp_path):
  """The command's refusal (--placements= is no placement): one line, exit 2, no WORKDIR."""
  out = _stability(tmp_path / "s", "--placements=", timeout=300)
  assert out.returncode == 2, out.stderr
  assert out.stderr.strip().splitlines() == [
      "lnjax.cli.stability: error: --placements is empty: name at least one, e.g. post,pre"]
  assert not (tmp_path / "s").exists()


def _refused(out, *words) -> str:
  """The command's one line on stderr, after checking it refused (exit 2) naming `words`."""
  assert out.returncode == 2, out.stderr
  (line,) = out.stderr.strip().splitlines()
  assert line.startswith("lnjax.cli.stability: error: "), line
  assert all(w in line for w in words), line
  return line


def _tree(root) -> dict:
  """Every file under `root`, relative path -> bytes."""
  return {os.path.relpath(os.path.join(d, f), root): open(os.path.join(d, f), "rb").read()
          for d, _, files in os.walk(root) for f in files}


@pytest.mark.slow
def test_a_training_runs_folder_is_refused_as_the_searchs_workdir(tmp_path):
  """A training run's folder (one that a search's search.json was left in, too) is no
  search's WORKDIR: the report and the search are refused in one line, exit 2, before
  search.json or runs/ is written into it."""
  run = tmp_path / "run"
  os.makedirs(run / "checkpoints" / "20")
  for name, text in (("config.json", "{}"), ("summary.json", '{"status": "completed"}'),
                     ("metrics.jsonl", '{"step": 1}\n'), ("checkpoints/20/x", "x")):
    (run / name).write_text(text)
  before = _tree(run)
  search_flags = ["--placements=pre", "--depths=2", "--seeds=1", "--probe_steps=2"]
  for flags in (["--report_only"], search_flags):
    _refused(_stability(run, *flags, timeout=300), f"--workdir={run} is the folder of the run")
    assert _tree(run) == before
  (run / "search.json").write_text(json.dumps({"settings": {}, "range_tests": {},
                                               "probes": {}}))
  before = _tree(run)
  _refused(_stability(run, "--report_only", timeout=300), "is the folder of the run")
  assert _tree(run) == before


@pytest.mark.slow
def test_a_state_file_that_is_not_a_search_state_is_refused_and_kept(tmp_path):
  """WORKDIR/search.json or --state=FILE that is not JSON, or JSON not of a search state's
  shape, is refused in one line naming it, exit 2, its bytes kept (it may hold a search's
  results): never replaced by a fresh state, no traceback."""
  cases = [("search.json", "garbage{\n"), ("search.json", '{"a": 1}'),
           ("kept.json", "[1, 2]"), ("kept.json", '{"settings": 5}')]
  for i, (name, text) in enumerate(cases):
    workdir = tmp_path / f"search{i}"
    state = (workdir if name == "search.json" else tmp_path) / name
    os.makedirs(state.parent, exist_ok=True)
    state.write_text(text)
    flags = [] if name == "search.json" else [f"--state={state}"]
    _refused(_stability(workdir, "--report_only", *flags, timeout=300),
             f"{state} is not a search state", "move it away", "afresh")
    assert state.read_text() == text
    if name == "search.json":
      assert os.listdir(workdir) == ["search.json"]
    else:
      assert not workdir.exists()


@pytest.mark.parametrize("text, why", [
    ("garbage{", "(Expecting value"), ("", "(Expecting value"), ("[1, 2]", "(not a JSON object)"),
    ('{"a": 1}', '(no "settings" object)'), ('{"settings": 5}', '(no "settings" object)'),
    ('{"settings": {}, "range_tests": {}, "probes": []}', '(no "probes" object)'),
    ('{"settings": {}, "range_tests": {"pre/2": {"lo": 0.1}}, "probes": {}}',
     '(range test "pre/2" is not a bracket'),
    ('{"settings": {}, "range_tests": {}, "probes": {"pre/2/0": {"fast": {}}}}',
     '(the probes of "pre/2/0" are not rates'),
    ('{"settings": {}, "range_tests": {}, "probes": {"pre/2/0": {"0.1": {"stable": 1}}}}',
     '(the probes of "pre/2/0" are not rates'),
    ('{"settings": {}, "range_tests": {}, "probes": {}, "seeds_so_far": {"r": 3}}',
     '("seeds_so_far" is not run summaries)'),
])
def test_a_state_is_read_only_in_the_shape_a_search_reads(tmp_path, text, why):
  """stability.read_state, what a search loads its state (and --range_tests_from's) with:
  no file is a new search; a file not of a state's shape is refused in one line naming it
  (a WorkdirError, exit 2), never read into a search that would fail on it."""
  from lnjax.core import errors
  from lnjax.sweep import stability
  state, _ = one_probe_left(tmp_path)
  assert stability.read_state(str(state)) == json.loads(state.read_text())
  assert stability.read_state(str(tmp_path / "none.json")) is None
  state.write_text(text)
  with pytest.raises(errors.WorkdirError) as refused:
    stability.read_state(str(state))
  assert str(refused.value).startswith(f"{state} is not a search state {why}")
  assert "move it away" in str(refused.value) and "\n" not in str(refused.value)
  with pytest.raises(errors.WorkdirError, match=r"^--range_tests_from=\S+ is not a search"):
    stability.read_state(str(state), flag="--range_tests_from")


@pytest.mark.slow
def test_a_workdir_that_is_a_file_is_refused(tmp_path):
  """--workdir naming a regular file: one line, exit 2, the file kept."""
  afile = tmp_path / "afile"
  afile.write_text("mine\n")
  _refused(_stability(afile, "--report_only", timeout=300),
           f"--workdir={afile} is a file, not a folder")
  assert afile.read_text() == "mine\n"


@pytest.mark.slow
def test_report_only_with_nothing_measured_says_so_and_launches_nothing(tmp_path):
  workdir = tmp_path / "search"
  out = _stability(workdir, "--placements=pre,post", "--probe_steps=20", "--report_only",
                   "--config.train.on_instability=skip", timeout=300)
  assert out.returncode == 0, out.stderr
  # The definition printed names the probes' recovery.
  assert "(train.on_instability=skip)" in out.stdout
  # Nothing measured yet: one line says so, and no report with empty axes is drawn.
  assert out.stdout.strip().splitlines()[-1] == (
      f"Nothing measured yet in {workdir}: no range test has finished; the same command "
      "without --report_only runs the search.")
  assert "-- round" not in out.stdout and not (workdir / "runs").exists()
  assert sorted(os.listdir(workdir)) == ["search.json"]  # (The new search's settings.)


def _launches(run_dir) -> int:
  with open(os.path.join(run_dir, "log.txt")) as f:
    return sum(line.startswith("=== ") and "sweep launch" in line for line in f)


@pytest.mark.slow
def test_smoke_search_writes_its_results_and_a_killed_search_resumes(tmp_path, monkeypatch):
  """One placement on the LM smoke preset, one seed, a tolerance wide enough that the range
  test's bracket is only checked at its ends (2 probes): killed once the range test is
  recorded, relaunched to the end, then continued again from what it recorded (the
  command's stability.run_search, in this process): nothing left to run."""
  workdir = tmp_path / "search"
  flags = ["--placements=pre", "--seeds=1", "--probe_steps=20", "--tolerance=1000",
           "--margin_nats=-1"]
  proc = forkserver.Popen(
      [sys.executable, "-m", "lnjax.cli.stability", "--config=configs/lm.py:smoke",
       f"--workdir={workdir}", *flags], cwd=REPO, stdout=subprocess.PIPE,
      stderr=subprocess.STDOUT, text=True)
  state_path = workdir / "search.json"
  deadline = time.monotonic() + 600
  while time.monotonic() < deadline and proc.poll() is None:
    state = json.loads(state_path.read_text()) if state_path.exists() else {}
    if state.get("range_tests"):
      break
    time.sleep(0.5)
  proc.send_signal(signal.SIGTERM)
  proc.communicate(timeout=600)
  state = json.loads(state_path.read_text())
  assert list(state["range_tests"]) == ["pre/2"]

  out = _stability(workdir, *flags, timeout=900)
  assert out.returncode == 0, out.stdout + out.stderr
  assert "stable: in each of 1 seed(s), the run finishes its warm-up and 20 steps after it" in out.stdout
  for name in ("stability.md", "stability.json", "stability.png", "search.json"):
    assert (workdir / name).stat().st_size > 0
  result = json.loads((workdir / "stability.json").read_text())
  (cell,) = result["cells"]
  assert cell["status"] in (search.FOUND, search.ABOVE, search.BELOW)
  assert cell["placement"] == "pre" and cell["depth"] == 2 and cell["warmup"] == 0
  assert "Pre-LN" in (workdir / "stability.md").read_text()
  runs = sorted(os.listdir(workdir / "runs"))
  probes = [r for r in runs if r.startswith("norm=pre")]
  assert len(probes) == len(cell["probes"]) >= 2
  # The range test finished before the kill and ran once; a probe launched twice is one
  # the kill stopped before it finished (at most the first).
  assert _launches(workdir / "runs" / "range_test,norm=pre,layers=2") == 1
  launches = {p: _launches(workdir / "runs" / p) for p in probes}
  assert sum(launches.values()) <= len(probes) + 1, launches

  from lnjax.sweep import stability
  monkeypatch.chdir(REPO)  # The config as the command named it, relative to its folder.
  settled = stability.Search(
      "configs/lm.py:smoke", {}, str(workdir), placements=["pre"], depths=[2], warmups=[0],
      seeds=1, range_steps=20, lr_min=1e-5, lr_max=1.0, tolerance=1000.0, widen=10.0,
      stable=search.Stable(20, 2.0, -1.0))  # The command's settings (else WorkdirError).
  assert settled.state == json.loads(state_path.read_text())

  def launch(_, again):
    raise AssertionError(f"a finished search launched {[r.name for r in again]}")
  stability.run_search(settled, launch)
  assert sorted(os.listdir(workdir / "runs")) == runs
  assert {p: _launches(workdir / "runs" / p) for p in probes} == launches


def test_the_commands_lists_take_each_value_once_and_refuse_an_empty_one():
  """`--warmups=0,0,500` measures two warm-ups (a line each, not three); `--depths=` is a
  mistake to name, not the config's depth."""
  from lnjax import cli
  from lnjax.core import errors
  assert cli.int_list("warmups", ["0", "0", "500"]) == [0, 500]
  with pytest.raises(errors.ConfigError, match="^--depths is empty"):
    cli.int_list("depths", [])
