"""Tests of lnjax.data on the real corpora (skipped only when absent).

Everything generated goes to pytest temp dirs; the real data dir is only read.
"""

from __future__ import annotations

import gzip
import json
import math
import pathlib
import re
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from lnjax.data import (
    DataError,
    LMDataConfig,
    make_lm_data,
    resolve_cache_dir,
    resolve_data_dir,
)
from lnjax.data import builders, paths, tokenizers

REPO_ROOT = pathlib.Path(__file__).resolve().parents[1]


# ---------------------------------------------------------------------------
# Fixtures: the packaged corpus, the fixture corpora, a cache shared by the module.
# ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory) -> str:
  return str(tmp_path_factory.mktemp("lnjax_cache"))


@pytest.fixture(scope="module")
def shakespeare(cache_dir):
  return builders.prepare("tiny_shakespeare", None, cache_dir)


@pytest.fixture(scope="module")
def wikitext(cache_dir, corpora):
  return builders.prepare("wikitext2_raw", corpora, cache_dir)


def _cfg(cache_dir, **kw) -> LMDataConfig:
  return LMDataConfig(cache_dir=cache_dir, **kw)


def _take(it, n):
  return [next(it) for _ in range(n)]


def _assert_batches_equal(a, b):
  assert len(a) == len(b)
  for x, y in zip(a, b):
    assert x.keys() == y.keys()
    for k in x:
      np.testing.assert_array_equal(x[k], y[k])


# ---------------------------------------------------------------------------
# Paths.
# ---------------------------------------------------------------------------


def test_resolve_dirs_order(tmp_path, monkeypatch):
  monkeypatch.setenv("LNJAX_DATA_DIR", str(tmp_path / "env_data"))
  monkeypatch.setenv("LNJAX_CACHE_DIR", str(tmp_path / "env_cache"))
  assert resolve_data_dir(str(tmp_path / "cfg")) == tmp_path / "cfg"
  assert resolve_data_dir(None) == tmp_path / "env_data"
  assert resolve_cache_dir(str(tmp_path / "c")) == tmp_path / "c"
  assert resolve_cache_dir(None) == tmp_path / "env_cache"
  assert (tmp_path / "env_cache").is_dir()  # created on demand

  monkeypatch.delenv("LNJAX_DATA_DIR")
  monkeypatch.delenv("LNJAX_CACHE_DIR")
  monkeypatch.setenv("HOME", str(tmp_path / "home"))
  assert resolve_cache_dir(None) == tmp_path / "home" / ".cache" / "lnjax"
  # Default: the embedded corpora only; a corpus folder beside the cwd (the layout earlier
  # versions searched) changes nothing.
  monkeypatch.chdir(tmp_path)
  sibling = tmp_path.parent / "shared"
  (sibling / "data" / "multi30k").mkdir(parents=True, exist_ok=True)
  assert paths.data_dir_candidates(None) == [paths.EMBEDDED_DIR]
  assert resolve_data_dir(None) == paths.EMBEDDED_DIR


# ---------------------------------------------------------------------------
# Document splitting and builders.
# ---------------------------------------------------------------------------


def test_split_paragraphs_roundtrip():
  text = "A:\nhi\n\nB:\nho\nhum\n\n\nC:\nx\n"
  docs = builders.split_paragraphs(text)
  assert docs == ["A:\nhi\n\n", "B:\nho\nhum\n\n\n", "C:\nx\n"]
  assert "".join(docs) == text


def test_split_articles_roundtrip():
  text = (
      " \n = One = \n \n Body one .\n \n = = Sub = = \n \n More .\n"
      " \n = Two = \n \n Body two .\n"
  )
  docs = builders.split_articles(text)
  assert "".join(docs) == text
  assert len(docs) == 2
  assert docs[0].startswith(" \n = One = \n") and "= = Sub = =" in docs[0]
  assert docs[1].startswith(" \n = Two = \n")


