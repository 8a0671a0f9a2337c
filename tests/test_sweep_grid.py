"""--grid: a sweep on the command line (lnjax/sweep/grid.py), no get_sweep needed."""

import os
import subprocess
import sys

import pytest

from lnjax import sweep
from lnjax.core import errors
from lnjax.sweep import grid

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LM_SMOKE = os.path.join(REPO, "configs", "lm.py") + ":smoke"


def test_grid_is_the_product_with_values_of_the_configs_types():
  runs = grid.runs(LM_SMOKE, "model.norm_position=pre,post opt.learning_rate=1e-3,3e-3",
                   {"train.num_steps": 7})
  assert [r.name for r in runs] == ["norm=pre,lr=0.001", "norm=pre,lr=0.003",
                                    "norm=post,lr=0.001", "norm=post,lr=0.003"]
  assert runs[3].overrides == {"model.norm_position": "post", "opt.learning_rate": 0.003}
  assert [r.setting("train.num_steps") for r in runs] == [7] * 4
  assert runs[1].setting("model.num_layers") == 2  # The smoke preset's, untouched.
  base = sweep.base_config(LM_SMOKE)
  assert grid.parse("train.num_steps=5,10 model.scan_layers=true", base) == [
      {"train.num_steps": 5, "model.scan_layers": True},
      {"train.num_steps": 10, "model.scan_layers": True}]
  assert isinstance(grid.parse("opt.learning_rate=1", base)[0]["opt.learning_rate"], float)


@pytest.mark.parametrize("text,message", [
    ("opt.lr=1e-3", "unknown config key opt.lr"),
    ("train.num_steps=0.5", "is not a int"),
    ("model.norm_position", "must be KEY=VALUE"),
    ("model.norm_position=pre,,post", "must be KEY=VALUE"),
    ("opt=adam", "is a section"),
    ("", "is empty"),
])
def test_grid_refuses_bad_items(text, message):
  with pytest.raises(errors.ConfigError, match=message):
    grid.parse(text, sweep.base_config(LM_SMOKE))


def test_a_placement_swept_by_key_resolves_as_its_norm_preset():
  """--grid='model.norm_position=...' on configs/llama.py:family=qwen3 gives each run the
  config family=qwen3,norm=P resolves to: Qwen3's QK-norm off under olmo2, ngpt and
  hybridnorm (their own QK-norms), on under the others (the grid's olmo2, ngpt and
  hybridnorm runs were refused, qk_norm=True fixed when the preset was read). A
  model.qk_norm=True given with such a placement is still refused, and the grid reads
  model.qk_norm's values as booleans."""
  from configs import llama
  from lnjax import models, tasks
  from lnjax.core import run as run_lib
  qwen3 = os.path.join(REPO, "configs", "llama.py") + ":family=qwen3,smoke"
  runs = grid.runs(qwen3, "model.norm_position=" + ",".join(models.NORM_POSITIONS))
  for r in runs:
    norm = r.overrides["model.norm_position"]
    by_key = run_lib.resolve_config(r.config, tasks=tasks.get)
    by_preset = run_lib.resolve_config(llama.get_config(f"family=qwen3,norm={norm},smoke"),
                                       tasks=tasks.get)
    assert by_key == by_preset, norm
    assert by_key.model.qk_norm == (norm not in models.OWN_QK_NORM), norm
  for norm in models.OWN_QK_NORM:
    for arg, fixed in ((qwen3, {"model.norm_position": norm}),
                       (f"{qwen3[:-len('smoke')]}norm={norm},smoke", {})):
      config = sweep.base_config(arg, {**fixed, "model.qk_norm": True})
      with pytest.raises(errors.ConfigError, match=f"model.qk_norm=True with norm_position="
                                                   f"'{norm}', which normalizes q and k"):
        run_lib.resolve_config(config, tasks=tasks.get)
  assert grid.parse("model.qk_norm=true,false", sweep.base_config(qwen3)) == [
      {"model.qk_norm": True}, {"model.qk_norm": False}]


