"""Llama, Qwen3, Gemma 2, Gemma 3 (text) and OLMo 2 folders imported into lnjax's
TransformerLM and written back (lnjax/hf/decoders.py, lnjax/hf/checkpoint.py).

No network: tiny models with random weights (every weight, norm gains included, so that a
gain read as 1 + w or as w would show), built by transformers 5.24 from its own config
classes and saved with save_pretrained; odd head counts, grouped-query ratios 1, 2 and 3,
tied and untied embeddings, sliding windows shorter than the input. Compared with
transformers on padded batches (left and right), at length 1 and at the maximum length.
"""

import functools
import json
import os

import numpy as np
import pytest

from lnjax.hf import checkpoint as hf
from lnjax.hf import decoders
from conftest import (assert_layer_removal_is_the_block_passing_its_input_on, edit_hf_config,
                      import_benchmark, read_only)

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
    # Gemma 3's text model: QK-norm with (1 + w), local and global layers of one θ, untied;
    # an attention soft-cap in config.json, which transformers' Gemma 3 does not apply.
    "gemma3": ("Gemma3TextConfig", "Gemma3ForCausalLM", dict(
        hidden_size=32, num_attention_heads=2, num_key_value_heads=1, head_dim=16,
        intermediate_size=64, sliding_window=4, layer_types=["sliding_attention", "full_attention"],
        attn_logit_softcapping=2.0, tie_word_embeddings=False, rope_parameters={
            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
            "full_attention": {"rope_type": "default", "rope_theta": 10000.0}}), "sandwich"),
    # Gemma 3 of local layers only (sliding_window_pattern 6) and Gemma3TextConfig's own
    # θ, 10⁶ global and 10⁴ local: one θ for the layers it has.
    "gemma3_local": ("Gemma3TextConfig", "Gemma3ForCausalLM", dict(
        hidden_size=32, num_attention_heads=2, num_key_value_heads=1, head_dim=16,
        intermediate_size=64, sliding_window=4), "sandwich"),
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


def _next_token_loss_inputs(ids, mask):
  """Labels as transformers' causal-LM loss reads them (shifted inside it): -100 where the
  target is padding or its input position is."""
  labels = np.where(mask > 0, ids, -100)
  labels[:, 1:][mask[:, :-1] == 0] = -100
  return labels


@pytest.mark.slow
def test_llama_loss_gradient_equals_torch_for_every_weight(models):
  import jax
  import jax.numpy as jnp
  import torch
  from flax import traverse_util

  folder, model = models["llama"]
  imported = hf.read_folder(folder)
  ids, mask = padded_batch(1)
  labels = _next_token_loss_inputs(ids, mask)
  model.zero_grad()
  out = model(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask),
              labels=torch.tensor(labels))
  out.loss.backward()
  theirs_grad = dict(model.named_parameters())

  def loss(params):
    logits = imported.model.apply({"params": params}, jnp.asarray(ids), mask_BxT=jnp.asarray(mask))
    targets, keep = labels[:, 1:], labels[:, 1:] != -100
    logp = jax.nn.log_softmax(logits[:, :-1], -1)
    nll = -jnp.take_along_axis(logp, jnp.asarray(np.maximum(targets, 0))[..., None], -1)[..., 0]
    return jnp.sum(nll * keep) / keep.sum()

  # (Jitted: one program, where op by op the gradient compiled 124, 2.7 s of CPU against
  # 1.3 s, cold compilation cache, 2026-12-07, 2-core machine.)
  value, grads = jax.jit(jax.value_and_grad(loss))(imported.params)
  assert float(value) == pytest.approx(out.loss.item(), abs=1e-5)
  flat = traverse_util.flatten_dict(grads, sep=".")
  mapping = hf.tensor_map("LlamaForCausalLM", imported.cfg, "model.")
  assert {name for name, _, _ in mapping} == set(flat)  # Every weight compared.
  for name, hf_name, how in mapping:
    want = theirs_grad[hf_name].grad.numpy()
    got = np.asarray(flat[name]).T if how == "linear" else np.asarray(flat[name])
    scale = np.abs(want).max()
    assert scale > 0, hf_name
    assert np.abs(got - want).max() <= 1e-4 * scale, (hf_name, np.abs(got - want).max(), scale)


@pytest.mark.slow
@pytest.mark.parametrize("name", list(MODELS))
def test_exported_folder_loads_in_transformers_with_the_same_logits(models, tmp_path, name):
  import transformers

  folder, model = models[name]
  imported = hf.read_folder(folder)
  config, tensors = hf.to_hf("lm", imported.cfg, imported.params)
  hf.write_folder(str(tmp_path), config, tensors)
  again = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path)).eval()
  assert type(again).__name__ == MODELS[name][1]
  ids, mask = padded_batch(2)
  real = mask.astype(bool)
  np.testing.assert_allclose(theirs(again, ids, mask)[real], theirs(model, ids, mask)[real],
                             atol=1e-4, rtol=0)


# lnjax models with random weights that no Hugging Face folder made: the export's own
# conversions (a √D-scaled tied embedding written untied as √D·E for Llama; an unscaled one
# as E/√D for Gemma 2, whose embedding is multiplied by √D; a window on a Qwen3 layer).
LNJAX_MODELS = {
    "LlamaForCausalLM": dict(norm_position="pre", scale_embeddings=True, tie_embeddings=True,
                             num_heads=3, num_kv_heads=1, d_model=48),
    "Qwen3ForCausalLM": dict(norm_position="pre", qk_norm=True, num_kv_heads=2, head_dim=16,
                             sliding_window=3, attention_pattern="global,local"),
    "Gemma2ForCausalLM": dict(norm_position="sandwich", norm_unit_offset=True,
                              scale_embeddings=False, tie_embeddings=True, activation="gelu",
                              num_kv_heads=2, query_scale=0.25, attn_logit_softcap=2.0,
                              final_logit_softcap=3.0, sliding_window=3,
                              attention_pattern="local,global"),
    # Global layers only: written with a window (max_len) that no layer uses, as
    # Gemma3TextModel builds its sliding-window mask even then.
    "Gemma3ForCausalLM": dict(norm_position="sandwich", norm_unit_offset=True, qk_norm=True,
                              activation="gelu", num_kv_heads=1, head_dim=12),
    "Olmo2ForCausalLM": dict(norm_position="olmo2", num_kv_heads=2, rope_theta=5e5),
}


