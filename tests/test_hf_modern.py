"""Llama, Qwen3, Gemma 2, Gemma 3 (text) and OLMo 2 folders imported into lnjax's
TransformerLM and written back (lnjax/hf/decoders.py, lnjax/hf/checkpoint.py).

No network: tiny models with random weights (every weight, norm gains included, so that a
gain read as 1 + w or as w would show), built by transformers 5.24 from its own config
classes and saved with save_pretrained; odd head counts, grouped-query ratios 1, 2 and 3,
tied and untied embeddings, sliding windows shorter than the input. Compared with
transformers on padded batches (left and right), at length 1 and at the maximum length.
"""

import json
import os

import numpy as np
import pytest

from lnjax.hf import checkpoint as hf

MAX_LEN = 12
VOCAB = 97

# family -> (transformers config class, architecture class, config fields, lnjax placement)
MODELS = {
    # GQA 3 (3 heads, 1 K/V head), untied, θ = 500000 (Llama 3's), ε 1e-5.
    "llama": ("LlamaConfig", "LlamaForCausalLM", dict(
        hidden_size=48, num_attention_heads=3, num_key_value_heads=1, intermediate_size=64,
        rms_norm_eps=1e-5, tie_word_embeddings=False,
        rope_parameters={"rope_type": "default", "rope_theta": 500000.0}), "pre"),
    # MHA (ratio 1), tied, biases on every projection (attention_bias and mlp_bias).
    "llama_tied_bias": ("LlamaConfig", "LlamaForCausalLM", dict(
        hidden_size=32, num_attention_heads=4, num_key_value_heads=4, intermediate_size=48,
        tie_word_embeddings=True, attention_bias=True, mlp_bias=True), "pre"),
    # GQA 2, head_dim 16 with 3 heads of a 32-wide model (q is [32, 48]), QK-norm, layer 1
    # sliding with a window of 3 < the input, tied, θ = 10⁶.
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", dict(
        hidden_size=32, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
        intermediate_size=64, tie_word_embeddings=True, use_sliding_window=True,
        sliding_window=3, max_window_layers=1,
        rope_parameters={"rope_type": "default", "rope_theta": 1e6}), "pre"),
    # GQA 2, query_pre_attn_scalar 24 (not head_dim), soft caps small enough to bite,
    # local (window 3) and global layers alternating, tied.
    "gemma2": ("Gemma2Config", "Gemma2ForCausalLM", dict(
        hidden_size=32, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
        intermediate_size=64, query_pre_attn_scalar=24, attn_logit_softcapping=2.0,
        final_logit_softcapping=3.0, sliding_window=3, tie_word_embeddings=True), "sandwich"),
    # Gemma 3's text model: QK-norm with (1 + w), local and global layers of one θ, untied.
    "gemma3": ("Gemma3TextConfig", "Gemma3ForCausalLM", dict(
        hidden_size=32, num_attention_heads=2, num_key_value_heads=1, head_dim=16,
        intermediate_size=64, sliding_window=4, layer_types=["sliding_attention", "full_attention"],
        tie_word_embeddings=False, rope_parameters={
            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
            "full_attention": {"rope_type": "default", "rope_theta": 10000.0}}), "sandwich"),
    # GQA 3 (the K-norm over 1 head's 16 features, the Q-norm over 48), untied.
    "olmo2": ("Olmo2Config", "Olmo2ForCausalLM", dict(
        hidden_size=48, num_attention_heads=3, num_key_value_heads=1, intermediate_size=64,
        tie_word_embeddings=False), "olmo2"),
}


def make(folder, name: str, seed: int = 0):
  """A random-weight transformers model of family `name`, saved into `folder`."""
  import torch
  import transformers

  config_class, model_class, fields, _ = MODELS[name]
  config = getattr(transformers, config_class)(
      vocab_size=VOCAB, num_hidden_layers=2, max_position_embeddings=MAX_LEN, pad_token_id=0,
      bos_token_id=None, eos_token_id=None, **fields)
  model = getattr(transformers, model_class)(config).eval()
  gen = torch.Generator().manual_seed(seed)
  with torch.no_grad():
    for p in model.parameters():
      p.copy_(torch.randn(p.shape, generator=gen) * 0.2)
  model.save_pretrained(folder)
  return model