def test_shakespeare_builder(shakespeare, cache_dir):
  raw = paths.read_text(shakespeare.source_files["input.txt"])
  assert len(raw) == 1_115_394
  train = builders.load_split_texts(shakespeare, "train")
  valid = builders.load_split_texts(shakespeare, "validation")
  assert len(train) > 1000 and len(valid) > 100
  # Sorted by index, the examples give back the text exactly.
  assert "".join(train) + "".join(valid) == raw
  frac = len("".join(train)) / len(raw)
  assert 0.899 < frac < 0.901
  assert "".join(train).endswith("\n")  # cut at a line boundary
  info = shakespeare.info
  assert set(info.splits.keys()) == {"train", "validation"}
  assert info.splits["train"].num_examples == len(train)
  # The raw data dir is untouched: files live in the cache.
  assert pathlib.Path(shakespeare.data_dir).is_relative_to(cache_dir)


def test_wikitext_builder(wikitext):
  for split, fname in builders.Wikitext2Raw.SPLIT_FILES.items():
    docs = builders.load_split_texts(wikitext, split)
    text = paths.read_text(wikitext.source_files[fname])
    # As many documents as top-level headings after a blank line, counted on the text.
    assert len(docs) == len(re.findall(r"(?:^|\n) \n = (?!=)", text)) > 10
    assert "".join(docs) == text
    # One article per example, each starting with its top-level heading.
    assert all(d.startswith(" \n = ") and not d.startswith(" \n = =") for d in docs)


def test_builder_cache_reused(shakespeare, cache_dir):
  again = builders.prepare("tiny_shakespeare", None, cache_dir)
  assert again.data_dir == shakespeare.data_dir
  assert again.fingerprint == shakespeare.fingerprint


# ---------------------------------------------------------------------------
# Tokenizers.
# ---------------------------------------------------------------------------


def test_char_tokenizer_roundtrip(shakespeare):
  train = "".join(builders.load_split_texts(shakespeare, "train"))
  valid = "".join(builders.load_split_texts(shakespeare, "validation"))
  tok = tokenizers.make_tokenizer("char", "tiny_shakespeare", 0, train, None)
  assert tok.vocab_size == len(set(train)) + 2 and tok.pad_id == 0
  ids = tok.encode(valid)
  assert ids.dtype == np.int32 and len(ids) == len(valid)
  assert ids.min() >= 1 and ids.max() < tok.vocab_size
  assert tok.decode(ids) == valid
  # Unknown characters -> id 1; padding decodes to nothing.
  assert tok.encode("a\u20ac")[1] == tokenizers.UNK_ID
  assert tok.decode(np.array([0, *tok.encode("hi"), 0])) == "hi"


def test_char_tokenizer_cached_in_its_chars_file(tmp_path):
  """With a chars_file, the characters are kept there and the text is not asked for again;
  another file (another corpus, split or text field) gets the characters of its own text."""
  asked = []

  def text(t):
    return lambda: asked.append(t) or t
  first = tokenizers.make_tokenizer("char", "x", 0, text("b\u00e9a\n"), None,
                                    chars_file=tmp_path / "one.txt")
  again = tokenizers.make_tokenizer("char", "x", 0, text("zz"), None,
                                    chars_file=tmp_path / "one.txt")
  other = tokenizers.make_tokenizer("char", "x", 0, text("zz"), None,
                                    chars_file=tmp_path / "two.txt")
  assert asked == ["b\u00e9a\n", "zz"]
  assert first.chars == again.chars == tokenizers.CharTokenizer.from_text("b\u00e9a\n").chars
  assert first.cache_key == again.cache_key != other.cache_key and other.chars == "z"


def test_a_prepared_corpus_is_not_read_again(cache_dir, shakespeare, monkeypatch):
  """Once its tokens and characters are cached, the LM data reads no document of the corpus
  (a quarter of a second of every run for tiny_shakespeare) and are the same."""
  before = make_lm_data(_cfg(cache_dir, seq_len=64, batch_size=8), seed=0)
  monkeypatch.setattr(builders, "load_split_texts", lambda *a: pytest.fail("read again"))
  after = make_lm_data(_cfg(cache_dir, seq_len=64, batch_size=8), seed=0)
  assert after.tokenizer.chars == before.tokenizer.chars
  np.testing.assert_array_equal(after.train_tokens_N, before.train_tokens_N)
  np.testing.assert_array_equal(after.eval_tokens_N, before.eval_tokens_N)


