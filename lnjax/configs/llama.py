r"""Today's decoder (Llama, Qwen3, Gemma 2, OLMo 2) as an LM on real text, any norm placement.

  python -m lnjax.main --config=configs/llama.py:family=llama,size=course --workdir=/tmp/llama
  lnjax train --config=llama:smoke --workdir=/tmp/llama_smoke

The modern block (docs/configs.md, "The modern block"): rotary positions, a gated FFN,
RMSNorm, no biases, and each family's own pieces. Presets (comma-separated after the colon):
  family=llama|qwen3|gemma2|olmo2   each family's recipe (FAMILIES below):
      llama   Pre-LN, RMSNorm, RoPE, SwiGLU (Touvron et al., arXiv 2302.13971, 2307.09288)
      qwen3   llama's block plus a per-head RMSNorm on q and k, θ 10⁶ (arXiv 2505.09388)
      gemma2  Sandwich norms, RMSNorm with (1 + w) gains, GeGLU, attention and final
              logit soft-caps 50 and 30, local and global layers in turn with a sliding
              window, embedding × √D, tied embeddings (arXiv 2408.00118)
      olmo2   OLMo 2's x + N(F(x)) with N on q and k, θ 5·10⁵ (arXiv 2501.00656)
  norm=<placement>      any model.norm_position (default: the family's own)
  size=smoke|course|125m|1b|7b   (SIZES below; smoke is also a bare switch)
      smoke   a few steps of a tiny model, seconds on a CPU (tests use it)
      course  the course-size LM of configs/lm.py (8 layers, D 128, SentencePiece 4096,
              seq 128, batch 32) with the family's block: FFN width 344 ≈ 8/3·D keeps the
              gated FFN's parameters at the 2-matrix F 512's (Llama's rule, arXiv 2302.13971 §2)
      125m, 1b, 7b   the published shapes, for compilation and accelerators (1b and 7b
              in bfloat16 with scanned layers, 125m in float32 unscanned; the models' own
              vocabulary size V: training them on this package's data needs
              model.vocab_size=0, the tokenizer's)
  data=tiny_shakespeare|wikitext2_raw
"""

from ml_collections import config_dict

from lnjax import models
from lnjax.configs import common as config_lib

SIZES = {
    # num_layers, d_model, num_heads, num_kv_heads, d_ff, vocab_size (0 = the tokenizer's),
    # seq_len, batch_size, tokenizer.
    "smoke": (2, 32, 4, 2, 64, 0, 32, 8, "char"),
    "course": (8, 128, 4, 4, 344, 0, 128, 32, "sentencepiece"),
    # GPT-3 Small's shape (Brown et al., arXiv 2005.14165, Table 2.1: 12 layers, D 768,
    # 12 heads) with Llama's F = 8/3·D rounded (2048) and its 32000-token vocabulary.
    "125m": (12, 768, 12, 12, 2048, 32000, 1024, 32, "sentencepiece"),
    # Llama 3.2 1B (huggingface.co/meta-llama/Llama-3.2-1B, config.json: 16 layers, D 2048,
    # 32 heads, 8 KV heads, F 8192, V 128256, tied embeddings, θ 5·10⁵).
    "1b": (16, 2048, 32, 8, 8192, 128256, 2048, 8, "sentencepiece"),
    # Llama 2 7B (Touvron et al., arXiv 2307.09288, Table 1 and meta-llama/Llama-2-7b-hf's
    # config.json: 32 layers, D 4096, 32 heads, F 11008, V 32000, context 4096).
    "7b": (32, 4096, 32, 32, 11008, 32000, 4096, 4, "sentencepiece"),
}
FAMILIES = ("llama", "qwen3", "gemma2", "olmo2")
# Each family's own placement (docs/configs.md's table says why Gemma 2's is Sandwich).
FAMILY_NORM = {"llama": "pre", "qwen3": "pre", "gemma2": "sandwich", "olmo2": "olmo2"}