def lnjax_model(**options):
  return _lnjax_model(tuple(sorted(options.items())))


@functools.cache
def _lnjax_model(options: tuple):
  """(cfg, model, params) made once per options: 25 tests ask for 9 models (init op by op).
  Read-only (the leaves are not writeable): hf.to_hf's tensors are written to folders."""
  import jax

  from lnjax.models import ModelConfig

  base = dict(vocab_size=VOCAB, num_layers=2, d_model=32, num_heads=4, d_ff=64,
              max_len=MAX_LEN, dropout_rate=0.0, pos_emb="rope", gated_ffn=True,
              activation="silu", norm_kind="rmsnorm", use_bias=False)
  cfg = ModelConfig(**{**base, **dict(options)})
  model = hf.make_model("lm", cfg)
  rng = np.random.RandomState(0)
  params = jax.tree.map(lambda x: np.asarray(x) + 0.2 * rng.randn(*x.shape).astype(np.float32),
                        hf._init(model, "lm"))
  read_only(params)
  # (The file 39.6, 40.7 -> 39.3, 37.9 s of CPU, cold compilation cache, 2026-12-07, 2-core
  # machine: within the machine's noise.)
  return cfg, model, params


@pytest.mark.slow
@pytest.mark.parametrize("architecture", list(LNJAX_MODELS))
def test_an_lnjax_model_exports_as_its_family_with_its_own_logits(tmp_path, architecture):
  import transformers

  cfg, model, params = lnjax_model(**LNJAX_MODELS[architecture])
  config, tensors = hf.to_hf("lm", cfg, params)
  assert config["architectures"] == [architecture]
  hf.write_folder(str(tmp_path), config, tensors)
  theirs_model = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path)).eval()
  ids, mask = padded_batch(3)
  real = mask.astype(bool)
  ours = np.asarray(hf.logits(hf.Imported("", architecture, "lm", cfg, model, params, {}),
                              ids, mask))
  np.testing.assert_allclose(ours[real], theirs(theirs_model, ids, mask)[real], atol=1e-4, rtol=0)
  back = hf.read_folder(str(tmp_path))  # ... and back into lnjax.
  np.testing.assert_allclose(np.asarray(hf.logits(back, ids, mask))[real], ours[real], atol=1e-5)


# ---- Refusals: one line naming the field (no torch needed)


def llama_folder(folder, **options) -> str:
  cfg, _, params = lnjax_model(**{"num_kv_heads": 2, **options})
  config, tensors = hf.to_hf("lm", cfg, params)
  hf.write_folder(str(folder), config, tensors)
  return str(folder)


BAD_CONFIGS = {
    "rope_llama3": (dict(rope_parameters={"rope_type": "llama3", "factor": 8.0,
                                          "rope_theta": 5e5}),
                    "config.json: rope_parameters: rope_type='llama3' is not supported "
                    "(lnjax imports 'default')"),
    "rope_scaling_linear": (dict(rope_scaling={"type": "linear", "factor": 2.0}),
                            "config.json: rope_scaling: rope_type='linear' is not supported"),
    "partial_rotary": (dict(rope_parameters={"rope_type": "default", "rope_theta": 1e4,
                                             "partial_rotary_factor": 0.5}),
                       "partial_rotary_factor=0.5 is not supported"),
    "architectures_int": (dict(architectures=5), "config.json: architectures=5 must be a list"),
    "architectures_nested": (dict(architectures=[["LlamaForCausalLM"]]),
                             "architectures=[['LlamaForCausalLM']] must be a list holding one"),
    "unknown_architecture": (dict(architectures=["MixtralForCausalLM"]),
                             "architectures=['MixtralForCausalLM'] is not supported"),
    "layers_float": (dict(num_hidden_layers=2.5),
                     "config.json: num_hidden_layers=2.5 must be an integer >= 1"),
    "width_string": (dict(hidden_size="32"), "config.json: hidden_size='32' must be an integer"),
    "eps_negative": (dict(rms_norm_eps=-1e-6), "config.json: rms_norm_eps=-1e-06 must be a "
                     "finite number > 0"),
    "tie_string": (dict(tie_word_embeddings="yes"), "tie_word_embeddings='yes' must be true or false"),
    "gqa_not_dividing": (dict(num_key_value_heads=3),
                         "num_attention_heads=4 is not a multiple of num_key_value_heads=3"),
    "kv_heads_vs_weights": (dict(num_key_value_heads=1),
                            "tensor 'model.layers.0.self_attn.k_proj.weight' has shape (16, 32), "
                            "config.json implies (8, 32)"),
    "activation": (dict(hidden_act="mish"), "config.json: hidden_act='mish' is not supported"),
    "bias_mismatch": (dict(attention_bias=True), "attention_bias=True with mlp_bias=False"),
    "local_layers_in_llama": (dict(layer_types=["sliding_attention", "full_attention"]),
                              "layer_types=['sliding_attention', 'full_attention'] is not supported"),
    "model_type": (dict(model_type="mistral"), "config.json: model_type='mistral' is not supported"),
}


@pytest.mark.parametrize("case", list(BAD_CONFIGS))
def test_a_config_lnjax_cannot_carry_is_refused_in_one_line(tmp_path, case):
  folder = llama_folder(tmp_path / "llama")
  hf.read_folder(folder)  # (valid before the edit)
  changes, message = BAD_CONFIGS[case]
  edit_hf_config(folder, **changes)
  with pytest.raises(hf.HFError) as e:
    hf.read_folder(folder)
  assert message in str(e.value) and "\n" not in str(e.value), str(e.value)


