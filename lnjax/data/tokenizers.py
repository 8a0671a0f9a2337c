"""Tokenizers for the LM pipeline: characters and SentencePiece.

Common interface: ``vocab_size``, ``pad_id`` (always 0), ``encode(str) ->
np.ndarray[int32]``, ``encode_batch(list[str]) -> list[np.ndarray]``,
``decode(ids) -> str`` and ``cache_key`` (a string that changes whenever the
token ids would, used to name cached token arrays).

Both reserve id 0 for padding and id 1 for unknown input, so padded targets
(id 0) never collide with real text.
"""

from __future__ import annotations

import hashlib
import io
import os
import pathlib
import tempfile
from typing import Callable, Sequence

import numpy as np

from lnjax.core import errors
from lnjax.data import paths

PAD_ID = 0
UNK_ID = 1
TOKENIZER_KINDS = ("char", "sentencepiece")
SP_MODEL_TYPES = ("unigram", "bpe")


def _atomic_write_bytes(path: pathlib.Path, data: bytes) -> None:
  """Writes via a temp file in the same dir + rename, so a concurrent reader
  sees either no file or the complete file, never a partial one."""
  path.parent.mkdir(parents=True, exist_ok=True)
  fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".tmp")
  try:
    with os.fdopen(fd, "wb") as f:
      f.write(data)
    os.chmod(tmp, 0o644)  # mkstemp makes 0600; the cache may be shared
    os.replace(tmp, path)
  except BaseException:
    if os.path.exists(tmp):
      os.unlink(tmp)
    raise


class CharTokenizer:
  """One id per character of the training text.

  ids: 0 = padding, 1 = unknown char (one unseen in train), 2.. = the train
  split's distinct characters in code-point order.
  """

  pad_id = PAD_ID
  unk_id = UNK_ID

  def __init__(self, chars: Sequence[str]):
    chars = sorted(set(chars))
    if not all(len(c) == 1 for c in chars):
      raise ValueError("CharTokenizer needs single characters")
    self.chars = "".join(chars)
    # Sorted code points: encoding is one vectorised searchsorted.
    self._codepoints = np.array([ord(c) for c in chars], dtype=np.uint32)
    self.vocab_size = len(chars) + 2
    digest = hashlib.sha256(self.chars.encode("utf-8")).hexdigest()[:8]
    self.cache_key = f"char-{digest}"

  @classmethod
  def from_text(cls, text: str) -> "CharTokenizer":
    return cls(set(text))

  def encode(self, text: str) -> np.ndarray:
    # UTF-32 gives one uint32 code point per character, no Python loop.
    codepoints_N = np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32)
    if not len(self._codepoints):
      return np.full(codepoints_N.shape, UNK_ID, np.int32)
    pos_N = np.searchsorted(self._codepoints, codepoints_N)
    pos_N = np.minimum(pos_N, len(self._codepoints) - 1)
    known_N = self._codepoints[pos_N] == codepoints_N
    return np.where(known_N, pos_N + 2, UNK_ID).astype(np.int32)

  def encode_batch(self, texts: Sequence[str]) -> list[np.ndarray]:
    return [self.encode(t) for t in texts]

  def decode(self, ids) -> str:
    out = []
    for i in np.asarray(ids).reshape(-1).tolist():
      if i == PAD_ID:
        continue
      out.append(self.chars[i - 2] if 2 <= i < self.vocab_size else "\ufffd")
    return "".join(out)


def train_sentencepiece(lines: Sequence[str], vocab_size: int, model_type: str,
                        **options) -> bytes:
  """A SentencePiece model trained on ``lines``, serialized; ``options`` are the
  caller's special ids and whitespace handling. Deterministic: one thread, every line
  used in order, no sampling or shuffling (multi-threaded unigram training depends on
  the thread count). A vocabulary too large for the corpus is a one-line ConfigError."""
  import sentencepiece as spm

  if model_type not in SP_MODEL_TYPES:
    raise ValueError(
        f"sentencepiece model_type={model_type!r} is not one of: {', '.join(SP_MODEL_TYPES)}")
  n_chars = len(set().union(*map(set, lines))) if lines else 0
  model = io.BytesIO()
  try:
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(lines),
        model_writer=model,
        model_type=model_type,
        vocab_size=vocab_size,
        # Cover every character when the alphabet is small next to the vocabulary
        # (Shakespeare: 65, Multi30k: ~100); otherwise SentencePiece's default for
        # large alphabets, leaving the rarest characters as <unk>.
        character_coverage=1.0 if n_chars <= vocab_size // 2 else 0.9995,
        # No NFKC, so decoded text compares with the raw text.
        normalization_rule_name="identity",
        num_threads=1,
        input_sentence_size=0,  # use all lines
        shuffle_input_sentence=False,
        minloglevel=2,  # silence the trainer's progress log
        **options,
    )
  except RuntimeError as e:
    # e.g. "Vocabulary size is too high (16384). Please set it to a value <= 11000."
    raise errors.ConfigError(
        f"sentencepiece training failed for data.vocab_size={vocab_size}"
        f" ({str(e).strip().splitlines()[-1]}); choose a smaller data.vocab_size"
    ) from e
  return model.getvalue()


