"""The suite's Llama-style rows (benchmarks/suite.py --models llama,llama_compile): the peer
is transformers' own LlamaForCausalLM loaded with lnjax's parameters, and computes lnjax's
function (else the comparison times two different models)."""

import numpy as np
import pytest
from conftest import import_benchmark


@pytest.mark.slow
def test_the_llama_peer_computes_lnjaxs_loss_from_lnjaxs_parameters():
  suite, lm_step, llama_peer, torch_peer = map(
      import_benchmark, ("suite", "lm_step", "llama_peer", "torch_peer"))
  cfg = suite.model_config("llama", "pre", "float32", dry=True)
  assert (cfg.pos_emb, cfg.gated_ffn, cfg.norm_kind, cfg.num_kv_heads) == ("rope", True,
                                                                           "rmsnorm", 2)
  assert [suite.model_config("llama", "pre", d).d_model for d in ("float32", "bfloat16")] == [
      128, 768]  # The CPU row's shape, and the GPU's (125M).
  batch = suite.make_batch("llama", cfg, dry=True)
  step = lm_step.TrainStep(cfg, batch, suite.TASKS["llama"])
  spec = {"model": "llama", "sizes": {
      "vocab_size": cfg.vocab_size, "num_layers": cfg.num_layers, "d_model": cfg.d_model,
      "num_heads": cfg.num_heads, "d_ff": cfg.d_ff, "max_len": cfg.max_len,
      "eps": cfg.norm_eps, "num_kv_heads": cfg.num_kv_heads, "rope_theta": cfg.rope_theta}}
  trainer = llama_peer.build(spec, step.initial_params, batch)
  assert torch_peer.count_params(trainer.model) == step.num_params
  assert trainer.loss() == pytest.approx(step.initial_loss, rel=1e-5)
  # One Adam step each: the same loss after it (the same gradients, the same update).
  step.run(2)
  _, torch_after = trainer.run(2)
  lnjax_after = step.loss
  assert torch_after == pytest.approx(lnjax_after, rel=1e-3)
  assert np.isfinite(torch_after)
