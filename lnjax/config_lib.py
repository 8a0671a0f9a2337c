"""Helpers shared by the files in configs/: the LM's default keys, preset parsing, and
mapping a config section onto its dataclass with one-line errors.

Every run is described by one `ml_collections.ConfigDict` with the sections
`model` (-> models.ModelConfig), `opt` (-> optim.OptConfig), `data` (-> data.LMDataConfig),
`train` (-> train.TrainConfig), `mesh` (-> sharding.MeshConfig) and a top-level `seed`.
"""

import dataclasses
from typing import Any, Mapping

import ml_collections

from lnjax import errors


def lm_config() -> ml_collections.ConfigDict:
  """Every key a decoder-only LM run reads, at the values of a small Pre-LN model."""
  c = _common("lm")
  c.data = d = ml_collections.ConfigDict()
  d.name = "tiny_shakespeare"  # tiny_shakespeare | wikitext2_raw | tfds:NAME | hf:PATH
  _data_dirs(d)
  _external_source(d, "text")
  d.tokenizer = "char"  # char | sentencepiece
  d.vocab_size = 4096  # SentencePiece vocabulary size.
  d.sp_model_type = "unigram"  # SentencePiece model: unigram | bpe.
  d.seq_len = 128  # L: tokens per training sequence.
  d.batch_size = 32  # B: sequences per step, over all devices and hosts.
  d.eval_split = "validation"
  d.eval_batches = 16  # Held-out batches per evaluation; 0 = the whole split.
  return c


def translation_config() -> ml_collections.ConfigDict:
  """Every key an encoder-decoder translation run reads."""
  c = _common("translation")
  c.model.max_len = 256
  c.model.tie_embeddings = True  # Output projection = the shared embedding (joint vocab).
  c.data = d = ml_collections.ConfigDict()
  d.name = "multi30k_de_en"  # multi30k_de_en | iwslt14_de_en | wmt14_de_en | tfds: | hf:
  d.source_lang = "de"  # de | en
  d.target_lang = "en"
  _data_dirs(d)
  _external_source(d, "")  # "": features named de/en; "translation": nested (HF's wmt)
  d.vocab_size = 8000  # Joint SentencePiece vocabulary, trained on the train split.
  d.sp_model_type = "unigram"  # unigram | bpe
  d.spm_path = ml_collections.FieldReference(None, field_type=str)  # A ready model instead.
  d.max_tokens = 4096  # Tokens per batch (per side, padded), over all devices: fairseq's.
  d.max_len = 256  # Training pairs longer than this (subword tokens) are dropped.
  d.eval_splits = ("validation",)  # Held-out loss on the first; BLEU (decode.bleu_split).
  d.test_split = "test_2016_flickr"  # What `--mode=predict` decodes by default.
  d.lowercase = False  # True for IWSLT14 as fairseq prepares it (tokenized, lowercased).
  c.decode = e = ml_collections.ConfigDict()
  e.beam_size = 4  # 1 = greedy.
  e.length_penalty = 1.0  # α in log p / length^α.
  e.max_extra_len = 50  # Hypotheses up to source bucket length + this.
  e.bleu_every_steps = 0  # 0 = BLEU at every evaluation.
  e.bleu_in_training = True  # False: no decoding while training (predict mode still scores).
  e.bleu_split = ""  # "" = data.eval_splits[0].
  return c


def bert_config() -> ml_collections.ConfigDict:
  """Every key a BERT pre-training run reads (task mlm_nsp: masked LM + next sentence)."""
  c = _common("mlm_nsp")
  c.model.max_len = 128
  c.model.activation = "gelu"
  c.model.tie_embeddings = True  # BERT's MLM head reads the input embedding (always tied).
  c.model.norm_eps = 1e-12  # BERT's LayerNorm ε.
  c.data = d = ml_collections.ConfigDict()
  d.name = "wikitext2_raw"  # wikitext2_raw | tiny_shakespeare
  _data_dirs(d)
  d.tokenizer = "sentencepiece"  # char | sentencepiece; [CLS] [SEP] [MASK] come on top.
  d.vocab_size = 8000  # SentencePiece vocabulary size, trained on the train split.
  d.sp_model_type = "unigram"  # unigram | bpe
  d.seq_len = 128  # L: tokens per packed sentence pair, specials included.
  d.batch_size = 32  # B: pairs per step, over all devices and hosts.
  d.eval_split = "validation"
  d.eval_batches = 16  # Held-out batches per evaluation (fixed masks); 0 = all.
  d.mask_rate = 0.15  # Fraction of tokens predicted (80% [MASK], 10% random, 10% kept).
  d.short_seq_prob = 0.1  # Pairs packed to a shorter random length (BERT's 10%).
  c.opt.name, c.opt.b2, c.opt.eps = "adamw", 0.999, 1e-6  # BERT's Adam.
  c.opt.weight_decay = 0.01
  c.opt.schedule = "linear"  # Linear decay to 0 at train.num_steps.
  return c


