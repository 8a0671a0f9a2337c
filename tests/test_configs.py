"""Every config file and preset resolves into valid dataclasses (no data or compute)."""

import importlib

import pytest

from lnjax.core import errors, run

CASES = [
    ("default", None), ("default", "smoke"),
    ("lm", None), ("lm", "norm=post,size=course"), ("lm", "norm=pre,size=course_reg"),
    ("lm", "smoke"),
    ("multi30k_de_en", "norm=pre"), ("multi30k_de_en", "norm=post,dir=en-de"),
    ("multi30k_de_en", "smoke"), ("multi30k_de_en", "quick"),
    ("multi30k_de_en", "norm=post,quick"),
    ("iwslt14_de_en", "norm=pre"), ("iwslt14_de_en", "norm=post"), ("iwslt14_de_en", "smoke"),
    ("wmt14_en_de", "norm=pre"), ("wmt14_en_de", "norm=post"), ("wmt14_en_de", "smoke"),
]


@pytest.mark.parametrize("name,arg", CASES)
def test_config_resolves(name, arg):
  config = importlib.import_module(f"configs.{name}").get_config(arg)
  resolved = run.resolve_config(config)
  assert resolved.model.norm_position in ("pre", "post")


def test_paper_translation_presets():
  """Xiong et al. 2020 (arXiv 2002.04745) §4: IWSLT14 Post-LN 4000 warm-up + inverse sqrt, Pre-LN no
  warm-up ×0.1 at epoch 8, both lr 5e-4, 6+6 layers, D 512, FFN 1024, 4 heads; fairseq's
  sinusoidal positions (WMT14's Transformer base too)."""
  from configs import iwslt14_de_en, wmt14_en_de
  post = run.resolve_config(iwslt14_de_en.get_config("norm=post"))
  pre = run.resolve_config(iwslt14_de_en.get_config("norm=pre"))
  assert (post.opt.schedule, post.opt.warmup_steps, post.opt.learning_rate) == (
      "inverse_sqrt", 4000, 5e-4)
  assert (pre.opt.schedule, pre.opt.warmup_steps, pre.opt.decay_epochs) == ("step", 0, (8,))
  m = pre.model
  assert (m.num_layers, m.d_model, m.d_ff, m.num_heads, m.pos_emb) == (
      6, 512, 1024, 4, "sinusoidal")
  base = run.resolve_config(wmt14_en_de.get_config("norm=pre")).model
  assert (base.num_layers, base.d_model, base.d_ff, base.num_heads, base.pos_emb) == (
      6, 512, 2048, 8, "sinusoidal")


def test_course_reg_is_the_course_model_with_dropout():
  """configs/lm.py:size=course_reg (issue 21): the course workshop's model, schedule and
  length, with dropout 0.1; its `course` sweep names the same five runs."""
  from configs import lm
  from lnjax import sweep
  course = run.resolve_config(lm.get_config("size=course"))
  reg = run.resolve_config(lm.get_config("size=course_reg"))
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
  full = run.resolve_config(multi30k_de_en.get_config("norm=pre"))
  quick = run.resolve_config(multi30k_de_en.get_config("quick"))
  assert (quick.model.num_layers, quick.model.d_ff, quick.data.vocab_size) == (2, 512, 4000)
  assert quick.model.d_model == full.model.d_model and quick.data.max_tokens == full.data.max_tokens
  assert (quick.train.num_steps, quick.train.eval_every_steps,
          quick.train.checkpoint_every_steps) == (220, 220, 220)
  assert (quick.opt.learning_rate, quick.opt.warmup_steps) == (1.5e-3, 0)
  post = run.resolve_config(multi30k_de_en.get_config("norm=post,quick")).opt
  assert (post.schedule, post.warmup_steps) == ("inverse_sqrt", 100)


def test_unknown_preset_is_refused():
  from configs import iwslt14_de_en
  with pytest.raises(errors.ConfigError, match="norm"):
    iwslt14_de_en.get_config("norm=middle")
