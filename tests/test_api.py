"""The Python API (lnjax/api.py, docs/api.md), the `lnjax` command (lnjax/cli/console.py) and
configs named from any directory; the wheel installed in a fresh virtual environment."""

import os
import pathlib
import re
import subprocess
import sys
import zipfile

import pytest

import lnjax
from lnjax import configs
from lnjax.core import errors

REPO = pathlib.Path(__file__).resolve().parents[1]


def _env(**extra) -> dict:
  return {**os.environ, "PYTHONPATH": str(REPO), **extra}


def test_import_lnjax_loads_no_jax_and_names_the_api():
  code = ("import sys, lnjax; heavy = sorted({m.split('.')[0] for m in sys.modules} & "
          "{'jax', 'flax', 'optax', 'ml_collections'}); "
          "print(heavy, ','.join(lnjax.__all__))")
  r = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True,
                     timeout=120, env={"JAX_PLATFORMS": "cpu", "PATH": "/usr/bin:/bin"})
  assert r.returncode == 0, r.stderr[-2000:]
  assert r.stdout.split() == ["[]", "get_config,train,load,analyze,compare"], r.stdout


def test_the_api_is_functions_of_lnjax_api():
  from lnjax import api
  for name in lnjax.__all__:
    assert getattr(lnjax, name) is getattr(api, name) and callable(getattr(api, name)), name
  with pytest.raises(AttributeError, match="no attribute 'nosuch'"):
    lnjax.nosuch


def test_get_config_by_name_by_path_and_refused():
  by_name = lnjax.get_config("lm", "norm=post,smoke")
  by_path = lnjax.get_config(str(REPO / "configs" / "lm.py"), "norm=post,smoke")
  assert by_name.to_dict() == by_path.to_dict()
  assert by_name.model.norm_position == "post" and by_name.train.num_steps == 20
  assert lnjax.get_config("default").train.num_steps == 1000
  with pytest.raises(errors.ConfigError, match="shipped config"):
    lnjax.get_config("lm_large")
  with pytest.raises(errors.ConfigError, match="unknown preset"):
    lnjax.get_config("lm", "norm=post,huge")


def test_config_names_resolve_to_the_package_and_paths_stay():
  assert "default" in configs.names() and "__init__" not in configs.names()
  assert configs.resolve("lm:norm=post") == os.path.join(configs.FOLDER, "lm.py") + ":norm=post"
  assert configs.resolve("default") == os.path.join(configs.FOLDER, "default.py")
  for arg in ("configs/lm.py:smoke", "lm.py", "/abs/x.py:a=b", "no_such_config:smoke"):
    assert configs.resolve(arg) == arg
  # The top-level configs/ of a clone is the package's folder.
  assert (REPO / "configs" / "lm.py").samefile(pathlib.Path(configs.FOLDER) / "lm.py")


@pytest.mark.slow
def test_console_dispatches_and_names_configs_from_another_directory(tmp_path):
  r = subprocess.run([sys.executable, "-m", "lnjax.cli.console", "train",
                      "--config=lm:norm=post,smoke", "--print_config"], cwd=tmp_path,
                     env=_env(), capture_output=True, text=True, timeout=300)
  assert r.returncode == 0, r.stderr[-2000:]
  assert re.search(r"norm_position = 'post'", r.stdout), r.stdout[:2000]
  assert re.search(r"num_steps = 20\b", r.stdout), r.stdout[:2000]
  r = subprocess.run([sys.executable, "-m", "lnjax.cli.console", "trian"], cwd=tmp_path,
                     env=_env(), capture_output=True, text=True, timeout=120)
  assert r.returncode == 2 and "unknown command 'trian'" in r.stderr, r.stderr
  assert "python -m lnjax.cli.average" in r.stderr  # The usage lists every subcommand.


def _doc_example(workdir) -> str:
  text = (REPO / "docs" / "api.md").read_text()
  code = re.search(r"```python\n(.*?)```", text, re.S).group(1)
  assert 'workdir = "/tmp/lnjax_api"' in code
  return code.replace('"/tmp/lnjax_api"', repr(str(workdir)))


@pytest.mark.slow
def test_the_documented_api_example_runs(tmp_path):
  r = subprocess.run([sys.executable, "-c", _doc_example(tmp_path / "run")], cwd=tmp_path,
                     env=_env(), capture_output=True, text=True, timeout=900)
  assert r.returncode == 0, r.stderr[-3000:]
  out = r.stdout.splitlines()
  assert "completed 10" in r.stdout, r.stdout[-2000:]
  vocab = lnjax.load(str(tmp_path / "run")).config.model.vocab_size
  assert any(l.startswith(f"step10 (19, {vocab})") for l in out), r.stdout[-2000:]
  assert (tmp_path / "run" / "analysis" / "10" / "analysis.json").is_file()
  assert (tmp_path / "run_compare.png").is_file()


