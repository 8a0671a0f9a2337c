"""Every config file and preset resolves into valid dataclasses (no data or compute)."""

import importlib

import re

import pytest

from lnjax import tasks
from lnjax.core import errors, run

CASES = [
    ("default", None), ("default", "smoke"),
    ("lm", None), ("lm", "norm=post,size=course"), ("lm", "norm=pre,size=course_reg"),
    ("lm", "smoke"), ("llama", None), ("llama", "smoke"), ("llama", "family=qwen3,size=1b"),
    ("multi30k_de_en", "norm=pre"), ("multi30k_de_en", "norm=post,dir=en-de"),
    ("multi30k_de_en", "smoke"), ("multi30k_de_en", "quick"),
    ("multi30k_de_en", "norm=post,quick"),
    ("iwslt14_de_en", "norm=pre"), ("iwslt14_de_en", "norm=post"), ("iwslt14_de_en", "smoke"),
    ("wmt14_en_de", "norm=pre"), ("wmt14_en_de", "norm=post"), ("wmt14_en_de", "smoke"),
]


@pytest.mark.parametrize("name,arg", CASES)
def test_config_resolves(name, arg):
  config = importlib.import_module(f"configs.{name}").get_config(arg)
  resolved = run.resolve_config(config, tasks=tasks.get)
  assert resolved.model.norm_position in ("pre", "post")


def test_paper_translation_presets():
  """Xiong et al. 2020 (arXiv 2002.04745) §4: IWSLT14 Post-LN 4000 warm-up + inverse sqrt, Pre-LN no
  warm-up ×0.1 at epoch 8, both lr 5e-4, 6+6 layers, D 512, FFN 1024, 4 heads; fairseq's
  sinusoidal positions (WMT14's Transformer base too)."""
  from configs import iwslt14_de_en, wmt14_en_de
  post = run.resolve_config(iwslt14_de_en.get_config("norm=post"), tasks=tasks.get)
  pre = run.resolve_config(iwslt14_de_en.get_config("norm=pre"), tasks=tasks.get)
  assert (post.opt.schedule, post.opt.warmup_steps, post.opt.learning_rate) == (
      "inverse_sqrt", 4000, 5e-4)
  assert (pre.opt.schedule, pre.opt.warmup_steps, pre.opt.decay_epochs) == ("step", 0, (8,))
  m = pre.model
  assert (m.num_layers, m.d_model, m.d_ff, m.num_heads, m.pos_emb) == (
      6, 512, 1024, 4, "sinusoidal")
  base = run.resolve_config(wmt14_en_de.get_config("norm=pre"), tasks=tasks.get).model
  assert (base.num_layers, base.d_model, base.d_ff, base.num_heads, base.pos_emb) == (
      6, 512, 2048, 8, "sinusoidal")


def test_course_reg_is_the_course_model_with_dropout():
  """configs/lm.py:size=course_reg (issue 21): the course workshop's model, schedule and
  length, with dropout 0.1; its `course` sweep names the same five runs."""
  from configs import lm
  from lnjax import sweep
  course = run.resolve_config(lm.get_config("size=course"), tasks=tasks.get)
  reg = run.resolve_config(lm.get_config("size=course_reg"), tasks=tasks.get)
  assert (course.model.dropout_rate, reg.model.dropout_rate) == (0.0, 0.1)
  for r in (course, reg):
    assert (r.model.num_layers, r.model.d_model, r.model.d_ff, r.data.tokenizer) == (
        8, 128, 512, "sentencepiece")
    assert (r.opt.warmup_steps, r.train.num_steps) == (30, 3000)
  path = f"{lm.__file__}:size=course_reg"
  runs = sweep.expand(path, "course", {"train.num_steps": 3000})
  assert [r.name for r in runs] == [r.name for r in sweep.expand(
      f"{lm.__file__}:size=course", "course", {"train.num_steps": 3000})]
  assert len(runs) == 5


def test_multi30k_quick_is_a_half_size_model_for_220_steps_evaluated_once():
  from configs import multi30k_de_en
  full = run.resolve_config(multi30k_de_en.get_config("norm=pre"), tasks=tasks.get)
  quick = run.resolve_config(multi30k_de_en.get_config("quick"), tasks=tasks.get)
  assert (quick.model.num_layers, quick.model.d_ff, quick.data.vocab_size) == (2, 512, 4000)
  assert quick.model.d_model == full.model.d_model and quick.data.max_tokens == full.data.max_tokens
  assert (quick.train.num_steps, quick.train.eval_every_steps,
          quick.train.checkpoint_every_steps) == (220, 220, 220)
  assert (quick.opt.learning_rate, quick.opt.warmup_steps) == (1.5e-3, 0)
  post = run.resolve_config(multi30k_de_en.get_config("norm=post,quick"), tasks=tasks.get).opt
  assert (post.schedule, post.warmup_steps) == ("inverse_sqrt", 100)


