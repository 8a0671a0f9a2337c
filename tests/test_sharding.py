"""Sharded steps on 8 virtual CPU devices equal the single-device step; FSDP holds 1/8 of
the state per device; a checkpoint saved on one mesh restores onto another.

Every model is stepped under FSDP and under data × FSDP × tensor parallelism (2×2×2), the
LM also under pure data and pure tensor parallelism, and every norm placement under one
of them. The full product (3 models × 16 placements × 4 modes) would compile ~170 train
steps; the placements differ only inside the blocks all three models share
(transformer.stack), so each is paired with one model and mode (the encoder-decoder
carries two: one per stack). B2T, which adds no parameter, takes pure data parallelism.
"""

import contextlib
import dataclasses

import jax
import numpy as np
import optax
import pytest

from lnjax import tasks
from lnjax.core import checkpoint, errors, optim, sharding, state as state_lib, steps as steps_lib
from lnjax.models import NORM_POSITIONS, ModelConfig

B, T, V = 8, 8, 64
MODES = {"data": (8, 1, 1), "fsdp": (1, 8, 1), "model": (1, 1, 8), "all": (2, 2, 2)}
# (task, mode, norm placement or (encoder's, decoder's)).
CASES = [
    ("lm", "data", "b2t"), ("lm", "fsdp", "admin"), ("lm", "model", "mix"),
    ("lm", "all", "normformer"),
    ("translation", "fsdp", ("deepnorm", "resi_dual")), ("translation", "all", ("pre", "sandwich")),
    ("mlm_nsp", "fsdp", "post"), ("mlm_nsp", "all", "peri"),
    # 2024-25: nGPT (LM only) with its norms over a tensor-parallel D, OLMo 2's QK-norm over
    # all heads with the heads split, DyT and LayerNorm Scaling in the two stacks.
    ("lm", "all", "ngpt"), ("lm", "model", "olmo2"), ("translation", "fsdp", ("dyt", "lns")),
    # 2025: HybridNorm's per-head q, k, v norms with the heads split; Derf in both stacks.
    ("lm", "model", "hybridnorm"), ("translation", "all", ("derf", "hybridnorm")),
]


def test_cases_cover_every_placement_and_mode():
  placements = {p for _, _, pos in CASES for p in (pos if isinstance(pos, tuple) else (pos,))}
  assert placements == set(NORM_POSITIONS)
  assert {mode for task, mode, _ in CASES if task == "lm"} == set(MODES)
  for task in ("translation", "mlm_nsp"):
    assert {mode for t, mode, _ in CASES if t == task} == {"fsdp", "all"}


def _setup(task: str, pos, dropout: float) -> state_lib.Setup:
  # SGD: Adam's m/√v turns rounding noise in exactly-zero gradients (the key bias's, say)
  # into full-size updates, which would compare noise rather than sharding.
  enc, dec = pos if isinstance(pos, tuple) else (pos, pos)
  cfg = ModelConfig(vocab_size=V, num_layers=2 if "mix" in (enc, dec) else 1, d_model=32,
                    num_heads=2, d_ff=64, max_len=T, norm_position=enc,
                    decoder_norm_position=dec if task == "translation" else "",
                    mix_post_fraction=0.5, dropout_rate=dropout)
  return state_lib.make_setup(cfg, optim.OptConfig(name="sgd", learning_rate=0.5), 100,
                              task=tasks.get(task))


def _batches(task: str, n=2) -> list[dict]:
  rng = np.random.default_rng(0)
  tokens = lambda *shape: rng.integers(1, V, shape).astype(np.int32)
  out = []
  for _ in range(n):
    if task == "lm":
      x = tokens(B, T + 1)
      batch = {"inputs": x[:, :-1], "targets": x[:, 1:]}
    elif task == "translation":
      y = tokens(B, T + 1)
      batch = {"inputs": tokens(B, T), "decoder_inputs": y[:, :-1], "targets": y[:, 1:]}
    else:  # Masked LM with next-sentence prediction: 2 predictions per row.
      batch = {"inputs": tokens(B, T), "segment_ids": (np.arange(T) >= T // 2)[None].repeat(
                   B, 0).astype(np.int32), "mlm_positions": tokens(B, 2) % T,
               "targets": tokens(B, 2), "nsp_labels": tokens(B) % 2}
    batch["weights"] = np.ones(batch["targets"].shape, np.float32)
    out.append(batch)
  return out


