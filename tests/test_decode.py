"""Encoder-decoder masks and final norms; greedy and beam search."""

import functools
import itertools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lnjax.inference import decode
from lnjax.models import EncoderDecoder, ModelConfig

from conftest import fast_tier

BOS, EOS = 2, 3


@functools.cache  # Shared by the tests that ask alike (arrays are immutable).
def _model(vocab=12, pos="pre", seed=0, jit_init=False, **kw):
  """jit_init: init as one program, for a block whose operations no other test's model has
  (eagerly, each is compiled on its own; the plain models' are shared across tests, and
  eager init is the cheaper for them)."""
  cfg = ModelConfig(**{**dict(vocab_size=vocab, num_layers=2, d_model=16, num_heads=2, d_ff=32,
                              max_len=16, dropout_rate=0.0, norm_position=pos), **kw})
  model = EncoderDecoder(cfg)
  src = jnp.array([[5, 4, 5, EOS, 0, 0], [4, 4, EOS, 0, 0, 0]])
  init = jax.jit(model.init) if jit_init else model.init
  params = nn.unbox(init(jax.random.key(seed), src, jnp.ones((2, 4), jnp.int32))["params"])
  return model, params, src


def test_decoder_is_causal():
  model, params, src = _model()
  tgt = jnp.array([[BOS, 5, 6, 7], [BOS, 8, 9, 10]])
  logits = model.apply({"params": params}, src, tgt)
  changed = model.apply({"params": params}, src, tgt.at[:, 2].set(11))
  np.testing.assert_allclose(logits[:, :2], changed[:, :2], atol=1e-6)
  assert np.abs(np.asarray(logits[:, 2:] - changed[:, 2:])).max() > 1e-4


def _loss(model, params, src, tgt):
  """Summed NLL of tgt[:, 1:] given tgt[:, :-1] (teacher forcing)."""
  logits = model.apply({"params": params}, src, tgt[:, :-1])
  logp = jax.nn.log_softmax(logits, -1)
  return -jnp.take_along_axis(logp, tgt[:, 1:, None], -1).sum()


@pytest.mark.slow  # (Fast tier: causality, cached decoding, beam one is greedy.)
def test_padded_source_encodes_and_scores_as_the_sentence_alone():
  """Row 1 of the batch, [4, 4, EOS] padded with three 0s, encodes and scores a target
  exactly as the sentence alone, unpadded: padding is masked in the encoder's
  self-attention and in the decoder's cross-attention."""
  model, params, src = _model()
  alone = src[1:, :3]
  assert alone.tolist() == [[4, 4, EOS]] and src[1, 3:].tolist() == [0, 0, 0]
  # Encoding and scoring as one program per shape: eagerly, each operation was compiled at
  # both (the test's CPU 2.7 -> 1.1 s, 2026-12-07, 2-core machine).
  run = jax.jit(lambda p, s, t: (model.apply({"params": p}, s, method=EncoderDecoder.encode),
                                 model.apply({"params": p}, s, t)))
  tgt = jnp.array([[BOS, 5, 6, 7, EOS]])
  padded_encoded, padded_logits = run(params, src, jnp.tile(tgt, (2, 1)))
  encoded, logits = run(params, alone, tgt)
  np.testing.assert_allclose(padded_encoded[1, :3], encoded[0], atol=1e-5)
  np.testing.assert_allclose(padded_logits[1], logits[0], atol=1e-5)


@pytest.mark.slow
def test_padded_source_trains_and_decodes_as_the_sentence_alone():
  """The same sentence, padded and alone: the loss's gradient (training), greedy decoding
  and beam search (tokens and score) are the same."""
  model, params, src = _model()
  alone = src[1:, :3]
  tgt = jnp.array([[BOS, 5, 6, 7, EOS]])
  grad = jax.jit(jax.grad(lambda p, s: _loss(model, p, s, tgt)))
  pad_grads, grads = grad(params, src[1:]), grad(params, alone)
  for a, b in zip(jax.tree.leaves(pad_grads), jax.tree.leaves(grads)):
    np.testing.assert_allclose(a, b, atol=2e-5)
  kw = dict(max_len=6, bos_id=BOS, eos_id=EOS)
  assert (decode.strip(decode.greedy(model, params, src, **kw), EOS)[1]
          == decode.strip(decode.greedy(model, params, alone, **kw), EOS)[0])
  padded_tokens, padded_score = decode.beam_search(model, params, src, beam_size=3, **kw)
  tokens, score = decode.beam_search(model, params, alone, beam_size=3, **kw)
  np.testing.assert_array_equal(padded_tokens[1], tokens[0])
  assert float(padded_score[1]) == pytest.approx(float(score[0]), abs=1e-5)


