"""The placement zoo (lnjax/models/placement.py): each variant's formula, constants and
initialization, pinned on tiny models (each paper's arXiv id is in placement.py), and each one training."""

import dataclasses
import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from lnjax import tasks
from lnjax.core import errors, optim, state, train
from lnjax.analysis import probes
from test_models import random_norms  # γ ~ 1 + N(0, ½²), β ~ N(0, ½²)
from test_train import smoke_config, train_losses
from lnjax.models import (NORM_POSITIONS, EncoderDecoder, ModelConfig, TransformerLM,
                          init_params, layers, norms, placement)

from conftest import fast_tier

CFG = ModelConfig(vocab_size=24, num_layers=2, d_model=16, num_heads=2, d_ff=32, max_len=16,
                  dropout_rate=0.0)
TOKENS = jax.random.randint(jax.random.key(0), (2, 8), 1, CFG.vocab_size)

# The two blocks every placement's formula test runs on: the 2020 one (CFG) and today's
# (docs/configs.md, "The modern block"): rotary positions, a SwiGLU FFN, one key/value head
# shared by the two query heads (MQA), no biases. The norm kind stays LayerNorm so that the
# placements' formulas read alike (RMSNorm: the OLMo 2 test; the norms' own tests).
BLOCKS = {"2020": {}, "modern": dict(pos_emb="rope", gated_ffn=True, activation="silu",
                                     num_kv_heads=1, use_bias=False)}
# Fast tier: the 2020 block; the full tier also the modern one.
EACH_BLOCK = pytest.mark.parametrize("block", fast_tier(list(BLOCKS), ("2020",)))


def _cfg(**kw):
  return dataclasses.replace(CFG, **kw)


def _lm(block="2020", **kw):
  cfg = _cfg(**BLOCKS[block], **kw)
  model = TransformerLM(cfg)
  return cfg, model, nn.unbox(init_params(model, jax.random.key(1), TOKENS))


def _theta(cfg):
  """RoPE's θ where the block has rotary positions, else 0 (none)."""
  return cfg.rope_theta if cfg.pos_emb == "rope" else 0.0


def _acts(model, params, *inputs):
  """{module path: its output} of one forward pass ('' = the whole model); a module called
  twice (the shared embedding) gives a tuple."""
  _, state = model.apply({"params": params}, *inputs, capture_intermediates=True,
                         mutable=["intermediates"])
  out = {}

  def walk(node, prefix):
    for k, v in node.items():
      if k == "__call__":
        out[prefix] = v[0] if len(v) == 1 else v
      elif isinstance(v, dict):  # (not a value sown by the module under another name)
        walk(v, f"{prefix}/{k}" if prefix else k)

  walk(state["intermediates"], "")
  return {k: jax.tree.map(np.asarray, v) for k, v in out.items()}


def _ln(x, p=None, eps=1e-5):
  """(x - μ) / √(σ² + ε) ⊙ γ + β in numpy; γ = 1, β = 0 without the norm's params `p`."""
  mu = x.mean(-1, keepdims=True)
  y = (x - mu) / np.sqrt(((x - mu) ** 2).mean(-1, keepdims=True) + eps)
  return y if p is None else y * np.asarray(p["scale"]) + np.asarray(p["bias"])


def _target_embedding(acts):
  """The decoder's input: the shared embedding's second call (the first embeds the source)."""
  return acts["target_embed"] if "target_embed" in acts else acts["embed"][1]


def _dense(x, p):
  return x @ np.asarray(p["kernel"]) + (np.asarray(p["bias"]) if "bias" in p else 0.0)


def _logits_from(hidden, params):
  return hidden @ np.asarray(params["logits"]["kernel"])


# ---- Config refusals. ---------------------------------------------------------------------

@pytest.mark.parametrize("key, value, choices", [
    ("norm_position", "middle", "post, pre, sandwich, peri, deepnorm, normformer, resi_dual, "
                                "admin, mix, b2t, dyt, lns, olmo2, ngpt, hybridnorm, derf"),
    ("norm_kind", "batchnorm", "layernorm, rmsnorm, scalenorm"),
])
def test_unknown_placement_or_norm_is_one_line_config_error(key, value, choices):
  with pytest.raises(errors.ConfigError) as e:
    _cfg(**{key: value})
  assert str(e.value) == f"model.{key}={value!r} is not one of: {choices}"


def test_mix_fraction_is_checked():
  with pytest.raises(errors.ConfigError, match="model.mix_post_fraction=1.5"):
    _cfg(mix_post_fraction=1.5)


# ---- Norms. -------------------------------------------------------------------------------

def test_scalenorm_formula_and_init():
  """ScaleNorm(x) = g · x / max(‖x‖, ε), one scalar g initialized to √D."""
  x = jax.random.normal(jax.random.key(0), (3, 16)) * 3 + 1
  x = x.at[2].set(1e-7)  # ‖x‖ < ε: divided by ε instead.
  module = norms.ScaleNorm(eps=1e-5)
  params = module.init(jax.random.key(0), x)["params"]
  g = nn.unbox(params["scale"])
  assert g.shape == () and float(g) == pytest.approx(4.0)  # √16
  y = module.apply({"params": {"scale": jnp.float32(2.5)}}, x)
  x = np.asarray(x)
  expected = 2.5 * x / np.maximum(np.linalg.norm(x, axis=-1, keepdims=True), 1e-5)
  np.testing.assert_allclose(y, expected, rtol=1e-5)


def test_qk_norm_normalizes_each_heads_queries_and_keys():
  """With the QK-norm, q and k are LayerNormed over d_h per head: scaling the query or key
  projection (weights and bias) leaves the output unchanged; without it, it does not."""
  x = jax.random.normal(jax.random.key(2), (2, 5, 16))
  bias = jnp.zeros((1, 1, 5, 5))
  outs = {}
  for qk_norm in (False, True):
    cfg = _cfg(qk_norm=qk_norm)
    options, _ = placement.sublayer_options(cfg)
    attn = layers.Attention(4, **options)
    params = nn.unbox(attn.init(jax.random.key(3), x, x, bias, True)["params"])
    if qk_norm:
      assert params["query_norm"]["scale"].shape == (4,)  # d_h, shared by the heads
      assert params["key_norm"]["bias"].shape == (4,)
    scaled = jax.tree.map(lambda a: a, params)
    for name, c in (("query", 7.0), ("key", 3.0)):
      scaled[name] = jax.tree.map(lambda a, c=c: a * c, params[name])
    outs[qk_norm] = [attn.apply({"params": p}, x, x, bias, True) for p in (params, scaled)]
  np.testing.assert_allclose(outs[True][0], outs[True][1], atol=1e-4)
  assert np.abs(np.asarray(outs[False][0] - outs[False][1])).max() > 1e-2


