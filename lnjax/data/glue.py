"""GLUE sentence-pair tasks (MRPC, RTE) for fine-tuning: reader, encoding, batches.

The files are GLUE's (``<data dir>/glue_mrpc/{train,dev}.tsv[.gz]``,
``<data dir>/glue_rte/{train,dev}.tsv[.gz]``): tab-separated with one header line, read
with no quote handling (the sentences hold unbalanced double quotes: a CSV reader with
quoting merges rows), and MRPC's files start with a UTF-8 byte-order mark, which is
dropped. Each pair is encoded as [CLS] A [SEP] B [SEP] with the pre-training run's
vocabulary (`mlm.BertVocab`), trimmed longest-first to seq_len.

Batches (dicts of numpy arrays):
  inputs       int32[B, L]    token ids, 0-padded
  segment_ids  int32[B, L]    0 for [CLS] A [SEP], 1 for B [SEP]
  labels       int32[B]
  weights      float32[B]     1 on real examples, 0 on the padding rows of the last dev batch
with B = batch_size // process count: each process holds its rows of every global batch.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json

import grain
import numpy as np

from lnjax.core import errors
from lnjax.data import mlm, paths, pipeline

HOW_TO_GET = (
    "run GLUE's download_glue_data.py (github.com/nyu-mll/GLUE-baselines) and copy"
    " glue_data/{task}/{{train,dev}}.tsv (plain or gzipped) into {{data_dir}}/{subdir}/,"
    " or point --config.data.data_dir / LNJAX_DATA_DIR at a folder holding them"
)


@dataclasses.dataclass(frozen=True)
class GlueTask:
  subdir: str  # Folder under the data dir.
  text_columns: tuple[int, int]  # Sentence A, sentence B.
  label_column: int
  labels: tuple[str, ...]  # Label strings; an example's label is its index here.
  num_fields: int  # Fields of every train/dev row.
  positive: int | None  # The class F1 is reported for (MRPC), or None.


TASKS = {
    # Quality  #1 ID  #2 ID  #1 String  #2 String; 1 = paraphrase.
    "mrpc": GlueTask("glue_mrpc", (3, 4), 0, ("0", "1"), 5, positive=1),
    # index  sentence1  sentence2  label
    "rte": GlueTask("glue_rte", (1, 2), 3, ("entailment", "not_entailment"), 4, positive=None),
}


def read_tsv(path) -> list[list[str]]:
  """Rows of a GLUE .tsv[.gz]: split on tabs, no quote processing, BOM dropped."""
  text = paths.read_text(path)
  if text.startswith("\ufeff"):
    text = text[1:]
  return [line.rstrip("\r").split("\t") for line in text.split("\n") if line.strip()]


def load_split(task: str, split: str, data_dir: str | None = None):
  """(sentences A, sentences B, labels int32[N]) of `split` (train | dev); `DataError`
  naming the paths searched for a missing file, or the line of a malformed row."""
  errors.check_choice("glue task", task, tuple(TASKS))
  t = TASKS[task]
  path = paths.find_corpus_file(data_dir, t.subdir, f"{split}.tsv",
                                HOW_TO_GET.format(task=task.upper(), subdir=t.subdir))
  rows = read_tsv(path)[1:]  # The header.
  a, b, labels = [], [], []
  for line, row in enumerate(rows, start=2):
    if len(row) != t.num_fields or row[t.label_column] not in t.labels:
      raise paths.DataError(f"{path}, line {line}: expected {t.num_fields} tab-separated fields "
                            f"with a label in {t.labels}, got {len(row)} fields: {row[:3]}...")
    a.append(row[t.text_columns[0]])
    b.append(row[t.text_columns[1]])
    labels.append(t.labels.index(row[t.label_column]))
  return a, b, np.asarray(labels, np.int32)


def encode_pairs(vocab: mlm.BertVocab, a: list[str], b: list[str], seq_len: int):
  """(tokens int32[N, L], segment ids int32[N, L]): [CLS] A [SEP] B [SEP], the longer
  sentence trimmed from its end first until the pair fits (BERT's fine-tuning rule)."""
  tokens_NxL = np.zeros((len(a), seq_len), np.int32)
  segments_NxL = np.zeros((len(a), seq_len), np.int32)
  for n, (x, y) in enumerate(zip(vocab.encode_sentences(a), vocab.encode_sentences(b))):
    while len(x) + len(y) > seq_len - 3:
      x, y = (x[:-1], y) if len(x) > len(y) else (x, y[:-1])
    tokens_NxL[n], segments_NxL[n] = vocab.pair(x, y, seq_len)
  return tokens_NxL, segments_NxL


class GlueData:
  """The train and dev splits of one task, encoded, as a task's DataSource (lnjax.core.task):
  endless, resumable train batches and the fixed dev batches, this process's rows of each."""

  def __init__(self, task: str, vocab: mlm.BertVocab, seq_len: int, batch_size: int,
               data_dir: str | None = None, train_examples: int = 0, *, seed: int = 0,
               process_index: int = 0, process_count: int = 1):
    """`train_examples`: keep only the first N train pairs (0 = all); `seed`: the order
    of the train pairs."""
    self.task, self.spec, self.batch_size = task, TASKS[task], batch_size
    self.num_classes = len(self.spec.labels)
    self.vocab_size = vocab.vocab_size
    self.unigram_entropy = None  # (A token baseline means nothing for a label.)
    self.seed = int(seed) % (1 << 32)  # grain seeds must lie in [0, 2**32).
    if batch_size % process_count:
      raise errors.ConfigError(f"data.batch_size={batch_size} is not divisible by the "
                               f"process count {process_count}")
    self.local_batch_size = batch_size // process_count
    self._rows = slice(process_index * self.local_batch_size,
                       (process_index + 1) * self.local_batch_size)
    if train_examples and train_examples < batch_size:
      raise errors.ConfigError(f"data.train_examples={train_examples} is below one batch "
                               f"(data.batch_size={batch_size})")
    self.splits = {}
    for split in ("train", "dev"):
      a, b, labels_N = load_split(task, split, data_dir)
      if split == "train" and train_examples:
        a, b, labels_N = a[:train_examples], b[:train_examples], labels_N[:train_examples]
      tokens, segments = encode_pairs(vocab, a, b, seq_len)
      self.splits[split] = {"inputs": tokens, "segment_ids": segments, "labels": labels_N}
    # Identifies the train batch sequence: the encoded pairs, the batch size and the seed.
    digest = hashlib.sha256()
    for v in self.splits["train"].values():
      digest.update(np.ascontiguousarray(v).tobytes())
    digest.update(json.dumps([task, batch_size, self.seed]).encode())
    self._fingerprint = digest.hexdigest()[:16]
    self._dev_batches = self._build_dev_batches()

  @property
  def steps_per_epoch(self) -> int:
    return len(self.splits["train"]["labels"]) // self.batch_size

  def _train_batch(self, ids_G: np.ndarray) -> dict:
    ids_B = ids_G[self._rows]
    batch = {k: v[ids_B] for k, v in self.splits["train"].items()}
    batch["weights"] = np.ones(len(ids_B), np.float32)
    return batch

  def train_iter(self) -> pipeline.TrainIterator:
    """Endless passes over the train split, reshuffled each epoch (the last partial
    batch dropped); get_state()/set_state() resume it exactly."""
    ds = (grain.MapDataset.range(len(self.splits["train"]["labels"]))
          .shuffle(seed=self.seed)
          .batch(self.batch_size, drop_remainder=True)
          .repeat(None)  # Reseeds the shuffle every epoch.
          .map(self._train_batch))
    read_options = grain.ReadOptions(num_threads=0, prefetch_buffer_size=0)
    return pipeline.TrainIterator(iter(ds.to_iter_dataset(read_options)), self._fingerprint)

  def _build_dev_batches(self) -> list[dict]:
    dev, g = self.splits["dev"], self.batch_size
    n = len(dev["labels"])
    batches = []
    for lo in range(0, n, g):
      rows = np.arange(lo, lo + g)[self._rows]
      real = rows < n
      batch = {k: v[np.where(real, rows, 0)] for k, v in dev.items()}
      batch["weights"] = real.astype(np.float32)
      batches.append(batch)
    return batches

  def eval_batches(self) -> list[dict]:
    """Every dev example once, in order; the last batch padded with weight-0 rows (one
    shape)."""
    return list(self._dev_batches)
