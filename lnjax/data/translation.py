"""Translation input pipeline: parallel text -> joint SentencePiece -> length-
bucketed, token-budgeted batches (grain), for encoder-decoder Transformers.

Flow (``make_mt_data``):
  raw de/en files --TFDS builder (mt_builders)--> sentence pairs (array_record)
  --joint SentencePiece (trained on train de+en, cached)--> ragged int32 ids
  per split and language (cached .npz) --buckets--> padded batches.

Ids: 0 = <pad>, 1 = <unk>, 2 = <s> (BOS), 3 = </s> (EOS), then pieces. The
source and the target get EOS appended; the decoder input is the target
shifted right behind BOS (teacher forcing).

Batches (dicts of numpy arrays; B rows = this process's share, S == T):
  inputs          int32[B, S]    source ids, EOS-terminated, 0-padded
  inputs_mask     float32[B, S]  1 on source tokens (EOS included)
  targets         int32[B, T]    target ids, EOS-terminated, 0-padded
  decoder_inputs  int32[B, T]    BOS + targets[:, :-1]
  weights         float32[B, T]  1 on target tokens (EOS included)
  index           int32[B]       eval only: example position in the split,
                                 -1 on padding rows

Length bucketing. A pair's length is max(len(source), len(target)) in
subword tokens with EOS. Lengths are rounded up to a bucket length from a
quarter-octave ladder (8, 10, 12, 14, 16, 20, 24, 28, 32, 40, 48, 56, 64, 80,
..., i.e. multiples of 2 below 16, of 4 below 32, of 8 below 64...), capped
at ``max_len`` for training, and both sides are padded to it. A batch of
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

BLEU: `MTData.references` is the target side as stored (lowercased when
``lowercase``). Multi30k and newstest2014 are raw text: score detokenized
output with sacreBLEU's default 13a tokenizer. IWSLT'14 is fairseq's Moses-
tokenized, lowercased text: the model then outputs tokenized text and the
usual number is *tokenized* BLEU (fairseq / multi-bleu), i.e. sacreBLEU with
``tokenize="none"`` against `MTData.tokenized_references`.
`MTData.sacrebleu_tokenize` says which.
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import logging
import os
import pathlib
from typing import Any, Mapping, Sequence

import grain
import numpy as np

from lnjax import errors
from lnjax.data import mt_builders
from lnjax.data import paths
from lnjax.data import pipeline
from lnjax.data import sources
from lnjax.data import tokenizers
from lnjax.data.tokenizers import _atomic_write_bytes

_log = logging.getLogger(__name__)

MT_DATASETS = tuple(mt_builders.MT_BUILDERS)  # multi30k_de_en, iwslt14_de_en, wmt14_de_en
LANGS = mt_builders.LANGS  # ('de', 'en')
PAD_ID, UNK_ID, BOS_ID, EOS_ID = 0, 1, 2, 3
_MAX_VOCAB = 1 << 20
# Shortest bucket length: shorter pairs are padded to it.
MIN_BUCKET_LEN = 8
# SentencePiece trains on at most this many lines (an evenly spaced subset of
# the train de+en lines beyond it): WMT14's 9M lines would take hours single-
# threaded, and 1M lines give practically the same vocabulary.
SP_MAX_TRAIN_LINES = 1_000_000
# Corpora stored Moses-tokenized: BLEU is computed on tokens (see docstring).
TOKENIZED_DATASETS = ("iwslt14_de_en",)


@dataclasses.dataclass(frozen=True)
class MTDataConfig:
  """The ``config.data`` block of a translation run. Every field is validated
  on construction (`errors.ConfigError` naming ``data.<field>``)."""

  name: str = "multi30k_de_en"  # multi30k_de_en | iwslt14_de_en | wmt14_de_en
  source_lang: str = "de"  # de | en (either direction)
  target_lang: str = "en"
  data_dir: str | None = None  # raw corpora; None -> LNJAX_DATA_DIR -> ../shared/data, downloads
  cache_dir: str | None = None  # prepared data; None -> env -> ~/.cache/lnjax
  mirror: str | None = None  # replaces the download URLs' base; None -> LNJAX_DATA_MIRROR
  tfds_data_dir: str | None = None  # tfds: names; None -> TFDS_DATA_DIR -> ~/tensorflow_datasets
  text_field: str = ""  # tfds:/hf: names: "" = features named de/en; else nested under it
  vocab_size: int = 8000  # joint SentencePiece on train de+en (ignored with spm_path)
  sp_model_type: str = "unigram"  # unigram | bpe
  spm_path: str | None = None  # use this SentencePiece model instead of training
  max_tokens: int = 4096  # padded tokens per global batch and side (fairseq --max-tokens)
  max_len: int = 256  # drop training pairs longer (either side, tokens incl. EOS)
  eval_splits: tuple[str, ...] = ("validation",)
  test_split: str = "test_2016_flickr"
  lowercase: bool = False  # lowercase all text (iwslt14's text already is)

  def __post_init__(self):
    def fail(field: str, why: str):
      raise errors.ConfigError(f"data.{field}={getattr(self, field)!r} {why}")

    def check_choice(field: str, valid):
      if getattr(self, field) not in valid:
        fail(field, f"is not one of: {pipeline._choices(valid)}")

    def check_int(field: str, lo: int, hi: int | None = None):
      v = getattr(self, field)
      ok = isinstance(v, (int, np.integer)) and not isinstance(v, bool)
      if not ok or v < lo or (hi is not None and v > hi):
        rng = f">= {lo}" if hi is None else f"in [{lo}, {hi}]"
        fail(field, f"is invalid: must be an integer {rng}")

    def check_path(field: str):
      v = getattr(self, field)
      if v is not None and not (isinstance(v, (str, os.PathLike)) and str(v)):
        fail(field, "is invalid: must be a non-empty path string or None")

    sources.check_name(self.name, "data.name", MT_DATASETS)
    check_choice("source_lang", LANGS)
    check_choice("target_lang", LANGS)
    if self.source_lang == self.target_lang:
      fail("target_lang", f"must differ from data.source_lang={self.source_lang!r}")
    check_path("data_dir")
    check_path("cache_dir")
    check_path("mirror")
    check_path("tfds_data_dir")
    if not isinstance(self.text_field, str):
      fail("text_field", "must be a string")
    check_int("vocab_size", 16, _MAX_VOCAB)
    check_choice("sp_model_type", tokenizers.SP_MODEL_TYPES)
    check_path("spm_path")
    check_int("max_tokens", MIN_BUCKET_LEN)
    check_int("max_len", 2)
    # tfds:/hf: splits are checked on opening the data set.
    splits = None if sources.is_external(self.name) else mt_builders.MT_SPLITS[self.name]
    # A list (from a command line or YAML) is fine; a bare string is the
    # classic mistake ('validation' would iterate as characters).
    if isinstance(self.eval_splits, (list, tuple)):
      object.__setattr__(self, "eval_splits", tuple(self.eval_splits))
    else:
      fail("eval_splits", f"must be a tuple of split names from: {pipeline._choices(splits or ())}")
    for split in self.eval_splits:
      if splits is not None and split not in splits:
        raise errors.ConfigError(
            f"data.eval_splits={self.eval_splits!r}: {split!r} is not one of:"
            f" {pipeline._choices(splits)} (splits of {self.name})"
        )
    if splits is not None and self.test_split not in splits:
      fail("test_split", f"is not one of: {pipeline._choices(splits)} (splits of {self.name})")
    if not isinstance(self.lowercase, bool):
      fail("lowercase", "is invalid: must be true or false")


# ---------------------------------------------------------------------------
# Tokenizer: joint SentencePiece with BOS/EOS.
# ---------------------------------------------------------------------------


class MTTokenizer(tokenizers.SentencePieceTokenizer):
  """SentencePiece model with 0 = <pad>, 1 = <unk>, 2 = <s>, 3 = </s>.

  ``encode`` gives the pieces only (add EOS with ``add_eos=True``);
  ``decode`` reads up to the first EOS and skips PAD/BOS, so a model's padded
  output decodes directly. With ``lowercase`` the text is lowercased before
  encoding (the model was trained on lowercased text).
  """

  bos_id = BOS_ID
  eos_id = EOS_ID

  def __init__(self, model_proto: bytes, lowercase: bool = False):
    import sentencepiece as spm

    sp = spm.SentencePieceProcessor(model_proto=model_proto)
    got = (sp.pad_id(), sp.unk_id(), sp.bos_id(), sp.eos_id())
    if got != (PAD_ID, UNK_ID, BOS_ID, EOS_ID):
      raise errors.ConfigError(
          f"SentencePiece model has pad/unk/bos/eos ids {got}; lnjax needs"
          f" {(PAD_ID, UNK_ID, BOS_ID, EOS_ID)} (train it with --pad_id=0"
          " --unk_id=1 --bos_id=2 --eos_id=3)"
      )
    super().__init__(model_proto)
    self.lowercase = lowercase
    if lowercase:
      self.cache_key += "-lc"

  @classmethod
  def load(cls, path: str | os.PathLike, lowercase: bool = False) -> "MTTokenizer":
    return cls(pathlib.Path(path).read_bytes(), lowercase=lowercase)

  @staticmethod
  def train(lines: Sequence[str], vocab_size: int, model_type: str = "unigram") -> bytes:
    """Trains a joint model on ``lines`` (one sentence each; pass source and
    target lines together) and returns it serialized. Deterministic: one
    thread, every line used in order (see `SP_MAX_TRAIN_LINES`)."""
    import sentencepiece as spm

    if model_type not in tokenizers.SP_MODEL_TYPES:
      raise ValueError(
          f"sentencepiece model_type={model_type!r} is not one of:"
          f" {', '.join(tokenizers.SP_MODEL_TYPES)}"
      )
    lines = [line for line in lines if line.strip()]
    if len(lines) > SP_MAX_TRAIN_LINES:
      keep = np.linspace(0, len(lines) - 1, SP_MAX_TRAIN_LINES).astype(np.int64)
      lines = [lines[i] for i in keep]
    n_chars = len(set().union(*map(set, lines))) if lines else 0
    model = io.BytesIO()
    try:
      spm.SentencePieceTrainer.train(
          sentence_iterator=iter(lines),
          model_writer=model,
          model_type=model_type,
          vocab_size=vocab_size,
          # Same rule as the LM tokenizer: cover every character of a small
          # alphabet (Multi30k: ~100), SentencePiece's default otherwise.
          character_coverage=1.0 if n_chars <= vocab_size // 2 else 0.9995,
          # No NFKC: decode(encode(x)) gives x back (up to runs of spaces),
          # so detokenized output compares with the raw references. The
          # dummy prefix makes a sentence's first word the same piece as
          # mid-sentence (standard for MT; decode removes it again).
          normalization_rule_name="identity",
          add_dummy_prefix=True,
          remove_extra_whitespaces=True,
          pad_id=PAD_ID,
          unk_id=UNK_ID,
          bos_id=BOS_ID,
          eos_id=EOS_ID,
          num_threads=1,
          input_sentence_size=0,
          shuffle_input_sentence=False,
          minloglevel=2,
      )
    except RuntimeError as e:
      raise errors.ConfigError(
          f"sentencepiece training failed for data.vocab_size={vocab_size}"
          f" ({str(e).strip().splitlines()[-1]}); choose a smaller data.vocab_size"
      ) from e
    return model.getvalue()

  def _prep(self, text: str) -> str:
    return text.lower() if self.lowercase else text

  def encode(self, text: str, add_eos: bool = False) -> np.ndarray:
    ids = self._sp.encode(self._prep(text))
    return np.asarray(ids + [EOS_ID] if add_eos else ids, dtype=np.int32)

  def encode_batch(self, texts: Sequence[str]) -> list[np.ndarray]:
    # One call: SentencePiece encodes the list in C++.
    pieces = self._sp.encode([self._prep(t) for t in texts])
    return [np.asarray(ids, dtype=np.int32) for ids in pieces]

  def decode(self, ids) -> str:
    ids = np.asarray(ids).reshape(-1).tolist()
    if EOS_ID in ids:
      ids = ids[: ids.index(EOS_ID)]
    return self._sp.decode([i for i in ids if i not in (PAD_ID, BOS_ID)])

  def decode_batch(self, ids_BxT) -> list[str]:
    return [self.decode(row) for row in np.asarray(ids_BxT)]


def _sp_model_path(cache_dir: pathlib.Path, cfg: MTDataConfig, fingerprint: str) -> pathlib.Path:
  # The corpus fingerprint is in the name: a changed train set retrains.
  lc = "_lc" if cfg.lowercase else ""
  return (
      cache_dir / "tokenizers"
      / f"{sources.cache_name(cfg.name)}-{fingerprint}_sp{cfg.vocab_size}_{cfg.sp_model_type}{lc}.model"
  )


# ---------------------------------------------------------------------------
# Length buckets.
# ---------------------------------------------------------------------------


def ladder_len(n: int) -> int:
  """Smallest bucket length >= n on the quarter-octave ladder: 8, 10, 12, 14,
  16, 20, 24, 28, 32, 40, ... (steps of octave/4, so padding is <= ~25% and
  ~12% on average at any length)."""
  if n <= MIN_BUCKET_LEN:
    return MIN_BUCKET_LEN
  step = (1 << (int(n).bit_length() - 1)) // 4  # octave start / 4
  return -(-n // step) * step


def bucket_len(n: int, max_len: int) -> int:
  """Padded length of a pair of length n: the ladder, capped at max_len for
  pairs that fit in it (so training never pads beyond max_len); longer
  (eval-only) pairs continue on the ladder."""
  return min(ladder_len(n), max_len) if n <= max_len else ladder_len(n)


def bucket_lens(len_N: np.ndarray, max_len: int) -> np.ndarray:
  """`bucket_len` of every entry of ``len_N`` (one table lookup)."""
  table = np.array(
      [bucket_len(n, max_len) for n in range(int(len_N.max(initial=0)) + 1)], np.int64
  )
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
class _Ragged:
  """Token ids of one split and language: sentence i is
  ``flat[offsets[i]:offsets[i+1]]`` (no EOS). ``flat`` ends with one unused
  0 so a clipped gather never indexes an empty array."""

  flat: np.ndarray  # int32[total + 1]
  offsets: np.ndarray  # int64[N + 1]

  @property
  def lengths(self) -> np.ndarray:
    return np.diff(self.offsets)

  @classmethod
  def encode(cls, tokenizer: MTTokenizer, lines: Sequence[str], chunk: int = 1 << 16) -> "_Ragged":
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


def _encode_cached(
    tokenizer: MTTokenizer, lines: Sequence[str] | None, cache_path: pathlib.Path
) -> _Ragged:
  """Tokenized ``lines`` from ``cache_path`` (.npz), computing and storing
  them (atomically) on a miss; the caller puts everything that affects the
  ids in the name. ``lines=None`` means 'must be cached' (never on a miss)."""
  if cache_path.exists():
    with np.load(cache_path) as z:
      return _Ragged(z["flat"], z["offsets"])
  assert lines is not None
  ragged = _Ragged.encode(tokenizer, lines)
  buf = io.BytesIO()
  np.savez(buf, flat=ragged.flat, offsets=ragged.offsets)
  _atomic_write_bytes(cache_path, buf.getvalue())
  return ragged


# ---------------------------------------------------------------------------
# Data object.
# ---------------------------------------------------------------------------


class MTTrainIterator(pipeline.TrainIterator):
  """`pipeline.TrainIterator` (JSON state: grain position in global batches +
  fingerprint) with the message naming the translation settings."""

  def set_state(self, state: Mapping[str, Any]) -> None:
    if state.get("fingerprint") != self._fingerprint:
      raise errors.ConfigError(
          "train iterator state was saved for a different data setup"
          f" (fingerprint {state.get('fingerprint')!r}, now"
          f" {self._fingerprint!r}): dataset, direction, tokenizer, lowercase,"
          " max_tokens, max_len, batch_multiple and seed must match the checkpoint"
      )
    self._it.set_state(dict(state["grain"]))


@dataclasses.dataclass
class _SplitData:
  src: _Ragged
  tgt: _Ragged
  src_text: list[str] | None  # raw text (lowercased with cfg.lowercase)
  tgt_text: list[str] | None


class MTData:
  """Tokenized splits of one parallel corpus in one direction, plus batch
  iterators. Build with `make_mt_data`.

  Attributes: ``cfg``, ``tokenizer`` (`MTTokenizer`), ``vocab_size``,
  ``pad_id``/``bos_id``/``eos_id``, ``batch_multiple``, ``splits`` (the
  corpus splits available here), ``sacrebleu_tokenize``; with a train split:
  ``steps_per_epoch``, ``num_train_pairs``, ``num_dropped_pairs``,
  ``train_padding_fraction``.
  """

  pad_id, bos_id, eos_id = PAD_ID, BOS_ID, EOS_ID

  def __init__(
      self,
      cfg: MTDataConfig,
      seed: int,
      builder: mt_builders._ParallelBuilder,
      tokenizer: MTTokenizer,
      process_index: int,
      process_count: int,
      batch_multiple: int,
  ):
    self.cfg = cfg
    self.seed = int(seed) % (1 << 32)  # grain/numpy seeds: 32-bit
    self.tokenizer = tokenizer
    self.vocab_size = int(tokenizer.vocab_size)
    self.process_index = process_index
    self.process_count = process_count
    self.batch_multiple = batch_multiple
    self.splits = builder.available_splits
    self.sacrebleu_tokenize = "none" if cfg.name in TOKENIZED_DATASETS else "13a"
    self._builder = builder
    self._split_cache: dict[str, _SplitData] = {}
    self._eval_cache: dict[str, list[dict[str, np.ndarray]]] = {}
    self._train: dict[str, Any] | None = None
    self._epoch_cache: tuple[int, np.ndarray, np.ndarray] | None = None
    self._token_dir = paths.resolve_cache_dir(cfg.cache_dir) / "tokens"

  # -- splits ---------------------------------------------------------------

  def _split(self, split: str, with_text: bool) -> _SplitData:
    """Token ids (cached on disk) and, if asked, the text of ``split``."""
    self._builder.require_split(split)
    data = self._split_cache.get(split)
    if data is not None and (data.src_text is not None or not with_text):
      return data
    cfg, tok = self.cfg, self.tokenizer
    names = {
        lang: self._token_dir
        / f"mt-{sources.cache_name(cfg.name)}-{self._builder.fingerprint}-{split}-{lang}-{tok.cache_key}.npz"
        for lang in LANGS
    }
    text: dict[str, list[str]] | None = None
    if with_text or not all(p.exists() for p in names.values()):
      de, en = self._builder.pairs(split, cfg.text_field)
      text = {"de": de, "en": en}
      if cfg.lowercase:
        text = {k: [s.lower() for s in v] for k, v in text.items()}
    ids = {
        lang: _encode_cached(tok, None if text is None else text[lang], names[lang])
        for lang in LANGS
    }
    s, t = cfg.source_lang, cfg.target_lang
    data = _SplitData(
        src=ids[s], tgt=ids[t],
        src_text=None if text is None else text[s],
        tgt_text=None if text is None else text[t],
    )
    self._split_cache[split] = data
    return data

  def sources(self, split: str) -> list[str]:
    """Source side of ``split`` in file order (lowercased with
    ``data.lowercase``)."""
    return list(self._split(split, with_text=True).src_text)

  def references(self, split: str) -> list[str]:
    """Target side of ``split`` in file order, as stored (lowercased with
    ``data.lowercase``): the BLEU references; see `sacrebleu_tokenize`."""
    return list(self._split(split, with_text=True).tgt_text)

  def tokenized_references(self, split: str) -> list[str]:
    """References as space-separated tokens, for tokenized BLEU
    (``sacrebleu.corpus_bleu(hyps, [refs], tokenize="none")`` with
    equally tokenized hypotheses): iwslt14's stored Moses tokens (fairseq's
    standard BLEU, the output of a model trained on it needs no further
    tokenization), else sacreBLEU's 13a tokenization of `references`."""
    refs = self.references(split)
    if self.sacrebleu_tokenize == "none":
      return [" ".join(r.split()) for r in refs]
    from sacrebleu.tokenizers.tokenizer_13a import Tokenizer13a

    tok13a = Tokenizer13a()
    return [tok13a(r) for r in refs]

  def pair_lengths(self, split: str) -> tuple[np.ndarray, np.ndarray]:
    """(source, target) lengths in tokens incl. EOS, int64[N] each."""
    data = self._split(split, with_text=False)
    return data.src.lengths + 1, data.tgt.lengths + 1

  # -- batches --------------------------------------------------------------

  def _make_batch(
      self, data: _SplitData, ids_n: np.ndarray, rows: int, length: int
  ) -> dict[str, np.ndarray]:
    """This process's slice of a global batch of ``rows`` rows holding pairs
    ``ids_n`` (then empty rows), both sides padded to ``length``."""
    B = rows // self.process_count
    lo = self.process_index * B
    local_ids_n = ids_n[lo : lo + B]  # may be short or empty: padding rows
    src_BxS = data.src.gather(local_ids_n, B, length)
    tgt_BxT = data.tgt.gather(local_ids_n, B, length)
    dec_BxT = np.empty_like(tgt_BxT)
    dec_BxT[:, 0] = BOS_ID
    dec_BxT[:, 1:] = tgt_BxT[:, :-1]
    return {
        "inputs": src_BxS,
        "inputs_mask": (src_BxS != PAD_ID).astype(np.float32),
        "targets": tgt_BxT,
        "decoder_inputs": dec_BxT,
        "weights": (tgt_BxT != PAD_ID).astype(np.float32),
    }

  # -- train ----------------------------------------------------------------

  def _train_setup(self) -> dict[str, Any]:
    """Filters train pairs by max_len and plans the (fixed) batch cut."""
    if self._train is not None:
      return self._train
    cfg = self.cfg
    data = self._split("train", with_text=False)
    src_len_N = data.src.lengths + 1
    tgt_len_N = data.tgt.lengths + 1
    keep_N = (src_len_N <= cfg.max_len) & (tgt_len_N <= cfg.max_len)
    pair_ids_K = np.flatnonzero(keep_N)
    if not len(pair_ids_K):
      raise errors.ConfigError(
          f"data.max_len={cfg.max_len} drops every training pair of {cfg.name}"
          f" (shortest pair: {int(np.maximum(src_len_N, tgt_len_N).min())} tokens)"
      )
    max_K = np.maximum(src_len_N, tgt_len_N)[pair_ids_K]
    padded_K = bucket_lens(max_K, cfg.max_len)
    plan = plan_batches(np.sort(padded_K), cfg.max_tokens, self.batch_multiple)
    real = int(src_len_N[pair_ids_K].sum() + tgt_len_N[pair_ids_K].sum())
    self._train = {
        "data": data,
        "pair_ids_K": pair_ids_K,
        "padded_K": padded_K,
        "plan": plan,
        "padding_fraction": 1.0 - real / float(2 * (plan.rows * plan.lens).sum()),
        "fingerprint": hashlib.sha256(json.dumps([
            "mt", self._builder.fingerprint, self.tokenizer.cache_key,
            cfg.source_lang, cfg.target_lang, cfg.max_tokens, cfg.max_len,
            self.batch_multiple, self.seed,
        ]).encode()).hexdigest()[:16],
    }
    _log.info(
        "%s train: %d pairs (%d longer than max_len dropped), %d batches/epoch,"
        " %d shapes, padding %.1f%%", cfg.name, len(pair_ids_K),
        len(src_len_N) - len(pair_ids_K), plan.num_batches,
        len(set(zip(plan.rows.tolist(), plan.lens.tolist()))),
        100 * self._train["padding_fraction"],
    )
    return self._train

  @property
  def unigram_entropy(self) -> float | None:
    """Cross-entropy (nats/token) of the first eval split's targets, EOS included, under
    the train targets' add-one-smoothed unigram distribution: the held-out loss of a
    decoder that learned token frequencies and nothing else. None without a train split."""
    if "train" not in self.splits or not self.cfg.eval_splits:
      return None
    V = self.vocab_size
    train_T = self._split("train", with_text=False).tgt
    counts_V = np.bincount(train_T.flat[:-1], minlength=V)[:V].astype(np.float64) + 1.0
    counts_V[EOS_ID] += len(train_T.lengths)
    logp_V = np.log(counts_V) - np.log(counts_V.sum())
    held_T = self._split(self.cfg.eval_splits[0], with_text=False).tgt
    nll = -logp_V[held_T.flat[:-1]].sum() - logp_V[EOS_ID] * len(held_T.lengths)
    return float(nll / (len(held_T.flat) - 1 + len(held_T.lengths)))

  @property
  def steps_per_epoch(self) -> int:
    """Global batches per epoch (the same every epoch)."""
    return self._train_setup()["plan"].num_batches

  @property
  def num_train_pairs(self) -> int:
    return len(self._train_setup()["pair_ids_K"])

  @property
  def num_dropped_pairs(self) -> int:
    """Train pairs left out for exceeding ``max_len``."""
    t = self._train_setup()
    return len(t["data"].src.lengths) - len(t["pair_ids_K"])

  @property
  def train_padding_fraction(self) -> float:
    """Fraction of padding (incl. empty rows) among all source+target
    positions of an epoch's batches."""
    return self._train_setup()["padding_fraction"]

  @property
  def train_shapes(self) -> list[tuple[int, int]]:
    """Distinct global (rows, length) batch shapes of training."""
    plan = self._train_setup()["plan"]
    return sorted(set(zip(plan.rows.tolist(), plan.lens.tolist())))

  def _epoch(self, epoch: int) -> tuple[np.ndarray, np.ndarray]:
    """(pair ids in batch-cut order, batch order) of ``epoch``; a pure
    function of (seed, epoch)."""
    if self._epoch_cache is not None and self._epoch_cache[0] == epoch:
      return self._epoch_cache[1], self._epoch_cache[2]
    t = self._train_setup()
    rng = np.random.default_rng([self.seed, epoch])
    perm_K = rng.permutation(len(t["pair_ids_K"]))
    # Stable sort by padded length: random order within each bucket.
    perm_K = perm_K[np.argsort(t["padded_K"][perm_K], kind="stable")]
    order_K = t["pair_ids_K"][perm_K]
    batch_order = rng.permutation(t["plan"].num_batches)
    self._epoch_cache = (epoch, order_K, batch_order)
    return order_K, batch_order

  def _train_batch(self, step: int, _) -> dict[str, np.ndarray]:
    t = self._train_setup()
    plan = t["plan"]
    epoch, j = divmod(int(step), plan.num_batches)
    order_K, batch_order = self._epoch(epoch)
    b = batch_order[j]
    ids_n = order_K[plan.starts[b] : plan.starts[b] + plan.counts[b]]
    return self._make_batch(t["data"], ids_n, int(plan.rows[b]), int(plan.lens[b]))

  def train_iter(self) -> MTTrainIterator:
    """Endless, seed-deterministic, resumable train batches (see the module
    docstring); every process iterates the same global batches and keeps its
    rows. `DataError` when the corpus has no train split here."""
    plan = self._train_setup()["plan"]
    ds = grain.MapDataset.range(plan.num_batches).repeat(None).map_with_index(self._train_batch)
    # Synchronous, like the LM pipeline: a batch is one vectorized gather
    # and the state is then just the step count.
    read_options = grain.ReadOptions(num_threads=0, prefetch_buffer_size=0)
    it = iter(ds.to_iter_dataset(read_options=read_options))
    return MTTrainIterator(it, self._train_setup()["fingerprint"])

  # -- eval -----------------------------------------------------------------

  def eval_batches(self, split: str | None = None) -> list[dict[str, np.ndarray]]:
    """Every pair of ``split`` (default: the first of ``cfg.eval_splits``) once, in deterministic batches sorted by
    length (same format as training plus ``index``); the last batch may have
    empty rows (index -1, zero masks). Same (read-only) arrays every call.

    Nothing is dropped: a pair longer than ``max_len`` gets a longer bucket,
    and one longer than ``max_tokens / batch_multiple`` a batch of
    ``batch_multiple`` rows over the token budget.
    """
    split = split or self.cfg.eval_splits[0]
    if split in self._eval_cache:
      return list(self._eval_cache[split])
    cfg = self.cfg
    data = self._split(split, with_text=False)
    len_N = np.maximum(data.src.lengths, data.tgt.lengths) + 1
    order_N = np.lexsort((np.arange(len(len_N)), len_N))  # by length, then position
    padded_N = bucket_lens(len_N[order_N], cfg.max_len)
    plan = plan_batches(padded_N, cfg.max_tokens, self.batch_multiple)
    batches = []
    for b in range(plan.num_batches):
      ids_n = order_N[plan.starts[b] : plan.starts[b] + plan.counts[b]]
      rows, length = int(plan.rows[b]), int(plan.lens[b])
      batch = self._make_batch(data, ids_n, rows, length)
      B = rows // self.process_count
      index_B = np.full((B,), -1, np.int32)
      local_n = ids_n[self.process_index * B : (self.process_index + 1) * B]
      index_B[: len(local_n)] = local_n
      batch["index"] = index_B
      for v in batch.values():
        v.setflags(write=False)  # shared between calls: keep them immutable
      batches.append(batch)
    self._eval_cache[split] = batches
    return list(batches)


