"""Every config key fuzzed (issue 28, part 4): hypothesis draws edge values (0, 1, -1, huge,
NaN, ±inf, "", a wrong type, each default and its neighbours) for one to three keys of a
config's smoke preset at a time; each draw must end in a clean refusal (an lnjax error,
which the commands print as one line with exit 2; or a value the typed ConfigDict refuses
on assignment, which `--config.KEY=VALUE` reports in one line through config_flags) or
in one train step with a finite loss. Any other exception fails the test.

The language model, translation and BERT configs build the model and data and take the
step (on one device, the embedded corpus or the test fixtures); GLUE's resolve through
lnjax.tasks.finetune (its model comes from a pre-training run, which a draw has none of). A
draw that resolves to a model too big for a test (a huge width, batch or length: valid,
but hours or tens of GiB here) is resolved only.

Profiles: the suite runs a few derandomized examples of each config (the fast tier the
language model's only); a longer search draws 60 random examples of each:
`LNJAX_FUZZ_PROFILE=long python -m pytest tests/test_config_fuzz.py` (about 2 minutes on
2 cores).
"""

import importlib
import math
import os
import re

import hypothesis
import ml_collections
import pytest
from hypothesis import strategies as st

from configs import bert as bert_config
from configs import glue as glue_config
from configs import lm as lm_config
from configs import multi30k_de_en
from lnjax import configs, tasks
from lnjax.core import errors, run as run_lib

from conftest import fast_tier
import forkserver

hypothesis.settings.register_profile("fast", max_examples=3, derandomize=True, deadline=None,
                                     database=None, print_blob=True,
                                     suppress_health_check=list(hypothesis.HealthCheck))
hypothesis.settings.register_profile("long", max_examples=60, derandomize=False, deadline=None,
                                     database=None, print_blob=True,
                                     suppress_health_check=list(hypothesis.HealthCheck))

CONFIGS = {"lm": lambda: lm_config.get_config("smoke"),
           "multi30k": lambda: multi30k_de_en.get_config("smoke"),
           "bert": lambda: bert_config.get_config("smoke"),
           "glue": lambda: glue_config.get_config("smoke")}

EDGES = [0, 1, -1, 2, 2**31, -2**31, 1e30, -1e30, float("nan"), float("inf"), float("-inf"),
         0.5, 1e-12, "", "x", "-1", None, True, False, (), ("validation",), [0]]


def _leaves(config: ml_collections.ConfigDict, prefix=""):
  for key in config.keys():
    value = config[key]
    if isinstance(value, ml_collections.ConfigDict):
      yield from _leaves(value, f"{prefix}{key}.")
    else:
      yield f"{prefix}{key}", value


def _values_for(default):
  near = []
  if isinstance(default, (int, float)) and not isinstance(default, bool):
    near = [default, default + 1, default - 1, default * 2, -default]
  return st.sampled_from(near + EDGES)


def _draws(name: str):
  keys = dict(_leaves(CONFIGS[name]()))
  pair = st.sampled_from(sorted(keys)).flatmap(
      lambda k: st.tuples(st.just(k), _values_for(keys[k])))
  return st.lists(pair, min_size=1, max_size=3, unique_by=lambda kv: kv[0])


def _set(config, key: str, value) -> bool:
  """config.KEY = value as --config.KEY=VALUE would; False if the typed ConfigDict refuses.
  (A key the config has is set with the config locked, as config_flags sets it: unlocking
  and relocking the whole tree for each value took 40% of the boundary sweeps' time.)"""
  *path, leaf = key.split(".")
  node = config
  for part in path:
    node = node[part]
  try:
    if leaf in node:
      node[leaf] = value
    else:
      with config.unlocked():
        node[leaf] = value
  except (TypeError, ValueError, KeyError, AttributeError):
    return False
  return True


# Elements of the largest arrays a draw may build here (parameters, activations).
BUDGET = 4e6


