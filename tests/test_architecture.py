"""The layering, by folder: no import cycle; the core (lnjax/core/) imports neither the task
registry nor a task plug-in (the entry points hand it the registry's lookup), nor any data
set, evaluator, analysis, Hugging Face, sweep or command module, and loads no heavy
library; every command lives in lnjax/cli/ (lnjax.main aside) and no lnjax module imports
one; no module is named like a folder beside it; modules small enough to read."""

import ast
import pathlib
import re
import subprocess
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]
PACKAGE = REPO / "lnjax"

# The layers: lnjax/<folder>/; at the top only the package, its API and the training command.
LAYERS = ("core", "models", "tasks", "data", "inference", "analysis", "hf", "sweep", "configs",
          "cli")
TOP = ("lnjax", "lnjax.api", "lnjax.main")
# What the core may import besides itself: the models. Not the task registry: the entry
# points above the core (lnjax.main, lnjax.api, lnjax/cli/, ...) hand its lookup in
# (`tasks=lnjax.tasks.get`), and the core reads the task off the resolved run.
CORE_MAY_IMPORT = ("lnjax.core", "lnjax.models")
COMMANDS_OUTSIDE_CLI = {"lnjax.main",  # `python -m lnjax.main`, the training command.
                        "lnjax.sweep.ray_driver"}  # What a Ray sweep starts on a node.
HEAVY = ("tensorflow_datasets", "grain", "sentencepiece", "sacrebleu", "datasets")


def _module_name(path: pathlib.Path) -> str:
  parts = list(path.relative_to(REPO).with_suffix("").parts)
  if parts[-1] == "__init__":
    parts = parts[:-1]
  return ".".join(parts)


def _modules() -> dict[str, pathlib.Path]:
  return {_module_name(p): p for p in PACKAGE.rglob("*.py")}


def _imports(name: str, path: pathlib.Path, known) -> set[str]:
  """The lnjax modules ``name`` imports, at module level or inside functions."""
  out = set()
  is_pkg = path.name == "__init__.py"
  for node in ast.walk(ast.parse(path.read_text())):
    if isinstance(node, ast.Import):
      targets = [a.name for a in node.names]
    elif isinstance(node, ast.ImportFrom):
      base = node.module or ""
      if node.level:
        pkg = name.split(".") if is_pkg else name.split(".")[:-1]
        pkg = pkg[: len(pkg) - (node.level - 1)]
        base = ".".join(pkg + ([base] if base else []))
      targets = [base] + [f"{base}.{a.name}" for a in node.names]
    else:
      continue
    for t in targets:
      # "from lnjax import x" names module lnjax.x; "import lnjax.a.b" imports lnjax.a.b.
      while t and t not in known:
        t = t.rpartition(".")[0]
      if t and t != name and t != "lnjax":
        out.add(t)
  return out


def test_no_import_cycle_among_lnjax_modules():
  mods = _modules()
  graph = {m: _imports(m, p, mods) for m, p in mods.items()}
  # A package's __init__ imported through one of its modules is not a cycle of that
  # module: drop edges from a module to its own parent packages.
  graph = {m: {t for t in ts if not m.startswith(t + ".")} for m, ts in graph.items()}
  state, stack, cycles = {}, [], []

  def visit(m):
    state[m] = "open"
    stack.append(m)
    for t in sorted(graph.get(m, ())):
      if state.get(t) == "open":
        cycles.append(stack[stack.index(t):] + [t])
      elif t not in state:
        visit(t)
    stack.pop()
    state[m] = "done"

  for m in sorted(graph):
    if m not in state:
      visit(m)
  assert not cycles, "import cycles:\n" + "\n".join(" -> ".join(c) for c in cycles)


# Each module's imports in a fresh interpreter; one for all of them: what importing them
# together loads is the union of what each loads alone.
CORE_ENTRY_POINTS = ("lnjax", "lnjax.core.state", "lnjax.core.train", "lnjax.core.checkpoint",
                     "lnjax.tasks")


