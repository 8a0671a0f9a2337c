"""One error contract for every command (lnjax/cli/__init__.py): a bad flag, an unknown
config key or preset, and a config file that fails to load end in exit code 2 and one line
on stderr, no traceback, for every `python -m lnjax.…` entry point. They fail before JAX
compiles."""

import concurrent.futures
import os
import pathlib
import re
import subprocess
import sys

import pytest
import forkserver

REPO = pathlib.Path(__file__).resolve().parents[1]

# Every entry point, with the flags it needs besides the one under test (so that the error
# reported is that one, not a missing flag). True: it takes --config.
COMMANDS = {
    "lnjax.main": (True, ["--workdir=W"]),
    "lnjax.cli.finetune": (True, ["--workdir=W"]),
    "lnjax.cli.sweep": (True, ["--workdir=W", "--sweep=course"]),
    "lnjax.cli.stability": (True, ["--workdir=W"]),
    "lnjax.cli.translate": (False, ["--workdir=W"]),
    "lnjax.cli.export": (False, ["--workdir=W"]),
    "lnjax.cli.average": (False, ["--workdir=W"]),
    "lnjax.cli.analyze": (False, ["--workdir=W"]),
    "lnjax.cli.compare": (False, []),
    "lnjax.cli.prepare": (False, ["iwslt14_de_en"]),
    "lnjax.cli.compile": (True, ["--topology=v5e:2x2"]),
}
CONSOLE = ["lnjax.cli.console", "train"]  # The `lnjax` command hands its flags to lnjax.main.
INTERNAL = {"lnjax.sweep.ray_driver"}  # The Ray driver a sweep starts (its spec on stdin).
# Commands that import JAX before parsing their flags (3-4 s of CPU each): the slow tier.
IMPORT_JAX = {"lnjax.cli.average", "lnjax.cli.compare", "lnjax.cli.prepare",
              "lnjax.cli.compile"}


def _entry_points() -> set[str]:
  found = set()
  for path in (REPO / "lnjax").rglob("*.py"):
    module = ".".join(path.relative_to(REPO).with_suffix("").parts)
    if path.name == "__main__.py":
      found.add(module.removesuffix(".__main__"))
    elif re.search(r'^if __name__ == "__main__":', path.read_text(), re.M):
      found.add(module)
  return found - INTERNAL