def test_gemma3_with_two_rope_thetas_is_refused_naming_rope_parameters():
  from test_hf_modern import base_config

  config = base_config("Gemma3ForCausalLM", layer_types=["sliding_attention",
                                                         "full_attention"], rope_parameters={
      "sliding_attention": {"rope_type": "default", "rope_theta": 1e4},
      "full_attention": {"rope_type": "default", "rope_theta": 1e6}})
  with pytest.raises(hf.HFError, match="config.json: rope_parameters gives the local and "
                     "global layers different RoPE θ"):
    hf.model_config(config, "Gemma3ForCausalLM")
  config["rope_parameters"]["full_attention"]["rope_theta"] = 1e4
  assert hf.model_config(config, "Gemma3ForCausalLM").rope_theta == 1e4
  # transformers 4's format (Gemma 3's released config.json): rope_theta for the global
  # layers, rope_local_base_freq for the local ones (10⁴ where absent, Gemma3TextConfig's).
  legacy = {k: v for k, v in config.items() if k != "rope_parameters"}
  legacy.update(rope_theta=1e6, rope_local_base_freq=1e4, rope_scaling=None)
  with pytest.raises(hf.HFError, match="different RoPE θ"):
    hf.model_config(legacy, "Gemma3ForCausalLM")
  legacy.pop("rope_local_base_freq")
  with pytest.raises(hf.HFError, match="different RoPE θ"):
    hf.model_config(legacy, "Gemma3ForCausalLM")
  legacy.update(rope_theta=1e6, rope_local_base_freq=1e6)
  assert hf.model_config(legacy, "Gemma3ForCausalLM").rope_theta == 1e6


def test_gemma3s_theta_is_each_layer_types_as_transformers_defaults_it():
  """Gemma3TextConfig (transformers 5.24): an entry of rope_parameters without rope_theta,
  or a layer type without an entry, takes rope_theta (global) or rope_local_base_freq
  (local), else 10⁶ global and 10⁴ local; only the model's own layer types count."""
  both = ["sliding_attention", "full_attention"]
  for rope in ({"full_attention": {"rope_type": "default", "rope_theta": 1e6}},
               {"full_attention": {"rope_type": "default"},
                "sliding_attention": {"rope_type": "default"}}, None):
    config = base_config("Gemma3ForCausalLM", layer_types=both, rope_parameters=rope)
    with pytest.raises(hf.HFError, match=r"different RoPE θ \({'full_attention': 1000000.0, "
                       r"'sliding_attention': 10000.0}\)"):
      hf.model_config(config, "Gemma3ForCausalLM")
  local = base_config("Gemma3ForCausalLM", rope_parameters=None)  # 2 local layers (of 6)
  assert hf.model_config(local, "Gemma3ForCausalLM").rope_theta == 1e4
  glob = base_config("Gemma3ForCausalLM", layer_types=["full_attention"] * 2,
                     rope_parameters={"sliding_attention": {"rope_type": "linear"}})
  assert hf.model_config(glob, "Gemma3ForCausalLM").rope_theta == 1e6


CONFIG_CLASSES = {"LlamaForCausalLM": "LlamaConfig", "Qwen3ForCausalLM": "Qwen3Config",
                  "Gemma2ForCausalLM": "Gemma2Config", "Gemma3ForCausalLM": "Gemma3TextConfig",
                  "Olmo2ForCausalLM": "Olmo2Config"}


@pytest.mark.slow  # (imports transformers for its configuration classes)
@pytest.mark.parametrize("architecture, fields", [
    ("Qwen3ForCausalLM", dict(use_sliding_window=True, sliding_window=4, max_window_layers=2)),
    ("Gemma2ForCausalLM", dict(sliding_window=4)),
    ("Gemma3ForCausalLM", dict(sliding_window=4, sliding_window_pattern=3, rope_parameters={
        kind: {"rope_type": "default", "rope_theta": 1e4}  # (one θ: lnjax has one)
        for kind in ("full_attention", "sliding_attention")}))])
def test_layer_types_left_out_are_filled_in_as_transformers_does(architecture, fields):
  """A config.json without layer_types (as older transformers wrote them): each of 7 layers
  local or global as transformers' own configuration class fills them in, the oracle here:
  Qwen3's layers from max_window_layers on local, Gemma 2's alternation (layer 0 local),
  Gemma 3's every sliding_window_pattern-th layer global. One off in either rule moves
  every window to the neighbouring layer, which the imported-logits tests (whose configs
  list layer_types) would not see."""
  import transformers

  theirs = getattr(transformers, CONFIG_CLASSES[architecture])(num_hidden_layers=7, **fields)
  config = base_config(architecture, num_hidden_layers=7, **fields)
  assert "layer_types" not in config
  cfg = hf.model_config(config, architecture)
  assert decoders.layer_types(cfg) == theirs.layer_types
  assert cfg.sliding_window == 4


@pytest.mark.slow  # (imports transformers for its configuration classes)
@pytest.mark.parametrize("architecture", list(CONFIG_CLASSES))
def test_a_config_without_rms_norm_eps_reads_its_familys_default(architecture):
  """rms_norm_eps left out of config.json: the ε of transformers' own configuration class
  for that family (from_pretrained's, so the logits stay transformers'): 1e-6, but OLMo 2's
  1e-5 (Olmo2Config)."""
  import transformers

  expected = getattr(transformers, CONFIG_CLASSES[architecture])().rms_norm_eps
  config = base_config(architecture)
  config.pop("rms_norm_eps")
  assert hf.model_config(config, architecture).norm_eps == expected


def test_a_model_with_no_family_is_refused_on_export():
  cfg, _, params = lnjax_model(norm_position="peri")
  with pytest.raises(hf.HFError, match="model.norm_position='peri' with qk_norm=False, "
                     "norm_unit_offset=False does not map onto a Hugging Face family"):
    hf.to_hf("lm", cfg, params)
  cfg, _, params = lnjax_model(norm_position="pre", attn_logit_softcap=5.0)
  with pytest.raises(hf.HFError, match="model.attn_logit_softcap=5.0 does not map onto "
                     "LlamaForCausalLM"):
    hf.to_hf("lm", cfg, params)


