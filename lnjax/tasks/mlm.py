"""BERT pre-training: masked LM, with or without next-sentence prediction."""

import functools

import jax.numpy as jnp

from lnjax.core import losses
from lnjax.data import mlm as mlm_data
from lnjax.models.bert import BertPretraining
from lnjax.core.task import Task


def bert_loss(outputs: dict, batch: dict, label_smoothing: float):
  """BERT's objective: mean masked-LM NLL + mean next-sentence NLL (when the model has
  that head). The reported loss is the masked-LM NLL per predicted token alone."""
  loss_sum, nll_sum, count = losses.cross_entropy(outputs["mlm"], batch["targets"],
                                                  batch["weights"], label_smoothing)
  if "nsp" in outputs:
    labels_Bx1 = batch["nsp_labels"][:, None]
    _, nsp_sum, b = losses.cross_entropy(outputs["nsp"][:, None], labels_Bx1,
                                         jnp.ones(labels_Bx1.shape, jnp.float32))
    loss_sum = loss_sum + nsp_sum / b * count
  return loss_sum, nll_sum, count


def batch_shapes(cfg: mlm_data.MLMDataConfig, batch_multiple: int) -> dict:
  """Every batch: B sequences of L tokens, P = data.max_predictions masked positions."""
  del batch_multiple
  B, L, P = cfg.batch_size, cfg.seq_len, cfg.max_predictions
  return {"inputs": ((B, L), jnp.int32), "segment_ids": ((B, L), jnp.int32),
          "mlm_positions": ((B, P), jnp.int32), "targets": ((B, P), jnp.int32),
          "weights": ((B, P), jnp.float32), "nsp_labels": ((B,), jnp.int32)}


def _masked_lm(name: str, next_sentence: bool) -> Task:
  def make_data(cfg, seed, process_index, process_count, batch_multiple):
    del batch_multiple  # Pairs are all one shape.
    return mlm_data.make_mlm_data(cfg, seed, process_index, process_count, next_sentence)

  return Task(
      name=name,
      data_config=mlm_data.MLMDataConfig,
      make_model=functools.partial(BertPretraining, next_sentence=next_sentence),
      example_inputs=lambda t=8: (jnp.ones((1, t), jnp.int32), jnp.zeros((1, t), jnp.int32),
                              jnp.zeros((1, 2), jnp.int32)),
      model_inputs=lambda batch: (batch["inputs"], batch["segment_ids"], batch["mlm_positions"]),
      make_data=make_data,
      loss=bert_loss,
      batch_shapes=batch_shapes,
  )


MASKED_LM = _masked_lm("mlm", next_sentence=False)
MASKED_LM_NSP = _masked_lm("mlm_nsp", next_sentence=True)

TASKS = (MASKED_LM, MASKED_LM_NSP)