def _sweep(tmp_path, *args):
  return subprocess.run([sys.executable, "-m", "lnjax.cli.sweep",
                         f"--workdir={tmp_path / 'grid'}", *args], cwd=tmp_path,
                        capture_output=True, text=True, timeout=300,
                        env={**os.environ, "PYTHONPATH": REPO})


@pytest.mark.slow
def test_grid_on_the_command_line_without_sweep(tmp_path):
  """--grid without --sweep: the runs and their commands (--dry_run, the smoke preset named
  as lm:smoke from another folder); --grid with --sweep is refused, whatever the config (a
  config file without JAX: the refusal comes before any run is built)."""
  r = _sweep(tmp_path, "--config=lm:smoke", "--grid",
             "model.norm_position=pre,post opt.learning_rate=1e-3,3e-3",
             "--config.train.num_steps=9", "--dry_run")
  assert r.returncode == 0, r.stderr[-2000:]
  names = [l for l in r.stdout.splitlines() if l and not l.startswith(" ")]
  assert names == ["norm=pre,lr=0.001", "norm=pre,lr=0.003", "norm=post,lr=0.001",
                   "norm=post,lr=0.003"], r.stdout
  assert "--config.model.norm_position=post --config.opt.learning_rate=0.003" in r.stdout
  assert r.stdout.count("--config.train.num_steps=9") == 4
  plain = tmp_path / "plain_config.py"
  plain.write_text("import ml_collections\n\n\ndef get_config(arg=None):\n"
                   "  return ml_collections.ConfigDict({'opt': {'learning_rate': 1e-3}})\n")
  both = _sweep(tmp_path, f"--config={plain}", "--grid=opt.learning_rate=1e-3",
                "--sweep=seeds", "--dry_run")
  assert both.returncode == 2, both.stderr
  assert both.stderr.strip().splitlines() == [
      "lnjax.cli.sweep: error: give --sweep=NAME (the config's get_sweep) or "
      "--grid='KEY=V1,V2 ...', not both"], both.stderr


QWEN3_GRID = "model.norm_position=pre,olmo2 model.qk_norm=true,false"  # OLMo 2 has its own.


def test_the_preflight_resolves_each_runs_config_and_names_the_first_refused():
  """Every run's config resolved as lnjax.main will: family=qwen3 × QWEN3_GRID's
  norm=olmo2,qk_norm=True (a second QK-norm) is refused in one line naming it; the grid
  without it passes."""
  from lnjax.sweep import preflight
  qwen3 = os.path.join(REPO, "configs", "llama.py") + ":family=qwen3,smoke"
  with pytest.raises(errors.ConfigError) as e:
    preflight.resolve(grid.runs(qwen3, QWEN3_GRID))
  assert str(e.value) == (
      "run norm=olmo2,qk_norm=True would be refused: model.qk_norm=True with "
      "norm_position='olmo2', which normalizes q and k its own way: set model.qk_norm=False "
      "(1 of the 4 runs; none started)")
  preflight.resolve(grid.runs(qwen3, "model.norm_position=pre,olmo2"))


@pytest.mark.slow
def test_a_sweep_with_a_run_lnjax_main_would_refuse_is_refused_before_any_run(tmp_path):
  """A grid whose one point lnjax.main refuses (QWEN3_GRID on family=qwen3): --dry_run
  refuses it in one line naming that run, exit 2, and so does the launch, before any run
  starts or the workdir is written."""
  qwen3 = f"--config={REPO}/configs/llama.py:family=qwen3,smoke"
  for dry_run in (["--dry_run"], []):
    r = _sweep(tmp_path, qwen3, f"--grid={QWEN3_GRID}", *dry_run)
    assert r.returncode == 2, r.stdout[-2000:] + r.stderr[-2000:]
    assert r.stdout == "" and r.stderr.strip().splitlines() == [
        "lnjax.cli.sweep: error: run norm=olmo2,qk_norm=True would be refused: model.qk_norm="
        "True with norm_position='olmo2', which normalizes q and k its own way: set "
        "model.qk_norm=False (1 of the 4 runs; none started)"], r.stderr
    assert not (tmp_path / "grid").exists()