def test_fields_config_json_leaves_out_are_read_as_transformers_defaults_them():
  """A hand-written config.json may leave fields out: each is then its configuration
  class's default (transformers 5.24), not one lnjax default for every family."""
  def read(architecture, *absent, **changes):
    config = {k: v for k, v in base_config(architecture, **changes).items() if k not in absent}
    return hf.model_config(config, architecture)

  assert read("Qwen3ForCausalLM", "head_dim").head_size == 128  # Qwen3Config
  assert read("Gemma2ForCausalLM", "head_dim").head_size == 256  # Gemma2Config
  assert read("LlamaForCausalLM", "head_dim").head_size == 32 // 4  # LlamaConfig: D / H
  assert read("Olmo2ForCausalLM", "rms_norm_eps").norm_eps == 1e-5  # Olmo2Config
  assert read("LlamaForCausalLM", "rms_norm_eps").norm_eps == 1e-6
  gemma = read("Gemma2ForCausalLM", "sliding_window")  # Gemma2Config: 4096
  assert (gemma.attention_pattern, gemma.sliding_window) == ("local,global", 4096)
  qwen = read("Qwen3ForCausalLM", "layer_types", use_sliding_window=True, max_window_layers=1)
  assert (qwen.attention_pattern, qwen.sliding_window) == ("global,local", 4096)
  # Gemma2Config's soft-caps 50 and 30 where the keys are absent; an explicit null is none.
  gemma = read("Gemma2ForCausalLM", "attn_logit_softcapping", "final_logit_softcapping")
  assert (gemma.attn_logit_softcap, gemma.final_logit_softcap) == (50.0, 30.0)
  gemma = read("Gemma2ForCausalLM", attn_logit_softcapping=None, final_logit_softcapping=None)
  assert (gemma.attn_logit_softcap, gemma.final_logit_softcap) == (0.0, 0.0)
  gemma = read("Gemma3ForCausalLM", "final_logit_softcapping")  # Gemma3TextConfig: None
  assert gemma.final_logit_softcap == 0.0


@pytest.mark.slow
def test_a_folder_without_head_dim_and_eps_fields_imports_as_transformers_reads_it(tmp_path):
  """Qwen3 of 128-wide heads (Qwen3Config's default) and OLMo 2 (ε 1e-5, Olmo2Config's)
  saved by transformers, head_dim and rms_norm_eps then taken out of config.json:
  transformers reads the folder with its defaults, and lnjax gives its logits."""
  import torch
  import transformers

  for name, fields in (("Qwen3", dict(num_attention_heads=2, num_key_value_heads=1)),
                       ("Olmo2", dict(num_attention_heads=4, num_key_value_heads=2))):
    config = getattr(transformers, f"{name}Config")(
        vocab_size=VOCAB, num_hidden_layers=1, hidden_size=32, intermediate_size=48,
        max_position_embeddings=MAX_LEN, pad_token_id=0, bos_token_id=None, eos_token_id=None,
        **fields)
    folder = tmp_path / name
    getattr(transformers, f"{name}ForCausalLM")(config).save_pretrained(folder)
    config = json.loads((folder / "config.json").read_text())
    config = {k: v for k, v in config.items() if k not in ("head_dim", "rms_norm_eps")}
    (folder / "config.json").write_text(json.dumps(config))
    model = transformers.AutoModelForCausalLM.from_pretrained(folder).eval()
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():  # (a small embedding: ε shows in the norms of q and k)
      for p in model.parameters():
        p.copy_(torch.randn(p.shape, generator=gen) * 0.2)
      model.model.embed_tokens.weight.mul_(0.01)
    model.save_pretrained(folder)
    (folder / "config.json").write_text(json.dumps(config))
    ids, mask = padded_batch(5)
    real = mask.astype(bool)
    np.testing.assert_allclose(np.asarray(hf.logits(hf.read_folder(str(folder)), ids, mask))[real],
                               theirs(model, ids, mask)[real], atol=1e-4, rtol=0)


def test_gemma3s_attention_soft_cap_is_left_unapplied_as_transformers_leaves_it():
  """Gemma3Attention passes no softcap to its attention function (transformers 5.24), so
  a Gemma 3 config.json's attn_logit_softcapping changes nothing there: imported as no
  cap, and an lnjax model with one is not written as Gemma 3. Gemma 2 applies both."""
  gemma3 = hf.model_config(base_config("Gemma3ForCausalLM"), "Gemma3ForCausalLM")
  assert (gemma3.attn_logit_softcap, gemma3.final_logit_softcap) == (0.0, 30.0)
  gemma2 = hf.model_config(base_config("Gemma2ForCausalLM"), "Gemma2ForCausalLM")
  assert (gemma2.attn_logit_softcap, gemma2.final_logit_softcap) == (50.0, 30.0)
  options = {**LNJAX_MODELS["Gemma3ForCausalLM"], "attn_logit_softcap": 5.0}
  cfg, _, params = lnjax_model(**options)
  with pytest.raises(hf.HFError, match="model.attn_logit_softcap=5.0 does not map onto "
                     "Gemma3ForCausalLM: transformers' Gemma 3 applies no attention-logit"):
    hf.to_hf("lm", cfg, params)


