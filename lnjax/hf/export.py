"""`python -m lnjax.cli.export --format=hf`: a run as a Hugging Face model folder.

An LM whose config maps onto GPT-2 becomes a GPT2LMHeadModel folder, an LM with rotary
positions the family of its placement (Llama, Qwen3, Gemma 2, Gemma 3, OLMo 2), a BERT (mlm, mlm_nsp)
that maps onto BERT a BertForMaskedLM folder (the next-sentence head, which that class
has not, is left out): config.json, model.safetensors and the run's tokenizer (characters or a
SentencePiece unigram model) as tokenizer.json + tokenizer_config.json, so that transformers' AutoModel* and
AutoTokenizer load them. A config field with no counterpart is refused by `hf.to_hf` in
one line naming it (an lnjax LM's √D-scaled tied embedding is written untied instead).
"""

import dataclasses

import numpy as np

from lnjax.hf import checkpoint as hf, tokenizer as hf_tokenizer

from lnjax.hf import decoders

LOADERS = {"GPT2LMHeadModel": "transformers.AutoModelForCausalLM.from_pretrained",
           "BertForMaskedLM": "transformers.AutoModelForMaskedLM.from_pretrained",
           **{name: "transformers.AutoModelForCausalLM.from_pretrained"
              for name in decoders.FAMILIES}}


def export(run, params, output: str, dtype: str) -> dict:
  """Writes `run`'s model with `params` (unboxed, as restored) into `output`."""
  import jax
  import ml_dtypes

  from lnjax.models.transformer import unscan_params

  cfg = run.model
  params = jax.device_get(params)
  if cfg.scan_layers:
    params, cfg = unscan_params(params, cfg), dataclasses.replace(cfg, scan_layers=False)
  config, tensors = hf.to_hf(run.task.name, cfg, params)
  tokenizer = run.task.make_data(run.data, run.seed, 0, 1, 1).tokenizer
  if run.data.tokenizer == "char":
    tok = hf_tokenizer.char_tokenizer(tokenizer.chars)
  elif run.data.sp_model_type == "unigram":
    tok = hf_tokenizer.sentencepiece_tokenizer(tokenizer.model_proto)
  else:
    raise hf.HFError(f"data.sp_model_type={run.data.sp_model_type!r}: a SentencePiece BPE "
                     "vocabulary is not written as a Hugging Face tokenizer yet (unigram is)")
  target = np.float32 if dtype == "float32" else ml_dtypes.bfloat16
  tensors = {k: v.astype(target) for k, v in tensors.items()}
  config["dtype"] = dtype
  architecture = config["architectures"][0]
  hf_tokenizer.write(output, tok, cfg.max_len, bert=architecture == "BertForMaskedLM")
  hf.write_folder(output, config, tensors)
  return {"architecture": architecture, "num_parameters": int(sum(v.size for v in tensors.values())),
          "load": f"{LOADERS[architecture]}({output!r})"}
