r"""Export a run's parameters for use outside lnjax's checkpoints.

  python -m lnjax.cli.export --workdir=DIR --format=safetensors [--dtype=float32|bfloat16]
      [--checkpoint=best|latest|STEP|avg:N] [--output=DIR/export]

writes into --output:
  model.safetensors   every parameter under its flat name ('decoder.layer_0.ffn.wi.kernel':
                      the Flax path joined by dots), float32 or bfloat16
  config.json         the model config (model), the task, where the parameters come from
                      (checkpoint, steps), the dtype, and the run's whole lnjax config
  tokenizer.model     the run's SentencePiece model (translation runs)

`--format=hf` writes a Hugging Face folder instead (lnjax/hf/export.py): an LM as GPT-2, a
BERT as BertForMaskedLM, with the run's tokenizer; a config with no counterpart is refused.

`load(folder)` rebuilds the Flax model from config.json and returns it with the
parameters: `model.apply({"params": params}, ...)` then gives the checkpoint's logits
exactly (float32), or those of its parameters rounded to bfloat16.
"""

import dataclasses
import json
import os

import numpy as np

from lnjax.core import errors

FORMATS = ("safetensors", "hf")
DTYPES = ("float32", "bfloat16")
WEIGHTS_FILE, CONFIG_FILE, TOKENIZER_FILE = "model.safetensors", "config.json", "tokenizer.model"


def flatten(params) -> dict[str, np.ndarray]:
  """{'encoder.layer_0.self_attn.query.kernel': array, ...} of a nested parameter dict."""
  out = {}

  def walk(node, prefix):
    for key, value in node.items():
      if "." in key:
        raise errors.LnjaxError(f"parameter name {key!r} holds a dot: cannot flatten")
      if hasattr(value, "items"):
        walk(value, f"{prefix}{key}.")
      else:
        out[prefix + key] = np.asarray(value)

  walk(params, "")
  return out


def export(workdir: str, output: str, checkpoint: str = "best", dtype: str = "float32",
           fmt: str = "safetensors") -> dict:
  """Writes the parameters `checkpoint` names, their config and tokenizer into `output`."""
  import jax
  import ml_dtypes
  from safetensors.numpy import save_file

  from lnjax import tasks
  from lnjax.core import averaging, checkpoint as ckpt_lib

  errors.check_choice("--format", fmt, FORMATS)
  errors.check_choice("--dtype", dtype, DTYPES)
  averaging.parse_spec(checkpoint)
  from lnjax.core import fileio
  fileio.refuse_run_files("--output", output, [os.path.join(output, name) for name in
                                               (WEIGHTS_FILE, CONFIG_FILE, TOKENIZER_FILE)],
                          own=[workdir])
  config = ckpt_lib.load_config(workdir)
  if config is None:
    raise errors.CheckpointError(f"{workdir} holds no config.json: not an lnjax workdir")
  if checkpoint == "best" and not os.path.isdir(os.path.join(workdir, "best_checkpoint")):
    checkpoint = "latest"  # Only tasks with a best metric (BLEU) keep a best checkpoint.
  chosen = averaging.restore(workdir, checkpoint, tasks=tasks.get)
  run = chosen.restored.run
  if fmt == "hf":  # A Hugging Face folder (lnjax/hf/export.py).
    from lnjax.hf import export as hf_export
    result = hf_export.export(run, chosen.params, output, dtype)
    return {**result, "dtype": dtype, "checkpoint": checkpoint, "steps": chosen.steps,
            "output": output, "files": sorted(os.listdir(output))}
  target = np.float32 if dtype == "float32" else ml_dtypes.bfloat16
  flat = {k: v.astype(target) for k, v in flatten(jax.device_get(chosen.params)).items()}
  os.makedirs(output, exist_ok=True)
  save_file(flat, os.path.join(output, WEIGHTS_FILE),
            metadata={"format": "lnjax", "dtype": dtype, "checkpoint": checkpoint})
  meta = {"task": run.task.name, "model": dataclasses.asdict(run.model), "dtype": dtype,
          "checkpoint": checkpoint, "steps": chosen.steps,
          "num_parameters": int(sum(v.size for v in flat.values())),
          "workdir": os.path.abspath(workdir), "lnjax_config": config.to_dict()}
  if run.task.name == "translation":
    from lnjax.core import build
    data = build.build(chosen.restored.config, build.one_device_mesh(), tasks=tasks.get,
                       whole_data=True).data
    with open(os.path.join(output, TOKENIZER_FILE), "wb") as f:
      f.write(data.tokenizer.model_proto)
    meta["tokenizer"] = {"file": TOKENIZER_FILE, "lowercase": run.data.lowercase,
                         "pad_id": 0, "unk_id": 1, "bos_id": data.bos_id,
                         "eos_id": data.eos_id}
  with open(os.path.join(output, CONFIG_FILE), "w") as f:
    f.write(json.dumps(meta, indent=2, sort_keys=True) + "\n")
  return {**meta, "output": output, "files": sorted(os.listdir(output))}


@dataclasses.dataclass
class Exported:
  model: object  # The Flax module (models.TransformerLM, EncoderDecoder, ...).
  params: dict
  config: dict  # config.json


def load(folder: str, dtype: str | None = "float32") -> Exported:
  """The Flax model rebuilt from `folder`'s config.json, with its parameters (cast to
  `dtype`; None: as stored)."""
  import ml_collections
  from flax import traverse_util
  from safetensors.numpy import load_file

  from lnjax import tasks
  from lnjax.core import run as run_lib

  with open(os.path.join(folder, CONFIG_FILE)) as f:
    meta = json.load(f)
  run = run_lib.resolve_config(ml_collections.ConfigDict(meta["lnjax_config"]), tasks=tasks.get)
  model = run.task.make_model(run.model)
  flat = load_file(os.path.join(folder, WEIGHTS_FILE))
  if dtype is not None:
    flat = {k: v.astype(dtype) for k, v in flat.items()}
  return Exported(model, traverse_util.unflatten_dict(flat, sep="."), meta)
