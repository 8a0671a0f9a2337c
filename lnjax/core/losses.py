"""Losses of the training step: token cross-entropy with label smoothing.

`cross_entropy` is the one loss every task's step reduces to (the masked LM adds its
next-sentence term on top). Its gradient is written out as a custom VJP: softmax minus
the smoothed one-hot in one pass over the logits, where autodiff of the formula scatters
into a zero [N, V] array (equal to autodiff: tests/test_optim.py).
"""

import functools

import jax
import jax.numpy as jnp


def cross_entropy(logits_BxTxV, targets_BxT, weights_BxT, label_smoothing: float = 0.0):
  """(smoothed loss sum, NLL sum, weight sum) in nats; smoothing as Szegedy et al. 2016.

  The smoothed target puts 1 - ε on the label and ε/V on every class; the NLL (no
  smoothing) is what is reported as loss and perplexity. Per token, with
  lse = log Σ exp(logits): NLL = lse - logit[y], smoothed = lse - (1-ε)·logit[y] - ε·mean(logits).
  """
  v = logits_BxTxV.shape[-1]
  loss_N, nll_N = _token_losses(logits_BxTxV.astype(jnp.float32).reshape(-1, v),
                                targets_BxT.reshape(-1), float(label_smoothing))
  w_N = weights_BxT.reshape(-1).astype(jnp.float32)
  return (loss_N * w_N).sum(), (nll_N * w_N).sum(), weights_BxT.sum()


def token_cross_entropy(outputs, batch: dict, label_smoothing: float):
  """(smoothed loss sum, NLL sum, target count) of logits [B, T, V] against the batch's
  targets and weights: the loss of every task whose model returns one array of logits."""
  return cross_entropy(outputs, batch["targets"], batch["weights"], label_smoothing)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def _token_losses(logits_NxV, targets_N, eps: float):
  return _token_losses_fwd(logits_NxV, targets_N, eps)[0]


def _token_losses_fwd(logits_NxV, targets_N, eps):
  lse_N = jax.nn.logsumexp(logits_NxV, -1)
  target_N = jnp.take_along_axis(logits_NxV, targets_N[:, None], -1)[:, 0]
  nll_N = lse_N - target_N
  loss_N = nll_N if eps == 0 else lse_N - (1 - eps) * target_N - eps * logits_NxV.mean(-1)
  return (loss_N, nll_N), (logits_NxV, targets_N, lse_N)


def _token_losses_bwd(eps, residuals, g):
  """d/dlogits in one pass: softmax − smoothed one-hot (no scatter into a zero [N, V])."""
  logits_NxV, targets_N, lse_N = residuals
  g_loss_N, g_nll_N = g
  v = logits_NxV.shape[-1]
  onehot_NxV = (jnp.arange(v)[None, :] == targets_N[:, None]).astype(logits_NxV.dtype)
  p_NxV = jnp.exp(logits_NxV - lse_N[:, None])
  d_NxV = ((p_NxV - (1 - eps) * onehot_NxV - eps / v) * g_loss_N[:, None]
           + (p_NxV - onehot_NxV) * g_nll_N[:, None])
  return d_NxV, None


_token_losses.defvjp(_token_losses_fwd, _token_losses_bwd)
