"""The model's hyper-parameters: `config.model` maps onto `ModelConfig(**config.model)`."""

import dataclasses

from lnjax.core import errors
from lnjax.models import kernels, layers, norms, placement

NORM_KINDS = norms.NORM_KINDS
POS_EMBS = ("learned", "sinusoidal", "rope", "none")
ATTENTION_KINDS = ("global", "local")  # The words of model.attention_pattern.
ACTIVATIONS = tuple(layers.ACTIVATIONS)
DTYPES = ("float32", "bfloat16")
# Rematerialization of each layer in the backward pass: "none", or the name of a
# jax.checkpoint_policies policy (what the forward pass keeps; the rest is recomputed).
# How dense layers form their weight gradient: autodiff's, or from a materialized xᵀ
# (kernels.matmul_transposed_grad; faster matmuls on some CPUs, slower on others).
WEIGHT_GRADS = tuple(layers.MATMULS)
ATTENTION_IMPLS = kernels.ATTENTION_IMPLS  # plain | reference | xla | cudnn
REMAT_POLICIES = ("none", "nothing_saveable", "dots_saveable", "dots_with_no_batch_dims_saveable",
                  "everything_saveable")
# model.sliding_window = SEQUENCE_WINDOW: W = half the run's sequence length, at most
# MAX_SEQUENCE_WINDOW (Gemma 2's 4096 of 8192), resolved with the run (`for_length`).
SEQUENCE_WINDOW = -1
MAX_SEQUENCE_WINDOW = 4096
# The largest W: the window mask compares W with int32 position distances (layers.window_bias;
# XLA's positions are int32), so a W of 2³¹ or more cannot be given to it. A W at or beyond
# the sequence length masks nothing (as config.json's 4096 over a shorter max_len).
MAX_WINDOW = 2**31 - 1
# The windows a local layer takes, as the refusals of model.sliding_window name them.
WINDOWS = (f"a width W > 0, or -1 for automatic (half the run's final sequence length, at "
           f"most {MAX_SEQUENCE_WINDOW})")


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  """Sizes use the math's letters: L layers, D model width, H heads, F FFN width, V vocab."""

  vocab_size: int = 0  # V (< 2³¹: token ids are int32); 0 = taken from the tokenizer at run time.
  num_layers: int = 4  # L
  d_model: int = 128  # D
  num_heads: int = 4  # H
  d_ff: int = 512  # F
  max_len: int = 256  # Longest sequence the position embedding covers (>= data.seq_len).
  norm_position: str = "pre"  # post: LN(x + F(x)) | pre: x + F(LN(x)), with a final LN |
  # sandwich | peri | deepnorm | normformer | resi_dual | admin | mix | b2t | dyt | lns |
  # olmo2 | ngpt | hybridnorm | derf (docs/configs.md's table).
  norm_kind: str = "layernorm"  # layernorm | rmsnorm | scalenorm
  norm_eps: float = 1e-5  # ε inside the norm's square root.
  qk_norm: bool | None = False  # A norm of norm_kind on each head's q and k (ViT-22B, arXiv
  # 2302.05442; Qwen3's RMSNorm). None: on unless the placement normalizes q and k its own
  # way (OWN_QK_NORM), resolved with the run from the final norm_position (`for_placement`;
  # configs/llama.py's qwen3).
  mix_post_fraction: float = 0.25  # Mix-LN: α; the first ⌊αL⌋ layers are Post-LN.
  deepnorm_alpha: float = 0.0  # DeepNorm's α and β; 0 = the paper's for the depth
  deepnorm_beta: float = 0.0  # (placement.deepnorm_role_constants).
  dyt_alpha_init: float = 0.5  # DyT: α₀ of every DyT (the paper's default) ...
  dyt_attention_alpha_init: float = 0.0  # ... but the attention blocks'; 0 = dyt_alpha_init.
  derf_alpha_init: float = 0.5  # Derf: α₀ of every Derf (its code's default; GPT-2 runs 1.0).
  dropout_rate: float = 0.1  # On sub-layer outputs and embeddings.
  attention_dropout_rate: float = 0.0  # On attention probabilities.
  activation: str = "relu"  # FFN (and MLM head) non-linearity: relu (paper) | gelu (tanh
  # approximation, GPT-2's, Gemma's) | gelu_erf (exact, BERT's) | silu (x·σ(x), Llama's).
  scale_embeddings: bool = True  # Token embedding × √D (Vaswani et al.); False: GPT-2, BERT.
  embed_norm: bool = False  # BERT: a norm on the sum of token, position, segment embeddings.
  tie_embeddings: bool = False  # Output projection = input embedding transposed.
  pos_emb: str = "learned"  # learned | sinusoidal | rope (rotary, on each head's q and k:
  # Su et al., arXiv 2104.09864; no position table) | none
  rope_theta: float = 10000.0  # RoPE's base θ: angle p·θ^(-2i/d_h) (Llama 2 10⁴, Llama 3
  # 5·10⁵, Qwen3 10⁶); transformers' rotate_half layout (halves of d_h, not pairs).
  # The modern block (docs/configs.md "The modern block"); every default is the 2020 one.
  gated_ffn: bool = False  # FFN(x) = (act(x W_gate) ⊙ x W_up) W²: SwiGLU with silu, GeGLU
  # with gelu (Shazeer, arXiv 2002.05202).
  num_kv_heads: int = 0  # G key/value heads shared by H/G query heads each (GQA, arXiv
  # 2305.13245; 1 = MQA, arXiv 1911.02150); 0 = num_heads (multi-head).
  head_dim: int = 0  # d_h, each head's width; 0 = d_model // num_heads (`head_size`).
  query_scale: float = 0.0  # s in softmax(q kᵀ·s): 0 = d_h^-1/2 (Gemma 2: 256^-1/2).
  attn_logit_softcap: float = 0.0  # c: attention logits c·tanh(z/c), 0 = off (Gemma 2: 50;
  # arXiv 2408.00118).
  final_logit_softcap: float = 0.0  # The same on the output logits (Gemma 2: 30).
  sliding_window: int = 0  # W: a query at t sees keys t-W < s <= t in 'local' layers
  # (Beltagy et al., arXiv 2004.05150; Gemma 2: 4096); 0 = off; -1 = half the run's
  # sequence length (data.seq_len, overrides included), at most 4096 (SEQUENCE_WINDOW).
  attention_pattern: str = "global"  # Comma-separated cycle of global | local over the
  # layers (layer l: word l mod n); Gemma 2 "local,global".
  norm_unit_offset: bool = False  # Norm gains applied as 1 + w, w init 0 (Gemma's RMSNorm).
  use_bias: bool = True  # Biases in every dense layer (as in the paper's fairseq model).
  dtype: str = "float32"  # Compute dtype; parameters stay float32.
  scan_layers: bool = False  # One nn.scan over the layers (parameters stacked on a leading
  # 'layers' axis): compile time independent of depth. False: layer_0, layer_1, ...
  remat_policy: str = "none"  # Recompute each layer in the backward pass: REMAT_POLICIES.
  weight_grad: str = "autodiff"  # Dense layers' weight gradient: WEIGHT_GRADS.
  attention_impl: str = "plain"  # Attention's kernel (lnjax/models/kernels.py): plain
  # (lnjax's, tuned for CPUs) | reference (textbook, autodiff) | xla | cudnn (flash
  # attention on NVIDIA GPUs, bfloat16 only, refused on other devices as the run is built,
  # lnjax/core/build.py; both jax.nn.dot_product_attention).
  # Encoder-decoder only:
  num_decoder_layers: int = 0  # Decoder depth; 0 = num_layers.
  encoder_norm_position: str = ""  # Per-stack override of norm_position; "" = same.
  decoder_norm_position: str = ""  # The same for the decoder stack.
  share_embeddings: bool = True  # One embedding for source and target (joint vocabulary).

  def __post_init__(self):
    errors.check_choice("model.norm_position", self.norm_position, placement.NORM_POSITIONS)
    for key in ("encoder_norm_position", "decoder_norm_position"):
      errors.check_choice(f"model.{key}", getattr(self, key), ("",) + placement.NORM_POSITIONS)
    errors.check_range("model.num_decoder_layers", self.num_decoder_layers, low=0)
    errors.check_choice("model.norm_kind", self.norm_kind, NORM_KINDS)
    errors.check_choice("model.pos_emb", self.pos_emb, POS_EMBS)
    errors.check_choice("model.activation", self.activation, ACTIVATIONS)
    errors.check_choice("model.dtype", self.dtype, DTYPES)
    errors.check_choice("model.scan_layers", self.scan_layers, (False, True))
    errors.check_choice("model.remat_policy", self.remat_policy, REMAT_POLICIES)
    errors.check_choice("model.weight_grad", self.weight_grad, WEIGHT_GRADS)
    errors.check_choice("model.attention_impl", self.attention_impl, ATTENTION_IMPLS)
    if self.attention_impl in ("xla", "cudnn") and self.attention_dropout_rate:
      raise errors.ConfigError(
          f"model.attention_impl={self.attention_impl!r} has no attention dropout: set "
          f"model.attention_dropout_rate=0 (now {self.attention_dropout_rate}) or "
          "model.attention_impl='plain'")
    if self.attention_impl == "cudnn" and self.dtype != "bfloat16":
      raise errors.ConfigError("model.attention_impl='cudnn' (cuDNN flash attention) needs "
                               f"model.dtype='bfloat16', not {self.dtype!r}")
    for key in ("num_layers", "d_model", "num_heads", "d_ff", "max_len"):
      errors.check_range(f"model.{key}", getattr(self, key), low=1)
    errors.check_range("model.vocab_size", self.vocab_size, low=0, high=2**31 - 1)  # int32 ids.
    if self.vocab_size == 1:  # (One token: every loss is 0, every plan meaningless.)
      raise errors.ConfigError("model.vocab_size=1 is invalid: 2 or more, or 0 for the "
                               "tokenizer's")
    errors.check_range("model.dropout_rate", self.dropout_rate, low=0.0, high=1.0, high_open=True)
    errors.check_range(
        "model.attention_dropout_rate", self.attention_dropout_rate, low=0.0, high=1.0, high_open=True)
    errors.check_range("model.norm_eps", self.norm_eps, low=0.0, low_open=True)
    errors.check_choice("model.qk_norm", self.qk_norm, (None, False, True))
    errors.check_choice("model.scale_embeddings", self.scale_embeddings, (False, True))
    errors.check_choice("model.embed_norm", self.embed_norm, (False, True))
    errors.check_range("model.mix_post_fraction", self.mix_post_fraction, low=0.0, high=1.0)
    for key in ("deepnorm_alpha", "deepnorm_beta"):
      errors.check_range(f"model.{key}", getattr(self, key), low=0.0)
    for key in ("dyt_alpha_init", "dyt_attention_alpha_init", "derf_alpha_init"):
      errors.check_range(f"model.{key}", getattr(self, key), low=0.0)
    placement.check_options(self)
    if self.d_model % self.num_heads and not self.head_dim:
      raise errors.ConfigError(
          f"model.d_model={self.d_model} must be divisible by model.num_heads={self.num_heads} "
          "(or set model.head_dim)")
    self._check_block_options()

  def _check_block_options(self):
    """The modern block's keys (docs/configs.md)."""
    # θ > 1: the frequencies θ^(-2i/d_h) fall from 1 rad a position (θ = 1 gives every pair
    # the same one, θ < 1 rising ones).
    errors.check_range("model.rope_theta", self.rope_theta, low=1.0, low_open=True)
    errors.check_choice("model.gated_ffn", self.gated_ffn, (False, True))
    errors.check_choice("model.norm_unit_offset", self.norm_unit_offset, (False, True))
    for key in ("num_kv_heads", "head_dim"):
      errors.check_int(f"model.{key}", getattr(self, key), low=0)
    try:
      errors.check_int("model.sliding_window", self.sliding_window, low=SEQUENCE_WINDOW)
    except errors.ConfigError:
      raise errors.ConfigError(f"model.sliding_window={self.sliding_window!r} is invalid: "
                               f"give {WINDOWS}; or 0 for none") from None
    if self.sliding_window > MAX_WINDOW:
      raise errors.ConfigError(f"model.sliding_window={self.sliding_window} is invalid: at most "
                               f"{MAX_WINDOW} (2³¹ − 1: positions are int32); a W of the sequence "
                               "length or more already lets every query see every earlier key")
    for key in ("query_scale", "attn_logit_softcap", "final_logit_softcap"):
      # (bounded so that the float32 logits stay finite: c·tanh(z/c) at c = inf is NaN)
      errors.check_range(f"model.{key}", getattr(self, key), low=0.0, high=1e4)
    if not isinstance(self.attention_pattern, str):
      raise errors.ConfigError(f"model.attention_pattern={self.attention_pattern!r} must be a "
                               "comma-separated string of global | local")
    if self.num_kv_heads and self.num_heads % self.num_kv_heads:
      raise errors.ConfigError(f"model.num_heads={self.num_heads} must be a multiple of "
                               f"model.num_kv_heads={self.num_kv_heads}")
    if self.pos_emb == "rope" and self.head_size % 2:
      raise errors.ConfigError(f"model.pos_emb='rope' needs an even head width, not "
                               f"{self.head_size} (model.head_dim or d_model/num_heads)")
    pattern = self.attention_pattern.split(",")
    for word in pattern:
      errors.check_choice("model.attention_pattern", word, ATTENTION_KINDS)
    where = f"model.attention_pattern={self.attention_pattern!r} with model.sliding_window="
    if "local" in pattern and not self.sliding_window:
      raise errors.ConfigError(f"{where}0 (none): local layers need a window; give {WINDOWS}")
    if "local" not in pattern and self.sliding_window:
      raise errors.ConfigError(f"{where}{self.sliding_window}: no layer is local to take the "
                               "window; add local to the pattern, or set model.sliding_window=0 "
                               "(none)")
    if self.attn_logit_softcap and self.attention_impl in ("xla", "cudnn"):
      raise errors.ConfigError(f"model.attention_impl={self.attention_impl!r} has no attention-"
                               "logit soft-cap: set model.attn_logit_softcap=0 or "
                               "model.attention_impl='plain'")
    if self.norm_unit_offset and self.norm_kind == "scalenorm":
      raise errors.ConfigError("model.norm_unit_offset=True needs a per-dimension gain: "
                               "model.norm_kind 'layernorm' or 'rmsnorm', not 'scalenorm'")

  def for_placement(self) -> "ModelConfig":
    """This config with a qk_norm of None resolved from its final placements: on unless one
    of them normalizes q and k its own way (OWN_QK_NORM)."""
    if self.qk_norm is not None:
      return self
    return dataclasses.replace(self, qk_norm=not placement.own_qk_norm(self))

  def for_length(self, length: int) -> "ModelConfig":
    """This config for a run of sequences of `length` tokens: a sliding_window of -1
    (SEQUENCE_WINDOW) resolved to half of `length`, at least 1 and at most 4096."""
    if self.sliding_window != SEQUENCE_WINDOW:
      return self
    window = max(1, min(MAX_SEQUENCE_WINDOW, length // 2))
    return dataclasses.replace(self, sliding_window=window)

  def layer_windows(self) -> list[int]:
    """Each layer's sliding window W (0 = global): `attention_pattern` cycled over layers."""
    if self.sliding_window == SEQUENCE_WINDOW:
      raise ValueError("model.sliding_window=-1 is resolved with the run's sequence length: "
                       "ModelConfig.for_length first")
    pattern = self.attention_pattern.split(",")
    return [self.sliding_window if pattern[i % len(pattern)] == "local" else 0
            for i in range(self.num_layers)]

  def stack(self, which: str) -> "ModelConfig":
    """This config as the `encoder` or `decoder` stack sees it (its own norm placement and
    depth; DeepNorm's α and β for an N+M encoder-decoder)."""
    position = getattr(self, f"{which}_norm_position") or self.norm_position
    placement.check_stack(position, which)
    n, m = self.num_layers, self.num_decoder_layers or self.num_layers
    alpha, beta = placement.deepnorm_role_constants(which, n, m)
    return dataclasses.replace(self, norm_position=position,
                               num_layers=m if which == "decoder" else n,
                               encoder_norm_position="", decoder_norm_position="",
                               num_decoder_layers=0, deepnorm_alpha=self.deepnorm_alpha or alpha,
                               deepnorm_beta=self.deepnorm_beta or beta)

  @property
  def head_size(self) -> int:
    """d_h: `head_dim`, or D/H when it is 0."""
    return self.head_dim or self.d_model // self.num_heads
