"""Today's decoders, Llama, Qwen3, Gemma 2, Gemma 3 (text) and OLMo 2, <-> lnjax's
TransformerLM with the modern block (rotary positions, gated FFN, grouped-query attention).

Each family is a name-mapping table (lnjax parameter <- Hugging Face tensor, per layer; as
MaxText's and levanter's checkpoint converters keep one per model) plus its config.json
fields, read from and written to transformers' own configuration classes
(transformers/models/<family>/configuration_<family>.py, 5.24). The placement each one is:

  Llama    pre       x + F(N(x)), RMSNorm, final N                 (Pre-LN)
  Qwen3    pre       Pre-LN, plus RMSNorm on each head's q and k (qk_norm)
  Gemma 2  sandwich  x + N_out(F(N_in(x))), final N; RMSNorm with a (1 + w) gain, embedding
                     × √D, attention and final logits soft-capped, local/global layers.
                     Not Peri-LN: Peri-LN (arXiv 2502.02732) also normalizes the embedding
                     before layer 0; Gemma 2 feeds the scaled embedding to layer 0 as it is
                     (Gemma2Model.forward), which is lnjax's Sandwich placement.
  Gemma 3  sandwich  Gemma 2's block with RMSNorm (1 + w) on each head's q and k and no soft
                     caps; imported only where its local and global layers share one RoPE θ
                     (lnjax has one model.rope_theta; the released Gemma 3 models use 10⁴
                     locally and 10⁶ globally, so those are refused naming rope_parameters).
  OLMo 2   olmo2     x + N(F(x)), RMSNorm over all heads' q and over all k (before the
                     split into heads), final N

Nothing here imports torch or transformers.
"""

import dataclasses

import numpy as np

from lnjax.hf.fields import Fields
from lnjax.hf.weights import HFError

# lnjax parameter (in layer_i) <- Hugging Face module (in model.layers.i): every projection
# an nn.Linear, stored [out, in] and transposed; the norms' gains as stored (Gemma's w of
# its 1 + w gain is lnjax's norm_unit_offset `scale`).
_ATTENTION = (("self_attn.query", "self_attn.q_proj"), ("self_attn.key", "self_attn.k_proj"),
              ("self_attn.value", "self_attn.v_proj"), ("self_attn.out", "self_attn.o_proj"))
_GATED_FFN = (("ffn.wi_gate", "mlp.gate_proj"), ("ffn.wi_up", "mlp.up_proj"),
              ("ffn.wo", "mlp.down_proj"))
_QK_NORM = (("self_attn.query_norm", "self_attn.q_norm"), ("self_attn.key_norm", "self_attn.k_norm"))
# The norms of each family's layer. transformers' `post_attention_layernorm` is the norm
# before the FFN in Llama and Qwen3, the norm of the attention's output in Gemma and OLMo 2.
_PRE_NORMS = (("self_attn_norm", "input_layernorm"), ("ffn_norm", "post_attention_layernorm"))
_SANDWICH_NORMS = (("self_attn_norm", "input_layernorm"),
                   ("self_attn_out_norm", "post_attention_layernorm"),
                   ("ffn_norm", "pre_feedforward_layernorm"),
                   ("ffn_out_norm", "post_feedforward_layernorm"))
_OLMO2_NORMS = (("self_attn_norm", "post_attention_layernorm"),
                ("ffn_norm", "post_feedforward_layernorm"))


@dataclasses.dataclass(frozen=True)
class Family:
  model_type: str  # config.json's model_type
  norm_position: str  # lnjax's placement
  norms: tuple  # (lnjax norm, Hugging Face norm) of each layer, QK-norms included
  gemma: bool = False  # (1 + w) norms, √D embedding, GeGLU, query_pre_attn_scalar, caps
  qk_norm: bool = False  # RMSNorm per head on q and k (Qwen3, Gemma 3)
  windows: bool = False  # sliding-window layers (layer_types)
  mlp_bias: bool = False  # a separate mlp_bias field (Llama)
  activation_key: str = "hidden_act"
  # What its configuration class gives a field config.json leaves out (transformers 5.24):
  head_dim: int = 0  # 0 = hidden_size / num_attention_heads
  rms_norm_eps: float = 1e-6
  sliding_window: int | None = None
  softcaps: tuple[float, float] = (0.0, 0.0)  # attention's and the final logits' (0: none)


