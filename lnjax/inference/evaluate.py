"""Translation quality: decode a split with beam search and score it with sacreBLEU.

BLEU is computed on detokenized, cased output against the raw references (sacreBLEU's
13a tokenizer: comparable with published sacreBLEU numbers), or, where the corpus is
distributed tokenized and lowercased (IWSLT14 as fairseq prepares it), as tokenized
BLEU on that text (sacreBLEU with tokenize='none', which is what fairseq's
`--scoring bleu` reports and what the paper's IWSLT numbers are).
"""

import dataclasses
import sys
import threading
import time

import jax
import numpy as np
import sacrebleu
from jax.experimental import multihost_utils

from lnjax.core import errors, fileio, preemption, progress, sharding
from lnjax.inference import decode
from lnjax.data import batching


@dataclasses.dataclass(frozen=True)
class DecodeConfig:
  """`config.decode` of translation runs."""

  beam_size: int = 4  # 1 = greedy.
  length_penalty: float = 1.0  # α in score = log p / length^α (fairseq's lenpen).
  max_extra_len: int = 50  # Hypotheses may be this much longer than their source bucket.
  bleu_every_steps: int = 0  # BLEU on the first eval split; 0 = at every evaluation.
  bleu_split: str = ""  # Split scored during training; "" = data.eval_splits[0].
  bleu_in_training: bool = True  # False: no decoding while training (predict mode still scores).

  def __post_init__(self):
    for key, low in (("beam_size", 1), ("max_extra_len", 1), ("bleu_every_steps", 0)):
      value = getattr(self, key)
      if (isinstance(value, bool) or not isinstance(value, int) or value < low
          or value > errors.INT64_MAX):
        raise errors.ConfigError(f"decode.{key}={value!r} must be an integer >= {low} (at "
                                 "most 2^63 - 1)")
    errors.check_range("decode.length_penalty", self.length_penalty, low=0.0)


def decode_split(setup, params, data, split: str, cfg: DecodeConfig, mesh) -> list[str]:
  """Hypotheses for every sentence of `split`, in the split's original order: its source
  text decoded as `python -m lnjax.cli.translate` decodes any text (decode_lines)."""
  return decode_lines(setup.model, params, data.tokenizer, data.sources(split), cfg, mesh,
                      max_tokens=data.cfg.max_tokens, per_octave=data.cfg.buckets_per_octave,
                      desc=f"decoding {split}")


def decode_lines(model, params, tokenizer, lines: list[str], cfg: DecodeConfig, mesh, *,
                 max_tokens: int, per_octave: int = batching.PER_OCTAVE,
                 max_len: int | None = None, desc: str = "decoding") -> list[str]:
  """Detokenized hypotheses of `lines` (source text, one sentence each), in their order.

  Batches depend on the source alone (never on a reference): sentences sorted by
  tokenized length, padded to the length ladder of lnjax.data.batching and cut into
  batches of about `max_tokens` source tokens (`per_octave`: the ladder's
  data.buckets_per_octave). So a split decoded by --mode=predict and
  the same lines decoded by lnjax.inference.translate give the same hypotheses. A hypothesis is
  at most `max_len` tokens (EOS included; default: its batch's source length +
  decode.max_extra_len), never more than model.max_len.
  """
  ids = [np.asarray(tokenizer.encode(line), np.int32) for line in lines]
  limit = model.cfg.max_len
  for i, x in enumerate(ids):
    if len(x) + 1 > limit:
      print(f"warning: input line {i + 1} has {len(x)} tokens; cut to model.max_len - 1 = "
            f"{limit - 1}", file=sys.stderr, flush=True)
      ids[i] = x[:limit - 1]
  tokens = decode_ids(model, params, ids, cfg, mesh, bos_id=tokenizer.bos_id,
                      eos_id=tokenizer.eos_id, max_tokens=max_tokens, per_octave=per_octave,
                      max_len=max_len, desc=desc)
  return [tokenizer.decode(t) for t in tokens]


