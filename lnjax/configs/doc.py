"""`lnjax.main --config=FILE --print_config`: every key of a config with its value and the
comment written beside it in the source.

The comments are read from the code that builds configs, where every key has one: the
assignments of lnjax/configs/common.py for the task and of the config file itself (what a
preset sets, and why), then the fields of the dataclasses the sections map onto (each
default and its meaning). A comment that ends without a full stop continues on the
comment lines right below it.
"""

import ast
import dataclasses
import inspect
import io
import pathlib
import textwrap
import tokenize

import ml_collections

from lnjax.configs import common as config_lib
from lnjax.core import sections

def _chain(node) -> list[str] | None:
  """['c', 'model', 'd_model'] for c.model.d_model; None for anything else."""
  parts = []
  while isinstance(node, ast.Attribute):
    parts.append(node.attr)
    node = node.value
  if isinstance(node, ast.Name):
    return [node.id] + parts[::-1]
  return None


def _statement(code: str):
  """(target chains, value chain or None) of an assignment (`a.b = c = x`, `a.b, a.c = x, y`,
  `m = c.model`); (['field', name]) for a dataclass field (`beam_size: int = 4`)."""
  try:
    tree = ast.parse(code.strip())
  except SyntaxError:
    return None
  if len(tree.body) != 1:
    return None
  stmt = tree.body[0]
  if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
    return [["field", stmt.target.id]], None
  if not isinstance(stmt, ast.Assign):
    return None
  nodes = []
  for t in stmt.targets:
    nodes += t.elts if isinstance(t, ast.Tuple) else [t]
  return [c for c in map(_chain, nodes) if c], _chain(stmt.value)


def comments_in(source: str) -> tuple[dict[str, dict[str, str]], dict[str, str]]:
  """({'lm_config': {'model.d_model': 'D', ...}, ...}, {'beam_size': '1 = greedy.', ...}):
  the comments of the config keys assigned in `source` by each top-level function
  (c.model.d_model, or m.d_model after `c.model = m = ...` or `m = c.model`), and of the
  dataclass fields it declares."""
  by_function, fields, aliases = {"": {}}, {}, {}
  keys = by_function[""]
  last, last_comment = [], ""

  def resolve(chain):
    if chain[0] == "c":
      return chain[1:]
    return aliases[chain[0]] + chain[1:] if chain[0] in aliases else None

  for line in source.splitlines(keepends=True):
    stripped = line.strip()
    if line.startswith("def "):
      keys = by_function.setdefault(line[4:].partition("(")[0], {})
    if stripped.startswith("#"):  # The comment of the line above, continued.
      if last and last_comment and not last_comment.endswith("."):
        last_comment = f"{last_comment} {stripped.lstrip('#').strip()}"
        for store, name in last:
          store[name] = last_comment
      continue
    last, last_comment = [], ""
    try:
      toks = list(tokenize.generate_tokens(io.StringIO(line).readline))
    except (tokenize.TokenError, IndentationError, SyntaxError):
      continue
    comment = next((t.string for t in toks if t.type == tokenize.COMMENT), None)
    parsed = _statement(line[:line.index(comment)] if comment else line)
    if not parsed:
      continue
    chains, value = parsed
    if not chains:
      continue
    if chains[0][0] == "field":
      named = [(fields, chains[0][1])]
    else:
      sections = [resolve(c) for c in chains if len(c) > 1] + (
          [resolve(value)] if value and len(value) > 1 else [])
      section = next((p for p in sections if p), None)
      for c in chains:  # `c.model = m = ...` / `m = c.model`: m stands for model.
        if len(c) == 1 and section:
          aliases[c[0]] = section
      named = [(keys, ".".join(p)) for p in (resolve(c) for c in chains if len(c) > 1) if p]
    if comment:
      last_comment = comment.lstrip("#").strip()
      for store, name in named:
        store[name] = last_comment
      last = named
  return by_function, fields


# The function of config_lib that builds each task's keys (its comments come first).
_TASK_FUNCTIONS = {"lm": "lm_config", "translation": "translation_config",
                   "mlm": "bert_config", "mlm_nsp": "bert_config"}


def section_classes(config: ml_collections.ConfigDict) -> dict[str, type]:
  """{'model': ModelConfig, 'data': MTDataConfig, 'decode': DecodeConfig, ...}: the
  dataclass each section of `config` maps onto; for a config that only its own entry
  point resolves (lnjax.tasks.finetune's), the dataclass its section was built from."""
  from lnjax import tasks
  from lnjax.core import errors, run as run_lib
  try:
    run = run_lib.resolve_config(config, tasks=tasks.get)
  except errors.LnjaxError:
    run = None
  out = {}
  for name in config.keys():
    value = getattr(run, name, None)
    if value is None or not dataclasses.is_dataclass(value):
      value = (getattr(run, "extra", None) or {}).get(name)
    if value is not None and dataclasses.is_dataclass(value):
      out[name] = type(value)
    elif isinstance(config[name], ml_collections.ConfigDict):
      cls = sections.built_from(config[name].keys())
      if cls is not None:
        out[name] = cls
  return out


def key_comments(config: ml_collections.ConfigDict, config_file: str | None) -> dict[str, str]:
  """Comments of every key: config_lib's for the task (its builder, then the shared
  helpers), then the config file's, then the comments of the section dataclasses' fields
  (where the defaults and their meaning are written)."""
  library, _ = comments_in(pathlib.Path(config_lib.__file__).read_text())
  first = [_TASK_FUNCTIONS.get(config.get("task", "lm"), ""), "_common", "_data_dirs",
           "_external_source"]
  ordered = [library.get(f, {}) for f in first]  # (Other tasks' comments do not apply.)
  if config_file:
    path = pathlib.Path(config_file.partition(":")[0])
    if path.is_file():
      ordered += list(comments_in(path.read_text())[0].values())
  for name, cls in section_classes(config).items():
    try:
      source = textwrap.dedent(inspect.getsource(cls))
    except (OSError, TypeError):
      continue
    ordered.append({f"{name}.{k}": v for k, v in comments_in(source)[1].items()})
  keys = {}
  for group in ordered:
    for k, v in group.items():
      keys.setdefault(k, v)
  return keys


def _flatten(config, prefix: str = "") -> list[tuple[str, object]]:
  out = []
  for key in config.keys():
    value = config[key]
    if isinstance(value, ml_collections.ConfigDict):
      out += _flatten(value, f"{prefix}{key}.")
    else:
      out.append((prefix + key, value))
  return out


def describe(config: ml_collections.ConfigDict, config_file: str | None = None) -> str:
  """One line per key: `section.key = value  # comment`, grouped by section."""
  comments = key_comments(config, config_file)
  items = sorted(_flatten(config), key=lambda kv: ("." in kv[0], kv[0]))
  width = max((len(f"{k} = {v!r}") for k, v in items), default=0)
  lines, section = [], None
  for key, value in items:
    head = key.split(".")[0] if "." in key else ""
    if head != section:
      section = head
      lines.append(f"\n[{head}]" if head else "[top level]")
    text = comments.get(key, "")
    line = f"{key} = {value!r}"
    lines.append(f"{line:<{width}}  # {text}" if text else line)
  return "\n".join(lines).lstrip("\n")