def test_qk_norm_in_a_model_and_its_analysis_records():
  cfg, model, params = _lm(qk_norm=True, norm_kind="scalenorm")
  setup = state.Setup(tasks.get("lm"), model, tx=None, schedule=None)
  batch = {"inputs": TOKENS, "weights": np.ones(TOKENS.shape), "targets": TOKENS}
  records = probes.norm_inputs(setup, params, batch)
  assert records["layer_0/self_attn/key_norm"]["d"] == cfg.head_size
  assert records["layer_0/self_attn/key_norm"]["tokens"].shape[1] == cfg.head_size
  assert records["final_norm"]["d"] == cfg.d_model  # ScaleNorms are recorded too
  r = records["layer_0/self_attn/query_norm"]
  np.testing.assert_allclose(jax.jit(r["fn"])(jnp.asarray(r["tokens"][0])).shape,
                             (cfg.head_size,))


# ---- Sandwich, Peri, NormFormer: the norms around each sub-layer. ---------------------------

@EACH_BLOCK
@pytest.mark.parametrize("pos", ["sandwich", "peri"])
def test_sandwich_and_peri_shape(pos, block):
  """x ← x + N_out(F(N_in(x))): two norms per sub-layer, a final norm; Peri-LN also
  normalizes the embedding."""
  _, model, params = _lm(block, norm_position=pos)
  for i in range(CFG.num_layers):
    assert {k for k in params[f"layer_{i}"] if "norm" in k} == {
        "self_attn_norm", "self_attn_out_norm", "ffn_norm", "ffn_out_norm"}
  assert "final_norm" in params
  assert ("embed_norm" in params) == (pos == "peri")
  params = random_norms(params)
  p = params["layer_0"]
  acts = _acts(model, params, TOKENS)
  x0 = acts["embed_norm"] if pos == "peri" else acts["embed"]
  if pos == "peri":
    np.testing.assert_allclose(x0, _ln(acts["embed"], params["embed_norm"]), atol=1e-5)
  np.testing.assert_allclose(acts["layer_0/self_attn_norm"], _ln(x0, p["self_attn_norm"]),
                             atol=1e-5)
  np.testing.assert_allclose(acts["layer_0/self_attn_out_norm"],
                             _ln(acts["layer_0/self_attn"], p["self_attn_out_norm"]), atol=1e-5)
  x1 = x0 + acts["layer_0/self_attn_out_norm"]
  np.testing.assert_allclose(acts["layer_0/ffn_norm"], _ln(x1, p["ffn_norm"]), atol=1e-5)
  np.testing.assert_allclose(acts["layer_0/ffn_out_norm"],
                             _ln(acts["layer_0/ffn"], p["ffn_out_norm"]), atol=1e-5)
  np.testing.assert_allclose(acts["layer_0"], x1 + acts["layer_0/ffn_out_norm"], atol=1e-5)
  np.testing.assert_allclose(acts["final_norm"], _ln(acts["layer_1"], params["final_norm"]),
                             atol=1e-5)


@EACH_BLOCK
def test_sandwich_decoder_norms_around_self_and_cross_attention(block):
  """The decoder layer x ← x + N_out(F(N_in(x))) for self-attention, cross-attention (to
  the encoder's final-normed output) and FFN, at random γ, β; a final norm per stack."""
  cfg = _cfg(norm_position="sandwich", **BLOCKS[block])
  model = EncoderDecoder(cfg)
  params = nn.unbox(init_params(model, jax.random.key(0), TOKENS, TOKENS))
  assert {"cross_attn_norm", "cross_attn_out_norm"} <= set(params["decoder"]["layer_0"])
  assert "final_norm" in params["encoder"] and "final_norm" in params["decoder"]
  params = random_norms(params)
  p = params["decoder"]["layer_0"]
  acts = _acts(model, params, TOKENS, TOKENS[:, ::-1])
  a = lambda name: acts[f"decoder/layer_0/{name}"]
  x = _target_embedding(acts)
  for sub in ("self_attn", "cross_attn", "ffn"):
    np.testing.assert_allclose(a(f"{sub}_norm"), _ln(x, p[f"{sub}_norm"]), atol=1e-5)
    np.testing.assert_allclose(a(f"{sub}_out_norm"), _ln(a(sub), p[f"{sub}_out_norm"]),
                               atol=1e-5)
    x = x + a(f"{sub}_out_norm")
  np.testing.assert_allclose(acts["decoder/layer_0"], x, atol=1e-5)
  encoded = acts["encoder/final_norm"]
  np.testing.assert_allclose(encoded, _ln(acts["encoder/layer_1"], params["encoder"]["final_norm"]),
                             atol=1e-5)
  np.testing.assert_allclose(acts["decoder/layer_0/cross_attn/key"],
                             _dense(encoded, p["cross_attn"]["key"]), atol=1e-4)
  np.testing.assert_allclose(acts["decoder/final_norm"],
                             _ln(acts["decoder/layer_1"], params["decoder"]["final_norm"]),
                             atol=1e-5)


@EACH_BLOCK
def test_normformer_head_scales_and_extra_norms(block):
  """NormFormer: x + N_a(HeadScaleMHA(N(x))) and x + W²N_f(act(W¹N(x))); γ init 1."""
  _, model, params = _lm(block, norm_position="normformer")
  p = params["layer_0"]
  np.testing.assert_array_equal(p["self_attn"]["head_scale"], np.ones(CFG.num_heads))
  assert p["ffn"]["mid_norm"]["scale"].shape == (CFG.d_ff,)
  assert "self_attn_out_norm" in p and "ffn_out_norm" not in p and "final_norm" in params
  params = random_norms(params)
  p = params["layer_0"]
  acts = _acts(model, params, TOKENS)
  x0 = acts["embed"]
  np.testing.assert_allclose(acts["layer_0/self_attn_norm"], _ln(x0, p["self_attn_norm"]),
                             atol=1e-5)
  np.testing.assert_allclose(acts["layer_0/self_attn/query"],  # The attention reads N(x).
                             _dense(acts["layer_0/self_attn_norm"], p["self_attn"]["query"]),
                             atol=1e-4)
  np.testing.assert_allclose(acts["layer_0/self_attn_out_norm"],
                             _ln(acts["layer_0/self_attn"], p["self_attn_out_norm"]), atol=1e-5)
  x1 = x0 + acts["layer_0/self_attn_out_norm"]
  ffn_in = _ln(x1, p["ffn_norm"])
  np.testing.assert_allclose(acts["layer_0/ffn_norm"], ffn_in, atol=1e-5)
  # FFN: W² N_f(act(W¹ N(x))): the mid norm after the activation.
  hidden = _hidden(ffn_in, p["ffn"])
  np.testing.assert_allclose(acts["layer_0/ffn/mid_norm"], _ln(hidden, p["ffn"]["mid_norm"]),
                             atol=1e-5)
  np.testing.assert_allclose(acts["layer_0/ffn"],
                             _dense(_ln(hidden, p["ffn"]["mid_norm"]), p["ffn"]["wo"]), atol=1e-4)
  np.testing.assert_allclose(acts["layer_0"], x1 + acts["layer_0/ffn"], atol=1e-5)
  np.testing.assert_allclose(acts["final_norm"], _ln(acts["layer_1"], params["final_norm"]),
                             atol=1e-5)
  # The head scales multiply each head's output before W^O: zeroing head 0's scale equals
  # zeroing the rows of W^O that read head 0.
  k = CFG.head_size
  a = jax.tree.map(lambda v: v, params)
  a["layer_0"]["self_attn"]["head_scale"] = jnp.array([0.0, 1.0])
  b = jax.tree.map(lambda v: v, params)
  b["layer_0"]["self_attn"]["out"]["kernel"] = p["self_attn"]["out"]["kernel"].at[:k].set(0.0)
  np.testing.assert_allclose(model.apply({"params": a}, TOKENS),
                             model.apply({"params": b}, TOKENS), atol=1e-5)


