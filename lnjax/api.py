"""The Python API, re-exported by `lnjax/__init__.py` (docs/api.md):

  config = lnjax.get_config("lm", "norm=post,smoke")    # a shipped config, or a file's path
  summary = lnjax.train(config, "/tmp/lm_post")         # trains or resumes; the summary dict
  run = lnjax.load("/tmp/lm_post")                      # best | latest | a step | avg:N
  logits_TxV = run.logits("To be, or not")
  hf = lnjax.load("HF_FOLDER")                          # a Hugging Face model folder
  hf.placement, hf.logits([1, 2, 3])                    # ids, or text with a tokenizer
  lnjax.analyze("/tmp/lm_post"); lnjax.compare(["/tmp/lm_post", "/tmp/lm_pre"])

This module imports nothing heavy at load time: the modules it calls (lnjax/core/train.py,
lnjax/analysis/report.py, lnjax/analysis/compare.py, ...) are imported inside the
functions.
"""

from __future__ import annotations

import dataclasses
import importlib
import os
from typing import Any


def get_config(name: str, preset: str = ""):
  """The config `name` with `preset` ('norm=post,smoke'): a config shipped with lnjax
  (lnjax.configs.names(): default, lm, multi30k_de_en, ...), or a config file's path.
  The config is locked (no new keys) but its values can be changed before training."""
  from lnjax import configs, sweep
  from lnjax.core import errors

  if name in configs.names():
    module = importlib.import_module(f"lnjax.configs.{name}")
  elif name.endswith(".py"):
    module = sweep.load_config_module(name)
  else:
    raise errors.ConfigError(f"config {name!r}: neither a config file (.py) nor a shipped "
                             f"config ({', '.join(configs.names())})")
  return module.get_config(preset or None)


def config_of(config) -> Any:
  """A ConfigDict as it is; a name with presets ('default:smoke') loaded by get_config."""
  if isinstance(config, str):
    name, _, preset = config.partition(":")
    return get_config(name, preset)
  return config


@dataclasses.dataclass
class Loaded:
  """A trained run ready to use: the model, its parameters, config and tokenizer.

  encode(text) -> token ids; decode(ids) -> text; logits(*inputs) -> the model's output
  for inputs given as text or ids (an LM: one text -> logits_TxV; a translation model:
  source, target prefix -> logits_TxV), a batch axis added and removed for 1-D inputs.
  """

  config: Any  # ml_collections.ConfigDict: the run's config.json, completed.
  model: Any  # The flax module (lnjax.models).
  params: Any
  tokenizer: Any  # The run's tokenizer: encode(text) -> ids, decode(ids) -> text.
  step: int  # The step of the (latest, for an average) checkpoint.
  label: str  # 'step20', or 'avg2-step20' for the mean of 2 checkpoints.

  def encode(self, text: str):
    return self.tokenizer.encode(text)

  def decode(self, ids) -> str:
    import numpy as np
    return self.tokenizer.decode([int(i) for i in np.asarray(ids).reshape(-1)])

  def logits(self, *inputs):
    import jax
    import numpy as np

    arrays = [self._ids(np.asarray(self.encode(x) if isinstance(x, str) else x))
              for x in inputs]
    single = all(a.ndim == 1 for a in arrays)
    batch = [a[None] if single else a for a in arrays]
    out = self.model.apply({"params": self.params}, *batch, deterministic=True)
    return jax.tree.map(lambda x: np.asarray(x[0] if single else x), out)

  def _ids(self, ids):
    """`ids` as int32 token ids, or a ValueError naming the vocabulary's range (an id
    outside it would index past the embedding table, which JAX clamps silently)."""
    import numpy as np

    vocab = self.model.cfg.vocab_size
    if ids.size and not np.issubdtype(ids.dtype, np.integer):
      raise ValueError(f"token ids must be integers in [0, {vocab - 1}], got dtype {ids.dtype}")
    outside = ids[(ids < 0) | (ids >= vocab)] if ids.size else ids
    if outside.size:
      raise ValueError(f"token id {int(outside[0])} is outside the vocabulary: ids must be in "
                       f"[0, {vocab - 1}] (model.vocab_size={vocab})")
    return ids.astype(np.int32)


