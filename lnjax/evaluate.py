"""Translation quality: decode a split with beam search and score it with sacreBLEU.

BLEU is computed on detokenized, cased output against the raw references (sacreBLEU's
13a tokenizer: comparable with published sacreBLEU numbers), or, where the corpus is
distributed tokenized and lowercased (IWSLT14 as fairseq prepares it), as tokenized
BLEU on that text (sacreBLEU with tokenize='none', which is what fairseq's
`--scoring bleu` reports and what the paper's IWSLT numbers are).
"""

import dataclasses
import os
import time

import numpy as np
import sacrebleu

from lnjax import decode, errors, fileio, sharding


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
      if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise errors.ConfigError(f"decode.{key}={value!r} must be an integer >= {low}")
    errors.check_range("decode.length_penalty", self.length_penalty, low=0.0)


def translate(setup, params, data, split: str, cfg: DecodeConfig, mesh) -> list[str]:
  """Hypotheses for every sentence of `split`, in the split's original order."""
  batch_sharding = sharding.batch_sharding(mesh)
  hyps: dict[int, str] = {}
  for batch in data.eval_batches(split):
    src = sharding.global_batch({"inputs": batch["inputs"]}, batch_sharding)["inputs"]
    max_len = min(batch["inputs"].shape[1] + cfg.max_extra_len, setup.model.cfg.max_len)
    if cfg.beam_size == 1:
      tokens = decode.greedy(setup.model, params, src, max_len=max_len, bos_id=data.bos_id,
                             eos_id=data.eos_id)
    else:
      tokens, _ = decode.beam_search(setup.model, params, src, beam_size=cfg.beam_size,
                                     max_len=max_len, bos_id=data.bos_id, eos_id=data.eos_id,
                                     length_penalty=cfg.length_penalty)
    rows = _local_rows(tokens)
    for index, ids in zip(batch["index"], decode.strip(rows, data.eos_id)):
      if index >= 0:
        hyps[int(index)] = data.tokenizer.decode(ids)
  return [hyps[i] for i in range(len(hyps))]


def _local_rows(tokens):
  """This process's rows of a batch-sharded array, in order."""
  shards = sorted(tokens.addressable_shards, key=lambda s: s.index[0].start or 0)
  seen, rows = set(), []
  for s in shards:
    start = s.index[0].start or 0
    if start not in seen:
      seen.add(start)
      rows.append(np.asarray(s.data))
  return np.concatenate(rows, axis=0)


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
  hyps = translate(setup, params, data, split, cfg, mesh)
  seconds = time.perf_counter() - t0
  refs = (data.tokenized_references(split) if data.sacrebleu_tokenize == "none"
          else data.references(split))
  scores = bleu(hyps, refs, data.sacrebleu_tokenize)
  return {**scores, "hypotheses": hyps, "sentences_per_second": len(hyps) / seconds}


def write_hypotheses(path: str, hypotheses: list[str]) -> None:
  fileio.write_text(path, "".join(h.replace("\n", " ") + "\n" for h in hypotheses))




def predict(workdir: str, split: str | None = None, checkpoint: str = "best") -> dict:
  """Decodes `split` (default: data.test_split) with the run's checkpoint ('best', 'latest'
  or a step), writes the hypotheses to predictions/ and scores them."""
  import json

  from lnjax import checkpoint as ckpt_lib

  folder = "best_checkpoint" if checkpoint == "best" else "checkpoints"
  if checkpoint not in ("best", "latest") and not checkpoint.isdigit():
    raise errors.LnjaxError(f"--checkpoint={checkpoint!r} must be best, latest or a step")
  step = None if checkpoint in ("best", "latest") else int(checkpoint)
  config = ckpt_lib.load_config(workdir)
  if config is None:
    raise errors.CheckpointError(f"{workdir} holds no {ckpt_lib.CONFIG_FILE}: not an lnjax "
                                 "workdir")
  task = config.get("task", "lm")
  if task != "translation":
    raise errors.LnjaxError(f"--mode=predict decodes translation runs; {workdir} is a "
                            f"{task} run")
  mesh = sharding.make_mesh(sharding.MeshConfig())
  restored = ckpt_lib.restore_run(workdir, step=step, mesh=mesh, folder=folder)
  run = restored.run
  data = run.task.make_data(run.data, run.seed, 0, 1, mesh.shape["data"] * mesh.shape["fsdp"])
  split = split or run.data.test_split
  if split not in data.splits:
    raise errors.LnjaxError(f"split {split!r} is not in {run.data.name}; available: "
                            f"{', '.join(data.splits)}")
  result = score_split(restored.setup, restored.state.params, data, split, run.extra["decode"],
                       mesh)
  stem = os.path.join(workdir, "predictions", f"{split}.step{restored.step}")
  write_hypotheses(stem + ".hyp", result.pop("hypotheses"))
  result.update(split=split, step=restored.step, checkpoint=checkpoint,
                beam_size=run.extra["decode"].beam_size, hypotheses_file=stem + ".hyp")
  fileio.write_text(stem + ".json", json.dumps(result, indent=2) + "\n")
  return result