class SentencePieceTokenizer:
  """A trained SentencePiece model (unigram or BPE).

  ids: 0 = <pad>, 1 = <unk>, 2 = the newline symbol, then learned pieces. No
  BOS/EOS: the LM stream is plain concatenated text.
  """

  pad_id = PAD_ID
  unk_id = UNK_ID

  def __init__(self, model_proto: bytes):
    import sentencepiece as spm

    self.model_proto = model_proto
    self._sp = spm.SentencePieceProcessor(model_proto=model_proto)
    self.vocab_size = int(self._sp.get_piece_size())
    assert self._sp.pad_id() == PAD_ID and self._sp.unk_id() == UNK_ID
    digest = hashlib.sha256(model_proto).hexdigest()[:8]
    self.cache_key = f"sp{self.vocab_size}-{digest}"

  @classmethod
  def load(cls, path: str | os.PathLike) -> "SentencePieceTokenizer":
    return cls(pathlib.Path(path).read_bytes())

  @staticmethod
  def train(
      train_text: str, vocab_size: int, model_type: str = "unigram"
  ) -> bytes:
    """Trains on ``train_text`` (one sentence per non-blank line) and returns
    the serialized model (`train_sentencepiece`)."""
    lines = [line for line in train_text.split("\n") if line.strip()]
    return train_sentencepiece(
        lines, vocab_size, model_type,
        # Keep the text verbatim so decode(encode(x)) == x: no whitespace squeezing,
        # no dummy leading space.
        remove_extra_whitespaces=False,
        add_dummy_prefix=False,
        # Lines are trained separately; "\n" is a reserved piece so whole
        # multi-line documents can be encoded.
        user_defined_symbols=["\n"],
        pad_id=PAD_ID,
        unk_id=UNK_ID,
        bos_id=-1,
        eos_id=-1,
        max_sentence_length=1 << 16,  # wikitext paragraphs exceed 4192 B
    )

  def encode(self, text: str) -> np.ndarray:
    return np.asarray(self._sp.encode(text), dtype=np.int32)

  def encode_batch(self, texts: Sequence[str]) -> list[np.ndarray]:
    # One call for many documents: SentencePiece encodes them in parallel
    # in C++, far faster than a Python loop over documents.
    return [np.asarray(ids, dtype=np.int32) for ids in self._sp.encode(list(texts))]

  def decode(self, ids) -> str:
    ids = [i for i in np.asarray(ids).reshape(-1).tolist() if i != PAD_ID]
    return self._sp.decode(ids)


Tokenizer = CharTokenizer | SentencePieceTokenizer


def sentencepiece_model_path(
    cache_dir: pathlib.Path, dataset: str, vocab_size: int, model_type: str
) -> pathlib.Path:
  return cache_dir / "tokenizers" / f"{dataset}_sp{vocab_size}_{model_type}.model"


def chars_path(cache_dir: str | os.PathLike | None, stem: str,
               text_field: str = "text") -> pathlib.Path:
  """Where a character tokenizer's characters are cached (``make_tokenizer``'s
  ``chars_file``): beside the token arrays, named by the corpus's ``stem`` (its name and
  fingerprint) and the field of the train split they come from."""
  return paths.resolve_cache_dir(cache_dir) / "tokens" / f"{stem}-train-{text_field}-chars.txt"


def make_tokenizer(
    kind: str,
    dataset: str,
    vocab_size: int,
    train_text: str | Callable[[], str],
    cache_dir: str | os.PathLike | None,
    model_type: str = "unigram",
    chars_file: pathlib.Path | None = None,
) -> Tokenizer:
  """Builds the tokenizer of ``kind`` from the train split's text (or a function
  giving it, called only when the tokenizer is not cached).

  SentencePiece models are cached at
  ``<cache>/tokenizers/<dataset>_sp<vocab>_<type>.model`` and reused when
  present; ``vocab_size`` and ``model_type`` only apply to SentencePiece. A
  character tokenizer's characters are cached in ``chars_file`` when given (its
  name must change with the text).
  """
  text = train_text if callable(train_text) else lambda: train_text
  if kind == "char":
    if chars_file is None:
      return CharTokenizer.from_text(text())
    if not chars_file.exists():
      _atomic_write_bytes(chars_file, CharTokenizer.from_text(text()).chars.encode("utf-8"))
    return CharTokenizer(chars_file.read_bytes().decode("utf-8"))
  if kind != "sentencepiece":
    raise ValueError(
        f"tokenizer {kind!r} is not one of: {', '.join(TOKENIZER_KINDS)}"
    )
  cache = paths.resolve_cache_dir(cache_dir)
  model_path = sentencepiece_model_path(cache, dataset, vocab_size, model_type)
  if not model_path.exists():
    # Lock so that processes sharing the cache train once; the others wait
    # and load the result.
    with paths.file_lock(model_path.with_name(model_path.name + ".lock")):
      if not model_path.exists():
        proto = SentencePieceTokenizer.train(text(), vocab_size, model_type)
        _atomic_write_bytes(model_path, proto)
  return SentencePieceTokenizer.load(model_path)


def encode_documents_cached(
    tokenizer: Tokenizer,
    docs: Callable[[], Sequence[str]],
    cache_path: pathlib.Path | None,
) -> np.ndarray:
  """Tokenizes the documents ``docs()`` gives and concatenates them into one int32
  stream (``docs`` is not called when the cache holds them).

  With ``cache_path`` the result is stored there as .npy (atomically) and read
  back on later calls; the caller puts everything that affects the ids
  (corpus fingerprint, split, ``tokenizer.cache_key``) in the file name.
  """
  if cache_path is not None and cache_path.exists():
    return np.load(cache_path)
  pieces = tokenizer.encode_batch(docs())
  tokens_N = (
      np.concatenate(pieces).astype(np.int32, copy=False)
      if pieces
      else np.zeros((0,), np.int32)
  )
  if cache_path is not None:
    buf = io.BytesIO()
    np.save(buf, tokens_N)
    _atomic_write_bytes(cache_path, buf.getvalue())
  return tokens_N
