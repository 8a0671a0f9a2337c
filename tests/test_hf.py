"""Hugging Face GPT-2 and BERT folders imported into lnjax's own models, and lnjax models
exported as such folders (lnjax/hf.py, lnjax/hf_tokenizer.py, lnjax/hf_analyze.py).

No network: small models with random weights are built from transformers' own config
classes, saved with save_pretrained beside a tokenizer trained here (byte-level BPE for
GPT-2, WordPiece for BERT) on the embedded Tiny Shakespeare, and compared with
transformers on the same padded batch.
"""

import gzip
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from lnjax import hf, hf_tokenizer

CORPUS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                      "lnjax", "data", "corpora", "tiny_shakespeare", "input.txt.gz")
TEXTS = ["First Citizen:\nBefore we proceed any further, hear me speak.",
         "All:\nSpeak, speak.",
         "You are all resolved rather to die than to famish?",
         "Ünïcode ☃ and an unseen word: zyzzyva"]


def corpus_lines(n: int = 400) -> list[str]:
  with gzip.open(CORPUS, "rt", encoding="utf-8") as f:
    text = f.read(40_000)
  return [line for line in text.split("\n") if line.strip()][:n]


def _randomize(model, seed: int) -> None:
  """Every weight random (LayerNorm γ, β and the biases too, which transformers
  initializes to 1 and 0: a mapping that dropped them would still agree)."""
  import torch

  gen = torch.Generator().manual_seed(seed)
  with torch.no_grad():
    for p in model.parameters():
      p.copy_(torch.randn(p.shape, generator=gen) * 0.2)


def make_gpt2(folder, tie: bool = True, seed: int = 0):
  import transformers
  from tokenizers import ByteLevelBPETokenizer

  bpe = ByteLevelBPETokenizer()
  bpe.train_from_iterator(corpus_lines(), vocab_size=300, min_frequency=2,
                          special_tokens=["<|endoftext|>"], show_progress=False)
  os.makedirs(folder, exist_ok=True)
  bpe.save_model(str(folder))  # vocab.json, merges.txt: as the hub's gpt2
  tok = transformers.GPT2Tokenizer.from_pretrained(folder)
  tok.save_pretrained(folder)
  config = transformers.GPT2Config(vocab_size=len(tok), n_positions=64, n_embd=32, n_layer=2,
                                   n_head=4, tie_word_embeddings=tie, bos_token_id=0,
                                   eos_token_id=0)
  model = transformers.GPT2LMHeadModel(config).eval()
  _randomize(model, seed)
  model.save_pretrained(folder)
  return model


def make_bert(folder, masked_lm: bool = True, seed: int = 1):
  import transformers
  from tokenizers import BertWordPieceTokenizer

  wp = BertWordPieceTokenizer(lowercase=True)
  wp.train_from_iterator(corpus_lines(), vocab_size=250, min_frequency=2, show_progress=False)
  os.makedirs(folder, exist_ok=True)
  wp.save_model(str(folder))  # vocab.txt: [PAD] 0, [UNK], [CLS], [SEP], [MASK], ...
  tok = transformers.BertTokenizer.from_pretrained(folder)
  tok.save_pretrained(folder)
  config = transformers.BertConfig(vocab_size=len(tok), hidden_size=32, num_hidden_layers=2,
                                   num_attention_heads=4, intermediate_size=64,
                                   max_position_embeddings=64)
  cls = transformers.BertForMaskedLM if masked_lm else transformers.BertModel
  model = cls(config).eval()
  _randomize(model, seed)
  model.save_pretrained(folder)
  return model


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
  root = tmp_path_factory.mktemp("hf")
  models = {"gpt2": make_gpt2(root / "gpt2"), "bert": make_bert(root / "bert"),
            "bert_base": make_bert(root / "bert_base", masked_lm=False)}
  return root, models


def _hf_batch(folder, padding_side: str):
  import transformers

  tok = transformers.AutoTokenizer.from_pretrained(folder)
  if tok.pad_token is None:
    tok.pad_token = tok.eos_token
  tok.padding_side = padding_side
  return tok, tok(TEXTS, padding=True, return_tensors="np")


@pytest.mark.slow
@pytest.mark.parametrize("name,padding_side", [("gpt2", "right"), ("gpt2", "left"),
                                               ("bert", "right"), ("bert_base", "right")])