def test_unknown_tokenizer_kind():
  with pytest.raises(ValueError, match="char, sentencepiece"):
    tokenizers.make_tokenizer("bpe", "x", 256, "abc", None)


@pytest.mark.slow
def test_sentencepiece_deterministic(shakespeare, tmp_path):
  """Two trainings on the same text give the same model and ids; the ids decode to the exact
  text; a cached model is reused. (Trained on the train split's first 200,000 characters,
  which hold every character of the 20,000 validation characters encoded: 0.7 s of trainer
  CPU time against 2.8 s on the whole split.)"""
  train = "".join(builders.load_split_texts(shakespeare, "train"))[:200_000]
  valid = "".join(builders.load_split_texts(shakespeare, "validation"))[:20000]
  assert set(valid) <= set(train)
  toks, models = [], []
  for run in ("a", "b"):
    tok = tokenizers.make_tokenizer(
        "sentencepiece", "tiny_shakespeare", 256, train, tmp_path / run
    )
    path = tmp_path / run / "tokenizers" / "tiny_shakespeare_sp256_unigram.model"
    assert path.is_file()
    toks.append(tok)
    models.append(path.read_bytes())
  assert models[0] == models[1]
  a, b = toks[0].encode(valid), toks[1].encode(valid)
  np.testing.assert_array_equal(a, b)
  assert toks[0].vocab_size == 256 and a.dtype == np.int32
  assert toks[0].decode(a) == valid  # identity normalization: exact text
  # A cached model is reused, not retrained (the text is not even read).
  again = tokenizers.make_tokenizer(
      "sentencepiece", "tiny_shakespeare", 256, "", tmp_path / "a"
  )
  assert again.model_proto == models[0]


# ---------------------------------------------------------------------------
# Config validation.
# ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kw, message",
    [
        ({"tokenizer": "bpe"}, "data.tokenizer='bpe' is not one of: char, sentencepiece"),
        ({"name": "ptb"}, "data.name='ptb' is not one of: tiny_shakespeare, wikitext2_raw"),
        ({"seq_len": 0}, "data.seq_len=0 is invalid: must be an integer >= 1"),
        ({"batch_size": True}, "data.batch_size=True is invalid"),
        ({"vocab_size": 8}, "data.vocab_size=8 is invalid: must be an integer in [16,"),
        ({"eval_batches": -1}, "data.eval_batches=-1 is invalid"),
        ({"eval_split": "test"}, "data.eval_split='test' is not one of: train, validation"),
        ({"sp_model_type": "word"}, "data.sp_model_type='word' is not one of: unigram, bpe"),
        ({"data_dir": ""}, "data.data_dir=''"),
    ],
)
def test_config_validation(kw, message):
  with pytest.raises(ValueError) as e:
    LMDataConfig(**kw)
  assert str(e.value).startswith(message)
  assert "\n" not in str(e.value)


def test_config_unknown_key():
  from lnjax.configs import common as config_lib
  with pytest.raises(ValueError, match=r"unknown config key data\.seqlen; valid keys: "):
    config_lib.from_config(LMDataConfig, "data", {"seqlen": 3})
  assert config_lib.from_config(LMDataConfig, "data", {"seq_len": 3}).seq_len == 3
  # wikitext has a test split.
  assert LMDataConfig(name="wikitext2_raw", eval_split="test").eval_split == "test"


def test_batch_not_divisible_by_processes(cache_dir, shakespeare):
  with pytest.raises(ValueError, match="data.batch_size=6 is not divisible"):
    make_lm_data(_cfg(cache_dir, batch_size=6), seed=0, process_index=0, process_count=4)


# ---------------------------------------------------------------------------
# Pipeline.
# ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def char_data(cache_dir, shakespeare):
  return make_lm_data(_cfg(cache_dir, seq_len=64, batch_size=8), seed=0)