@pytest.mark.parametrize("pos, has_final", [("pre", True), ("post", False)])
def test_pre_ln_stacks_end_in_a_final_norm(pos, has_final):
  _, params, _ = _model(pos=pos)
  assert ("final_norm" in params["encoder"]) == has_final
  assert ("final_norm" in params["decoder"]) == has_final


def test_per_stack_override():
  _, params, _ = _model(pos="pre", decoder_norm_position="post")
  assert "final_norm" in params["encoder"] and "final_norm" not in params["decoder"]


@pytest.mark.parametrize("pos_emb", fast_tier(["learned", "sinusoidal"], ("learned",)))
def test_cached_decoding_equals_teacher_forcing(pos_emb):
  """Each decode step adds the position at its offset, as the full forward pass does."""
  model, params, src = _model(pos_emb=pos_emb)
  assert ("positions" in params["embed"]) == (pos_emb == "learned")
  tokens = decode.greedy(model, params, src, max_len=6, bos_id=BOS, eos_id=EOS)
  tgt_in = jnp.concatenate([jnp.full((2, 1), BOS), tokens[:, :-1]], axis=1)
  logits = model.apply({"params": params}, src, tgt_in)
  greedy_again = jnp.argmax(logits, -1)
  for row, ids in enumerate(decode.strip(tokens, EOS)):
    n = len(ids)
    np.testing.assert_array_equal(greedy_again[row, :n], np.asarray(ids))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_beam_one_is_greedy(seed):
  model, params, src = _model(seed=seed)
  g = decode.greedy(model, params, src, max_len=8, bos_id=BOS, eos_id=EOS)
  b, _ = decode.beam_search(model, params, src, beam_size=1, max_len=8, bos_id=BOS,
                            eos_id=EOS)
  assert decode.strip(g, EOS) == decode.strip(b, EOS)


@functools.cache
def _enumerated_log_probs(max_len=3):
  """{hypothesis: summed log-prob of its tokens after BOS, by teacher forcing} for every
  hypothesis of _model(vocab=6, seed=3) on its first source sentence: ending in EOS, or
  unfinished at `max_len`. Computed once for both length penalties, one batch per length
  (the two tests' CPU 2.5 -> 2.2 s, 2026-12-07, 2-core machine)."""
  model, params, src = _model(vocab=6, seed=3)
  hyps = [(*body, EOS) for n in range(max_len) for body in
          itertools.product([0, 1, 2, 4, 5], repeat=n)]
  hyps += list(itertools.product([0, 1, 2, 4, 5], repeat=max_len))
  log_probs = jax.jit(  # One compile per target length, not an eager pass per hypothesis.
      lambda tgt_in: jax.nn.log_softmax(model.apply(
          {"params": params}, jnp.repeat(src[:1], len(tgt_in), 0), tgt_in), -1))
  out = {}
  for n in range(1, max_len + 1):
    group = [h for h in hyps if len(h) == n]
    logp = np.asarray(log_probs(jnp.array([[BOS, *h[:-1]] for h in group])))
    for h, row in zip(group, logp):
      out[h] = sum(float(row[t, tok]) for t, tok in enumerate(h))
  return out


@pytest.mark.parametrize("alpha", fast_tier([0.0, 1.0], ()))
def test_beam_finds_the_best_sequence_when_all_can_be_enumerated(alpha):
  """Vocabulary of 6, at most 3 tokens: every hypothesis (ending in EOS, or unfinished at
  the limit) is scored by teacher forcing; a beam wide enough to hold them all returns
  the best one and its score."""
  model, params, src = _model(vocab=6, seed=3)
  src1, max_len = src[:1], 3
  scores = {h: logp / len(h) ** alpha for h, logp in _enumerated_log_probs(max_len).items()}
  best = max(scores, key=scores.get)
  tokens, score = decode.beam_search(model, params, src1, beam_size=64, max_len=max_len,
                                     bos_id=BOS, eos_id=EOS, length_penalty=alpha)
  row = np.asarray(tokens[0]).tolist()
  got = tuple(row[: row.index(EOS) + 1] if EOS in row else row)
  assert got == best, (got, best, scores[best])
  assert float(score[0]) == pytest.approx(scores[best], rel=1e-4)


