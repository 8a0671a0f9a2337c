"""Translation: an encoder-decoder on length-bucketed batches, BLEU by beam search at
each evaluation (config section `decode`), the best checkpoint kept by BLEU."""

import jax
import jax.numpy as jnp

from lnjax.inference import evaluate
from lnjax.data import batching, translation as mt_data
from lnjax.models import EncoderDecoder
from lnjax.core.task import EvalContext, Task


def bleu(ctx: EvalContext) -> dict:
  """BLEU of the decoded bleu split (config.decode), at the steps it asks for."""
  cfg = ctx.section(evaluate.DecodeConfig)
  if not cfg.bleu_in_training:
    return {}
  if cfg.bleu_every_steps and ctx.step % cfg.bleu_every_steps and not ctx.final:
    return {}
  split = cfg.bleu_split or ctx.data.cfg.eval_splits[0]
  result = evaluate.score_split(ctx.setup, ctx.params, ctx.data, split, cfg, ctx.mesh)
  return {"eval_bleu": result["bleu"],
          "eval_decode_sentences_per_second": result["sentences_per_second"]}


def batch_shapes(cfg: mt_data.MTDataConfig, batch_multiple: int) -> dict:
  """The longest bucket's batch (the most attention memory): length L = the bucket of
  data.max_len, as many rows as data.max_tokens allows (lnjax/data/batching.py). A corpus
  without pairs that long trains on shorter buckets only."""
  L = batching.bucket_len(cfg.max_len, cfg.max_len, cfg.buckets_per_octave)
  B = batching.batch_rows(L, cfg.max_tokens, batch_multiple)
  ids, mask = ((B, L), jnp.int32), ((B, L), jnp.float32)
  return {"inputs": ids, "inputs_mask": mask, "targets": ids, "decoder_inputs": ids,
          "weights": mask}


TRANSLATION = Task(
    name="translation",
    data_config=mt_data.MTDataConfig,
    make_model=EncoderDecoder,
    example_inputs=lambda t=8: (jnp.ones((1, t), jnp.int32), jnp.ones((1, t), jnp.int32)),
    model_inputs=lambda batch: (batch["inputs"], batch["decoder_inputs"]),
    random_inputs=lambda key, vocab, t=8: tuple(jax.random.randint(k, (32, t), 1, vocab)
                                           for k in jax.random.split(key)),
    make_data=mt_data.make_mt_data,
    sections={"decode": evaluate.DecodeConfig},
    evaluators=(bleu,),
    best_metric="eval_bleu",
    batch_shapes=batch_shapes,
)

TASKS = (TRANSLATION,)
