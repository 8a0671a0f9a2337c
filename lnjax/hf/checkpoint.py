"""Hugging Face model folders <-> lnjax's own models, each with the norm placement it has.

  GPT-2 (GPT2LMHeadModel, GPT2Model; Radford et al. 2019) -> models.TransformerLM with
      norm_position='pre' (a LN before each sub-layer and a final LN), learned positions,
      tanh-GELU (activation 'gelu'), biases everywhere, the output tied to the token
      embedding, embeddings not scaled by √D. Its Conv1D weights are stored [in, out], as
      lnjax's kernels; c_attn holds W_Q, W_K, W_V side by side.
  BERT (BertForMaskedLM, BertModel; Devlin et al. 2019, arXiv 1810.04805) ->
      models.bert.BertPretraining (masked LM) or BertEncoder with norm_position='post', a LN
      on the embedding sum (embed_norm), segment (token type) embeddings, erf-GELU
      ('gelu_erf'), ε 1e-12, the MLM head's dense + GELU + LN and per-token bias. Its
      nn.Linear weights are stored [out, in]: transposed.

`read_folder` reads config.json with json and the weights with safetensors' numpy API (no
torch, no transformers); `to_hf` maps an lnjax model back. Whatever a mapping cannot carry
is refused with one line naming the field (HFError: exit 2).
"""

import dataclasses
import json
import os

import numpy as np

from lnjax.core import errors
from lnjax.models import ModelConfig

CONFIG_FILE, WEIGHTS_FILE, INDEX_FILE = "config.json", "model.safetensors", "model.safetensors.index.json"

# architecture -> (lnjax task: 'lm' | 'mlm' | 'encoder', tensor prefix in a saved folder)
ARCHITECTURES = {"GPT2LMHeadModel": ("lm", "transformer."), "GPT2Model": ("lm", ""),
                 "BertForMaskedLM": ("mlm", "bert."), "BertModel": ("encoder", "")}
# Hugging Face activation names (transformers.activations.ACT2FN) <-> model.activation.
_ACTIVATIONS = {"gelu_new": "gelu", "gelu_pytorch_tanh": "gelu", "gelu_fast": "gelu",
                "gelu": "gelu_erf", "relu": "relu"}
_ACTIVATION_NAMES = {"gelu": "gelu_new", "gelu_erf": "gelu", "relu": "relu"}
# Tensors a folder may hold that no lnjax parameter needs: GPT-2's causal-mask buffers,
# BERT's position-id buffer, pooler and next-sentence head (BertForMaskedLM drops them too).
_IGNORED_SUFFIXES = (".attn.bias", ".attn.masked_bias", "embeddings.position_ids")
_IGNORED_PREFIXES = ("pooler.", "bert.pooler.", "cls.seq_relationship.")


class HFError(errors.LnjaxError):
  """A Hugging Face folder, config or weight file lnjax cannot import or write."""


@dataclasses.dataclass
class Imported:
  folder: str
  architecture: str  # A key of ARCHITECTURES.
  task: str  # 'lm' (TransformerLM), 'mlm' (BertPretraining), 'encoder' (BertEncoder).
  cfg: ModelConfig
  model: object  # The Flax module.
  params: dict  # Nested, float32 numpy arrays.
  hf_config: dict  # config.json


def make_model(task: str, cfg: ModelConfig):
  from lnjax.models import TransformerLM
  from lnjax.models.bert import BertEncoder, BertPretraining

  if task == "lm":
    return TransformerLM(cfg)
  if task == "mlm":
    return BertPretraining(cfg, next_sentence=False)
  return BertEncoder(cfg)


