"""The ``config.data`` sections, one dataclass per kind of data, each field checked on
construction with `lnjax.core.errors`' checks (a refused value is one line naming
``data.<field>``). A ConfigDict section maps onto its dataclass with
`lnjax.configs.common.from_config`.
"""

from __future__ import annotations

import dataclasses
import math

from lnjax.core import errors
from lnjax.data import batching
from lnjax.data import builders
from lnjax.data import mt_builders
from lnjax.data import sources
from lnjax.data import tokenizers

MAX_VOCAB = 1 << 20
LM_DATASETS = tuple(builders.BUILDERS)  # tiny_shakespeare, wikitext2_raw
MT_DATASETS = tuple(mt_builders.MT_BUILDERS)  # multi30k_de_en, iwslt14_de_en, wmt14_de_en
LANGS = mt_builders.LANGS  # ('de', 'en')


def _check_source(cfg, builtin) -> None:
  """The keys every data section has: where the data come from."""
  sources.check_name(cfg.name, "data.name", builtin)
  for key in ("data_dir", "cache_dir", "mirror"):
    errors.check_path(f"data.{key}", getattr(cfg, key))


@dataclasses.dataclass(frozen=True)
class LMDataConfig:
  """The ``config.data`` block. Every field is validated on construction."""

  name: str = "tiny_shakespeare"  # 'tiny_shakespeare' | 'wikitext2_raw' | 'tfds:NAME[/CONFIG]' | 'hf:PATH[:CONFIG]'
  data_dir: str | None = None  # raw corpora; None -> LNJAX_DATA_DIR -> embedded/downloaded
  cache_dir: str | None = None  # prepared data; None -> env -> ~/.cache/lnjax
  mirror: str | None = None  # replaces the download URLs' base; None -> LNJAX_DATA_MIRROR
  tfds_data_dir: str | None = None  # tfds: names; None -> TFDS_DATA_DIR -> ~/tensorflow_datasets
  text_field: str = "text"  # tfds:/hf: names: the feature holding the text
  tokenizer: str = "char"  # 'char' | 'sentencepiece'
  vocab_size: int = 4096  # sentencepiece only
  seq_len: int = 128
  batch_size: int = 32  # global batch, over all processes
  eval_split: str = "validation"
  eval_batches: int = 16  # 0 = the whole eval split
  sp_model_type: str = "unigram"  # sentencepiece only: 'unigram' | 'bpe'

  def __post_init__(self):
    _check_source(self, LM_DATASETS)
    errors.check_path("data.tfds_data_dir", self.tfds_data_dir)
    errors.check_choice("data.tokenizer", self.tokenizer, tokenizers.TOKENIZER_KINDS)
    errors.check_int("data.vocab_size", self.vocab_size, 16, MAX_VOCAB)
    errors.check_int("data.seq_len", self.seq_len, 1)
    errors.check_int("data.batch_size", self.batch_size, 1)
    if not sources.is_external(self.name):  # (tfds:/hf: splits are checked on opening)
      errors.check_choice("data.eval_split", self.eval_split, builders.SPLITS[self.name])
    errors.check_int("data.eval_batches", self.eval_batches, 0)
    errors.check_choice("data.sp_model_type", self.sp_model_type, tokenizers.SP_MODEL_TYPES)