# ---- DeepNorm. ----------------------------------------------------------------------------

def test_deepnorm_constants():
  """DeepNet Table 1 at N = 6 encoder and M = 18 decoder layers (encoder β: the paper's 0.87)."""
  a, b = placement.deepnorm_role_constants("decoder_only", 18)
  assert (a, b) == pytest.approx((36 ** 0.25, 144 ** -0.25))
  assert (a, b) == pytest.approx((2.449490, 0.288675), abs=1e-6)
  a, b = placement.deepnorm_role_constants("encoder", 6, 18)
  assert (a, b) == pytest.approx((0.81 * (6**4 * 18) ** (1 / 16), 0.87 * (6**4 * 18) ** (-1 / 16)))
  assert (a, b) == pytest.approx((1.518719, 0.464010), abs=1e-6)
  a, b = placement.deepnorm_role_constants("decoder", 6, 18)
  assert (a, b) == pytest.approx((54 ** 0.25, 216 ** -0.25))
  # The encoder-decoder's stacks get their own constants; the LM the decoder-only ones.
  cfg = _cfg(norm_position="deepnorm", num_layers=6, num_decoder_layers=18)
  assert (cfg.stack("encoder").deepnorm_alpha, cfg.stack("encoder").deepnorm_beta) == \
      pytest.approx((1.518719, 0.464010), abs=1e-6)
  assert cfg.stack("decoder").deepnorm_alpha == pytest.approx(54 ** 0.25)
  assert placement.deepnorm_constants(_cfg(norm_position="deepnorm", num_layers=18)) == \
      pytest.approx((36 ** 0.25, 144 ** -0.25))


@EACH_BLOCK
def test_deepnorm_residual_scale_and_init(block):
  """x ← LN(α·x + F(x)); Xavier-normal with gain β on V, W^O, W¹, W², gain 1 on Q and K."""
  cfg = _cfg(norm_position="deepnorm", d_model=64, d_ff=64, num_heads=2, **BLOCKS[block])
  model = TransformerLM(cfg)
  params = nn.unbox(init_params(model, jax.random.key(1), TOKENS))
  alpha, beta = (4 ** 0.25, 16 ** -0.25)  # L = 2
  attn, ffn = params["layer_0"]["self_attn"], params["layer_0"]["ffn"]
  for w, gain in ((attn["query"], 1), (attn["key"], 1), (attn["value"], beta),
                  (attn["out"], beta), *[(w, beta) for w in ffn.values()]):
    w = np.asarray(w["kernel"])
    xavier_std = (2 / sum(w.shape)) ** 0.5
    assert w.std() == pytest.approx(gain * xavier_std, rel=0.05)
    assert np.abs(w).max() > 2.5 * gain * xavier_std  # Normal, not uniform (max √3σ).
  params = random_norms(params)
  acts = _acts(model, params, TOKENS)
  p = params["layer_0"]
  h = _ln(alpha * acts["embed"] + acts["layer_0/self_attn"], p["self_attn_norm"])
  np.testing.assert_allclose(acts["layer_0/self_attn_norm"], h, atol=1e-5)
  np.testing.assert_allclose(acts["layer_0"], _ln(alpha * h + acts["layer_0/ffn"], p["ffn_norm"]),
                             atol=1e-5)
  assert "final_norm" not in params


@EACH_BLOCK
def test_deepnorm_encoder_decoder_residuals_and_cross_attention(block):
  """N+M = 2+2: the encoder's sub-layers LN(α_e·x + F(x)), α_e = 0.81(N⁴M)^1/16; the
  decoder's self-attention, cross-attention and FFN LN(α_d·x + F(x)), α_d = (3M)^¼; random
  γ, β."""
  cfg = _cfg(norm_position="deepnorm", **BLOCKS[block])
  model = EncoderDecoder(cfg)
  params = random_norms(nn.unbox(init_params(model, jax.random.key(0), TOKENS, TOKENS)))
  acts = _acts(model, params, TOKENS, TOKENS[:, ::-1])
  alpha_e, alpha_d = 0.81 * (2**4 * 2) ** (1 / 16), 6**0.25
  x = acts["embed"][0]
  for sub in ("self_attn", "ffn"):
    x = _ln(alpha_e * x + acts[f"encoder/layer_0/{sub}"],
            params["encoder"]["layer_0"][f"{sub}_norm"])
    np.testing.assert_allclose(acts[f"encoder/layer_0/{sub}_norm"], x, atol=1e-5)
  p = params["decoder"]["layer_0"]
  x = _target_embedding(acts)
  for sub in ("self_attn", "cross_attn", "ffn"):
    x = _ln(alpha_d * x + acts[f"decoder/layer_0/{sub}"], p[f"{sub}_norm"])
    np.testing.assert_allclose(acts[f"decoder/layer_0/{sub}_norm"], x, atol=1e-5)
  np.testing.assert_allclose(acts["decoder/layer_0/cross_attn/value"],
                             _dense(acts["encoder/layer_1"], p["cross_attn"]["value"]), atol=1e-4)
  assert "final_norm" not in params["encoder"] and "final_norm" not in params["decoder"]


# ---- ResiDual. ----------------------------------------------------------------------------