def test_train_batches(char_data):
  d, L, B = char_data, 64, 8
  it = d.train_iter()
  windows = {
      d.train_tokens_N[i * (L + 1) : (i + 1) * (L + 1)].tobytes()
      for i in range(len(d.train_tokens_N) // (L + 1))
  }
  for batch in _take(it, 5):
    assert set(batch) == {"inputs", "targets", "weights"}
    assert batch["inputs"].shape == batch["targets"].shape == (B, L)
    assert batch["inputs"].dtype == batch["targets"].dtype == np.int32
    assert batch["weights"].dtype == np.float32 and (batch["weights"] == 1).all()
    # Targets are the inputs shifted by one ...
    np.testing.assert_array_equal(batch["inputs"][:, 1:], batch["targets"][:, :-1])
    # ... and every row is one of the non-overlapping seq_len+1 windows.
    for x, y in zip(batch["inputs"], batch["targets"]):
      assert np.concatenate([x, y[-1:]]).tobytes() in windows
  assert d.vocab_size == d.tokenizer.vocab_size == 67


def test_train_epochs_reshuffled(cache_dir, shakespeare):
  # Long windows -> short epoch: 1003856 // 2049 = 489 windows, 7 batches of 64.
  L, B = 2048, 64
  d = make_lm_data(_cfg(cache_dir, seq_len=L, batch_size=B), seed=1)
  per_epoch = d.num_train_windows // B
  assert per_epoch == 7
  index = {
      d.train_tokens_N[i * (L + 1) : (i + 1) * (L + 1)].tobytes(): i
      for i in range(d.num_train_windows)
  }

  def window_ids(batches):
    return [
        index[np.concatenate([x, y[-1:]]).tobytes()]
        for b in batches
        for x, y in zip(b["inputs"], b["targets"])
    ]

  it = d.train_iter()
  epoch1, epoch2 = window_ids(_take(it, per_epoch)), window_ids(_take(it, per_epoch))
  assert len(set(epoch1)) == len(epoch1) == per_epoch * B  # no repeats in an epoch
  assert len(set(epoch2)) == len(epoch2)
  assert epoch1 != epoch2  # each epoch is a new permutation
  assert epoch1 != sorted(epoch1)  # and it is shuffled


def test_seed_determinism(cache_dir, char_data):
  a = _take(char_data.train_iter(), 4)
  b = _take(make_lm_data(_cfg(cache_dir, seq_len=64, batch_size=8), seed=0).train_iter(), 4)
  c = _take(make_lm_data(_cfg(cache_dir, seq_len=64, batch_size=8), seed=1).train_iter(), 4)
  _assert_batches_equal(a, b)
  assert not np.array_equal(a[0]["inputs"], c[0]["inputs"])
  # Any int seed is accepted (folded into grain's 32-bit range).
  big = make_lm_data(_cfg(cache_dir, seq_len=64, batch_size=8), seed=2**40 + 1)
  assert next(big.train_iter())["inputs"].shape == (8, 64)


def test_process_slices(cache_dir, char_data):
  cfg = _cfg(cache_dir, seq_len=64, batch_size=8)
  procs = [make_lm_data(cfg, seed=0, process_index=i, process_count=2) for i in range(2)]
  assert all(p.local_batch_size == 4 for p in procs)
  full = _take(char_data.train_iter(), 3)
  parts = [_take(p.train_iter(), 3) for p in procs]
  for step in range(3):
    for k in full[step]:
      got = np.concatenate([parts[0][step][k], parts[1][step][k]])
      np.testing.assert_array_equal(got, full[step][k])
  # Same for eval batches.
  full_eval = char_data.eval_batches()
  eval_parts = [p.eval_batches() for p in procs]
  for step in range(len(full_eval)):
    for k in full_eval[step]:
      got = np.concatenate([eval_parts[0][step][k], eval_parts[1][step][k]])
      np.testing.assert_array_equal(got, full_eval[step][k])


def test_resume_exact(cache_dir, shakespeare):
  # Epoch of 489 // 64 = 7 batches: 5 + 6 crosses an epoch boundary.
  cfg = _cfg(cache_dir, seq_len=2048, batch_size=64)
  it = make_lm_data(cfg, seed=3).train_iter()
  _take(it, 5)
  state = json.loads(json.dumps(it.get_state()))  # JSON-serializable
  expected = _take(it, 6)
  fresh = make_lm_data(cfg, seed=3).train_iter()
  fresh.set_state(state)
  _assert_batches_equal(_take(fresh, 6), expected)
  # A state from another setup (seed) is refused instead of silently wrong.
  other = make_lm_data(cfg, seed=4).train_iter()
  with pytest.raises(ValueError, match="different data setup.*seq_len, batch_size and seed must"):
    other.set_state(state)


def test_eval_batches(cache_dir, char_data):
  d = char_data
  batches = d.eval_batches()
  assert len(batches) == 16  # data.eval_batches
  _assert_batches_equal(batches, d.eval_batches())  # same every call
  # The first batch is the first windows of the validation stream, in order.
  L1 = 65
  np.testing.assert_array_equal(
      batches[0]["inputs"][0], d.eval_tokens_N[:64]
  )
  np.testing.assert_array_equal(
      batches[0]["targets"][1], d.eval_tokens_N[L1 + 1 : 2 * L1]
  )
  assert d.eval_tokens == 16 * 8 * 64

  # Whole split: the last batch is padded, and weights count real targets.
  whole = make_lm_data(_cfg(cache_dir, seq_len=64, batch_size=8, eval_batches=0), seed=0)
  batches = whole.eval_batches()
  n = len(whole.eval_tokens_N)
  window_lens = [min(L1, n - s) for s in range(0, n, L1)]
  window_lens = [w for w in window_lens if w >= 2]  # 1 token: no target
  assert len(batches) == math.ceil(len(window_lens) / 8)
  assert whole.eval_tokens == sum(w - 1 for w in window_lens)
  assert sum(b["weights"].sum() for b in batches) == whole.eval_tokens
  last = batches[-1]
  assert last["weights"].dtype == np.float32 and last["weights"][-1].sum() == 0
  assert (last["targets"][last["weights"] == 0] == 0).all()  # pad_id targets
  for b in batches:
    assert b["inputs"].shape == b["targets"].shape == b["weights"].shape == (8, 64)


def test_unigram_entropy(cache_dir, char_data):
  d = char_data
  assert 0 < d.unigram_entropy < math.log(d.vocab_size)
  # Recompute from scratch on the evaluated targets.
  counts = np.bincount(d.train_tokens_N, minlength=d.vocab_size) + 1.0
  logp = np.log(counts / counts.sum())
  targets = np.concatenate([b["targets"][b["weights"] > 0] for b in d.eval_batches()])
  assert len(targets) == d.eval_tokens
  assert d.unigram_entropy == pytest.approx(-logp[targets].mean(), rel=1e-9)


def test_sentencepiece_pipeline_wikitext(tmp_path, corpora):
  # BPE trains in ~1 s on wikitext; the tokens are cached as .npy.
  cfg = LMDataConfig(
      name="wikitext2_raw", tokenizer="sentencepiece", vocab_size=512,
      sp_model_type="bpe", data_dir=str(corpora), cache_dir=str(tmp_path), seq_len=32, batch_size=4,
      eval_split="test", eval_batches=2,
  )
  d = make_lm_data(cfg, seed=0)
  assert d.vocab_size == 512
  assert (tmp_path / "tokenizers" / "wikitext2_raw_sp512_bpe.model").is_file()
  cached = sorted(p.name for p in (tmp_path / "tokens").glob("*.npy"))
  assert len(cached) == 2 and any("-train-" in p for p in cached)
  assert any("-test-" in p for p in cached)
  b = next(d.train_iter())
  assert b["inputs"].shape == (4, 32) and b["inputs"].max() < 512
  # Second run reads the cached tokens: identical stream.
  d2 = make_lm_data(cfg, seed=0)
  np.testing.assert_array_equal(d2.train_tokens_N, d.train_tokens_N)
  assert 0 < d.unigram_entropy < math.log(512)
  text = d.tokenizer.decode(d.eval_tokens_N[:200])
  assert text.startswith(" \n = Robert Boulter = \n")


# ---------------------------------------------------------------------------
# Missing, empty and plain-text corpora.
# ---------------------------------------------------------------------------


def test_missing_corpus(tmp_path):
  data = tmp_path / "nodata"
  with pytest.raises(DataError) as e:
    make_lm_data(LMDataConfig(data_dir=str(data), cache_dir=str(tmp_path / "c")), 0)
  msg = str(e.value)
  assert "\n" not in msg
  # The folders searched, the URL it comes from, and where to put it (downloads are off
  # in the tests: conftest sets LNJAX_DATA_OFFLINE).
  assert str(data) in msg and "tiny_shakespeare" in msg
  assert "https://raw.githubusercontent.com/karpathy/char-rnn/" in msg
  assert str(tmp_path / "c" / "downloads" / "tiny_shakespeare") in msg
  assert not (tmp_path / "c" / "tfds").exists()  # failed before writing

  with pytest.raises(DataError, match=r"wikitext-2-raw.*train\.txt.*train_9\.txt"):
    make_lm_data(LMDataConfig(name="wikitext2_raw", data_dir=str(data),
                              cache_dir=str(tmp_path / "c")), 0)


def test_missing_corpus_env(tmp_path, monkeypatch):
  monkeypatch.setenv("LNJAX_DATA_DIR", str(tmp_path / "envdata"))
  with pytest.raises(DataError, match="envdata"):
    make_lm_data(LMDataConfig(cache_dir=str(tmp_path / "c")), 0)


@pytest.mark.parametrize("content", [b"", b"  \n\n \t\n"])
@pytest.mark.parametrize("gz", [True, False])
def test_empty_corpus(tmp_path, content, gz):
  folder = tmp_path / "data" / "tiny_shakespeare"
  folder.mkdir(parents=True)
  path = folder / ("input.txt.gz" if gz else "input.txt")
  path.write_bytes(gzip.compress(content) if gz and content else content)
  cfg = LMDataConfig(data_dir=str(tmp_path / "data"), cache_dir=str(tmp_path / "c"))
  with pytest.raises(DataError) as e:
    make_lm_data(cfg, 0)
  msg = str(e.value)
  assert str(path) in msg and "empty" in msg and "github.com/karpathy" in msg
  assert "\n" not in msg


def test_plain_text_corpus(tmp_path):
  # A small plain (not gzipped) input.txt in a custom data dir works.
  folder = tmp_path / "data" / "tiny_shakespeare"
  folder.mkdir(parents=True)
  speech = "".join(f"SPEAKER{i % 7}:\nline {i} of the play, said well.\n\n" for i in range(400))
  (folder / "input.txt").write_text(speech)
  cfg = LMDataConfig(
      data_dir=str(tmp_path / "data"), cache_dir=str(tmp_path / "c"),
      seq_len=16, batch_size=4,
  )
  d = make_lm_data(cfg, seed=0)
  assert d.tokenizer.decode(np.concatenate([d.train_tokens_N, d.eval_tokens_N])) == speech
  assert next(d.train_iter())["inputs"].shape == (4, 16)


# ---------------------------------------------------------------------------
# No TensorFlow.
# ---------------------------------------------------------------------------


@pytest.mark.slow
def test_no_tensorflow_import(cache_dir, shakespeare):
  # In a fresh interpreter: the whole path (TFDS build + read, tokenizer,
  # grain) must not pull in TensorFlow.
  code = textwrap.dedent(f"""
      import sys
      from lnjax.data import LMDataConfig, make_lm_data
      d = make_lm_data(LMDataConfig(cache_dir={cache_dir!r}), seed=0)
      next(d.train_iter()); d.eval_batches()
      assert 'tensorflow' not in sys.modules, 'tensorflow was imported'
      print('ok')
  """)
  out = subprocess.run(
      [sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True,
      timeout=120,
  )
  assert out.returncode == 0, out.stderr
  assert out.stdout.strip() == "ok"
  assert "tensorflow" not in sys.modules
