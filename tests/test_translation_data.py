"""Tests of the translation data pipeline (lnjax.data.translation /
mt_builders) on the fixture corpora (tests/fixtures/corpora: the first lines of the real
files) and on small fake data dirs built in tmp_path.

Everything generated goes to pytest temp dirs; the real data dir is only read.
The joint SentencePiece model uses a small vocabulary (500) for speed.
"""

from __future__ import annotations

import collections
import gzip
import json
import math
import pathlib
import shutil
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from lnjax.data import DataError, paths
from lnjax.data import mt_builders
from lnjax.data.batching import bucket_len, ladder_len, plan_batches
from lnjax.data.mt_tokenizer import BOS_ID, EOS_ID, PAD_ID, MTTokenizer
from lnjax.data.translation import MTDataConfig, make_mt_data
from lnjax.core.errors import ConfigError

REPO_ROOT = pathlib.Path(__file__).resolve().parents[1]
VOCAB = 500
BATCH_KEYS = {"inputs", "inputs_mask", "targets", "decoder_inputs", "weights"}


def _lines(corpora: pathlib.Path, rel: str) -> int:
  """Lines of a fixture corpus file, counted here (not by lnjax)."""
  return len(gzip.decompress((corpora / f"{rel}.gz").read_bytes()).decode().splitlines())


def _take(it, n):
  return [next(it) for _ in range(n)]


def _assert_batches_equal(a, b):
  assert len(a) == len(b)
  for x, y in zip(a, b):
    assert x.keys() == y.keys()
    for k in x:
      np.testing.assert_array_equal(x[k], y[k])


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory, corpora) -> str:
  """A cache of the module's own whose download folder holds the fixture corpora."""
  cache = tmp_path_factory.mktemp("lnjax_mt_cache")
  shutil.copytree(corpora, cache / "downloads")
  return str(cache)


@pytest.fixture(scope="module")
def multi30k(cache_dir):
  return mt_builders.prepare("multi30k_de_en", None, cache_dir)


@pytest.fixture(scope="module")
def m30k_data(cache_dir, multi30k):
  """de->en Multi30k, vocab 500 (the SentencePiece model is trained once)."""
  return make_mt_data(MTDataConfig(cache_dir=cache_dir, vocab_size=VOCAB), seed=0)


def _fake_wmt(root: pathlib.Path, test_de: str, test_en: str, gz: bool = False) -> pathlib.Path:
  """A data dir holding only wmt14_newstest2014_de-en/newstest2014.{de,en}."""
  folder = root / "wmt14_newstest2014_de-en"
  folder.mkdir(parents=True)
  for lang, text in (("de", test_de), ("en", test_en)):
    if gz:
      (folder / f"newstest2014.{lang}.gz").write_bytes(gzip.compress(text.encode()))
    else:
      (folder / f"newstest2014.{lang}").write_text(text)
  return root


# ---------------------------------------------------------------------------
# Builders on the real files.
# ---------------------------------------------------------------------------


def test_multi30k_builder(multi30k, cache_dir, corpora):
  files = {"train": "train", "validation": "val", "test_2016_flickr": "test_2016_flickr",
           "test_2017_flickr": "test_2017_flickr", "test_2017_mscoco": "test_2017_mscoco",
           "test_2018_flickr": "test_2018_flickr"}
  expected = {split: _lines(corpora, f"multi30k/{f}.en") for split, f in files.items()}
  assert multi30k.available_splits == tuple(expected)
  for split, n in expected.items():
    assert multi30k.info.splits[split].num_examples == n
  n = expected["train"]
  de, en = mt_builders.load_split_pairs(multi30k, "train")
  assert len(de) == len(en) == n == _lines(corpora, "multi30k/train.de")
  # File order restored from 'index' (TFDS shuffles on write).
  assert de[0] == "Zwei junge weiße Männer sind im Freien in der Nähe vieler Büsche."
  assert en[0] == "Two young, White males are outside near many bushes."
  raw_en = paths.read_text(multi30k.source_files["train.en"]).split("\n")
  assert en == raw_en[:n] and raw_en[n:] == [""]
  # Generated data lives in the cache, keyed by the raw files' hash.
  assert pathlib.Path(multi30k.data_dir).is_relative_to(cache_dir)
  assert f"src-{multi30k.fingerprint}" in multi30k.data_dir
  again = mt_builders.prepare("multi30k_de_en", None, cache_dir)
  assert again.data_dir == multi30k.data_dir


