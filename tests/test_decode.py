"""Encoder-decoder masks and final norms; greedy and beam search."""

import itertools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lnjax import decode
from lnjax.models import EncoderDecoder, ModelConfig

BOS, EOS = 2, 3


def _model(vocab=12, pos="pre", seed=0, **kw):
  cfg = ModelConfig(vocab_size=vocab, num_layers=2, d_model=16, num_heads=2, d_ff=32,
                    max_len=16, dropout_rate=0.0, norm_position=pos, **kw)
  model = EncoderDecoder(cfg)
  src = jnp.array([[5, 4, 5, EOS, 0, 0], [4, 4, EOS, 0, 0, 0]])
  params = nn.unbox(model.init(jax.random.key(seed), src, jnp.ones((2, 4), jnp.int32))["params"])
  return model, params, src


def test_decoder_is_causal_and_source_padding_is_masked():
  model, params, src = _model()
  tgt = jnp.array([[BOS, 5, 6, 7], [BOS, 8, 9, 10]])
  logits = model.apply({"params": params}, src, tgt)
  changed = model.apply({"params": params}, src, tgt.at[:, 2].set(11))
  np.testing.assert_allclose(logits[:, :2], changed[:, :2], atol=1e-6)
  # Whatever sits in the padded source positions is invisible.
  noisy_src = jnp.where(src == 0, 0, src)
  other = model.apply({"params": params}, noisy_src.at[0, 5].set(0), tgt)
  np.testing.assert_allclose(logits, other, atol=1e-6)
  enc = model.apply({"params": params}, src, method=EncoderDecoder.encode)
  enc2 = model.apply({"params": params}, src.at[1, 4].set(0), method=EncoderDecoder.encode)
  np.testing.assert_allclose(enc[1, :3], enc2[1, :3], atol=1e-6)


@pytest.mark.parametrize("pos, has_final", [("pre", True), ("post", False)])
def test_pre_ln_stacks_end_in_a_final_norm(pos, has_final):
  _, params, _ = _model(pos=pos)
  assert ("final_norm" in params["encoder"]) == has_final
  assert ("final_norm" in params["decoder"]) == has_final


def test_per_stack_override():
  _, params, _ = _model(pos="pre", decoder_norm_position="post")
  assert "final_norm" in params["encoder"] and "final_norm" not in params["decoder"]


def test_cached_decoding_equals_teacher_forcing():
  model, params, src = _model()
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


def _score(log_probs, ids, alpha):
  """Summed log-prob of `ids` after BOS, by teacher forcing, divided by len^α."""
  logp = np.asarray(log_probs(jnp.array([[BOS] + list(ids[:-1])])))
  return sum(float(logp[t, tok]) for t, tok in enumerate(ids)) / len(ids) ** alpha


@pytest.mark.parametrize("alpha", [0.0, 1.0])
def test_beam_finds_the_best_sequence_when_all_can_be_enumerated(alpha):
  """Vocabulary of 6, at most 3 tokens: every hypothesis (ending in EOS, or unfinished at
  the limit) is scored by teacher forcing; a beam wide enough to hold them all returns
  the best one and its score."""
  model, params, src = _model(vocab=6, seed=3)
  src1, max_len = src[:1], 3
  hyps = [(*body, EOS) for n in range(max_len) for body in
          itertools.product([0, 1, 2, 4, 5], repeat=n)]
  hyps += list(itertools.product([0, 1, 2, 4, 5], repeat=max_len))
  log_probs = jax.jit(  # One compile per target length, not an eager pass per hypothesis.
      lambda tgt_in: jax.nn.log_softmax(model.apply({"params": params}, src1, tgt_in)[0], -1))
  scores = {h: _score(log_probs, h, alpha) for h in hyps}
  best = max(scores, key=scores.get)
  tokens, score = decode.beam_search(model, params, src1, beam_size=64, max_len=max_len,
                                     bos_id=BOS, eos_id=EOS, length_penalty=alpha)
  row = np.asarray(tokens[0]).tolist()
  got = tuple(row[: row.index(EOS) + 1] if EOS in row else row)
  assert got == best, (got, best, scores[best])
  assert float(score[0]) == pytest.approx(scores[best], rel=1e-4)