def test_unknown_preset_is_refused():
  from configs import iwslt14_de_en
  with pytest.raises(errors.ConfigError, match="norm"):
    iwslt14_de_en.get_config("norm=middle")


@pytest.mark.parametrize("name,arg,words", [
    ("lm", "norm=post,norm=pre", "preset 'norm' given twice"),
    ("llama", "size=1b,size=7b", "preset 'size' given twice"),
    ("lm", "size=course,smoke", "give smoke or size=course, not both"),
    ("llama", "smoke,size=7b", "give smoke or size=7b, not both"),
    ("bert", "size=base,smoke", "give smoke or size=base, not both")])
def test_a_preset_given_twice_or_smoke_beside_a_size_is_refused(name, arg, words):
  """Either would be dropped silently (the last value kept, smoke's tiny model built)."""
  with pytest.raises(errors.ConfigError, match=re.escape(words)):
    importlib.import_module(f"configs.{name}").get_config(arg)
  assert importlib.import_module("configs.llama").get_config("smoke,size=smoke").model.d_model == 32


@pytest.mark.parametrize("family", ["llama", "qwen3", "gemma2", "olmo2"])
def test_llama_family_recipes(family):
  """configs/llama.py: each family's recipe (its placement and block keys) at the course
  size; any placement through norm= (a second QK-norm dropped where the placement has
  its own)."""
  from configs import llama
  m = run.resolve_config(llama.get_config(f"family={family}"), tasks=tasks.get).model
  assert (m.num_layers, m.d_model, m.d_ff, m.pos_emb, m.gated_ffn, m.norm_kind, m.use_bias) == (
      8, 128, 344, "rope", True, "rmsnorm", False)
  recipe = {
      "llama": dict(norm_position="pre", activation="silu", qk_norm=False, rope_theta=1e4),
      "qwen3": dict(norm_position="pre", activation="silu", qk_norm=True, rope_theta=1e6,
                    norm_eps=1e-6),
      "gemma2": dict(norm_position="sandwich", activation="gelu", norm_unit_offset=True,
                     attn_logit_softcap=50.0, final_logit_softcap=30.0,
                     attention_pattern="local,global", sliding_window=64,
                     scale_embeddings=True, tie_embeddings=True, query_scale=0.0),
      "olmo2": dict(norm_position="olmo2", activation="silu", qk_norm=False, rope_theta=5e5),
  }[family]
  assert {k: getattr(m, k) for k in recipe} == recipe
  for norm in ("post", "olmo2", "ngpt", "hybridnorm", "mix"):
    m = run.resolve_config(llama.get_config(f"family={family},norm={norm},smoke"),
                           tasks=tasks.get).model  # (qwen3 with hybridnorm was refused)
    assert (m.norm_position, m.qk_norm) == (norm, recipe.get("qk_norm", False) and norm in (
        "post", "mix")), norm
  with pytest.raises(errors.ConfigError, match="family must be one of: llama, qwen3"):
    llama.get_config("family=gpt2")


def test_every_family_takes_every_placement():
  """family=F,norm=P resolves for each of the 4 families × 16 placements, as
  docs/configs.md promises (Qwen3's QK-norm dropped under the placements that normalize q
  and k their own way: olmo2, ngpt, hybridnorm; kept under the others)."""
  from configs import llama
  from lnjax.models import NORM_POSITIONS
  for family in llama.FAMILIES:
    for norm in NORM_POSITIONS:
      m = run.resolve_config(llama.get_config(f"family={family},norm={norm},smoke"),
                             tasks=tasks.get).model
      assert m.norm_position == norm
      assert m.qk_norm == (family == "qwen3" and norm not in ("olmo2", "ngpt", "hybridnorm"))


def test_gemma2s_query_scale_follows_the_head_width():
  """family=gemma2's s = d_h^-1/2 (docs/configs.md; Gemma 2 2B, 9B: query_pre_attn_scalar =
  head_dim) for the head width the model gets: 8 at smoke, 16 under model.head_dim=16 or
  model.num_heads=2; not the preset's D/H of 4 heads, which left s at 8^-1/2."""
  from configs import llama
  for key, value, d_h in (("head_dim", 0, 8), ("head_dim", 16, 16), ("num_heads", 2, 16)):
    c = llama.get_config("family=gemma2,smoke")
    c.model[key] = value
    if key == "num_heads":
      c.model.num_kv_heads = 1
    m = run.resolve_config(c, tasks=tasks.get).model
    assert m.head_size == d_h
    assert (m.query_scale or m.head_size**-0.5) == d_h**-0.5, (key, value, m.query_scale)


