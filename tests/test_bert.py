"""BERT: masking statistics, pair packing, the classification head, every norm placement,
a smoke pre-training run whose loss falls, smoke GLUE fine-tuning runs (loss, scores,
initialization, resume after SIGTERM), the GLUE reader."""

import csv
import gzip
import json
import math
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lnjax import tasks
from lnjax.configs import common as config_lib
from lnjax.core import checkpoint, errors, metrics, train
from lnjax.tasks import finetune
from lnjax.data import glue, mlm, paths, tokenizers
from lnjax.models import ModelConfig
from lnjax.models.bert import BertClassifier, BertEncoder, BertPretraining
from lnjax.models.placement import NORM_POSITIONS
from conftest import assert_same_final_state, fast_tier
from test_train import sigterm_when
from quiet_runs import NO_HEALTH


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


def test_the_vocabulary_is_made_again_without_reading_the_corpus(monkeypatch):
  """Once its tokenizer is cached (a char tokenizer's characters in the file beside the
  LM's tokens), the masked LM's vocabulary reads no document of the corpus again."""
  from lnjax.data import builders

  cfg = mlm.MLMDataConfig(tokenizer="char")
  first = mlm.make_vocab(cfg)
  monkeypatch.setattr(builders, "load_split_texts", lambda *a: pytest.fail("read again"))
  assert mlm.make_vocab(cfg).tokenizer.chars == first.tokenizer.chars


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


@pytest.mark.slow  # (Fast tier: the pre-training model's test.)
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


@pytest.mark.parametrize("norm_position", fast_tier(NORM_POSITIONS, ("post", "pre")))
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
  stopped early and resumed follows the same schedule), the loss logged at every step,
  without train.health's statistics (tests/quiet_runs.py)."""
  c = config_lib.bert_config()
  config_lib.apply_bert_smoke(c)
  c.model.norm_position = "post"
  c.mesh.data = 1
  c.opt.schedule = "constant"
  c.train.num_steps = num_steps
  c.train.log_every_steps = 1
  c.train.health = NO_HEALTH
  return c


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory):
  """A smoke pre-training run of 30 steps (shared by the tests below)."""
  wd = str(tmp_path_factory.mktemp("bert") / "pre")
  return wd, train.train_and_evaluate(bert_smoke_config(), wd, tasks=tasks.get)


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
  train.train_and_evaluate(bert_smoke_config(10), parts, tasks=tasks.get)
  assert train.train_and_evaluate(bert_smoke_config(30), parts,
                                  tasks=tasks.get)["status"] == "completed"
  losses = lambda wd: {r["step"]: r["train_loss"] for r in metrics.read_metrics(wd)
                       if "train_loss" in r}
  a, b = losses(full), losses(parts)
  assert [a[s] for s in range(1, 31)] == [b[s] for s in range(1, 31)]
  assert_same_final_state(full, parts)


def glue_smoke_config(pretrained_workdir: str):
  """configs/glue.py:task=mrpc,smoke fine-tuning the smoke pre-training run's step 20 on
  its first 32 train pairs for 40 steps (one batch an epoch), without dropout, so that
  the loss falls far in seconds (the pairs are learned by heart); evaluations and
  checkpoints at steps 20 and 40, the loss logged at every step (no health statistics:
  NO_HEALTH)."""
  from configs import glue as glue_config
  config = glue_config.get_config("task=mrpc,smoke")
  with config.unlocked():
    config.data.init_workdir, config.data.init_step = pretrained_workdir, 20
    config.data.train_examples = 32
    config.finetune.num_epochs, config.finetune.dropout_rate = 40, 0.0
    config.opt.learning_rate = 3e-3
    config.train.log_every_steps = 1
    config.train.eval_every_steps = config.train.checkpoint_every_steps = 20
    config.train.health = NO_HEALTH
    config.mesh.data = 1
  return config


@pytest.fixture(scope="module")
def finetuned(pretrained, tmp_path_factory):
  """Seeds 0 and 1 of glue_smoke_config, fine-tuned by lnjax.tasks.finetune (shared below)."""
  out = str(tmp_path_factory.mktemp("glue") / "mrpc")
  config = glue_smoke_config(pretrained[0])
  return out, config, finetune.finetune(config, out)


