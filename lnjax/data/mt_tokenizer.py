"""The translation tokenizer: a joint SentencePiece model with <pad> <unk> <s> </s>."""

from __future__ import annotations

import logging
import os
import pathlib
from typing import Sequence

import numpy as np

from lnjax.core import errors
from lnjax.data import tokenizers

_log = logging.getLogger(__name__)

PAD_ID, UNK_ID, BOS_ID, EOS_ID = 0, 1, 2, 3
# SentencePiece trains on at most this many lines (an evenly spaced subset of
# the train de+en lines beyond it): WMT14's 9M lines would take hours single-
# threaded, and 1M lines give practically the same vocabulary.
SP_MAX_TRAIN_LINES = 1_000_000


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
    target lines together) and returns it serialized (`tokenizers.train_sentencepiece`;
    an evenly spaced `SP_MAX_TRAIN_LINES` of them beyond that many)."""
    lines = [line for line in lines if line.strip()]
    if len(lines) > SP_MAX_TRAIN_LINES:
      keep = np.linspace(0, len(lines) - 1, SP_MAX_TRAIN_LINES).astype(np.int64)
      lines = [lines[i] for i in keep]
    return tokenizers.train_sentencepiece(
        lines, vocab_size, model_type,
        # decode(encode(x)) gives x back up to runs of spaces, so detokenized output
        # compares with the raw references. The dummy prefix makes a sentence's first
        # word the same piece as mid-sentence (standard for MT; decode removes it again).
        add_dummy_prefix=True,
        remove_extra_whitespaces=True,
        pad_id=PAD_ID,
        unk_id=UNK_ID,
        bos_id=BOS_ID,
        eos_id=EOS_ID,
    )

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