def test_iwslt14_builder_without_train(cache_dir, corpora):
  b = mt_builders.prepare("iwslt14_de_en", None, cache_dir)
  assert b.available_splits == ("validation", "test")
  de, en = mt_builders.load_split_pairs(b, "validation")
  assert len(de) == len(en) == _lines(corpora, "iwslt14_de-en/fairseq_tok/valid.en") == 300
  assert (de[0], en[0]) == ("es ist diese pyramide .", "it &apos;s that pyramid .")
  assert b.info.splits["test"].num_examples == _lines(corpora, "iwslt14_de-en/fairseq_tok/test.en")

  # Asking for train: one line naming the paths searched and the fix.
  with pytest.raises(DataError) as e:
    mt_builders.load_split_pairs(b, "train")
  msg = str(e.value)
  assert "\n" not in msg
  assert "iwslt14_de-en/fairseq_tok/train.de.gz" in msg
  assert "iwslt14_de-en/fairseq_tok/train.en" in msg
  assert "prepare-iwslt14.sh" in msg and "iwslt14.tokenized.de-en/tmp/train.{de,en}" in msg
  # The pipeline cannot train its SentencePiece model without it ...
  cfg = MTDataConfig(
      name="iwslt14_de_en", cache_dir=cache_dir, vocab_size=VOCAB, test_split="test",
      lowercase=True,
  )
  with pytest.raises(DataError) as e:
    make_mt_data(cfg, seed=0)
  assert "prepare-iwslt14.sh" in str(e.value) and "data.spm_path" in str(e.value)
  assert "\n" not in str(e.value)


def test_iwslt14_eval_only_with_spm_path(cache_dir, m30k_data, tmp_path):
  """Without train, validation/test still serve eval batches (e.g. for the
  gradient analysis) given an existing SentencePiece model."""
  model = tmp_path / "sp.model"
  model.write_bytes(m30k_data.tokenizer.model_proto)
  cfg = MTDataConfig(
      name="iwslt14_de_en", cache_dir=cache_dir, spm_path=str(model),
      test_split="test", lowercase=True,
  )
  d = make_mt_data(cfg, seed=0)
  assert d.sacrebleu_tokenize == "none"
  refs = d.references("test")
  assert len(refs) == 200 and refs == d.tokenized_references("test")
  assert refs[0] == refs[0].lower()
  batches = d.eval_batches("test")
  index = np.concatenate([b["index"] for b in batches])
  assert sorted(index[index >= 0].tolist()) == list(range(200))
  with pytest.raises(DataError, match="prepare-iwslt14.sh"):
    d.train_iter()
  with pytest.raises(DataError, match="train split not found"):
    _ = d.steps_per_epoch


def test_wmt14_builder(cache_dir):
  b = mt_builders.prepare("wmt14_de_en", None, cache_dir)
  assert "test" in b.available_splits
  de, en = mt_builders.load_split_pairs(b, "test")
  assert len(de) == len(en) == 100
  assert de[0] == "Gutach: Noch mehr Sicherheit für Fußgänger"
  assert en[0] == "Gutach: Increased safety for pedestrians"


# ---------------------------------------------------------------------------
# Fake data dirs: user-supplied train, corrupt and empty files.
# ---------------------------------------------------------------------------


