"""The models: shapes, causality, the Post-LN and Pre-LN formulas, Pre-LN's final norm."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lnjax.models import kernels
from lnjax.models import ModelConfig, TransformerLM, count_params, layers, norms

CFG = ModelConfig(vocab_size=50, num_layers=2, d_model=32, num_heads=4, d_ff=64, max_len=16,
                  dropout_rate=0.0)


def _init(cfg, t=8, seed=0):
  model = TransformerLM(cfg)
  tokens = jax.random.randint(jax.random.key(seed), (2, t), 0, cfg.vocab_size)
  params = nn.unbox(model.init(jax.random.key(1), tokens)["params"])
  return model, params, tokens


@pytest.mark.parametrize("pos", ["post", "pre"])
def test_shapes_and_finite(pos):
  cfg = ModelConfig(**{**CFG.__dict__, "norm_position": pos})
  model, params, tokens = _init(cfg)
  logits = model.apply({"params": params}, tokens)
  assert logits.shape == (2, 8, 50) and logits.dtype == jnp.float32
  assert np.isfinite(np.asarray(logits)).all()


@pytest.mark.parametrize("pos", ["post", "pre"])
def test_causality(pos):
  """Changing token t changes no logit before t."""
  cfg = ModelConfig(**{**CFG.__dict__, "norm_position": pos})
  model, params, tokens = _init(cfg)
  changed = tokens.at[:, 5].set((tokens[:, 5] + 1) % cfg.vocab_size)
  a = model.apply({"params": params}, tokens)
  b = model.apply({"params": params}, changed)
  np.testing.assert_allclose(a[:, :5], b[:, :5], atol=1e-6)
  assert np.abs(np.asarray(a[:, 5:] - b[:, 5:])).max() > 1e-4


def test_param_count_of_the_26m_lm():
  """The 8-layer, D 128, F 512, V 4096 untied LM of the course workshop: about 2.6M parameters."""
  cfg = ModelConfig(vocab_size=4096, num_layers=8, d_model=128, num_heads=4, d_ff=512,
                    max_len=128)
  model = TransformerLM(cfg)
  shapes = jax.eval_shape(lambda: model.init(jax.random.key(0), jnp.zeros((1, 8), jnp.int32)))
  n = count_params(nn.unbox(shapes["params"]))
  per_layer = 4 * (128 * 128 + 128) + (128 * 512 + 512) + (512 * 128 + 128) + 2 * 2 * 128
  assert n == 8 * per_layer + 4096 * 128 * 2 + 128 * 128 + 2 * 128  # + final LN (Pre-LN)
  assert 2.6e6 < n < 2.7e6


def test_tied_embeddings_share_the_matrix():
  """Tied: the logits are the final hidden state times the input embedding's transpose,
  and changing the embedding row of a token the input never uses changes that token's
  logit alone (the input side does not read the row)."""
  cfg = ModelConfig(**{**CFG.__dict__, "tie_embeddings": True})
  model, params, tokens = _init(cfg)
  assert "logits" not in params
  acts = _capture(cfg, params, tokens)
  embedding = np.asarray(params["embed"]["embedding"])
  np.testing.assert_allclose(acts[""], acts["final_norm"] @ embedding.T, atol=1e-4)
  unused = sorted(set(range(cfg.vocab_size)) - set(np.asarray(tokens).ravel().tolist()))[0]
  params2 = jax.tree.map(lambda x: x, params)
  params2["embed"]["embedding"] = params["embed"]["embedding"].at[unused].mul(-3.0)
  logits, logits2 = (np.asarray(model.apply({"params": p}, tokens)) for p in (params, params2))
  others = np.arange(cfg.vocab_size) != unused
  np.testing.assert_allclose(logits2[..., others], logits[..., others], atol=1e-6)
  np.testing.assert_allclose(logits2[..., unused], -3.0 * logits[..., unused], rtol=1e-4,
                             atol=1e-5)


def _layer_norm(x, p=None, eps=1e-5):
  """(x - μ) / √(σ² + ε) ⊙ γ + β in numpy; γ = 1, β = 0 without the norm's params `p`."""
  mu = x.mean(-1, keepdims=True)
  y = (x - mu) / np.sqrt(((x - mu) ** 2).mean(-1, keepdims=True) + eps)
  return y if p is None else y * np.asarray(p["scale"]) + np.asarray(p["bias"])


