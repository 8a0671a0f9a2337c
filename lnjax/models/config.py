"""The model's hyper-parameters: `config.model` maps onto `ModelConfig(**config.model)`."""

import dataclasses

from lnjax.core import errors
from lnjax.models import kernels, layers, norms, placement

NORM_KINDS = norms.NORM_KINDS
POS_EMBS = ("learned", "sinusoidal")
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


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  """Sizes use the math's letters: L layers, D model width, H heads, F FFN width, V vocab."""

  vocab_size: int = 0  # V; 0 = taken from the tokenizer at run time.
  num_layers: int = 4  # L
  d_model: int = 128  # D
  num_heads: int = 4  # H
  d_ff: int = 512  # F
  max_len: int = 256  # Longest sequence the position embedding covers (>= data.seq_len).
  norm_position: str = "pre"  # post: LN(x + F(x)) | pre: x + F(LN(x)), with a final LN |
  # sandwich | peri | deepnorm | normformer | resi_dual | admin | mix | b2t | dyt | lns |
  # olmo2 | ngpt (docs/configs.md's table).
  norm_kind: str = "layernorm"  # layernorm | rmsnorm | scalenorm
  norm_eps: float = 1e-5  # ε inside the norm's square root.
  qk_norm: bool = False  # LayerNorm on each head's q and k (ViT-22B).
  mix_post_fraction: float = 0.25  # Mix-LN: α; the first ⌊αL⌋ layers are Post-LN.
  deepnorm_alpha: float = 0.0  # DeepNorm's α and β; 0 = the paper's for the depth
  deepnorm_beta: float = 0.0  # (placement.deepnorm_role_constants).
  dyt_alpha_init: float = 0.5  # DyT: α₀ of every DyT (the paper's default) ...
  dyt_attention_alpha_init: float = 0.0  # ... but the attention blocks'; 0 = dyt_alpha_init.
  dropout_rate: float = 0.1  # On sub-layer outputs and embeddings.
  attention_dropout_rate: float = 0.0  # On attention probabilities.
  activation: str = "relu"  # FFN (and MLM head) non-linearity: relu (paper) | gelu (tanh
  # approximation, GPT-2's) | gelu_erf (exact, BERT's).
  scale_embeddings: bool = True  # Token embedding × √D (Vaswani et al.); False: GPT-2, BERT.
  embed_norm: bool = False  # BERT: a norm on the sum of token, position, segment embeddings.
  tie_embeddings: bool = False  # Output projection = input embedding transposed.
  pos_emb: str = "learned"  # learned | sinusoidal
  use_bias: bool = True  # Biases in every dense layer (as in the paper's fairseq model).
  dtype: str = "float32"  # Compute dtype; parameters stay float32.
  scan_layers: bool = False  # One nn.scan over the layers (parameters stacked on a leading
  # 'layers' axis): compile time independent of depth. False: layer_0, layer_1, ...
  remat_policy: str = "none"  # Recompute each layer in the backward pass: REMAT_POLICIES.
  weight_grad: str = "autodiff"  # Dense layers' weight gradient: WEIGHT_GRADS.
  attention_impl: str = "plain"  # Attention's kernel (lnjax/models/kernels.py): plain
  # (lnjax's, tuned for CPUs) | reference (textbook, autodiff) | xla | cudnn (flash
  # attention on NVIDIA GPUs, bfloat16 only; both jax.nn.dot_product_attention).
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
    errors.check_range("model.vocab_size", self.vocab_size, low=0)
    errors.check_range("model.dropout_rate", self.dropout_rate, low=0.0, high=1.0, high_open=True)
    errors.check_range(
        "model.attention_dropout_rate", self.attention_dropout_rate, low=0.0, high=1.0, high_open=True)
    errors.check_range("model.norm_eps", self.norm_eps, low=0.0, low_open=True)
    errors.check_choice("model.qk_norm", self.qk_norm, (False, True))
    errors.check_choice("model.scale_embeddings", self.scale_embeddings, (False, True))
    errors.check_choice("model.embed_norm", self.embed_norm, (False, True))
    errors.check_range("model.mix_post_fraction", self.mix_post_fraction, low=0.0, high=1.0)
    for key in ("deepnorm_alpha", "deepnorm_beta"):
      errors.check_range(f"model.{key}", getattr(self, key), low=0.0)
    for key in ("dyt_alpha_init", "dyt_attention_alpha_init"):
      errors.check_range(f"model.{key}", getattr(self, key), low=0.0)
    placement.check_options(self)
    if self.d_model % self.num_heads:
      raise errors.ConfigError(
          f"model.d_model={self.d_model} must be divisible by model.num_heads={self.num_heads}")

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
  def head_dim(self) -> int:
    return self.d_model // self.num_heads
