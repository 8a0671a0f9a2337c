"""Train-step suite: lnjax's three CPU-size models against the same models in eager
PyTorch, timed alternately in one run, in one table.

  python benchmarks/suite.py --out BENCHMARKS.md      # the table below, ~5 min on 2 cores
  python benchmarks/suite.py --quick                  # 1 round of 2 steps: a self-check
  python benchmarks/suite.py --dry_run --dtype bfloat16 --models lm,mt_iwslt
      # the same models at tiny sizes, 2 steps each, end to end in seconds; writes nothing
  python benchmarks/suite.py --models mt --norm post --rounds 8
  # On a GPU (jax[cuda] and a CUDA torch): bf16 compute, float32 parameters, its own section
  python benchmarks/suite.py --dtype bfloat16 --models lm,mt_iwslt --out BENCHMARKS.md

Models (dropout 0 and no label smoothing in both frameworks, so both do the same work;
Adam, lr 1e-3, β (0.9, 0.98), ε 1e-8 for all three):
  lm   benchmarks/lm_step.py's decoder-only LM: 8 layers, D 128, 4 heads, F 512,
       vocab 4096 (untied), learned positions; batch 32 × seq 128.
  mt   configs/multi30k_de_en.py's encoder-decoder: 3+3 layers, D 256, 4 heads, F 1024,
       vocab 8000 (one embedding for source, target and output), learned positions;
       128 pairs × 32 source × 32 target tokens (the 4096-token batch of the length-32
       bucket, without padding).
  mlm  configs/bert.py:size=cpu's masked LM with next-sentence prediction: 4 layers,
       D 256, 4 heads, F 1024, GELU, LN ε 1e-12, vocab 8003 (8000 + [CLS] [SEP] [MASK]),
       tied MLM head; batch 32 × seq 128, 20 predicted positions per sequence.
  mt_iwslt  configs/iwslt14_de_en.py's encoder-decoder (the paper's IWSLT model, for the
       GPU table): 6+6 layers, D 512, 4 heads, F 1024, vocab 10000; the mt batch.
  llama  a Llama-style decoder (issue 59): Pre-LN RMSNorm (ε 1e-6), rotary positions
       (θ 10000), SwiGLU, grouped-query attention, no biases, no embedding scaling, untied:
       8 layers, D 128, 4 heads, 2 key/value heads, F 352, vocab 4096; the lm batch (with
       --dtype bfloat16, for a GPU: 12 layers, D 768, 12 heads, 4 key/value heads, F 2048,
       vocab 32000).
       Its peer is transformers' own LlamaForCausalLM (benchmarks/llama_peer.py) on torch
       eager; llama_compile: the same under torch.compile (both rows in one run:
       --models llama,llama_compile).
The pre-LN models by default (--norm post for Post-LN).

For each model, lnjax's train step (benchmarks/lm_step.py's TrainStep: lnjax's own
train_step, jitted as the trainer jits it, state donated) and its PyTorch peer
(benchmarks/torch_peer.py) each run in a worker process of their own: lnjax with the
malloc settings it applies at import, PyTorch with glibc's defaults, as each framework's
users run it; each worker's peak RSS (VmHWM) is its model's peak memory. The PyTorch
model starts from lnjax's initial parameters and the two initial losses must agree
(else the run fails). Then R rounds alternate N lnjax steps and N PyTorch steps, after
warm-up, with the float32 matmul peak (JAX jit, 2048²) sampled in this process between
them. Figures: medians of the per-step times over all rounds. In every round, right after its
plain steps (train.health=off), the lnjax worker also runs the same step with the health
statistics on (train.health=log|warn, issue 29), between log steps and at a log step, on
the same state: the health column and its overhead, side by side with the off step.

With --dtype bfloat16 both frameworks compute in bf16 with float32 parameters and Adam
(lnjax: model.dtype; PyTorch: torch.autocast), each worker on the first GPU when JAX sees
one (PyTorch on cuda), MFU is against the bf16 matmul rate measured in the same run (JAX
jit, --peak_n², 8192 on a GPU), and the table goes into its own `suite_gpu` section.

--dry_run keeps each model's structure (its config's placement, positions, activation,
norm ε, sharing) at tiny sizes (DRY_MODEL, DRY_SHAPES) and runs two steps of each
framework through the whole path (workers, parameter transfer, initial-loss check, timing, table):
tests/test_gpu_check.py runs it for every model and dtype benchmarks/gpu_check.sh uses, so
that a lent GPU's minutes are spent measuring.
"""

import os
import sys

import bench_env  # noqa: E402  (first: lnjax on the path, malloc tuned before JAX)