def random_norms(params, seed=0):
  """`params` with every norm's γ (scale) and β (bias) drawn at random (γ ~ 1 + N(0, ½²),
  β ~ N(0, ½²)), so that a formula test sees them used, and used in the right place."""
  keys = iter(jax.random.split(jax.random.key(seed), 1000))

  def draw(path, leaf):
    names = [str(getattr(k, "key", k)) for k in path]
    if not any(n.endswith("norm") for n in names[:-1]) or names[-1] not in ("scale", "bias"):
      return leaf
    noise = 0.5 * jax.random.normal(next(keys), jnp.shape(leaf))
    return noise + 1.0 if names[-1] == "scale" else noise

  return jax.tree_util.tree_map_with_path(draw, params)


def _capture(cfg, params, tokens):
  """Every sub-module's output, keyed by its module path ('' for the whole model)."""
  _, state = TransformerLM(cfg).apply({"params": params}, tokens,
                                      capture_intermediates=True, mutable=["intermediates"])
  flat = jax.tree_util.tree_flatten_with_path(state["intermediates"])[0]
  # Module outputs only (…/__call__/0); values a module sows under another name (the
  # health statistics) are left out.
  return {"/".join(str(k.key) for k in path[:-2]): np.asarray(v) for path, v in flat
          if len(path) >= 2 and getattr(path[-2], "key", None) == "__call__"}


def test_post_ln_formula():
  """Post-LN: every sub-layer ends in LN(x + F(x)) (random γ, β); no final norm."""
  cfg = ModelConfig(**{**CFG.__dict__, "norm_position": "post"})
  _, params, tokens = _init(cfg)
  params = random_norms(params)
  acts = _capture(cfg, params, tokens)
  p = params["layer_0"]
  x_in = acts["embed"]
  attn_out = acts["layer_0/self_attn"]
  after_attn = acts["layer_0/self_attn_norm"]
  np.testing.assert_allclose(after_attn, _layer_norm(x_in + attn_out, p["self_attn_norm"]),
                             atol=1e-5)
  ffn_out = acts["layer_0/ffn"]
  np.testing.assert_allclose(acts["layer_0"], _layer_norm(after_attn + ffn_out, p["ffn_norm"]),
                             atol=1e-5)
  # The self-attention reads the layer input itself (no norm before it).
  q = x_in @ np.asarray(p["self_attn"]["query"]["kernel"]) + np.asarray(
      p["self_attn"]["query"]["bias"])
  np.testing.assert_allclose(acts["layer_0/self_attn/query"], q, atol=1e-4)
  np.testing.assert_allclose(acts[""], acts["layer_1"] @ np.asarray(params["logits"]["kernel"]),
                             atol=1e-4)
  assert not any(k.startswith("final_norm") for k in params)


def test_pre_ln_formula_and_final_norm():
  """Pre-LN: x + F(LN(x)) with the stream left un-normalized, then one final LN."""
  cfg = ModelConfig(**{**CFG.__dict__, "norm_position": "pre"})
  _, params, tokens = _init(cfg)
  params = random_norms(params)
  acts = _capture(cfg, params, tokens)
  p = params["layer_0"]
  x_in = acts["embed"]
  np.testing.assert_allclose(acts["layer_0/self_attn_norm"],
                             _layer_norm(x_in, p["self_attn_norm"]), atol=1e-5)
  after_attn = x_in + acts["layer_0/self_attn"]
  np.testing.assert_allclose(acts["layer_0/ffn_norm"], _layer_norm(after_attn, p["ffn_norm"]),
                             atol=1e-5)
  np.testing.assert_allclose(acts["layer_0"], after_attn + acts["layer_0/ffn"], atol=1e-5)
  layer_out = acts["layer_1"]
  # The stream is not normalized after the last layer ...
  assert np.abs(layer_out.std(-1) - 1).max() > 0.05
  # ... the final norm normalizes it, and the output projection reads the normed stream.
  final = acts["final_norm"]
  np.testing.assert_allclose(final, _layer_norm(layer_out, params["final_norm"]), atol=1e-5)
  w = np.asarray(params["logits"]["kernel"])
  np.testing.assert_allclose(acts[""], final @ w, atol=1e-4)