@EACH_BLOCK
def test_resi_dual_output_is_post_stream_plus_normed_accumulator(block):
  """x_{k+1} = LN(x_k + f_k), d_{k+1} = d_k + f_k, d_0 = x_0; output x_L + LN(d_L)."""
  _, model, params = _lm(block, norm_position="resi_dual")
  acts = _acts(model, params, TOKENS)
  x0 = acts["embed"]
  fs = [acts[f"layer_{i}/{s}"] for i in range(CFG.num_layers) for s in ("self_attn", "ffn")]
  x_l, d_l = acts[f"layer_{CFG.num_layers - 1}"]
  np.testing.assert_allclose(d_l, x0 + sum(fs), atol=1e-5)
  np.testing.assert_allclose(acts["layer_0/self_attn_norm"], _ln(x0 + fs[0]), atol=1e-5)
  np.testing.assert_allclose(x_l, acts[f"layer_{CFG.num_layers - 1}/ffn_norm"], atol=1e-6)
  np.testing.assert_allclose(acts["final_norm"], _ln(d_l), atol=1e-5)
  np.testing.assert_allclose(acts[""], _logits_from(x_l + _ln(d_l), params), atol=1e-4)


# ---- Mix-LN. ------------------------------------------------------------------------------

@EACH_BLOCK
def test_mix_ln_split(block):
  """Post-LN in the first ⌊αL⌋ layers, Pre-LN after, a final norm always."""
  for layers_, alpha, post in ((12, 0.25, 3), (24, 0.25, 6), (4, 0.5, 2), (3, 0.25, 0),
                               (5, 0.6, 3), (4, 1.0, 4)):
    assert placement.mix_post_layers(_cfg(num_layers=layers_, mix_post_fraction=alpha)) == post
  _, model, params = _lm(block, norm_position="mix", num_layers=4, mix_post_fraction=0.5)
  assert "final_norm" in params
  acts = _acts(model, params, TOKENS)
  for i in range(4):
    x_in = acts["embed"] if i == 0 else acts[f"layer_{i - 1}"]
    attn, ffn = acts[f"layer_{i}/self_attn"], acts[f"layer_{i}/ffn"]
    if i < 2:  # Post-LN: LN(LN(x + A) + F)
      np.testing.assert_allclose(acts[f"layer_{i}"],
                                 _ln(acts[f"layer_{i}/self_attn_norm"] + ffn), atol=1e-5)
      np.testing.assert_allclose(acts[f"layer_{i}/self_attn_norm"], _ln(x_in + attn), atol=1e-5)
    else:  # Pre-LN: x + A(LN(x)) + F(LN(·))
      np.testing.assert_allclose(acts[f"layer_{i}/self_attn_norm"], _ln(x_in), atol=1e-5)
      np.testing.assert_allclose(acts[f"layer_{i}"], x_in + attn + ffn, atol=1e-5)


# ---- B2T. ---------------------------------------------------------------------------------

@EACH_BLOCK
def test_b2t_skip_spans_the_layer(block):
  """h = LN(x + A(x)); y = LN(x + h + F(h)); in the decoder the skip spans self- and
  cross-attention."""
  _, model, params = _lm(block, norm_position="b2t")
  acts = _acts(model, params, TOKENS)
  x, h = acts["embed"], acts["layer_0/self_attn_norm"]
  np.testing.assert_allclose(h, _ln(x + acts["layer_0/self_attn"]), atol=1e-5)
  np.testing.assert_allclose(acts["layer_0"], _ln(x + h + acts["layer_0/ffn"]), atol=1e-5)
  cfg = _cfg(norm_position="b2t", num_layers=1, **BLOCKS[block])
  model = EncoderDecoder(cfg)
  params = nn.unbox(init_params(model, jax.random.key(0), TOKENS, TOKENS))
  acts = _acts(model, params, TOKENS, TOKENS[:, ::-1])
  x = acts["embed"][1]  # The shared embedding's second call: the target side.
  h1 = acts["decoder/layer_0/self_attn_norm"]
  h2 = acts["decoder/layer_0/cross_attn_norm"]
  np.testing.assert_allclose(h2, _ln(h1 + acts["decoder/layer_0/cross_attn"]), atol=1e-5)
  np.testing.assert_allclose(acts["decoder/layer_0"],
                             _ln(x + h2 + acts["decoder/layer_0/ffn"]), atol=1e-5)


# ---- Admin. -------------------------------------------------------------------------------

def _omega(params, path):
  w = np.asarray(params[path]["omega"] if isinstance(path, str) else
                 _at(params, path)["omega"])
  assert np.all(w == w[0])
  return float(w[0])


def _at(tree, path):
  for k in path:
    tree = tree[k]
  return tree


@EACH_BLOCK
def test_admin_omega_from_the_profiling_pass(block):
  """ω_1 = 1, ω_{i+1} = √(Var[ω_i x_i] + Var[F_i(x_i)]) along the stack, by hand from the
  sub-layers' inputs and outputs on the profiling batch."""
  cfg = _cfg(norm_position="admin", **BLOCKS[block])
  model = TransformerLM(cfg)
  params = nn.unbox(model.init(jax.random.key(1), TOKENS)["params"])
  np.testing.assert_array_equal(params["layer_1"]["ffn_shortcut"]["omega"], np.ones(16))
  params = placement.admin_profile(model, params, TOKENS)
  acts = _acts(model, params, TOKENS)
  expected, stream = 1.0, acts["embed"]
  for i in range(cfg.num_layers):
    for sub in ("self_attn", "ffn"):
      omega = _omega(params, (f"layer_{i}", f"{sub}_shortcut"))
      assert omega == pytest.approx(expected, rel=1e-5)
      f = acts[f"layer_{i}/{sub}"]
      np.testing.assert_allclose(acts[f"layer_{i}/{sub}_norm"], _ln(omega * stream + f),
                                 atol=1e-5)
      expected = math.sqrt(np.var(omega * stream) + np.var(f))
      stream = acts[f"layer_{i}/{sub}_norm"]
  assert _omega(params, ("layer_1", "ffn_shortcut")) > 1.1


def test_admin_encoder_and_decoder_chains_are_separate_and_stored():
  """init_params runs the profiling pass: ω is a parameter (checkpointed with the run),
  1 at the first sub-layer of each stack and above 1 after it (Var[F] > 0)."""
  cfg = _cfg(norm_position="admin", num_layers=1)
  model = EncoderDecoder(cfg)
  params = nn.unbox(init_params(model, jax.random.key(0), TOKENS, TOKENS,
                               random_inputs=tasks.get("translation").random_inputs))
  assert _omega(params, ("encoder", "layer_0", "self_attn_shortcut")) == 1.0
  assert _omega(params, ("decoder", "layer_0", "self_attn_shortcut")) == 1.0
  assert _omega(params, ("encoder", "layer_0", "ffn_shortcut")) > 1.0
  assert _omega(params, ("decoder", "layer_0", "cross_attn_shortcut")) > 1.0
  assert _omega(params, ("decoder", "layer_0", "ffn_shortcut")) > 1.0


