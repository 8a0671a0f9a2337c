"""Greedy and beam search for the encoder-decoder, jitted, with cached decoder keys/values.

Both run the decoder one position per step against its 'cache' collection
(lnjax/models/layers.py, Attention._cached). Beam search follows fairseq's rules, so
that beam size 1 is exactly greedy decoding:
  - each step ranks the 2K best continuations of the K live hypotheses by summed log-prob;
  - an EOS among the top K is a finished hypothesis, scored logp / length^α (α = the
    length penalty; length counts the EOS);
  - the K best non-EOS continuations stay live;
  - a sentence is done once K hypotheses have finished; at the length limit the live
    hypotheses are finished as they are.
Token ids: 0 padding, `bos_id` starts every target, `eos_id` ends it.
"""

import functools

import jax
import jax.numpy as jnp

from lnjax.models import EncoderDecoder, placement

NEG = -1e9


def _empty_cache(model: EncoderDecoder, params, encoded_NxSxD, src_NxS, max_len: int):
  """Zeros of the cache a decode pass of `max_len` positions needs (no compute)."""
  tgt_NxT = jnp.zeros((src_NxS.shape[0], max_len), jnp.int32)
  shapes = jax.eval_shape(lambda: model.apply(
      {"params": params}, encoded_NxSxD, src_NxS, tgt_NxT, decode=True,
      method=EncoderDecoder.decode, mutable=["cache"])[1]["cache"])
  return jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)


def _reorder_rows(model: EncoderDecoder, cache, rows_N):
  """The cache's hypothesis rows in the order `rows_N`: axis 0 of each key/value leaf
  ([N, H, S, d_h]), axis 1 under a scanned run of layers (model.scan_layers:
  [L, N, H, S, d_h]); positions and indices (no N axis) as they are."""
  runs = set()
  if model.cfg.scan_layers:
    runs = {name for name, _, _ in placement.layer_runs(model.cfg.stack("decoder"))}

  def take(path, x):
    axis = 1 if any(getattr(key, "key", None) in runs for key in path) else 0
    return jnp.take(x, rows_N, axis=axis) if x.ndim > axis and x.shape[axis] == len(rows_N) else x

  return jax.tree_util.tree_map_with_path(take, cache)


def _step_logprobs(model, params, cache, encoded, src, tokens_Nx1):
  logits_Nx1xV, updated = model.apply(
      {"params": params, "cache": cache}, encoded, src, tokens_Nx1, decode=True,
      method=EncoderDecoder.decode, mutable=["cache"])
  return jax.nn.log_softmax(logits_Nx1xV[:, 0].astype(jnp.float32)), updated["cache"]


@functools.partial(jax.jit, static_argnames=("model", "max_len", "bos_id", "eos_id"))
def greedy(model: EncoderDecoder, params, src_BxS, *, max_len: int, bos_id: int, eos_id: int):
  """Argmax decoding: [B, max_len] token ids (after BOS), EOS then padding at the end."""
  b = src_BxS.shape[0]
  encoded = model.apply({"params": params}, src_BxS, method=EncoderDecoder.encode)
  cache = _empty_cache(model, params, encoded, src_BxS, max_len)

  def body(carry, _):
    cache, last_Bx1, done_B = carry
    logp_BxV, cache = _step_logprobs(model, params, cache, encoded, src_BxS, last_Bx1)
    token_B = jnp.where(done_B, 0, jnp.argmax(logp_BxV, -1).astype(jnp.int32))
    return (cache, token_B[:, None], done_B | (token_B == eos_id)), token_B

  init = (cache, jnp.full((b, 1), bos_id, jnp.int32), jnp.zeros((b,), bool))
  _, tokens_TxB = jax.lax.scan(body, init, None, length=max_len)
  return tokens_TxB.T


@functools.partial(jax.jit,
                   static_argnames=("model", "beam_size", "max_len", "bos_id", "eos_id"))