bench_env.share_the_gpu()  # The parent and its two workers on one GPU.

import argparse  # noqa: E402
import dataclasses  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import subprocess  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402

import jax  # noqa: E402
import numpy as np  # noqa: E402

import lm_step  # noqa: E402
from lnjax import sweep, tasks  # noqa: E402
from lnjax.core import run as run_lib  # noqa: E402
from lnjax.models import ModelConfig  # noqa: E402

MODELS = ("lm", "mt", "mlm", "mt_iwslt", "llama", "llama_compile")
# lnjax's step with train.health=log|warn (the "lnjax" column is train.health=off): at a
# step between log steps (per-layer RMS of gradient, update and parameters) and at a log
# step (also the sown activations: residual RMS, attention and output logits, from a
# forward pass of their own before the step).
HEALTH_VARIANTS = {"health_step": dict(health=True),
                   "health_log_step": dict(health=True, log_step=True)}
# The bar on the health overhead (issue 29): ≤ 3% of the step, on the CPU models.
MAX_HEALTH_OVERHEAD = 0.03
DEFAULT_MODELS = ("lm", "mt", "mlm")
# The goals on this CPU (issue 34): lnjax's step time at most PyTorch eager's, and its
# worker's peak RSS at most 1.5× the PyTorch worker's, for each CPU model.
MAX_RATIO = {"lm": 1.0, "mt": 1.0, "mlm": 1.0, "llama": 1.0, "llama_compile": 1.0}
MAX_RSS_RATIO = 1.5
# Batch shapes (B, T) per model, and those of --dry_run with its model sizes.
SHAPES = {"lm": (lm_step.BATCH, lm_step.SEQ), "mt": (128, 32), "mlm": (32, 128)}
DRY_SHAPES = {"lm": (2, 8), "mt": (2, 8), "mlm": (2, 16)}
DRY_MODEL = dict(num_layers=1, d_model=32, num_heads=2, d_ff=64, vocab_size=96)


def batch_shape(name: str, dry: bool = False) -> tuple[int, int]:
  return (DRY_SHAPES if dry else SHAPES)[BATCH_OF.get(name, name)]


# The models that share another's batch (and task).
BATCH_OF = {"mt_iwslt": "mt", "llama": "lm", "llama_compile": "lm"}
# The Llama-style decoder (transformers' LlamaForCausalLM's function; benchmarks/llama_peer.py).
LLAMA = dict(num_layers=8, d_model=128, num_heads=4, num_kv_heads=2, d_ff=352,
             vocab_size=lm_step.MODEL["vocab_size"], max_len=lm_step.SEQ, norm_position="pre",
             norm_kind="rmsnorm", norm_eps=1e-6, pos_emb="rope", rope_theta=10000.0,
             activation="silu", gated_ffn=True, use_bias=False, scale_embeddings=False,
             tie_embeddings=False, dropout_rate=0.0)
# On a GPU (--dtype bfloat16) the Llama-style rows take a 125M-parameter shape (GPT-3 Small's
# 12 layers × D 768, with 4 key/value heads and Llama's F ≈ 8/3·D), as a GPU trains them.
LLAMA_GPU = dict(LLAMA, num_layers=12, d_model=768, num_heads=12, num_kv_heads=4, d_ff=2048,
                 vocab_size=32000)


# ---------------------------------------------------------------------------------------
# The models, their batches and their FLOPs.

def _config_model(path: str, arg: str, **overrides) -> ModelConfig:
  module = sweep.load_config_module(os.path.join(bench_env.REPO, path))
  return ModelConfig(**{**dict(module.get_config(arg).model), **overrides})


def model_config(name: str, norm: str, dtype: str = "float32", dry: bool = False) -> ModelConfig:
  cfg = _full_model_config(name, norm, dtype)
  if not dry:
    return cfg
  return dataclasses.replace(cfg, **DRY_MODEL,
                             num_decoder_layers=1 if cfg.num_decoder_layers else 0)


def _full_model_config(name: str, norm: str, dtype: str) -> ModelConfig:
  if name in ("llama", "llama_compile"):  # (Pre-LN whatever --norm: Llama's block.)
    return ModelConfig(**(LLAMA if dtype == "float32" else LLAMA_GPU), dtype=dtype)
  if name == "lm":
    return ModelConfig(**lm_step.MODEL, norm_position=norm, dropout_rate=0.0, dtype=dtype)
  if name == "mt":
    return _config_model("configs/multi30k_de_en.py", f"norm={norm}", vocab_size=8000,
                         dropout_rate=0.0, dtype=dtype)
  if name == "mt_iwslt":
    return _config_model("configs/iwslt14_de_en.py", f"norm={norm}", vocab_size=10000,
                         dropout_rate=0.0, dtype=dtype)
  if name == "mlm":
    return _config_model("configs/bert.py", f"norm={norm},size=cpu", vocab_size=8003,
                         dropout_rate=0.0, dtype=dtype)
  raise ValueError(name)