def apply_bert_smoke(c: ml_collections.ConfigDict) -> None:
  """The BERT `smoke` preset: a tiny character-level model, a few steps, seconds on a CPU."""
  c.model.num_layers, c.model.d_model, c.model.num_heads, c.model.d_ff = 2, 32, 2, 64
  c.model.max_len = c.data.seq_len = 32
  c.data.tokenizer = "char"
  c.data.batch_size = 8
  c.data.eval_batches = 2
  c.opt.learning_rate, c.opt.warmup_steps = 3e-3, 0
  c.train.num_steps = 20
  c.train.log_every_steps = 5
  c.train.eval_every_steps = 10
  c.train.checkpoint_every_steps = 10
  c.train.tensorboard = False


def _data_dirs(d: ml_collections.ConfigDict) -> None:
  d.data_dir = ml_collections.FieldReference(None, field_type=str)  # Raw corpora; None:
  # $LNJAX_DATA_DIR, else the embedded corpus, ../shared/data, the download folder.
  d.cache_dir = ml_collections.FieldReference(None, field_type=str)  # Prepared data,
  # downloads and tokenizers; None: $LNJAX_CACHE_DIR, then ~/.cache/lnjax.
  d.mirror = ml_collections.FieldReference(None, field_type=str)  # Base URL replacing
  # the built-in corpora's download URLs; None: $LNJAX_DATA_MIRROR, then the public URLs.


def _external_source(d: ml_collections.ConfigDict, text_field: str) -> None:
  """Keys of data.name=tfds:NAME[/CONFIG] and hf:PATH[:CONFIG] (lnjax/data/sources.py)."""
  d.tfds_data_dir = ml_collections.FieldReference(None, field_type=str)  # TFDS data dir
  # (may be gs://); None: $TFDS_DATA_DIR, then ~/tensorflow_datasets.
  d.text_field = text_field  # The feature holding the text (tfds:/hf: names).


