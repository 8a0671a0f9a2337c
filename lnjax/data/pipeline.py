"""Language-model input pipeline: packed token windows, batched with grain.

Flow (``make_lm_data``):
  raw corpus --TFDS builder--> documents (array_record, in the cache dir)
  --tokenizer--> one int32 token stream per split (cached .npy)
  --windows--> non-overlapping windows of seq_len+1 tokens
  --grain--> shuffled (per-epoch reshuffle), batched, sliced per process.

The token streams live in memory as numpy arrays; grain only shuffles and
batches *window indices*, and a batch is built by one fancy-indexing gather,
so there is no per-example Python work on the hot path.

Batches are dicts of numpy arrays with B = batch_size // process_count:
  inputs  int32[B, L]   = window[:-1]
  targets int32[B, L]   = window[1:]
  weights float32[B, L] = 1 for real targets, 0 for padding (eval only)
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
from typing import Any, Mapping

import grain
import numpy as np

from lnjax.core import errors
from lnjax.data import builders
from lnjax.data.config import LMDataConfig
from lnjax.data import paths
from lnjax.data import sources
from lnjax.data import tokenizers



def _choices(values) -> str:
  return ", ".join(str(v) for v in values)


def _windows_needed(n_tokens: int, window: int) -> int:
  """Number of non-overlapping full windows in a stream of n_tokens."""
  return n_tokens // window


class TrainIterator:
  """Endless iterator of train batches with exact save/restore.

  Wraps grain's iterator; ``get_state()`` is a JSON-serializable dict with
  grain's position (counted in *global* batches, so a run may resume with a
  different process count) and a fingerprint of everything that determines
  the batch sequence, which ``set_state`` checks.
  """

  # What the fingerprint covers, named in the mismatch message.
  settings = "dataset, tokenizer, seq_len, batch_size and seed"

  def __init__(self, grain_iter, fingerprint: str):
    self._it = grain_iter
    self._fingerprint = fingerprint

  def __iter__(self) -> "TrainIterator":
    return self

  def __next__(self) -> dict[str, np.ndarray]:
    return next(self._it)

  def get_state(self) -> dict[str, Any]:
    return {"grain": self._it.get_state(), "fingerprint": self._fingerprint}

  def set_state(self, state: Mapping[str, Any]) -> None:
    if state.get("fingerprint") != self._fingerprint:
      raise errors.ConfigError(
          "train iterator state was saved for a different data setup"
          f" (fingerprint {state.get('fingerprint')!r}, now"
          f" {self._fingerprint!r}): {self.settings} must match the checkpoint"
      )
    self._it.set_state(dict(state["grain"]))


class LMData:
  """Tokenized splits of one corpus plus batch iterators. Build with
  `make_lm_data`."""

  def __init__(
      self,
      cfg: LMDataConfig,
      seed: int,
      tokenizer: tokenizers.Tokenizer,
      train_tokens_N: np.ndarray,
      eval_tokens_N: np.ndarray,
      process_index: int,
      process_count: int,
      corpus_fingerprint: str,
  ):
    self.cfg = cfg
    # grain seeds must lie in [0, 2**32); fold any int seed into that range.
    self.seed = int(seed) % (1 << 32)
    self.tokenizer = tokenizer
    self.vocab_size = int(tokenizer.vocab_size)
    self.process_index = process_index
    self.process_count = process_count
    self.local_batch_size = cfg.batch_size // process_count
    self.train_tokens_N = train_tokens_N
    self.eval_tokens_N = eval_tokens_N

    L1 = cfg.seq_len + 1
    self.num_train_windows = _windows_needed(len(train_tokens_N), L1)
    if self.num_train_windows < cfg.batch_size:
      raise errors.ConfigError(
          f"data.batch_size={cfg.batch_size} is too large: the train split of"
          f" {cfg.name} has {len(train_tokens_N)} tokens ="
          f" {self.num_train_windows} windows of data.seq_len+1={L1} tokens"
      )
    # Train windows as a [W, L+1] view of the stream (no copy): window w is
    # tokens[w*(L+1) : (w+1)*(L+1)].
    self._train_windows_WxL1 = train_tokens_N[: self.num_train_windows * L1].reshape(
        self.num_train_windows, L1
    )
    # Identifies the train batch sequence (not the process split).
    self._train_fingerprint = hashlib.sha256(
        json.dumps([
            corpus_fingerprint, tokenizer.cache_key, cfg.seq_len,
            cfg.batch_size, self.seed,
        ]).encode()
    ).hexdigest()[:16]

    self._eval_batches = self._build_eval_batches()
    # Real targets evaluated (over all processes).
    self.eval_tokens = int(self._eval_weights_global.sum())
    self.unigram_entropy = self._unigram_entropy()

  # -- train ----------------------------------------------------------------

  def _gather_train_batch(self, window_ids_G: np.ndarray) -> dict[str, np.ndarray]:
    """Global batch of window ids -> this process's slice of the batch."""
    B = self.local_batch_size
    ids_B = window_ids_G[self.process_index * B : (self.process_index + 1) * B]
    windows_BxL1 = self._train_windows_WxL1[ids_B]  # one gather, copies
    return {
        # Contiguous copies (not strided views) for a cheap device transfer.
        "inputs": np.ascontiguousarray(windows_BxL1[:, :-1]),
        "targets": np.ascontiguousarray(windows_BxL1[:, 1:]),
        "weights": np.ones((B, self.cfg.seq_len), np.float32),
    }

  @property
  def steps_per_epoch(self) -> int:
    """Optimizer steps in one pass over the train windows."""
    return self.num_train_windows // self.cfg.batch_size

  def train_iter(self) -> TrainIterator:
    """Endless, seed-deterministic train batches; every epoch is a fresh
    permutation of the windows, and the last incomplete global batch of each
    epoch is dropped. Every process iterates the same global batches and
    keeps its own slice."""
    ds = (
        grain.MapDataset.range(self.num_train_windows)
        .shuffle(seed=self.seed)
        .batch(self.cfg.batch_size, drop_remainder=True)
        # repeat() reseeds the upstream shuffle for every epoch.
        .repeat(None)
        .map(self._gather_train_batch)
    )
    # Synchronous (no prefetch threads): a batch costs ~0.3 ms, prefetch
    # threads measured slower here, and a synchronous iterator's state is
    # trivially exact.
    read_options = grain.ReadOptions(num_threads=0, prefetch_buffer_size=0)
    it = iter(ds.to_iter_dataset(read_options=read_options))
    return TrainIterator(it, self._train_fingerprint)

  # -- eval -----------------------------------------------------------------

  def _build_eval_batches(self) -> list[dict[str, np.ndarray]]:
    """Eval split, in order, as windows of seq_len+1 tokens; the tail of the
    stream is a partial window and the last batch is padded with empty rows
    (inputs/targets = pad_id, weights = 0)."""
    cfg = self.cfg
    L1 = cfg.seq_len + 1
    G, B = cfg.batch_size, self.local_batch_size
    tokens_N = self.eval_tokens_N
    num_windows = math.ceil(len(tokens_N) / L1)
    if num_windows and len(tokens_N) - (num_windows - 1) * L1 < 2:
      num_windows -= 1  # a 1-token tail has no target
    num_batches = math.ceil(num_windows / G)
    if cfg.eval_batches:
      num_batches = min(num_batches, cfg.eval_batches)
    rows = num_batches * G
    padded_N = np.full((max(rows, num_windows) * L1,), tokenizers.PAD_ID, np.int32)
    padded_N[: len(tokens_N)] = tokens_N[: len(padded_N)]
    windows_RxL1 = padded_N.reshape(-1, L1)[:rows]
    # weights[r, j] = 1 iff target position r*L1 + j + 1 is a real token.
    pos_RxL = np.arange(rows)[:, None] * L1 + np.arange(1, L1)[None, :]
    weights_RxL = (pos_RxL < len(tokens_N)).astype(np.float32)
    self._eval_targets_global = windows_RxL1[:, 1:]
    self._eval_weights_global = weights_RxL

    batches = []
    for b in range(num_batches):
      lo = b * G + self.process_index * B
      batch = {
          "inputs": windows_RxL1[lo : lo + B, :-1],
          "targets": windows_RxL1[lo : lo + B, 1:],
          "weights": weights_RxL[lo : lo + B],
      }
      for v in batch.values():
        v.setflags(write=False)  # shared between calls: keep them immutable
      batches.append(batch)
    return batches

  def eval_batches(self) -> list[dict[str, np.ndarray]]:
    """The eval batches (same arrays every call; read-only)."""
    return list(self._eval_batches)

  def _unigram_entropy(self) -> float:
    """Cross-entropy (nats/token) of the evaluated targets under the train
    split's add-one-smoothed unigram distribution: the loss of a model that
    learned only token frequencies."""
    counts_V = np.bincount(self.train_tokens_N, minlength=self.vocab_size)
    counts_V = counts_V[: self.vocab_size].astype(np.float64) + 1.0
    logp_V = np.log(counts_V) - np.log(counts_V.sum())
    mask = self._eval_weights_global > 0
    if not mask.any():
      return float("nan")
    return float(-logp_V[self._eval_targets_global[mask]].mean())