@dataclasses.dataclass
class LoadedHF(Loaded):
  """A Hugging Face model folder imported into lnjax (lnjax/hf/checkpoint.py): `config`
  is its config.json, `model_config` the lnjax ModelConfig, `placement` how lnjax places
  its norms; `tokenizer` is None for a folder without tokenizer files and no `tokenizer=`
  (then `logits` takes token ids only)."""

  imported: Any = None

  @property
  def placement(self) -> str:
    return self.imported.placement

  @property
  def model_config(self):
    return self.imported.cfg

  def encode(self, text: str):
    if self.tokenizer is None:
      from lnjax.hf.weights import HFError
      raise HFError(f"{self.imported.folder} has no tokenizer files: pass lnjax.load(folder, "
                    "tokenizer=DIR_OR_NAME), or give token ids")
    return self.tokenizer.encode(text)

  def logits(self, ids, mask=None):
    """Logits [T, V] of one sequence (text or ids), or [B, T, V] of a batch of ids [B, T]
    with Hugging Face's attention_mask (1 real, 0 padding)."""
    import numpy as np

    from lnjax.hf import checkpoint as hf

    ids = np.asarray(self.encode(ids) if isinstance(ids, str) else ids)
    single = ids.ndim == 1
    vocab = self.imported.cfg.vocab_size
    if ids.size and (ids.dtype.kind not in "iu" or ids.min() < 0 or ids.max() >= vocab):
      from lnjax.hf.weights import HFError
      raise HFError(f"token ids must be integers in [0, {vocab}), the model's vocabulary")
    out = hf.logits(self.imported, ids[None] if single else ids,
                    None if mask is None else np.asarray(mask)[None] if single else mask)
    return np.asarray(out[0] if single else out)


def load(workdir: str, checkpoint: str = "latest", *, tokenizer: str | None = None,
         dtype: str | None = None) -> Loaded:
  """The run in `workdir` at `checkpoint`: 'best' (translation's best BLEU), 'latest', a
  step (20 or '20'), or 'avg:N' (the mean of the last N checkpoints' parameters), on the
  first local device. `workdir` may also be a Hugging Face model folder (GPT-2, BERT,
  Llama, Qwen3, Gemma 2/3, OLMo 2: a LoadedHF), read in its stored dtype (or `dtype`),
  with its own tokenizer or `tokenizer` (a folder or hub name)."""
  from lnjax.hf import checkpoint as hf_checkpoint

  if hf_checkpoint.is_hf_folder(workdir):
    return _load_hf(workdir, checkpoint, tokenizer, dtype)
  if tokenizer is not None or dtype is not None:
    from lnjax.core import errors
    raise errors.ConfigError(f"{workdir} is an lnjax run: tokenizer= and dtype= are for "
                             "Hugging Face folders (a run has its own)")
  from lnjax import tasks
  from lnjax.core import averaging, build

  mesh = build.one_device_mesh()
  chosen = averaging.restore(workdir, str(checkpoint), mesh, flag="checkpoint", tasks=tasks.get)
  b = build.build(chosen.restored.config, mesh, tasks=tasks.get, whole_data=True)
  return Loaded(b.config, b.setup.model, chosen.params, b.data.tokenizer,
                chosen.restored.step, chosen.label)


def _load_hf(folder: str, checkpoint: str, tokenizer: str | None, dtype: str | None):
  from lnjax.hf import analyze as hf_analyze, checkpoint as hf_checkpoint, tokenizer as hf_tok
  from lnjax.hf.weights import HFError

  if str(checkpoint) != "latest":
    raise HFError(f"checkpoint={checkpoint!r}: {folder} is a Hugging Face folder, one set of "
                  "weights")
  imported = hf_checkpoint.read_folder(folder, dtype)
  tok = None
  if tokenizer is not None:
    tok = hf_tok.load(hf_analyze.resolve(tokenizer))
  elif any(os.path.isfile(os.path.join(folder, name)) for name in hf_tok.TOKENIZER_FILES):
    tok = hf_tok.load(folder)
  return LoadedHF(imported.hf_config, imported.model, imported.params, tok, 0,
                  imported.architecture, imported)


def train(config, workdir: str) -> dict:
  """Trains or resumes the run in `workdir` (lnjax/core/train.py); the summary dict.
  `config`: a ConfigDict, or a config's name with its presets ('default:smoke')."""
  from lnjax import tasks
  from lnjax.core import train as train_lib

  return train_lib.train_and_evaluate(config_of(config), workdir, tasks=tasks.get)


def analyze(workdir: str, step: str = "latest", num_batches: int = 4,
            lr: float | None = None, sharpness_iters: int = 0) -> tuple[dict, str]:
  """Gradients, norms and norm Jacobians of the run at `step`, and with `sharpness_iters`
  its loss's sharpness (lnjax/analysis/report.py): (the result, the folder of its report,
  JSON and plots)."""
  from lnjax.analysis import report

  return report.analyze(workdir, step, num_batches, lr, sharpness_iters)


def compare(workdirs: list[str], output: str = "compare", title: str | None = None) -> dict:
  """Curves and a table of several runs (lnjax/analysis/compare.py): {'png', 'markdown',
  'table', 'runs', 'figure'}."""
  from lnjax.analysis import compare as compare_lib

  return compare_lib.compare(workdirs, output, title)