def _common(task: str) -> ml_collections.ConfigDict:
  """The sections every task has: model, opt, train, mesh."""
  c = ml_collections.ConfigDict()
  c.task = task  # lm | translation | mlm | mlm_nsp
  c.seed = 0  # Parameters, dropout and data order all derive from it.

  c.model = m = ml_collections.ConfigDict()
  m.vocab_size = 0  # 0: the tokenizer's vocabulary size.
  m.num_layers = 4  # L
  m.d_model = 128  # D
  m.num_heads = 4  # H
  m.d_ff = 512  # F
  m.max_len = 256  # Longest sequence (>= data.seq_len).
  m.norm_position = "pre"  # post: LN(x + F(x)) | pre: x + F(LN(x)), with a final LN |
  # sandwich | peri | deepnorm | normformer | resi_dual | admin | mix | b2t (README table).
  m.norm_kind = "layernorm"  # layernorm | rmsnorm | scalenorm
  m.norm_eps = 1e-5
  m.qk_norm = False  # LayerNorm on each head's queries and keys (ViT-22B).
  m.mix_post_fraction = 0.25  # Mix-LN: the first ⌊αL⌋ layers Post-LN, the rest Pre-LN.
  m.deepnorm_alpha = 0.0  # DeepNorm's residual scale α; 0 = the paper's for the depth.
  m.deepnorm_beta = 0.0  # DeepNorm's init gain β on V, W^O, FFN; 0 = the paper's.
  m.dropout_rate = 0.1  # On sub-layer outputs and the embedding.
  m.attention_dropout_rate = 0.0  # On attention probabilities.
  m.activation = "relu"  # relu | gelu
  m.tie_embeddings = False  # Output projection shares the input embedding.
  m.pos_emb = "learned"  # learned | sinusoidal
  m.use_bias = True
  m.dtype = "float32"  # Compute dtype (bfloat16 on GPU/TPU); parameters stay float32.
  m.scan_layers = False  # nn.scan over the layers (params stacked on a 'layers' axis):
  # compile time flat in depth. False: unrolled layer_0, layer_1, ...
  m.remat_policy = "none"  # Per-layer rematerialization: none | nothing_saveable |
  # dots_saveable | dots_with_no_batch_dims_saveable | everything_saveable.
  m.weight_grad = "autodiff"  # Dense layers' dW: autodiff | transposed (dW = xᵀ dY from
  # a materialized xᵀ: faster on some CPUs; benchmarks/lm_step.py --weight-grad).
  m.attention_impl = "plain"  # Attention's kernel: plain (lnjax's) | xla | cudnn
  # (jax.nn.dot_product_attention; cudnn: flash attention on NVIDIA GPUs, bfloat16 only).
  m.num_decoder_layers = 0  # Encoder-decoder: decoder depth; 0 = num_layers.
  m.encoder_norm_position = ""  # Encoder-decoder: per-stack placement; "" = norm_position.
  m.decoder_norm_position = ""
  m.share_embeddings = True  # Encoder-decoder: one source/target embedding.

  c.opt = o = ml_collections.ConfigDict()
  o.name = "adam"  # adam | adamw | sgd | radam
  o.learning_rate = 1e-3  # Peak, reached at the end of warm-up.
  o.schedule = "constant"  # constant | inverse_sqrt | linear | step | cosine
  o.warmup_steps = 0  # Linear warm-up from 0 over this many steps; 0 = none.
  o.end_learning_rate = 0.0  # Final lr of linear and cosine decay.
  o.decay_factor = 0.1  # step schedule: lr ×= decay_factor at each boundary ...
  o.decay_steps = ml_collections.FieldReference((), field_type=tuple)  # ... given in steps
  o.decay_epochs = ml_collections.FieldReference((), field_type=tuple)  # ... or in epochs.
  o.b1 = 0.9
  o.b2 = 0.98
  o.eps = 1e-8
  o.weight_decay = 0.0  # adamw only.
  o.momentum = 0.9  # sgd only.
  o.nesterov = False  # sgd only.
  o.grad_clip_norm = 0.0  # Global-norm clipping; 0 = off.

  c.train = t = ml_collections.ConfigDict()
  t.num_steps = 2000  # Optimizer steps in the whole run.
  t.label_smoothing = 0.0  # ε of label smoothing (the reported loss is the plain NLL).
  t.log_every_steps = 50  # Console line and train_* metrics.
  t.eval_every_steps = 500  # Held-out evaluation (also at the last step).
  t.checkpoint_every_steps = 500  # Orbax checkpoint (also at the last step).
  t.keep_checkpoints = 3  # The most recent ones kept.
  t.tensorboard = True  # Mirror metrics to TensorBoard event files.
  t.log_grad_norms = False  # Log ‖∂L/∂W‖ of every weight (grad_norm/<path>), averaged
  # over each log_every_steps window like the other train metrics.
  t.divergence_factor = 1e4  # The run ends as diverged when a train loss is NaN/Inf or
  # above this × ln V (the uniform guess's loss, about the initial one); 0 = NaN/Inf only.
  t.compilation_cache_dir = ""  # JAX's persistent compilation cache (local or gs://):
  # a relaunch, or another run of the same shapes, skips compilation. "" = off.
  t.profile_steps = ""  # "START,END": a jax.profiler trace of steps START..END into
  # <workdir>/profile (TensorBoard's profile plugin). "" = off.
  t.wandb_project = ""  # Weights & Biases project receiving the same scalars and the
  # config (WANDB_MODE=offline: files under <workdir>/wandb/ for `wandb sync`). "" = off.

  c.mesh = s = ml_collections.ConfigDict()
  s.data = -1  # Devices on the data-parallel axis; -1 = all the others.
  s.fsdp = 1  # Devices sharding parameters and optimizer state (FSDP).
  s.model = 1  # Devices sharding heads and FFN (tensor parallel).
  # Across TPU slices (or hosts, elsewhere): each axis is dcn_<axis> × <axis> devices
  # long, the data/fsdp/model sizes above then counting devices within one slice.
  s.dcn_data = 1  # Slices on the data axis (multislice data parallelism).
  s.dcn_fsdp = 1  # Slices on the fsdp axis (parameters sharded across slices too).
  s.dcn_model = 1  # Slices on the model axis (seldom: tensor parallelism is chatty).
  return c