FAMILIES = {
    "LlamaForCausalLM": Family("llama", "pre", _PRE_NORMS, mlp_bias=True),
    "Qwen3ForCausalLM": Family("qwen3", "pre", _PRE_NORMS + _QK_NORM, qk_norm=True,
                               windows=True, head_dim=128, sliding_window=4096),
    "Gemma2ForCausalLM": Family("gemma2", "sandwich", _SANDWICH_NORMS, gemma=True,
                                windows=True, activation_key="hidden_activation",
                                head_dim=256, sliding_window=4096, softcaps=(50.0, 30.0)),
    "Gemma3ForCausalLM": Family("gemma3_text", "sandwich", _SANDWICH_NORMS + _QK_NORM,
                                gemma=True, qk_norm=True, windows=True,
                                activation_key="hidden_activation", head_dim=256,
                                sliding_window=4096),
    "Olmo2ForCausalLM": Family("olmo2", "olmo2", _OLMO2_NORMS + _QK_NORM, rms_norm_eps=1e-5),
}
# transformers.activations.ACT2FN names <-> model.activation.
ACTIVATIONS = {"silu": "silu", "swish": "silu", "gelu_pytorch_tanh": "gelu", "gelu_new": "gelu",
               "gelu_fast": "gelu", "gelu": "gelu_erf", "relu": "relu"}
ACTIVATION_NAMES = {"silu": "silu", "gelu": "gelu_pytorch_tanh", "gelu_erf": "gelu", "relu": "relu"}
_LAYER_TYPES = {"full_attention": "global", "sliding_attention": "local"}


def tensor_map(architecture: str, cfg, prefix: str = "model.") -> list[tuple[str, str, str]]:
  """[(lnjax parameter, Hugging Face tensor, 'same' | 'linear')] of a family's model."""
  family, p = FAMILIES[architecture], prefix
  out = [("embed.embedding", f"{p}embed_tokens.weight", "same")]
  for i in range(cfg.num_layers):
    ln, hf = f"layer_{i}", f"{p}layers.{i}"
    for name, module in _ATTENTION + _GATED_FFN:
      out.append((f"{ln}.{name}.kernel", f"{hf}.{module}.weight", "linear"))
      if cfg.use_bias:
        out.append((f"{ln}.{name}.bias", f"{hf}.{module}.bias", "same"))
    out += [(f"{ln}.{name}.scale", f"{hf}.{module}.weight", "same")
            for name, module in family.norms]
  out.append(("final_norm.scale", f"{p}norm.weight", "same"))
  if not cfg.tie_embeddings:
    out.append(("logits.kernel", "lm_head.weight", "linear"))
  return out


def ignorable(hf_name: str, tied: bool) -> bool:
  """Tensors a folder may hold that no lnjax parameter needs: RoPE's inverse frequencies
  (saved by older transformers) and a tied output saved anyway."""
  return hf_name.endswith(".rotary_emb.inv_freq") or (tied and hf_name == "lm_head.weight")


# ---- config.json -> ModelConfig


