"""BERT pre-training data: sentence pairs packed to a fixed length, masked per batch.

Flow (``make_mlm_data``):
  raw corpus --TFDS builder (builders.py)--> documents (array_record, in the cache dir)
  --sentences--> token ids per sentence (the corpus's LM tokenizer, cached)
  --pairs--> [CLS] A [SEP] B [SEP] instances of at most seq_len tokens (once, seeded)
  --grain--> shuffled batches (per-epoch reshuffle), each masked by a pure function of
  (seed, global step): dynamic masking (RoBERTa), and a resumed run sees the same masks.

Ids: the text tokenizer's ids (0 = padding, 1 = unknown, ...), then [CLS], [SEP] and
[MASK] appended after its vocabulary (`BertVocab`), so a tokenizer trained for the LM
is reused as it is.

Pairs (Devlin et al. 2019, create_pretraining_data.py): sentences of a document are
gathered until they fill seq_len - 3 tokens (with probability `short_seq_prob` a shorter
random target); a random cut splits them into A and B. With next-sentence prediction,
B is replaced half the time by sentences from a random other document (label 1; the
unused sentences go back to the document); the pair is trimmed from the longer side, at
a random end, to fit.

Masking: in each sequence, round(15%) of the non-special tokens (at least one) are
chosen; of those 80% become [MASK], 10% a random regular token, 10% stay. Only the
chosen positions are predicted, gathered into P = ceil(0.15 · seq_len) slots.

Batches (B = batch_size // process_count):
  inputs         int32[B, L]    masked tokens, 0-padded
  segment_ids    int32[B, L]    0 for [CLS] A [SEP], 1 for B [SEP] (and padding)
  mlm_positions  int32[B, P]    positions predicted (0 in unused slots)
  targets        int32[B, P]    original tokens there
  weights        float32[B, P]  1 on used slots
  nsp_labels     int32[B]       0: B follows A; 1: B is random (always 0 without NSP)
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import re
from typing import Sequence

import grain
import numpy as np

from lnjax.core import errors
from lnjax.data import builders, paths, pipeline, tokenizers
from lnjax.data.config import MLMDataConfig

SPECIAL_TOKENS = ("[CLS]", "[SEP]", "[MASK]")
FIRST_REGULAR_ID = 2  # Random replacements are drawn from [2, text vocab): no pad, no unk.
MASK_FRACTION, RANDOM_FRACTION = 0.8, 0.1  # Of the chosen tokens; the remaining 10% stay.
_TRAIN_STREAM, _EVAL_STREAM = 1, 2  # Separate random streams for train and eval masks.


@dataclasses.dataclass(frozen=True)
class BertVocab:
  """A text tokenizer plus BERT's special tokens appended after its ids."""

  tokenizer: tokenizers.Tokenizer

  @property
  def text_vocab_size(self) -> int:
    return int(self.tokenizer.vocab_size)

  @property
  def cls_id(self) -> int:
    return self.text_vocab_size

  @property
  def sep_id(self) -> int:
    return self.text_vocab_size + 1

  @property
  def mask_id(self) -> int:
    return self.text_vocab_size + 2

  @property
  def vocab_size(self) -> int:
    return self.text_vocab_size + len(SPECIAL_TOKENS)

  def encode_sentences(self, sentences: Sequence[str]) -> list[np.ndarray]:
    """Each sentence with one leading space, as words inside running text have it (the
    tokenizers keep whitespace verbatim), so that GLUE sentences and pre-training
    sentences tokenize alike."""
    return self.tokenizer.encode_batch([" " + s.strip() for s in sentences])

  def pair(self, a_N: np.ndarray, b_M: np.ndarray | None, seq_len: int):
    """[CLS] a [SEP] (b [SEP]) padded to seq_len: (tokens, segment ids), int32 [seq_len]."""
    parts = [[self.cls_id], a_N, [self.sep_id]]
    segments = [np.zeros(len(a_N) + 2, np.int32)]
    if b_M is not None and len(b_M):
      parts += [b_M, [self.sep_id]]
      segments.append(np.ones(len(b_M) + 1, np.int32))
    tokens = np.concatenate(parts).astype(np.int32)
    tokens_L = np.zeros(seq_len, np.int32)
    segments_L = np.zeros(seq_len, np.int32)
    tokens_L[: len(tokens)] = tokens
    segments_L[: len(tokens)] = np.concatenate(segments)
    return tokens_L, segments_L


