"""lnjax data: raw-text LM corpora -> TFDS array_record -> tokens -> grain.

Public API:
  LMDataConfig   the validated ``config.data`` block
  make_lm_data   (cfg, seed, process_index=0, process_count=1) -> LMData
  LMData         tokenizer, vocab_size, train_iter(), eval_batches(),
                 unigram_entropy, eval_tokens
  DataError      missing/empty corpus (one-line message with paths and fix)
  resolve_data_dir / resolve_cache_dir   where corpora are read / data written
"""

from lnjax.data.paths import DataError, resolve_cache_dir, resolve_data_dir
from lnjax.data.pipeline import LMData, LMDataConfig, make_lm_data

__all__ = [
    "DataError",
    "LMData",
    "LMDataConfig",
    "make_lm_data",
    "resolve_cache_dir",
    "resolve_data_dir",
]

# Translation (parallel corpora -> joint SentencePiece -> token-budgeted,
# length-bucketed batches): see lnjax.data.translation.
from lnjax.data.mt_tokenizer import MTTokenizer
from lnjax.data.translation import MTData, MTDataConfig, make_mt_data

__all__ += ["MTData", "MTDataConfig", "MTTokenizer", "make_mt_data"]