def test_user_supplied_train_iwslt(tmp_path, corpora):
  """train.{de,en} copied into fairseq_tok/ (here: a stand-in made of the
  valid set) becomes the train split; the pipeline runs end to end."""
  real = corpora / "iwslt14_de-en" / "fairseq_tok"
  folder = tmp_path / "data" / "iwslt14_de-en" / "fairseq_tok"
  folder.mkdir(parents=True)
  for split in ("valid", "test"):
    for lang in ("de", "en"):
      (folder / f"{split}.{lang}.gz").symlink_to(real / f"{split}.{lang}.gz")
  for lang in ("de", "en"):  # plain (not gzipped) train files, the 300 valid lines
    lines = paths.read_text(real / f"valid.{lang}.gz").split("\n")[:300]
    (folder / f"train.{lang}").write_text("\n".join(lines) + "\n")
  cfg = MTDataConfig(
      name="iwslt14_de_en", data_dir=str(tmp_path / "data"),
      cache_dir=str(tmp_path / "c"), vocab_size=VOCAB, test_split="test",
      lowercase=True, max_len=64, max_tokens=1024,
  )
  d = make_mt_data(cfg, seed=0)
  assert d.splits == ("train", "validation", "test")
  assert d.num_train_pairs + d.num_dropped_pairs == 300
  b = next(d.train_iter())
  assert b["inputs"].shape[1] <= 64 and b["inputs"].size <= 1024
  assert d.tokenizer.decode(b["inputs"][0]) == d.tokenizer.decode(b["inputs"][0]).lower()


def test_user_supplied_train_wmt14(tmp_path):
  data = _fake_wmt(tmp_path / "data", "Hallo Welt\nGuten Tag\n", "Hello world\nGood day\n", gz=True)
  folder = data / "wmt14_de-en"
  folder.mkdir()
  (folder / "train.de").write_text("".join(f"Satz {i} ist hier.\n" for i in range(200)))
  (folder / "train.en").write_text("".join(f"Sentence {i} is here.\n" for i in range(200)))
  b = mt_builders.prepare("wmt14_de_en", data, tmp_path / "c")
  assert b.available_splits == ("train", "test")
  de, en = mt_builders.load_split_pairs(b, "train")
  assert (de[7], en[7]) == ("Satz 7 ist hier.", "Sentence 7 is here.")
  cfg = MTDataConfig(
      name="wmt14_de_en", data_dir=str(data), cache_dir=str(tmp_path / "c"),
      vocab_size=40, eval_splits=("test",), test_split="test", max_tokens=256,
  )
  d = make_mt_data(cfg, seed=0)
  assert d.references("test") == ["Hello world", "Good day"]
  assert d.sources("test") == ["Hallo Welt", "Guten Tag"]
  assert sum(int(x["weights"].sum() > 0) for x in _take(d.train_iter(), d.steps_per_epoch))


@pytest.mark.parametrize("gz", [False, True])
def test_corrupt_line_pair_count(tmp_path, gz):
  data = _fake_wmt(tmp_path / "data", "a\nb\nc\n", "a\nb\n", gz=gz)
  with pytest.raises(DataError) as e:
    mt_builders.prepare("wmt14_de_en", data, tmp_path / "c")
  msg = str(e.value)
  assert "\n" not in msg and "corrupt line pair count" in msg
  folder = data / "wmt14_newstest2014_de-en"
  suffix = ".gz" if gz else ""
  assert f"{folder / 'newstest2014.de'}{suffix} has 3 lines" in msg
  assert f"{folder / 'newstest2014.en'}{suffix} has 2" in msg


@pytest.mark.parametrize("content", ["", "  \n\n \t\n"])
def test_empty_split(tmp_path, content):
  data = _fake_wmt(tmp_path / "data", "Hallo\n", content)
  with pytest.raises(DataError) as e:
    mt_builders.prepare("wmt14_de_en", data, tmp_path / "c")
  msg = str(e.value)
  assert "\n" not in msg and "empty" in msg and "newstest2014.en" in msg
  assert not (tmp_path / "c" / "tfds").exists()  # refused before writing


def test_half_supplied_train(tmp_path):
  data = _fake_wmt(tmp_path / "data", "Hallo\n", "Hello\n")
  (data / "wmt14_de-en").mkdir()
  (data / "wmt14_de-en" / "train.de").write_text("Hallo\n")
  with pytest.raises(DataError, match=r"wmt14_de-en/train\.en\.gz.*wmt14_de-en/train\.en\b"):
    mt_builders.prepare("wmt14_de_en", data, tmp_path / "c")