# ---- 2024-25: DyT, LayerNorm Scaling, OLMo 2, nGPT. ----------------------------------------

def _rms(x, p, eps=1e-5):
  return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * np.asarray(p["scale"])


def _unit(x, axis=-1):
  return x / np.linalg.norm(x, axis=axis, keepdims=True)


def _silu(u):
  return u / (1.0 + np.exp(-u))


def _hidden(x, p, pre_act=lambda u: u):
  """The FFN's F-wide hidden layer: relu(pre(x W¹)) (2020), or silu(pre(x W_gate)) ⊙ x W_up
  (SwiGLU)."""
  if "wi_gate" in p:
    return _silu(pre_act(_dense(x, p["wi_gate"]))) * _dense(x, p["wi_up"])
  return np.maximum(pre_act(_dense(x, p["wi"])), 0.0)


def _ffn(x, p, pre_act=lambda u: u):
  return _dense(_hidden(x, p, pre_act), p["wo"])


def _rope(x_BxHxTxK, theta):
  """Rotary positions at 0, 1, ...: the halves (x₁, x₂) of each vector rotated pairwise,
  x₁·cos − x₂·sin and x₂·cos + x₁·sin, by the angle p·θ^(-2i/d_h)."""
  t, k = x_BxHxTxK.shape[-2:]
  angles_TxK2 = np.arange(t)[:, None] * theta ** (-np.arange(0, k, 2) / k)[None, :]
  cos, sin = np.cos(angles_TxK2), np.sin(angles_TxK2)
  x1, x2 = x_BxHxTxK[..., : k // 2], x_BxHxTxK[..., k // 2:]
  return np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1)


