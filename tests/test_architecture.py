"""The layering: no import cycle, a core that loads no task, data set or evaluator,
modules small enough to read."""

import ast
import pathlib
import subprocess
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]
PACKAGE = REPO / "lnjax"

# The core: models, optimizer and losses, sharding, state, checkpoints, the loop's parts.
CORE = ("lnjax.state", "lnjax.checkpoint", "lnjax.optim", "lnjax.losses", "lnjax.sharding",
        "lnjax.models", "lnjax.task", "lnjax.run")
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


@pytest.mark.slow
@pytest.mark.parametrize("module", ["lnjax.state", "lnjax.checkpoint", "lnjax.run", "lnjax.tasks"])
def test_the_core_loads_no_data_set_tokenizer_or_evaluator(module):
  code = (f"import sys, {module}; heavy = {HEAVY!r}; "
          "print(sorted({m.split('.')[0] for m in sys.modules} & set(heavy)))")
  r = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True,
                     timeout=120, env={"JAX_PLATFORMS": "cpu", "PATH": "/usr/bin:/bin"})
  assert r.returncode == 0, r.stderr[-2000:]
  assert r.stdout.strip() == "[]", r.stdout


def test_the_core_imports_no_task_data_or_evaluation_module():
  # The core may name tasks through the registry (lnjax.tasks, which loads no plug-in
  # until a run asks for one), never a plug-in (lnjax.tasks.lm, ...) or what they use.
  mods = _modules()
  outside = ("lnjax.data", "lnjax.tasks.", "lnjax.evaluate", "lnjax.bleu", "lnjax.predict",
             "lnjax.train", "lnjax.analyze", "lnjax.main", "lnjax.finetune", "lnjax.sweep")
  for m, p in mods.items():
    if any(m == c or m.startswith(c + ".") for c in CORE):
      bad = [t for t in _imports(m, p, mods) if t.startswith(outside)]
      assert not bad, f"{m} imports {bad}"


def test_no_module_over_500_lines():
  long = {m: n for m, p in _modules().items() if (n := len(p.read_text().splitlines())) > 500}
  assert not long, long


def test_importing_lnjax_leaves_the_allocator_alone():
  code = ("import lnjax, lnjax.state, lnjax.train, lnjax.allocator as a; "
          "assert not a._applied, 'import lnjax tuned glibc malloc'; print('ok')")
  r = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True,
                     timeout=120, env={"JAX_PLATFORMS": "cpu", "PATH": "/usr/bin:/bin"})
  assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr[-2000:]