# Window and attention fields lnjax cannot carry or transformers cannot run (5.24), each one
# line naming the field: (architecture, config.json changes, message).
REFUSED_WINDOWS_AND_CAPS = {
    # A window beyond int32 (ModelConfig's bound, 2³¹ − 1), not jax's OverflowError.
    "gemma2_window_2e31": ("Gemma2ForCausalLM", dict(sliding_window=2**31),
                           "config.json of Gemma2ForCausalLM does not map onto lnjax: "
                           "model.sliding_window=2147483648 is invalid: at most 2147483647"),
    "qwen3_window_1e12": ("Qwen3ForCausalLM", dict(
        use_sliding_window=True, sliding_window=10**12, layer_types=["sliding_attention"] * 2),
        "model.sliding_window=1000000000000 is invalid: at most 2147483647"),
    # A layer type lnjax has no attention for, with or without a window in use.
    "qwen3_chunked": ("Qwen3ForCausalLM", dict(layer_types=["chunked_attention",
                                                            "full_attention"]),
                      "config.json: layer_types='chunked_attention' is not supported (lnjax "
                      "imports 'full_attention' or 'sliding_attention')"),
    "gemma3_chunked_global": ("Gemma3ForCausalLM", dict(layer_types=["full_attention",
                                                                     "chunked_attention"]),
                              "layer_types='chunked_attention' is not supported"),
    # Gemma2Model and Gemma3TextModel: a null window fails on every call (TypeError).
    "gemma2_window_null": ("Gemma2ForCausalLM", dict(sliding_window=None),
                           "config.json: sliding_window=null must be an integer >= 1"),
    "gemma2_global_window_null": ("Gemma2ForCausalLM", dict(
        sliding_window=None, layer_types=["full_attention"] * 2), "sliding_window=null must"),
    "gemma3_window_null": ("Gemma3ForCausalLM", dict(sliding_window=None),
                           "config.json: sliding_window=null must be an integer >= 1"),
    # A cap of 0 is no "off" in transformers: it divides by it (null is off).
    "gemma2_attn_cap_0": ("Gemma2ForCausalLM", dict(attn_logit_softcapping=0),
                          "config.json: attn_logit_softcapping=0 must be null (no cap) or a "
                          "finite number > 0"),
    "gemma2_final_cap_0": ("Gemma2ForCausalLM", dict(final_logit_softcapping=0.0),
                           "config.json: final_logit_softcapping=0.0 must be null (no cap) or "
                           "a finite number > 0"),
    "gemma3_final_cap_0": ("Gemma3ForCausalLM", dict(final_logit_softcapping=0),
                           "final_logit_softcapping=0 must be null (no cap)"),
    "gemma2_attn_cap_negative": ("Gemma2ForCausalLM", dict(attn_logit_softcapping=-5.0),
                                 "attn_logit_softcapping=-5.0 must be null (no cap) or a"),
}


@pytest.mark.parametrize("case", list(REFUSED_WINDOWS_AND_CAPS))
def test_a_window_layer_type_or_soft_cap_lnjax_cannot_carry_is_refused_in_one_line(case):
  architecture, changes, message = REFUSED_WINDOWS_AND_CAPS[case]
  hf.model_config(base_config(architecture), architecture)  # (valid before the changes)
  with pytest.raises(hf.HFError) as e:
    hf.model_config(base_config(architecture, **changes), architecture)
  assert message in str(e.value) and "\n" not in str(e.value), str(e.value)


def test_windows_and_soft_caps_transformers_runs_are_still_imported():
  """The neighbours of the refusals above that transformers 5.24 runs: the largest int32
  window; Qwen3's null window (no window: Qwen3Model builds no sliding mask without
  sliding layers); null caps (off); Gemma 3's attention cap of 0 (read, never applied)."""
  def read(architecture, **changes):
    return hf.model_config(base_config(architecture, **changes), architecture)

  assert read("Gemma2ForCausalLM", sliding_window=2**31 - 1).sliding_window == 2**31 - 1
  qwen = read("Qwen3ForCausalLM", use_sliding_window=True, sliding_window=None)
  assert (qwen.attention_pattern, qwen.sliding_window) == ("global", 0)
  qwen = read("Qwen3ForCausalLM", layer_types=["sliding_attention", "full_attention"])
  assert (qwen.attention_pattern, qwen.sliding_window) == ("global", 0)  # (no window in use)
  gemma = read("Gemma2ForCausalLM", attn_logit_softcapping=None, final_logit_softcapping=None)
  assert (gemma.attn_logit_softcap, gemma.final_logit_softcap) == (0.0, 0.0)
  gemma3 = read("Gemma3ForCausalLM", attn_logit_softcapping=0, final_logit_softcapping=None)
  assert (gemma3.attn_logit_softcap, gemma3.final_logit_softcap) == (0.0, 0.0)


@pytest.mark.slow
def test_the_refused_gemma_values_fail_in_transformers_and_the_kept_ones_run():
  """The oracle of the Gemma refusals above: transformers 5.24's own model on each value,
  a null window fails (TypeError, or ValueError without local layers), a final cap of 0
  gives non-finite logits; null caps and Gemma 3's attention cap of 0 run finite."""
  import torch
  import transformers

  common = dict(vocab_size=VOCAB, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                num_attention_heads=2, num_key_value_heads=1, head_dim=8,
                max_position_embeddings=8)
  ids = torch.tensor([[1, 2, 3, 4, 5]])

  def logits(architecture, **fields):
    config = getattr(transformers, CONFIG_CLASSES[architecture])(**common, **fields)
    with torch.no_grad():
      return getattr(transformers, architecture)(config).eval()(input_ids=ids).logits

  gemma2, gemma3 = "Gemma2ForCausalLM", "Gemma3ForCausalLM"
  for architecture in (gemma2, gemma3):
    with pytest.raises(TypeError):
      logits(architecture, sliding_window=None)
    final_0 = logits(architecture, sliding_window=4, final_logit_softcapping=0.0)
    assert not torch.isfinite(final_0).all()
  with pytest.raises(ValueError, match="sliding_window"):
    logits(gemma2, sliding_window=None, layer_types=["full_attention"] * 2)
  for architecture, fields in ((gemma2, dict(attn_logit_softcapping=None,
                                             final_logit_softcapping=None)),
                               (gemma3, dict(attn_logit_softcapping=0.0))):
    assert torch.isfinite(logits(architecture, sliding_window=4, **fields)).all()