@pytest.fixture(scope="module")
def models(tmp_path_factory):
  root = tmp_path_factory.mktemp("hf_modern")
  return {name: (str(root / name), make(root / name, name)) for name in MODELS}


def padded_batch(seed: int = 0):
  """Three rows of ids, padded to MAX_LEN on the right, on the left and not at all."""
  rng = np.random.RandomState(seed)
  ids = rng.randint(1, VOCAB, (3, MAX_LEN))
  mask = np.ones_like(ids)
  mask[0, 7:] = 0  # right padding
  mask[1, :5] = 0  # left padding
  return np.where(mask > 0, ids, 0), mask


def theirs(model, ids, mask):
  import torch

  with torch.no_grad():
    return model(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask)).logits.numpy()


@pytest.mark.slow
@pytest.mark.parametrize("name", list(MODELS))
def test_imported_logits_equal_transformers(models, name):
  folder, model = models[name]
  imported = hf.read_folder(folder)
  assert imported.cfg.norm_position == MODELS[name][3]
  ids, mask = padded_batch()
  real = mask.astype(bool)
  got = np.asarray(hf.logits(imported, ids, mask))
  np.testing.assert_allclose(got[real], theirs(model, ids, mask)[real], atol=1e-4, rtol=0)
  one = ids[2:, :1]  # length 1
  np.testing.assert_allclose(np.asarray(hf.logits(imported, one)),
                             theirs(model, one, np.ones_like(one)), atol=1e-4, rtol=0)


def test_each_family_is_reported_as_its_lnjax_placement(tmp_path):
  """The placement each family is, from config.json alone (no weights needed)."""
  expected = {"LlamaForCausalLM": ("pre", False, "Pre-LN (norm_position=pre, RMSNorm)"),
              "Qwen3ForCausalLM": ("pre", True, "Pre-LN + QK-norm (norm_position=pre, RMSNorm)"),
              "Gemma2ForCausalLM": ("sandwich", False, "Sandwich-LN (norm_position=sandwich, "
                                    "RMSNorm, (1 + w) gains)"),
              "Olmo2ForCausalLM": ("olmo2", False, "OLMo 2 + QK-norm (norm_position=olmo2, "
                                   "RMSNorm)")}
  for architecture, (position, qk_norm, summary) in expected.items():
    cfg = hf.model_config(base_config(architecture), architecture)
    assert (cfg.norm_position, cfg.qk_norm) == (position, qk_norm)
    assert hf.placement_summary(cfg) == summary
    assert cfg.pos_emb == "rope" and cfg.gated_ffn and not cfg.embed_norm
  gemma = hf.model_config(base_config("Gemma2ForCausalLM"), "Gemma2ForCausalLM")
  assert gemma.norm_position != "peri"  # Gemma 2 feeds the embedding to layer 0 unnormalized.
  assert gemma.scale_embeddings and gemma.norm_unit_offset
  assert gemma.attention_pattern == "local,global" and gemma.sliding_window == 8


def base_config(architecture: str, **changes) -> dict:
  """A config.json as transformers writes it (the fields lnjax reads), 2 layers."""
  model_type = {"LlamaForCausalLM": "llama", "Qwen3ForCausalLM": "qwen3",
                "Gemma2ForCausalLM": "gemma2", "Gemma3ForCausalLM": "gemma3_text",
                "Olmo2ForCausalLM": "olmo2"}[architecture]
  config = {"architectures": [architecture], "model_type": model_type, "vocab_size": VOCAB,
            "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4,
            "num_key_value_heads": 2, "intermediate_size": 64, "max_position_embeddings": 16,
            "rms_norm_eps": 1e-6, "rope_parameters": {"rope_type": "default", "rope_theta": 1e4}}
  if model_type.startswith("gemma"):
    config.update(head_dim=8, sliding_window=8, query_pre_attn_scalar=8,
                  attn_logit_softcapping=50.0, final_logit_softcapping=30.0)
  return {**config, **changes}
