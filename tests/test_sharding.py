"""Sharded steps on 8 virtual CPU devices equal the single-device step."""

import functools

import jax
import numpy as np
import pytest

from lnjax import optim, sharding, state as state_lib, train
from lnjax.models import ModelConfig

SEQ = 16


def _setup(pos):
  # SGD: Adam's m/√v turns rounding noise in exactly-zero gradients (the key bias's, say)
  # into full-size updates, which would compare noise rather than sharding.
  cfg = ModelConfig(vocab_size=64, num_layers=2, d_model=32, num_heads=4, d_ff=64, max_len=SEQ,
                    norm_position=pos, dropout_rate=0.1)
  return state_lib.make_setup(cfg, optim.OptConfig(name="sgd", learning_rate=0.5), 100)


def _run(setup, mesh, batches, steps=2):
  shardings = state_lib.state_shardings(setup, mesh)
  step = jax.jit(functools.partial(train.train_step, setup=setup, label_smoothing=0.1, seed=0),
                 in_shardings=(shardings, sharding.batch_sharding(mesh)),
                 out_shardings=(shardings, sharding.replicated(mesh)), donate_argnums=0)
  state = state_lib.init_state(setup, mesh, seed=0)
  losses = []
  for b in batches[:steps]:
    state, m = step(state, sharding.global_batch(b, sharding.batch_sharding(mesh)))
    losses.append(float(m["train_loss"]))
  return jax.device_get(state.params), losses, state


def _batches(n=2, b=8):
  rng = np.random.default_rng(0)
  out = []
  for _ in range(n):
    tokens = rng.integers(0, 64, (b, SEQ + 1)).astype(np.int32)
    out.append({"inputs": tokens[:, :-1], "targets": tokens[:, 1:],
                "weights": np.ones((b, SEQ), np.float32)})
  return out


def test_eight_virtual_devices():
  assert jax.device_count() == 8, "tests/conftest.py sets 8 virtual CPU devices"


@pytest.mark.parametrize("pos, shape", [("post", (4, 1, 2)), ("pre", (4, 1, 2)),
                                        ("pre", (2, 2, 2)), ("post", (8, 1, 1))])
def test_sharded_step_equals_single_device(pos, shape):
  """(data, fsdp, model) meshes: data × model, all three axes, pure data parallel."""
  setup, batches = _setup(pos), _batches()
  single = sharding.make_mesh(sharding.MeshConfig(data=1), jax.devices()[:1])
  p1, l1, _ = _run(setup, single, batches)
  mesh = sharding.make_mesh(sharding.MeshConfig(*shape))
  p8, l8, state8 = _run(setup, mesh, batches)
  np.testing.assert_allclose(l8, l1, rtol=1e-5, atol=1e-5)
  for a, b in zip(jax.tree.leaves(p8), jax.tree.leaves(p1)):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
  # Parameters really are split: FFN W¹ is [D, F] with F over 'model', D over 'fsdp'.
  wi = state8.params["layer_0"]["ffn"]["wi"]["kernel"]
  data, fsdp, model = shape
  assert wi.addressable_shards[0].data.shape == (32 // fsdp, 64 // model)


def test_mesh_refusals():
  from lnjax import errors
  with pytest.raises(errors.ConfigError, match="mesh.model=0"):
    sharding.MeshConfig(model=0)
  with pytest.raises(errors.ConfigError, match="exceeds"):
    sharding.MeshConfig(data=4, model=4).shape(8)
  with pytest.raises(errors.ConfigError, match="do not divide"):
    sharding.MeshConfig(data=-1, model=3).shape(8)