def logits(imported: Imported, ids_BxT, mask_BxT=None, segments_BxT=None):
  """The model's output on ids [B, T] with Hugging Face's attention_mask (1 real, 0 padding):
  next-token logits [B, T, V] (GPT-2), masked-LM logits at every position [B, T, V] (BERT
  MLM) or the last hidden states [B, T, D] (BertModel)."""
  import jax.numpy as jnp

  ids_BxT = jnp.asarray(ids_BxT, jnp.int32)
  mask_BxT = jnp.ones_like(ids_BxT) if mask_BxT is None else jnp.asarray(mask_BxT)
  variables = {"params": imported.params}
  if imported.task == "lm":
    return imported.model.apply(variables, ids_BxT, mask_BxT=mask_BxT)
  segments_BxT = jnp.zeros_like(ids_BxT) if segments_BxT is None else jnp.asarray(segments_BxT)
  if imported.task == "encoder":
    return imported.model.apply(variables, ids_BxT, segments_BxT, deterministic=True,
                                mask_BxT=mask_BxT)
  positions_BxT = jnp.broadcast_to(jnp.arange(ids_BxT.shape[1]), ids_BxT.shape)
  return imported.model.apply(variables, ids_BxT, segments_BxT, positions_BxT,
                              mask_BxT=mask_BxT)["mlm"]


def read_config(folder: str) -> tuple[dict, str, str]:
  """(config.json, architecture, task) of a Hugging Face model folder, or one line why not."""
  path = os.path.join(folder, CONFIG_FILE)
  if not os.path.isdir(folder):
    raise HFError(f"{folder} is not a folder")
  if not os.path.isfile(path):
    raise HFError(f"{folder} is not a Hugging Face model folder: it has no {CONFIG_FILE}")
  try:
    with open(path, encoding="utf-8") as f:
      config = json.load(f)
  except (OSError, UnicodeDecodeError, ValueError) as e:
    raise HFError(f"{path} is not readable JSON ({e})") from None
  if not isinstance(config, dict):
    raise HFError(f"{path} is not a JSON object")
  architectures = config.get("architectures") or []
  if len(architectures) != 1 or architectures[0] not in ARCHITECTURES:
    raise HFError(f"{path}: architectures={architectures} is not supported (lnjax imports "
                  f"{', '.join(ARCHITECTURES)})")
  return config, architectures[0], ARCHITECTURES[architectures[0]][0]


def model_config(config: dict, architecture: str) -> ModelConfig:
  """The ModelConfig of a Hugging Face config; a field it cannot carry is refused."""
  get = lambda key, default=None: config.get(key, default)

  def require(key, allowed, default=None):
    value = get(key, default)
    if value not in allowed:
      raise HFError(f"config.json: {key}={value!r} is not supported (lnjax imports "
                    f"{' or '.join(map(repr, allowed))})")
    return value

  if architecture.startswith("GPT2"):
    require("model_type", ("gpt2",))
    require("scale_attn_weights", (True,), True)
    require("scale_attn_by_inverse_layer_idx", (False,), False)
    require("add_cross_attention", (False,), False)
    act = require("activation_function", tuple(_ACTIVATIONS), "gelu_new")
    d = get("n_embd", 768)
    return ModelConfig(
        vocab_size=get("vocab_size", 50257), num_layers=get("n_layer", 12), d_model=d,
        num_heads=get("n_head", 12), d_ff=get("n_inner") or 4 * d,
        max_len=get("n_positions", 1024), norm_position="pre", norm_kind="layernorm",
        norm_eps=get("layer_norm_epsilon", 1e-5), dropout_rate=get("resid_pdrop", 0.1),
        attention_dropout_rate=get("attn_pdrop", 0.1), activation=_ACTIVATIONS[act],
        tie_embeddings=get("tie_word_embeddings", True), pos_emb="learned", use_bias=True,
        scale_embeddings=False)
  require("model_type", ("bert",))
  require("position_embedding_type", ("absolute",), "absolute")
  require("is_decoder", (False,), False)
  require("add_cross_attention", (False,), False)
  require("type_vocab_size", (2,), 2)
  act = require("hidden_act", tuple(_ACTIVATIONS), "gelu")
  return ModelConfig(
      vocab_size=get("vocab_size", 30522), num_layers=get("num_hidden_layers", 12),
      d_model=get("hidden_size", 768), num_heads=get("num_attention_heads", 12),
      d_ff=get("intermediate_size", 3072), max_len=get("max_position_embeddings", 512),
      norm_position="post", norm_kind="layernorm", norm_eps=get("layer_norm_eps", 1e-12),
      dropout_rate=get("hidden_dropout_prob", 0.1),
      attention_dropout_rate=get("attention_probs_dropout_prob", 0.1),
      activation=_ACTIVATIONS[act], tie_embeddings=get("tie_word_embeddings", True),
      pos_emb="learned", use_bias=True, scale_embeddings=False, embed_norm=True)


