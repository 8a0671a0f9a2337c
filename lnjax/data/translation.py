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

Batching: length buckets and token-budgeted batches, see `lnjax.data.batching`.

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
import json
import logging
import pathlib
from typing import Any

import grain
import numpy as np

from lnjax.core import errors
from lnjax.data import batching
from lnjax.data import mt_builders
from lnjax.data import mt_tokenizer
from lnjax.data import paths
from lnjax.data import pipeline
from lnjax.data import sources
from lnjax.data.config import MTDataConfig
from lnjax.data.tokenizers import _atomic_write_bytes

_log = logging.getLogger(__name__)

LANGS = mt_builders.LANGS  # ('de', 'en')
PAD_ID, UNK_ID, BOS_ID, EOS_ID = mt_tokenizer.PAD_ID, mt_tokenizer.UNK_ID, mt_tokenizer.BOS_ID, mt_tokenizer.EOS_ID
# Corpora stored Moses-tokenized: BLEU is computed on tokens (see docstring).
TOKENIZED_DATASETS = ("iwslt14_de_en",)


def _sp_model_path(cache_dir: pathlib.Path, cfg: MTDataConfig, fingerprint: str) -> pathlib.Path:
  # The corpus fingerprint is in the name: a changed train set retrains.
  lc = "_lc" if cfg.lowercase else ""
  return (
      cache_dir / "tokenizers"
      / f"{sources.cache_name(cfg.name)}-{fingerprint}_sp{cfg.vocab_size}_{cfg.sp_model_type}{lc}.model"
  )


# ---------------------------------------------------------------------------
# Data object.
# ---------------------------------------------------------------------------


class MTTrainIterator(pipeline.TrainIterator):
  """`pipeline.TrainIterator` (JSON state: grain position in global batches +
  fingerprint) with the message naming the translation settings."""

  settings = ("dataset, direction, tokenizer, lowercase, max_tokens, max_len,"
              " batch_multiple and seed")


@dataclasses.dataclass
class _SplitData:
  src: batching.Ragged
  tgt: batching.Ragged
  src_text: list[str] | None  # raw text (lowercased with cfg.lowercase)
  tgt_text: list[str] | None


class MTData:
  """Tokenized splits of one parallel corpus in one direction, plus batch
  iterators. Build with `make_mt_data`.

  Attributes: ``cfg``, ``tokenizer`` (`mt_tokenizer.MTTokenizer`), ``vocab_size``,
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
      tokenizer: mt_tokenizer.MTTokenizer,
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
        lang: batching.encode_cached(tok, None if text is None else text[lang], names[lang])
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
    padded_K = batching.bucket_lens(max_K, cfg.max_len, cfg.buckets_per_octave)
    plan = batching.plan_batches(np.sort(padded_K), cfg.max_tokens, self.batch_multiple)
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
    padded_N = batching.bucket_lens(len_N[order_N], cfg.max_len, cfg.buckets_per_octave)
    plan = batching.plan_batches(padded_N, cfg.max_tokens, self.batch_multiple)
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
) -> mt_tokenizer.MTTokenizer:
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
            model_path, mt_tokenizer.MTTokenizer.train(lines, cfg.vocab_size, cfg.sp_model_type)
        )
  return mt_tokenizer.MTTokenizer.load(model_path, lowercase=cfg.lowercase)


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
  longest = batching.bucket_len(cfg.max_len, cfg.max_len, cfg.buckets_per_octave)
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
      tokenizer = mt_tokenizer.MTTokenizer.load(path, lowercase=cfg.lowercase)
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
