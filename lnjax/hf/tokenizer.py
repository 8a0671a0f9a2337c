"""Tokenizers of Hugging Face model folders, with the `tokenizers` package (Hugging Face's
own Rust implementation, not transformers):

  load(folder)     the folder's tokenizer: tokenizer.json, or else GPT-2's vocab.json +
                   merges.txt (byte-level BPE) or BERT's vocab.txt (WordPiece, with the
                   lower-casing of its tokenizer_config.json); special tokens added as the
                   model's own tokenizer adds them ([CLS] ... [SEP] for BERT)
  write(...)       an lnjax run's character or SentencePiece (unigram) vocabulary as
                   tokenizer.json + tokenizer_config.json, which AutoTokenizer loads
"""

import json
import os

import numpy as np

from lnjax.hf.weights import HFError

TOKENIZER_FILE, TOKENIZER_CONFIG = "tokenizer.json", "tokenizer_config.json"
TOKENIZER_FILES = (TOKENIZER_FILE, "vocab.json", "vocab.txt")  # (load's three kinds)


class HFTokenizer:
  """encode(text) -> int32 ids, as the Hugging Face tokenizer of the folder gives them."""

  def __init__(self, tokenizer, config: dict):
    self._tok = tokenizer
    self.vocab_size = tokenizer.get_vocab_size(with_added_tokens=True)
    token_id = lambda key, default: tokenizer.token_to_id(_token(config.get(key)) or default)
    self.pad_id = token_id("pad_token", "[PAD]")
    self.mask_id = token_id("mask_token", "[MASK]")
    self.cls_id = token_id("cls_token", "[CLS]")
    self.sep_id = token_id("sep_token", "[SEP]")

  def encode(self, text: str, add_special_tokens: bool = True) -> np.ndarray:
    return np.asarray(self._tok.encode(text, add_special_tokens=add_special_tokens).ids,
                      np.int32)

  def decode(self, ids) -> str:
    return self._tok.decode([int(i) for i in np.asarray(ids).reshape(-1)])


def _token(value):
  """A special token as tokenizer_config.json writes it: a string or {'content': ...}."""
  return value.get("content") if isinstance(value, dict) else value


def load(folder: str) -> HFTokenizer:
  import tokenizers

  config_path = os.path.join(folder, TOKENIZER_CONFIG)
  config = {}
  if os.path.isfile(config_path):
    try:
      with open(config_path, encoding="utf-8") as f:
        config = json.load(f)
    except (OSError, UnicodeDecodeError, ValueError) as e:
      raise HFError(f"{config_path} is not readable JSON ({e})") from None
  path = lambda name: os.path.join(folder, name)
  try:
    if os.path.isfile(path(TOKENIZER_FILE)):
      tok = tokenizers.Tokenizer.from_file(path(TOKENIZER_FILE))
    elif os.path.isfile(path("vocab.json")) and os.path.isfile(path("merges.txt")):
      tok = tokenizers.ByteLevelBPETokenizer(path("vocab.json"), path("merges.txt"),
                                             add_prefix_space=config.get("add_prefix_space", False))
    elif os.path.isfile(path("vocab.txt")):
      tok = tokenizers.BertWordPieceTokenizer(
          path("vocab.txt"), lowercase=config.get("do_lower_case", True),
          strip_accents=config.get("strip_accents"),
          handle_chinese_chars=config.get("tokenize_chinese_chars", True))
    else:
      raise HFError(f"{folder} has no tokenizer: none of {TOKENIZER_FILE}, vocab.json + "
                    "merges.txt, vocab.txt")
  except HFError:
    raise
  except Exception as e:  # tokenizers raises a bare Exception for a malformed file.
    raise HFError(f"the tokenizer in {folder} is unreadable ({str(e).splitlines()[0][:160]})") from None
  return HFTokenizer(tok, config)


def char_tokenizer(chars: str):
  """lnjax's CharTokenizer (0 <pad>, 1 <unk>, then `chars` in order): one token per
  character."""
  import tokenizers
  from tokenizers import Regex, decoders, models, pre_tokenizers

  vocab = {"<pad>": 0, "<unk>": 1, **{c: i + 2 for i, c in enumerate(chars)}}
  tok = tokenizers.Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
  tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
  tok.decoder = decoders.Fuse()
  return tok


def sentencepiece_tokenizer(model_proto: bytes):
  """lnjax's SentencePiece unigram model (data/tokenizers.py: identity normalization, no
  dummy prefix, whitespace kept, '\n' a user-defined piece, 0 <pad>, 1 <unk>) as a
  tokenizers Unigram over the same pieces, scores and ids."""
  import sentencepiece as spm
  import tokenizers
  from tokenizers import AddedToken, decoders, models, pre_tokenizers

  sp = spm.SentencePieceProcessor(model_proto=model_proto)
  vocab = [(sp.id_to_piece(i), sp.get_score(i)) for i in range(sp.get_piece_size())]
  tok = tokenizers.Tokenizer(models.Unigram(vocab, sp.unk_id(), False))
  # Words split before each space, the space written '▁' (SentencePiece's
  # split_by_whitespace), with no '▁' added in front of the text (add_dummy_prefix=False).
  tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="never")
  tok.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="never")
  tok.add_tokens([AddedToken("\n", normalized=False, special=False)])
  return tok


def write(output: str, tok, max_len: int, bert: bool = False) -> None:
  """`tok` as tokenizer.json + tokenizer_config.json; `bert`: with lnjax's BERT ids
  (lnjax.data.mlm.BertVocab: [CLS], [SEP], [MASK] after the text vocabulary) and
  [CLS] text [SEP] added, as BERT's tokenizer adds them."""
  from tokenizers import processors

  special = {"pad_token": "<pad>", "unk_token": "<unk>"}
  if bert:
    n = tok.get_vocab_size(with_added_tokens=True)
    tok.add_special_tokens(["[CLS]", "[SEP]", "[MASK]"])
    if tok.token_to_id("[CLS]") != n or tok.token_to_id("[MASK]") != n + 2:
      raise HFError("the vocabulary already holds [CLS], [SEP] or [MASK]: not lnjax's BERT ids")
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", n), ("[SEP]", n + 1)])
    special.update(cls_token="[CLS]", sep_token="[SEP]", mask_token="[MASK]")
  tok.add_special_tokens(["<pad>"])
  _save(output, tok, special, max_len)


def _save(output: str, tok, special: dict, max_len: int) -> None:
  os.makedirs(output, exist_ok=True)
  tok.save(os.path.join(output, TOKENIZER_FILE))
  config = {"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": max_len,
            "clean_up_tokenization_spaces": False, **special}
  with open(os.path.join(output, TOKENIZER_CONFIG), "w", encoding="utf-8") as f:
    f.write(json.dumps(config, indent=2, sort_keys=True) + "\n")