def tensor_map(architecture: str, cfg: ModelConfig, prefix: str) -> list[tuple[str, str, str]]:
  """[(lnjax parameter 'layer_0.ffn.wi.kernel', Hugging Face tensor name, how)]: `how` is
  'same' (vectors, embeddings, Conv1D kernels, all stored as lnjax stores them), 'linear'
  (nn.Linear's [out, in]: transposed) or 'qkv:i' (GPT-2's c_attn [D, 3D]: the i-th D
  columns, or its bias's i-th D entries)."""
  out = []
  norm = lambda ln, hf, names=("weight", "bias"): [
      (f"{ln}.scale", f"{hf}.{names[0]}", "same"), (f"{ln}.bias", f"{hf}.{names[1]}", "same")]
  dense = lambda ln, hf, how: [(f"{ln}.kernel", f"{hf}.weight", how),
                               (f"{ln}.bias", f"{hf}.bias", "same")]
  p = prefix
  if architecture.startswith("GPT2"):
    out += [("embed.embedding", f"{p}wte.weight", "same"),
            ("embed.positions", f"{p}wpe.weight", "same")]
    for i in range(cfg.num_layers):
      h, ln = f"{p}h.{i}", f"layer_{i}"
      out += norm(f"{ln}.self_attn_norm", f"{h}.ln_1")
      for j, name in enumerate(("query", "key", "value")):
        out += [(f"{ln}.self_attn.{name}.kernel", f"{h}.attn.c_attn.weight", f"qkv:{j}"),
                (f"{ln}.self_attn.{name}.bias", f"{h}.attn.c_attn.bias", f"qkv:{j}")]
      out += dense(f"{ln}.self_attn.out", f"{h}.attn.c_proj", "same")
      out += norm(f"{ln}.ffn_norm", f"{h}.ln_2")
      out += dense(f"{ln}.ffn.wi", f"{h}.mlp.c_fc", "same")
      out += dense(f"{ln}.ffn.wo", f"{h}.mlp.c_proj", "same")
    out += norm("final_norm", f"{p}ln_f")
    if not cfg.tie_embeddings:
      out.append(("logits.kernel", "lm_head.weight", "linear"))
    return out
  b = "bert." if p else ""  # lnjax's BertPretraining holds the encoder under 'bert'.
  out += [(f"{b}embed.embedding", f"{p}embeddings.word_embeddings.weight", "same"),
          (f"{b}embed.positions", f"{p}embeddings.position_embeddings.weight", "same"),
          (f"{b}segment_embed", f"{p}embeddings.token_type_embeddings.weight", "same")]
  out += norm(f"{b}embed_norm", f"{p}embeddings.LayerNorm")
  for i in range(cfg.num_layers):
    h, ln = f"{p}encoder.layer.{i}", f"{b}stack.layer_{i}"
    for name in ("query", "key", "value"):
      out += dense(f"{ln}.self_attn.{name}", f"{h}.attention.self.{name}", "linear")
    out += dense(f"{ln}.self_attn.out", f"{h}.attention.output.dense", "linear")
    out += norm(f"{ln}.self_attn_norm", f"{h}.attention.output.LayerNorm")
    out += dense(f"{ln}.ffn.wi", f"{h}.intermediate.dense", "linear")
    out += dense(f"{ln}.ffn.wo", f"{h}.output.dense", "linear")
    out += norm(f"{ln}.ffn_norm", f"{h}.output.LayerNorm")
  if p:  # The masked-LM head.
    out += dense("mlm_transform", "cls.predictions.transform.dense", "linear")
    out += norm("mlm_norm", "cls.predictions.transform.LayerNorm")
    if cfg.tie_embeddings:
      out.append(("mlm_bias", "cls.predictions.bias", "same"))
    else:  # Untied, transformers reads the decoder's own bias, not cls.predictions.bias.
      out += [("logits.kernel", "cls.predictions.decoder.weight", "linear"),
              ("mlm_bias", "cls.predictions.decoder.bias", "same")]
  return out


