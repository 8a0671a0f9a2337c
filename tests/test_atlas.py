"""experiments/atlas.py merges the slices' states into one table and figure without
training: from the committed 6-layer slice's state, in a folder of its own."""

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.slow
def test_the_atlas_tables_a_slice_from_its_state_and_says_what_is_not_yet(tmp_path):
  """The committed 6-layer state, less Pre-LN's stable probe: that cell is still searching,
  bounded only by the unstable rates above it."""
  states = tmp_path / "states"
  states.mkdir()
  with open(os.path.join(REPO, "experiments", "atlas", "d6.json")) as f:
    state = json.load(f)
  del state["probes"]["pre/6/0"]["0.0459"]
  (states / "d6.json").write_text(json.dumps(state))
  r = subprocess.run([sys.executable, "experiments/atlas.py", f"--states={states}",
                      f"--workdir={tmp_path / 'work'}", f"--figure={tmp_path / 'atlas.png'}"],
                     cwd=REPO, capture_output=True, text=True, timeout=300)
  assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
  report = (states / "atlas.md").read_text()  # Beside the states by default.
  assert "- d6 (every placement at 6 layers, no warm-up; probes of 300 steps): 13 of 14 " \
         "cells measured" in report
  assert "- d12 (every placement at 12 layers, no warm-up): not started" in report
  assert "Cells measured: 13 of the atlas's 84" in report
  assert re.search(r"Tabled by `python experiments/atlas.py` \(\d{4}-\d\d-\d\d \d\d:\d\d UTC\)",
                   report), report[:500]  # Its command and date.
  # The state's answers; the bound so far of the cell still searching; "not yet" in every
  # column no slice has measured.
  assert "| Post-LN | 0.0011 | not yet | not yet | not yet | not yet | not yet |" in report
  assert "| Pre-LN | searching: < 0.0714 | not yet | not yet | not yet | not yet | not yet |" \
         in report
  assert "| Sandwich-LN | 6 | 0 | 0.0447 |" in report and "| Pre-LN | 6 |" not in report
  assert os.path.getsize(tmp_path / "atlas.png") > 10_000
  assert sorted(os.listdir(states)) == ["atlas.md", "d6.json"]  # The state is not rewritten.
  assert json.loads((states / "d6.json").read_text()) == state


@pytest.mark.slow
def test_the_atlas_tables_the_warmups_lift_where_both_cells_are_measured(tmp_path):
  """The committed 6-layer slices with and without warm-up: each placement's edge after it
  over its edge without it (Post-LN 0.00644 / 0.0011, Pre-LN 0.173 / 0.0459); "—" at the
  depths neither slice measured."""
  states = tmp_path / "states"
  states.mkdir()
  for name in ("d6", "w500_d6"):
    shutil.copy(os.path.join(REPO, "experiments", "atlas", f"{name}.json"), states)
  r = subprocess.run([sys.executable, "experiments/atlas.py", f"--states={states}",
                      f"--workdir={tmp_path / 'work'}", f"--figure={tmp_path / 'atlas.png'}"],
                     cwd=REPO, capture_output=True, text=True, timeout=300)
  assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
  report = (states / "atlas.md").read_text()
  lifts = report[report.index("The warm-up's lift"):]
  assert "| placement | 6 layers | 12 layers | 24 layers |" in lifts
  assert "| Post-LN | 5.9× | — | — |" in lifts and "| Pre-LN | 3.8× | — | — |" in lifts
  assert "| nGPT | 1× | — | — |" in lifts  # 0.3 both: the search's ceiling.