def _small(run) -> bool:
  m, d = run.model, run.data
  vocab = m.vocab_size or getattr(d, "vocab_size", 0) or 256
  length = getattr(d, "seq_len", 0) or getattr(d, "max_len", 0)
  batch = getattr(d, "batch_size", 0) or max(1, getattr(d, "max_tokens", 0) // max(length, 1))
  layers = m.num_layers + (m.num_decoder_layers or m.num_layers)
  heads_width = m.num_heads * (m.head_dim or m.d_model // m.num_heads)  # H·d_h
  params = (layers * (4 * m.d_model * heads_width + 3 * m.d_model * m.d_ff)
            + vocab * m.d_model)
  acts = batch * length * (m.d_ff + vocab + m.num_heads * length) * max(layers, 1)
  return (params < BUDGET and acts < 8 * BUDGET and length <= 512 and m.max_len <= 4096
          and layers <= 16 and run.train.num_steps <= 10**7)


def check_draw(name: str, draw) -> str:
  """'refused', 'resolved' or 'stepped'; an unexpected exception propagates."""
  config = CONFIGS[name]()
  with config.unlocked():
    config.mesh.data = 1
  for key, value in draw:
    if not _set(config, key, value):
      return "refused"
  try:
    if name == "glue":
      from lnjax.tasks import finetune
      config = finetune.seed_config(config, 0)
    run = run_lib.resolve_config(config, tasks=tasks.get)
    if not _small(run):
      return "resolved"
    from lnjax.core import build
    b = build.build(config, build.one_device_mesh(), whole_data=True, tasks=tasks.get)
    state = b.init_state()
    _, metrics = b.train_step(state, b.global_batch(next(b.data.train_iter())))
    loss = float(metrics["train_loss"])
  except errors.LnjaxError as e:
    assert "\n" not in str(e).strip(), str(e)
    return "refused"
  assert math.isfinite(loss), (draw, loss)
  return "stepped"


def _fuzz(name: str, profile: str):
  @hypothesis.settings(hypothesis.settings.get_profile(profile))
  @hypothesis.given(_draws(name))
  def inner(draw):
    check_draw(name, draw)
  inner()


# The fast tier resolves the language model's config at every edge; the draws that train
# (each prepares a corpus and compiles a step: ~1 min a config on 2 cores), and the other
# configs' edges, are in the full tier.
FAST = fast_tier(sorted(CONFIGS), ("lm",))


@pytest.mark.slow  # Each draw that resolves trains a few steps.
@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_config_draws_are_refused_or_train(name):
  _fuzz(name, os.environ.get("LNJAX_FUZZ_PROFILE", "fast"))


@pytest.mark.parametrize("name", FAST)
def test_each_key_alone_at_each_edge_is_refused_or_resolves(name):
  """Every key at every edge value, resolved only (no step): cheap and exhaustive."""
  keys = dict(_leaves(CONFIGS[name]()))
  config = None
  for key in sorted(keys):
    for value in EDGES:
      # A fresh config for each value, but where the last value was refused: a refused
      # assignment leaves the config as it was (its fields, types and lock: checked for all
      # 4852 refusals). A get_config for every value was 90% of this test: the four
      # parametrizations' process 8.1 -> 5.0 CPU s (3 runs each, 2026-12-07, 2-core machine).
      if config is None:
        config = CONFIGS[name]()
      if not _set(config, key, value):
        continue
      config, resolving = None, config
      try:
        if name == "glue":
          from lnjax.tasks import finetune
          resolving = finetune.seed_config(resolving, 0)
        run_lib.resolve_config(resolving, tasks=tasks.get)
      except errors.LnjaxError:
        pass


# ---- Boundaries by construction (issue 62): explicit examples, not draws. ----
#
# Every numeric key of every shipped config (lnjax.configs.names()) and preset (read from
# the configs' own refusals of an unknown preset: a config added later is covered), each
# at: 0, 1, 2, -1, the largest int64 and beyond, its default and neighbours, and every
# limit its refusals name (check_int's ">= 16", check_range's "[0.0, 1.0)", another key's
# value it must not exceed), one step inside and outside each. Each value alone on the
# preset, and on the preset's smallest model with the shortest lengths (every size and
# length key at its lowest accepted value at once). Each must resolve, or be refused in
# one line (an LnjaxError; or the typed ConfigDict's refusal, which --config.KEY=VALUE
# reports in one line); the configs whose data the tests hold also take one train step on a
# sample of the accepted extremes (tests below, slow).

INT64_MAX = 2**63 - 1
INTS = (0, 1, 2, -1, INT64_MAX, INT64_MAX + 1, 2**64)
FLOATS = (0.0, 1.0, 2.0, -1.0, 0.5, 1e-12, 1e30, float("nan"), float("inf"), float("-inf"))
# Size and length keys (by leaf name): set together to their lowest accepted values.
SIZE_KEY = re.compile(r"^(model|data)\.(num_(decoder_)?layers|d_model|num_(kv_)?heads|d_ff|"
                      r"max_len|seq_len|max_tokens|buckets_per_octave|batch_size|head_dim|"
                      r"sliding_window|window\w*|\w*_len)$")
_NUMBER = re.compile(r"(?<![\w.])-?\d+(?:\.\d+)?(?:e[+-]?\d+)?(?![\w.])")


def _module(name: str):
  return importlib.import_module(f"lnjax.configs.{name}")


def presets(name: str) -> list[str]:
  """The config's presets, one at a time ("" = none), read from its refusals: an unknown
  preset names the valid ones, a preset with a wrong value its values."""
  out = [""]
  try:
    _module(name).get_config("?")
    return out
  except errors.ConfigError as e:
    names = str(e).split("valid: ", 1)[1].split(", ")
  for preset in names:
    try:
      _module(name).get_config(f"{preset}=?")
    except errors.ConfigError as e:
      text = str(e)
      if "takes no value" in text:
        out.append(preset)
      elif "must be one of: " in text:
        out += [f"{preset}={v}" for v in text.split("must be one of: ", 1)[1].split(", ")]
  return out


def _numeric(value) -> bool:
  return isinstance(value, (int, float)) and not isinstance(value, bool)


class Boundaries:
  """One config (a preset of one shipped config) and the outcome of one key's value on it,
  the config left as it was after each (set, resolve, set back: no copy per value)."""

  def __init__(self, name: str, preset: str):
    self.name, self.preset = name, preset
    self.config = _module(name).get_config(preset or None)
    with self.config.unlocked():
      self.config.mesh.data = 1
    self.keys = dict(_leaves(self.config))

  def resolve(self, config=None):
    config = config or self.config
    if self.name == "glue":
      from lnjax.tasks import finetune
      config = finetune.seed_config(config, 0)
    return run_lib.resolve_config(config, tasks=tasks.get)

  def outcome(self, key: str, value) -> tuple[str, str]:
    """('refused' | 'resolved', the refusal's message); any other exception propagates."""
    old = _get(self.config, key)
    if not _set(self.config, key, value):
      return "refused", ""
    try:
      self.resolve()
    except errors.LnjaxError as e:
      assert "\n" not in str(e).strip(), (key, value, str(e))
      return "refused", str(e)
    finally:
      _force(self.config, key, old)
    return "resolved", ""

  def values(self, key: str, seen: dict | None = None) -> list:
    """The key's boundary values: the fixed ones, its default's neighbours, and the limits
    its refusals of the fixed ones name, one step inside and outside each. `seen`, if
    given, gets the fixed values' outcomes ({_same(value): outcome}) on the config as is."""
    default = self.keys[key]
    fixed = INTS if isinstance(default, int) else FLOATS
    limits = {default}
    for value in fixed:
      verdict, message = self.outcome(key, value)
      if seen is not None:
        seen[_same(value)] = verdict, message
      if verdict == "refused":
        text = message.replace(f"{key}={value!r}", " ")
        limits |= {float(n) for n in _NUMBER.findall(text)
                   if abs(float(n)) < 2**70}
    out = list(fixed)
    for limit in sorted(limits):
      if isinstance(default, int):
        out += [int(limit) - 1, int(limit), int(limit) + 1]
      else:
        step = 1e-6 * max(1.0, abs(limit))
        out += [limit - step, limit, limit + step]
    return list(dict.fromkeys(out))

  def shrink(self) -> dict:
    """Every size and length key at its lowest accepted value, together (a key whose lowest
    the others' lowests refuse keeps the lowest they accept); {key: value} set."""
    chosen = {}
    for key in sorted(k for k, v in self.keys.items() if SIZE_KEY.match(k) and _numeric(v)):
      for value in sorted(v for v in self.values(key) if isinstance(v, int) and v >= 0):
        if self.outcome(key, value)[0] == "resolved":
          _force(self.config, key, value)
          chosen[key] = value
          break
    self.keys = dict(_leaves(self.config))
    return chosen


def _same(value) -> tuple:
  """A value's identity as a setting: 1, 1.0 and True differ; every NaN is the same."""
  return type(value), repr(value)


def _get(config, key: str):
  node = config
  for part in key.split("."):
    node = node[part]
  return node


def _force(config, key: str, value) -> None:
  assert _set(config, key, value), (key, value)


def sweep_boundaries(name: str, preset: str, shrink: bool) -> list[str]:
  """Every numeric key of `name`:`preset` (shrunk first if asked) at each of its boundary
  values; the failures (an exception other than a one-line refusal), each as a line."""
  b = Boundaries(name, preset)
  if shrink:
    b.shrink()
  failures = []
  for key in sorted(k for k, v in b.keys.items() if _numeric(v)):
    seen = {}  # (The fixed values' outcomes, found by values(): each value resolved once.)
    for value in b.values(key, seen):
      try:
        verdict, _ = seen.get(_same(value)) or b.outcome(key, value)
        # No setting takes NaN, ±inf or an integer past int64 (JAX's and numpy's widest).
        assert verdict == "refused" or (math.isfinite(value) and (
            isinstance(value, float) or abs(value) <= INT64_MAX)), "accepted"
      except Exception as e:  # noqa: BLE001 (collected: every failure in one report)
        failures.append(f"{name}:{preset} {'(smallest) ' if shrink else ''}{key}={value!r}: "
                        f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
  return failures


CASES = [(name, preset) for name in configs.names() for preset in presets(name)]


# The fast tier: the default config's (3 s); every other config in the full tier.
@pytest.mark.parametrize("name", fast_tier(configs.names(), ("default",)))
def test_every_numeric_key_at_its_boundaries_is_refused_in_one_line_or_resolves(name):
  """Each preset alone; the smoke preset (or the bare config) also shrunk to its smallest."""
  failures = []
  for config_name, preset in CASES:
    if config_name == name:
      failures += sweep_boundaries(name, preset, shrink=False)
  smallest = "smoke" if "smoke" in presets(name) else ""
  failures += sweep_boundaries(name, smallest, shrink=True)
  assert not failures, f"{len(failures)} failures:\n" + "\n".join(failures)


def one_step(b: "Boundaries") -> str:
  """'refused', 'resolved' (too big to train here) or 'stepped': one train step and one
  held-out batch of the config as it stands; an unexpected exception propagates."""
  try:
    run = b.resolve()
    if not _small(run):
      return "resolved"
    from lnjax.core import build
    config = b.config
    if b.name == "glue":
      return "resolved"  # (Its model comes from a pre-training run.)
    built = build.build(config, build.one_device_mesh(), whole_data=True, tasks=tasks.get)
    state = built.init_state()
    # (The step donates its input state: the held-out batch reads the new one.)
    state, metrics = built.train_step(state, built.global_batch(next(built.data.train_iter())))
    nll, count = built.eval_step(state.params, built.global_batch(built.eval_batches(1)[0]))
  except errors.LnjaxError as e:
    assert "\n" not in str(e).strip(), str(e)
    return "refused"
  assert math.isfinite(float(metrics["train_loss"])) and float(count) > 0, metrics
  return "stepped"


# Configs whose data the tests hold (the embedded corpus, the fixtures' Multi30k); the
# others resolve only (above).
TRAINED = ("bert", "default", "lm", "multi30k_de_en")


def extremes(b: "Boundaries") -> dict:
  """{key: (lowest, highest) accepted boundary value} of every numeric key but the sizes."""
  out = {}
  for key in sorted(k for k, v in b.keys.items() if _numeric(v) and not SIZE_KEY.match(k)):
    accepted = sorted(v for v in b.values(key) if not (isinstance(v, float) and math.isnan(v))
                      and b.outcome(key, v)[0] == "resolved")
    if accepted:
      out[key] = (accepted[0], accepted[-1])
  return out


def step_sample(name: str, each: bool) -> list[str]:
  """One train step of the smallest config; then of it with every other numeric key at its
  lowest accepted value together, and at its highest together (`each`: every key's
  extreme alone instead, one step each: the long profile). The failures, one line each."""
  smallest = "smoke" if "smoke" in presets(name) else ""
  b = Boundaries(name, smallest)
  b.shrink()
  base = {k: _get(b.config, k) for k in b.keys}
  cases = [{}]
  ends = extremes(b)
  for side in (0, 1):
    if each:
      cases += [{k: v[side]} for k, v in ends.items()]
    else:
      together = {}
      for key, pair in ends.items():  # (Kept while the whole resolves and trains here.)
        if b.outcome(key, pair[side])[0] == "resolved":
          _force(b.config, key, pair[side])
          if _resolves(b) and _small(b.resolve()):
            together[key] = pair[side]
          else:
            _force(b.config, key, base[key])
      for key in together:
        _force(b.config, key, base[key])
      cases.append(together)
  failures = []
  for case in cases:
    for key, value in case.items():
      _force(b.config, key, value)
    try:
      one_step(b)
    except Exception as e:  # noqa: BLE001
      failures.append(f"{name} (smallest) {case if len(case) < 4 else f'{len(case)} keys'}: "
                      f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
    for key in case:
      _force(b.config, key, base[key])
  return failures


def _resolves(b: "Boundaries") -> bool:
  try:
    b.resolve()
  except errors.LnjaxError:
    return False
  return True


@pytest.mark.slow  # Three train steps of a tiny model (compiles), each config.
@pytest.mark.parametrize("name", TRAINED)
def test_the_smallest_config_at_its_extremes_takes_a_step(name):
  each = os.environ.get("LNJAX_FUZZ_PROFILE") == "long"
  failures = step_sample(name, each)
  assert not failures, f"{len(failures)} failures:\n" + "\n".join(failures)


# ---- Every command's numeric flags (lnjax/cli/*, lnjax.main): 0, -1, NaN, ±inf, huge. ----
#
# Each entry point's numeric flags (found by absl, not listed here) are parsed at each value,
# the entry points one after another in one process (each one's flags removed before the
# next is imported). A value is refused at parsing with one line naming the flag
# (lnjax.cli.number: the flag's domain), or accepted because it is in the domain.

FLAG_VALUES = ("0", "-1", "nan", "inf", "-inf", "1e30", str(INT64_MAX + 1), str(2**64))
# The values of 0 and -1 a flag's domain holds (a finite margin, a length penalty α, ...).
ZERO_OR_NEGATIVE_ACCEPTED = {("lnjax.main", "process_id", "0"),
                             ("lnjax.cli.analyze", "sharpness", "0"),
                             ("lnjax.cli.stability", "margin_nats", "0"),
                             ("lnjax.cli.stability", "margin_nats", "-1"),
                             ("lnjax.cli.stability", "divergence_factor", "0"),
                             ("lnjax.cli.sweep", "grace_seconds", "0"),
                             ("lnjax.cli.translate", "length_penalty", "0")}
FLAG_DRIVER = """
import importlib, json, sys
from absl import flags
from lnjax import cli
FLAGS = flags.FLAGS
out = []
for module_name in sys.argv[2:]:
  importlib.import_module(module_name)
  mine = [n for n in list(FLAGS) if FLAGS.find_module_defining_flag(n) == module_name]
  given = [a for n, a in (("config", "--config=lm:smoke"), ("workdir", "--workdir=W"),
                          ("topology", "--topology=v5e:2x2")) if n in mine]
  for name in mine:
    kind = {flags.IntegerParser: "int", flags.FloatParser: "float"}.get(type(FLAGS[name].parser))
    if kind is None:
      continue
    for value in json.loads(sys.argv[1]):
      FLAGS.unparse_flags()
      try:
        cli.parse([module_name, *given, f"--{name}={value}"])
        out.append([module_name, name, kind, value, ""])
      except Exception as e:
        out.append([module_name, name, kind, value, f"{type(e).__name__}: {e}"])
  for name in mine:
    delattr(FLAGS, name)
print(json.dumps(out))
"""


@pytest.mark.slow  # A command line importing every entry point.
def test_every_commands_numeric_flags_refuse_their_boundaries_in_one_line():
  import json
  import sys

  from test_cli_errors import REPO, _entry_points

  r = forkserver.run([sys.executable, "-c", FLAG_DRIVER, json.dumps(FLAG_VALUES),
                      *sorted(_entry_points())], cwd=REPO, capture_output=True, text=True,
                     timeout=300)
  assert r.returncode == 0, r.stderr[-3000:]
  results = json.loads(r.stdout.splitlines()[-1])
  failures = []
  for module, name, kind, value, error in results:
    if error:
      ok = error.startswith("ConfigError: ") and f"--{name}={value}" in error and (
          "\n" not in error)
    else:
      number = float(value)
      ok = math.isfinite(number) and (kind == "float" or abs(number) <= INT64_MAX) and (
          number > 0 or (module, name, value) in ZERO_OR_NEGATIVE_ACCEPTED)
    if not ok:
      failures.append(f"{module} --{name}={value}: {error or 'accepted'}")
  assert len({(m, n) for m, n, *_ in results}) >= 20  # (The flags were found.)
  assert not failures, f"{len(failures)} failures:\n" + "\n".join(failures)