def _from_hf(value: np.ndarray, how: str, d: int) -> np.ndarray:
  if how == "linear":
    return value.T
  if how.startswith("qkv:"):
    j = int(how[4:])
    return value[..., j * d:(j + 1) * d]
  return value


def read_folder(folder: str) -> Imported:
  """A Hugging Face GPT-2 or BERT folder as an lnjax model and its parameters (float32)."""
  import jax
  from flax import traverse_util

  config, architecture, task = read_config(folder)
  cfg = model_config(config, architecture)
  tensors = _read_tensors(folder)
  prefix = ARCHITECTURES[architecture][1]
  if prefix and not any(k.startswith(prefix) for k in tensors):
    prefix = ""  # Saved from the base model (the hub's gpt2: 'h.0.attn...', 'wte.weight').
  model = make_model(task, cfg)
  shapes = _flat(jax.eval_shape(lambda: _init(model, task)))
  mapping = tensor_map(architecture, cfg, prefix)
  weights = os.path.join(folder, WEIGHTS_FILE)
  flat, used = {}, set()
  for name, hf_name, how in mapping:
    hf_name = _alias(hf_name, tensors)
    if hf_name not in tensors:
      raise HFError(f"{weights} has no tensor {hf_name!r} ({architecture}, "
                    f"{cfg.num_layers} layers in config.json)")
    used.add(hf_name)
    value = _from_hf(tensors[hf_name], how, cfg.d_model)
    if value.shape != shapes[name].shape:
      raise HFError(f"{weights}: tensor {hf_name!r} has shape {tuple(tensors[hf_name].shape)}, "
                    f"config.json implies {_hf_shape(shapes[name].shape, how)}")
    flat[name] = np.ascontiguousarray(value, np.float32)
  if set(flat) != set(shapes):
    raise HFError(f"{folder}: no tensor for lnjax parameter {sorted(set(shapes) - set(flat))[0]!r}")
  for hf_name in sorted(tensors):
    if hf_name not in used and not _ignorable(hf_name, cfg):
      raise HFError(f"{weights}: tensor {hf_name!r} is not supported ({architecture} as lnjax "
                    "imports it has no such weight)")
  params = traverse_util.unflatten_dict(flat, sep=".")
  return Imported(folder, architecture, task, cfg, model, params, config)


def _hf_shape(shape, how):
  if how == "linear":
    return tuple(reversed(shape))
  if how.startswith("qkv:"):
    return (*shape[:-1], 3 * shape[-1])
  return tuple(shape)


def _alias(hf_name: str, tensors: dict) -> str:
  """BERT checkpoints of the TensorFlow era name LayerNorm's γ, β 'gamma', 'beta'."""
  if hf_name in tensors:
    return hf_name
  for new, old in ((".weight", ".gamma"), (".bias", ".beta")):
    if "LayerNorm" in hf_name and hf_name.endswith(new):
      return hf_name[: -len(new)] + old
  return hf_name


