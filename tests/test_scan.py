"""`model.scan_layers` and `model.remat_policy` (lnjax/models/transformer.py `stack`): the
scanned stack is the unrolled one with its layers' parameters stacked, so the same
parameters give the same loss and gradients, under every norm placement.

Forward passes run op by op (jax.disable_jit: nn.scan's body then runs once per layer
in Python, a fraction of a second for these tiny models, where compiling both variants
takes seconds); the gradient test compiles the scanned, rematerialized step.
"""

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lnjax.core import losses
from lnjax.inference import decode as decode_lib
from lnjax import tasks
from lnjax.core import errors, optim, sharding, state
from lnjax.models import (NORM_POSITIONS, EncoderDecoder, ModelConfig, TransformerLM,
                          init_params, placement)
from lnjax.models.bert import BertPretraining
from lnjax.models.transformer import scan_params, unscan_params

from conftest import fast_tier

# Two layers, so that Mix-LN (α = 0.5) has one Post-LN and one Pre-LN run.
CFG = ModelConfig(vocab_size=24, num_layers=2, d_model=16, num_heads=2, d_ff=32, max_len=16,
                  dropout_rate=0.0, mix_post_fraction=0.5, scan_layers=True)
TOKENS = jax.random.randint(jax.random.key(0), (2, 9), 1, CFG.vocab_size)


def _init(model, *inputs):
  with jax.disable_jit():
    return nn.unbox(init_params(model, jax.random.key(1), *inputs))


def _unrolled(model):
  return model.clone(cfg=dataclasses.replace(model.cfg, scan_layers=False))


def _lm_loss(model, params):
  logits = model.apply({"params": params}, TOKENS[:, :-1])
  return losses.cross_entropy(logits, TOKENS[:, 1:], jnp.ones((2, 8)), 0.0)[0] / 16


def _close(a, b, atol=1e-5):
  jax.tree.map(lambda x, y: np.testing.assert_allclose(x, y, atol=atol, rtol=0), a, b)


@pytest.mark.parametrize("position", fast_tier(NORM_POSITIONS, ("pre",)))
def test_scanned_lm_equals_unrolled(position):
  """Parameters initialized scanned (Admin's ω profiled through the unrolled model),
  unstacked for the unrolled model: the same logits."""
  model = TransformerLM(dataclasses.replace(CFG, norm_position=position))
  params = _init(model, TOKENS)
  names = {name for name, _, _ in placement.layer_runs(model.cfg)}
  assert names <= set(params) and not any(k.startswith("layer_") for k in params)
  with jax.disable_jit():
    scanned = model.apply({"params": params}, TOKENS)
    unrolled = _unrolled(model).apply({"params": unscan_params(params, model.cfg)}, TOKENS)
  np.testing.assert_allclose(scanned, unrolled, atol=1e-5, rtol=0)
  _close(scan_params(unscan_params(params, model.cfg), model.cfg), params, atol=0)


@pytest.mark.slow
def test_scanned_gradients_equal_unrolled_with_remat():
  """Loss and gradients of the scanned stack under remat (nothing saved) against the
  unrolled stack without remat, for the same (unrolled-initialized) parameters; Mix-LN,
  so that two scans and the stacking of gradients per run are exercised."""
  cfg = dataclasses.replace(CFG, norm_position="mix", scan_layers=False)
  unrolled = TransformerLM(cfg)
  # Initialized on TOKENS, as the other tests are: the same parameters from the eager
  # programs compiled for that shape (2.6 -> 1.5 CPU s cold, 2026-12-07, 2-core machine).
  params = _init(unrolled, TOKENS)
  scanned = TransformerLM(dataclasses.replace(cfg, scan_layers=True,
                                              remat_policy="nothing_saveable"))
  grad = lambda model, p: jax.jit(jax.value_and_grad(lambda q: _lm_loss(model, q)))(p)
  loss_u, grads_u = grad(unrolled, params)
  loss_s, grads_s = grad(scanned, scan_params(params, cfg))
  np.testing.assert_allclose(loss_s, loss_u, atol=1e-5, rtol=0)
  _close(unscan_params(grads_s, cfg), grads_u)


@pytest.mark.slow
def test_scanned_encoder_decoder():
  """Encoder-decoder (Post-LN encoder, DeepNorm decoder: per-stack constants, 2+3
  layers): the unrolled model's logits, and its beam search (the scanned decode cache
  stacked per layer)."""
  cfg = dataclasses.replace(CFG, encoder_norm_position="post", decoder_norm_position="deepnorm",
                            num_decoder_layers=3, remat_policy="dots_saveable")
  model = EncoderDecoder(cfg)
  src, tgt = TOKENS, TOKENS  # One shape throughout: op-by-op kernels are compiled once.
  params = _init(model, src, tgt)
  assert "layers" in params["encoder"]
  assert params["decoder"]["layers"]["ffn"]["wi"]["kernel"].shape == (3, 16, 32)
  plain_params = unscan_params(params, cfg)
  assert {"layer_0", "layer_2"} <= set(plain_params["decoder"])
  with jax.disable_jit():
    logits = model.apply({"params": params}, src, tgt)
    np.testing.assert_allclose(
        logits, _unrolled(model).apply({"params": plain_params}, src, tgt), atol=1e-5, rtol=0)

  # Beam search (cache rows reordered along the scanned cache's hypothesis axis, 1).
  search = lambda m, p: decode_lib.beam_search(m, p, src[:, :4], beam_size=2, max_len=4,
                                               bos_id=1, eos_id=2)
  (tokens_s, score_s), (tokens_u, score_u) = search(model, params), search(_unrolled(model),
                                                                         plain_params)
  np.testing.assert_array_equal(tokens_s, tokens_u)
  np.testing.assert_allclose(score_s, score_u, atol=1e-5, rtol=0)


@pytest.mark.slow
def test_scanned_bert_equals_unrolled():
  model = BertPretraining(dataclasses.replace(CFG, norm_position="post"), next_sentence=True)
  inputs = (TOKENS, jnp.zeros_like(TOKENS), TOKENS[:, :2] % 9)
  params = _init(model, *inputs)
  assert "layers" in params["bert"]["stack"]
  with jax.disable_jit():
    _close(model.apply({"params": params}, *inputs),
           _unrolled(model).apply({"params": unscan_params(params, model.cfg)}, *inputs))


def test_scanned_parameters_carry_a_layers_axis():
  """The stacked axis is named 'layers' (replicated by the mesh rules); shardings of the
  whole train state follow."""
  setup = state.make_setup(dataclasses.replace(CFG, remat_policy="dots_saveable"),
                           optim.OptConfig(), num_steps=10, task=tasks.get("lm"))
  boxed = jax.eval_shape(lambda: init_params(setup.model, jax.random.key(0), TOKENS))
  spec = nn.get_partition_spec(boxed)["layers"]["self_attn"]["query"]["kernel"]
  assert tuple(spec) == ("layers", "embed", "heads")
  mesh = sharding.make_mesh(sharding.MeshConfig(data=1), jax.devices()[:1])
  assert state.state_shardings(setup, mesh).params["layers"]["ffn"]["wi"]["kernel"].spec[0] is None


def test_config_refuses_unknown_remat_policy():
  with pytest.raises(errors.ConfigError, match="remat_policy"):
    dataclasses.replace(CFG, remat_policy="save_everything")
  with pytest.raises(errors.ConfigError, match="scan_layers"):
    dataclasses.replace(CFG, scan_layers="yes")
