"""tests/mutants.py stays runnable: every mutant's pattern is still in its file, once, and
every test it names still exists (a renamed test or moved code would otherwise surface only
in a full mutation run, which takes hours)."""

import ast
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import mutants  # noqa: E402


def _test_functions(path: str) -> set[str]:
  with open(os.path.join(mutants.REPO, path)) as f:
    tree = ast.parse(f.read())
  return {node.name for node in ast.walk(tree) if isinstance(node, ast.FunctionDef)}


@pytest.mark.parametrize("mutant", mutants.MUTANTS, ids=lambda m: m.name)
def test_each_mutant_applies_once_and_names_existing_tests(mutant):
  with open(os.path.join(mutants.REPO, mutant.path)) as f:
    assert f.read().count(mutant.find) == 1, f"{mutant.path}: the pattern is not there once"
  for test_id in mutant.tests:
    path, _, name = test_id.partition("::")
    assert name.split("[")[0] in _test_functions(path), f"{test_id} does not exist"


def test_mutant_names_are_unique():
  names = [m.name for m in mutants.MUTANTS]
  assert len(names) == len(set(names))