def apply_smoke(c: ml_collections.ConfigDict) -> None:
  """The `smoke` preset every config offers: a few steps of a tiny model, seconds on a CPU."""
  c.model.num_layers, c.model.d_model, c.model.num_heads, c.model.d_ff = 2, 32, 2, 64
  c.model.max_len = c.data.seq_len = 32
  c.data.batch_size = 8
  c.data.eval_batches = 2
  c.data.tokenizer = "char"
  c.train.num_steps = 20
  c.opt.warmup_steps = min(c.opt.warmup_steps, c.train.num_steps)
  c.train.log_every_steps = 5
  c.train.eval_every_steps = 10
  c.train.checkpoint_every_steps = 10
  c.train.tensorboard = False


def apply_translation_smoke(c: ml_collections.ConfigDict) -> None:
  """The translation `smoke` preset: a tiny model, a small vocabulary, a few steps."""
  c.model.num_layers, c.model.d_model, c.model.num_heads, c.model.d_ff = 1, 32, 2, 64
  c.data.vocab_size = 500
  c.data.max_tokens = 1024
  c.data.max_len = 64
  c.decode.beam_size = 2
  c.decode.max_extra_len = 10
  c.train.num_steps = 20
  c.opt.warmup_steps = min(c.opt.warmup_steps, c.train.num_steps)
  c.train.log_every_steps = 5
  c.train.eval_every_steps = 20
  c.train.checkpoint_every_steps = 10
  c.train.tensorboard = False


def apply_paper_translation_schedule(c: ml_collections.ConfigDict, norm: str, *,
                                     post_warmup: int) -> None:
  """Xiong et al. §4 (IWSLT14): Pre-LN without warm-up, lr ×0.1 at epoch 8; Post-LN with
  `post_warmup` linear warm-up steps, then inverse square root."""
  c.model.norm_position = norm
  if norm == "pre":
    c.opt.schedule, c.opt.warmup_steps = "step", 0
    c.opt.decay_epochs, c.opt.decay_factor = (8,), 0.1
  else:
    c.opt.schedule, c.opt.warmup_steps = "inverse_sqrt", post_warmup


def parse_arg(arg: str | None, **choices: tuple | None) -> dict[str, Any]:
  """Parses a config argument 'norm=post,size=small,smoke' into {'norm': 'post', ...}.

  `choices` maps each preset name to its valid values, or to None for a bare switch.
  """
  presets = {}
  for item in filter(None, (arg or "").split(",")):
    name, _, value = item.partition("=")
    if name not in choices:
      raise errors.ConfigError(
          f"config argument {item!r}: unknown preset {name!r}; valid: {', '.join(choices)}")
    valid = choices[name]
    if valid is None:
      if value:
        raise errors.ConfigError(f"config argument {item!r}: {name!r} takes no value")
      presets[name] = True
    elif value not in valid:
      raise errors.ConfigError(
          f"config argument {item!r}: {name} must be one of: {', '.join(valid)}")
    else:
      presets[name] = value
  return presets


def from_config(cls, section: str, values: Mapping[str, Any], **extra):
  """cls(**values) where an unknown key is a one-line ConfigError naming the valid keys."""
  fields = {f.name for f in dataclasses.fields(cls)}
  for key in values:
    if key not in fields:
      raise errors.ConfigError(
          f"unknown config key {section}.{key}; valid keys: {', '.join(sorted(fields))}")
  return cls(**{**dict(values), **extra})