def make_vocab(cfg: MLMDataConfig, builder=None) -> BertVocab:
  """The corpus's tokenizer (trained on its train split, or loaded from the cache without
  reading the split; a char tokenizer's characters are the LM pipeline's file)."""
  builder = builder or builders.prepare(cfg.name, cfg.data_dir, cfg.cache_dir, cfg.mirror)
  return BertVocab(tokenizers.make_tokenizer(
      cfg.tokenizer, cfg.name, cfg.vocab_size,
      lambda: "".join(builders.load_split_texts(builder, "train")), cfg.cache_dir,
      model_type=cfg.sp_model_type,
      chars_file=tokenizers.chars_path(cfg.cache_dir, f"{cfg.name}-{builder.fingerprint}")))


# ---------------------------------------------------------------------------
# Sentences and pairs.
# ---------------------------------------------------------------------------

_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")


def split_sentences(document: str) -> list[str]:
  """The sentences of a document, in order: lines split after '.', '!' or '?'; blank
  lines and wikitext headings (' = Title = ') dropped."""
  sentences = []
  for line in document.split("\n"):
    line = line.strip()
    if not line or (line.startswith("=") and line.endswith("=")):
      continue
    sentences += [s for s in _SENTENCE_END.split(line) if s]
  return sentences


def truncate_pair(a_N: np.ndarray, b_M: np.ndarray, max_tokens: int,
                  rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
  """BERT's trimming: one token at a time from the longer side (B on a tie), each from a
  random end, until the pair fits. The final lengths follow from the rule; how many of a
  side's removals come off its front is then Binomial(removed, 1/2)."""
  la, lb, m = len(a_N), len(b_M), max_tokens
  if la + lb <= m:
    return a_N, b_M
  if la > lb and lb <= m - lb:
    fa, fb = m - lb, lb
  elif lb > la and la <= m - la:
    fa, fb = la, m - la
  else:  # Both trimmed down to about half, A keeping the odd token.
    fa, fb = m - m // 2, m // 2
  front_a, front_b = rng.binomial(la - fa, 0.5), rng.binomial(lb - fb, 0.5)
  return a_N[front_a : front_a + fa], b_M[front_b : front_b + fb]


def make_pairs(docs: Sequence[Sequence[np.ndarray]], seq_len: int, rng: np.random.Generator,
               next_sentence: bool, short_seq_prob: float):
  """Packs documents (lists of sentence token arrays) into pairs, BERT's way (module
  docstring). Returns [(a tokens, b tokens, nsp label)]."""
  max_tokens = seq_len - 3  # [CLS] A [SEP] B [SEP]
  empty = np.zeros(0, np.int32)
  concat = lambda sentences: np.concatenate(sentences) if sentences else empty

  def target_length():
    if rng.random() < short_seq_prob:
      return int(rng.integers(2, max_tokens + 1))
    return max_tokens

  pairs = []
  for d, doc in enumerate(docs):
    target = target_length()
    chunk, length, i = [], 0, 0
    while i < len(doc):
      chunk.append(doc[i])
      length += len(doc[i])
      if i == len(doc) - 1 or length >= target:
        a_end = int(rng.integers(1, len(chunk))) if len(chunk) >= 2 else 1
        a = concat(chunk[:a_end])
        label = 0
        if next_sentence and len(docs) > 1 and (len(chunk) == 1 or rng.random() < 0.5):
          label = 1  # B from a random other document.
          other = d
          while other == d:
            other = int(rng.integers(len(docs)))
          j, b_sentences, b_length = int(rng.integers(len(docs[other]))), [], 0
          while j < len(docs[other]) and (not b_sentences or b_length < target - len(a)):
            b_sentences.append(docs[other][j])
            b_length += len(docs[other][j])
            j += 1
          b = concat(b_sentences)
          i -= len(chunk) - a_end  # The unused sentences start the next chunk.
        else:
          b = concat(chunk[a_end:])
        pairs.append((*truncate_pair(a, b, max_tokens, rng), label))
        chunk, length, target = [], 0, target_length()
      i += 1
  return pairs


# ---------------------------------------------------------------------------
# Masking.
# ---------------------------------------------------------------------------


def mask_tokens(tokens_BxL: np.ndarray, rng: np.random.Generator, vocab: BertVocab,
                mask_rate: float, max_predictions: int) -> dict[str, np.ndarray]:
  """BERT's masking of a batch (module docstring): {'inputs', 'mlm_positions', 'targets',
  'weights'}. Special tokens and padding are never chosen."""
  b, length = tokens_BxL.shape
  p = max_predictions
  candidate_BxL = (tokens_BxL != tokenizers.PAD_ID) & (tokens_BxL < vocab.text_vocab_size)
  count_B = np.minimum(np.maximum(np.rint(mask_rate * candidate_BxL.sum(1)), 1), p)
  # A random order of each row's candidates first: argsort of uniform keys, the other
  # positions pushed to the end.
  keys_BxL = np.where(candidate_BxL, rng.random((b, length)), 2.0)
  order_BxP = np.argsort(keys_BxL, axis=1, kind="stable")[:, :p]
  rows_Bx1 = np.arange(b)[:, None]
  chosen_BxP = (np.arange(p)[None, :] < count_B[:, None]) & candidate_BxL[rows_Bx1, order_BxP]
  positions_BxP = np.where(chosen_BxP, order_BxP, 0).astype(np.int32)
  targets_BxP = np.where(chosen_BxP, tokens_BxL[rows_Bx1, order_BxP], 0).astype(np.int32)
  u_BxP = rng.random((b, p))
  random_BxP = rng.integers(FIRST_REGULAR_ID, vocab.text_vocab_size, (b, p))
  replaced_BxP = np.where(u_BxP < MASK_FRACTION, vocab.mask_id,
                          np.where(u_BxP < MASK_FRACTION + RANDOM_FRACTION, random_BxP,
                                   targets_BxP))
  inputs_BxL = tokens_BxL.copy()
  rows, slots = np.nonzero(chosen_BxP)
  inputs_BxL[rows, positions_BxP[rows, slots]] = replaced_BxP[rows, slots]
  return {"inputs": inputs_BxL.astype(np.int32), "mlm_positions": positions_BxP,
          "targets": targets_BxP, "weights": chosen_BxP.astype(np.float32)}


# ---------------------------------------------------------------------------
# The data object.
# ---------------------------------------------------------------------------


class MLMData:
  """Packed, tokenized pairs of the train and eval splits and their batch iterators.
  Build with `make_mlm_data`."""

  def __init__(self, cfg: MLMDataConfig, seed: int, vocab: BertVocab, train: dict,
               eval_: dict, process_index: int, process_count: int, fingerprint: str):
    self.cfg = cfg
    self.seed = int(seed) % (1 << 32)  # grain seeds must lie in [0, 2**32)
    self.vocab = vocab
    self.tokenizer = vocab.tokenizer
    self.vocab_size = vocab.vocab_size
    self.process_index, self.process_count = process_index, process_count
    self.local_batch_size = cfg.batch_size // process_count
    self.train, self.eval = train, eval_
    self.num_train_pairs = len(train["tokens"])
    if self.num_train_pairs < cfg.batch_size:
      raise errors.ConfigError(f"data.batch_size={cfg.batch_size} exceeds the "
                               f"{self.num_train_pairs} training pairs of {cfg.name}")
    self._fingerprint = fingerprint
    self._eval_batches = self._build_eval_batches()
    self.unigram_entropy = self._unigram_entropy()

  @property
  def steps_per_epoch(self) -> int:
    return self.num_train_pairs // self.cfg.batch_size

  def _masked_batch(self, split: dict, ids_G: np.ndarray, rng: np.random.Generator) -> dict:
    """Masks the global batch `ids_G` (the same on every process), keeps this process's rows."""
    tokens_GxL = split["tokens"][ids_G]
    batch = mask_tokens(tokens_GxL, rng, self.vocab, self.cfg.mask_rate,
                        self.cfg.max_predictions)
    batch["segment_ids"] = split["segments"][ids_G]
    batch["nsp_labels"] = split["nsp_labels"][ids_G]
    lo = self.process_index * self.local_batch_size
    return {k: np.ascontiguousarray(v[lo : lo + self.local_batch_size]) for k, v in batch.items()}

  def _train_batch(self, step: int, ids_G: np.ndarray) -> dict:
    rng = np.random.default_rng([self.seed, _TRAIN_STREAM, int(step)])
    return self._masked_batch(self.train, ids_G, rng)

  def train_iter(self) -> pipeline.TrainIterator:
    """Endless, seed-deterministic, resumable batches: each epoch a fresh permutation of
    the pairs (the last partial batch dropped), each batch masked by (seed, step)."""
    ds = (grain.MapDataset.range(self.num_train_pairs)
          .shuffle(seed=self.seed)
          .batch(self.cfg.batch_size, drop_remainder=True)
          .repeat(None)  # reseeds the shuffle every epoch
          .map_with_index(self._train_batch))
    read_options = grain.ReadOptions(num_threads=0, prefetch_buffer_size=0)
    return pipeline.TrainIterator(iter(ds.to_iter_dataset(read_options=read_options)),
                                  self._fingerprint)

  def _build_eval_batches(self) -> list[dict]:
    """The first eval_batches full batches of the eval split, with fixed masks."""
    g = self.cfg.batch_size
    n = len(self.eval["tokens"]) // g
    if self.cfg.eval_batches:
      n = min(n, self.cfg.eval_batches)
    if n == 0:
      raise errors.ConfigError(f"data.batch_size={g} exceeds the {len(self.eval['tokens'])} "
                               f"pairs of the {self.cfg.eval_split} split of {self.cfg.name}")
    rng = np.random.default_rng([self.seed, _EVAL_STREAM])
    return [self._masked_batch(self.eval, np.arange(i * g, (i + 1) * g), rng) for i in range(n)]

  def eval_batches(self) -> list[dict]:
    return list(self._eval_batches)

  def _unigram_entropy(self) -> float:
    """Cross-entropy (nats) of the held-out masked targets under the train split's
    add-one-smoothed token frequencies: a model that learned only frequencies."""
    tokens_N = self.train["tokens"].reshape(-1)
    counts_V = np.bincount(tokens_N[tokens_N < self.vocab.text_vocab_size],
                           minlength=self.vocab_size).astype(np.float64) + 1.0
    logp_V = np.log(counts_V) - np.log(counts_V.sum())
    targets = np.concatenate([b["targets"][b["weights"] > 0] for b in self._eval_batches])
    return float(-logp_V[targets].mean())


def _encode_split(builder, split: str, vocab: BertVocab, cache_path) -> list[list[np.ndarray]]:
  """Documents of `split` as lists of sentence token arrays (cached as one .npz)."""
  if cache_path.exists():
    with np.load(cache_path) as z:
      flat, sentence_lens, doc_lens = z["flat"], z["sentence_lens"], z["doc_lens"]
  else:
    docs = [split_sentences(d) for d in builders.load_split_texts(builder, split)]
    pieces = vocab.encode_sentences([s for doc in docs for s in doc])
    flat = np.concatenate(pieces).astype(np.int32) if pieces else np.zeros(0, np.int32)
    sentence_lens = np.array([len(p) for p in pieces], np.int64)
    doc_lens = np.array([len(doc) for doc in docs], np.int64)
    buf = io.BytesIO()
    np.savez(buf, flat=flat, sentence_lens=sentence_lens, doc_lens=doc_lens)
    tokenizers._atomic_write_bytes(cache_path, buf.getvalue())
  sentences = np.split(flat, np.cumsum(sentence_lens)[:-1]) if len(sentence_lens) else []
  bounds = np.concatenate([[0], np.cumsum(doc_lens)])
  return [sentences[a:b] for a, b in zip(bounds[:-1], bounds[1:]) if b > a]


def pair_arrays(vocab: BertVocab, pairs, seq_len: int) -> dict[str, np.ndarray]:
  """Pairs -> {'tokens', 'segments': int32[N, L], 'nsp_labels': int32[N]}: each row
  `vocab.pair(a, b, seq_len)`, built by one scatter rather than a loop over rows."""
  n = len(pairs)
  la_N = np.array([len(a) for a, _, _ in pairs], np.int64)
  lb_N = np.array([len(b) for _, b, _ in pairs], np.int64)
  cls, sep = np.array([vocab.cls_id], np.int32), np.array([vocab.sep_id], np.int32)
  pieces = []
  for a, b, _ in pairs:
    pieces += [cls, a, sep, b, sep] if len(b) else [cls, a, sep]
  flat = np.concatenate(pieces).astype(np.int32) if pieces else np.zeros(0, np.int32)
  lens_N = la_N + 2 + np.where(lb_N > 0, lb_N + 1, 0)
  rows = np.repeat(np.arange(n), lens_N)
  cols = np.arange(len(flat)) - np.repeat(np.cumsum(lens_N) - lens_N, lens_N)
  tokens_NxL = np.zeros((n, seq_len), np.int32)
  segments_NxL = np.zeros((n, seq_len), np.int32)
  tokens_NxL[rows, cols] = flat
  segments_NxL[rows, cols] = cols >= la_N[rows] + 2  # B and its [SEP].
  labels_N = np.array([label for _, _, label in pairs], np.int32)
  return {"tokens": tokens_NxL, "segments": segments_NxL, "nsp_labels": labels_N}


def make_mlm_data(cfg: MLMDataConfig, seed: int, process_index: int = 0, process_count: int = 1,
                  next_sentence: bool = True) -> MLMData:
  """Prepares (or loads from the cache) `cfg.name` and returns `MLMData`; `DataError`
  (one line, with how to get it) for a missing corpus."""
  if cfg.batch_size % process_count:
    raise errors.ConfigError(f"data.batch_size={cfg.batch_size} is not divisible by the "
                             f"process count {process_count}")
  builder = builders.prepare(cfg.name, cfg.data_dir, cfg.cache_dir, cfg.mirror)
  vocab = make_vocab(cfg, builder)
  cache = paths.resolve_cache_dir(cfg.cache_dir) / "tokens"
  arrays = {}
  for stream, split in ((_TRAIN_STREAM, "train"), (_EVAL_STREAM, cfg.eval_split)):
    docs = _encode_split(builder, split, vocab, cache / (
        f"{cfg.name}-{builder.fingerprint}-{split}-{vocab.tokenizer.cache_key}-sentences.npz"))
    # Pairs are drawn once per (seed, split): dynamic masking varies them per step.
    rng = np.random.default_rng([int(seed) % (1 << 32), stream])
    pairs = make_pairs(docs, cfg.seq_len, rng, next_sentence, cfg.short_seq_prob)
    arrays[split if stream == _TRAIN_STREAM else "eval"] = pair_arrays(vocab, pairs, cfg.seq_len)
  fingerprint = hashlib.sha256(json.dumps([
      builder.fingerprint, vocab.tokenizer.cache_key, dataclasses.asdict(cfg) | {
          "data_dir": None, "cache_dir": None, "eval_batches": None},
      int(seed), next_sentence]).encode()).hexdigest()[:16]
  return MLMData(cfg, seed, vocab, arrays["train"], arrays["eval"], process_index,
                 process_count, fingerprint)