def _ignorable(hf_name: str, cfg: ModelConfig) -> bool:
  if hf_name.endswith(_IGNORED_SUFFIXES) or hf_name.startswith(_IGNORED_PREFIXES):
    return True
  # A tied output saved anyway (lm_head.weight, the MLM decoder and its bias, which
  # transformers ties to cls.predictions.bias); untied, cls.predictions.bias is unused.
  if cfg.tie_embeddings:
    return hf_name in ("lm_head.weight", "cls.predictions.decoder.weight",
                       "cls.predictions.decoder.bias")
  return hf_name == "cls.predictions.bias"


def _read_tensors(folder: str) -> dict[str, np.ndarray]:
  from safetensors import safe_open

  index = os.path.join(folder, INDEX_FILE)
  if os.path.isfile(index):
    try:
      with open(index, encoding="utf-8") as f:
        files = sorted(set(json.load(f)["weight_map"].values()))
    except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError, AttributeError) as e:
      raise HFError(f"{index} is not a readable safetensors index ({e})") from None
  elif os.path.isfile(os.path.join(folder, WEIGHTS_FILE)):
    files = [WEIGHTS_FILE]
  else:
    other = [f for f in ("pytorch_model.bin", "tf_model.h5", "flax_model.msgpack")
             if os.path.isfile(os.path.join(folder, f))]
    hint = (f" (lnjax reads safetensors only, not {other[0]}: re-save it with transformers' "
            "save_pretrained)") if other else ""
    raise HFError(f"{folder} has no {WEIGHTS_FILE}{hint}")
  tensors = {}
  for name in files:
    path = os.path.join(folder, name)
    try:
      with safe_open(path, framework="numpy") as f:
        for key in f.keys():
          tensors[key] = f.get_tensor(key)
    except FileNotFoundError:
      raise HFError(f"{path} is missing (named by {INDEX_FILE})") from None
    except Exception as e:  # safetensors raises SafetensorError, OSError, ValueError.
      reason = str(e).splitlines()[0][:160] if str(e) else type(e).__name__
      raise HFError(f"{path} is not a readable safetensors file, truncated or corrupt "
                    f"({reason})") from None
  return tensors


def _init(model, task: str):
  import jax
  import jax.numpy as jnp

  ids = jnp.ones((1, 2), jnp.int32)
  args = (ids,) if task == "lm" else (ids, jnp.zeros_like(ids))
  if task == "mlm":
    args += (jnp.zeros_like(ids),)
  kwargs = {"deterministic": True} if task == "encoder" else {}
  return model.init(jax.random.key(0), *args, **kwargs)["params"]


def _flat(tree, prefix: str = "") -> dict:
  out = {}
  for key, value in tree.items():
    if hasattr(value, "items"):
      out.update(_flat(value, f"{prefix}{key}."))
    else:
      out[prefix + key] = getattr(value, "value", value)  # (unboxed from nn.Partitioned)
  return out


# ---- lnjax -> Hugging Face