@pytest.mark.slow
def test_analyze_cli_refuses_a_window_layer_type_or_cap_in_one_line(tmp_path):
  """lnjax analyze --hf on folders whose config.json holds a refused window, layer type
  or cap: exit 2 and one line on stderr (no traceback, no report)."""
  from conftest import run_command_lines

  gemma = llama_folder(tmp_path / "gemma2", **LNJAX_MODELS["Gemma2ForCausalLM"])
  qwen = llama_folder(tmp_path / "qwen3", **LNJAX_MODELS["Qwen3ForCausalLM"])
  ids = tmp_path / "ids.txt"
  ids.write_text(" ".join(map(str, range(40))))
  cases = {"gemma_window": (gemma, dict(sliding_window=2**31), "sliding_window=2147483648"),
           "qwen_window": (qwen, dict(sliding_window=10**12), "sliding_window=1000000000000"),
           "qwen_chunked": (qwen, dict(use_sliding_window=False, layer_types=[
               "chunked_attention", "full_attention"]), "layer_types='chunked_attention'"),
           "gemma_null": (gemma, dict(sliding_window=None), "sliding_window=null"),
           "gemma_cap_0": (gemma, dict(attn_logit_softcapping=0), "attn_logit_softcapping=0")}
  for name, (folder, changes, _) in cases.items():
    os.system(f"cp -r {folder} {tmp_path / name}")
    edit_hf_config(tmp_path / name, **changes)
  env = {**os.environ, "LNJAX_PROGRESS_SECONDS": "100000", "HF_HUB_OFFLINE": "1"}
  runs = run_command_lines([["lnjax.cli.analyze", f"--hf={tmp_path / name}",
                             f"--token_ids={ids}", f"--output={tmp_path / 'out'}"]
                            for name in cases], env=env)
  for (name, (_, _, message)), (code, _, stderr) in zip(cases.items(), runs, strict=True):
    assert code == 2, (name, stderr)
    assert stderr.startswith("lnjax: error: ") and message in stderr, (name, stderr)
    assert len(stderr.strip().splitlines()) == 1, stderr
  assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_analyze_of_a_zero_token_stream_warns_nothing_and_stays_finite(tmp_path):
  """A token whose embedding row is 0 (transformers initializes Gemma's and OLMo 2's
  pad_token_id row so) keeps a zero stream through a model without biases: the norms'
  reference d^p/‖x − μ‖ is undefined there. The analysis takes both Jacobian means over
  the tokens where it is defined: no divide-by-zero warning, no inf in the report; None
  where no token has one."""
  import warnings

  from lnjax.analysis import probes, report
  from lnjax.hf import analyze as hf_analyze

  cfg, _, params = lnjax_model(**LNJAX_MODELS["Gemma2ForCausalLM"])
  config, tensors = hf.to_hf("lm", cfg, params)
  tensors["model.embed_tokens.weight"][0] = 0.0
  hf.write_folder(str(tmp_path / "gemma2"), config, tensors)
  ids = tmp_path / "ids.txt"
  ids.write_text(" ".join(map(str, [0] + list(range(1, 40)))))  # The zero row first.
  with warnings.catch_warnings():
    warnings.simplefilter("error", RuntimeWarning)
    result, out = hf_analyze.analyze(str(tmp_path / "gemma2"), None, str(tmp_path / "out"),
                                     num_batches=1, report=report.figures, token_ids=str(ids))
  jacobians = result["norm_jacobians"]
  assert jacobians["final_norm"]["sqrt_d_over_norm"] is not None
  assert all(np.isfinite([j["spectral_norm"], j["sqrt_d_over_norm"]]).all()
             for j in jacobians.values()), jacobians
  assert "inf" not in open(os.path.join(out, "report.md")).read()
  jacobians["final_norm"]["sqrt_d_over_norm"] = None  # As below: the report and plot take it.
  report.figures(result, str(tmp_path / "none"))
  assert "| final_norm |" in (row := next(
      line for line in open(tmp_path / "none" / "report.md") if line.startswith("| final_norm")))
  assert row.rstrip().endswith("| — |"), row
  import flax.linen as nn
  import jax

  from lnjax.models import norms

  module, zeros = norms.RMSNorm(eps=1e-6), np.zeros((2, 4), np.float32)
  params = nn.unbox(module.init(jax.random.key(0), zeros[:1])["params"])
  with warnings.catch_warnings():  # Every token x = 0: no reference (None), nothing inf.
    warnings.simplefilter("error", RuntimeWarning)
    zero = probes.ln_jacobians({"n": {"tokens": zeros, "d": 4, "module": module,
                                      "params": params}}, iters=2)
  assert zero["n"]["sqrt_d_over_norm"] is None and np.isfinite(zero["n"]["spectral_norm"])


@pytest.mark.slow
def test_a_gemma2_without_local_layers_exports_a_folder_transformers_runs(tmp_path):
  """Gemma2Model builds its sliding-window mask on every call and fails on a null
  sliding_window: a model of global layers only is written with the window max_len,
  which no layer uses, and reads back as global."""
  import transformers

  options = dict(LNJAX_MODELS["Gemma2ForCausalLM"], sliding_window=0,
                 attention_pattern="global")
  cfg, model, params = lnjax_model(**options)
  config, tensors = hf.to_hf("lm", cfg, params)
  assert config["layer_types"] == ["full_attention"] * 2 and config["sliding_window"] == MAX_LEN
  hf.write_folder(str(tmp_path), config, tensors)
  theirs_model = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path)).eval()
  ids, mask = padded_batch(3)
  real = mask.astype(bool)
  ours = np.asarray(hf.logits(hf.Imported("", "Gemma2ForCausalLM", "lm", cfg, model, params,
                                          {}), ids, mask))
  np.testing.assert_allclose(ours[real], theirs(theirs_model, ids, mask)[real], atol=1e-4, rtol=0)
  back = hf.read_folder(str(tmp_path))
  assert (back.cfg.attention_pattern, back.cfg.sliding_window) == ("global", 0)