def test_missing_corpus(tmp_path):
  with pytest.raises(DataError) as e:
    make_mt_data(MTDataConfig(data_dir=str(tmp_path / "none"), cache_dir=str(tmp_path / "c")), 0)
  msg = str(e.value)
  assert "\n" not in msg and "raw.githubusercontent.com/multi30k/dataset/" in msg
  assert str(tmp_path / "c" / "downloads" / "multi30k") in msg and "train.de.gz" in msg


# ---------------------------------------------------------------------------
# Tokenizer.
# ---------------------------------------------------------------------------


def test_sentencepiece_roundtrip(m30k_data):
  tok = m30k_data.tokenizer
  assert tok.vocab_size == m30k_data.vocab_size == VOCAB
  assert (tok.pad_id, tok.unk_id, tok.bos_id, tok.eos_id) == (0, 1, 2, 3)
  assert (m30k_data.pad_id, m30k_data.bos_id, m30k_data.eos_id) == (0, 2, 3)
  for text in [
      "Zwei junge weiße Männer sind im Freien in der Nähe vieler Büsche.",
      "A man in an orange hat starring at something.",
      "Ein Hund läuft über die Straße, während es regnet!",
  ]:
    ids = tok.encode(text)
    assert ids.dtype == np.int32 and ids.min() > EOS_ID
    assert tok.decode(ids) == text
    with_eos = tok.encode(text, add_eos=True)
    assert with_eos[-1] == EOS_ID
    # decode skips BOS/padding and stops at the first EOS.
    assert tok.decode(np.concatenate([[BOS_ID], with_eos, [7, 8, 0, 0]])) == text
  assert tok.decode_batch([tok.encode("Ein Mann", add_eos=True)]) == ["Ein Mann"]


def test_sentencepiece_deterministic(tmp_path):
  lines = [f"der Hund {i} läuft schnell" for i in range(300)]
  lines += [f"the dog {i} runs fast" for i in range(300)]
  a = MTTokenizer.train(lines, 60)
  assert a == MTTokenizer.train(lines, 60)
  with pytest.raises(ConfigError, match="choose a smaller data.vocab_size"):
    MTTokenizer.train(lines, 5000)


def test_sentencepiece_cached_model(cache_dir, m30k_data):
  models = list((pathlib.Path(cache_dir) / "tokenizers").glob("multi30k_de_en-*_sp500_unigram.model"))
  assert len(models) == 1
  assert models[0].read_bytes() == m30k_data.tokenizer.model_proto
  # The other direction shares the joint model (not retrained).
  other = make_mt_data(
      MTDataConfig(cache_dir=cache_dir, vocab_size=VOCAB, source_lang="en", target_lang="de"), 0
  )
  assert other.tokenizer.model_proto == m30k_data.tokenizer.model_proto


def test_spm_path_with_wrong_ids(tmp_path, multi30k, corpora):
  import io
  import sentencepiece as spm

  buf = io.BytesIO()
  spm.SentencePieceTrainer.train(
      sentence_iterator=iter(["hallo welt", "hello world"] * 50), model_writer=buf,
      vocab_size=15, minloglevel=2,  # default ids: unk=0, bos=1, eos=2, no pad
  )
  (tmp_path / "bad.model").write_bytes(buf.getvalue())
  cfg = MTDataConfig(data_dir=str(corpora), cache_dir=str(tmp_path / "c"),
                     spm_path=str(tmp_path / "bad.model"))
  with pytest.raises(ConfigError, match=r"data.spm_path=.*pad/unk/bos/eos ids"):
    make_mt_data(cfg, 0)
  with pytest.raises(ConfigError, match="is not a file"):
    make_mt_data(MTDataConfig(data_dir=str(corpora), cache_dir=str(tmp_path / "c"),
                              spm_path=str(tmp_path / "no")), 0)


# ---------------------------------------------------------------------------
# Buckets.
# ---------------------------------------------------------------------------


