"""What differs between a language model and a translation model, in one place.

A task names its data config, builds its model and data, turns a batch into logits, and
may add held-out metrics beyond the loss (BLEU for translation). The training loop,
checkpoints and analysis take a task and know nothing else about it. `config.task`
selects one: 'lm' | 'translation' | 'mlm' | 'mlm_nsp' (BERT pre-training without and
with next-sentence prediction).
"""

import dataclasses
import functools
from typing import Any, Callable

import flax.linen as nn
import jax
import jax.numpy as jnp

from lnjax import data as data_lib
from lnjax import errors, evaluate, optim
from lnjax.data import mlm as mlm_data
from lnjax.models import EncoderDecoder, ModelConfig, TransformerLM
from lnjax.models.bert import BertPretraining


def token_cross_entropy(outputs, batch: dict, label_smoothing: float):
  """(smoothed loss sum, NLL sum, target count) of logits [B, T, V] against the batch's
  targets and weights: the loss of every task whose model returns one array of logits."""
  return optim.cross_entropy(outputs, batch["targets"], batch["weights"], label_smoothing)


@dataclasses.dataclass(frozen=True)
class Task:
  name: str
  data_config: type  # The dataclass `config.data` maps onto.
  make_model: Callable[[ModelConfig], nn.Module]
  example_inputs: Callable[[], tuple]  # Arguments of model.init (shapes only matter).
  model_inputs: Callable[[dict], tuple]  # A batch -> the model's positional arguments.
  make_data: Callable[..., Any]  # (data_cfg, seed, process_index, process_count,
  #                                 batch_multiple) -> data
  sections: dict = dataclasses.field(default_factory=dict)  # Extra config sections.
  # (setup, params, data, run, mesh, step, final) -> extra held-out scalars, e.g. BLEU.
  extra_eval: Callable[..., dict] | None = None
  best_metric: str | None = None  # A scalar of extra_eval to keep the best checkpoint by.
  # (model outputs, batch, label_smoothing) -> (objective sum, NLL sum, count): the step
  # minimizes objective sum / count and reports NLL sum / count as the loss.
  loss: Callable[..., tuple] = token_cross_entropy
  # (key, vocab_size) -> a batch of random model inputs for a data-dependent init (Admin's
  # profiling pass, models.init_params); None: the example inputs.
  random_inputs: Callable[[jax.Array, int], tuple] | None = None


LANGUAGE_MODELING = Task(
    name="lm",
    data_config=data_lib.LMDataConfig,
    make_model=TransformerLM,
    example_inputs=lambda: (jnp.zeros((1, 8), jnp.int32),),
    model_inputs=lambda batch: (batch["inputs"],),
    random_inputs=lambda key, vocab: (jax.random.randint(key, (32, 8), 1, vocab),),
    make_data=lambda cfg, seed, process_index, process_count, batch_multiple:
        data_lib.make_lm_data(cfg, seed, process_index, process_count),
)

def _bleu_eval(setup, params, data, run, mesh, step: int, final: bool) -> dict:
  """BLEU of the decoded bleu split (config.decode), at the steps it asks for."""
  cfg = run.extra["decode"]
  if not cfg.bleu_in_training:
    return {}
  if cfg.bleu_every_steps and step % cfg.bleu_every_steps and not final:
    return {}
  split = cfg.bleu_split or data.cfg.eval_splits[0]
  result = evaluate.score_split(setup, params, data, split, cfg, mesh)
  return {"eval_bleu": result["bleu"],
          "eval_decode_sentences_per_second": result["sentences_per_second"]}


TRANSLATION = Task(
    name="translation",
    data_config=data_lib.MTDataConfig,
    make_model=EncoderDecoder,
    example_inputs=lambda: (jnp.ones((1, 8), jnp.int32), jnp.ones((1, 8), jnp.int32)),
    model_inputs=lambda batch: (batch["inputs"], batch["decoder_inputs"]),
    random_inputs=lambda key, vocab: tuple(jax.random.randint(k, (32, 8), 1, vocab)
                                           for k in jax.random.split(key)),
    make_data=data_lib.make_mt_data,
    sections={"decode": evaluate.DecodeConfig},
    extra_eval=_bleu_eval,
    best_metric="eval_bleu",
)


def _bert_loss(outputs: dict, batch: dict, label_smoothing: float):
  """BERT's objective: mean masked-LM NLL + mean next-sentence NLL (when the model has
  that head). The reported loss is the masked-LM NLL per predicted token alone."""
  loss_sum, nll_sum, count = optim.cross_entropy(outputs["mlm"], batch["targets"],
                                                 batch["weights"], label_smoothing)
  if "nsp" in outputs:
    labels_Bx1 = batch["nsp_labels"][:, None]
    _, nsp_sum, b = optim.cross_entropy(outputs["nsp"][:, None], labels_Bx1,
                                        jnp.ones(labels_Bx1.shape, jnp.float32))
    loss_sum = loss_sum + nsp_sum / b * count
  return loss_sum, nll_sum, count


def _masked_lm(name: str, next_sentence: bool) -> Task:
  return Task(
      name=name,
      data_config=mlm_data.MLMDataConfig,
      make_model=functools.partial(BertPretraining, next_sentence=next_sentence),
      example_inputs=lambda: (jnp.ones((1, 8), jnp.int32), jnp.zeros((1, 8), jnp.int32),
                              jnp.zeros((1, 2), jnp.int32)),
      model_inputs=lambda batch: (batch["inputs"], batch["segment_ids"], batch["mlm_positions"]),
      make_data=lambda cfg, seed, process_index, process_count, batch_multiple:
          mlm_data.make_mlm_data(cfg, seed, process_index, process_count, next_sentence),
      loss=_bert_loss,
  )


MASKED_LM = _masked_lm("mlm", next_sentence=False)
MASKED_LM_NSP = _masked_lm("mlm_nsp", next_sentence=True)

TASKS = {t.name: t for t in (LANGUAGE_MODELING, TRANSLATION, MASKED_LM, MASKED_LM_NSP)}


def get(name: str) -> Task:
  errors.check_choice("task", name, tuple(TASKS))
  return TASKS[name]