def test_imported_logits_equal_transformers_on_a_padded_batch(folders, name, padding_side):
  import torch

  root, models = folders
  tok, batch = _hf_batch(root / name, padding_side)
  with torch.no_grad():
    out = models[name](input_ids=torch.tensor(batch["input_ids"]),
                       attention_mask=torch.tensor(batch["attention_mask"]))
  expected = (out.logits if hasattr(out, "logits") else out.last_hidden_state).numpy()
  imported = hf.read_folder(str(root / name))
  assert imported.cfg.norm_position == ("pre" if name == "gpt2" else "post")
  got = np.asarray(hf.logits(imported, batch["input_ids"], batch["attention_mask"]))
  real = batch["attention_mask"].astype(bool)
  assert got.shape == expected.shape
  assert (batch["attention_mask"] == 0).any()  # The batch is padded.
  np.testing.assert_allclose(got[real], expected[real], atol=1e-4, rtol=0)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["gpt2", "bert"])
def test_token_ids_equal_the_hugging_face_tokenizer(folders, name):
  import transformers

  root, _ = folders
  theirs = transformers.AutoTokenizer.from_pretrained(root / name)
  ours = hf_tokenizer.load(str(root / name))
  for text in TEXTS + corpus_lines(40):
    assert ours.encode(text).tolist() == theirs(text)["input_ids"], text
  if name == "bert":
    assert ours.mask_id == theirs.mask_token_id and ours.pad_id == theirs.pad_token_id
    os.remove(root / name / "tokenizer.json")  # vocab.txt alone: the same ids
    ours = hf_tokenizer.load(str(root / name))
    for text in TEXTS:
      assert ours.encode(text).tolist() == theirs(text)["input_ids"], text


# ---- lnjax -> Hugging Face (lnjax.export --format=hf)


def _trained(workdir, config):
  from lnjax import train

  config.train.num_steps = config.train.eval_every_steps = config.train.checkpoint_every_steps = 2
  train.train_and_evaluate(config, str(workdir))
  return str(workdir)


def _lm_config(**model):
  from test_train import smoke_config

  return smoke_config(**{f"model.{k}": v for k, v in model.items()})


def _bert_config(**model):
  from test_bert import bert_smoke_config

  c = bert_smoke_config()
  c.model.embed_norm = True
  for k, v in model.items():
    c.model[k] = v
  return c


EXPORTS = {
    # lnjax's default LM: ReLU, untied output, √D-scaled embedding (written untied).
    "lm_default": lambda: _lm_config(),
    # Tied and unscaled: GPT-2's own layout, tanh-GELU.
    "lm_tied_gelu": lambda: _lm_config(tie_embeddings=True, scale_embeddings=False,
                                       activation="gelu"),
    # BERT (mlm_nsp, Post-LN, tied, √D-scaled): BertForMaskedLM with the NSP head left out.
    "bert": lambda: _bert_config(),
}


@pytest.mark.slow
@pytest.mark.parametrize("name", list(EXPORTS))
def test_exported_folder_gives_the_same_logits_in_transformers(tmp_path, name):
  import torch
  import transformers

  from lnjax import averaging, export

  workdir = _trained(tmp_path / "run", EXPORTS[name]())
  out = str(tmp_path / "hf")
  result = export.export(workdir, out, "latest", "float32", "hf")
  assert {"config.json", "model.safetensors", "tokenizer.json"} <= set(result["files"])
  bert = name == "bert"
  auto = transformers.AutoModelForMaskedLM if bert else transformers.AutoModelForCausalLM
  theirs = auto.from_pretrained(out).eval()
  tok = transformers.AutoTokenizer.from_pretrained(out)
  texts = ["First Citizen:\nBefore we", "All:\nSpeak, speak."]  # (max_len 32)
  batch = tok(texts, padding=True, return_tensors="np")
  chosen = averaging.restore(workdir, "latest")
  run = chosen.restored.run
  chars = run.task.make_data(run.data, run.seed, 0, 1, 1).tokenizer
  for text, ids in zip(texts, batch["input_ids"]):  # The run's character ids, as lnjax's.
    expected = chars.encode(text).tolist()
    if bert:
      expected = [len(chars.chars) + 2] + expected + [len(chars.chars) + 3]
    assert ids[: len(expected)].tolist() == expected
  with torch.no_grad():
    want = theirs(input_ids=torch.tensor(batch["input_ids"]),
                  attention_mask=torch.tensor(batch["attention_mask"])).logits.numpy()
  imported = hf.Imported(out, "", "mlm" if bert else "lm", run.model,
                         hf.make_model("mlm" if bert else "lm", run.model), chosen.params, {})
  got = np.asarray(hf.logits(imported, batch["input_ids"], batch["attention_mask"]))
  real = batch["attention_mask"].astype(bool)
  np.testing.assert_allclose(got[real], want[real], atol=1e-4, rtol=0)