def test_ladder_and_plan():
  assert [ladder_len(n) for n in (1, 8, 9, 15, 16, 17, 33, 57, 65, 256, 257)] == [
      8, 8, 10, 16, 16, 20, 40, 64, 80, 256, 320]
  assert bucket_len(100, 100) == 100 and bucket_len(90, 100) == 96
  assert bucket_len(101, 100) == 112  # eval-only lengths continue the ladder
  lens = np.sort(np.array([8] * 100 + [16] * 70 + [32] * 3))
  plan = plan_batches(lens, max_tokens=512, batch_multiple=4)
  # rows: 64 at length 8, 32 at 16, 16 at 32. The 36 eights left after one
  # full batch exceed a 16-batch, so they keep their own (partial) batch; the
  # 6 sixteens left join the three 32s in one batch of length 32.
  assert plan.counts.sum() == len(lens)
  assert (plan.rows * plan.lens <= 512).all() and (plan.rows % 4 == 0).all()
  assert (plan.counts <= plan.rows).all()
  assert plan.lens.tolist() == sorted(plan.lens.tolist())
  assert plan.counts.tolist() == [64, 36, 32, 32, 9]
  assert plan.lens.tolist() == [8, 8, 16, 16, 32]
  assert plan.rows.tolist() == [64, 64, 32, 32, 16]