def _causal_attention(q_BxTxHK, k_BxTxGK, v_BxTxGK, p_out, heads, scale, qk=lambda q, k: (q, k),
                      theta=0.0, per_head=lambda q, k, v: (q, k, v)):
  """softmax(q kᵀ·scale + causal mask) v per head, then W^O: G = width/d_h key/value heads
  each serving H/G query heads; `per_head` maps the [B, ·, T, d_h] q, k, v first, then RoPE
  (θ > 0), then `qk` the [B, H, T, d_h] queries and keys."""
  b, t, hk = q_BxTxHK.shape
  dh = hk // heads
  g = k_BxTxGK.shape[-1] // dh
  split = lambda y, n: y.reshape(b, t, n, dh).transpose(0, 2, 1, 3)
  q, k, v = per_head(split(q_BxTxHK, heads), split(k_BxTxGK, g), split(v_BxTxGK, g))
  if theta:
    q, k = _rope(q, theta), _rope(k, theta)
  k, v = np.repeat(k, heads // g, 1), np.repeat(v, heads // g, 1)
  q, k = qk(q, k)
  s = np.where(np.tril(np.ones((t, t), bool)), q @ k.transpose(0, 1, 3, 2) * scale, -1e9)
  w = np.exp(s - s.max(-1, keepdims=True))
  out = (w / w.sum(-1, keepdims=True)) @ v
  return _dense(out.transpose(0, 2, 1, 3).reshape(b, t, hk), p_out)


def _randomize(params, names, seed=0, low=0.3, high=1.5):
  """`params` with every leaf whose path holds one of `names` drawn from U(low, high)."""
  keys = iter(jax.random.split(jax.random.key(seed), 1000))

  def draw(path, leaf):
    if not set(str(getattr(k, "key", k)) for k in path) & set(names):
      return leaf
    return jax.random.uniform(next(keys), jnp.shape(leaf), minval=low, maxval=high)

  return jax.tree_util.tree_map_with_path(draw, params)


def _check_pre_ln_layout(acts, params, num_layers, norm):
  """Pre-LN's layout, x + F(N(x)) with a final N, against numpy, for a point-wise N
  (`norm(x, its parameters)`: DyT, Derf); the attention reads N(x)."""
  x = acts["embed"]
  for i in range(num_layers):
    p, a = params[f"layer_{i}"], lambda name: acts[f"layer_{i}/{name}"]
    np.testing.assert_allclose(a("self_attn_norm"), norm(x, p["self_attn_norm"]), atol=1e-5)
    np.testing.assert_allclose(a("self_attn/query"),
                               _dense(a("self_attn_norm"), p["self_attn"]["query"]), atol=1e-4)
    x = x + a("self_attn")
    np.testing.assert_allclose(a("ffn"), _ffn(norm(x, p["ffn_norm"]), p["ffn"]), atol=1e-4)
    x = x + a("ffn")
    np.testing.assert_allclose(acts[f"layer_{i}"], x, atol=1e-5)
  np.testing.assert_allclose(acts["final_norm"], norm(x, params["final_norm"]), atol=1e-5)


@EACH_BLOCK
def test_dyt_replaces_every_norm_by_a_scaled_tanh(block):
  """Pre-LN's layout with every N a DyT, γ ⊙ tanh(α·x) + β: α₀ 0.5 (the attention blocks'
  their own when set), γ = 1, β = 0 at init; at random α, γ, β each against numpy."""
  def dyt(x, p):
    return np.tanh(float(p["alpha"]) * x) * np.asarray(p["scale"]) + np.asarray(p["bias"])

  _, model, params = _lm(block, norm_position="dyt", dyt_attention_alpha_init=0.8)
  assert float(params["layer_1"]["self_attn_norm"]["alpha"]) == pytest.approx(0.8)
  assert float(params["layer_1"]["ffn_norm"]["alpha"]) == 0.5
  assert float(params["final_norm"]["alpha"]) == 0.5
  np.testing.assert_array_equal(params["final_norm"]["scale"], np.ones(CFG.d_model))
  np.testing.assert_array_equal(params["final_norm"]["bias"], np.zeros(CFG.d_model))
  params = _randomize(random_norms(params), ["alpha"])
  _check_pre_ln_layout(_acts(model, params, TOKENS), params, CFG.num_layers, dyt)


@EACH_BLOCK
def test_layernorm_scaling_scales_each_norm_output_by_one_over_sqrt_depth(block):
  """x ← x + F(N(x)/√ℓ), ℓ = 1, 2, 3 in layers 0, 1, 2, both sub-layers; the final N
  unscaled; random γ, β. Scanned: a run per layer (1/√ℓ is each layer's own constant)."""
  _, model, params = _lm(block, norm_position="lns", num_layers=3)
  assert placement.layer_runs(_cfg(norm_position="lns", num_layers=3)) == [
      ("lns_layer_0", 0, 1), ("lns_layer_1", 1, 2), ("lns_layer_2", 2, 3)]
  params = random_norms(params)
  acts = _acts(model, params, TOKENS)
  x = acts["embed"]
  for i in range(3):
    p, a, scale = params[f"layer_{i}"], lambda name: acts[f"layer_{i}/{name}"], (i + 1) ** -0.5
    n = _ln(x, p["self_attn_norm"])
    np.testing.assert_allclose(a("self_attn_norm"), n, atol=1e-5)
    np.testing.assert_allclose(a("self_attn/value"), _dense(n * scale, p["self_attn"]["value"]),
                               atol=1e-4)
    x = x + a("self_attn")
    np.testing.assert_allclose(a("ffn"), _ffn(_ln(x, p["ffn_norm"]) * scale, p["ffn"]), atol=1e-4)
    x = x + a("ffn")
    np.testing.assert_allclose(acts[f"layer_{i}"], x, atol=1e-5)
  np.testing.assert_allclose(acts["final_norm"], _ln(x, params["final_norm"]), atol=1e-5)


@EACH_BLOCK
def test_olmo2_norms_each_sublayer_output_with_qk_norm_and_normal_init(block):
  """x ← x + N(F(x)), F reading x itself; q and k normalized over all heads (width D) before
  the split into heads; a final N; RMSNorm at random g. Sub-layer weights N(0, 0.02²) cut
  at ±3σ (OLMo-core's truncated normal)."""
  cfg, model, params = _lm(block, norm_position="olmo2", norm_kind="rmsnorm")
  p = params["layer_0"]
  assert p["self_attn"]["query_norm"]["scale"].shape == (CFG.d_model,)
  w = np.concatenate([np.ravel(params[f"layer_{i}"][s][m]["kernel"]) for i in range(2)
                      for s in ("self_attn", "ffn") for m in params[f"layer_{i}"][s]
                      if "kernel" in params[f"layer_{i}"][s][m]])
  assert w.std() == pytest.approx(0.02 * 0.9866, rel=0.05) and np.abs(w).max() <= 0.06
  params = random_norms(params)
  p = params["layer_0"]
  acts = _acts(model, params, TOKENS)
  x = acts["embed"]
  attn = p["self_attn"]
  q = _rms(_dense(x, attn["query"]), attn["query_norm"])
  k = _rms(_dense(x, attn["key"]), attn["key_norm"])
  np.testing.assert_allclose(acts["layer_0/self_attn/query_norm"], q, atol=1e-5)
  np.testing.assert_allclose(acts["layer_0/self_attn"], _causal_attention(
      q, k, _dense(x, attn["value"]), attn["out"], CFG.num_heads, CFG.head_size**-0.5,
      theta=_theta(cfg)), atol=1e-4)
  np.testing.assert_allclose(acts["layer_0/self_attn_norm"],
                             _rms(acts["layer_0/self_attn"], p["self_attn_norm"]), atol=1e-5)
  x = x + acts["layer_0/self_attn_norm"]
  np.testing.assert_allclose(acts["layer_0/ffn"], _ffn(x, p["ffn"]), atol=1e-4)
  np.testing.assert_allclose(acts["layer_0"], x + _rms(acts["layer_0/ffn"], p["ffn_norm"]),
                             atol=1e-5)
  np.testing.assert_allclose(acts["final_norm"], _rms(acts["layer_1"], params["final_norm"]),
                             atol=1e-5)


# ---- 2025: HybridNorm, Derf. --------------------------------------------------------------

@EACH_BLOCK
def test_hybridnorm_norms_q_k_v_inside_attention_and_the_stream_before_the_ffn(block):
  """HybridNorm (BryceZhuo/HybridNorm's main variant): attention x ← x + Attn(N_q q, N_k k,
  N_v v), each N over a head's d_h (one gain and bias shared by the heads), nothing around
  the attention; FFN z ← N(x), x ← z + F(z); a final N. Random γ, β, on both blocks."""
  cfg, model, params = _lm(block, norm_position="hybridnorm")
  p = params["layer_0"]
  assert {k for k in p if "norm" in k} == {"ffn_norm"} and "final_norm" in params
  for name in ("query_norm", "key_norm", "value_norm"):
    assert p["self_attn"][name]["scale"].shape == (cfg.head_size,)
  params = random_norms(params)
  acts = _acts(model, params, TOKENS)
  x = acts["embed"]
  for i in range(cfg.num_layers):
    p, a = params[f"layer_{i}"], lambda name: acts[f"layer_{i}/{name}"]
    attn = p["self_attn"]
    qkv = lambda q, k, v: (_ln(q, attn["query_norm"]), _ln(k, attn["key_norm"]),
                           _ln(v, attn["value_norm"]))
    expected = _causal_attention(_dense(x, attn["query"]), _dense(x, attn["key"]),
                                 _dense(x, attn["value"]), attn["out"], cfg.num_heads,
                                 cfg.head_size**-0.5, theta=_theta(cfg), per_head=qkv)
    np.testing.assert_allclose(a("self_attn"), expected, atol=1e-4)
    z = _ln(x + a("self_attn"), p["ffn_norm"])
    np.testing.assert_allclose(a("ffn_norm"), z, atol=1e-5)
    np.testing.assert_allclose(a("ffn"), _ffn(z, p["ffn"]), atol=1e-4)
    x = z + a("ffn")
    np.testing.assert_allclose(acts[f"layer_{i}"], x, atol=1e-5)
  np.testing.assert_allclose(acts["final_norm"], _ln(x, params["final_norm"]), atol=1e-5)


def _derf(x, p):
  """γ ⊙ erf(α·x + s) + β in numpy (math.erf, element by element)."""
  erf = np.vectorize(math.erf)
  return (erf(float(p["alpha"]) * x + float(p["shift"])) * np.asarray(p["scale"])
          + np.asarray(p["bias"]))


@EACH_BLOCK
def test_derf_replaces_every_norm_by_a_scaled_erf(block):
  """Pre-LN's layout with every N a Derf, γ ⊙ erf(α·x + s) + β: α₀ = derf_alpha_init,
  s = 0, γ = 1, β = 0 at init; at random α, s, γ, β each against numpy, on both blocks."""
  cfg, model, params = _lm(block, norm_position="derf", derf_alpha_init=0.7)
  for norm in (params["layer_1"]["self_attn_norm"], params["final_norm"]):
    assert (float(norm["alpha"]), float(norm["shift"])) == (pytest.approx(0.7), 0.0)
  np.testing.assert_array_equal(params["final_norm"]["scale"], np.ones(CFG.d_model))
  params = _randomize(random_norms(params), ["alpha"])
  params = _randomize(params, ["shift"], seed=1, low=-0.5, high=0.5)
  _check_pre_ln_layout(_acts(model, params, TOKENS), params, cfg.num_layers, _derf)


@pytest.mark.parametrize("position", ["dyt", "derf"])
def test_dyt_and_derf_take_the_unit_offset_gain(position):
  """model.norm_unit_offset under DyT and Derf, as under the norms it replaces: every
  point-wise norm's γ stored as w, init 0, and applied as 1 + w, so that its output is
  (1 + w) ⊙ f(α·x [+ s]) + β (numpy, at random w, α, s, β). A DyT or Derf built without
  the option would store γ itself, init 1, and read a stored w as the gain."""
  def dyt(x, p):
    return np.tanh(float(p["alpha"]) * x) * np.asarray(p["scale"]) + np.asarray(p["bias"])

  _, model, params = _lm(norm_position=position, norm_unit_offset=True)
  gains = [v for path, v in jax.tree_util.tree_flatten_with_path(params)[0]
           if path[-1].key == "scale"]
  assert len(gains) == 2 * CFG.num_layers + 1 and all(not np.any(g) for g in gains)
  params = _randomize(random_norms(params), ["alpha"])
  if position == "derf":
    params = _randomize(params, ["shift"], seed=1, low=-0.5, high=0.5)
  one_plus_w = jax.tree_util.tree_map_with_path(
      lambda path, v: 1 + v if path[-1].key == "scale" else v, params)
  f = dyt if position == "dyt" else _derf
  _check_pre_ln_layout(_acts(model, params, TOKENS), one_plus_w, CFG.num_layers, f)


NGPT_SCALES = ["self_attn_alpha", "ffn_alpha", "qk_scale", "hidden_scale", "logit_scale"]


@EACH_BLOCK
def test_ngpt_block_on_the_unit_sphere(block):
  """h_0 = Norm(embedding); h ← Norm(h + |α| ⊙ (Norm(F(h)) − h)) for attention and FFN;
  attention on s_qk ⊙ Norm(q), s_qk ⊙ Norm(k) per head with q kᵀ·√d_h; FFN
  relu(s_ν√D ⊙ x W¹) W²; logits s_z ⊙ (h W); no final norm. Each learned vector is stored
  at its scale (α: 1/√D for 0.05) and read as stored·value/scale; here at random values."""
  cfg, model, params = _lm(block, norm_position="ngpt")
  d, root_d = CFG.d_model, CFG.d_model**0.5
  p = params["layer_0"]
  np.testing.assert_allclose(p["self_attn_alpha"]["scale"], np.full(d, 1 / root_d), rtol=1e-6)
  np.testing.assert_allclose(p["self_attn"]["qk_scale"]["s_qk"]["scale"],
                             np.full((CFG.num_heads, CFG.head_size), 1 / root_d), rtol=1e-6)
  np.testing.assert_array_equal(p["ffn"]["hidden_scale"]["s_nu"]["scale"], np.ones(CFG.d_ff))
  assert params["logit_scale"]["scale"].shape == (CFG.vocab_size,)
  assert "final_norm" not in params and not any("norm" in k for k in p)
  params = _randomize(params, NGPT_SCALES)
  acts = _acts(model, params, TOKENS)
  read = lambda tree, value=1.0: np.asarray(tree["scale"]) * value * root_d  # at scale 1/√D
  h = _unit(acts["embed"])
  for i in range(CFG.num_layers):
    p, a = params[f"layer_{i}"], lambda name: acts[f"layer_{i}/{name}"]
    attn = p["self_attn"]
    s_qk = read(attn["qk_scale"]["s_qk"])[None, :, None, :]
    expected = _causal_attention(_dense(h, attn["query"]), _dense(h, attn["key"]),
                                 _dense(h, attn["value"]), attn["out"], CFG.num_heads,
                                 CFG.head_size**0.5, lambda q, k: (s_qk * _unit(q), s_qk * _unit(k)),
                                 theta=_theta(cfg))
    np.testing.assert_allclose(a("self_attn"), expected, atol=1e-4)
    alpha = np.abs(read(p["self_attn_alpha"], 0.05))
    h = _unit(h + alpha * (_unit(a("self_attn")) - h))
    s_nu = np.asarray(p["ffn"]["hidden_scale"]["s_nu"]["scale"]) * root_d  # at scale 1
    np.testing.assert_allclose(a("ffn"), _ffn(h, p["ffn"], lambda u: s_nu * u), atol=1e-4)
    alpha = np.abs(read(p["ffn_alpha"], 0.05))
    h = _unit(h + alpha * (_unit(a("ffn")) - h))
    np.testing.assert_allclose(acts[f"layer_{i}"], h, atol=1e-5)
  np.testing.assert_allclose(acts[""], read(params["logit_scale"]) * _logits_from(h, params),
                             atol=1e-4)


def test_ngpt_matrices_stay_on_the_unit_sphere():
  """At init and after every optimizer step, the embedding's, the output projection's and
  every sub-layer matrix's rows along its 'embed' axis (D) have norm 1; the optimizer's
  step is Adam's u followed by (p + u)/‖p + u‖ (optim.keep_params_on_unit_sphere); the
  other parameters (positions, biases, learned scales) move freely."""
  cfg, model, _ = _lm(norm_position="ngpt")
  boxed = init_params(model, jax.random.key(1), TOKENS)
  axis_of = placement.unit_sphere_axis(cfg)
  matrices = []

  def check_init(path, leaf):
    keys = tuple(k.key for k in path)
    axis = axis_of(keys)
    assert (axis is not None) == (keys[-1] in ("kernel", "embedding")), keys
    if axis is not None:
      assert leaf.names[axis] == "embed", (keys, leaf.names)
      np.testing.assert_allclose(np.linalg.norm(leaf.value, axis=axis), 1.0, rtol=1e-5)
      matrices.append(keys)

  jax.tree_util.tree_map_with_path(check_init, boxed,
                                   is_leaf=lambda x: isinstance(x, nn.meta.AxisMetadata))
  assert len(matrices) == 2 + 6 * cfg.num_layers  # embedding, logits; Q, K, V, W^O, W¹, W²
  params = nn.unbox(boxed)
  opt_cfg = optim.OptConfig(learning_rate=0.05)
  tx = optim.make_optimizer(opt_cfg, optax.constant_schedule(0.05), axis_of)
  adam = optim.make_optimizer(opt_cfg, optax.constant_schedule(0.05))
  loss = lambda p: optax.softmax_cross_entropy_with_integer_labels(
      model.apply({"params": p}, TOKENS[:, :-1]), TOKENS[:, 1:]).mean()
  grads = jax.jit(jax.grad(loss))(params)
  step = lambda t: jax.jit(lambda p, g: optax.apply_updates(p, t.update(g, t.init(p), p)[0]))
  new, plain = step(tx)(params, grads), step(adam)(params, grads)

  def check_step(path, p_new, p_plain):
    axis = axis_of(tuple(k.key for k in path))
    expected = p_plain if axis is None else _unit(np.asarray(p_plain), axis)
    np.testing.assert_allclose(p_new, expected, atol=1e-6)
    if axis is not None:
      np.testing.assert_allclose(np.linalg.norm(p_new, axis=axis), 1.0, rtol=1e-5)

  jax.tree_util.tree_map_with_path(check_step, new, plain)
  moved = jax.tree.map(lambda a, b: float(np.abs(a - b).max()), plain, new)
  assert moved["layer_0"]["ffn"]["wo"]["kernel"] > 1e-3  # The projection did something.
  with pytest.raises(errors.ConfigError, match="opt.weight_decay=0.1 with model.norm_position="):
    optim.make_optimizer(optim.OptConfig(name="adamw", weight_decay=0.1),
                         optax.constant_schedule(0.05), axis_of)


def test_new_placements_refusals_are_one_line_config_errors():
  """nGPT is decoder-only: refused in the encoder-decoder (either stack); OLMo 2 and nGPT
  normalize q and k themselves: a second QK-norm is refused."""
  cases = [lambda: EncoderDecoder(_cfg(norm_position="ngpt")).init(jax.random.key(0), TOKENS,
                                                                   TOKENS),
           lambda: _cfg(decoder_norm_position="ngpt"),
           lambda: _cfg(norm_position="olmo2", qk_norm=True),
           lambda: _cfg(norm_position="ngpt", qk_norm=True),
           lambda: _cfg(norm_position="hybridnorm", qk_norm=True)]
  messages = []
  for case in cases:
    with pytest.raises(errors.ConfigError) as e:
      case()
    messages.append(str(e.value))
  assert all("\n" not in m for m in messages)
  assert messages[0] == ("model.norm_position='ngpt' in the encoder-decoder's encoder: nGPT is "
                         "defined for decoder-only models (task=lm) only")
  assert "decoder" in messages[1] and "qk_norm=True" in messages[2] and "'ngpt'" in messages[3]
  assert "'hybridnorm'" in messages[4]


@pytest.mark.slow
@pytest.mark.parametrize("pos", ["dyt", "lns", "olmo2", "ngpt", "hybridnorm", "derf"])
def test_new_placement_trains_on_the_lm_smoke_preset(tmp_path, pos):
  """configs/lm.py:smoke through train_and_evaluate (nGPT's optimizer chosen by the run
  from the placement), 40 steps without warm-up: the loss falls. nGPT at lr 1e-2: its
  logits start within ±s_z = ±1 (cosines), and Adam moves s_z by about lr·√D a step.
  One evaluation and one checkpoint, at the end (the preset's every 10 steps add nothing
  to what is pinned here)."""
  wd = str(tmp_path / pos)
  lr = {"opt.learning_rate": 1e-2} if pos == "ngpt" else {}
  summary = train.train_and_evaluate(smoke_config(**{
      "model.norm_position": pos, "train.num_steps": 40, "train.eval_every_steps": 40,
      "train.checkpoint_every_steps": 40, **lr}), wd, tasks=tasks.get)
  assert summary["status"] == "completed"
  losses = train_losses(wd)
  assert losses[40] < losses[5] - 0.3, losses


# ---- Every placement trains. --------------------------------------------------------------

def _train(model, inputs, targets, steps=3, lr=2e-2):
  """Losses of `steps` Adam steps on one batch, from init_params. Three steps: two updates
  lower the loss by 0.29 nats (nGPT, whose cosine logits move least) to 2 nats at lr 2e-2;
  the test asks for 0.2. The loss and its gradient are one jitted program; the parameters'
  initialization and the optimizer's update run eagerly, the update's few operations per
  parameter compiled once for the shapes all placements share, not again in each
  placement's program: the sixteen placements' tests took 23.0 and 23.4 s of CPU so from
  an empty compilation cache, 25.3 and 27.0 s with the update in the jitted step
  (2026-12-07, 2-core machine). Earlier, with the update jitted: 24-27 s cold and 16 s
  warm, 28-32 s and 23-33 s with the step run eagerly op by op, 60 s and 27 s with the
  initialization and the steps in one program."""
  params = nn.unbox(init_params(model, jax.random.key(0), *inputs))
  tx = optim.make_optimizer(optim.OptConfig(b2=0.999), optax.constant_schedule(lr),
                            placement.unit_sphere_axis(model.cfg))  # nGPT: its sphere kept
  loss_and_grad = jax.jit(jax.value_and_grad(
      lambda p, inputs, targets: optax.softmax_cross_entropy_with_integer_labels(
          model.apply({"params": p}, *inputs), targets).mean()))

  opt_state, losses = tx.init(params), []
  for _ in range(steps):
    loss, grads = loss_and_grad(params, inputs, targets)
    updates, opt_state = tx.update(grads, opt_state, params)
    params = optax.apply_updates(params, updates)
    losses.append(float(loss))
  return np.array(losses)


@pytest.mark.slow  # Trains: the full tier (the fast one checks each placement's formula).
@pytest.mark.parametrize("pos", NORM_POSITIONS)
def test_each_placement_trains(pos):
  """Two Adam steps on one batch, no warm-up: the loss after them is lower, for the LM and the
  encoder-decoder (RMSNorm for Mix-LN and OLMo 2, as in their papers, and ScaleNorm for
  B2T); nGPT, decoder-only, is refused in the encoder-decoder."""
  kind = {"mix": "rmsnorm", "olmo2": "rmsnorm", "b2t": "scalenorm"}.get(pos, "layernorm")
  # The other tests' sizes, so that the eager init reuses the primitives they compiled.
  cfg = _cfg(norm_position=pos, norm_kind=kind, num_layers=2 if pos == "mix" else 1,
             mix_post_fraction=0.5)
  tokens = jax.random.randint(jax.random.key(5), (2, 9), 1, cfg.vocab_size)
  src, tgt = tokens[:, 1:], tokens[:, ::-1]
  for model, inputs, targets in (
      (TransformerLM(cfg), (tokens[:, :-1],), tokens[:, 1:]),
      (EncoderDecoder(dataclasses.replace(cfg, num_layers=1)), (src, tgt[:, :-1]), tgt[:, 1:])):
    if pos == "ngpt" and isinstance(model, EncoderDecoder):
      with pytest.raises(errors.ConfigError, match="decoder-only"):
        _train(model, inputs, targets)
      continue
    losses = _train(model, inputs, targets)
    assert np.isfinite(losses).all() and losses[-1] < losses[0] - 0.2, (type(model), losses)