@pytest.mark.slow
def test_batched_decoding_returns_each_hypothesis_in_the_input_order():
  """Sentences of unsorted lengths, decoded together (sorted by length inside, in batches
  of two) and each alone: the i-th hypothesis is the i-th sentence's. One padded length
  (8) for all, and a fixed hypothesis length (max_len), which a batch's padded source
  length would otherwise set."""
  from lnjax.core import sharding
  from lnjax.inference import evaluate

  model, params, _ = _model(vocab=24, seed=1)
  rng = np.random.default_rng(1)
  sources = [rng.integers(4, 24, n).astype(np.int32) for n in (7, 1, 4, 6, 2, 5)]
  mesh = sharding.make_mesh(sharding.MeshConfig(data=1), jax.devices()[:1])
  decode_ids = functools.partial(evaluate.decode_ids, model, params, cfg=evaluate.DecodeConfig(
      beam_size=1), mesh=mesh, bos_id=BOS, eos_id=EOS, max_tokens=16, max_len=12)
  alone = [decode_ids([s])[0] for s in sources]
  assert len({tuple(h) for h in alone}) >= 4, alone  # Hypotheses that tell sentences apart.
  assert decode_ids(sources) == alone


# The modern block's options that touch the decoder's cache: rotary positions at the
# decode step's offset, K/V cached as G = 1 shared heads (MQA here, GQA 2 under scan) and a
# sliding window W = 2 over the cached keys in every other layer.
MODERN = dict(pos_emb="rope", num_heads=4, num_kv_heads=1, gated_ffn=True, activation="silu",
              sliding_window=2, attention_pattern="local,global", norm_kind="rmsnorm",
              use_bias=False, attn_logit_softcap=5.0, final_logit_softcap=10.0)


@pytest.mark.parametrize("scan", fast_tier([False, True], ()))
def test_cached_decoding_of_the_modern_block_equals_the_full_forward_pass(scan):
  """Each step's logits, decoded one position at a time against the cache, equal the
  teacher-forced forward pass's at that position (rope + MQA/GQA + sliding window +
  soft-caps); the cache holds the G key/value heads, not H."""
  options = dict(MODERN, scan_layers=scan, num_kv_heads=2 if scan else 1)
  # (Jitted init and forward pass: the block's operations are its own; the two tests' CPU
  # 6.6 -> 4.7 s, 2026-12-07, 2-core machine.)
  model, params, src = _model(**options, jit_init=True)
  assert "positions" not in params["embed"]
  tgt_in = jnp.array([[BOS, 5, 6, 7, 8, 9], [BOS, 8, 9, 10, 4, 4]])
  full_BxTxV, encoded = jax.jit(lambda p: (  # (One program for both.)
      model.apply({"params": p}, src, tgt_in),
      model.apply({"params": p}, src, method=EncoderDecoder.encode)))(params)
  cache = decode._empty_cache(model, params, encoded, src, tgt_in.shape[1])
  key_shapes = [x.shape for path, x in jax.tree_util.tree_flatten_with_path(cache)[0]
                if path[-1].key == "cached_key"]
  assert key_shapes and all(s[-3:] == (options["num_kv_heads"], 6, 4) for s in key_shapes)
  step = jax.jit(lambda cache, tokens_Bx1: model.apply(
      {"params": params, "cache": cache}, encoded, src, tokens_Bx1, decode=True,
      method=EncoderDecoder.decode, mutable=["cache"]))
  for t in range(tgt_in.shape[1]):
    step_Bx1xV, updated = step(cache, tgt_in[:, t:t + 1])
    cache = updated["cache"]
    np.testing.assert_allclose(step_Bx1xV[:, 0], full_BxTxV[:, t], atol=1e-5)
