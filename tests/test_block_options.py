"""The modern block's options (docs/configs.md, "The modern block"): each formula against a
hand-computed or numpy value, the refusals, and one finite train step for every placement
with every option on and for each option alone."""

import dataclasses
import math

import flax.linen as nn
import hypothesis
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from hypothesis import strategies as st

from lnjax.core import errors
from lnjax.models import (NORM_POSITIONS, EncoderDecoder, ModelConfig, TransformerLM,
                          init_params, kernels, layers, norms)
from lnjax.models.transformer import scan_params

from conftest import assert_layer_removal_is_the_block_passing_its_input_on, fast_tier

TOKENS = jax.random.randint(jax.random.key(0), (2, 8), 1, 24)
# The forward tests' tokens: the train steps' inputs, whose shapes the eager operations of
# the steps compile for, so that the forward tests reuse those programs (the file compiled
# 1333 programs so, 1402 on the eight tokens).
INPUTS = TOKENS[:, :-1]
TINY = dict(vocab_size=24, num_layers=2, d_model=16, num_heads=4, d_ff=32, max_len=16,
            dropout_rate=0.0)
# Every option on at once (Gemma-like): what a placement must train with.
ALL_OPTIONS = dict(pos_emb="rope", rope_theta=500.0, gated_ffn=True, activation="silu",
                   num_kv_heads=2, head_dim=6, query_scale=0.3, attn_logit_softcap=20.0,
                   final_logit_softcap=15.0, sliding_window=3, attention_pattern="local,global",
                   norm_kind="rmsnorm", norm_unit_offset=True, qk_norm=True, use_bias=False)
# Each option alone, on Pre-LN.
EACH_OPTION = {
    "rope": dict(pos_emb="rope"), "gated_silu": dict(gated_ffn=True, activation="silu"),
    "geglu": dict(gated_ffn=True, activation="gelu"), "gqa": dict(num_kv_heads=2),
    "mqa": dict(num_kv_heads=1), "head_dim": dict(head_dim=6), "query_scale": dict(query_scale=0.3),
    "attn_softcap": dict(attn_logit_softcap=5.0), "final_softcap": dict(final_logit_softcap=5.0),
    "sliding_window": dict(sliding_window=2, attention_pattern="local"),
    "unit_offset": dict(norm_kind="rmsnorm", norm_unit_offset=True),
    "qk_rmsnorm": dict(qk_norm=True, norm_kind="rmsnorm"), "no_bias": dict(use_bias=False),
    "no_positions": dict(pos_emb="none"),
}


# ---- RoPE. --------------------------------------------------------------------------------

def test_rope_rotates_each_half_pair_by_its_angle():
  """d_h = 4, θ = 100, position 1: the pairs (x₀, x₂) and (x₁, x₃) turn by 1 and 100^(-1/2)
  = 0.1 radians (transformers' rotate_half layout); position 0 is the identity."""
  x = jnp.array([1.0, 2.0, 3.0, 4.0]).reshape(1, 1, 1, 4)
  got = layers.rope(jnp.concatenate([x, x], axis=2), jnp.array([0, 1]), 100.0)
  c1, s1, c2, s2 = math.cos(1), math.sin(1), math.cos(0.1), math.sin(0.1)
  np.testing.assert_allclose(got[0, 0, 0], [1, 2, 3, 4], rtol=1e-6)
  np.testing.assert_allclose(got[0, 0, 1], [1 * c1 - 3 * s1, 2 * c2 - 4 * s2, 3 * c1 + 1 * s1,
                                            4 * c2 + 2 * s2], rtol=1e-5)


@hypothesis.settings(max_examples=25, deadline=None, derandomize=True)
@hypothesis.given(m=st.integers(0, 60), n=st.integers(0, 60), shift=st.integers(0, 60),
                  seed=st.integers(0, 2**16))
def test_rope_scores_depend_on_the_offset_only(m, n, shift, seed):
  """q at position m and k at n score alike when both move by the same shift: RoPE's
  relative-position property, q_mᵀ k_n = qᵀ R_{n−m} k (Su et al., arXiv 2104.09864 §3.4)."""
  q, k = np.random.default_rng(seed).normal(size=(2, 1, 1, 1, 8)).astype(np.float32)
  score = lambda a, b: float(jnp.sum(layers.rope(q, jnp.array([a]), 1e4)
                                     * layers.rope(k, jnp.array([b]), 1e4)))
  assert score(m + shift, n + shift) == pytest.approx(score(m, n), abs=2e-4)