def test_layernorm_and_rmsnorm_formulas_with_random_parameters():
  """LN(x) = (x - μ)/√(σ² + ε) ⊙ γ + β and RMSNorm(x) = x/√(mean(x²) + ε) ⊙ g, at random γ,
  β, g (initialized to 1 and 0)."""
  kx, kg, kb = jax.random.split(jax.random.key(0), 3)
  x = jax.random.normal(kx, (3, 16)) * 3 + 1
  g = 1 + jax.random.normal(kg, (16,))
  b = jax.random.normal(kb, (16,))
  ln = norms.LayerNorm(eps=1e-5)
  init = nn.unbox(ln.init(jax.random.key(1), x)["params"])
  np.testing.assert_array_equal(init["scale"], np.ones(16))
  np.testing.assert_array_equal(init["bias"], np.zeros(16))
  y = ln.apply({"params": {"scale": g, "bias": b}}, x)
  np.testing.assert_allclose(y, _layer_norm(np.asarray(x), {"scale": g, "bias": b}),
                             rtol=1e-5, atol=1e-5)
  rms = norms.RMSNorm(eps=1e-6)
  assert set(nn.unbox(rms.init(jax.random.key(1), x)["params"])) == {"scale"}  # No bias.
  y = rms.apply({"params": {"scale": g}}, x)
  x = np.asarray(x)
  np.testing.assert_allclose(y, x / np.sqrt((x**2).mean(-1, keepdims=True) + 1e-6) * np.asarray(g),
                             rtol=1e-5, atol=1e-6)


def test_sinusoidal_positions_formula():
  """Vaswani et al. §3.5: PE(p, 2i) = sin(p / 10000^(2i/D)), PE(p, 2i+1) = cos(same)."""
  from lnjax.models import layers
  pe_LxD = np.asarray(layers.sinusoidal_positions(50, 16))
  p, i = np.arange(50)[:, None], np.arange(8)[None, :]
  angle = p / 10000 ** (2 * i / 16)
  np.testing.assert_allclose(pe_LxD[:, 0::2], np.sin(angle), atol=1e-5)
  np.testing.assert_allclose(pe_LxD[:, 1::2], np.cos(angle), atol=1e-5)


def test_xavier_init_and_logical_axes():
  model = TransformerLM(CFG)
  boxed = model.init(jax.random.key(0), jnp.zeros((1, 4), jnp.int32))["params"]
  wi = boxed["layer_0"]["ffn"]["wi"]["kernel"]
  assert wi.names == ("embed", "mlp")
  assert boxed["layer_0"]["self_attn"]["query"]["kernel"].names == ("embed", "heads")
  assert boxed["embed"]["embedding"].names == ("vocab", "embed")
  # Xavier-uniform: U(-a, a) with a = √(6 / (fan_in + fan_out)).
  a = np.sqrt(6 / (32 + 64))
  w = np.asarray(wi.value)
  assert np.abs(w).max() <= a and np.abs(w).max() > 0.9 * a


def test_attention_bias_masks_padding():
  bias = layers.padding_bias(jnp.array([[1, 1, 0]]))
  assert bias.shape == (1, 1, 1, 3) and bias[0, 0, 0, 2] < -1e8 and bias[0, 0, 0, 0] == 0