@pytest.mark.slow  # Starts a Python process.
def test_the_core_loads_no_data_set_tokenizer_or_evaluator_and_leaves_the_allocator_alone():
  """Importing the package, the training loop, the checkpoints and the task registry loads
  none of the heavy data libraries and does not tune glibc malloc (the commands do)."""
  code = (f"import sys, {', '.join(CORE_ENTRY_POINTS)}, lnjax.core.allocator as a; "
          f"heavy = {HEAVY!r}; "
          "print(sorted({m.split('.')[0] for m in sys.modules} & set(heavy))); "
          "print('tuned' if a._applied else 'untouched')")
  r = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True,
                     timeout=120, env={"JAX_PLATFORMS": "cpu", "PATH": "/usr/bin:/bin"})
  assert r.returncode == 0, r.stderr[-2000:]
  assert r.stdout.split("\n")[:2] == ["[]", "untouched"], r.stdout


def test_every_module_sits_in_a_layer_folder():
  loose = [m for m in _modules() if m not in TOP and m.split(".")[1] not in LAYERS]
  assert not loose, f"modules outside lnjax/{{{','.join(LAYERS)}}}/: {loose}"


def test_the_core_imports_only_the_core_and_the_models():
  mods = _modules()
  for m, p in mods.items():
    if m.startswith("lnjax.core"):
      bad = [t for t in _imports(m, p, mods) if not t.startswith(CORE_MAY_IMPORT)]
      assert not bad, f"{m} imports {bad}"


def test_the_core_names_no_layer_above_it_by_attribute_or_string():
  """Nor reaches one past its imports: `lnjax.tasks.get` off `import lnjax`, or
  importlib.import_module("lnjax.tasks.lm") (docstrings and comments may name them)."""
  above = tuple(f"lnjax.{layer}" for layer in LAYERS if layer not in ("core", "models"))
  for m, p in _modules().items():
    if not m.startswith("lnjax.core"):
      continue
    tree = ast.parse(p.read_text())
    docstrings = {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Expr)}
    for node in ast.walk(tree):
      if isinstance(node, ast.Attribute):
        name = ast.unparse(node)
      elif isinstance(node, ast.Constant) and isinstance(node.value, str):
        name = "" if id(node) in docstrings else node.value
      else:
        continue
      assert not (name + ".").startswith(tuple(a + "." for a in above)), f"{m} names {name}"


def test_commands_live_in_cli_and_no_module_imports_one():
  mods = _modules()
  commands = {m for m, p in mods.items()
              if re.search(r'^if __name__ == "__main__":', p.read_text(), re.M)}
  assert commands - COMMANDS_OUTSIDE_CLI == {m for m in commands if m.startswith("lnjax.cli.")}
  assert {m for m in mods if m.startswith("lnjax.cli.")} <= commands, "cli/ holds commands only"
  for m, p in mods.items():
    bad = [t for t in _imports(m, p, mods) if t.startswith("lnjax.cli.") or t == "lnjax.main"]
    assert not bad, f"{m} imports the command(s) {bad}"


def test_no_module_is_named_like_a_folder_beside_it():
  for folder in [PACKAGE, *[d for d in PACKAGE.rglob("*") if d.is_dir()]]:
    subfolders = {d.name for d in folder.iterdir() if d.is_dir() and d.name != "__pycache__"}
    for f in folder.glob("*.py"):
      assert not {f.stem, f.stem + "s"} & subfolders, f"{f} beside {folder / f.stem}*/"


def test_no_module_over_500_lines():
  long = {m: n for m, p in _modules().items() if (n := len(p.read_text().splitlines())) > 500}
  assert not long, long


def test_experiments_run_from_the_installed_package():
  """An experiment imports lnjax (and its configs, lnjax.configs) as the installed package;
  none puts the repository on sys.path."""
  for path in sorted((REPO / "experiments").glob("*.py")):
    text = path.read_text()
    assert "sys.path" not in text and "from configs import" not in text, path.name