@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 5000), per_octave=st.sampled_from([1, 2, 4, 8]))
def test_the_ladder_at_every_resolution(n, per_octave):
  """data.buckets_per_octave: the smallest length >= n on a ladder of `per_octave` equal
  steps an octave, from 8; so padding stays below one step: < n / per_octave."""
  padded = ladder_len(n, per_octave)
  assert padded >= max(n, 8)
  if n > 8:
    octave = 1 << (n.bit_length() - 1)  # The octave [octave, 2 · octave) holding n.
    assert padded % (octave // per_octave) == 0 and padded - n < octave // per_octave
  assert ladder_len(padded, per_octave) == padded  # A ladder length is its own bucket.


def test_the_octave_ladder_and_its_refusals():
  assert [ladder_len(n, 1) for n in (1, 9, 16, 17, 33, 65)] == [8, 16, 16, 32, 64, 128]
  assert [ladder_len(n, 2) for n in (9, 13, 17, 25)] == [12, 16, 24, 32]
  assert bucket_len(40, 48, 1) == 48 and bucket_len(49, 48, 1) == 64  # Capped; eval goes on.
  with pytest.raises(ConfigError, match=r"data.buckets_per_octave=3 is not one of: 1, 2, 4, 8"):
    MTDataConfig(buckets_per_octave=3)


# ---------------------------------------------------------------------------
# Train batches.
# ---------------------------------------------------------------------------


def _check_batch(b, max_tokens, batch_multiple):
  assert set(b) - {"index"} == BATCH_KEYS
  B, S = b["inputs"].shape
  assert b["targets"].shape == b["decoder_inputs"].shape == (B, S)
  assert b["inputs_mask"].shape == b["weights"].shape == (B, S)
  assert B % batch_multiple == 0 and B * S <= max_tokens
  for k in ("inputs", "targets", "decoder_inputs"):
    assert b[k].dtype == np.int32
  assert b["inputs_mask"].dtype == b["weights"].dtype == np.float32
  np.testing.assert_array_equal(b["inputs_mask"], (b["inputs"] != 0).astype(np.float32))
  np.testing.assert_array_equal(b["weights"], (b["targets"] != 0).astype(np.float32))
  # decoder_inputs = BOS + targets[:-1]
  assert (b["decoder_inputs"][:, 0] == BOS_ID).all()
  np.testing.assert_array_equal(b["decoder_inputs"][:, 1:], b["targets"][:, :-1])
  for ids, mask in ((b["inputs"], b["inputs_mask"]), (b["targets"], b["weights"])):
    n = mask.sum(1).astype(int)
    real = n > 0
    # Real rows: tokens (no EOS/BOS/PAD inside), then EOS, then padding only.
    assert (ids[real, n[real] - 1] == EOS_ID).all()
    pos = np.arange(S)[None, :]
    assert (mask == (pos < n[:, None])).all()  # masks are prefixes
    inner = pos < (n[:, None] - 1)
    # (UNK may occur: the fixture's 2,000 train pairs do not hold every test character.)
    assert not np.isin(ids[inner], (PAD_ID, BOS_ID, EOS_ID)).any()
  return B, S


def test_train_batches(m30k_data):
  d = m30k_data
  assert d.num_train_pairs + d.num_dropped_pairs == 2000  # the fixture's train pairs
  steps = d.steps_per_epoch
  epoch = _take(d.train_iter(), steps)
  shapes = set()
  rows_real = 0
  for b in epoch:
    shapes.add(_check_batch(b, 4096, 1))
    rows_real += int((b["weights"].sum(1) > 0).sum())
  # Each kept pair exactly once per epoch, few compiled shapes.
  assert rows_real == d.num_train_pairs
  assert len(shapes) == len(d.train_shapes) <= 16
  assert d.train_padding_fraction < 0.3  # 2,000 pairs fill the buckets less than 29,000
  positions = sum(b["inputs"].size + b["targets"].size for b in epoch)
  real = sum(b["inputs_mask"].sum() + b["weights"].sum() for b in epoch)
  assert 1 - real / positions == pytest.approx(d.train_padding_fraction)
  # Rows are real Multi30k pairs: a row's source decodes to a train sentence
  # whose translation is the row's target.
  de, en = d.sources("train"), d.references("train")
  pair = dict(zip(de, en))
  b = epoch[0]
  for r in range(3):
    src = d.tokenizer.decode(b["inputs"][r])
    assert d.tokenizer.decode(b["targets"][r]) == " ".join(pair[src].split())


def test_max_len_drops_long_pairs(cache_dir, m30k_data):
  d = make_mt_data(MTDataConfig(cache_dir=cache_dir, vocab_size=VOCAB, max_len=20), 0)
  src, tgt = d.pair_lengths("train")
  assert d.num_dropped_pairs == int(((src > 20) | (tgt > 20)).sum()) > 0
  for b in _take(d.train_iter(), 50):
    assert b["inputs"].shape[1] <= 20
  with pytest.raises(ConfigError, match=r"data.max_tokens=32 is too small"):
    make_mt_data(MTDataConfig(cache_dir=cache_dir, max_tokens=32, max_len=40), 0)


def test_epochs_reshuffled_and_seeded(cache_dir, m30k_data):
  d = m30k_data
  steps = d.steps_per_epoch
  it = d.train_iter()
  e1, e2 = _take(it, steps), _take(it, steps)
  sig = lambda batches: [b["inputs"][0].tobytes() for b in batches]  # noqa: E731
  assert sig(e1) != sig(e2)
  # Same seed -> same batches (fresh object); another seed -> different.
  again = make_mt_data(MTDataConfig(cache_dir=cache_dir, vocab_size=VOCAB), seed=0)
  _assert_batches_equal(_take(again.train_iter(), 3), e1[:3])
  other = make_mt_data(MTDataConfig(cache_dir=cache_dir, vocab_size=VOCAB), seed=1)
  assert sig(_take(other.train_iter(), 3)) != sig(e1[:3])


def test_resume_exact(cache_dir, m30k_data):
  cfg = MTDataConfig(cache_dir=cache_dir, vocab_size=VOCAB)
  it = make_mt_data(cfg, seed=3).train_iter()
  steps = make_mt_data(cfg, seed=3).steps_per_epoch
  _take(it, steps - 2)
  state = json.loads(json.dumps(it.get_state()))  # JSON-serializable
  expected = _take(it, 5)  # crosses the epoch boundary
  fresh = make_mt_data(cfg, seed=3).train_iter()
  fresh.set_state(state)
  _assert_batches_equal(_take(fresh, 5), expected)
  with pytest.raises(ConfigError, match="different data setup.*direction, tokenizer, lowercase"):
    make_mt_data(cfg, seed=4).train_iter().set_state(state)


def test_both_directions(cache_dir, m30k_data):
  de_en = m30k_data
  en_de = make_mt_data(
      MTDataConfig(cache_dir=cache_dir, vocab_size=VOCAB, source_lang="en", target_lang="de"), 0
  )
  assert en_de.sources("validation") == de_en.references("validation")
  assert en_de.references("validation") == de_en.sources("validation")
  a, b = de_en.eval_batches("validation")[0], en_de.eval_batches("validation")[0]
  # Same pairs (length order is symmetric), sides swapped.
  np.testing.assert_array_equal(a["index"], b["index"])
  np.testing.assert_array_equal(a["inputs"], b["targets"])
  np.testing.assert_array_equal(a["targets"], b["inputs"])
  t = next(en_de.train_iter())
  _check_batch(t, 4096, 1)
  english = set(de_en.references("train"))
  assert " ".join(en_de.tokenizer.decode(t["inputs"][0]).split()) in {
      " ".join(s.split()) for s in english}


def test_process_slices_and_batch_multiple(cache_dir, m30k_data):
  cfg = MTDataConfig(cache_dir=cache_dir, vocab_size=VOCAB)
  full = make_mt_data(cfg, seed=0, batch_multiple=4)
  parts = [make_mt_data(cfg, seed=0, process_index=i, process_count=2, batch_multiple=4)
           for i in range(2)]
  assert full.steps_per_epoch == parts[0].steps_per_epoch
  fb, pb = _take(full.train_iter(), 4), [_take(p.train_iter(), 4) for p in parts]
  for step in range(4):
    _check_batch(fb[step], 4096, 4)
    for k in fb[step]:
      np.testing.assert_array_equal(
          np.concatenate([pb[0][step][k], pb[1][step][k]]), fb[step][k])
  fe, pe = full.eval_batches("validation"), [p.eval_batches("validation") for p in parts]
  for step in range(len(fe)):
    for k in fe[step]:
      np.testing.assert_array_equal(np.concatenate([pe[0][step][k], pe[1][step][k]]), fe[step][k])
  with pytest.raises(ConfigError, match="batch_multiple=3 must be a positive multiple"):
    make_mt_data(cfg, seed=0, process_index=0, process_count=2, batch_multiple=3)


# ---------------------------------------------------------------------------
# Eval batches and references.
# ---------------------------------------------------------------------------


def test_eval_batches(m30k_data):
  d = m30k_data
  batches = d.eval_batches("test_2016_flickr")
  _assert_batches_equal(batches, d.eval_batches("test_2016_flickr"))  # cached
  srcs, refs = d.sources("test_2016_flickr"), d.references("test_2016_flickr")
  assert len(refs) == 100 and refs[0] == "A man in an orange hat starring at something."
  seen = []
  for b in batches:
    assert set(b) == BATCH_KEYS | {"index"} and b["index"].dtype == np.int32
    _check_batch(b, 4096, 1)
    pad = b["index"] < 0
    assert (b["weights"][pad] == 0).all() and (b["inputs_mask"][pad] == 0).all()
    for r in np.flatnonzero(~pad)[:5]:
      i = b["index"][r]
      assert d.tokenizer.decode(b["inputs"][r]) == " ".join(srcs[i].split())
      assert d.tokenizer.decode(b["targets"][r]) == " ".join(refs[i].split())
    seen += b["index"][~pad].tolist()
  assert sorted(seen) == list(range(100))
  assert d.sacrebleu_tokenize == "13a"
  assert d.tokenized_references("test_2016_flickr")[0] == (
      "A man in an orange hat starring at something .")


def test_unigram_baseline(m30k_data):
  """The held-out loss of a decoder that knows only the train targets' token frequencies,
  counted here from the sentences themselves (EOS once per sentence, add-one smoothing)."""
  d = m30k_data
  train = [d.tokenizer.encode(s).tolist() + [d.eos_id] for s in d.references("train")]
  held = [d.tokenizer.encode(s).tolist() + [d.eos_id] for s in d.references("validation")]
  counts = collections.Counter(t for s in train for t in s)
  total = sum(counts.values()) + d.vocab_size
  expected = -np.mean([math.log((counts[t] + 1) / total) for s in held for t in s])
  assert d.unigram_entropy == pytest.approx(expected, rel=1e-9)
  assert 3.0 < d.unigram_entropy < math.log(d.vocab_size)


# ---------------------------------------------------------------------------
# Config validation.
# ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kw, message",
    [
        ({"name": "wmt16"}, "data.name='wmt16' is not one of: multi30k_de_en, iwslt14_de_en, wmt14_de_en"),
        ({"source_lang": "fr"}, "data.source_lang='fr' is not one of: de, en"),
        ({"target_lang": "de"}, "data.target_lang='de' must differ from data.source_lang='de'"),
        ({"max_tokens": 0}, "data.max_tokens=0 is invalid: must be an integer >= 8"),
        ({"max_len": True}, "data.max_len=True is invalid"),
        ({"vocab_size": 8}, "data.vocab_size=8 is invalid"),
        ({"sp_model_type": "word"}, "data.sp_model_type='word' is not one of: unigram, bpe"),
        ({"eval_splits": "validation"}, "data.eval_splits='validation' must be a non-empty tuple"),
        ({"eval_splits": ("valid",)}, "data.eval_splits=('valid',): 'valid' is not one of: train,"),
        ({"name": "iwslt14_de_en"}, "data.test_split='test_2016_flickr' is not one of: train, validation, test"),
        ({"lowercase": "yes"}, "data.lowercase='yes' is invalid"),
        ({"spm_path": ""}, "data.spm_path=''"),
    ],
)
def test_config_validation(kw, message):
  with pytest.raises(ConfigError) as e:
    MTDataConfig(**kw)
  assert str(e.value).startswith(message)
  assert "\n" not in str(e.value)