def to_hf(task: str, cfg: ModelConfig, params) -> tuple[dict, dict[str, np.ndarray]]:
  """(config.json, {tensor name: array}) of an lnjax LM as GPT2LMHeadModel or of an lnjax
  BERT as BertForMaskedLM; a config field that has no counterpart is refused."""

  def require(key, allowed, why):
    value = getattr(cfg, key)
    if value not in allowed:
      raise HFError(f"model.{key}={value!r} does not map onto {architecture}: {why}")

  if task == "lm":
    architecture = "GPT2LMHeadModel"
    require("norm_position", ("pre",), "GPT-2 is Pre-LN (norm_position='pre')")
  elif task in ("mlm", "mlm_nsp"):
    architecture = "BertForMaskedLM"
    require("norm_position", ("post",), "BERT is Post-LN (norm_position='post')")
    require("embed_norm", (True,), "BERT normalizes the embedding sum (model.embed_norm=True)")
  else:
    raise HFError(f"task {task!r} has no Hugging Face counterpart here (--format=hf writes an "
                  "LM as GPT-2 or a masked-LM BERT as BertForMaskedLM)")
  require("norm_kind", ("layernorm",), "its norms are LayerNorms")
  require("pos_emb", ("learned",), "its positions are learned embeddings")
  require("use_bias", (True,), "its dense layers have biases")
  require("qk_norm", (False,), "its attention has no QK-norm")
  act_key = "activation_function" if task == "lm" else "hidden_act"
  # A scaled tied embedding (√D·E in, E out) is written untied: the input table √D·E.
  tied = cfg.tie_embeddings and not cfg.scale_embeddings
  flat = {k: np.asarray(v, np.float32) for k, v in _flat(params).items()}
  mapping = tensor_map(architecture, dataclasses.replace(cfg, tie_embeddings=tied),
                       ARCHITECTURES[architecture][1])
  embedding = "embed.embedding" if task == "lm" else "bert.embed.embedding"
  if cfg.tie_embeddings and not tied:  # lnjax's tied output reads E, unscaled.
    flat["logits.kernel"] = flat[embedding].T
  tensors = {}
  for name, hf_name, how in mapping:
    value = flat[name]
    if name == embedding and cfg.scale_embeddings:
      value = value * cfg.d_model**0.5
    if how == "linear":
      tensors[hf_name] = value.T
    elif how.startswith("qkv:"):
      tensors.setdefault(hf_name, []).append((int(how[4:]), value))
    else:
      tensors[hf_name] = value
  for hf_name, value in list(tensors.items()):
    if isinstance(value, list):
      tensors[hf_name] = np.concatenate([v for _, v in sorted(value, key=lambda x: x[0])], -1)
  if "cls.predictions.decoder.bias" in tensors:  # (what an untied BertForMaskedLM saves)
    tensors["cls.predictions.bias"] = tensors["cls.predictions.decoder.bias"]
  tensors = {k: np.ascontiguousarray(v) for k, v in tensors.items()}
  common = {"architectures": [architecture], "vocab_size": cfg.vocab_size,
            act_key: _ACTIVATION_NAMES[cfg.activation], "tie_word_embeddings": tied,
            "pad_token_id": 0, "dtype": "float32"}
  if task == "lm":
    return {**common, "model_type": "gpt2", "n_layer": cfg.num_layers, "n_embd": cfg.d_model,
            "n_head": cfg.num_heads, "n_inner": cfg.d_ff, "n_positions": cfg.max_len,
            "layer_norm_epsilon": cfg.norm_eps, "resid_pdrop": cfg.dropout_rate,
            "embd_pdrop": cfg.dropout_rate, "attn_pdrop": cfg.attention_dropout_rate,
            "bos_token_id": None, "eos_token_id": None}, tensors
  return {**common, "model_type": "bert", "num_hidden_layers": cfg.num_layers,
          "hidden_size": cfg.d_model, "num_attention_heads": cfg.num_heads,
          "intermediate_size": cfg.d_ff, "max_position_embeddings": cfg.max_len,
          "layer_norm_eps": cfg.norm_eps, "hidden_dropout_prob": cfg.dropout_rate,
          "attention_probs_dropout_prob": cfg.attention_dropout_rate, "type_vocab_size": 2,
          "position_embedding_type": "absolute"}, tensors


def write_folder(output: str, config: dict, tensors: dict[str, np.ndarray]) -> None:
  from safetensors.numpy import save_file

  os.makedirs(output, exist_ok=True)
  save_file(tensors, os.path.join(output, WEIGHTS_FILE), metadata={"format": "pt"})
  with open(os.path.join(output, CONFIG_FILE), "w", encoding="utf-8") as f:
    f.write(json.dumps(config, indent=2, sort_keys=True) + "\n")