@dataclasses.dataclass(frozen=True)
class MTDataConfig:
  """The ``config.data`` block of a translation run. Every field is validated
  on construction (`errors.ConfigError` naming ``data.<field>``)."""

  name: str = "multi30k_de_en"  # multi30k_de_en | iwslt14_de_en | wmt14_de_en
  source_lang: str = "de"  # de | en (either direction)
  target_lang: str = "en"  # de | en, not source_lang
  data_dir: str | None = None  # raw corpora; None -> LNJAX_DATA_DIR -> the package, downloads
  cache_dir: str | None = None  # prepared data; None -> env -> ~/.cache/lnjax
  mirror: str | None = None  # replaces the download URLs' base; None -> LNJAX_DATA_MIRROR
  tfds_data_dir: str | None = None  # tfds: names; None -> TFDS_DATA_DIR -> ~/tensorflow_datasets
  text_field: str = ""  # tfds:/hf: names: "" = features named de/en; else nested under it
  vocab_size: int = 8000  # joint SentencePiece on train de+en (ignored with spm_path)
  sp_model_type: str = "unigram"  # unigram | bpe
  spm_path: str | None = None  # use this SentencePiece model instead of training
  max_tokens: int = 4096  # padded tokens per global batch and side (fairseq --max-tokens)
  max_len: int = 256  # drop training pairs longer (either side, tokens incl. EOS)
  buckets_per_octave: int = batching.PER_OCTAVE  # length buckets an octave: 1, 2, 4 or 8
  eval_splits: tuple[str, ...] = ("validation",)  # Held-out loss on the first; BLEU (decode.bleu_split).
  test_split: str = "test_2016_flickr"  # What `--mode=predict` decodes by default.
  lowercase: bool = False  # lowercase all text (iwslt14's text already is)

  def __post_init__(self):
    _check_source(self, MT_DATASETS)
    errors.check_path("data.tfds_data_dir", self.tfds_data_dir)
    if not isinstance(self.text_field, str):
      raise errors.ConfigError(f"data.text_field={self.text_field!r} must be a string")
    errors.check_choice("data.source_lang", self.source_lang, LANGS)
    errors.check_choice("data.target_lang", self.target_lang, LANGS)
    if self.source_lang == self.target_lang:
      raise errors.ConfigError(f"data.target_lang={self.target_lang!r} must differ from "
                               f"data.source_lang={self.source_lang!r}")
    errors.check_int("data.vocab_size", self.vocab_size, 16, MAX_VOCAB)
    errors.check_choice("data.sp_model_type", self.sp_model_type, tokenizers.SP_MODEL_TYPES)
    errors.check_path("data.spm_path", self.spm_path)
    errors.check_int("data.max_tokens", self.max_tokens, batching.MIN_BUCKET_LEN)
    errors.check_int("data.max_len", self.max_len, 2)
    errors.check_choice("data.buckets_per_octave", self.buckets_per_octave,
                        batching.PER_OCTAVE_CHOICES)
    # tfds:/hf: splits are checked on opening the data set.
    splits = None if sources.is_external(self.name) else mt_builders.MT_SPLITS[self.name]
    names = ", ".join(splits or ())
    # A list (from a command line or YAML) is fine; a bare string is the classic
    # mistake ('validation' would iterate as characters).
    # The held-out loss is the first split's; none at all is refused.
    if not isinstance(self.eval_splits, (list, tuple)) or not self.eval_splits:
      raise errors.ConfigError(f"data.eval_splits={self.eval_splits!r} must be a non-empty "
                               f"tuple of split names from: {names}")
    object.__setattr__(self, "eval_splits", tuple(self.eval_splits))
    for split in self.eval_splits:
      if splits is not None and split not in splits:
        raise errors.ConfigError(f"data.eval_splits={self.eval_splits!r}: {split!r} is not one "
                                 f"of: {names} (splits of {self.name})")
    if splits is not None and self.test_split not in splits:
      raise errors.ConfigError(f"data.test_split={self.test_split!r} is not one of: {names} "
                               f"(splits of {self.name})")
    errors.check_bool("data.lowercase", self.lowercase)


@dataclasses.dataclass(frozen=True)
class MLMDataConfig:
  """The ``config.data`` block of a BERT pre-training run."""

  name: str = "wikitext2_raw"  # tiny_shakespeare | wikitext2_raw
  data_dir: str | None = None  # raw corpora; None -> LNJAX_DATA_DIR -> the package, downloads
  cache_dir: str | None = None  # prepared data; None -> env -> ~/.cache/lnjax
  mirror: str | None = None  # replaces the download URLs' base; None -> LNJAX_DATA_MIRROR
  tokenizer: str = "sentencepiece"  # char | sentencepiece
  vocab_size: int = 8000  # sentencepiece only (the specials come on top)
  sp_model_type: str = "unigram"  # unigram | bpe
  seq_len: int = 128  # L: tokens per instance, [CLS] and [SEP]s included
  batch_size: int = 32  # global batch, over all processes
  eval_split: str = "validation"
  eval_batches: int = 16  # held-out batches per evaluation; 0 = every full batch
  mask_rate: float = 0.15  # fraction of tokens predicted
  short_seq_prob: float = 0.1  # instances with a shorter random target length

  def __post_init__(self):
    _check_source(self, LM_DATASETS)
    errors.check_choice("data.tokenizer", self.tokenizer, tokenizers.TOKENIZER_KINDS)
    errors.check_choice("data.sp_model_type", self.sp_model_type, tokenizers.SP_MODEL_TYPES)
    if not sources.is_external(self.name):
      errors.check_choice("data.eval_split", self.eval_split, builders.SPLITS[self.name])
    errors.check_int("data.vocab_size", self.vocab_size, 16)
    errors.check_int("data.seq_len", self.seq_len, 8)
    errors.check_int("data.batch_size", self.batch_size, 1)
    errors.check_int("data.eval_batches", self.eval_batches, 0)
    errors.check_range("data.mask_rate", self.mask_rate, low=0.0, high=1.0, low_open=True)
    errors.check_range("data.short_seq_prob", self.short_seq_prob, low=0.0, high=1.0)

  @property
  def max_predictions(self) -> int:
    """P: prediction slots per sequence (BERT: 20 for 128 tokens)."""
    return math.ceil(self.mask_rate * self.seq_len)
