"""What the paper measures on a real model (Xiong et al. 2020, §3.3 and Fig. 3).

Given a Setup, parameters and a few real batches:
  gradient_norms   ‖∂L/∂W‖_F of every weight (per layer and sub-layer; encoder and decoder
                   separately), L the mean per-token NLL over the batches
  norm_inputs      ‖x‖²/d of every norm's input and output (the main path before and after
                   each norm), averaged over real tokens
  ln_jacobians     ‖J_norm(x)‖₂ of every norm at its actual input (power iteration), beside
                   √d/‖x − μ‖ (the paper's approximation for LayerNorm; μ = 0 for
                   RMSNorm and ScaleNorm, which do not centre)
  gradient_and_update_norms
                   the gradient norms and ‖Δw‖/‖w‖ of one optimizer step at a given
                   learning rate, per weight, and the loss, from one compiled program
"""

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax

from lnjax.core import metrics, optim
from lnjax.analysis.jacobian import spectral_norm
from lnjax.models import norms


def mean_loss(params, setup, batches):
  """Mean per-token NLL (nats) over `batches`, deterministic (no dropout): the task's own
  loss (token cross-entropy; for BERT the masked-LM NLL), without label smoothing."""
  total, count = 0.0, 0.0
  for batch in batches:
    outputs = setup.model.apply({"params": params}, *setup.task.model_inputs(batch),
                                deterministic=True)
    _, nll_sum, n = setup.task.loss(outputs, batch, 0.0)
    total, count = total + nll_sum, count + n
  return total / count


def gradient_and_update_norms(setup, params, batches, opt_cfg, learning_rate: float):
  """({weight: ‖∂L/∂W‖_F} as gradient_norms gives them, {weight: ‖Δw‖/‖w‖} of the run's
  optimizer's first step from a fresh state at a constant `learning_rate`, mean_loss),
  from one compiled function whose outputs are scalars: the gradient and update trees
  are never returned to the host (XLA may free a weight's gradient once its norms are
  taken), and the loss comes from the same forward pass."""
  tx = first_step(opt_cfg, learning_rate)

  def norms(p):
    loss, g = jax.value_and_grad(mean_loss)(p, setup, batches)
    updates, _ = tx.update(g, tx.init(p), p)
    return [metrics.per_weight_norms(tree, "u") for tree in (g, updates, p)] + [loss]

  g, u, w, loss = jax.jit(norms)(params)
  strip = lambda k: k.split("/", 1)[1]
  return ({strip(k): float(v) for k, v in g.items()},
          {strip(k): float(u[k]) / max(float(w[k]), 1e-30) for k in u}, float(loss))


def first_step(opt_cfg, learning_rate: float):
  """The run's optimizer at a constant `learning_rate`, no warm-up or decay."""
  cfg = dataclasses.replace(opt_cfg, learning_rate=learning_rate, schedule="constant",
                            warmup_steps=0, decay_steps=(), decay_epochs=())
  return optim.make_optimizer(cfg, optax.constant_schedule(learning_rate))


def gradient_norms(grads) -> dict:
  """{'layer_3/ffn/wo/kernel': ‖g‖_F, ...} for every leaf."""
  return {k.split("/", 1)[1]: float(v) for k, v in metrics.per_weight_norms(grads, "g").items()}


def norm_inputs(setup, params, batch, *, num_tokens: int = 8):
  """Every norm's input and output on `batch`, by intercepting the norm modules' calls in
  one compiled forward pass.

  Returns {module path: {'in_sq': ‖x‖²/d, 'out_sq': ‖y‖²/d (means over real tokens),
  'tokens': [num_tokens, d] input vectors, 'fn': the norm as a function of one vector}}.
  """
  modules = {}  # Path -> the norm module met while tracing (its fields: ε, dtype, ...).

  def forward(params, inputs):
    records = {}

    def interceptor(next_fun, args, kwargs, context):
      out = next_fun(*args, **kwargs)
      module = context.module
      if context.method_name == "__call__" and isinstance(module, norms.MODULES):
        path = "/".join(module.path)
        modules[path] = module
        records[path] = (args[0], out)
      return out

    with nn.intercept_methods(interceptor):
      setup.model.apply({"params": params}, *inputs, deterministic=True)
    return records

  arrays = jax.jit(forward)(params, setup.task.model_inputs(batch))
  records = {path: (module, *arrays[path]) for path, module in modules.items()}  # Model order.
  return summarize_norms(records, params, batch, num_tokens=num_tokens)