def _train_losses(workdir: str) -> dict:
  return {r["step"]: r["train_loss"] for r in metrics.read_metrics(workdir) if "train_loss" in r}


def _predict(setup, params, batches) -> tuple[np.ndarray, np.ndarray]:
  """(predicted classes, labels) of the real rows of `batches`."""
  predictions, labels = [], []
  for b in batches:
    logits = setup.model.apply({"params": params}, b["inputs"], b["segment_ids"])
    predictions.append(np.asarray(logits).argmax(-1)[b["weights"] > 0])
    labels.append(b["labels"][b["weights"] > 0])
  return np.concatenate(predictions), np.concatenate(labels)


@pytest.mark.slow
def test_smoke_finetune_loss_falls_and_reports_accuracy_f1_and_intervals(finetuned, capsys):
  """Each seed is a run of task glue in seeds/<seed>/: its loss falls, its train pairs are
  fitted (the labels are read), its logged dev accuracy and F1 are those of its final
  parameters; the summary holds their mean and 95% t-interval; a re-run skips them."""
  out, config, summary = finetuned
  assert summary["status"] == "completed" and summary["steps_per_seed"] == 40
  for seed in (0, 1):
    wd = os.path.join(out, "seeds", str(seed))
    losses = _train_losses(wd)
    assert sorted(losses) == list(range(1, 41))
    first, last = np.mean([losses[s] for s in range(1, 5)]), np.mean(
        [losses[s] for s in range(37, 41)])
    assert 0 < last < 0.5 * first and last < np.log(2) / 2, (seed, first, last)
    restored = checkpoint.restore_run(wd, tasks=tasks.get)
    assert restored.step == 40 and restored.run.task.name == "glue"
    data = restored.run.task.make_data(restored.run.data, seed, 0, 1, 1)
    train_batch = next(data.train_iter())  # The 32 pairs, in the seed's order.
    predicted, labels = _predict(restored.setup, restored.state.params, [train_batch])
    assert len(labels) == 32 and (predicted == labels).mean() >= 0.9
    predicted, labels = _predict(restored.setup, restored.state.params, data.eval_batches())
    assert len(labels) == len(glue.load_split("mrpc", "dev")[2])  # MRPC dev (the fixture's).
    (logged,) = [r for r in metrics.read_metrics(wd) if r["step"] == 40 and "eval_f1" in r]
    tp = ((predicted == 1) & (labels == 1)).sum()
    f1 = 2 * tp / (2 * tp + ((predicted == 1) & (labels == 0)).sum()
                   + ((predicted == 0) & (labels == 1)).sum())
    assert logged["eval_accuracy"] == pytest.approx((predicted == labels).mean())
    assert logged["eval_f1"] == pytest.approx(f1)
    assert summary["per_seed"][seed]["accuracy"] == logged["eval_accuracy"]
  for metric in ("accuracy", "f1"):
    values = [r[metric] for r in summary["per_seed"]]
    assert summary[metric]["n"] == 2 and summary[metric]["ci95"] is not None
    assert summary[metric]["mean"] == pytest.approx(np.mean(values))
  assert json.load(open(os.path.join(out, "summary.json"))) == summary
  capsys.readouterr()
  assert finetune.finetune(config, out) == summary
  assert capsys.readouterr().out.count("done earlier") == 2


