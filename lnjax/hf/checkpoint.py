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

  Llama, Qwen3, Gemma 2, Gemma 3 (text) and OLMo 2 -> models.TransformerLM with rotary
      positions, a gated FFN and grouped-query attention: lnjax/hf/decoders.py, one name
      table per family, and the placement each is.

`read_folder` reads config.json with json, each field's type checked (lnjax/hf/fields.py),
and the weights one tensor at a time (lnjax/hf/weights.py; sharded folders too), kept in
their stored dtype (a bfloat16 model stays bfloat16, with no float32 copy of the whole
model); `to_hf` maps an lnjax model back. Whatever a mapping cannot carry is refused with
one line naming the field (HFError: exit 2). No torch, no transformers.
"""

import dataclasses
import functools
import json
import os

import numpy as np

from lnjax.core import errors
from lnjax.hf import decoders, fields, weights
from lnjax.hf.weights import HFError, INDEX_FILE, WEIGHTS_FILE
from lnjax.models import ModelConfig

CONFIG_FILE = "config.json"

# architecture -> (lnjax task: 'lm' | 'mlm' | 'encoder', tensor prefix in a saved folder)
ARCHITECTURES = {"GPT2LMHeadModel": ("lm", "transformer."), "GPT2Model": ("lm", ""),
                 "BertForMaskedLM": ("mlm", "bert."), "BertModel": ("encoder", ""),
                 **{name: ("lm", "model.") for name in decoders.FAMILIES}}
# Hugging Face activation names (transformers.activations.ACT2FN) <-> model.activation.
_ACTIVATIONS = {"gelu_new": "gelu", "gelu_pytorch_tanh": "gelu", "gelu_fast": "gelu",
                "gelu": "gelu_erf", "relu": "relu"}
_ACTIVATION_NAMES = {"gelu": "gelu_new", "gelu_erf": "gelu", "relu": "relu"}
# Tensors a folder may hold that no lnjax parameter needs: GPT-2's causal-mask buffers,
# BERT's position-id buffer, pooler and next-sentence head (BertForMaskedLM drops them too).
_IGNORED_SUFFIXES = (".attn.bias", ".attn.masked_bias", "embeddings.position_ids")
_IGNORED_PREFIXES = ("pooler.", "bert.pooler.", "cls.seq_relationship.")


@dataclasses.dataclass
class Imported:
  folder: str
  architecture: str  # A key of ARCHITECTURES.
  task: str  # 'lm' (TransformerLM), 'mlm' (BertPretraining), 'encoder' (BertEncoder).
  cfg: ModelConfig
  model: object  # The Flax module.
  params: dict  # Nested jax arrays, in the stored dtype (float32 or bfloat16).
  hf_config: dict  # config.json

  @property
  def placement(self) -> str:
    return placement_summary(self.cfg)


def placement_summary(cfg: ModelConfig) -> str:
  """How lnjax places the norms of an imported model: 'Sandwich-LN (norm_position=sandwich,
  RMSNorm, (1 + w) gains)', 'Pre-LN + QK-norm (norm_position=pre, RMSNorm)'."""
  from lnjax.analysis import plotting

  qk = " + QK-norm" if cfg.qk_norm or cfg.norm_position == "olmo2" else ""
  kind = {"layernorm": "LayerNorm", "rmsnorm": "RMSNorm"}.get(cfg.norm_kind, cfg.norm_kind)
  offset = ", (1 + w) gains" if getattr(cfg, "norm_unit_offset", False) else ""
  return (f"{plotting.placement_label(cfg.norm_position)}{qk} "
          f"(norm_position={cfg.norm_position}, {kind}{offset})")


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
  MLM) or the last hidden states [B, T, D] (BertModel). One jitted program per model and
  shape, the parameters its argument: op by op, each operation of each shape compiled
  apart, tests/test_hf.py compiled 759 programs against 318 (45 s of CPU against 52 s,
  cold compilation cache, 2026-12-07, 2-core machine)."""
  import jax.numpy as jnp

  ids_BxT = jnp.asarray(ids_BxT, jnp.int32)
  mask_BxT = jnp.ones_like(ids_BxT) if mask_BxT is None else jnp.asarray(mask_BxT)
  segments_BxT = jnp.zeros_like(ids_BxT) if segments_BxT is None else jnp.asarray(segments_BxT)
  return _jitted_apply()(imported.model, imported.task, imported.params, ids_BxT, mask_BxT,
                         segments_BxT)


@functools.cache
def _jitted_apply():
  import jax
  import jax.numpy as jnp

  def apply(model, task, params, ids_BxT, mask_BxT, segments_BxT):
    variables = {"params": params}
    if task == "lm":
      return model.apply(variables, ids_BxT, mask_BxT=mask_BxT)
    if task == "encoder":
      return model.apply(variables, ids_BxT, segments_BxT, deterministic=True,
                         mask_BxT=mask_BxT)
    positions_BxT = jnp.broadcast_to(jnp.arange(ids_BxT.shape[1]), ids_BxT.shape)
    return model.apply(variables, ids_BxT, segments_BxT, positions_BxT,
                       mask_BxT=mask_BxT)["mlm"]

  return jax.jit(apply, static_argnames=("model", "task"))


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
  architecture = fields.architecture(config, ARCHITECTURES, path)
  return config, architecture, ARCHITECTURES[architecture][0]


def is_hf_folder(folder: str) -> bool:
  """Whether `folder` holds a Hugging Face config.json ("architectures" or "model_type"),
  rather than an lnjax run's or export's (whose config.json holds "model")."""
  try:
    with open(os.path.join(folder, CONFIG_FILE), encoding="utf-8") as f:
      config = json.load(f)
  except (OSError, UnicodeDecodeError, ValueError):
    return False
  return (isinstance(config, dict) and "model" not in config
          and ("architectures" in config or "model_type" in config))


def model_config(config: dict, architecture: str) -> ModelConfig:
  """The ModelConfig of a Hugging Face config; a field it cannot carry, or of the wrong
  type, is refused naming it."""
  try:
    if architecture in decoders.FAMILIES:
      return decoders.model_config(config, architecture)
    return _gpt2_config(fields.Fields(config)) if architecture.startswith("GPT2") else \
        _bert_config(fields.Fields(config))
  except errors.ConfigError as e:  # A value ModelConfig refuses: one line, naming both.
    raise HFError(f"config.json of {architecture} does not map onto lnjax: {e}") from None


def _gpt2_config(f: fields.Fields) -> ModelConfig:
  f.choice("model_type", ("gpt2",))
  f.choice("scale_attn_weights", (True,), True)
  f.choice("scale_attn_by_inverse_layer_idx", (False,), False)
  f.choice("add_cross_attention", (False,), False)
  act = f.choice("activation_function", tuple(_ACTIVATIONS), "gelu_new")
  d = f.integer("n_embd", 768)
  return ModelConfig(
      vocab_size=f.integer("vocab_size", 50257), num_layers=f.integer("n_layer", 12), d_model=d,
      num_heads=f.integer("n_head", 12), d_ff=f.integer("n_inner", 4 * d),
      max_len=f.integer("n_positions", 1024), norm_position="pre", norm_kind="layernorm",
      norm_eps=f.number("layer_norm_epsilon", 1e-5, positive=True),
      dropout_rate=f.number("resid_pdrop", 0.1), attention_dropout_rate=f.number("attn_pdrop", 0.1),
      activation=_ACTIVATIONS[act], tie_embeddings=f.flag("tie_word_embeddings", True),
      pos_emb="learned", use_bias=True, scale_embeddings=False)


def _bert_config(f: fields.Fields) -> ModelConfig:
  f.choice("model_type", ("bert",))
  f.choice("position_embedding_type", ("absolute",), "absolute")
  f.choice("is_decoder", (False,), False)
  f.choice("add_cross_attention", (False,), False)
  if f.integer("type_vocab_size", 2) != 2:
    raise f.refuse("type_vocab_size", f.get("type_vocab_size"), "2")
  act = f.choice("hidden_act", tuple(_ACTIVATIONS), "gelu")
  return ModelConfig(
      vocab_size=f.integer("vocab_size", 30522), num_layers=f.integer("num_hidden_layers", 12),
      d_model=f.integer("hidden_size", 768), num_heads=f.integer("num_attention_heads", 12),
      d_ff=f.integer("intermediate_size", 3072), max_len=f.integer("max_position_embeddings", 512),
      norm_position="post", norm_kind="layernorm",
      norm_eps=f.number("layer_norm_eps", 1e-12, positive=True),
      dropout_rate=f.number("hidden_dropout_prob", 0.1),
      attention_dropout_rate=f.number("attention_probs_dropout_prob", 0.1),
      activation=_ACTIVATIONS[act], tie_embeddings=f.flag("tie_word_embeddings", True),
      pos_emb="learned", use_bias=True, scale_embeddings=False, embed_norm=True)


def tensor_map(architecture: str, cfg: ModelConfig, prefix: str) -> list[tuple[str, str, str]]:
  """[(lnjax parameter 'layer_0.ffn.wi.kernel', Hugging Face tensor name, how)]: `how` is
  'same' (vectors, embeddings, Conv1D kernels, all stored as lnjax stores them), 'linear'
  (nn.Linear's [out, in]: transposed) or 'qkv:i' (GPT-2's c_attn [D, 3D]: the i-th D
  columns, or its bias's i-th D entries)."""
  if architecture in decoders.FAMILIES:
    return decoders.tensor_map(architecture, cfg, prefix)
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


def read_folder(folder: str, dtype: str | None = None) -> Imported:
  """A Hugging Face folder as an lnjax model and its parameters. `dtype`: None keeps a
  bfloat16 checkpoint in bfloat16 (and computes in it) and reads any other in float32;
  'float32' or 'bfloat16' converts every tensor, one at a time."""
  import jax

  config, architecture, task = read_config(folder)
  cfg = model_config(config, architecture)
  tensors = weights.TensorIndex(folder)
  prefix = ARCHITECTURES[architecture][1]
  if prefix and not any(k.startswith(prefix) for k in tensors):
    prefix = ""  # Saved from the base model (the hub's gpt2: 'h.0.attn...', 'wte.weight').
  mapping = [(name, _alias(hf_name, tensors), how)
             for name, hf_name, how in tensor_map(architecture, cfg, prefix)]
  dtype = dtype or _stored_dtype(tensors, mapping)
  errors.check_choice("dtype", dtype, ("float32", "bfloat16"))
  cfg = dataclasses.replace(cfg, dtype=dtype)
  model = make_model(task, cfg)
  _check_tensors(folder, architecture, cfg, tensors, mapping,
                 _flat(jax.eval_shape(lambda: _init(model, task))))
  _check_tied_copy(tensors, cfg, mapping)
  target = np.float32 if dtype == "float32" else jax.numpy.bfloat16
  flat, last = {}, (None, None)
  for name, hf_name, how in mapping:  # One tensor in host memory at a time.
    if last[0] != hf_name:  # (GPT-2's c_attn serves three parameters: read once)
      last = (hf_name, tensors.read(hf_name))
    value = np.ascontiguousarray(_from_hf(last[1], how, cfg.d_model), target)
    flat[name] = jax.device_put(value)
    del value
  from flax import traverse_util

  return Imported(folder, architecture, task, cfg, model,
                  traverse_util.unflatten_dict(flat, sep="."), config)


def _stored_dtype(tensors: weights.TensorIndex, mapping) -> str:
  import ml_dtypes

  stored = {np.dtype(tensors.dtype(hf)) for _, hf, _ in mapping if hf in tensors}
  return "bfloat16" if stored == {np.dtype(ml_dtypes.bfloat16)} else "float32"


def _check_tensors(folder, architecture, cfg, tensors, mapping, shapes) -> None:
  """Every parameter has its tensor, of the shape config.json implies, and every tensor a
  parameter: checked on the headers, before any weight is read."""
  weights_name = os.path.join(folder, WEIGHTS_FILE)
  for name, hf_name, how in mapping:
    if hf_name not in tensors:
      raise HFError(f"{weights_name} has no tensor {hf_name!r} ({architecture}, "
                    f"{cfg.num_layers} layers in config.json)")
    expected = _hf_shape(shapes[name].shape, how)
    if tensors.shape(hf_name) != expected:
      raise HFError(f"{tensors.file(hf_name)}: tensor {hf_name!r} has shape "
                    f"{tensors.shape(hf_name)}, config.json implies {expected}")
  missing = set(shapes) - {name for name, _, _ in mapping}
  if missing:
    raise HFError(f"{folder}: no tensor for lnjax parameter {sorted(missing)[0]!r}")
  used = {hf_name for _, hf_name, _ in mapping}
  for hf_name in tensors:
    if hf_name not in used and not _ignorable(hf_name, cfg):
      raise HFError(f"{tensors.file(hf_name)}: tensor {hf_name!r} is not supported "
                    f"({architecture} as lnjax imports it has no such weight)")


def _check_tied_copy(tensors: weights.TensorIndex, cfg: ModelConfig, mapping) -> None:
  """A tied model's output matrix saved anyway is left unread, as the embedding it copies;
  one that differs from the embedding is another model's head (config.json says tied, the
  weights say not): refused, not silently replaced by the embedding."""
  head = "lm_head.weight"
  embedding = dict((name, hf) for name, hf, _ in mapping).get("embed.embedding")
  if not cfg.tie_embeddings or head not in tensors or embedding not in tensors:
    return
  if not np.array_equal(tensors.read(head), tensors.read(embedding)):
    raise HFError(f"{tensors.file(head)}: config.json says tie_word_embeddings, but tensor "
                  f"{head!r} differs from {embedding!r}: set tie_word_embeddings to false "
                  "to import the stored head")


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
  if cfg.pos_emb == "rope":  # (the modern decoders)
    return decoders.ignorable(hf_name, cfg.tie_embeddings)
  if hf_name.endswith(_IGNORED_SUFFIXES) or hf_name.startswith(_IGNORED_PREFIXES):
    return True
  # A tied output saved anyway (lm_head.weight, the MLM decoder and its bias, which
  # transformers ties to cls.predictions.bias); untied, cls.predictions.bias is unused.
  if cfg.tie_embeddings:
    return hf_name in ("lm_head.weight", "cls.predictions.decoder.weight",
                       "cls.predictions.decoder.bias")
  return hf_name == "cls.predictions.bias"


def _init(model, task: str):
  import jax
  import jax.numpy as jnp

  ids = jnp.ones((1, 1), jnp.int32)  # (a model of max_len 1 is valid)
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
  """(config.json, {tensor name: array}) of an lnjax LM as GPT2LMHeadModel (learned
  positions) or as the family of its placement (rotary positions: lnjax/hf/decoders.py),
  or of an lnjax BERT as BertForMaskedLM; a config field that has no counterpart is
  refused."""

  def require(key, allowed, why):
    value = getattr(cfg, key)
    if value not in allowed:
      raise HFError(f"model.{key}={value!r} does not map onto {architecture}: {why}")

  if task == "lm" and cfg.pos_emb == "rope":  # Llama, Qwen3, Gemma 2 or 3, OLMo 2
    return decoders.to_hf(cfg, {k: np.asarray(v, np.float32) for k, v in _flat(params).items()})
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
  for key, off in (("gated_ffn", False), ("num_kv_heads", 0), ("query_scale", 0.0),
                   ("attn_logit_softcap", 0.0), ("final_logit_softcap", 0.0),
                   ("sliding_window", 0), ("norm_unit_offset", False)):
    require(key, (off, cfg.num_heads) if key == "num_kv_heads" else (off,), "the option is not in GPT-2 and BERT (a rotary-position LM is "
            "written as Llama, Qwen3, Gemma or OLMo 2)")
  if cfg.head_size != cfg.d_model // cfg.num_heads:
    require("head_dim", (0,), "its heads are d_model / num_heads wide")
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
  weights.write(output, tensors)
  with open(os.path.join(output, CONFIG_FILE), "w", encoding="utf-8") as f:
    f.write(json.dumps(config, indent=2, sort_keys=True) + "\n")
