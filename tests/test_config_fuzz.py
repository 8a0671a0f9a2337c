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

import math
import os

import hypothesis
import ml_collections
import pytest
from hypothesis import strategies as st

from configs import bert as bert_config
from configs import glue as glue_config
from configs import lm as lm_config
from configs import multi30k_de_en
from lnjax.core import errors, run as run_lib

from conftest import fast_tier

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
  """config.KEY = value as --config.KEY=VALUE would; False if the typed ConfigDict refuses."""
  *path, leaf = key.split(".")
  node = config
  for part in path:
    node = node[part]
  try:
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
    run = run_lib.resolve_config(config)
    if not _small(run):
      return "resolved"
    from lnjax.core import build
    b = build.build(config, build.one_device_mesh(), whole_data=True)
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
  for key in sorted(keys):
    for value in EDGES:
      config = CONFIGS[name]()
      if not _set(config, key, value):
        continue
      try:
        if name == "glue":
          from lnjax.tasks import finetune
          config = finetune.seed_config(config, 0)
        run_lib.resolve_config(config)
      except errors.LnjaxError:
        pass
