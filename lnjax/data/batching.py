"""Length buckets and token-budgeted batches of variable-length pairs (translation).

Length bucketing. A pair's length is max(len(source), len(target)) in
subword tokens with EOS. Lengths are rounded up to a bucket length from a
quarter-octave ladder (8, 10, 12, 14, 16, 20, 24, 28, 32, 40, 48, 56, 64, 80,
..., i.e. multiples of 2 below 16, of 4 below 32, of 8 below 64...), capped
at ``max_len`` for training, and both sides are padded to it. Fewer steps an
octave (``data.buckets_per_octave``: 2, or 1 for 8, 16, 32, 64, ...) mean
fewer shapes to compile and more padding: the smoke presets' choice. A batch of
bucket length L has ``rows(L) = floor(max_tokens / L)`` rounded down to a
multiple of ``batch_multiple`` (the number of data shards), so
``rows x L <= max_tokens`` on each side and jit compiles one shape per bucket
(about a dozen). Why not pad source and target to separate lengths: on
Multi30k that needs ~50-90 (S, T) shapes for a few percent less padding.

Each epoch: pairs are shuffled, stably sorted by bucket (random order within a
bucket), and cut greedily into batches, each as long as its last (longest)
bucket allows; the batch order is then shuffled. The leftover of a bucket thus
fills up the next bucket's first batch instead of becoming a half-empty batch,
so at most one batch per epoch (the last of the longest bucket) has empty
padding rows, and the number of batches per epoch (`steps_per_epoch`) is the
same in every epoch. A batch is a pure function of (seed, global step), which
makes the iterator exactly resumable from a step count (grain's state).

Evaluation batches use the same ladder and budget, sorted by length then by
position (deterministic); lengths above ``max_len`` are kept (never dropped or
truncated) and padded to the ladder beyond it, so eval batches may be longer
than any training batch.
"""

from __future__ import annotations

import dataclasses
import io
import pathlib
from typing import Sequence

import numpy as np

from lnjax.data.mt_tokenizer import EOS_ID, PAD_ID
from lnjax.data.tokenizers import _atomic_write_bytes

# Shortest bucket length: shorter pairs are padded to it.
MIN_BUCKET_LEN = 8
# Bucket lengths an octave, the ladder's resolution (the default: a quarter-octave ladder).
PER_OCTAVE = 4
PER_OCTAVE_CHOICES = (1, 2, 4, 8)  # (Divisors of MIN_BUCKET_LEN: every length an integer.)


# ---------------------------------------------------------------------------
# Length buckets.
# ---------------------------------------------------------------------------