TASKS = {"lm": tasks.get("lm"), "mt": tasks.get("translation"), "mlm": tasks.get("mlm_nsp"),
         "mt_iwslt": tasks.get("translation"), "llama": tasks.get("lm"),
         "llama_compile": tasks.get("lm")}


def make_batch(name: str, cfg: ModelConfig, dry: bool = False) -> dict:
  """The fixed host batch (seed 0): random tokens in [1, V), every weight 1."""
  rng = np.random.default_rng(0)
  ints = lambda high, shape, low=1: rng.integers(low, high, shape, dtype=np.int32)
  b, t = batch_shape(name, dry)
  if BATCH_OF.get(name, name) == "lm":
    return lm_step.lm_batch(cfg.vocab_size, b, t)
  if name in ("mt", "mt_iwslt"):
    tgt = ints(cfg.vocab_size, (b, t + 1))
    return {"inputs": ints(cfg.vocab_size, (b, t)), "decoder_inputs": tgt[:, :-1],
            "targets": tgt[:, 1:], "weights": np.ones((b, t), np.float32)}
  p = mlm_predictions(t)
  positions = np.stack([np.sort(rng.choice(np.arange(1, t), p, replace=False))
                        for _ in range(b)]).astype(np.int32)
  segments = (np.arange(t)[None, :] >= t // 2).astype(np.int32)
  return {"inputs": ints(cfg.vocab_size, (b, t)),
          "segment_ids": np.repeat(segments, b, 0), "mlm_positions": positions,
          "targets": ints(cfg.vocab_size, (b, p)),
          "weights": np.ones((b, p), np.float32),
          "nsp_labels": ints(2, (b,), low=0)}


def mlm_predictions(seq_len: int) -> int:
  return math.ceil(0.15 * seq_len)  # lnjax.data.mlm: ceil(mask_rate · seq_len).


def flops(name: str, cfg: ModelConfig, dry: bool = False) -> dict:
  """Training FLOPs per step (the convention of lm_step.flops_per_token: 6 per weight per
  token through a matmul, 12·T·D per token per attention layer, embeddings' lookups,
  biases and norms not counted) and the tokens a step processes."""
  d, f, v = cfg.d_model, cfg.d_ff, cfg.vocab_size
  b, t = batch_shape(name, dry)
  if name == "lm":
    per_token = lm_step.flops_per_token(cfg.num_layers, d, f, v, seq_len=t)["total"]
    return {"total": per_token * b * t, "tokens": b * t}
  if name in ("llama", "llama_compile"):
    q, kv = cfg.num_heads * cfg.head_size, cfg.num_kv_heads * cfg.head_size
    n = cfg.num_layers
    per_token = 6 * n * (2 * d * q + 2 * d * kv + 3 * d * f) + 12 * n * t * q + 6 * d * v
    return {"total": per_token * b * t, "tokens": b * t}
  if name in ("mt", "mt_iwslt"):
    le, ld = cfg.num_layers, cfg.num_decoder_layers or cfg.num_layers
    s = t
    per_src = 6 * le * (4 * d * d + 2 * d * f) + 12 * le * s * d + 6 * ld * 2 * d * d
    per_tgt = 6 * ld * (6 * d * d + 2 * d * f) + 12 * ld * (t + s) * d + 6 * d * v
    return {"total": b * (s * per_src + t * per_tgt), "tokens": b * t}
  n = cfg.num_layers
  per_token = 6 * n * (4 * d * d + 2 * d * f) + 12 * n * t * d
  per_prediction = 6 * (d * d + d * v)
  per_sequence = 6 * (d * d + 2 * d)
  return {"total": b * (t * per_token + mlm_predictions(t) * per_prediction
                        + per_sequence), "tokens": b * t}


FLOP_FORMULAS = """\
lm:  FLOPs/step = B·T·(6·N_matmul + 12·L·T·D), N_matmul = L·(4D² + 2DF) + D·V
     (benchmarks/lm_step.py; B 32, T 128, L 8, D 128, F 512, V 4096).
mt:  FLOPs/step = B·S·[6·L_e·(4D² + 2DF) + 12·L_e·S·D + 6·L_d·2D²]
                + B·T·[6·L_d·(6D² + 2DF) + 12·L_d·(T + S)·D + 6·D·V]
     per source token the encoder's weights and self-attention, and the decoder's
     cross-attention keys and values (2D² per layer); per target token the decoder's
     self-attention Q, K, V, O and cross-attention Q, O (6D²), FFN, self- and
     cross-attention products, and the tied output projection (B 128, S = T = 32,
     L_e = L_d = 3, D 256, F 1024, V 8000). tokens/s counts target tokens (B·T).
     mt_iwslt: the same formula with L_e = L_d = 6, D 512, F 1024, V 10000.
mlm: FLOPs/step = B·T·[6·L·(4D² + 2DF) + 12·L·T·D] + B·P·6·(D² + D·V) + B·6·(D² + 2D)
     (stack; MLM head at the P gathered positions: transform and tied output; pooler and
     next-sentence head; B 32, T 128, P 20, L 4, D 256, F 1024, V 8003). tokens/s counts
     input tokens (B·T).
llama: FLOPs/step = B·T·[6·L·(2D·HK + 2D·GK + 3DF) + 12·L·T·HK + 6·D·V] (Q and O, K and V
     of G heads, the gated FFN's three matrices; B 32, T 128, L 8, D 128, H 4, G 2, K 32,
     F 352, V 4096; bf16: L 12, D 768, H 12, G 4, K 64, F 2048, V 32000); llama_compile:
     the same.
6 = 2 (multiply-add) × 3 (forward, input gradient, weight gradient); attention's QKᵀ and
AV count in full (no causal discount). MFU = FLOPs/step ÷ step time ÷ the matmul peak of
the run's compute dtype measured in the same run (JAX jit, n × n @ n × n, 2·n³ FLOPs; n
2048 on the CPU, 8192 on a GPU)."""


# ---------------------------------------------------------------------------------------
# Workers.

def lnjax_worker(name: str, norm: str, workdir: str, dtype: str = "float32",
                 dry: bool = False) -> None:
  """Builds lnjax's step for `name`, writes its initial parameters, batch and the PyTorch
  peer's spec to `workdir`, then serves run / rss / quit on stdin (JSON lines)."""
  cfg = model_config(name, norm, dtype, dry)
  step = lm_step.TrainStep(cfg, make_batch(name, cfg, dry), TASKS[name])
  np.savez(os.path.join(workdir, "params.npz"), **step.initial_params)
  np.savez(os.path.join(workdir, "batch.npz"), **step.host_batch)
  sizes = {"vocab_size": cfg.vocab_size, "num_layers": cfg.num_layers, "d_model": cfg.d_model,
           "num_heads": cfg.num_heads, "d_ff": cfg.d_ff, "max_len": cfg.max_len,
           "norm_position": norm}
  if name != "lm":  # (The LM peer's norms are LayerNorm(ε 1e-5), its positions learned.)
    sizes["eps"] = cfg.norm_eps
  if name in ("mt", "mt_iwslt"):
    sizes["num_decoder_layers"] = cfg.num_decoder_layers or cfg.num_layers
    sizes["pos_emb"] = cfg.pos_emb
  if name in ("llama", "llama_compile"):
    sizes.update(num_kv_heads=cfg.num_kv_heads, rope_theta=cfg.rope_theta,
                 compile=name == "llama_compile")
  with open(os.path.join(workdir, "spec.json"), "w") as f:
    json.dump({"model": {"mt_iwslt": "mt", "llama_compile": "llama"}.get(name, name),
               "sizes": sizes}, f)
  reply = lambda obj: (sys.stdout.write(json.dumps(obj) + "\n"), sys.stdout.flush())
  reply({"num_params": step.num_params, "initial_loss": step.initial_loss,
         "lower_s": step.lower_s, "compile_s": step.compile_s,
         "xla_temp_mib": step.xla_temp_mib, "xla_args_mib": step.xla_args_mib})
  for line in sys.stdin:
    cmd = line.split()
    if cmd and cmd[0] == "run":  # run N [VARIANT]
      times = step.run(int(cmd[1]), *cmd[2:])
      reply({"times": times, "loss": step.loss})
    elif cmd and cmd[0] == "variants":  # Compiled after the plain step's RSS is read.
      for variant, options in HEALTH_VARIANTS.items():
        step.add_variant(variant, **options)
      reply({})
    elif cmd and cmd[0] == "rss":
      stats = jax.devices()[0].memory_stats() or {}  # None on the CPU.
      peak = stats.get("peak_bytes_in_use")
      reply({"maxrss_kib": lm_step.vmhwm_mib() * 1024,
             "device_peak_mib": None if peak is None else peak / 2**20})
    elif cmd and cmd[0] == "quit":
      break


class Worker(lm_step.TorchWorker):
  """A JSON-lines worker process (lm_step.TorchWorker's protocol) on any command line."""

  def __init__(self, argv: list[str], env: dict):
    self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                 env=env, bufsize=1)
    self.hello = self._hello()
    self.num_params = self.hello["num_params"]
    self.loss = None

  def run(self, n: int, variant: str = "") -> list[float]:
    r = self.ask(f"run {n} {variant}".strip())
    self.loss = r["loss"]
    return r["times"]