def test_config_lists_and_unknown_key():
  from lnjax.configs import common as config_lib

  cfg = MTDataConfig(eval_splits=["validation", "test_2017_mscoco"])
  assert cfg.eval_splits == ("validation", "test_2017_mscoco")
  with pytest.raises(ConfigError, match=r"unknown config key data\.maxlen; valid keys: "):
    config_lib.from_config(MTDataConfig, "data", {"maxlen": 3})
  cfg = MTDataConfig(name="wmt14_de_en", eval_splits=("test",), test_split="test")
  assert cfg.test_split == "test"


# ---------------------------------------------------------------------------
# No TensorFlow.
# ---------------------------------------------------------------------------


@pytest.mark.slow
def test_no_tensorflow_import(cache_dir, m30k_data):
  code = textwrap.dedent(f"""
      import sys
      from lnjax.data.translation import MTDataConfig, make_mt_data
      d = make_mt_data(MTDataConfig(cache_dir={cache_dir!r}, vocab_size={VOCAB}), seed=0)
      next(d.train_iter()); d.eval_batches('validation'); d.tokenized_references('validation')
      assert 'tensorflow' not in sys.modules, 'tensorflow was imported'
      print('ok')
  """)
  out = subprocess.run(
      [sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, timeout=120,
  )
  assert out.returncode == 0, out.stderr
  assert out.stdout.strip() == "ok"
  assert "tensorflow" not in sys.modules


@pytest.mark.slow
def test_two_processes_preparing_a_corpus_at_once_both_read_it(tmp_path, corpora):
  """The first use of a corpus by two processes at once (two hosts of a run, two test
  workers): the one that waited on the lock reopens the prepared data set with its splits."""
  shutil.copytree(corpora, tmp_path / "downloads")
  code = ("import sys; from lnjax.data import mt_builders as m; "
          f"b = m.prepare('multi30k_de_en', None, {str(tmp_path)!r}); "
          "print(len(m.load_split_pairs(b, 'train')[0]))")
  procs = [subprocess.Popen([sys.executable, "-c", code], cwd=REPO_ROOT, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE) for _ in range(2)]
  outs = [p.communicate(timeout=300) for p in procs]
  assert [p.returncode for p in procs] == [0, 0], [err[-1500:] for _, err in outs]
  train_lines = _lines(corpora, "multi30k/train.de")
  assert [int(out.split()[-1]) for out, _ in outs] == [train_lines] * 2
