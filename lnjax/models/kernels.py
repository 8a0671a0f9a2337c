"""Kernels tuned for speed, kept apart from the readable layers (lnjax/models/layers.py).

The layers call these through two model settings:
  model.weight_grad     autodiff | transposed    how a dense layer's x W is differentiated
  model.attention_impl  plain | reference | xla | cudnn
                        plain (the default): lnjax's attention with a hand-written
                        backward pass and, under a causal mask, no work on the masked
                        block, measured faster on CPUs (BENCHMARKS.md); reference: the
                        textbook softmax(q kᵀ + bias) v differentiated by autodiff
                        (also what plain runs under an attention-logit soft-cap);
                        xla / cudnn: jax.nn.dot_product_attention (cudnn: flash
                        attention on NVIDIA GPUs, bfloat16 only)
Each kernel equals the textbook formula (tests/test_models.py, tests/test_weight_grad.py).
"""

import jax
import jax.numpy as jnp

ATTENTION_IMPLS = ("plain", "reference", "xla", "cudnn")


@jax.custom_vjp
def matmul_transposed_grad(x_MxI, w_IxO):
  """x W, whose backward pass forms both gradients as plain row-major matmuls of
  materialized transposes: dx = dY (Wᵀ), dW = (xᵀ) dY. Autodiff's dW contracts x and dY
  over their leading (token) axis, which XLA:CPU ran at 160-316 GFLOP/s against 279-389
  for the materialized form on a 2-core AMD EPYC (jax 0.10.2, 2026-11-29; benchmarks/prototypes.py dense_vjp); on
  an Intel Xeon the whole LM step was 7% slower (BENCHMARKS.md). Hence an option
  (`model.weight_grad`), not the default.
  """
  return x_MxI @ w_IxO


def _matmul_transposed_grad_fwd(x_MxI, w_IxO):
  return x_MxI @ w_IxO, (x_MxI, w_IxO)


def _matmul_transposed_grad_bwd(residuals, dy_MxO):
  x_MxI, w_IxO = residuals
  # The barrier keeps XLA from folding each transpose back into its dot's dimension
  # numbers, which would give autodiff's contraction again.
  xt_IxM, wt_OxI = jax.lax.optimization_barrier((x_MxI.T, w_IxO.T))
  return dy_MxO @ wt_OxI, xt_IxM @ dy_MxO


matmul_transposed_grad.defvjp(_matmul_transposed_grad_fwd, _matmul_transposed_grad_bwd)



def softcap(logits, cap: float):
  """c·tanh(logits / c): logits bounded by ±c, the identity near 0 (Gemma 2, arXiv
  2408.00118, §2: attention c = 50, final c = 30); `cap` 0 = unchanged."""
  if not cap:
    return logits
  return cap * jnp.tanh(logits / cap)


def attention_probs(q_BxHxTxK, k_BxHxSxK, bias_BxHxTxS, logit_softcap: float = 0.0):
  """softmax(softcap(q kᵀ) + bias) in float32 statistics, in q's dtype."""
  logits_BxHxTxS = jnp.einsum("bhtk,bhsk->bhts", q_BxHxTxK, k_BxHxSxK)
  logits_BxHxTxS = softcap(logits_BxHxTxS.astype(jnp.float32), logit_softcap) + bias_BxHxTxS
  return jax.nn.softmax(logits_BxHxTxS, axis=-1).astype(q_BxHxTxK.dtype)


@jax.custom_vjp
def attention_core(q_BxHxTxK, k_BxHxSxK, v_BxHxSxK, bias_BxHxTxS):
  """P v with P = softmax(q kᵀ + bias): q already scaled by 1/√d_h, bias a constant mask.

  The custom VJP is the textbook softmax-attention backward, written so that dK and dV
  come out of plain matmuls as their transposes (dKᵀ = qᵀ dS, dVᵀ = dOᵀ P): on the CPU
  autodiff's own contraction order for them ran at half the matmul rate, and this saves
  ~9% of the LM train step and ~130 MiB of scratch (benchmarks/prototypes.py, `attn`).
  """
  return jnp.einsum("bhts,bhsk->bhtk", attention_probs(q_BxHxTxK, k_BxHxSxK, bias_BxHxTxS),
                    v_BxHxSxK)


def _attention_core_fwd(q, k, v, bias):
  p = attention_probs(q, k, bias)
  return jnp.einsum("bhts,bhsk->bhtk", p, v), (q, k, v, p, bias)


