"""The pure train and eval steps every run compiles (lnjax/core/build.py jits them)."""

import jax
import jax.numpy as jnp
import optax

from lnjax.core import health as health_lib, metrics as metrics_lib, run as run_lib
from lnjax.core import state as state_lib
from lnjax.models import transformer


def train_step(state: state_lib.TrainState, batch: dict, *, setup: state_lib.Setup,
               label_smoothing: float, seed: int, log_grad_norms: bool = False,
               lr_scale: float = 1.0, health: bool = False,
               dropout_rng: str = run_lib.TrainConfig.dropout_rng):
  """One optimizer update; pure. Dropout's key is a function of (seed, step) (`_dropout_key`).
  `lr_scale` (static) multiplies the update: the learning rate's, for lnjax's optimizers,
  whose last factor it is. `health`: the per-layer RMS of gradient, update and parameters
  in the metrics (health/...; the statistics the model sows come from `activation_step`).
  `dropout_rng`: the masks' generator (train.dropout_rng)."""
  dropout_key = _dropout_key(seed, dropout_rng, state.step)

  def loss_fn(params):
    outputs = setup.model.apply({"params": params}, *setup.task.model_inputs(batch),
                                deterministic=False, rngs={"dropout": dropout_key})
    loss_sum, nll_sum, count = setup.task.loss(outputs, batch, label_smoothing)
    return loss_sum / count, nll_sum / count

  (loss, nll), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params)
  # (`value`: the loss, which health.skip_spikes reads; other transforms ignore it.)
  updates, opt_state = optax.with_extra_args_support(setup.tx).update(
      grads, state.opt_state, state.params, value=loss)
  learning_rate = setup.schedule(state.step)
  if lr_scale != 1.0:  # (A recovery hook's Action; 1.0 leaves the program as it was.)
    updates = jax.tree.map(lambda u: u * lr_scale, updates)
    learning_rate = learning_rate * lr_scale
  params = optax.apply_updates(state.params, updates)
  metrics = {"train_loss": nll, "learning_rate": learning_rate,
             "grad_norm": optax.tree.norm(grads), "param_norm": optax.tree.norm(params)}
  if log_grad_norms:  # ‖∂L/∂W‖_F of every weight, per layer and sub-layer.
    cfg = setup.model.cfg  # Scanned layers: unstacked into layer_0, layer_1, ... first.
    per_layer = transformer.unscan_params(grads, cfg) if cfg.scan_layers else grads
    metrics.update(metrics_lib.per_weight_norms(per_layer, "grad_norm"))
  if health:
    metrics.update(health_lib.step_statistics(setup.model.cfg, state.params, grads, updates))
  if health_lib.skipped_steps(opt_state) is not None:  # train.on_instability=skip
    metrics["train_skipped"] = (health_lib.skipped_steps(opt_state) -
                                health_lib.skipped_steps(state.opt_state)).astype(jnp.float32)
  return state.replace(step=state.step + 1, params=params, opt_state=opt_state), metrics


def activation_step(params, batch: dict, step, *, setup: state_lib.Setup, seed: int,
                    dropout_rng: str = run_lib.TrainConfig.dropout_rng):
  """The statistics the model sows (health/...: residual RMS, largest attention and output
  logits) in the forward pass `train_step` takes at `step` from `params`: the same batch and
  dropout masks, so the same values. Forward only, at log steps (lnjax/core/health_hooks.py):
  a program about a third of the train step's to compile, one forward pass a log period to
  run, where sowing inside the train step needed a second train-step program."""
  _, sown = setup.model.apply({"params": params}, *setup.task.model_inputs(batch),
                              deterministic=False, rngs={"dropout": _dropout_key(
                                  seed, dropout_rng, step)}, mutable=["intermediates"])
  return health_lib.sown_statistics(sown["intermediates"], setup.model.cfg)


def _dropout_key(seed: int, dropout_rng: str, step):
  """Dropout's key at `step`: a function of (seed, step), so a resumed run draws the same
  masks as an uninterrupted one."""
  return jax.random.fold_in(jax.random.key(seed, impl=dropout_rng), step)


def eval_step(params, batch: dict, *, setup: state_lib.Setup):
  """Summed NLL (nats) and target count of one held-out batch."""
  outputs = setup.model.apply({"params": params}, *setup.task.model_inputs(batch),
                              deterministic=True)
  _, nll_sum, count = setup.task.loss(outputs, batch, 0.0)
  return nll_sum, count