@pytest.mark.slow  # (Fast tier: its other table tests.)
def test_a_warmup_slice_is_one_depth_borrows_its_range_tests_and_can_narrow_its_placements(
    tmp_path):
  """Each warm-up slice searches one depth (a round of probes runs at that depth's pace),
  borrows the range tests of the no-warm-up slice of its depth, and --placements narrows
  the run to the cells wanted first, in the slice's own state."""
  script = ("import json, sys; sys.argv = ['atlas', '--states=' + sys.argv[1], '--parallel=2']; "
            "sys.path.insert(0, 'experiments'); import atlas; from absl import flags; "
            "flags.FLAGS(sys.argv); print(json.dumps([atlas.search_command("
            "'w500_d6', 'W', False, ['post', 'pre']), atlas.search_command('w500_d24', 'W', "
            "True)]))")
  (tmp_path / "d6.json").write_text("{}")  # A 6-layer state to borrow from; no 24-layer one.
  r = subprocess.run([sys.executable, "-c", script, str(tmp_path)], cwd=REPO,
                     capture_output=True, text=True, timeout=120)
  assert r.returncode == 0, r.stderr[-3000:]
  narrowed, report = json.loads(r.stdout)
  assert "--placements=post,pre" in narrowed and "--depths=6" in narrowed
  assert "--warmups=500" in narrowed and f"--state={tmp_path}/w500_d6.json" in narrowed
  assert [f for f in narrowed if f.startswith("--parallel")] == ["--parallel=2"]
  assert f"--range_tests_from={tmp_path}/d6.json" in narrowed
  assert [f for f in report if f.startswith("--placements=")] == [
      "--placements=post,pre,sandwich,peri,deepnorm,normformer,resi_dual,admin,mix,b2t,dyt,"
      "lns,olmo2,ngpt"] and "--depths=24" in report and "--report_only" in report


@pytest.mark.slow
def test_stopping_a_slice_stops_its_search_and_the_search_its_run(tmp_path):
  """`--run` puts the search in its own place: SIGTERM to the command a user started stops
  the search (exit 128 + 15) and its run, which saves what it can; nothing is left running."""
  states, work = tmp_path / "states", tmp_path / "work"
  states.mkdir()
  shutil.copy(os.path.join(REPO, "experiments", "atlas", "d6.json"), states)  # Range tests.
  with open(tmp_path / "stderr.txt", "w+") as log:  # (Not a pipe: none is read while it runs.)
    proc = subprocess.Popen([sys.executable, "experiments/atlas.py", "--run=w500_d6",
                             "--placements=pre", f"--states={states}", f"--workdir={work}"],
                            cwd=REPO, stdout=subprocess.DEVNULL, stderr=log)
    deadline = time.monotonic() + 120
    while not list(work.glob("runs/norm=pre,*/log.txt")) and time.monotonic() < deadline:
      time.sleep(0.2)
    assert list(work.glob("runs/norm=pre,*/log.txt")), "no probe was launched"
    time.sleep(2)
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=120)
    log.seek(0)
    assert proc.returncode == 128 + signal.SIGTERM, log.read()[-3000:]
  left = subprocess.run(["pgrep", "-f", str(work)], capture_output=True, text=True).stdout
  assert not left, f"still running: {left}"
  assert (states / "w500_d6.json").exists()  # The slice's state, where --states says.


@pytest.mark.slow
def test_the_modern_blocks_slices_run_the_modern_block_in_their_own_states(tmp_path):
  """--block=modern: the same search settings as the 2020 atlas's 12-layer slices, the
  modern block's keys, states in experiments/atlas_modern (--states here), the warm-up
  slice borrowing the modern no-warm-up slice's range tests, never the 2020 block's."""
  script = ("import json, sys; sys.argv = ['atlas', '--block=modern', '--states=' + sys.argv[1]]; "
            "sys.path.insert(0, 'experiments'); import atlas; from absl import flags; "
            "flags.FLAGS(sys.argv); print(json.dumps([atlas.search_command("
            "'w500_d12', 'W', False, block='modern'), atlas.search_command('d12', 'W', True, "
            "block='2020'), atlas.states_dir('2020')]))")
  (tmp_path / "d12.json").write_text("{}")
  r = subprocess.run([sys.executable, "-c", script, str(tmp_path)], cwd=REPO,
                     capture_output=True, text=True, timeout=120)
  assert r.returncode == 0, r.stderr[-3000:]
  modern, older, older_states = json.loads(r.stdout)
  for flag in ("--config.model.pos_emb=rope", "--config.model.gated_ffn=true",
               "--config.model.activation=silu", "--config.model.norm_kind=rmsnorm",
               "--config.model.use_bias=false", "--depths=12", "--warmups=500",
               "--probe_steps=300", "--tolerance=2", "--seeds=2",
               f"--state={tmp_path}/w500_d12.json", f"--range_tests_from={tmp_path}/d12.json"):
    assert flag in modern, flag
  assert [f for f in modern if f.startswith("--placements=")][0].endswith(",ngpt,hybridnorm,derf")
  assert not any(f.startswith("--config.model.pos_emb") for f in older)
  assert [f for f in older if f.startswith("--placements=")][0].endswith(",olmo2,ngpt")
  assert older_states == os.path.join(REPO, "experiments", "atlas")
  assert f"--state={older_states}/d12.json" in older