def _attention_core_bwd(residuals, do_BxHxTxK):
  q, k, v, p_BxHxTxS, bias = residuals
  dp_BxHxTxS = jnp.einsum("bhtk,bhsk->bhts", do_BxHxTxK, v)
  dv_BxHxKxS = jnp.einsum("bhtk,bhts->bhks", do_BxHxTxK, p_BxHxTxS)  # dVᵀ = dOᵀ P
  # Softmax backward: dS = P ⊙ (dP − rowsum(dP ⊙ P)).
  ds_BxHxTxS = p_BxHxTxS * (dp_BxHxTxS - jnp.sum(dp_BxHxTxS * p_BxHxTxS, -1, keepdims=True))
  dq = jnp.einsum("bhts,bhsk->bhtk", ds_BxHxTxS.astype(q.dtype), k)
  dk_BxHxKxS = jnp.einsum("bhtk,bhts->bhks", q, ds_BxHxTxS.astype(q.dtype))  # dKᵀ = qᵀ dS
  return dq, dk_BxHxKxS.swapaxes(-1, -2), dv_BxHxKxS.swapaxes(-1, -2), jnp.zeros_like(bias)


attention_core.defvjp(_attention_core_fwd, _attention_core_bwd)


def causal_attention(q_BxHxTxK, k_BxHxTxK, v_BxHxTxK, bias_BxHxTxT, min_len: int = 64):
  """`attention_core` under a causal bias, without the masked upper-right block: queries
  [0, T/2) attend to keys [0, T/2) only, queries [T/2, T) to all keys. Exact (those
  logits are masked anyway), a quarter fewer attention FLOPs, ~20% less time (two halves
  beat more, smaller pieces on the CPU)."""
  t = q_BxHxTxK.shape[2]
  if t % 2 or t < min_len or k_BxHxTxK.shape[2] != t:
    return attention_core(q_BxHxTxK, k_BxHxTxK, v_BxHxTxK, bias_BxHxTxT)
  h = t // 2
  first = attention_core(q_BxHxTxK[:, :, :h], k_BxHxTxK[:, :, :h], v_BxHxTxK[:, :, :h],
                         bias_BxHxTxT[..., :h, :h])
  second = attention_core(q_BxHxTxK[:, :, h:], k_BxHxTxK, v_BxHxTxK, bias_BxHxTxT[..., h:, :])
  return jnp.concatenate([first, second], axis=2)


def attention(q_BxHxTxK, k_BxHxSxK, v_BxHxSxK, bias_BxHxTxS, *, impl: str, causal: bool,
              logit_softcap: float = 0.0):
  """softmax(softcap(q kᵀ) + bias) v (q already scaled), by the kernel `impl`. A soft-cap
  (> 0) runs the reference kernel under plain too (autodiff through the tanh; plain's
  hand-written backward pass has none); xla and cudnn have none (ModelConfig refuses it)."""
  if logit_softcap:
    if impl in ("xla", "cudnn"):
      raise ValueError(f"attention_impl={impl!r} has no attention-logit soft-cap")
    return jnp.einsum("bhts,bhsk->bhtk", attention_probs(q_BxHxTxK, k_BxHxSxK, bias_BxHxTxS,
                                                         logit_softcap), v_BxHxSxK)
  if impl in ("xla", "cudnn"):
    t, s = q_BxHxTxK.shape[2], k_BxHxSxK.shape[2]
    # [B, T, H, d_h] in and out; the bias broadcast to [B|1, 1, T, S], cuDNN's shapes.
    bias_BxHxTxS = jnp.broadcast_to(bias_BxHxTxS, (bias_BxHxTxS.shape[0], 1, t, s))
    out_BxTxHxK = jax.nn.dot_product_attention(
        q_BxHxTxK.swapaxes(1, 2), k_BxHxSxK.swapaxes(1, 2), v_BxHxSxK.swapaxes(1, 2),
        bias_BxHxTxS.astype(q_BxHxTxK.dtype), scale=1.0, is_causal=causal,
        implementation=impl)
    return out_BxTxHxK.swapaxes(1, 2)
  if impl == "reference":
    return jnp.einsum("bhts,bhsk->bhtk", attention_probs(q_BxHxTxK, k_BxHxSxK, bias_BxHxTxS),
                      v_BxHxSxK)
  if causal:
    return causal_attention(q_BxHxTxK, k_BxHxSxK, v_BxHxSxK, bias_BxHxTxS)
  return attention_core(q_BxHxTxK, k_BxHxSxK, v_BxHxSxK, bias_BxHxTxS)