# ---- Attention: GQA, head width, query scale, soft-cap, sliding window. ---------------------

def _numpy_attention(x, p, heads, kv_heads, dh, scale, cap, window):
  """softmax(mask(c·tanh(q kᵀ·s / c))) v W^O with causal and sliding-window masks, K/V head
  j serving query heads j·H/G ...; in numpy, bias-free."""
  b, t, _ = x.shape
  split = lambda y, n: y.reshape(b, t, n, dh).transpose(0, 2, 1, 3)
  q = split(x @ p["query"]["kernel"], heads)
  k = np.repeat(split(x @ p["key"]["kernel"], kv_heads), heads // kv_heads, 1)
  v = np.repeat(split(x @ p["value"]["kernel"], kv_heads), heads // kv_heads, 1)
  s = q @ k.transpose(0, 1, 3, 2) * scale
  if cap:
    s = cap * np.tanh(s / cap)
  i, j = np.arange(t)[:, None], np.arange(t)[None, :]
  s = np.where((j <= i) & ((i - j < window) | (window == 0)), s, -np.inf)
  w = np.exp(s - s.max(-1, keepdims=True))
  out = (w / w.sum(-1, keepdims=True)) @ v
  return out.transpose(0, 2, 1, 3).reshape(b, t, heads * dh) @ p["out"]["kernel"]


@pytest.mark.parametrize("impl", ["plain", "reference", "xla"])
def test_attention_options_against_numpy(impl):
  """H = 4 query heads, G = 2 key/value heads, d_h = 3 (≠ D/H), s = 0.3, soft-cap c = 2
  (xla: none, refused by the config), window W = 3, causal: each kernel equals the formula
  in numpy; the projections are [D, H·d_h], [D, G·d_h] and [H·d_h, D]."""
  cap = 0.0 if impl == "xla" else 2.0
  attn = layers.Attention(4, use_bias=False, causal=True, num_kv_heads=2, head_dim=3,
                          query_scale=0.3, logit_softcap=cap, attention_impl=impl)
  x = jax.random.normal(jax.random.key(1), (2, 7, 8))
  bias = layers.causal_bias(7)
  params = nn.unbox(attn.init(jax.random.key(2), x, x, bias, True, window=3)["params"])
  assert (params["query"]["kernel"].shape, params["key"]["kernel"].shape,
          params["out"]["kernel"].shape) == ((8, 12), (8, 6), (12, 8))
  got = attn.apply({"params": params}, x, x, bias, True, window=3)
  expected = _numpy_attention(np.asarray(x), jax.tree.map(np.asarray, params), 4, 2, 3, 0.3,
                              cap, 3)
  np.testing.assert_allclose(got, expected, atol=2e-5)


def test_rotary_attention_with_head_norms_against_numpy():
  """Today's decoder's attention (Llama/Qwen3/Gemma's order): each head's q and k
  RMS-normalized over d_h with random gains, then rotated (transformers' rotate_half: the
  pair (i, i + d_h/2) by p·θ^(-2i/d_h), Su et al., arXiv 2104.09864), then scored at the
  default 1/√d_h; H = 4, G = 2, d_h = 4 ≠ D/H, θ = 100, 6 positions. In numpy: keys not
  rotated, the norm after the rotation, tiled K/V heads, the scale from D/H or θ
  inverted each differ by far more than the tolerance."""
  heads, kv_heads, dh, theta, t = 4, 2, 4, 100.0, 6
  attn = layers.Attention(heads, use_bias=False, causal=True, num_kv_heads=kv_heads,
                          head_dim=dh, rope_theta=theta,
                          qk_norm=lambda name: norms.RMSNorm(name=name))
  x = jax.random.normal(jax.random.key(7), (2, t, 8))
  bias = layers.causal_bias(t)
  params = nn.unbox(attn.init(jax.random.key(8), x, x, bias, True)["params"])
  rng = np.random.default_rng(0)
  for name in ("query_norm", "key_norm"):
    params[name]["scale"] = jnp.asarray(rng.uniform(0.5, 1.5, dh), jnp.float32)
  p = jax.tree.map(np.asarray, params)
  got = attn.apply({"params": params}, x, x, bias, True)

  x = np.asarray(x)
  def heads_of(y, n):  # [B, T, n·d_h] -> [B, n, T, d_h]
    return y.reshape(2, t, n, dh).transpose(0, 2, 1, 3)
  def rms(y, g):
    return y / np.sqrt(np.mean(y * y, -1, keepdims=True) + 1e-6) * g
  freqs = theta ** (-np.arange(0, dh, 2) / dh)
  angles = np.arange(t)[:, None] * np.concatenate([freqs, freqs])  # [T, d_h]
  def rotate(y):
    half = np.concatenate([-y[..., dh // 2:], y[..., :dh // 2]], -1)
    return y * np.cos(angles) + half * np.sin(angles)
  q = rotate(rms(heads_of(x @ p["query"]["kernel"], heads), p["query_norm"]["scale"]))
  k = rotate(rms(heads_of(x @ p["key"]["kernel"], kv_heads), p["key_norm"]["scale"]))
  k = np.repeat(k, heads // kv_heads, 1)
  v = np.repeat(heads_of(x @ p["value"]["kernel"], kv_heads), heads // kv_heads, 1)
  s = q @ k.transpose(0, 1, 3, 2) / np.sqrt(dh)
  s = np.where(np.tril(np.ones((t, t), bool)), s, -np.inf)
  w = np.exp(s - s.max(-1, keepdims=True))
  out = ((w / w.sum(-1, keepdims=True)) @ v).transpose(0, 2, 1, 3).reshape(2, t, heads * dh)
  np.testing.assert_allclose(got, out @ p["out"]["kernel"], atol=2e-5)


def test_gqa_equals_multi_head_attention_with_repeated_key_value_weights():
  """G = 2 key/value heads for H = 4 query heads equal MHA whose K and V weights repeat
  each K/V head's columns for the H/G = 2 query heads it serves (transformers' repeat_kv)."""
  x = jax.random.normal(jax.random.key(3), (2, 5, 8))
  bias = layers.causal_bias(5)
  gqa = layers.Attention(4, causal=True, num_kv_heads=2)
  p = nn.unbox(gqa.init(jax.random.key(4), x, x, bias, True)["params"])
  mha_p = dict(p)
  for name in ("key", "value"):  # [D, G·d_h] -> [D, H·d_h], head j -> heads 2j, 2j+1
    w = p[name]["kernel"].reshape(8, 2, 1, 2)
    b = p[name]["bias"].reshape(2, 1, 2)
    mha_p[name] = {"kernel": jnp.broadcast_to(w, (8, 2, 2, 2)).reshape(8, 8),
                   "bias": jnp.broadcast_to(b, (2, 2, 2)).reshape(8)}
  np.testing.assert_allclose(gqa.apply({"params": p}, x, x, bias, True),
                             layers.Attention(4, causal=True).apply({"params": mha_p}, x, x,
                                                                    bias, True), atol=1e-6)


def test_softcap_formula():
  """c·tanh(z/c) at c = 2: 0 at 0, 2·tanh(½) at 1, → ±c far out; 0 = off."""
  z = jnp.array([0.0, 1.0, -100.0])
  np.testing.assert_allclose(kernels.softcap(z, 2.0), [0.0, 2 * math.tanh(0.5), -2.0], rtol=1e-6)
  np.testing.assert_array_equal(kernels.softcap(z, 0.0), z)


def test_final_logit_softcap_caps_the_model_output():
  cfg = ModelConfig(**TINY)
  model = TransformerLM(cfg)
  params = nn.unbox(init_params(model, jax.random.key(0), INPUTS))
  params = jax.tree.map(lambda a: a * 3, params)  # logits well past the cap
  raw = model.apply({"params": params}, INPUTS)
  capped = TransformerLM(dataclasses.replace(cfg, final_logit_softcap=2.0)).apply(
      {"params": params}, INPUTS)
  assert float(jnp.abs(raw).max()) > 4.0
  np.testing.assert_allclose(capped, 2.0 * np.tanh(np.asarray(raw) / 2.0), atol=1e-5)


def test_sliding_window_mask_and_layer_pattern():
  """W = 2 over 4 positions: a query sees itself and the key before it (|t − s| < W); W = 0
  masks nothing. The pattern cycles over the layers."""
  allowed = np.asarray(layers.window_bias(jnp.arange(4), jnp.arange(4), 2)[0, 0]) == 0
  np.testing.assert_array_equal(allowed, [[1, 1, 0, 0], [1, 1, 1, 0], [0, 1, 1, 1], [0, 0, 1, 1]])
  assert (np.asarray(layers.window_bias(jnp.arange(4), jnp.arange(4), 0)) == 0).all()
  cfg = ModelConfig(**{**TINY, "num_layers": 5}, sliding_window=4,
                    attention_pattern="local,local,global")
  assert cfg.layer_windows() == [4, 4, 0, 4, 4]


def test_the_largest_window_is_accepted_and_masks_nothing():
  """W = 2³¹ − 1 (config.MAX_WINDOW, the largest int32) is a window longer than any
  sequence: accepted, and the local layer's output is the global layer's (the mask's
  int32 comparison does not overflow at the bound)."""
  from lnjax.models import config

  assert config.MAX_WINDOW == 2**31 - 1
  cfg = ModelConfig(**{**TINY, "num_layers": 1}, pos_emb="rope", sliding_window=2**31 - 1,
                    attention_pattern="local")
  model = TransformerLM(cfg)
  params = nn.unbox(init_params(model, jax.random.key(0), INPUTS))
  plain = TransformerLM(dataclasses.replace(cfg, sliding_window=0, attention_pattern="global"))
  np.testing.assert_allclose(model.apply({"params": params}, INPUTS),
                             plain.apply({"params": params}, INPUTS), atol=1e-6)


def test_a_local_layer_does_not_see_past_its_window():
  """One local layer, W = 2: the output at position t changes with the token at t − 1 and
  not with the one at t − 2 (nor earlier)."""
  cfg = ModelConfig(**{**TINY, "num_layers": 1}, pos_emb="rope", sliding_window=2,
                    attention_pattern="local")
  model = TransformerLM(cfg)
  params = nn.unbox(init_params(model, jax.random.key(0), INPUTS))
  base = model.apply({"params": params}, INPUTS)
  far = model.apply({"params": params}, INPUTS.at[:, 3].set(INPUTS[:, 3] % 23 + 1))
  np.testing.assert_allclose(far[:, 5:], base[:, 5:], atol=1e-6)  # 3 = t − 2 or earlier
  assert np.abs(np.asarray(far[:, 4] - base[:, 4])).max() > 1e-4  # 3 = t − 1: seen


# ---- Norm gain (1 + w), gated FFN. ----------------------------------------------------------

def test_rmsnorm_unit_offset_gain():
  """RMSNorm with the (1 + w) gain: w stored, init 0; y = x / √(mean(x²) + ε) ⊙ (1 + w)."""
  x = jnp.array([[1.0, -2.0, 3.0, 0.5]])
  module = norms.RMSNorm(eps=1e-6, unit_offset=True)
  params = nn.unbox(module.init(jax.random.key(0), x)["params"])
  np.testing.assert_array_equal(params["scale"], np.zeros(4))
  w = jnp.array([0.5, -0.5, 0.0, 2.0])
  rms = math.sqrt((1 + 4 + 9 + 0.25) / 4 + 1e-6)
  np.testing.assert_allclose(module.apply({"params": {"scale": w}}, x),
                             [[1.5 / rms, -1.0 / rms, 3.0 / rms, 1.5 / rms]], rtol=1e-6)


@pytest.mark.parametrize("activation, act_of_1, act_of_minus_1", [
    ("silu", 0.7310586, -0.2689414),  # x·σ(x)
    ("gelu", 0.8411920, -0.1588080)])  # tanh-approximated GELU
def test_gated_ffn_by_hand(activation, act_of_1, act_of_minus_1):
  """x = (1, −1), W_gate = I, W_up = diag(2, 1), W² = I: (act(x W_gate) ⊙ x W_up) W²
  = (2·act(1), −act(−1))."""
  mlp = layers.Mlp(2, activation, use_bias=False, gated=True)
  x = jnp.array([[1.0, -1.0]])
  params = {"wi_gate": {"kernel": jnp.eye(2)}, "wi_up": {"kernel": jnp.diag(jnp.array([2.0, 1.0]))},
            "wo": {"kernel": jnp.eye(2)}}
  assert jax.tree.map(jnp.shape, nn.unbox(mlp.init(jax.random.key(0), x)["params"])) == \
      jax.tree.map(jnp.shape, params)
  np.testing.assert_allclose(mlp.apply({"params": params}, x),
                             [[2 * act_of_1, -act_of_minus_1]], rtol=1e-5)


# ---- Refusals. ----------------------------------------------------------------------------

@pytest.mark.parametrize("options, message", [
    (dict(num_kv_heads=3), "model.num_heads=4 must be a multiple of model.num_kv_heads=3"),
    (dict(num_kv_heads=-1), "model.num_kv_heads=-1 is invalid: must be an integer >= 0"),
    (dict(pos_emb="rope", head_dim=5), "model.pos_emb='rope' needs an even head width"),
    # What model.sliding_window takes, -1 and 0 with their meanings (WINDOWS).
    (dict(attention_pattern="local"), "model.attention_pattern='local' with "
     "model.sliding_window=0 (none): local layers need a window; give a width W > 0, or -1 "
     "for automatic (half the run's final sequence length, at most 4096)"),
    (dict(sliding_window=4), "model.attention_pattern='global' with model.sliding_window=4: "
     "no layer is local to take the window; add local to the pattern, or set "
     "model.sliding_window=0 (none)"),
    (dict(attention_pattern="global,sliding", sliding_window=4),
     "model.attention_pattern='sliding' is not one of: global, local"),
    (dict(sliding_window=-2, attention_pattern="local"), "model.sliding_window=-2 is invalid: "
     "give a width W > 0, or -1 for automatic (half the run's final sequence length, at most "
     "4096); or 0 for none"),
    # W beyond int32 (XLA's positions): refused here, not jax's OverflowError in a run.
    (dict(sliding_window=2**31, attention_pattern="local"), "model.sliding_window=2147483648 "
     "is invalid: at most 2147483647 (2³¹ − 1: positions are int32)"),
    (dict(sliding_window=2**63 - 1, attention_pattern="local"),
     "model.sliding_window=9223372036854775807 is invalid: at most 2147483647"),
    (dict(attn_logit_softcap=30.0, attention_impl="xla"), "has no attention-logit soft-cap"),
    (dict(norm_unit_offset=True, norm_kind="scalenorm"), "needs a per-dimension gain"),
    (dict(query_scale=-1.0), "model.query_scale=-1.0 must be a number in [0.0, 10000.0]"),
    (dict(pos_emb="alibi"), "model.pos_emb='alibi' is not one of: learned, sinusoidal, rope, none"),
    (dict(rope_theta=0.0), "model.rope_theta=0.0 must be a number in (1.0, inf)"),
    # Every pair rotating at one frequency, 1 rad a position: positions ~2π apart alike.
    (dict(rope_theta=1.0), "model.rope_theta=1.0 must be a number in (1.0, inf)"),
    (dict(d_model=18), "model.d_model=18 must be divisible by model.num_heads=4"),
    # One token: every loss 0 (lnjax compile planned it; train refused it by chance).
    (dict(vocab_size=1), "model.vocab_size=1 is invalid: 2 or more, or 0 for the tokenizer's"),
])
def test_bad_block_options_are_one_line_config_errors(options, message):
  with pytest.raises(errors.ConfigError) as e:
    ModelConfig(**{**TINY, **options})
  assert message in str(e.value) and "\n" not in str(e.value)


def test_an_explicit_head_width_frees_d_model_from_the_head_count():
  """Gemma 2 2B: D 2304 = 8 heads × 288, but d_h = 256 (q: [D, H·d_h = 2048])."""
  assert ModelConfig(**{**TINY, "d_model": 18, "head_dim": 4}).head_size == 4


# ---- One finite train step (the full tier). ----------------------------------------------------

def _one_step(model, *inputs, targets):
  """One Adam step from init_params: the loss, the gradient norm and the new parameters'
  norm, all of which must be finite. Run eagerly: the placements share their small
  primitives, where jitted steps compiled a program for each placement (the same
  values; the sixteen placements took 98 s of CPU jitted, 53 s so). The loss is also traced
  on abstract values, as training's jit traces it: a value read in Python fails there (and
  under the eager gradient, where it depends on the parameters)."""
  params = nn.unbox(init_params(model, jax.random.key(0), *inputs))
  tx = optax.adam(1e-3)
  loss_fn = lambda p: optax.softmax_cross_entropy_with_integer_labels(
      model.apply({"params": p}, *inputs), targets).mean()

  def step(p, state):
    loss, grads = jax.value_and_grad(loss_fn)(p)
    updates, state = tx.update(grads, state, p)
    return loss, optax.tree.norm(grads), optax.tree.norm(optax.apply_updates(p, updates))

  jax.eval_shape(loss_fn, params)
  return [float(v) for v in step(params, tx.init(params))]


def _all_options(position):
  options = dict(ALL_OPTIONS)
  if position in ("olmo2", "ngpt", "hybridnorm"):
    options["qk_norm"] = False  # (they normalize q and k their own way)
  return ModelConfig(**TINY, **options, norm_position=position, mix_post_fraction=0.5)


@pytest.mark.parametrize("position", fast_tier(NORM_POSITIONS, ()))
def test_each_placement_takes_a_finite_step_with_every_option_on(position):
  """Every placement on the block with all of its options at once (RoPE, SwiGLU, GQA, an
  explicit head width, query scale, both soft-caps, local and global layers, (1 + w)
  RMSNorm, QK-norm, no biases): one finite Adam step of the LM, and of the encoder-decoder
  (nGPT, decoder-only, excepted)."""
  cfg = _all_options(position)
  steps = [_one_step(TransformerLM(cfg), TOKENS[:, :-1], targets=TOKENS[:, 1:])]
  if position != "ngpt":
    steps.append(_one_step(EncoderDecoder(cfg), TOKENS[:, 1:], TOKENS[:, :-1],
                           targets=TOKENS[:, 1:]))
  for loss, grad_norm, param_norm in steps:
    assert math.isfinite(loss) and 0 < grad_norm < 1e4 and math.isfinite(param_norm), steps


@pytest.mark.parametrize("option", fast_tier(list(EACH_OPTION), ()))
def test_each_option_alone_takes_a_finite_step(option):
  cfg = ModelConfig(**TINY, **EACH_OPTION[option])
  loss, grad_norm, param_norm = _one_step(TransformerLM(cfg), TOKENS[:, :-1],
                                          targets=TOKENS[:, 1:])
  assert math.isfinite(loss) and 0 < grad_norm < 1e4 and math.isfinite(param_norm)


@pytest.mark.parametrize("position", fast_tier(["pre", "mix", "lns"], ()))
def test_scanned_layers_with_every_option_equal_the_unrolled_ones(position):
  """model.scan_layers with local and global layers (each layer's window an input of the
  scan; Mix-LN's two runs and LayerNorm Scaling's run per layer each take their slice)."""
  cfg = _all_options(position)
  model = TransformerLM(cfg)
  params = nn.unbox(init_params(model, jax.random.key(0), INPUTS))
  scanned = TransformerLM(dataclasses.replace(cfg, scan_layers=True))
  np.testing.assert_allclose(scanned.apply({"params": scan_params(params, cfg)}, INPUTS),
                             model.apply({"params": params}, INPUTS), atol=1e-5)


@pytest.mark.slow  # (compiles a loss per placement)
@pytest.mark.parametrize("position", ["hybridnorm", "derf"])
def test_layer_removal_of_the_2025_placements_and_windowed_layers(position):
  """removal.layer_removal (the model one layer shallower) equals the full model whose
  block i returns its input, for HybridNorm and Derf (their blocks do not depend on the
  index); with local and global layers in turn too, each layer keeping its own window
  when it moves down."""
  from lnjax import tasks
  from lnjax.core.state import Setup

  cfg = ModelConfig(**{**TINY, "num_layers": 3}, norm_position=position)
  model = TransformerLM(cfg)
  # The batch's inputs, not TOKENS: the same parameters, from the eager programs the steps
  # above compiled for their shape (both cases 4.6 -> 3.5 CPU s cold, 2026-12-07, 2-core
  # machine).
  params = nn.unbox(init_params(model, jax.random.key(0), INPUTS))
  batches = [{"inputs": TOKENS[:, :-1], "targets": TOKENS[:, 1:],
              "weights": np.ones((2, 7), np.float32)}]
  setup = Setup(tasks.get("lm"), model, None, None)
  assert_layer_removal_is_the_block_passing_its_input_on(setup, params, batches, 3)
  # Local and global layers: each keeps its own window when it moves down (lnjax/hf's
  # Gemma analyses; tests/test_hf_modern.py checks it against this interception too).
  windowed = Setup(tasks.get("lm"), TransformerLM(dataclasses.replace(
      cfg, sliding_window=2, attention_pattern="local,global")), None, None)
  assert_layer_removal_is_the_block_passing_its_input_on(windowed, params, batches, 3)