def model_config(config: dict, architecture: str):
  """The ModelConfig of a family's config.json; a field lnjax cannot carry is refused."""
  from lnjax.models import ModelConfig

  family, f = FAMILIES[architecture], Fields(config)
  f.choice("model_type", (family.model_type,))
  d, h = f.integer("hidden_size"), f.integer("num_attention_heads")
  g = f.integer("num_key_value_heads", h)
  if h % g:
    raise HFError(f"config.json: num_attention_heads={h} is not a multiple of "
                  f"num_key_value_heads={g}")
  head_dim = f.integer("head_dim", family.head_dim or d // h)
  num_layers = f.integer("num_hidden_layers")
  bias = f.flag("attention_bias", False)
  if family.mlp_bias and f.flag("mlp_bias", False) != bias:
    raise HFError(f"config.json: attention_bias={bias} with mlp_bias={not bias} is not "
                  "supported (lnjax's model.use_bias sets both)")
  if bias and not family.mlp_bias:
    raise f.refuse("attention_bias", True, f"false: {architecture}'s FFN has no bias, and "
                   "lnjax's model.use_bias sets both")
  act = ACTIVATIONS[f.choice(family.activation_key, tuple(ACTIVATIONS),
                             "gelu_pytorch_tanh" if family.gemma else "silu")]
  pattern, window = _attention_pattern(f, family, num_layers)
  theta = _rope_theta(f, family, set(pattern.split(",")))
  options = dict(
      vocab_size=f.integer("vocab_size"), num_layers=num_layers, d_model=d, num_heads=h,
      num_kv_heads=g, head_dim=head_dim, d_ff=f.integer("intermediate_size"),
      max_len=f.integer("max_position_embeddings"), norm_position=family.norm_position,
      norm_kind="rmsnorm", norm_eps=f.number("rms_norm_eps", family.rms_norm_eps, positive=True),
      qk_norm=family.qk_norm, dropout_rate=0.0,
      attention_dropout_rate=f.number("attention_dropout", 0.0),
      activation=act, gated_ffn=True, pos_emb="rope", rope_theta=theta,
      tie_embeddings=f.flag("tie_word_embeddings", family.gemma), use_bias=bias,
      scale_embeddings=family.gemma, sliding_window=window, attention_pattern=pattern)
  if family.gemma:
    if f.flag("use_bidirectional_attention", False):
      raise f.refuse("use_bidirectional_attention", True, "false: lnjax's LM is causal")
    # Gemma 3's attention cap is read but unused (below), so any c >= 0 runs in transformers.
    attn_cap = _softcap(f, "attn_logit_softcapping", family.softcaps[0],
                        positive=family.model_type == "gemma2")
    final_cap = _softcap(f, "final_logit_softcapping", family.softcaps[1])
    options.update(norm_unit_offset=True,
                   query_scale=f.number("query_pre_attn_scalar", 256, positive=True) ** -0.5,
                   # Gemma3Attention keeps attn_logit_softcapping but passes no softcap to
                   # its attention function (transformers 5.24): Gemma 3 has no such cap.
                   attn_logit_softcap=0.0 if family.model_type == "gemma3_text" else attn_cap,
                   final_logit_softcap=final_cap)
  return ModelConfig(**options)


def _softcap(f: Fields, key: str, default: float, positive: bool = True) -> float:
  """A logit soft-cap c (c·tanh(z/c)); null is none (0.0, lnjax's off). transformers
  divides by c wherever c is not null, so c = 0 is no "off" there: NaN final logits, or
  attention logits all 0. It is refused, as any c but a finite one > 0. Left out: the
  configuration class's `default` (Gemma 3's None, 0.0 here)."""
  if key not in f.config:
    return float(default)
  value = f.config[key]
  if value is None:
    return 0.0
  try:
    return f.number(key, positive=positive)
  except HFError:
    bound = "> 0" if positive else ">= 0"
    raise HFError(f"{f.where}: {key}={value!r} must be null (no cap) or a finite number "
                  f"{bound}") from None


def _attention_pattern(f: Fields, family: Family, num_layers: int) -> tuple[str, int]:
  """(model.attention_pattern, model.sliding_window) of layer_types: the shortest cycle
  that gives every layer its type ('local,global' for Gemma 2's alternation)."""
  window = None if f.is_null("sliding_window") else f.get("sliding_window", family.sliding_window)
  if family.model_type == "qwen3" and not f.flag("use_sliding_window", False):
    window = None  # (Qwen3Config: no window unless use_sliding_window)
  types = f.strings("layer_types", num_layers)
  if not family.windows:
    if types and set(types) != {"full_attention"}:
      raise f.refuse("layer_types", types, "full_attention layers only")
    return "global", 0
  # Every entry is checked, whether or not a window is in use: a type lnjax has no attention
  # for (chunked_attention, ...) is refused, not read as a global layer.
  unknown = sorted(set(types or ()) - set(_LAYER_TYPES))
  if unknown:
    raise f.refuse("layer_types", unknown[0], " or ".join(map(repr, _LAYER_TYPES)))
  if window is None and family.gemma:
    # Gemma2Model and Gemma3TextModel build a sliding-window mask on every call, local
    # layers or not: a null window fails there (TypeError), so it is no "none" to import.
    raise HFError(f"{f.where}: sliding_window=null must be an integer >= 1: "
                  f"{family.model_type}'s transformers model needs a window, local layers or not")
  if window is None:
    return "global", 0
  window = f.integer("sliding_window", window)
  if types is None:  # What the configuration classes fill in when none is written.
    every = {"qwen3": 0, "gemma2": 2, "gemma3_text": f.integer("sliding_window_pattern", 6)}
    n = every[family.model_type]
    if family.model_type == "qwen3":
      first = f.integer("max_window_layers", 28, low=0)
      types = ["sliding_attention" if i >= first else "full_attention" for i in range(num_layers)]
    else:
      types = ["sliding_attention" if (i + 1) % n else "full_attention" for i in range(num_layers)]
  kinds = [_LAYER_TYPES[t] for t in types]
  period = next(p for p in range(1, len(kinds) + 1)
                if all(k == kinds[i % p] for i, k in enumerate(kinds)))
  return ",".join(kinds[:period]), window if "local" in kinds else 0


def _rope_theta(f: Fields, family: Family, kinds: set[str]) -> float:
  """RoPE's θ from rope_parameters (transformers 5) or rope_theta and rope_scaling (older
  config.json files); any rope_type but 'default' is refused: lnjax's RoPE has no
  frequency scaling (linear, dynamic, yarn, llama3, longrope). `kinds`: the model's
  layers' attention ('local', 'global'), whose θ Gemma 3 gives apart."""
  if family.model_type == "gemma3_text":
    return _gemma3_rope_theta(f, kinds)
  params = f.obj("rope_scaling") or f.obj("rope_parameters") or {}
  key = "rope_scaling" if f.get("rope_scaling") else "rope_parameters"
  default = f.number("rope_theta", 10000.0, positive=True)
  return _one_rope(Fields(params, f"config.json: {key}"), default)


def _gemma3_rope_theta(f: Fields, kinds: set[str]) -> float:
  """Gemma 3's one θ, read as Gemma3TextConfig.convert_rope_params_to_dict reads it
  (transformers 5.24): rope_parameters holds one entry per layer type, a legacy
  rope_scaling updates the full-attention one, and an entry without rope_theta takes
  rope_theta (full) or rope_local_base_freq (sliding), else its default_theta, 10⁶ global
  and 10⁴ local. Only the types of the model's layers count (Gemma3RotaryEmbedding)."""
  params = f.obj("rope_parameters") or {}
  key = "rope_parameters" if params else "rope_theta/rope_local_base_freq"
  defaults = {"full_attention": f.number("rope_theta", 1e6, positive=True),
              "sliding_attention": f.number("rope_local_base_freq", 10000.0, positive=True)}
  thetas = {}
  for kind, default in defaults.items():
    if _LAYER_TYPES[kind] not in kinds:
      continue
    entry = params.get(kind, {})
    entry = dict(entry) if isinstance(entry, dict) else {"rope_type": entry}
    where = f"config.json: rope_parameters.{kind}"
    if kind == "full_attention" and f.obj("rope_scaling"):
      entry.update(f.obj("rope_scaling"))
      where = "config.json: rope_scaling"
    thetas[kind] = _one_rope(Fields(entry, where), default)
  if len(set(thetas.values())) > 1:
    raise HFError(f"config.json: {key} gives the local and global layers different RoPE θ "
                  f"({thetas}); lnjax has one model.rope_theta")
  return next(iter(thetas.values()))


def _one_rope(g: Fields, default: float) -> float:
  g.choice("rope_type", ("default",), g.config.get("type", "default"))
  if g.config.get("partial_rotary_factor") not in (None, 1, 1.0):
    raise g.refuse("partial_rotary_factor", g.config["partial_rotary_factor"], "1.0")
  return g.number("rope_theta", default, positive=True)


# ---- lnjax -> Hugging Face


def architecture_of(cfg) -> str:
  """The family an lnjax LM with rotary positions is written as, by its placement."""
  key = (cfg.norm_position, cfg.qk_norm, cfg.norm_unit_offset)
  names = {("pre", False, False): "LlamaForCausalLM", ("pre", True, False): "Qwen3ForCausalLM",
           ("sandwich", False, True): "Gemma2ForCausalLM",
           ("sandwich", True, True): "Gemma3ForCausalLM", ("olmo2", False, False): "Olmo2ForCausalLM"}
  if key not in names:
    raise HFError(f"model.norm_position={cfg.norm_position!r} with qk_norm={cfg.qk_norm}, "
                  f"norm_unit_offset={cfg.norm_unit_offset} does not map onto a Hugging Face "
                  "family (pre: Llama, pre + qk_norm: Qwen3, sandwich + norm_unit_offset: "
                  "Gemma 2, and + qk_norm: Gemma 3, olmo2: OLMo 2)")
  return names[key]


def to_hf(cfg, flat: dict[str, np.ndarray]) -> tuple[dict, dict[str, np.ndarray]]:
  """(config.json, {tensor: array}) of an lnjax LM with rotary positions; `flat` maps
  'layer_0.ffn.wo.kernel' to float32 arrays."""
  architecture = architecture_of(cfg)
  family = FAMILIES[architecture]
  _check_exportable(cfg, architecture, family)
  # The embedding the first layer reads is E·√D (scale_embeddings) in lnjax, E_hf·√D in
  # Gemma, E_hf elsewhere: E_hf = E·(lnjax's scale / the family's). Tied only if equal.
  ours, theirs = (cfg.d_model**0.5 if s else 1.0 for s in (cfg.scale_embeddings, family.gemma))
  tied = cfg.tie_embeddings and ours == theirs
  flat = dict(flat)
  if cfg.tie_embeddings and not tied:  # lnjax's tied output reads E, unscaled.
    flat["logits.kernel"] = flat["embed.embedding"].T
  flat["embed.embedding"] = flat["embed.embedding"] * np.float32(ours / theirs)
  mapping = tensor_map(architecture, dataclasses.replace(cfg, tie_embeddings=tied))
  tensors = {hf: np.ascontiguousarray(flat[ln].T if how == "linear" else flat[ln])
             for ln, hf, how in mapping}
  return hf_config(cfg, architecture, family, tied), tensors


def _check_exportable(cfg, architecture: str, family: Family) -> None:
  def require(key, ok: bool, why: str):
    if not ok:
      raise HFError(f"model.{key}={getattr(cfg, key)!r} does not map onto {architecture}: {why}")

  require("norm_kind", cfg.norm_kind == "rmsnorm", "its norms are RMSNorms")
  require("gated_ffn", cfg.gated_ffn, "its FFN is gated (gate_proj, up_proj, down_proj)")
  require("embed_norm", not cfg.embed_norm, "it has no norm on the embedding")
  require("activation", cfg.activation in ACTIVATION_NAMES, "no such activation")
  require("use_bias", family.mlp_bias or not cfg.use_bias, "its layers have no biases")
  if not family.gemma:
    for key in ("attn_logit_softcap", "final_logit_softcap"):
      require(key, not getattr(cfg, key), "it has no logit soft-capping (Gemma 2 has)")
    require("query_scale", cfg.query_scale in (0.0, cfg.head_size**-0.5),
            "its attention scale is head_dim^-1/2")
  if family.model_type == "gemma3_text":  # (see model_config)
    require("attn_logit_softcap", not cfg.attn_logit_softcap,
            "transformers' Gemma 3 applies no attention-logit soft-cap (Gemma 2 does)")
  if family.gemma and cfg.query_scale:
    scalar = cfg.query_scale**-2
    require("query_scale", abs(scalar - round(scalar)) < 1e-6 * scalar,
            "query_pre_attn_scalar = query_scale^-2 is an integer in Gemma's config")
  if not family.windows:
    require("attention_pattern", set(cfg.attention_pattern.split(",")) == {"global"} or
            not cfg.sliding_window, "it has no sliding-window layers")
  if family.model_type == "olmo2":
    require("head_dim", cfg.head_size == cfg.d_model // cfg.num_heads,
            "Olmo2Config has no head_dim field (d_model / num_heads)")
  if family.model_type != "qwen3":  # (LlamaConfig and GemmaConfig check it)
    require("num_heads", cfg.d_model % cfg.num_heads == 0,
            f"{family.model_type}'s config requires d_model % num_heads == 0")


def layer_types(cfg) -> list[str]:
  cycle = cfg.attention_pattern.split(",")
  local = lambda i: cycle[i % len(cycle)] == "local" and cfg.sliding_window
  return ["sliding_attention" if local(i) else "full_attention" for i in range(cfg.num_layers)]


def hf_config(cfg, architecture: str, family: Family, tied: bool) -> dict:
  rope = {"rope_type": "default", "rope_theta": cfg.rope_theta}
  config = {
      "architectures": [architecture], "model_type": family.model_type,
      "vocab_size": cfg.vocab_size, "hidden_size": cfg.d_model,
      "intermediate_size": cfg.d_ff, "num_hidden_layers": cfg.num_layers,
      "num_attention_heads": cfg.num_heads, "num_key_value_heads": cfg.num_kv_heads or cfg.num_heads,
      family.activation_key: ACTIVATION_NAMES[cfg.activation],
      "max_position_embeddings": cfg.max_len, "rms_norm_eps": cfg.norm_eps,
      "tie_word_embeddings": tied, "rope_theta": cfg.rope_theta, "rope_parameters": rope,
      "attention_bias": cfg.use_bias, "attention_dropout": cfg.attention_dropout_rate,
      "pad_token_id": 0, "bos_token_id": None, "eos_token_id": None, "dtype": "float32"}
  if family.model_type != "olmo2":
    config["head_dim"] = cfg.head_size
  if family.mlp_bias:
    config["mlp_bias"] = cfg.use_bias
  if family.windows:
    types = layer_types(cfg)
    # Gemma2Model and Gemma3TextModel build a sliding-window mask on every call, which
    # fails on a null window: with no local layer, the window is max_len, used by none.
    window = cfg.sliding_window or (cfg.max_len if family.gemma else None)
    config.update(layer_types=types, sliding_window=window)
    if family.model_type == "qwen3":
      config.update(use_sliding_window=bool(cfg.sliding_window), max_window_layers=cfg.num_layers)
  if family.gemma:
    config.update(query_pre_attn_scalar=round(cfg.query_scale**-2) if cfg.query_scale
                  else cfg.head_size, attn_logit_softcapping=cfg.attn_logit_softcap or None,
                  final_logit_softcapping=cfg.final_logit_softcap or None,
                  use_bidirectional_attention=False)
  if family.model_type == "gemma3_text":
    config["rope_parameters"] = {"full_attention": dict(rope), "sliding_attention": dict(rope)}
    config.pop("rope_theta")
  return config