@pytest.mark.slow
def test_load_gives_the_checkpoints_parameters_and_the_tokenizer(tmp_path):
  config = lnjax.get_config("default", "smoke")
  with config.unlocked():
    config.mesh.data = 1
  summary = lnjax.train(config, str(tmp_path))
  run = lnjax.load(str(tmp_path), checkpoint=10)
  assert summary["status"] == "completed" and run.step == 10 and run.label == "step10"
  text = "To be, or not to be"
  assert run.decode(run.encode(text)) == text
  import numpy as np
  logits_TxV = run.logits(text)
  assert logits_TxV.shape == (len(text), config.model.d_model and run.config.model.vocab_size)
  batch = run.logits(np.stack([run.encode(text)] * 2))
  np.testing.assert_allclose(batch[1], logits_TxV, rtol=1e-5, atol=1e-5)
  assert not np.allclose(lnjax.load(str(tmp_path)).logits(text), logits_TxV)  # step 20


def _venv_seeing_these_packages(venv):
  """A new venv whose python also sees the packages of the interpreter running the tests
  (its site directories, their .pth files processed), after the venv's own.
  `--system-site-packages` would give the base interpreter's: inside a virtual environment
  (the README's install), not the ones installed there (the `lnjax` command then died with
  "No module named 'absl'")."""
  import site
  import sysconfig

  # (No pip of its own: the tests' pip installs into it, `pip --python`; ensurepip cost 3.6 s.)
  subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True,
                 timeout=300)
  r = subprocess.run([str(venv / "bin" / "python"), "-c",
                      "import sysconfig; print(sysconfig.get_path('purelib'))"],
                     capture_output=True, text=True, check=True, timeout=120)
  dirs = [*site.getsitepackages(), *([site.getusersitepackages()] if site.ENABLE_USER_SITE
                                     else []), sysconfig.get_path("purelib")]
  dirs = [d for d in dict.fromkeys(dirs) if os.path.isdir(d)]
  pathlib.Path(r.stdout.strip(), "lnjax_test_parent_env.pth").write_text(
      "".join(f"import site; site.addsitedir({d!r})\n" for d in dirs))
  return venv


@pytest.mark.slow
def test_the_wheel_installs_the_command_and_the_configs(tmp_path):
  """pip wheel, a fresh venv (the heavy dependencies from this interpreter's site
  directories), then `lnjax train --config=default:smoke` from an empty directory."""
  src = tmp_path / "src"
  ignore = __import__("shutil").ignore_patterns("__pycache__", "*.pyc")
  for name in ("lnjax", "pyproject.toml", "README.md"):
    path = REPO / name
    if path.is_dir():
      __import__("shutil").copytree(path, src / name, ignore=ignore)
    else:
      __import__("shutil").copy2(path, src / name)
  r = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                      "-w", str(tmp_path / "dist"), str(src)], capture_output=True, text=True,
                     timeout=600)
  assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
  wheel, = (tmp_path / "dist").glob("lnjax-*.whl")
  names = zipfile.ZipFile(wheel).namelist()
  assert "lnjax/configs/default.py" in names and "lnjax/configs/lm.py" in names
  assert any(n.endswith("entry_points.txt") for n in names)
  venv = _venv_seeing_these_packages(tmp_path / "venv")
  r = subprocess.run([sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"),
                      "install", "--no-deps", str(wheel)], capture_output=True, text=True,
                     timeout=600)
  assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
  empty = tmp_path / "empty"
  empty.mkdir()
  env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
  r = subprocess.run([str(venv / "bin" / "lnjax"), "train", "--config=default:smoke",
                      f"--workdir={tmp_path / 'run'}", "--config.mesh.data=1"], cwd=empty,
                     env=env, capture_output=True, text=True, timeout=900)
  assert r.returncode == 0, r.stderr[-3000:]
  assert "completed at step 20/20" in r.stdout
  assert (tmp_path / "run" / "summary.json").is_file()
  r = subprocess.run([str(venv / "bin" / "python"), "-c", "import lnjax; print(lnjax.__file__)"],
                     cwd=empty, env=env, capture_output=True, text=True, timeout=120)
  assert r.stdout.strip().startswith(str(venv)), r.stdout  # The wheel's, not the clone's.


@pytest.mark.slow
def test_every_commands_help_exits_0(tmp_path):
  """`lnjax COMMAND --help` prints the command's flags and exits 0 (absl's own help exits
  1), for every command of the console: each a process of its own, forked from the tests'
  warm launcher (tests/forkserver.py), which has defined no command's flags."""
  import concurrent.futures
  import forkserver
  from lnjax.cli import console

  def help_of(name):
    return forkserver.run([sys.executable, "-m", "lnjax.cli.console", name, "--help"],
                          capture_output=True, text=True, timeout=300)

  with concurrent.futures.ThreadPoolExecutor(2) as pool:
    results = dict(zip(console.COMMANDS, pool.map(help_of, console.COMMANDS)))
  for name, r in results.items():
    assert r.returncode == 0 and "--" in r.stdout, (name, r.returncode, r.stderr[-500:])