def get_config(arg=None):
  presets = config_lib.parse_arg(arg, family=FAMILIES, norm=models.NORM_POSITIONS,
                                 size=tuple(SIZES), data=("tiny_shakespeare", "wikitext2_raw"),
                                 smoke=None)
  config_lib.refuse_smoke_with_size(arg, presets)
  size = "smoke" if "smoke" in presets else presets.get("size", "course")
  family = presets.get("family", "llama")
  c = config_lib.lm_config()
  c.data.name = presets.get("data", "tiny_shakespeare")
  c.opt.learning_rate = 1e-3  # configs/lm.py's: the 2020 block's runs compare alike.
  c.opt.schedule = "constant"
  c.opt.warmup_steps = 30 if size == "course" else 0
  c.train.num_steps = 3000
  if size == "smoke":
    config_lib.apply_smoke(c)  # (its steps and logging; the sizes are the family's below)
  _shape(c, size)
  _block(c, family, size, presets.get("norm", FAMILY_NORM[family]))
  return c.lock()


def _shape(c, size: str):
  m = c.model
  (m.num_layers, m.d_model, m.num_heads, m.num_kv_heads, m.d_ff, m.vocab_size,
   seq_len, c.data.batch_size, c.data.tokenizer) = SIZES[size]
  m.max_len = c.data.seq_len = seq_len
  m.dropout_rate = 0.0  # Llama-style pre-training: no dropout.
  big = size in ("1b", "7b")
  m.dtype = "bfloat16" if big else "float32"  # Accelerators' compute dtype at the real shapes.
  m.scan_layers = big  # One layer compiled, not L.


def _block(c, family: str, size: str, norm: str):
  """The modern block in `family`'s recipe (sources in the module docstring), each key
  assigned once."""
  m = c.model
  gemma = family == "gemma2"
  m.norm_position = norm  # The placement: the family's own (FAMILY_NORM) unless norm= says.
  m.pos_emb = "rope"  # Rotary positions on q and k; no position table.
  m.gated_ffn = True  # SwiGLU (Llama, Qwen3, OLMo 2) or GeGLU (Gemma 2).
  m.activation = "gelu" if gemma else "silu"  # Gemma 2: tanh GELU; the others: SiLU.
  m.norm_kind = "rmsnorm"  # Every family's norm.
  m.norm_eps = 1e-5 if family == "llama" else 1e-6  # rms_norm_eps: Llama 1e-5, others 1e-6.
  m.use_bias = False  # No biases anywhere.
  m.rope_theta = {"llama": 500000.0 if size == "1b" else 10000.0, "qwen3": 1000000.0,
                  "gemma2": 10000.0, "olmo2": 500000.0}[family]  # θ: Llama 2 10⁴, Llama 3.2
  # 5·10⁵, Qwen3 10⁶, Gemma 2 10⁴, OLMo 2 5·10⁵.
  m.qk_norm = config_dict.placeholder(bool) if family == "qwen3" else False  # Qwen3: RMSNorm
  # on each head's q and k before RoPE; None: on unless the final placement normalizes q and
  # k its own way (olmo2, ngpt, hybridnorm: models.OWN_QK_NORM), resolved by ModelConfig, so
  # that norm= and a --config.model.norm_position override give the same model.
  m.tie_embeddings = gemma or family == "qwen3" or size == "1b"  # Gemma, Qwen3 (0.6B-4B)
  # and Llama 3.2 1B tie them; Llama 2 and OLMo 2 do not.
  m.scale_embeddings = gemma  # Gemma: embedding × √D; the others read it as it is.
  m.norm_unit_offset = gemma  # Gemma's RMSNorm gain (1 + w), w init 0.
  m.attn_logit_softcap = 50.0 if gemma else 0.0  # Gemma 2's attention soft-cap.
  m.final_logit_softcap = 30.0 if gemma else 0.0  # Gemma 2's final-logit soft-cap.
  m.attention_pattern = "local,global" if gemma else "global"  # Gemma 2: local, global, ...
  m.sliding_window = models.SEQUENCE_WINDOW if gemma else 0  # Gemma 2: 4096 of 8192; here
  # min(4096, seq_len/2) of the run's final data.seq_len (resolved with the run).
  m.query_scale = 0.0  # s = d_h^-1/2 in every family (0: of the width the model gets, a
  # model.head_dim or num_heads override included); Gemma 2 2B, 9B: query_pre_attn_scalar = d_h.