def test_sharded_bfloat16_folder_is_read_in_bfloat16_tensor_by_tensor(tmp_path):
  """model.safetensors.index.json over two shards, bfloat16 weights: read as stored
  (bfloat16 parameters, bfloat16 compute), the same numbers as the float32 folder's
  rounded, and a shard missing is one line."""
  import ml_dtypes
  from safetensors.numpy import save_file

  folder = llama_folder(tmp_path / "f32")
  f32 = hf.read_folder(folder)
  config, tensors = hf.to_hf("lm", f32.cfg, f32.params)
  names = sorted(tensors)
  shards = {"model-00001-of-00002.safetensors": names[: len(names) // 2],
            "model-00002-of-00002.safetensors": names[len(names) // 2:]}
  sharded = tmp_path / "bf16"
  hf.write_folder(str(sharded), config, {})
  os.remove(sharded / "model.safetensors")
  for shard, keys in shards.items():
    save_file({k: tensors[k].astype(ml_dtypes.bfloat16) for k in keys}, str(sharded / shard))
  (sharded / "model.safetensors.index.json").write_text(json.dumps(
      {"metadata": {}, "weight_map": {k: s for s, keys in shards.items() for k in keys}}))
  bf16 = hf.read_folder(str(sharded))
  assert bf16.cfg.dtype == "bfloat16"
  leaf = bf16.params["layer_0"]["ffn"]["wo"]["kernel"]
  assert leaf.dtype == ml_dtypes.bfloat16
  np.testing.assert_array_equal(
      np.asarray(leaf, np.float32),
      np.asarray(f32.params["layer_0"]["ffn"]["wo"]["kernel"]).astype(ml_dtypes.bfloat16)
      .astype(np.float32))
  assert hf.read_folder(str(sharded), "float32").cfg.dtype == "float32"
  os.remove(sharded / "model-00002-of-00002.safetensors")
  with pytest.raises(hf.HFError, match="model-00002-of-00002.safetensors is missing"):
    hf.read_folder(str(sharded))


# ---- A folder without a tokenizer: lnjax.load and lnjax analyze from token ids


def char_tokenizer_folder(folder) -> str:
  """A tokenizer alone (tokenizer.json, a character vocabulary of fewer than VOCAB ids)."""
  from lnjax.hf import tokenizer as hf_tokenizer

  hf_tokenizer.write(str(folder), hf_tokenizer.char_tokenizer("abcdefghijklmnopqrstuvwxyz ,.\n"),
                     MAX_LEN)
  return str(folder)


@pytest.mark.slow
def test_lnjax_load_takes_a_hugging_face_folder_with_or_without_a_tokenizer(tmp_path):
  import lnjax

  folder = llama_folder(tmp_path / "gemma", **LNJAX_MODELS["Gemma2ForCausalLM"])
  run = lnjax.load(folder)
  assert run.placement.startswith("Sandwich-LN") and run.model_config.norm_unit_offset
  ids, mask = padded_batch(4)
  np.testing.assert_array_equal(run.logits(ids, mask),
                                np.asarray(hf.logits(hf.read_folder(folder), ids, mask)))
  np.testing.assert_array_equal(run.logits(ids[2]), run.logits(ids[2:])[0])
  with pytest.raises(hf.HFError, match="has no tokenizer files: pass lnjax.load"):
    run.encode("to be")
  with pytest.raises(hf.HFError, match=r"token ids must be integers in \[0, 97\)"):
    run.logits([100000, -5])
  named = lnjax.load(folder, tokenizer=char_tokenizer_folder(tmp_path / "tok"))
  assert named.logits("to be").shape == (5, VOCAB)
  with pytest.raises(hf.HFError, match="is a Hugging Face folder, one set of weights"):
    lnjax.load(folder, "best")


@pytest.mark.slow
def test_analyze_a_folder_without_tokenizer_from_ids_or_a_named_tokenizer(tmp_path):
  from lnjax.analysis import report
  from lnjax.hf import analyze as hf_analyze

  folder = llama_folder(tmp_path / "gemma", **LNJAX_MODELS["Gemma2ForCausalLM"])
  ids_file = tmp_path / "ids.txt"
  ids_file.write_text(" ".join(map(str, np.random.RandomState(0).randint(0, VOCAB, 200))))
  text = tmp_path / "text.txt"
  text.write_text("to be, or not to be, that is the question.\n" * 20)
  with pytest.raises(hf.HFError, match="has no tokenizer: .*--tokenizer=DIR_OR_NAME, or give "
                     "token ids with --token_ids=FILE"):
    hf_analyze.analyze(folder, str(text), str(tmp_path / "no"), report=report.figures)
  result, out = hf_analyze.analyze(folder, None, str(tmp_path / "ids"), num_batches=1,
                                   report=report.figures, token_ids=str(ids_file))
  assert result["architecture"] == "Gemma2ForCausalLM" and result["norm_position"] == "sandwich"
  assert result["tokens_per_window"] == MAX_LEN and result["tokenizer"] is None
  assert len(result["layer_removal"]["increase"]) == 2
  assert {"layer_0/ffn/wi_gate/kernel", "layer_1/self_attn/key/kernel"} <= set(result["gradient_norms"])
  assert os.path.getsize(os.path.join(out, "layer_removal.png"))
  named, _ = hf_analyze.analyze(folder, str(text), str(tmp_path / "tok"), num_batches=1,
                                report=report.figures,
                                tokenizer=char_tokenizer_folder(tmp_path / "tokenizer"))
  assert named["tokenizer"].endswith("tokenizer") and np.isfinite(named["loss"])
  ids_file.write_text("1 2 400")
  with pytest.raises(hf.HFError, match=r"id 400 is outside the model's vocabulary \[0, 97\)"):
    hf_analyze.analyze(folder, None, str(tmp_path / "bad"), report=report.figures,
                       token_ids=str(ids_file))


@pytest.mark.slow
def test_layer_removal_keeps_each_layers_local_or_global_attention():
  """Gemma 2's alternation: removing layer 0 (local) leaves layer 1 global, moved to
  index 0; the profile equals the model whose block i returns its input."""
  from lnjax import tasks
  from lnjax.core.state import Setup

  options = {**LNJAX_MODELS["Gemma2ForCausalLM"], "sliding_window": 2}
  cfg, model, params = lnjax_model(**{**options, "num_layers": 3})
  tokens = np.random.RandomState(1).randint(1, VOCAB, (2, MAX_LEN + 1)).astype(np.int32)
  batches = [{"inputs": tokens[:, :-1], "targets": tokens[:, 1:],
              "weights": np.ones((2, MAX_LEN), np.float32)}]
  setup = Setup(tasks.get("lm"), model, None, None)
  assert_layer_removal_is_the_block_passing_its_input_on(setup, params, batches, 3)


@pytest.mark.slow
def test_a_bfloat16_folder_is_read_in_less_than_twice_its_weight_bytes(tmp_path):
  """A 64 MB bfloat16 Llama read into lnjax: the peak RSS growth stays below twice the
  weight bytes (a float32 copy of the model alone would be twice; a memory-mapped read
  adds the file's pages besides). The 1B figure: benchmarks/hf_import_rss.py."""
  import subprocess
  import sys

  import jax
  import ml_dtypes
  from safetensors.numpy import save_file

  from lnjax.models import ModelConfig

  cfg = ModelConfig(vocab_size=8000, num_layers=8, d_model=512, num_heads=8, num_kv_heads=2,
                    d_ff=1536, max_len=MAX_LEN, pos_emb="rope", gated_ffn=True,
                    activation="silu", norm_kind="rmsnorm", use_bias=False, dropout_rate=0.0)
  model = hf.make_model("lm", cfg)
  shapes = hf._flat(jax.eval_shape(lambda: hf._init(model, "lm")))
  rng = np.random.default_rng(0)
  tensors = {hf_name: (rng.standard_normal(hf._hf_shape(shapes[name].shape, how), np.float32)
                       * 0.02).astype(ml_dtypes.bfloat16)
             for name, hf_name, how in hf.tensor_map("LlamaForCausalLM", cfg, "model.")}
  nbytes = sum(t.nbytes for t in tensors.values())
  assert 60e6 < nbytes < 70e6
  save_file(tensors, str(tmp_path / "model.safetensors"))
  del tensors
  from lnjax.hf import decoders
  (tmp_path / "config.json").write_text(json.dumps(
      decoders.hf_config(cfg, "LlamaForCausalLM", decoders.FAMILIES["LlamaForCausalLM"], False)))
  child = import_benchmark("hf_import_rss").READ_CHILD
  out = subprocess.run([sys.executable, "-c", child, str(tmp_path)], capture_output=True,
                       text=True, timeout=300)
  assert out.returncode == 0, out.stderr
  growth, _, dtype = out.stdout.split()
  assert dtype == "bfloat16"
  assert int(growth) < 2 * nbytes, (int(growth) / nbytes)
  print(f"peak RSS growth {int(growth) / nbytes:.2f}x the weight bytes")
  # The measurement can fail: converted to float32 (twice the bytes), the read exceeds it.
  out = subprocess.run([sys.executable, "-c", child, str(tmp_path), "float32"],
                       capture_output=True, text=True, timeout=300)
  growth, _, dtype = out.stdout.split()
  assert dtype == "float32" and int(growth) >= 2 * nbytes, (int(growth) / nbytes)


def test_the_analysis_asks_xla_cpu_for_its_memory_first_scheduler(monkeypatch):
  from lnjax.hf import analyze as hf_analyze

  monkeypatch.setenv("XLA_FLAGS", "--xla_force_host_platform_device_count=2")
  hf_analyze.memory_first_scheduling()
  assert os.environ["XLA_FLAGS"] == ("--xla_force_host_platform_device_count=2 "
                                     "--xla_cpu_enable_concurrency_optimized_scheduler=false")
  monkeypatch.setenv("XLA_FLAGS", "--xla_cpu_enable_concurrency_optimized_scheduler=true")
  hf_analyze.memory_first_scheduling()  # A user's own choice is kept.
  assert os.environ["XLA_FLAGS"] == "--xla_cpu_enable_concurrency_optimized_scheduler=true"


def test_a_tied_models_saved_head_is_read_only_where_it_copies_the_embedding(tmp_path):
  """tie_word_embeddings with lm_head.weight stored too: a copy of the embedding is left
  unread; a different matrix is another model's head, refused in one line (transformers
  would use it, lnjax the embedding: the logits would differ without a word)."""
  import jax
  from safetensors.numpy import save_file

  from lnjax.hf import decoders
  from lnjax.models import ModelConfig

  cfg = ModelConfig(vocab_size=64, num_layers=1, d_model=16, num_heads=2, num_kv_heads=1,
                    d_ff=32, max_len=MAX_LEN, pos_emb="rope", gated_ffn=True, activation="silu",
                    norm_kind="rmsnorm", use_bias=False, dropout_rate=0.0, tie_embeddings=True)
  shapes = hf._flat(jax.eval_shape(lambda: hf._init(hf.make_model("lm", cfg), "lm")))
  rng = np.random.default_rng(0)
  tensors = {hf_name: rng.standard_normal(hf._hf_shape(shapes[name].shape, how), np.float32)
             for name, hf_name, how in hf.tensor_map("LlamaForCausalLM", cfg, "model.")}
  (tmp_path / "config.json").write_text(json.dumps(
      decoders.hf_config(cfg, "LlamaForCausalLM", decoders.FAMILIES["LlamaForCausalLM"], True)))
  head = tensors["model.embed_tokens.weight"].copy()
  save_file({**tensors, "lm_head.weight": head}, str(tmp_path / "model.safetensors"))
  assert hf.read_folder(str(tmp_path)).cfg.tie_embeddings
  save_file({**tensors, "lm_head.weight": head + 1.0}, str(tmp_path / "model.safetensors"))
  with pytest.raises(hf.HFError, match="says tie_word_embeddings, but tensor 'lm_head.weight' "
                     "differs from 'model.embed_tokens.weight'"):
    hf.read_folder(str(tmp_path))
