"""BERT: masking statistics, pair packing, the classification head, every norm placement,
a smoke pre-training run whose loss falls, a smoke fine-tuning run, the GLUE reader."""

import gzip
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lnjax import checkpoint, config_lib, finetune, metrics, train
from lnjax.data import glue, mlm, paths, tokenizers
from lnjax.models import ModelConfig
from lnjax.models.bert import BertClassifier, BertEncoder, BertPretraining
from lnjax.models.placement import NORM_POSITIONS

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def char_vocab(num_chars: int = 200) -> mlm.BertVocab:
  """A vocabulary of `num_chars` regular ids (2 .. num_chars+1) plus the specials."""
  return mlm.BertVocab(tokenizers.CharTokenizer([chr(0x100 + i) for i in range(num_chars)]))


def test_masking_rates_and_special_tokens():
  vocab = char_vocab()
  rng = np.random.default_rng(0)
  b, length = 2048, 64
  tokens = rng.integers(2, vocab.text_vocab_size, (b, length)).astype(np.int32)
  used = rng.integers(20, length + 1, b)  # Real lengths; the rest is padding.
  tokens[np.arange(length)[None, :] >= used[:, None]] = tokenizers.PAD_ID
  tokens[:, 0] = vocab.cls_id
  tokens[np.arange(b), used // 2] = vocab.sep_id
  tokens[np.arange(b), used - 1] = vocab.sep_id
  special = (tokens == tokenizers.PAD_ID) | (tokens >= vocab.text_vocab_size)
  p = mlm.MLMDataConfig(seq_len=length).max_predictions

  batch = mlm.mask_tokens(tokens, np.random.default_rng(1), vocab, 0.15, p)
  rows = np.nonzero(batch["weights"])[0]
  positions = batch["mlm_positions"][batch["weights"] > 0]
  assert not special[rows, positions].any()  # Never [CLS], [SEP] or padding.
  np.testing.assert_array_equal(batch["targets"][batch["weights"] > 0], tokens[rows, positions])
  assert len(set(zip(rows.tolist(), positions.tolist()))) == len(rows)  # No slot twice.
  # Inputs differ from the tokens only at chosen positions.
  changed = batch["inputs"] != tokens
  changed[rows, positions] = False
  assert not changed.any()

  assert len(rows) / (~special).sum() == pytest.approx(0.15, abs=0.005)
  replaced = batch["inputs"][rows, positions]
  original = tokens[rows, positions]
  assert (replaced == vocab.mask_id).mean() == pytest.approx(0.8, abs=0.01)
  random_ = (replaced != vocab.mask_id) & (replaced != original)
  assert random_.mean() == pytest.approx(0.1 * (1 - 1 / 200), abs=0.01)
  assert (replaced == original).mean() == pytest.approx(0.1, abs=0.01)
  assert replaced[random_].min() >= mlm.FIRST_REGULAR_ID
  assert replaced[random_].max() < vocab.text_vocab_size

  again = mlm.mask_tokens(tokens, np.random.default_rng(1), vocab, 0.15, p)
  for key in batch:  # Deterministic given the generator's seed.
    np.testing.assert_array_equal(batch[key], again[key])


def test_packing_lengths_segments_and_separators():
  vocab = char_vocab()
  rng = np.random.default_rng(0)
  # Token t = 2 + 10·document + (sentence % 10): which document a token came from.
  docs = [[np.full(rng.integers(3, 12), 2 + 10 * d + s % 10, np.int32)
           for s in range(rng.integers(1, 30))] for d in range(15)]
  seq_len = 40
  pairs = mlm.make_pairs(docs, seq_len, np.random.default_rng(1), next_sentence=True,
                         short_seq_prob=0.1)
  labels = np.array([label for _, _, label in pairs])
  assert 0.3 < labels.mean() < 0.7
  arrays = mlm.pair_arrays(vocab, pairs, seq_len)
  for n, (a, b, label) in enumerate(pairs):
    assert 1 <= len(a) and 1 <= len(b) and len(a) + len(b) <= seq_len - 3
    same_doc = (a[0] - 2) // 10 == (b[0] - 2) // 10
    assert same_doc == (label == 0)
    assert len(set((a - 2) // 10)) == 1  # A is a run of sentences of one document.
    tokens, segments = vocab.pair(a, b, seq_len)
    np.testing.assert_array_equal(arrays["tokens"][n], tokens)
    np.testing.assert_array_equal(arrays["segments"][n], segments)
    assert arrays["nsp_labels"][n] == label
    sep = np.nonzero(tokens == vocab.sep_id)[0].tolist()
    assert tokens[0] == vocab.cls_id and sep == [len(a) + 1, len(a) + len(b) + 2]
    np.testing.assert_array_equal(tokens[1 : len(a) + 1], a)
    np.testing.assert_array_equal(tokens[len(a) + 2 : sep[1]], b)
    assert (tokens[sep[1] + 1 :] == tokenizers.PAD_ID).all()
    expected = np.zeros(seq_len, np.int32)
    expected[sep[0] + 1 : sep[1] + 1] = 1
    np.testing.assert_array_equal(segments, expected)

  # Without next-sentence prediction every B continues its A.
  pairs = mlm.make_pairs(docs, seq_len, np.random.default_rng(1), False, 0.0)
  assert all(label == 0 for _, _, label in pairs)
  single = [n for n, (_, b, _) in enumerate(pairs) if len(b) == 0]  # [CLS] A [SEP] only.
  assert single
  arrays = mlm.pair_arrays(vocab, pairs, seq_len)
  for n in single:
    assert (arrays["tokens"][n] == vocab.sep_id).sum() == 1 and not arrays["segments"][n].any()
  # Trimming: from the longer side, down to the budget.
  a, b = mlm.truncate_pair(np.arange(30), np.arange(5), 20, np.random.default_rng(0))
  assert (len(a), len(b)) == (15, 5) and a[-1] - a[0] == 14
  a, b = mlm.truncate_pair(np.arange(30), np.arange(30), 21, np.random.default_rng(0))
  assert (len(a), len(b)) == (11, 10)


def test_classifier_head_reads_the_first_token():
  cfg = ModelConfig(vocab_size=50, num_layers=1, d_model=16, num_heads=2, d_ff=32, max_len=16,
                    dropout_rate=0.0, tie_embeddings=True)
  model = BertClassifier(cfg, num_classes=3)
  tokens = jax.random.randint(jax.random.key(0), (4, 10), 1, 50)
  segments = jnp.zeros((4, 10), jnp.int32).at[:, 5:].set(1)
  params = model.init(jax.random.key(1), tokens, segments)["params"]
  logits = model.apply({"params": params}, tokens, segments)
  assert logits.shape == (4, 3) and logits.dtype == jnp.float32
  # logits = W_c tanh(W_p h_0 + b_p) + b_c from the encoder's state at position 0 alone.
  h = BertEncoder(cfg).apply({"params": params["bert"]}, tokens, segments, deterministic=True)
  p, c = params["pooler"], params["classifier"]
  pooled = jnp.tanh(h[:, 0] @ p["kernel"].value + p["bias"].value)
  np.testing.assert_allclose(logits, pooled @ c["kernel"].value + c["bias"].value,
                             rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("norm_position", NORM_POSITIONS)
def test_pretraining_model_under_every_norm_position(norm_position):
  cfg = ModelConfig(vocab_size=40, num_layers=2, d_model=16, num_heads=2, d_ff=32, max_len=16,
                    norm_position=norm_position, tie_embeddings=True)
  model = BertPretraining(cfg, next_sentence=True)
  tokens = jax.random.randint(jax.random.key(0), (2, 12), 1, 40)
  inputs = (tokens, jnp.zeros_like(tokens), jnp.array([[1, 3, 0], [2, 5, 7]]))
  params = model.init(jax.random.key(1), *inputs)["params"]
  out = model.apply({"params": params}, *inputs)
  assert out["mlm"].shape == (2, 3, 40) and out["nsp"].shape == (2, 2)
  assert all(bool(jnp.isfinite(v).all()) for v in out.values())
  assert "logits" not in params  # Tied: the output projection is the input embedding.


def bert_smoke_config(num_steps: int = 30):
  """configs/bert.py:smoke, Post-LN, with NSP, a constant learning rate (so that a run
  stopped early and resumed follows the same schedule), the loss logged at every step."""
  c = config_lib.bert_config()
  config_lib.apply_bert_smoke(c)
  c.model.norm_position = "post"
  c.mesh.data = 1
  c.opt.schedule = "constant"
  c.train.num_steps = num_steps
  c.train.log_every_steps = 1
  return c


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory):
  """A smoke pre-training run of 30 steps (shared by the tests below)."""
  wd = str(tmp_path_factory.mktemp("bert") / "pre")
  return wd, train.train_and_evaluate(bert_smoke_config(), wd)


@pytest.mark.slow
def test_smoke_pretraining_loss_falls(pretrained):
  wd, summary = pretrained
  assert summary["status"] == "completed" and summary["step"] == 30
  records = metrics.read_metrics(wd)
  train_losses = {r["step"]: r["train_loss"] for r in records if "train_loss" in r}
  evals = [r["eval_loss"] for r in records if "eval_loss" in r]
  assert train_losses[30] < train_losses[5] - 1.0, train_losses
  assert len(evals) == 3 and evals[-1] < evals[0] - 0.5, evals
  assert sorted(os.listdir(os.path.join(wd, "checkpoints"))) == ["10", "20", "30"]
  saved = json.load(open(os.path.join(wd, "checkpoints", "30", "data", "metadata")))
  assert saved["fingerprint"]  # The data position is saved with the state (resume).


@pytest.mark.slow
def test_bert_resume_reproduces_the_uninterrupted_run(pretrained, tmp_path):
  """Stopped at step 10 and run again to 30: every step's loss (masking and dropout are
  functions of (seed, step); the pair order comes from the saved data position), the
  final state and the data position equal the uninterrupted run's, bit for bit."""
  full, _ = pretrained
  parts = str(tmp_path / "parts")
  train.train_and_evaluate(bert_smoke_config(10), parts)
  assert train.train_and_evaluate(bert_smoke_config(30), parts)["status"] == "completed"
  losses = lambda wd: {r["step"]: r["train_loss"] for r in metrics.read_metrics(wd)
                       if "train_loss" in r}
  a, b = losses(full), losses(parts)
  assert [a[s] for s in range(1, 31)] == [b[s] for s in range(1, 31)]
  ra, rb = checkpoint.restore_run(full), checkpoint.restore_run(parts)
  for x, y in zip(jax.tree.leaves(ra.state), jax.tree.leaves(rb.state)):
    np.testing.assert_array_equal(x, y)
  assert ra.data_state == rb.data_state


@pytest.mark.slow
def test_smoke_finetune_reports_accuracy_f1_and_intervals(pretrained, tmp_path, capsys):
  wd, _ = pretrained
  sys_path = os.path.join(REPO, "configs")
  import importlib.util
  spec = importlib.util.spec_from_file_location("glue_config", os.path.join(sys_path, "glue.py"))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  config = module.get_config("task=mrpc,smoke")
  with config.unlocked():
    config.init.workdir, config.init.step = wd, 20
    config.train.log_every_steps = 1
    config.train.num_epochs = 3
  out = str(tmp_path / "mrpc")
  summary = finetune.finetune(config, out)
  # Each seed's training loss falls: its last epoch's mean below its first's, and below
  # ln 2 (a fair coin); its dev accuracy above chance (MRPC dev: 68% positive pairs).
  for seed in (0, 1):
    losses = [r["train_loss"] for r in metrics.read_metrics(out)
              if r.get("seed") == seed and "train_loss" in r]
    epochs = np.array(losses).reshape(3, -1).mean(1)
    assert epochs[-1] < epochs[0] and epochs[-1] < np.log(2), (seed, epochs)
    assert json.load(open(os.path.join(out, "seeds", f"{seed}.json")))["accuracy"] > 0.6
  for metric in ("accuracy", "f1"):
    assert 0.0 <= summary[metric]["mean"] <= 1.0 and summary[metric]["n"] == 2
    assert summary[metric]["ci95"] is not None
  seeds = [json.load(open(os.path.join(out, "seeds", f"{s}.json"))) for s in (0, 1)]
  assert summary["accuracy"]["mean"] == pytest.approx(np.mean([s["accuracy"] for s in seeds]))
  # A re-run skips the finished seeds.
  capsys.readouterr()
  finetune.finetune(config, out)
  assert capsys.readouterr().out.count("done earlier") == 2


def test_t_interval():
  s = finetune.t_interval([1.0, 2.0, 3.0])
  # t_{0.975, 2} = 4.3027; s = 1.
  assert s["mean"] == 2.0 and s["std"] == 1.0
  assert s["ci95"] == pytest.approx(4.302653 / np.sqrt(3), rel=1e-5)
  assert finetune.t_interval([0.7])["ci95"] is None
  assert finetune.classification_metrics([1, 1, 0, 0], [1, 0, 1, 0], positive=1) == {
      "accuracy": 0.5, "f1": 0.5}


def test_glue_reader_bom_no_quotes_and_missing_file(tmp_path):
  a, b, labels = glue.load_split("mrpc", "train")
  assert len(a) == 3668 and labels.sum() == 2474  # GLUE's counts (default quoting: 3,570).
  assert a[0].startswith('Amrozi accused his brother, whom he called "the witness"')
  a, b, labels = glue.load_split("rte", "dev")
  assert len(a) == 277 and (labels == 0).sum() == 146

  rows = glue.read_tsv(paths.find_corpus_file(None, "glue_mrpc", "dev.tsv", ""))
  assert rows[0][0] == "Quality"  # The byte-order mark is gone.

  folder = tmp_path / "glue_rte"
  folder.mkdir()
  with gzip.open(folder / "dev.tsv.gz", "wt") as f:  # An unbalanced quote, then a bad row.
    f.write('index\tsentence1\tsentence2\tlabel\n0\t"Open quote\tB.\tentailment\n'
            "1\tonly\tthree\n")
  with pytest.raises(paths.DataError, match=r"dev.tsv.gz, line 3: expected 4"):
    glue.load_split("rte", "dev", str(tmp_path))
  with gzip.open(folder / "dev.tsv.gz", "wt") as f:
    f.write('index\tsentence1\tsentence2\tlabel\n0\t"Open quote\tB.\tentailment\n')
  assert glue.load_split("rte", "dev", str(tmp_path))[0] == ['"Open quote']
  # Missing here: the error names where it looked and the published file (downloads are
  # off in the tests), and where to put it.
  with pytest.raises(paths.DataError, match=r"glue_rte corpus file train.tsv not found in .*"
                     r"marcwww/nlu_eval/.*/data/RTE/train_copy.tsv and put train.tsv into"):
    glue.load_split("rte", "train", str(tmp_path))


@pytest.mark.slow
def test_analyze_reads_a_bert_checkpoint(pretrained):
  """lnjax.analyze on a masked-LM run: its loss is the masked-LM NLL (task.loss), and
  per-layer gradients and norm statistics come from the encoder's layers."""
  from lnjax import analyze
  wd, summary = pretrained
  result, out = analyze.analyze(wd, "latest", num_batches=1, lr=1e-4)
  assert os.path.exists(os.path.join(out, "gradients.png"))
  assert 0 < result["loss"] < summary["eval_loss"] + 1.0
  w2 = [v for points in analyze.per_layer(result["gradient_norms"], "ffn/wo/kernel").values()
        for _, v in points]
  assert len(w2) == c_layers(wd) and all(v > 0 for v in w2)


def c_layers(workdir: str) -> int:
  return json.load(open(os.path.join(workdir, "config.json")))["model"]["num_layers"]