def start_workers(name: str, norm: str, workdir: str, dtype: str = "float32",
                  device: str = "cpu", dry: bool = False) -> tuple[Worker, Worker]:
  env = dict(os.environ)
  if device != "cpu":  # Both workers share the GPU: JAX takes less than its default 75%.
    env.setdefault("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.45")
  ln = Worker([sys.executable, os.path.abspath(__file__), "--worker", name, "--norm", norm,
               "--dir", workdir, "--dtype", dtype] + (["--dry_run"] if dry else []), env)
  peer = [sys.executable, os.path.join(bench_env.HERE, "torch_peer.py"), "--worker",
          "--params", os.path.join(workdir, "params.npz"),
          "--batch", os.path.join(workdir, "batch.npz"), "--device", device, "--dtype", dtype,
          "--spec", os.path.join(workdir, "spec.json")]
  # PyTorch as its users run it: glibc's default malloc settings.
  env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
  try:
    return ln, Worker(peer, env)
  except Exception:
    ln.kill()  # Else it outlives the suite (on the first GPU run the stage then hung).
    raise


# ---------------------------------------------------------------------------------------
# Timing and report.

def bench_model(name: str, norm: str, rounds: int, steps: int, warmup: int,
                peaks: list[float], dtype: str = "float32", device: str = "cpu",
                peak_n: int = 2048, dry: bool = False) -> dict:
  cfg = model_config(name, norm, dtype, dry)
  # The two initial losses agree to float32 rounding, or to bf16's 8-bit mantissa.
  tolerance = 1e-3 if dtype == "float32" else 2e-2
  with tempfile.TemporaryDirectory(prefix=f"suite_{name}_") as workdir:
    ln, pt = start_workers(name, norm, workdir, dtype, device, dry)
    try:
      pt_loss = pt.ask("loss")["loss"]
      failures = []
      if pt.num_params != ln.num_params:
        failures.append(f"{name}: PyTorch has {pt.num_params:,} parameters, lnjax "
                        f"{ln.num_params:,}")
      if abs(pt_loss - ln.hello["initial_loss"]) > tolerance * abs(ln.hello["initial_loss"]):
        failures.append(f"{name}: initial loss lnjax {ln.hello['initial_loss']:.6f}, PyTorch "
                        f"{pt_loss:.6f}")
      if failures:
        return {"name": name, "failures": failures}
      ln.run(warmup)
      pt.run(warmup)
      times = {"lnjax": [], "torch": [], "lnjax_beside_health": [],
               **{v: [] for v in HEALTH_VARIANTS}}
      for r in range(rounds):
        peaks += lm_step.matmul_peak_sample(reps=3, n=peak_n, dtype=dtype)
        times["lnjax"] += ln.run(steps)
        times["torch"] += pt.run(steps)
        print(f"{name} round {r + 1}/{rounds} (load {os.getloadavg()[0]:.1f}): lnjax "
              f"{1e3 * np.median(times['lnjax'][-steps:]):.0f} ms, PyTorch "
              f"{1e3 * np.median(times['torch'][-steps:]):.0f} ms", flush=True)
      # Peak memory of the same work on both sides: one compiled step (lnjax's health
      # variants are compiled only now), then again with them.
      replies = {"lnjax": ln.ask("rss"), "torch": pt.ask("rss")}
      ln.ask("variants")
      for variant in HEALTH_VARIANTS:
        ln.run(warmup, variant)
      for r in range(rounds):  # Each variant right after the plain step, on the same state.
        times["lnjax_beside_health"] += ln.run(steps)
        for variant in HEALTH_VARIANTS:
          times[variant] += ln.run(steps, variant)
        print(f"{name} health round {r + 1}/{rounds}: lnjax "
              f"{1e3 * np.median(times['lnjax_beside_health'][-steps:]):.0f} ms; with health "
              + ", ".join(f"{1e3 * np.median(times[v][-steps:]):.0f} ms ({v})"
                          for v in HEALTH_VARIANTS), flush=True)
      replies["lnjax_with_health"] = ln.ask("rss")
      rss = {k: r["maxrss_kib"] / 1024 for k, r in replies.items()}
      device_peak = {k: r.get("device_peak_mib") for k, r in replies.items()}
      if name == "lm":
        rss["torch_mm_gflops"] = pt.ask(f"matmul {peak_n}" if dry else "matmul")["gflops"]
    finally:
      ln.close()
      pt.close()
  return {"name": name, "failures": [], "num_params": ln.num_params,
          "label": LABELS[name] + (" at --dry_run sizes" if dry else ""),
          "flops": flops(name, cfg, dry),
          "stats": {k: lm_step.stats(v) for k, v in times.items()},
          "times_ms": {k: [round(1e3 * x, 2) for x in v] for k, v in times.items()},
          "rss_mib": {k: rss[k] for k in ("lnjax", "torch", "lnjax_with_health")},
          "device_peak_mib": device_peak,
          "torch_mm_gflops": rss.get("torch_mm_gflops"),
          "compile": {k: ln.hello[k] for k in ("lower_s", "compile_s")},
          "xla_mib": {k: ln.hello[k] for k in ("xla_temp_mib", "xla_args_mib")},
          "initial_loss": {"lnjax": ln.hello["initial_loss"], "torch": pt_loss},
          "final_loss": {"lnjax": ln.loss, "torch": pt.loss},
          "total_steps": warmup + rounds * steps}