def _run_all(cases: list[tuple[list[str], str]], tmp_path) -> list[str]:
  """Runs each (command + args, text its error line must contain) at once; the failures."""
  def one(case):
    argv, expected = case
    argv = [a.replace("W", str(tmp_path / "wd")) if a == "--workdir=W" else a for a in argv]
    r = forkserver.run([sys.executable, "-m", *argv], cwd=REPO, capture_output=True,
                       text=True, timeout=300, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    lines = r.stderr.splitlines()
    if (r.returncode != 2 or len(lines) != 1 or "Traceback" in r.stderr
        or expected not in lines[0] or not lines[0].startswith("lnjax")):
      return f"{' '.join(argv)}: exit {r.returncode}, stderr {r.stderr[-600:]!r}"
    return None

  with concurrent.futures.ThreadPoolExecutor(4) as pool:
    return [f for f in pool.map(one, cases) if f]


def _argv(module: str) -> list[list[str]]:
  """How each command is started: its module, and lnjax.main through the console too."""
  return [[module, *COMMANDS[module][1]]] + (
      [[*CONSOLE, *COMMANDS[module][1]]] if module == "lnjax.main" else [])


def test_every_entry_point_is_covered():
  assert _entry_points() == set(COMMANDS) | {CONSOLE[0]}


@pytest.mark.parametrize("which", [  # The fast tier: lnjax.main, itself and through `lnjax`.
    "main", pytest.param("others", marks=pytest.mark.slow)])
def test_a_bad_flag(which, tmp_path):
  cases = [(argv + ["--nosuch=1"], "nosuch")
           for m in COMMANDS if m not in IMPORT_JAX and (m == "lnjax.main") == (which == "main")
           for argv in _argv(m)]
  assert cases and not _run_all(cases, tmp_path)


@pytest.mark.slow
def test_a_config_file_that_fails_to_load(tmp_path):
  bad = tmp_path / "bad.py"
  bad.write_text("def get_config(arg=None):\n  return {\n")
  cases = [(argv + [f"--config={bad}"], "never closed")
           for m, (takes_config, _) in COMMANDS.items() if takes_config for argv in _argv(m)]
  assert not _run_all(cases, tmp_path)


@pytest.mark.slow
def test_an_unknown_config_key_or_preset(tmp_path):
  """The shipped configs (loading one imports JAX): a key no section has (the fine-tuning
  driver's own section too), a preset get_config refuses; commands without --config refuse
  the flag itself (the commands that import JAX first: a bad flag, the same parse)."""
  bad = tmp_path / "bad.py"
  bad.write_text("def get_config(arg=None):\n  return {\n")
  cases = [([m, *COMMANDS[m][1], "--nosuch=1"], "nosuch") for m in IMPORT_JAX]
  for m, (takes_config, args) in COMMANDS.items():
    if m in IMPORT_JAX:
      continue
    config = "configs/glue.py:task=mrpc" if m == "lnjax.cli.finetune" else "configs/lm.py:smoke"
    cases += [([m, *args, f"--config={config}", "--config.nosuch=1"],
               "nosuch" if takes_config else "config"),
              ([m, *args, "--config=configs/glue.py:task=cola"],
               "cola" if takes_config else "config")]
    if m == "lnjax.cli.finetune":
      cases.append(([m, *args, f"--config={config}", "--config.finetune.nosuch=1"],
                    "finetune.nosuch"))
    if not takes_config:
      cases.append(([m, *args, f"--config={bad}"], "config"))
  assert not _run_all(cases, tmp_path)


@pytest.mark.slow  # A command line that imports JAX.
def test_every_command_freezes_what_its_imports_made_once_its_flags_parse(tmp_path):
  """cli.parse_flags, which every entry point hands to app.run, gc.freezes what the command's
  imports and its config file made: a sweep's launcher (`--dry_run` of two runs) 2.06-2.11
  -> 1.80-1.91 CPU s, 2026-12-07. One command line shows the freeze, called once its flags
  parse even where main then refuses; the sources show every entry point on that path."""
  for module in COMMANDS:
    source = (REPO / (module.replace(".", "/") + ".py")).read_text()
    assert "cli.parse_flags" in source, module
  script = tmp_path / "freeze.py"
  script.write_text(
      "import gc, os, runpy, sys\n_freeze = gc.freeze\n"
      "def freeze():\n  os.write(2, b'gc.freeze\\n')\n  _freeze()\n"
      "gc.freeze = freeze\n"
      f"sys.argv = ['lnjax.cli.sweep', '--workdir={tmp_path / 'w'}', "
      "'--config=configs/lm.py:smoke']\n"
      "runpy.run_module('lnjax.cli.sweep', run_name='__main__', alter_sys=True)\n")
  r = subprocess.run([sys.executable, str(script)], cwd=REPO, capture_output=True, text=True,
                     timeout=300)
  assert r.returncode == 2 and r.stderr.startswith("gc.freeze\nlnjax.cli.sweep: error: --sweep"), \
      r.stderr[-2000:]


def test_a_command_leaves_its_imports_out_of_the_garbage_collections():
  """lnjax.main turns collection off while it imports and, once it has, freezes what is
  alive (cli.freeze_imports) and turns it back on: later collections and the teardown no
  longer walk every imported module's objects."""
  import gc
  from lnjax import cli

  gc.disable()
  try:
    cli.freeze_imports()
    assert gc.isenabled() and gc.get_freeze_count() > 0
  finally:
    gc.unfreeze()
    gc.enable()