def _run(setups, mesh, initials, batches):
  """Losses [case, step] and final states of every case, each case stepped by a program of
  its own jitted with the mesh's shardings. One program for all of them compiled slower
  than a program each: the 13 cases on one device 13.3 CPU s, 9.3 s apart; the 2×2×2
  mesh's 5 cases 7.5 s, 6.5 s apart (cold compilation cache, 2026-12-07, 2-core machine)."""
  batch_sharding = sharding.batch_sharding(mesh)
  losses, states = [], []
  for setup, initial, case_batches in zip(setups, initials, batches, strict=True):
    shardings = state_lib.state_shardings(setup, mesh)

    def step(state, batch, setup=setup):
      with sharding.activations_on(mesh):  # (the models' activation constraints, as a run's)
        state, metrics = steps_lib.train_step(state, batch, setup=setup, label_smoothing=0.1,
                                              seed=0)
      return state, metrics["train_loss"]

    step = jax.jit(step, in_shardings=(shardings, batch_sharding),
                   out_shardings=(shardings, sharding.replicated(mesh)))
    state, case_losses = jax.device_put(initial, shardings), []
    for batch in case_batches:
      state, loss = step(state, sharding.global_batch(batch, batch_sharding))
      case_losses.append(loss)
    losses.append(case_losses)
    states.append(state)
  return np.asarray(jax.device_get(losses)), states


def _setups(cases):
  # Dropout (its masks drawn over sharded shapes) in the LM's data and 2×2×2 cases.
  return [_setup(task, pos, dropout=0.1 if task == "lm" and mode in ("data", "all") else 0.0)
          for task, mode, pos in cases]


@pytest.fixture(scope="module")
def single_device():
  """Every case's initial state and its two steps on one device."""
  setups = _setups(CASES)
  one = sharding.make_mesh(sharding.MeshConfig(data=1), jax.devices()[:1])
  # Drawn by XLA's RngBitGenerator (unsafe_rbg) rather than threefry, whose rounds, once for
  # every parameter of the 13 models, made the init program slow to compile: 8.5 CPU s,
  # 5.8 s with it (cold compilation cache, 2026-12-07, 2-core machine). The steps compare
  # sharded and single-device runs from the same initial state, whatever drew it.
  with jax.default_prng_impl("unsafe_rbg"):
    initials = jax.device_get(jax.jit(lambda: [state_lib.init_state(s, one, 0)
                                               for s in setups])())
  losses, states = _run(setups, one, initials, [_batches(task) for task, _, _ in CASES])
  return initials, losses, jax.device_get(states)


def _bytes_on(state, device) -> int:
  return sum(s.data.nbytes for leaf in jax.tree.leaves(state) for s in leaf.addressable_shards
             if s.device == device)