LABELS = {"lm": "LM 2.6M (8L, D 128)", "mt": "Multi30k enc-dec (3+3L, D 256)",
          "mlm": "masked LM (4L, D 256)", "mt_iwslt": "IWSLT enc-dec (6+6L, D 512)",
          "llama": "Llama-style LM vs transformers' LlamaForCausalLM, eager",
          "llama_compile": "Llama-style LM vs LlamaForCausalLM, torch.compile"}


def render(results: list[dict], peak: float) -> str:
  lines = [
      "| model | parameters | tokens/step | GFLOP/step | lnjax ms | PyTorch ms | lnjax / "
      "PyTorch | lnjax tokens/s | PyTorch tokens/s | lnjax MFU | PyTorch MFU | peak RSS "
      "lnjax / PyTorch MiB (lnjax with health) | XLA temp MiB | lnjax health on ms: step / log step (overhead) |",
      "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
  for r in results:
    ln, pt = r["stats"]["lnjax"]["median_ms"], r["stats"]["torch"]["median_ms"]
    f = r["flops"]
    mfu = lambda ms: f["total"] / (ms / 1e3) / (peak * 1e9)
    lines.append(
        f"| {r['label']} | {r['num_params']:,} | {f['tokens']:,} | "
        f"{f['total'] / 1e9:.1f} | {ln:.0f} | {pt:.0f} | **{ln / pt:.2f}** | "
        f"{f['tokens'] / (ln / 1e3):,.0f} | {f['tokens'] / (pt / 1e3):,.0f} | "
        f"{100 * mfu(ln):.1f}% | {100 * mfu(pt):.1f}% | {r['rss_mib']['lnjax']:.0f} / "
        f"{r['rss_mib']['torch']:.0f} ({r['rss_mib']['lnjax_with_health']:.0f}) | "
        f"{r['xla_mib']['xla_temp_mib']:.0f} | "
        + " / ".join(f"{r['stats'][v]['median_ms']:.0f} ({100 * health_overhead(r, v):+.1f}%)"
                     for v in HEALTH_VARIANTS) + " |")
  return "\n".join(lines)


def health_overhead(r: dict, variant: str) -> float:
  """The step with health on over the step with it off timed beside it (medians), minus 1."""
  return r["stats"][variant]["median_ms"] / r["stats"]["lnjax_beside_health"]["median_ms"] - 1


def run_health_overhead(r: dict) -> float:
  """A run's health overhead a step: every step's statistics, and a log step's extra
  forward pass once a log period (train.log_every_steps at its default)."""
  every, logged = (health_overhead(r, v) for v in ("health_step", "health_log_step"))
  return every + (logged - every) / run_lib.TrainConfig().log_every_steps


def verdicts(results: list[dict], peak: float, args) -> list[str]:
  """The goals: the CPU float32 table's (the GPU/bf16 table has none)."""
  out = []
  if section_tag(args) != "suite":
    return out
  for r in results:
    if r["name"] not in MAX_RATIO:
      continue
    ratio = r["stats"]["lnjax"]["median_ms"] / r["stats"]["torch"]["median_ms"]
    line = (f"{r['name']}: lnjax / PyTorch step time {ratio:.2f} (goal ≤ "
            f"{MAX_RATIO[r['name']]}: {'met' if ratio <= MAX_RATIO[r['name']] else 'not met'})")
    rss = r["rss_mib"]["lnjax"] / r["rss_mib"]["torch"]
    line += (f"; peak RSS {rss:.2f}× PyTorch's (goal ≤ {MAX_RSS_RATIO}: "
             f"{'met' if rss <= MAX_RSS_RATIO else 'not met'})")
    out.append(line)
    overhead = run_health_overhead(r)
    out.append(f"{r['name']}: health overhead of a run (train.health=log|warn vs off; its "
               f"log step {100 * health_overhead(r, 'health_log_step'):+.1f}%) "
               f"{100 * overhead:+.1f}% (bar ≤ {100 * MAX_HEALTH_OVERHEAD:.0f}%: "
               f"{'met' if overhead <= MAX_HEALTH_OVERHEAD else 'not met'})")
  return out


def notes(results, peak, n_peaks, args, loads) -> list[str]:
  torch_mm = next((r["torch_mm_gflops"] for r in results if r.get("torch_mm_gflops")), None)
  out = [
      f"- {args.rounds} rounds × {args.steps} steps per framework and model, alternating, "
      f"after {args.warmup} warm-up steps; medians. {args.norm}-LN models"
      + (", bf16 compute with float32 parameters and Adam (lnjax model.dtype, PyTorch "
         "autocast)." if args.dtype == "bfloat16" else "."),
      f"- {args.dtype} matmul peak (JAX jit, {args.peak_n}², median of {n_peaks} samples "
      f"across the rounds): **{peak:.0f} GFLOP/s**"
      + (f"; torch.mm {args.peak_n if args.dry_run else 2048}² for context: {torch_mm:.0f} "
         "GFLOP/s." if torch_mm else "."),
      "- lnjax ms is train.health=off's step, timed in rounds alternating with PyTorch's. "
      "Health on: after those rounds, the same step with train.health=log|warn between "
      "log steps (per-layer RMS of gradient, update, parameters) and at a log step (also "
      "residual RMS, attention and output logits, from a forward pass of their own before "
      "the step), each timed right after a round of the off step on the same state; "
      "overhead against that off step. A run's overhead (the verdict): the first's, and "
      "the log step's extra once every train.log_every_steps (default 50) steps.",
      "- Peak RSS: each worker process's VmHWM (one model, one framework each; lnjax's "
      "includes its compile), read after the alternating rounds, when lnjax has compiled "
      "and run the one step PyTorch runs; in brackets lnjax's after the health variants "
      "were compiled and run too (a train.health=warn run holds them). XLA temp: the lnjax "
      "step's scratch (XLA buffer assignment).",
  ]
  for r in results:
    dev = r.get("device_peak_mib") or {}
    if dev.get("lnjax") is not None or dev.get("torch") is not None:
      fmt = lambda v: "—" if v is None else f"{v:.0f}"
      out.append(f"- {r['name']}: peak device memory lnjax {fmt(dev.get('lnjax'))} MiB "
                 f"(JAX peak_bytes_in_use) / PyTorch {fmt(dev.get('torch'))} MiB "
                 "(torch.cuda.max_memory_allocated).")
  for r in results:
    s, c = r["stats"], r["compile"]
    out.append(
        f"- {r['name']}: step ms min lnjax {s['lnjax']['min_ms']:.0f} / PyTorch "
        f"{s['torch']['min_ms']:.0f}, IQR {s['lnjax']['p25_ms']:.0f}–{s['lnjax']['p75_ms']:.0f}"
        f" / {s['torch']['p25_ms']:.0f}–{s['torch']['p75_ms']:.0f}; lnjax compile: lower "
        f"{c['lower_s']:.2f} s + XLA {c['compile_s']:.2f} s; loss initial "
        f"{r['initial_loss']['lnjax']:.4f} / {r['initial_loss']['torch']:.4f}, after "
        f"{r['total_steps']} steps {r['final_loss']['lnjax']:.4f} / "
        f"{r['final_loss']['torch']:.4f} (lnjax / PyTorch).")
  out.append(f"- Load average (1 min) at start / end: {loads[0]:.2f} / {loads[1]:.2f}.")
  return out


def section_tag(args) -> str:
  """BENCHMARKS.md's section: the CPU float32 table, or the GPU/bf16 one beside it; the
  Llama-style rows alone (--models llama,llama_compile) in their own."""
  llama = set(args.models.split(",")) <= {"llama", "llama_compile"}
  if args.device == "cpu" and args.dtype == "float32":
    return "suite_llama" if llama else "suite"
  return "suite_gpu_llama" if llama else "suite_gpu"


def section(results, peak, n_peaks, args, loads, command) -> str:
  mi = lm_step.machine_info()
  tag = section_tag(args)
  accelerator = ("no GPU" if args.device == "cpu" else
                 f"{jax.device_count()} × {jax.devices()[0].device_kind} (runs on the first)")
  peer = ("transformers' LlamaForCausalLM, eager and torch.compile" if tag.endswith("llama")
          else "PyTorch eager")
  title = f"Suite: {len(results)} models against {peer}, {args.dtype}, {args.device}"
  return lm_step.section_text(tag, "benchmarks/suite.py", title, mi, command, [
      render(results, peak), "",
      *["- " + x for x in verdicts(results, peak, args)],
      *notes(results, peak, n_peaks, args, loads),
      "", "FLOP formulas:", "", "```", FLOP_FORMULAS, "```"], accelerator)


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--models", default=",".join(DEFAULT_MODELS),
                 help="lm,mt,mlm (default), mt_iwslt, llama and llama_compile (comma-separated)")
  p.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32",
                 help="compute dtype of both frameworks (parameters stay float32)")
  p.add_argument("--peak_n", type=int, default=None,
                 help="matmul size of the peak measurement (default 2048; 8192 on a GPU)")
  p.add_argument("--norm", choices=("pre", "post"), default="pre")
  p.add_argument("--steps", type=int, default=5, help="steps per framework per round")
  p.add_argument("--rounds", type=int, default=5, help="alternating rounds per model")
  p.add_argument("--warmup", type=int, default=3, help="warm-up steps per framework")
  p.add_argument("--quick", action="store_true", help="1 round of 2 steps: a self-check")
  p.add_argument("--dry_run", action="store_true",
                 help="tiny sizes of the same models, 1 warm-up and 1 timed step; writes nothing")
  p.add_argument("--out", help="Markdown file whose suite section is added or replaced")
  p.add_argument("--json", help="write the raw results here")
  p.add_argument("--worker", choices=MODELS, help=argparse.SUPPRESS)
  p.add_argument("--dir", help=argparse.SUPPRESS)
  args = p.parse_args(argv)
  if args.worker:
    lnjax_worker(args.worker, args.norm, args.dir, args.dtype, args.dry_run)
    return 0
  if args.dry_run and (args.out or args.json):
    p.error("--dry_run writes nothing: drop --out and --json")
  args.device = "cuda" if jax.default_backend() == "gpu" else "cpu"
  args.peak_n = args.peak_n or (256 if args.dry_run else 8192 if args.device == "cuda"
                                else 2048)
  if args.quick:
    args.rounds, args.steps, args.warmup = 1, 2, 1
  if args.dry_run:
    args.rounds, args.steps, args.warmup = 1, 1, 1
  models = lm_step.choices("--models", args.models, MODELS)
  command = lm_step.command_line("suite.py", argv)
  loads = [os.getloadavg()[0]]
  t0 = time.perf_counter()
  peaks = lm_step.matmul_peak_sample(n=args.peak_n, dtype=args.dtype)
  results = [bench_model(m, args.norm, args.rounds, args.steps, args.warmup, peaks,
                         args.dtype, args.device, args.peak_n, args.dry_run) for m in models]
  loads.append(os.getloadavg()[0])
  failures = [f for r in results for f in r["failures"]]
  if failures:
    for f in failures:
      print("FAIL:", f, file=sys.stderr)
    return 1
  peak = float(np.median(peaks))
  print()
  print(render(results, peak))
  print()
  print("\n".join(verdicts(results, peak, args) + notes(results, peak, len(peaks), args, loads)))
  print("\nFLOP formulas:\n" + FLOP_FORMULAS)
  print(f"\nwall time {time.perf_counter() - t0:.0f} s")
  if args.out:
    lm_step.update_section(args.out, section(results, peak, len(peaks), args, loads, command),
                           section_tag(args))
    print(f"updated {args.out}")
  if args.json:
    with open(args.json, "w") as f:
      json.dump({"results": results, "peak_gflops": peak, "peaks": peaks}, f, indent=1,
                default=str)
  for r in results:
    for name in ("lnjax", "torch"):
      if not np.isfinite(r["final_loss"][name]):
        print(f"FAIL: {r['name']} {name}: non-finite loss", file=sys.stderr)
        return 1
  return 0


if __name__ == "__main__":
  sys.exit(main())