def summarize_norms(records: dict, params, batch, *, num_tokens: int = 8) -> dict:
  """norm_inputs' result from {module path: (norm module, input x, output y)} on `batch`."""
  weights = np.asarray(batch["weights"])
  src_mask = np.asarray(batch["inputs"]) > 0  # Translation: source padding is id 0.
  result = {}
  for path, (module, x, y) in records.items():
    x, y = np.asarray(x, np.float32), np.asarray(y, np.float32)
    if x.ndim == 4:  # A QK-norm's per-head q or k, [B, H, T, d_h]: to [B, T, H, d_h].
      x, y = x.transpose(0, 2, 1, 3), y.transpose(0, 2, 1, 3)
    d = x.shape[-1]
    # Real tokens: the encoder's are the source's, everything else follows the targets.
    if path.startswith("encoder/"):
      mask = src_mask
    else:
      mask = weights > 0 if x.shape[:2] == weights.shape else np.ones(x.shape[:2], bool)
    xs, ys = x[mask].reshape(-1, d), y[mask].reshape(-1, d)
    scope_params = _params_at(params, path)
    unbound = module.clone(parent=None, name=None)  # (its eps, dtype, unit offset)
    fn = lambda v, m=unbound, p=scope_params: m.apply({"params": p}, v[None])[0]
    result[path] = {"in_sq": float(np.mean(np.sum(xs * xs, -1)) / d),
                    "out_sq": float(np.mean(np.sum(ys * ys, -1)) / d),
                    "tokens": xs[:num_tokens], "fn": fn, "d": d,
                    "module": unbound, "params": scope_params}
  return result


def _params_at(params, path: str):
  node = params
  for part in path.split("/"):
    if part not in node:  # A norm without parameters (nGPT's x/‖x‖).
      return {}
    node = node[part]
  return node


def ln_jacobians(norm_records: dict, *, iters: int = 30) -> dict:
  """{path: {'spectral_norm': mean over tokens, 'sqrt_d_over_norm': mean √d/‖x − μ‖}}
  (μ = 0 for RMSNorm and ScaleNorm; nGPT's x/‖x‖: 1/‖x‖), over the tokens with x ≠ μ
  (the reference's; None if no token has one).

  One compiled power iteration per kind of norm and width, vmapped over the tokens, with
  the norm's parameters as an argument: a 12-layer model's 30 norms compile once."""
  compiled = {}

  def batched(module):
    # The module's type and fields (ε, dtype, the (1 + w) gain, DyT's α₀) but its name.
    key = (type(module), *(getattr(module, f.name) for f in dataclasses.fields(module)
                           if f.name not in ("parent", "name")))
    if key not in compiled:
      one = lambda p, x: spectral_norm(lambda v: module.apply({"params": p}, v[None])[0], x,
                                       iters=iters)
      compiled[key] = jax.jit(jax.vmap(one, in_axes=(None, 0)))
    return compiled[key]

  out = {}
  for path, r in norm_records.items():
    xs = np.asarray(r["tokens"], np.float32)
    # The unit-gain norm's ‖J‖₂ as the norm's class states it (lnjax/models/norms.py):
    # d^radius_power/‖x − μ‖, μ the mean of x if it centres (LN's √d/‖x − μ‖, RMSNorm's
    # and ScaleNorm's √d/‖x‖, nGPT's 1/‖x‖; the point-wise norms state LN's). It is the
    # ε → 0 limit, undefined at x = μ: a zero input, as the stream of a token whose
    # embedding row is 0 is in a model without biases (transformers initializes the
    # pad_token_id row of Gemma's and OLMo 2's nn.Embedding to 0). Both means are over the
    # tokens where it is defined (the same tokens, side by side); None where none is.
    module = r["module"]
    sigmas = np.asarray(batched(module)(r["params"], jnp.asarray(xs)))
    mu = xs.mean(-1, keepdims=True) if module.centred else 0.0
    radii = np.linalg.norm(xs - mu, axis=-1)
    defined = radii > 0
    if not defined.any():
      out[path] = {"spectral_norm": float(np.mean(sigmas)), "sqrt_d_over_norm": None}
      continue
    approx = float(r["d"]) ** module.radius_power / radii[defined]
    out[path] = {"spectral_norm": float(np.mean(sigmas[defined])),
                 "sqrt_d_over_norm": float(np.mean(approx))}
  return out