def make_lm_data(
    cfg: LMDataConfig,
    seed: int,
    process_index: int = 0,
    process_count: int = 1,
) -> LMData:
  """Prepares (or loads from the cache) ``cfg.name`` and returns `LMData`.

  Raises `DataError` for a missing/empty corpus and ValueError for settings
  that cannot work (batch not divisible by processes, batch larger than the
  split...).
  """
  if not (isinstance(process_count, (int, np.integer)) and process_count >= 1):
    raise errors.ConfigError(f"process_count={process_count!r} must be an integer >= 1")
  process_count = int(process_count)
  if not (
      isinstance(process_index, (int, np.integer))
      and 0 <= process_index < process_count
  ):
    raise errors.ConfigError(
        f"process_index={process_index!r} must be in [0, {process_count})"
    )
  process_index = int(process_index)
  if cfg.batch_size % process_count:
    raise errors.ConfigError(
        f"data.batch_size={cfg.batch_size} is not divisible by the"
        f" process count {process_count}"
    )

  source = open_source(cfg)
  # A split's documents are read only where a cache misses (its tokens, the tokenizer):
  # reading tiny_shakespeare's took a quarter of a second of every run.
  docs = functools.cache(lambda split: source.texts(split, cfg.text_field))
  stem = f"{sources.cache_name(cfg.name)}-{source.fingerprint}"
  token_dir = paths.resolve_cache_dir(cfg.cache_dir) / "tokens"
  tokenizer = tokenizers.make_tokenizer(
      cfg.tokenizer,
      # (a tfds:/hf: name is not unique across data dirs: its fingerprint is added)
      stem if sources.is_external(cfg.name) else cfg.name,
      cfg.vocab_size,
      lambda: "".join(docs("train")),
      cfg.cache_dir,
      model_type=cfg.sp_model_type,
      chars_file=tokenizers.chars_path(cfg.cache_dir, stem, cfg.text_field),
  )

  def tokens(split: str) -> np.ndarray:
    name = f"{stem}-{split}-{tokenizer.cache_key}.npy"
    return tokenizers.encode_documents_cached(tokenizer, lambda: docs(split), token_dir / name)

  train_tokens_N = tokens("train")
  eval_tokens_N = train_tokens_N if cfg.eval_split == "train" else tokens(cfg.eval_split)
  return LMData(
      cfg,
      seed,
      tokenizer,
      train_tokens_N,
      eval_tokens_N,
      process_index,
      process_count,
      source.fingerprint,
  )


def open_source(cfg: LMDataConfig):
  """The prepared corpus ``cfg.name`` (built-in, tfds: or hf:), with its train
  and eval splits checked."""
  if sources.is_external(cfg.name):
    source = sources.open_external(cfg.name, cfg.tfds_data_dir)
    source.require_split("train")
    if cfg.eval_split != "train":
      source.require_split(cfg.eval_split)
    return source
  return builders.prepare(cfg.name, cfg.data_dir, cfg.cache_dir, cfg.mirror)