def test_both_blocks_are_compared_by_rank_and_the_placements_that_move_are_named():
  sys.path.insert(0, os.path.join(REPO, "experiments"))
  import atlas_blocks
  cell = lambda lo, hi=None: {"highest_stable_lr": lo, "lowest_unstable_lr": hi or 2 * (lo or 1)}
  older = {("post", 12, 0): cell(1e-3), ("pre", 12, 0): cell(0.05), ("dyt", 12, 0): cell(4e-3),
           ("ngpt", 12, 0): cell(0.2)}
  newer = {("post", 12, 0): cell(2e-4), ("pre", 12, 0): cell(0.06), ("dyt", 12, 0): cell(0.05),
           ("ngpt", 12, 0): cell(0.1)}
  lines = atlas_blocks.comparison(older, newer, warmups=(0,))
  text = "\n".join(lines)
  # Ranks 1 2 3 4 (post, dyt, pre, ngpt) against 1 2 3 4 (post, dyt, pre, ngpt): ρ = 1.
  assert "warm-up 0: Spearman's rank correlation 1.00 over 4 placements" in text
  assert "| Post-LN | 0 | 0.001 | 0.0002 | 0.2× | -2.3 |" in text
  movers = [l for l in lines if l.startswith("- ")]
  assert [m.split(":")[0] for m in movers] == ["- Post-LN, warm-up 0", "- DyT, warm-up 0"]
  assert "lower on the modern block by 2.3 steps" in movers[0]
  assert "higher on the modern block by 3.6 steps" in movers[1]
  assert atlas_blocks.spearman([1, 2, 3, 4], [10, 20, 40, 30]) == pytest.approx(0.8)
  # A cell still searching shows the words it is given; one with no probe yet, 'not yet'.
  pending = ({("derf", 12, 0): "searching: < 0.0197"}, {})
  text = "\n".join(atlas_blocks.comparison(older, newer, warmups=(0,), pending=pending))
  assert "| Derf | 0 | searching: < 0.0197 | not yet | — | — |" in text
  assert "| HybridNorm | 0 | not yet | not yet | — | — |" in text


def test_a_cell_without_a_stable_rate_bounds_the_move_by_its_lowest_unstable_rate():
  """2020 Post-LN learned at no rate tried (lowest unstable 1e-5, the search's floor): the
  modern 2e-4 is more than 20× it, not 40× (the halved rate only ranks it); two bounds give
  no ratio; a mover's range comes from both brackets."""
  sys.path.insert(0, os.path.join(REPO, "experiments"))
  import atlas_blocks
  bound = {"highest_stable_lr": None, "lowest_unstable_lr": 1e-5}
  older = {("post", 12, 0): bound, ("admin", 12, 0): bound,
           ("ngpt", 12, 0): {"highest_stable_lr": 0.231, "lowest_unstable_lr": 0.445}}
  newer = {("post", 12, 0): {"highest_stable_lr": 2e-4, "lowest_unstable_lr": 3.66e-4},
           ("admin", 12, 0): bound,
           ("ngpt", 12, 0): {"highest_stable_lr": 0.0552, "lowest_unstable_lr": 0.0937}}
  text = "\n".join(atlas_blocks.comparison(older, newer, warmups=(0,)))
  assert "| Post-LN | 0 | < 1e-05 | 0.0002 | > 20× | > +4.3 |" in text
  assert "| Admin | 0 | < 1e-05 | < 1e-05 | — | — |" in text
  assert "higher on the modern block by more than 4.3 steps (a bound" in text
  assert "lower on the modern block by 2.1 steps (from the brackets, 1.3 to 3.0)" in text