def ladder_len(n: int, per_octave: int = PER_OCTAVE) -> int:
  """Smallest bucket length >= n on the ladder of `per_octave` steps an octave;
  the quarter-octave ladder (4): 8, 10, 12, 14, 16, 20, 24, 28, 32, 40, ...
  (steps of octave/4, so padding is <= ~25% and ~12% on average at any length);
  1: 8, 16, 32, 64, ... (padding <= ~50%)."""
  if n <= MIN_BUCKET_LEN:
    return MIN_BUCKET_LEN
  step = (1 << (int(n).bit_length() - 1)) // per_octave  # octave start / per_octave
  return -(-n // step) * step


def bucket_len(n: int, max_len: int, per_octave: int = PER_OCTAVE) -> int:
  """Padded length of a pair of length n: the ladder, capped at max_len for
  pairs that fit in it (so training never pads beyond max_len); longer
  (eval-only) pairs continue on the ladder."""
  padded = ladder_len(n, per_octave)
  return min(padded, max_len) if n <= max_len else padded


def bucket_lens(len_N: np.ndarray, max_len: int, per_octave: int = PER_OCTAVE) -> np.ndarray:
  """`bucket_len` of every entry of ``len_N`` (one table lookup)."""
  table = np.array(
      [bucket_len(n, max_len, per_octave) for n in range(int(len_N.max(initial=0)) + 1)],
      np.int64)
  return table[len_N]


def batch_rows(length: int, max_tokens: int, batch_multiple: int) -> int:
  """Rows of a batch of padded length ``length``: as many as the token budget
  allows, a multiple of ``batch_multiple``, at least ``batch_multiple``."""
  return max(batch_multiple, (max_tokens // length) // batch_multiple * batch_multiple)


@dataclasses.dataclass(frozen=True)
class _BatchPlan:
  """Cut of a length-sorted sequence of N pairs into batches: batch b holds
  sorted positions [starts[b], starts[b] + counts[b]) padded to rows[b] rows
  of length lens[b]."""

  starts: np.ndarray
  counts: np.ndarray
  rows: np.ndarray
  lens: np.ndarray

  @property
  def num_batches(self) -> int:
    return len(self.starts)


def plan_batches(
    sorted_len_N: np.ndarray, max_tokens: int, batch_multiple: int
) -> _BatchPlan:
  """Greedy cut of pairs sorted by padded length (ascending): each batch
  takes as many pairs as the budget of its *last* (longest) pair's length
  allows. Depends only on the sorted lengths, not on which pairs they are."""
  N = len(sorted_len_N)
  # rows_by_len[L] = batch_rows(L) (index 0 unused): one lookup per pair.
  rows_by_len = np.array(
      [0] + [batch_rows(L, max_tokens, batch_multiple)
             for L in range(1, int(sorted_len_N.max(initial=0)) + 1)], np.int64)
  rows_N = rows_by_len[sorted_len_N]
  starts, counts = [], []
  p = 0
  while p < N:
    # Largest n with n <= rows_N[p + n - 1]; monotone in n because rows_N
    # is non-increasing along the sorted lengths -> binary search.
    lo, hi = 1, min(N - p, int(rows_N[p]))
    while lo < hi:
      mid = (lo + hi + 1) // 2
      if mid <= rows_N[p + mid - 1]:
        lo = mid
      else:
        hi = mid - 1
    starts.append(p)
    counts.append(lo)
    p += lo
  starts_a = np.asarray(starts, np.int64)
  counts_a = np.asarray(counts, np.int64)
  last = starts_a + counts_a - 1
  return _BatchPlan(
      starts=starts_a,
      counts=counts_a,
      rows=rows_N[last].astype(np.int64),
      lens=sorted_len_N[last].astype(np.int64),
  )


# ---------------------------------------------------------------------------
# Token storage.
# ---------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Ragged:
  """Token ids of one split and language: sentence i is
  ``flat[offsets[i]:offsets[i+1]]`` (no EOS). ``flat`` ends with one unused
  0 so a clipped gather never indexes an empty array."""

  flat: np.ndarray  # int32[total + 1]
  offsets: np.ndarray  # int64[N + 1]

  @property
  def lengths(self) -> np.ndarray:
    return np.diff(self.offsets)

  @classmethod
  def encode(cls, tokenizer, lines: Sequence[str], chunk: int = 1 << 16) -> "Ragged":
    """Tokenizes ``lines`` in chunks: SentencePiece returns Python int lists
    (~30 bytes per id), so a whole WMT-sized corpus at once would need GBs;
    each chunk is packed into int32 right away."""
    flats: list[np.ndarray] = []
    lens: list[np.ndarray] = []
    for lo in range(0, len(lines), chunk):
      pieces = tokenizer.encode_batch(lines[lo : lo + chunk])
      lens.append(np.fromiter((len(p) for p in pieces), np.int64, len(pieces)))
      flats.append(np.concatenate(pieces) if pieces else np.zeros((0,), np.int32))
    offsets = np.concatenate([[0], np.cumsum(np.concatenate(lens or [np.zeros(0, np.int64)]))])
    flat = np.concatenate(flats + [np.zeros((1,), np.int32)]).astype(np.int32)
    return cls(flat, offsets.astype(np.int64))

  def gather(self, ids_n: np.ndarray, rows: int, length: int) -> np.ndarray:
    """int32[rows, length]: sentences ``ids_n`` + EOS, 0-padded; rows past
    len(ids_n) are all 0. One vectorized gather, no per-row Python."""
    n = len(ids_n)
    out_RxL = np.zeros((rows, length), np.int32)
    if n == 0:
      return out_RxL
    starts_n = self.offsets[ids_n]
    lens_n = self.offsets[ids_n + 1] - starts_n
    pos_L = np.arange(length)
    idx_nxL = np.minimum(starts_n[:, None] + pos_L[None, :], len(self.flat) - 1)
    out_RxL[:n] = np.where(pos_L[None, :] < lens_n[:, None], self.flat[idx_nxL], PAD_ID)
    out_RxL[np.arange(n), lens_n] = EOS_ID
    return out_RxL


def encode_cached(
    tokenizer, lines: Sequence[str] | None, cache_path: pathlib.Path
) -> Ragged:
  """Tokenized ``lines`` from ``cache_path`` (.npz), computing and storing
  them (atomically) on a miss; the caller puts everything that affects the
  ids in the name. ``lines=None`` means 'must be cached' (never on a miss)."""
  if cache_path.exists():
    with np.load(cache_path) as z:
      return Ragged(z["flat"], z["offsets"])
  assert lines is not None
  ragged = Ragged.encode(tokenizer, lines)
  buf = io.BytesIO()
  np.savez(buf, flat=ragged.flat, offsets=ragged.offsets)
  _atomic_write_bytes(cache_path, buf.getvalue())
  return ragged
