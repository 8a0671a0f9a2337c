"""The Llama-style LM's PyTorch peer for benchmarks/suite.py (issue 59, item 6): transformers'
own LlamaForCausalLM — the model a user moving from transformers would train — on torch
eager, or under torch.compile (`sizes['compile']`), loaded from lnjax's initial parameters.

lnjax's side: model.pos_emb=rope (transformers' rotate_half layout), activation=silu with
gated_ffn (SwiGLU), norm_kind=rmsnorm, num_kv_heads (GQA), use_bias=False,
scale_embeddings=False, untied output — the same function as LlamaForCausalLM's (its
modeling file, transformers/models/llama/modeling_llama.py), so the two initial losses
agree to float32 rounding. Imported by benchmarks/torch_peer.py's worker only: neither jax
nor lnjax here.
"""

import os

import numpy as np
import torch

import torch_peer


def llama_config(sizes: dict):
  from transformers import LlamaConfig
  d, h = sizes["d_model"], sizes["num_heads"]
  return LlamaConfig(vocab_size=sizes["vocab_size"], hidden_size=d,
                     intermediate_size=sizes["d_ff"], num_hidden_layers=sizes["num_layers"],
                     num_attention_heads=h, num_key_value_heads=sizes["num_kv_heads"],
                     head_dim=d // h, max_position_embeddings=sizes["max_len"],
                     rms_norm_eps=sizes["eps"], rope_theta=sizes["rope_theta"],
                     attention_bias=False, mlp_bias=False, tie_word_embeddings=False,
                     attn_implementation="sdpa", use_cache=False)


def state_dict(flat: dict, num_layers: int) -> dict:
  """lnjax's flat parameters ('layer_0/self_attn/query/kernel', [in, out]) as
  LlamaForCausalLM's state dict ([out, in] weights)."""
  t = lambda k: torch.tensor(flat[k].T)  # (A copy: torch keeps no read-only array.)
  sd = {"model.embed_tokens.weight": torch.tensor(flat["embed/embedding"]),
        "model.norm.weight": torch.tensor(flat["final_norm/scale"]),
        "lm_head.weight": t("logits/kernel")}
  names = {"self_attn.q_proj": "self_attn/query", "self_attn.k_proj": "self_attn/key",
           "self_attn.v_proj": "self_attn/value", "self_attn.o_proj": "self_attn/out",
           "mlp.gate_proj": "ffn/wi_gate", "mlp.up_proj": "ffn/wi_up",
           "mlp.down_proj": "ffn/wo"}
  for i in range(num_layers):
    for hf, ln in names.items():
      sd[f"model.layers.{i}.{hf}.weight"] = t(f"layer_{i}/{ln}/kernel")
    sd[f"model.layers.{i}.input_layernorm.weight"] = torch.tensor(
        flat[f"layer_{i}/self_attn_norm/scale"])
    sd[f"model.layers.{i}.post_attention_layernorm.weight"] = torch.tensor(
        flat[f"layer_{i}/ffn_norm/scale"])
  return sd


def objective(model, batch):
  logits = model(input_ids=batch["inputs"]).logits
  nll = torch_peer._weighted_nll(logits, batch["targets"], batch["weights"])
  return nll, nll.detach()


def build(spec: dict, params: dict, batch: dict,
          precision=torch_peer.FLOAT32) -> torch_peer.BatchTrainer:
  """LlamaForCausalLM with lnjax's parameters (strict: every weight, no other), compiled
  when the spec says so, in BatchTrainer's Adam step (the suite's: lr 1e-3, β (0.9, 0.98))."""
  from transformers import LlamaForCausalLM
  sizes = spec["sizes"]
  torch.set_num_threads(os.cpu_count())
  torch.manual_seed(0)
  model = LlamaForCausalLM(llama_config(sizes))
  model.load_state_dict(state_dict(params, sizes["num_layers"]), strict=True)
  model.train()
  tensors = {k: torch.from_numpy(v.astype(np.int64) if v.dtype.kind in "iu" else v)
             for k, v in batch.items()}
  trainer = torch_peer.BatchTrainer(model, objective, tensors, precision=precision)
  if sizes.get("compile"):
    # The module is compiled (forward and, through AOTAutograd, backward); the optimizer
    # step stays eager, as torch.compile's tutorials train. The suite's untimed warm-up
    # steps pay the compilation.
    trainer.model = torch.compile(model)
  return trainer