def test_gemma2s_window_follows_the_final_seq_len():
  """family=gemma2's W = min(4096, seq_len/2) of the run's data.seq_len, a
  --config.data.seq_len override included (the preset's seq_len left W at 16 for a 16-token
  sequence: local layers saw all of it); a model.sliding_window set by hand is kept."""
  from configs import llama

  def window(arg, **keys):
    c = llama.get_config(arg)
    for key, value in keys.items():
      section, _, name = key.partition("__")
      c[section][name] = value
    return run.resolve_config(c, tasks=tasks.get).model

  assert window("family=gemma2,smoke").sliding_window == 16  # seq 32
  assert window("family=gemma2,smoke", data__seq_len=16).sliding_window == 8
  assert window("family=gemma2,smoke", data__seq_len=3).sliding_window == 1
  assert window("family=gemma2,size=7b").sliding_window == 2048  # seq 4096
  assert window("family=gemma2,size=7b", model__max_len=16384,
                data__seq_len=16384).sliding_window == 4096  # Gemma 2's 4096 of 8192, at most
  m = window("family=gemma2,smoke", data__seq_len=16, model__sliding_window=12)
  assert m.layer_windows() == [12, 0]
  assert window("family=llama,smoke", data__seq_len=16).sliding_window == 0
  from lnjax.models import ModelConfig
  with pytest.raises(ValueError, match="for_length first"):  # (never a mask of width -1)
    ModelConfig(sliding_window=-1, attention_pattern="local").layer_windows()


def test_an_unset_qk_norm_is_resolved_with_the_run_and_the_config_stays_frozen():
  """model.qk_norm=None (family=qwen3's) stays None in the frozen ModelConfig, no field
  changed behind its back, and is resolved where the run's other derived fields are
  (`for_placement`, called by resolve_config): on unless a placement of the model
  normalizes q and k its own way. A model built from it unresolved is refused, never built
  silently without its QK-norm."""
  from lnjax.models import ModelConfig, placement
  assert ModelConfig(qk_norm=None).qk_norm is None
  for position, on in (("pre", True), ("sandwich", True), ("olmo2", False), ("ngpt", False),
                       ("hybridnorm", False)):
    assert ModelConfig(qk_norm=None, norm_position=position).for_placement().qk_norm is on
  assert ModelConfig(qk_norm=None, decoder_norm_position="olmo2").for_placement().qk_norm is False
  assert ModelConfig(qk_norm=False).for_placement().qk_norm is False  # Set by hand: kept.
  with pytest.raises(ValueError, match="for_placement first"):
    placement.sublayer_options(ModelConfig(qk_norm=None))


def test_llama_shapes_have_the_published_parameter_counts():
  """size=1b and size=7b build Llama 3.2 1B and Llama 2 7B: 1,235,814,400 and
  6,738,415,616 parameters, the counts transformers gives for meta-llama/Llama-3.2-1B and
  meta-llama/Llama-2-7b-hf (shapes only: jax.eval_shape, no memory)."""
  import math

  import jax
  import jax.numpy as jnp

  from configs import llama
  from lnjax.models import TransformerLM
  for size, expected in (("1b", 1_235_814_400), ("7b", 6_738_415_616)):
    model = TransformerLM(run.resolve_config(llama.get_config(f"size={size}"),
                                             tasks=tasks.get).model)
    shapes = jax.eval_shape(lambda: model.init(jax.random.key(0), jnp.ones((1, 8), jnp.int32)))
    assert sum(math.prod(x.shape) for x in jax.tree.leaves(shapes)) == expected, size


@pytest.mark.slow  # Trains 40 steps (about a minute on 2 cores).
def test_llama_smoke_trains(tmp_path):
  """configs/llama.py:family=gemma2,smoke (the family with the most options: local and
  global layers, soft-caps, (1 + w) RMSNorm, GeGLU, Sandwich) through train_and_evaluate,
  as `lnjax train --config=llama:...,smoke` runs it: the loss falls."""
  from configs import llama
  from lnjax.core import train
  from test_train import train_losses
  c = llama.get_config("family=gemma2,smoke")
  with c.unlocked():
    c.mesh.data = 1
    c.train.num_steps, c.train.eval_every_steps, c.train.checkpoint_every_steps = 40, 40, 40
  wd = str(tmp_path / "gemma2")
  assert train.train_and_evaluate(c, wd, tasks=tasks.get)["status"] == "completed"
  losses = train_losses(wd)
  assert losses[40] < losses[5] - 0.3, losses