@pytest.mark.slow
def test_glue_init_copies_the_pretrained_encoder_and_refuses_another_model(pretrained):
  """Task.init_params: bert/ and pooler from the pre-training checkpoint at data.init_step
  (0: that run's initialization), the classifier left fresh; a model section other than
  the pre-training run's (dropout aside) is refused."""
  import dataclasses
  from lnjax.core import run as run_lib, sharding, state as state_lib
  from lnjax.tasks import glue as glue_task

  config = finetune.seed_config(glue_smoke_config(pretrained[0]), seed=0)
  run = run_lib.resolve_config(config, tasks=tasks.get)
  setup = state_lib.make_setup(run.model, run.opt, run.train.num_steps, task=run.task)
  mesh = sharding.make_mesh(sharding.MeshConfig(data=1), jax.local_devices()[:1])
  fresh = state_lib.init_state(setup, mesh, 0).params
  params = glue_task.init_params(setup, fresh, run)
  at_20 = checkpoint.restore_run(pretrained[0], 20, tasks=tasks.get).state.params
  for name in ("bert", "pooler"):
    for a, b in zip(jax.tree.leaves(params[name]), jax.tree.leaves(at_20[name]), strict=True):
      np.testing.assert_array_equal(a, b)
  assert params["classifier"] is fresh["classifier"]
  assert not np.array_equal(params["bert"]["segment_embed"], fresh["bert"]["segment_embed"])

  at_init = dataclasses.replace(run, data=dataclasses.replace(run.data, init_step=0))
  pre_run = run_lib.resolve_config(checkpoint.load_config(pretrained[0]), tasks=tasks.get)
  pre_setup = state_lib.make_setup(pre_run.model, pre_run.opt, 30, task=pre_run.task)
  expected = state_lib.init_state(pre_setup, mesh, pre_run.seed).params["bert"]
  got = glue_task.init_params(setup, fresh, at_init)["bert"]
  for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(expected), strict=True):
    np.testing.assert_array_equal(a, b)

  other = dataclasses.replace(run, model=dataclasses.replace(run.model, norm_position="pre"))
  with pytest.raises(errors.ConfigError, match=r"model.norm_position='pre' differs from the "
                     r"pre-training run's 'post'"):
    glue_task.init_params(setup, fresh, other)


@pytest.mark.slow
def test_finetune_resumes_bit_exactly_after_sigterm(finetuned, tmp_path):
  """python -m lnjax.cli.finetune stopped by SIGTERM mid-seed exits 143 with a checkpoint;
  the same config run again resumes it, and every step's loss, the dev scores and the
  final parameters equal the uninterrupted run's (finetuned's seed 0) bit for bit."""
  out, config, _ = finetuned
  wd = str(tmp_path / "mrpc")
  seed_wd = os.path.join(wd, "seeds", "0")
  args = ["--config=configs/glue.py:task=mrpc,smoke", f"--workdir={wd}",
          "--config.finetune.seeds=(0,)"] + [
      f"--config.{k}={v}" for k, v in (
          ("data.init_workdir", config.data.init_workdir), ("data.init_step", 20),
          ("data.train_examples", 32), ("finetune.num_epochs", 40),
          ("finetune.dropout_rate", 0.0), ("opt.learning_rate", 3e-3),
          ("train.log_every_steps", 1), ("train.eval_every_steps", 20),
          ("train.checkpoint_every_steps", 20), ("train.health", NO_HEALTH), ("mesh.data", 1))]
  stdout, _ = sigterm_when("lnjax.cli.finetune", args, lambda: len(_train_losses(seed_wd)) >= 3,
                           poll=0.02)
  assert "stopped by SIGTERM during seed 0" in stdout
  stopped = json.load(open(os.path.join(seed_wd, "summary.json")))
  assert stopped["status"] == "preempted" and 3 <= stopped["step"] < 40, stopped
  assert os.listdir(os.path.join(seed_wd, "checkpoints")) == [str(stopped["step"])]

  with config.unlocked():
    config.finetune.seeds = (0,)
  summary = finetune.finetune(config, wd)
  assert summary["status"] == "completed"
  full = os.path.join(out, "seeds", "0")
  assert _train_losses(seed_wd) == _train_losses(full)
  evals = lambda w: [r for r in metrics.read_metrics(w) if "eval_loss" in r]
  assert evals(seed_wd) == evals(full) and len(evals(full)) == 2
  assert_same_final_state(full, seed_wd)