def beam_search(model: EncoderDecoder, params, src_BxS, *, beam_size: int, max_len: int,
                bos_id: int, eos_id: int, length_penalty: float = 1.0):
  """Returns (tokens [B, max_len], score [B]) of the best finished hypothesis per sentence."""
  b, k = src_BxS.shape[0], beam_size
  encoded = model.apply({"params": params}, src_BxS, method=EncoderDecoder.encode)
  # Every sentence's encoding repeated for its K beams: row n = sentence n // K.
  src_NxS = jnp.repeat(src_BxS, k, axis=0)
  encoded_NxSxD = jnp.repeat(encoded, k, axis=0)
  cache = _empty_cache(model, params, encoded_NxSxD, src_NxS, max_len)

  def norm(logp, length):
    return logp / (length.astype(jnp.float32) ** length_penalty)

  # Live hypotheses: all K start as BOS, but only beam 0 counts (else K copies of one).
  alive_seqs_BxKxT = jnp.zeros((b, k, max_len), jnp.int32)
  alive_logp_BxK = jnp.tile(jnp.array([0.0] + [NEG] * (k - 1)), (b, 1))
  fin_seqs_BxKxT = jnp.zeros((b, k, max_len), jnp.int32)
  fin_score_BxK = jnp.full((b, k), NEG)
  fin_count_B = jnp.zeros((b,), jnp.int32)

  def cond(state):
    i, _, _, _, _, _, fin_count_B, _ = state
    return (i < max_len) & jnp.any(fin_count_B < k)

  def body(state):
    i, cache, alive_seqs, alive_logp, fin_seqs, fin_score, fin_count, last_N = state
    logp_NxV, cache = _step_logprobs(model, params, cache, encoded_NxSxD, src_NxS,
                                     last_N[:, None])
    v = logp_NxV.shape[-1]
    cand_BxKV = (alive_logp[:, :, None] + logp_NxV.reshape(b, k, v)).reshape(b, k * v)
    top_logp_Bx2K, top_idx_Bx2K = jax.lax.top_k(cand_BxKV, 2 * k)
    beam_Bx2K, token_Bx2K = top_idx_Bx2K // v, (top_idx_Bx2K % v).astype(jnp.int32)
    seqs_Bx2KxT = jnp.take_along_axis(alive_seqs, beam_Bx2K[:, :, None], axis=1)
    seqs_Bx2KxT = seqs_Bx2KxT.at[:, :, i].set(token_Bx2K)
    is_eos_Bx2K = token_Bx2K == eos_id
    live_Bx2K = top_logp_Bx2K > NEG / 2

    # Finished now: EOS among the top K candidates (fairseq), or anything at the limit.
    at_limit = i == max_len - 1
    ranks_2K = jnp.arange(2 * k)
    finishing = live_Bx2K & ((is_eos_Bx2K & (ranks_2K < k)) | (at_limit & ~is_eos_Bx2K
                                                                  & (ranks_2K < k)))
    finishing &= (fin_count < k)[:, None]  # A done sentence takes no more.
    new_score = jnp.where(finishing, norm(top_logp_Bx2K, jnp.asarray(i + 1)), NEG)
    all_score = jnp.concatenate([fin_score, new_score], axis=1)
    all_seqs = jnp.concatenate([fin_seqs, seqs_Bx2KxT], axis=1)
    fin_score, keep_BxK = jax.lax.top_k(all_score, k)
    fin_seqs = jnp.take_along_axis(all_seqs, keep_BxK[:, :, None], axis=1)
    fin_count = fin_count + finishing.sum(-1)

    # Still live: the K best non-EOS continuations.
    alive_rank_Bx2K = jnp.where(is_eos_Bx2K, NEG, top_logp_Bx2K)
    alive_logp, pick_BxK = jax.lax.top_k(alive_rank_Bx2K, k)
    alive_seqs = jnp.take_along_axis(seqs_Bx2KxT, pick_BxK[:, :, None], axis=1)
    # Reorder the cache rows to follow their hypotheses.
    src_beam_BxK = jnp.take_along_axis(beam_Bx2K, pick_BxK, axis=1)
    rows_N = (jnp.arange(b)[:, None] * k + src_beam_BxK).reshape(-1)
    cache = _reorder_rows(model, cache, rows_N)
    last_N = jnp.take_along_axis(token_Bx2K, pick_BxK, axis=1).reshape(-1)
    return i + 1, cache, alive_seqs, alive_logp, fin_seqs, fin_score, fin_count, last_N

  state = (jnp.asarray(0), cache, alive_seqs_BxKxT, alive_logp_BxK, fin_seqs_BxKxT,
           fin_score_BxK, fin_count_B, jnp.full((b * k,), bos_id, jnp.int32))
  state = jax.lax.while_loop(cond, body, state)
  fin_seqs, fin_score = state[4], state[5]
  return fin_seqs[:, 0], fin_score[:, 0]


def strip(tokens, eos_id: int) -> list[list[int]]:
  """Token rows -> id lists cut before the first EOS (or padding)."""
  out = []
  for row in jax.device_get(tokens).tolist():
    ids = []
    for t in row:
      if t == eos_id or t == 0:
        break
      ids.append(t)
    out.append(ids)
  return out