def decode_ids(model, params, sources: list[np.ndarray], cfg: DecodeConfig, mesh, *,
               bos_id: int, eos_id: int, max_tokens: int, per_octave: int = batching.PER_OCTAVE,
               max_len: int | None = None, desc: str = "decoding") -> list[list[int]]:
  """Token ids of the hypothesis of every source (ids without EOS), in their order."""
  if not sources:
    return []
  batch_multiple = mesh.shape["data"] * mesh.shape["fsdp"]
  batch_sharding = sharding.batch_sharding(mesh)
  len_N = np.array([len(s) + 1 for s in sources], np.int64)  # EOS included.
  order_N = np.lexsort((np.arange(len(len_N)), len_N))  # By length, then position.
  padded_N = batching.bucket_lens(len_N[order_N], model.cfg.max_len, per_octave)
  plan = batching.plan_batches(padded_N, max_tokens, batch_multiple)
  out: list[list[int] | None] = [None] * len(sources)
  bar = progress.Bar(len(sources), desc, unit="sentences")
  for b in range(plan.num_batches):
    preemption.check()  # SIGTERM during a training run's BLEU: save and stop within seconds.
    ids_n = order_N[plan.starts[b]:plan.starts[b] + plan.counts[b]]
    rows, length = int(plan.rows[b]), int(plan.lens[b])
    src_RxS = np.zeros((rows, length), np.int32)
    for r, i in enumerate(ids_n):
      src_RxS[r, :len(sources[i])] = sources[i]
      src_RxS[r, len(sources[i])] = eos_id
    per_process = rows // jax.process_count()
    local = src_RxS[jax.process_index() * per_process:(jax.process_index() + 1) * per_process]
    src = sharding.global_batch({"inputs": local}, batch_sharding)["inputs"]
    steps = min(max_len or length + cfg.max_extra_len, model.cfg.max_len)
    if cfg.beam_size == 1:
      run = lambda: decode.greedy(model, params, src, max_len=steps, bos_id=bos_id,
                                  eos_id=eos_id)
    else:
      run = lambda: decode.beam_search(model, params, src, beam_size=cfg.beam_size,
                                       max_len=steps, bos_id=bos_id, eos_id=eos_id,
                                       length_penalty=cfg.length_penalty)[0]
    tokens = _stoppable(lambda: jax.block_until_ready(run()))
    if jax.process_count() > 1:  # Every process gets every hypothesis.
      tokens = multihost_utils.process_allgather(tokens, tiled=True)
    for i, row in zip(ids_n, decode.strip(tokens, eos_id)):
      out[i] = row
    bar.update(len(ids_n))
  bar.close()
  return out


def _stoppable(fn):
  """fn() in a worker thread while this one checks for a stop every 50 ms: one batch's
  decode, with its compilation for a new shape, takes seconds (tens on a loaded CPU) that
  no signal can cut short, so a SIGTERM during it is honoured at once (preemption.check
  raises) and the batch is abandoned; the process exits after its checkpoint without
  waiting for it. Many processes decode in step (their collectives): there, fn() as is."""
  if jax.process_count() > 1:
    return fn()
  result = {}

  def work():
    try:
      result["value"] = fn()
    except BaseException as e:  # Raised again in the caller's thread.
      result["error"] = e

  thread = threading.Thread(target=work, name="lnjax-decode-batch", daemon=True)
  thread.start()
  while thread.is_alive():
    preemption.check()
    thread.join(0.05)
  if "error" in result:
    raise result["error"]
  return result["value"]


def bleu(hypotheses: list[str], references: list[str], tokenize: str = "13a") -> dict:
  """Corpus BLEU of detokenized hypotheses (tokenize='13a') or of tokenized text ('none')."""
  if len(hypotheses) != len(references):
    raise errors.LnjaxError(
        f"{len(hypotheses)} hypotheses for {len(references)} references: refusing to score")
  if not references:
    raise errors.LnjaxError("no references to score")
  metric = sacrebleu.BLEU(tokenize=tokenize)
  result = metric.corpus_score(hypotheses, [references])
  return {"bleu": float(result.score), "signature": str(metric.get_signature()),
          "brevity_penalty": float(result.bp)}


def score_split(setup, params, data, split: str, cfg: DecodeConfig, mesh) -> dict:
  """Decodes `split` and scores it: BLEU beside sentences/s."""
  t0 = time.perf_counter()
  hyps = decode_split(setup, params, data, split, cfg, mesh)
  seconds = time.perf_counter() - t0
  refs = (data.tokenized_references(split) if data.sacrebleu_tokenize == "none"
          else data.references(split))
  scores = bleu(hyps, refs, data.sacrebleu_tokenize)
  return {**scores, "hypotheses": hyps, "sentences_per_second": len(hyps) / seconds}


def write_hypotheses(path: str, hypotheses: list[str]) -> None:
  fileio.write_text(path, "".join(h.replace("\n", " ") + "\n" for h in hypotheses))