def _spm_from_train(
    cfg: MTDataConfig, builder: mt_builders._ParallelBuilder
) -> MTTokenizer:
  """The cached joint model for this corpus, training it on first use."""
  cache = paths.resolve_cache_dir(cfg.cache_dir)
  model_path = _sp_model_path(cache, cfg, builder.fingerprint)
  if not model_path.exists():
    try:
      builder.require_split("train")
    except paths.DataError as e:
      raise paths.DataError(
          f"{e} (the joint SentencePiece model is trained on it; to use the"
          " other splits without it, set data.spm_path to an existing model)"
      ) from e
    # Processes sharing the cache train once; the others wait and load.
    with paths.file_lock(model_path.with_name(model_path.name + ".lock")):
      if not model_path.exists():
        de, en = builder.pairs("train", cfg.text_field)
        lines = de + en
        if cfg.lowercase:
          lines = [s.lower() for s in lines]
        _atomic_write_bytes(
            model_path, MTTokenizer.train(lines, cfg.vocab_size, cfg.sp_model_type)
        )
  return MTTokenizer.load(model_path, lowercase=cfg.lowercase)


def make_mt_data(
    cfg: MTDataConfig,
    seed: int,
    process_index: int = 0,
    process_count: int = 1,
    batch_multiple: int | None = None,
) -> MTData:
  """Prepares (or loads from the cache) ``cfg.name`` and returns `MTData`.

  Args:
    cfg: the data config.
    seed: shuffling seed (any int).
    process_index, process_count: this process's slice of every global batch.
    batch_multiple: every global batch's row count is a multiple of it (the
      number of data shards, so batches shard evenly over devices); must be
      a multiple of process_count. Default: process_count.

  Raises `DataError` for missing/corrupt corpora (including a missing train
  split when no ``data.spm_path`` is given) and `ConfigError` for settings
  that cannot work.
  """
  if not (isinstance(process_count, (int, np.integer)) and process_count >= 1):
    raise errors.ConfigError(f"process_count={process_count!r} must be an integer >= 1")
  process_count = int(process_count)
  if not (isinstance(process_index, (int, np.integer)) and 0 <= process_index < process_count):
    raise errors.ConfigError(f"process_index={process_index!r} must be in [0, {process_count})")
  process_index = int(process_index)
  batch_multiple = process_count if batch_multiple is None else batch_multiple
  if not (
      isinstance(batch_multiple, (int, np.integer))
      and batch_multiple >= 1
      and batch_multiple % process_count == 0
  ):
    raise errors.ConfigError(
        f"batch_multiple={batch_multiple!r} must be a positive multiple of the"
        f" process count {process_count}"
    )
  batch_multiple = int(batch_multiple)
  longest = bucket_len(cfg.max_len, cfg.max_len)
  if longest * batch_multiple > cfg.max_tokens:
    raise errors.ConfigError(
        f"data.max_tokens={cfg.max_tokens} is too small: a batch of"
        f" {batch_multiple} rows (the batch multiple) of data.max_len={cfg.max_len}"
        f" tokens needs {longest * batch_multiple}"
    )

  builder = open_source(cfg)
  if cfg.spm_path is not None:
    path = pathlib.Path(cfg.spm_path).expanduser()
    if not path.is_file():
      raise errors.ConfigError(f"data.spm_path={cfg.spm_path!r} is not a file")
    try:
      tokenizer = MTTokenizer.load(path, lowercase=cfg.lowercase)
    except errors.ConfigError as e:
      raise errors.ConfigError(f"data.spm_path={cfg.spm_path!r}: {e}") from e
    except (RuntimeError, OSError) as e:  # not a SentencePiece model
      raise errors.ConfigError(
          f"data.spm_path={cfg.spm_path!r} is not a readable SentencePiece model ({e})"
      ) from e
  else:
    tokenizer = _spm_from_train(cfg, builder)
  return MTData(cfg, seed, builder, tokenizer, process_index, process_count, batch_multiple)


def open_source(cfg: MTDataConfig):
  """The prepared parallel corpus ``cfg.name`` (built-in, tfds: or hf:), with its
  evaluation and test splits checked."""
  if not sources.is_external(cfg.name):
    return mt_builders.prepare(cfg.name, cfg.data_dir, cfg.cache_dir, cfg.mirror)
  source = sources.open_external(cfg.name, cfg.tfds_data_dir)
  for split in cfg.eval_splits:
    source.require_split(split)
  return source