def test_glue_data_resumes_and_splits_batches_over_processes():
  """The GLUE DataSource: every epoch a permutation of the train pairs, a train iterator
  that resumes exactly from get_state(), processes holding disjoint rows of the same
  global batches, and the dev split once, padded with weight-0 rows."""
  vocab = mlm.BertVocab(tokenizers.CharTokenizer([chr(i) for i in range(32, 127)]))
  make = lambda index=0, count=1, seed=3: glue.GlueData(
      "rte", vocab, 32, 8, train_examples=40, seed=seed, process_index=index,
      process_count=count)
  data = make()
  assert data.steps_per_epoch == 5 and data.vocab_size == vocab.vocab_size
  it = data.train_iter()
  batches = [next(it) for _ in range(12)]
  rows = lambda bs: np.concatenate([b["inputs"] for b in bs])
  train_rows = data.splits["train"]["inputs"]
  for epoch in (batches[0:5], batches[5:10]):  # Each epoch: all 40 pairs once.
    assert sorted(map(bytes, rows(epoch))) == sorted(map(bytes, train_rows))
  assert not np.array_equal(rows(batches[0:5]), rows(batches[5:10]))  # Reshuffled.
  it = data.train_iter()
  for _ in range(7):
    next(it)
  state = json.loads(json.dumps(it.get_state()))
  resumed = make().train_iter()
  resumed.set_state(state)
  for expected in batches[7:12]:
    got = next(resumed)
    for k in expected:
      np.testing.assert_array_equal(got[k], expected[k])
  with pytest.raises(errors.ConfigError, match="different data setup"):
    make(seed=4).train_iter().set_state(state)
  halves = [next(make(i, 2).train_iter()) for i in (0, 1)]
  for k in batches[0]:
    np.testing.assert_array_equal(np.concatenate([h[k] for h in halves]), batches[0][k])
  dev = data.eval_batches()
  n_dev = len(glue.load_split("rte", "dev")[0])  # the fixture's 120 pairs
  assert len(dev) == math.ceil(n_dev / 8) and sum(b["weights"].sum() for b in dev) == n_dev
  np.testing.assert_array_equal(np.concatenate([b["labels"] for b in dev])[:n_dev],
                                data.splits["dev"]["labels"])


def test_t_interval():
  s = finetune.t_interval([1.0, 2.0, 3.0])
  # t_{0.975, 2} = 4.3027; s = 1.
  assert s["mean"] == 2.0 and s["std"] == 1.0
  assert s["ci95"] == pytest.approx(4.302653 / np.sqrt(3), rel=1e-5)
  assert finetune.t_interval([0.7])["ci95"] is None


def test_glue_reader_bom_no_quotes_and_missing_file(tmp_path, corpora, monkeypatch):
  # The fixtures (tests/fixtures/corpora) are in GLUE's layout: counted here on the lines.
  lines = gzip.decompress((corpora / "glue_mrpc" / "train.tsv.gz").read_bytes()
                          ).decode().splitlines()
  a, b, labels = glue.load_split("mrpc", "train")
  assert len(a) == len(lines) - 1 and labels.sum() == sum(l.startswith("1\t") for l in lines)
  assert a[0] == lines[1].split("\t")[3]
  # Some sentences open a double quote they never close: a CSV reader's default quoting
  # would merge rows.
  assert len(list(csv.reader(lines[1:], delimiter="\t"))) < len(a)
  lines = gzip.decompress((corpora / "glue_rte" / "dev.tsv.gz").read_bytes()).decode().splitlines()
  a, b, labels = glue.load_split("rte", "dev")
  assert len(a) == len(lines) - 1
  assert (labels == 0).sum() == sum(l.endswith("\tentailment") for l in lines)

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
  # Missing here (and in an empty download folder): the error names where it looked and the
  # published file (downloads are off in the tests), and where to put it.
  monkeypatch.setenv("LNJAX_CACHE_DIR", str(tmp_path / "cache"))
  with pytest.raises(paths.DataError, match=r"glue_rte corpus file train.tsv not found in .*"
                     r"marcwww/nlu_eval/.*/data/RTE/train_copy.tsv and put train.tsv into"):
    glue.load_split("rte", "train", str(tmp_path))


@pytest.mark.slow
def test_analyze_reads_a_bert_checkpoint(pretrained):
  """lnjax.analysis.report on a masked-LM run: its loss is the masked-LM NLL (task.loss), and
  per-layer gradients and norm statistics come from the encoder's layers."""
  from lnjax.analysis import report as analyze
  wd, summary = pretrained
  result, out = analyze.analyze(wd, "latest", num_batches=1, lr=1e-4)
  assert os.path.exists(os.path.join(out, "gradients.png"))
  assert 0 < result["loss"] < summary["eval_loss"] + 1.0
  w2 = [v for points in analyze.per_layer(result["gradient_norms"], "ffn/wo/kernel").values()
        for _, v in points]
  assert len(w2) == c_layers(wd) and all(v > 0 for v in w2)


def c_layers(workdir: str) -> int:
  return json.load(open(os.path.join(workdir, "config.json")))["model"]["num_layers"]