def test_attention_core_custom_vjp_matches_autodiff():
  """The hand-written attention backward (dKᵀ = qᵀ dS, dVᵀ = dOᵀ P) equals autodiff's."""
  kq, kk, kv, kd = jax.random.split(jax.random.key(0), 4)
  q, k, v = (jax.random.normal(key, (2, 3, 5, 4)) for key in (kq, kk, kv))
  bias = jnp.broadcast_to(layers.causal_bias(5), (2, 3, 5, 5))
  do = jax.random.normal(kd, (2, 3, 5, 4))

  def plain(q, k, v):
    p = jax.nn.softmax(jnp.einsum("bhtk,bhsk->bhts", q, k) + bias, axis=-1)
    return jnp.sum(jnp.einsum("bhts,bhsk->bhtk", p, v) * do)

  custom = lambda q, k, v: jnp.sum(kernels.attention_core(q, k, v, bias) * do)
  np.testing.assert_allclose(custom(q, k, v), plain(q, k, v), rtol=1e-6)
  for g_custom, g_plain in zip(jax.grad(custom, (0, 1, 2))(q, k, v),
                               jax.grad(plain, (0, 1, 2))(q, k, v)):
    np.testing.assert_allclose(g_custom, g_plain, atol=1e-5)


def test_causal_attention_skips_only_masked_blocks():
  """Splitting the queries in halves under a causal mask gives attention_core's values and
  gradients exactly."""
  k1, k2, k3 = jax.random.split(jax.random.key(1), 3)
  q, k, v = (jax.random.normal(key, (2, 2, 64, 8)) for key in (k1, k2, k3))
  bias = layers.causal_bias(64)
  full = lambda q, k, v: jnp.sum(jnp.sin(kernels.attention_core(q, k, v, bias)))
  split = lambda q, k, v: jnp.sum(jnp.sin(kernels.causal_attention(q, k, v, bias)))
  np.testing.assert_allclose(split(q, k, v), full(q, k, v), rtol=1e-5)
  for a, b in zip(jax.grad(split, (0, 1, 2))(q, k, v), jax.grad(full, (0, 1, 2))(q, k, v)):
    np.testing.assert_allclose(a, b, atol=1e-5)


@pytest.fixture(scope="module")
def attention_case():
  """The encoder-decoder, its inputs and parameters, and a jitted loss-and-gradients of a
  given attention_impl; with the plain kernel's (computed once for both impls below)."""
  from lnjax.models import EncoderDecoder, ModelConfig as Cfg
  src = jax.random.randint(jax.random.key(0), (2, 64), 1, 50).at[1, 40:].set(0)  # padded
  tgt = jax.random.randint(jax.random.key(1), (2, 64), 1, 50)
  cfg = Cfg(**{**CFG.__dict__, "max_len": 64})
  params = nn.unbox(EncoderDecoder(cfg).init(jax.random.key(2), src, tgt)["params"])

  def loss(params, impl):
    m = EncoderDecoder(Cfg(**{**cfg.__dict__, "attention_impl": impl}))
    return jnp.mean(jax.nn.log_softmax(m.apply({"params": params}, src, tgt))[..., 7])

  grad = jax.jit(jax.value_and_grad(loss), static_argnums=1)
  return cfg, params, grad, grad(params, "plain")


@pytest.mark.slow  # The GPU kernels' stand-ins (the CPU trains on the plain kernel).
@pytest.mark.parametrize("impl", ["xla", "reference"])
def test_attention_impl_equals_the_plain_path(impl, attention_case):
  """model.attention_impl='xla' (jax.nn.dot_product_attention, the reference for cuDNN's
  flash attention on a GPU) and 'reference' (the textbook formula, autodiff) give the plain
  kernel's loss and gradients: causal self-attention of 64 positions (the plain kernel's
  halves), padded sources, cross-attention."""
  from lnjax.models import ModelConfig as Cfg
  cfg, params, grad, (plain, g_plain) = attention_case
  xla, g_xla = grad(params, impl)
  np.testing.assert_allclose(xla, plain, rtol=1e-6)
  for a, b in zip(jax.tree.leaves(g_xla), jax.tree.leaves(g_plain)):
    np.testing.assert_allclose(a, b, atol=1e-6)
  with pytest.raises(Exception, match="needs model.dtype='bfloat16'"):
    Cfg(**{**cfg.__dict__, "attention_impl": "cudnn"})
  with pytest.raises(Exception, match="has no attention dropout"):
    Cfg(**{**cfg.__dict__, "attention_impl": "xla", "attention_dropout_rate": 0.1})
