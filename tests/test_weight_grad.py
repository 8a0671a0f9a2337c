"""`model.weight_grad='transposed'` (kernels.matmul_transposed_grad): dense layers whose
gradients come from materialized transposes give autodiff's gradients."""

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lnjax.core import losses
from lnjax.core import errors
from lnjax.models import kernels
from lnjax.models import ModelConfig, TransformerLM


def test_matmul_gradients_equal_autodiff():
  kx, kw, kg = jax.random.split(jax.random.key(0), 3)
  x, w = jax.random.normal(kx, (24, 16)), jax.random.normal(kw, (16, 8))
  g = jax.random.normal(kg, (24, 8))
  loss = lambda matmul: lambda x, w: jnp.sum(matmul(x, w) * g)
  want = jax.grad(loss(jnp.matmul), argnums=(0, 1))(x, w)
  got = jax.jit(jax.grad(loss(kernels.matmul_transposed_grad), argnums=(0, 1)))(x, w)
  for a, b in zip(got, want):
    np.testing.assert_allclose(a, b, atol=1e-5, rtol=1e-5)


def test_lm_gradients_equal_autodiff():
  """Every dense layer of a tiny LM (attention, FFN, output projection): same loss and
  gradients, same parameters."""
  cfg = ModelConfig(vocab_size=24, num_layers=2, d_model=16, num_heads=2, d_ff=32, max_len=16,
                    dropout_rate=0.0)
  tokens = jax.random.randint(jax.random.key(0), (2, 9), 1, cfg.vocab_size)
  params = nn.unbox(TransformerLM(cfg).init(jax.random.key(1), tokens[:, :-1])["params"])

  def grads(weight_grad):
    model = TransformerLM(dataclasses.replace(cfg, weight_grad=weight_grad))

    def loss(p):
      logits = model.apply({"params": p}, tokens[:, :-1])
      return losses.cross_entropy(logits, tokens[:, 1:], jnp.ones((2, 8)), 0.0)[0] / 16

    return jax.jit(jax.value_and_grad(loss))(params)

  (loss_a, grads_a), (loss_t, grads_t) = grads("autodiff"), grads("transposed")
  np.testing.assert_allclose(loss_t, loss_a, atol=1e-6)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-5, rtol=0), grads_t,
               grads_a)
  # Each transposed dense layer's backward holds one optimization barrier: Q, K, V, O,
  # W¹, W² per layer and the output projection.
  jaxpr = jax.make_jaxpr(jax.grad(lambda p: TransformerLM(
      dataclasses.replace(cfg, weight_grad="transposed")).apply({"params": p}, tokens).sum()))
  assert str(jaxpr(params)).count("optimization_barrier") == 2 * 6 + 1


def test_config_refuses_unknown_weight_grad():
  with pytest.raises(errors.ConfigError, match="weight_grad"):
    ModelConfig(weight_grad="manual")
