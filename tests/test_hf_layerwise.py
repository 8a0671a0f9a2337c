"""lnjax.analysis.layerwise (what `lnjax analyze --hf` measures GPT-2 and the modern decoders
with, one layer at a time) against the whole-model probes (lnjax.analysis.probes and
removal) on tiny random float32 models built by transformers: the same loss, gradient
norms, first-update ratios, layer-removal increases and norm inputs, within 1e-5 relative.

The output matrix is cut into chunks of CHUNK_ROWS = 32 of its 96 entries, and 6 windows
make two batches of 3 (the gradient summed over both).
"""

import numpy as np
import pytest

from lnjax.analysis import layerwise, probes, removal
from lnjax.hf import analyze as hf_analyze, checkpoint as hf

VOCAB = 96
RTOL = 1e-5

# name -> (transformers config class, model class, fields): tied Llama (Pre-LN); untied
# Gemma 2 (Sandwich-LN, (1 + w) gains, √D-scaled embedding, soft caps, a local layer with
# a window of 3 shorter than the input).
MODELS = {
    "llama_tied": ("LlamaConfig", "LlamaForCausalLM", dict(
        hidden_size=32, num_attention_heads=4, num_key_value_heads=2, intermediate_size=48,
        tie_word_embeddings=True)),
    "gemma2_untied": ("Gemma2Config", "Gemma2ForCausalLM", dict(
        hidden_size=32, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
        intermediate_size=48, query_pre_attn_scalar=24, attn_logit_softcapping=2.0,
        final_logit_softcapping=3.0, sliding_window=3, tie_word_embeddings=False)),
}


def make(folder, name: str) -> str:
  """A random-weight 2-layer transformers model of `name`, saved into `folder`."""
  import torch
  import transformers

  config_class, model_class, fields = MODELS[name]
  config = getattr(transformers, config_class)(
      vocab_size=VOCAB, num_hidden_layers=2, max_position_embeddings=16, pad_token_id=0,
      bos_token_id=None, eos_token_id=None, **fields)
  model = getattr(transformers, model_class)(config)
  gen = torch.Generator().manual_seed(0)
  with torch.no_grad():
    for p in model.parameters():
      p.copy_(torch.randn(p.shape, generator=gen) * 0.2)
  model.save_pretrained(str(folder))
  return str(folder)


def assert_close(ours: dict, theirs: dict, what: str) -> None:
  assert list(ours) == list(theirs), what
  for key, value in theirs.items():
    assert ours[key] == pytest.approx(value, rel=RTOL), f"{what}: {key}"


@pytest.mark.slow  # 7-11 s each: two Hugging Face models built, analysed both ways.
@pytest.mark.parametrize("name", list(MODELS))
def test_layer_by_layer_statistics_equal_the_whole_models(tmp_path, monkeypatch, name):
  from lnjax import tasks
  from lnjax.core import optim, state as state_lib

  monkeypatch.setattr(layerwise, "CHUNK_ROWS", 32)
  imported = hf.read_folder(make(tmp_path / name, name))
  ids = np.random.default_rng(1).integers(0, VOCAB, 6 * 12)
  batches = hf_analyze.make_batches("lm", None, ids, 11, 2, 3)
  assert [b["inputs"].shape for b in batches] == [(3, 11), (3, 11)]
  setup = state_lib.Setup(tasks.get("lm"), imported.model, None, None)
  params, opt = imported.params, optim.OptConfig()
  assert layerwise.applies("lm", imported.cfg) and imported.cfg.dtype == "float32"

  fw = layerwise.forward(imported.cfg, params, batches)
  grads, ratios = layerwise.gradient_and_update_norms(fw, opt, 1e-3)
  whole_grads, whole_ratios, whole_loss = probes.gradient_and_update_norms(setup, params,
                                                                          batches, opt, 1e-3)
  assert "layer_1/ffn/wo/kernel" in grads and "embed/embedding" in grads
  assert_close(grads, whole_grads, "gradient norms")
  assert_close(ratios, whole_ratios, "update ratios")

  profile, whole = layerwise.layer_removal(fw), removal.layer_removal(setup, params, batches)
  assert profile["loss"] == pytest.approx(whole["loss"], rel=RTOL)
  assert whole_loss == pytest.approx(whole["loss"], rel=1e-6)  # The gradient's forward pass.
  assert profile["increase"] == pytest.approx(whole["increase"], rel=RTOL, abs=RTOL * whole["loss"])

  records, whole_records = layerwise.norm_inputs(fw), probes.norm_inputs(setup, params, batches[0])
  for q in ("in_sq", "out_sq"):
    assert_close({p: r[q] for p, r in records.items()},
                 {p: r[q] for p, r in whole_records.items()}, f"norms' {q}")
  for path, r in whole_records.items():  # What probes.ln_jacobians reads.
    # (Two programs round differently: a token's entries near 0 are compared at the scale
    # of the row's largest, 4.35 in Gemma 2's, which differed by 2.5e-6 on one CPU.)
    np.testing.assert_allclose(records[path]["tokens"], r["tokens"], rtol=RTOL,
                               atol=RTOL * np.abs(r["tokens"]).max())
    assert records[path]["params"] is r["params"] and records[path]["module"] == r["module"]


def test_chunks_cover_the_vocabulary_in_at_most_two_sizes():
  for vocab, rows in [(97, 40), (128256, 8192), (5, 1), (8192, 8192), (8193, 8192)]:
    parts = layerwise.chunks(vocab, rows)
    assert [a for a, _ in parts] == list(np.cumsum([0] + [s for _, s in parts[:-1]]))
    assert sum(s for _, s in parts) == vocab and len({s for _, s in parts}) <= 2
    assert max(s for _, s in parts) <= rows


def test_global_norm_clipping_is_refused():
  from lnjax.core import optim

  with pytest.raises(ValueError, match="grad_clip_norm"):
    layerwise.gradient_and_update_norms(None, optim.OptConfig(grad_clip_norm=1.0), 1e-3)