@pytest.mark.slow
@pytest.mark.parametrize("mode", MODES)
def test_sharded_steps_equal_single_device(mode, single_device):
  initials, losses, states = single_device
  index = [i for i, case in enumerate(CASES) if case[1] == mode]
  cases = [CASES[i] for i in index]
  mesh = sharding.make_mesh(sharding.MeshConfig(*MODES[mode]))
  l8, s8 = _run(_setups(cases), mesh, [initials[i] for i in index],
                [_batches(task) for task, _, _ in cases])
  data, fsdp, model = MODES[mode]
  for case, i, loss, state in zip(cases, index, l8, s8):
    np.testing.assert_allclose(loss, losses[i], rtol=1e-5, atol=1e-5, err_msg=str(case))
    for a, b in zip(jax.tree.leaves(state), jax.tree.leaves(states[i])):
      np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5, err_msg=str(case))
    # State per device: all of it (data); ~1/8 (FSDP: every matrix split over 'embed',
    # only biases and norm gains whole); ~1/4 (FSDP 2 × tensor 2).
    total = sum(x.nbytes for x in jax.tree.leaves(states[i]))
    here = _bytes_on(state, jax.devices()[0])
    low, high = {"data": (1, 1), "fsdp": (1 / 8, 1.3 / 8), "model": (1 / 8, 1 / 2),
                 "all": (1 / 4, 1.3 / 4)}[mode]
    assert low * total <= here <= high * total, (case, here / total)
    wi = next(x for path, x in jax.tree_util.tree_leaves_with_path(state.params)
              if jax.tree_util.keystr(path).endswith("['ffn']['wi']['kernel']"))
    assert wi.addressable_shards[0].data.shape == (32 // fsdp, 64 // model), case


def test_checkpoint_restores_onto_another_mesh(tmp_path):
  """Saved from FSDP over 8 devices; restored onto tensor parallel over 8 and onto one."""
  setup = _setup("lm", "pre", dropout=0.0)
  one = sharding.make_mesh(sharding.MeshConfig(data=1), jax.devices()[:1])
  initial = jax.device_get(state_lib.init_state(setup, one, seed=0))
  fsdp = sharding.make_mesh(sharding.MeshConfig(*MODES["fsdp"]))
  saved = jax.device_put(initial, state_lib.state_shardings(setup, fsdp))
  ckpt = checkpoint.Checkpoints(str(tmp_path), 1, 1)
  ckpt.save(1, saved, {"position": 7}, force=True)
  ckpt.wait()
  for mesh in (sharding.make_mesh(sharding.MeshConfig(*MODES["model"])), one):
    state, data, _ = ckpt.restore_latest(state_lib.abstract_state(setup, mesh))
    assert data == {"position": 7}
    for a, b in zip(jax.tree.leaves(state), jax.tree.leaves(initial)):
      np.testing.assert_array_equal(a, b)
    wi = state.params["layer_0"]["ffn"]["wi"]["kernel"]
    assert wi.addressable_shards[0].data.shape == (32, 64 // mesh.shape["model"])
  ckpt.close()


@contextlib.contextmanager
def _jax_events(suffix: str):
  """The list of jax.monitoring's duration events ending in `suffix` while the block runs
  (a trace: "jaxpr_trace_duration"; a lowering: "jaxpr_to_mlir_module_duration")."""
  events = []

  def count(event, secs, **_):
    if event.endswith(suffix):
      events.append(event)
  jax.monitoring.register_event_duration_secs_listener(count)
  try:
    yield events
  finally:
    jax.monitoring.unregister_event_duration_listener(count)


def test_the_model_init_is_traced_once_per_setup():
  """The shardings and the restore target (asked again by a rollback) share one trace of
  the model's init (Setup.boxed_shapes); a fresh state adds its jitted init's. A setup
  with another optimizer or model traces its own, and gets its own shapes."""
  setup = _setup("lm", "pre", dropout=0.0)
  one = sharding.make_mesh(sharding.MeshConfig(data=1), jax.devices()[:1])
  with _jax_events("jaxpr_trace_duration") as traces:
    state_lib.state_shardings(setup, one)
    target = state_lib.abstract_state(setup, one)
    assert state_lib.abstract_state(setup, one) == target
    assert len(traces) == 1
    state = state_lib.init_state(setup, one, seed=0)
    assert len(traces) == 2
    adam = dataclasses.replace(setup, tx=optax.adam(1e-3))
    wider = state_lib.make_setup(dataclasses.replace(setup.model.cfg, d_ff=128),
                                 optim.OptConfig(name="sgd", learning_rate=0.5), 100,
                                 task=setup.task)
    adam_target, wider_target = (state_lib.abstract_state(s, one) for s in (adam, wider))
    assert len(traces) == 4
  shapes = lambda tree: jax.tree.map(lambda x: (x.shape, x.dtype), tree)
  assert shapes(target) == shapes(state)
  assert jax.tree.structure(adam_target.opt_state) != jax.tree.structure(target.opt_state)
  assert shapes(adam_target.params) == shapes(target.params)
  assert wider_target.params["layer_0"]["ffn"]["wi"]["kernel"].shape == (32, 128)
  assert target.params["layer_0"]["ffn"]["wi"]["kernel"].shape == (32, 64)


def test_a_single_process_save_compiles_no_program(tmp_path):
  """Orbax's replica-parallel saving sliced every replicated array on device, one small
  program per shape (56 of the LM smoke run's 60); in one process lnjax saves each array
  from one replica, and a save lowers nothing."""
  setup = _setup("lm", "pre", dropout=0.0)
  data = sharding.make_mesh(sharding.MeshConfig(*MODES["data"]))
  state = state_lib.init_state(setup, data, seed=0)
  with _jax_events("jaxpr_to_mlir_module_duration") as lowered:
    ckpt = checkpoint.Checkpoints(str(tmp_path), 1, 1)
    ckpt.save(1, state, {}, force=True)
    ckpt.wait()
  assert lowered == []
  restored, _, _ = ckpt.restore_latest(state_lib.abstract_state(setup, data))
  for a, b in zip(jax.tree.leaves(restored), jax.tree.leaves(state)):
    np.testing.assert_array_equal(a, b)
  ckpt.close()


def test_mesh_shapes_and_refusals():
  assert sharding.MeshConfig().shape(8) == (8, 1, 1)
  assert sharding.MeshConfig(data=2, model=-1).shape(8) == (2, 1, 4)
  assert sharding.MeshConfig(dcn_data=2).dcn_shape == (2, 1, 1)
  with pytest.raises(errors.ConfigError, match="mesh.model=0"):
    sharding.MeshConfig(model=0)
  with pytest.raises(errors.ConfigError, match="mesh.dcn_fsdp=0"):
    sharding.MeshConfig(dcn_fsdp=0)
  with pytest.raises(errors.ConfigError, match="exceeds"):
    sharding.MeshConfig(data=4, model=4).shape(8)
  with pytest.raises(errors.ConfigError, match="do not divide"):
    sharding.MeshConfig(data=-1, model=3).shape(8)
  # Two granules (slices, or processes on CPU) asked for; this process is one.
  with pytest.raises(errors.ConfigError, match="must equal the product of dcn_mesh_shape"):
    sharding.make_mesh(sharding.MeshConfig(dcn_fsdp=2))


def test_eight_virtual_devices():
  assert jax.device_count() == 8, "tests/conftest.py sets 8 virtual CPU devices"
