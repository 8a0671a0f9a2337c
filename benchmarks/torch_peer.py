"""The benchmark's PyTorch peer: the same decoder-only LM as lnjax's TransformerLM, in eager
PyTorch, written the way a careful PyTorch user would write it.

Architecture (identical to lnjax/models/transformer.py with use_bias=True, relu, learned
positions, untied output, LayerNorm eps 1e-5):
  x = E[tokens]·√D + P[:T]
  pre:  x = x + Attn(LN(x));  x = x + FFN(LN(x));  ...;  logits = LN_f(x) W_out
  post: x = LN(x + Attn(x));  x = LN(x + FFN(x));  ...;  logits = x W_out
Attention uses one fused QKV nn.Linear (same parameter count as lnjax's separate q/k/v,
and the faster choice for eager PyTorch) and F.scaled_dot_product_attention(is_causal=True).
Optimizer: torch.optim.Adam(lr 1e-3, betas (0.9, 0.98), eps 1e-8) = lnjax's OptConfig
defaults; zero_grad(set_to_none=True).

This module imports neither jax nor lnjax, so `--worker` mode times PyTorch in a process
with glibc's default allocator settings (lnjax tunes malloc at import; see
lnjax/_malloc.py). The worker reads commands on stdin, one per line, and answers one JSON
line each:
  run N     -> {"times": [seconds per step ...], "loss": float}
  loss      -> {"loss": float}                (forward only, no update)
  rss       -> {"maxrss_kib": int}        (peak RSS of the worker alone: VmHWM)
  matmul    -> {"gflops": float}           (torch.mm 2048², for context)
  quit
"""

import argparse
import json
import math
import os
import resource
import sys
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F


class Attention(nn.Module):

  def __init__(self, d_model: int, num_heads: int):
    super().__init__()
    self.num_heads = num_heads
    self.qkv = nn.Linear(d_model, 3 * d_model)
    self.out = nn.Linear(d_model, d_model)

  def forward(self, x):
    b, t, d = x.shape
    h = self.num_heads
    q, k, v = self.qkv(x).split(d, dim=-1)
    q, k, v = (y.view(b, t, h, d // h).transpose(1, 2) for y in (q, k, v))  # [B, H, T, hd]
    y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    return self.out(y.transpose(1, 2).reshape(b, t, d))


class Block(nn.Module):

  def __init__(self, d_model: int, num_heads: int, d_ff: int, norm_position: str):
    super().__init__()
    self.pre = norm_position == "pre"
    self.attn_norm = nn.LayerNorm(d_model, eps=1e-5)
    self.attn = Attention(d_model, num_heads)
    self.ffn_norm = nn.LayerNorm(d_model, eps=1e-5)
    self.wi = nn.Linear(d_model, d_ff)
    self.wo = nn.Linear(d_ff, d_model)

  def ffn(self, x):
    return self.wo(F.relu(self.wi(x)))

  def forward(self, x):
    if self.pre:
      x = x + self.attn(self.attn_norm(x))
      return x + self.ffn(self.ffn_norm(x))
    x = self.attn_norm(x + self.attn(x))
    return self.ffn_norm(x + self.ffn(x))


class TorchLM(nn.Module):

  def __init__(self, vocab_size=4096, num_layers=8, d_model=128, num_heads=4, d_ff=512,
               max_len=128, norm_position="pre"):
    super().__init__()
    if norm_position not in ("pre", "post"):
      raise ValueError(f"norm_position={norm_position!r}")
    self.d_model = d_model
    self.embedding = nn.Embedding(vocab_size, d_model)
    self.positions = nn.Parameter(torch.zeros(max_len, d_model))
    self.blocks = nn.ModuleList(
        Block(d_model, num_heads, d_ff, norm_position) for _ in range(num_layers))
    self.final_norm = nn.LayerNorm(d_model, eps=1e-5) if norm_position == "pre" else None
    self.logits = nn.Linear(d_model, vocab_size, bias=False)

  def forward(self, tokens):
    t = tokens.shape[1]
    x = self.embedding(tokens) * math.sqrt(self.d_model) + self.positions[:t]
    for block in self.blocks:
      x = block(x)
    if self.final_norm is not None:
      x = self.final_norm(x)
    return self.logits(x)


def count_params(model: nn.Module) -> int:
  return sum(p.numel() for p in model.parameters())


def load_lnjax_params(model: TorchLM, flat: dict) -> None:
  """Copies lnjax parameters (flat dict 'a/b/c' -> np.ndarray) into `model`.

  lnjax's Dense kernels are [D_in, D_out] (y = x W); nn.Linear's weights are [D_out, D_in].
  Every parameter of `model` must be set exactly once.
  """
  t = lambda a: torch.from_numpy(np.array(a, dtype=np.float32, order="C", copy=True))
  sd = {"embedding.weight": t(flat["embed/embedding"]), "positions": t(flat["embed/positions"]),
        "logits.weight": t(flat["logits/kernel"].T)}
  if model.final_norm is not None:
    sd["final_norm.weight"] = t(flat["final_norm/scale"])
    sd["final_norm.bias"] = t(flat["final_norm/bias"])
  for i in range(len(model.blocks)):
    p, q = f"layer_{i}/", f"blocks.{i}."
    sd[q + "attn.qkv.weight"] = t(np.concatenate(
        [flat[p + f"self_attn/{n}/kernel"] for n in ("query", "key", "value")], axis=1).T)
    sd[q + "attn.qkv.bias"] = t(np.concatenate(
        [flat[p + f"self_attn/{n}/bias"] for n in ("query", "key", "value")]))
    sd[q + "attn.out.weight"] = t(flat[p + "self_attn/out/kernel"].T)
    sd[q + "attn.out.bias"] = t(flat[p + "self_attn/out/bias"])
    for ours, theirs in (("attn_norm", "self_attn_norm"), ("ffn_norm", "ffn_norm")):
      sd[q + f"{ours}.weight"] = t(flat[p + f"{theirs}/scale"])
      sd[q + f"{ours}.bias"] = t(flat[p + f"{theirs}/bias"])
    for n in ("wi", "wo"):
      sd[q + f"{n}.weight"] = t(flat[p + f"ffn/{n}/kernel"].T)
      sd[q + f"{n}.bias"] = t(flat[p + f"ffn/{n}/bias"])
  model.load_state_dict(sd, strict=True)
  used = {"embed/embedding", "embed/positions", "logits/kernel"} | {
      k for k in flat if k.startswith("layer_") or k.startswith("final_norm")}
  if set(flat) != used:
    raise ValueError(f"lnjax parameters not mapped: {sorted(set(flat) - used)}")


class Trainer:
  """One step = forward + cross-entropy (mean over tokens) + backward + Adam."""

  def __init__(self, model: TorchLM, lr=1e-3, betas=(0.9, 0.98), eps=1e-8):
    self.model = model
    self.opt = torch.optim.Adam(model.parameters(), lr=lr, betas=betas, eps=eps)

  def step(self, inputs, targets) -> torch.Tensor:
    self.opt.zero_grad(set_to_none=True)
    logits = self.model(inputs)
    loss = F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.view(-1))
    loss.backward()
    self.opt.step()
    return loss.detach()

  @torch.no_grad()
  def loss(self, inputs, targets) -> float:
    logits = self.model(inputs)
    return float(F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.view(-1)))

  def run(self, inputs, targets, n: int):
    times, loss = [], None
    for _ in range(n):
      t0 = time.perf_counter()
      loss = self.step(inputs, targets)
      times.append(time.perf_counter() - t0)
    return times, float(loss)


def peak_rss_kib() -> int:
  """This process's peak RSS. VmHWM, not getrusage's ru_maxrss: Linux carries ru_maxrss
  over fork + exec, so a worker's ru_maxrss would include its parent's peak."""
  try:
    with open("/proc/self/status") as f:
      for line in f:
        if line.startswith("VmHWM:"):
          return int(line.split()[1])
  except OSError:
    pass
  return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def matmul_gflops(n: int = 2048, reps: int = 7) -> float:
  """Median float32 n×n @ n×n rate of torch.mm, GFLOP/s (for context only)."""
  a, b = torch.randn(n, n), torch.randn(n, n)
  torch.mm(a, b)
  ts = []
  for _ in range(reps):
    t0 = time.perf_counter()
    torch.mm(a, b)
    ts.append(time.perf_counter() - t0)
  return 2 * n**3 / float(np.median(ts)) / 1e9


def build(norm_position: str, params_npz: str | None = None, **sizes):
  torch.set_num_threads(os.cpu_count())
  torch.manual_seed(0)
  model = TorchLM(norm_position=norm_position, **sizes)
  if params_npz:
    with np.load(params_npz) as f:
      load_lnjax_params(model, {k: f[k] for k in f.files})
  return Trainer(model)


def worker(args) -> None:
  trainer = build(args.norm, args.params)
  with np.load(args.batch) as f:
    inputs = torch.from_numpy(f["inputs"].astype(np.int64))
    targets = torch.from_numpy(f["targets"].astype(np.int64))
  reply = lambda obj: (sys.stdout.write(json.dumps(obj) + "\n"), sys.stdout.flush())
  reply({"ready": True, "num_params": count_params(trainer.model),
         "num_threads": torch.get_num_threads()})
  for line in sys.stdin:
    cmd = line.split()
    if not cmd:
      continue
    if cmd[0] == "run":
      times, loss = trainer.run(inputs, targets, int(cmd[1]))
      reply({"times": times, "loss": loss})
    elif cmd[0] == "loss":
      reply({"loss": trainer.loss(inputs, targets)})
    elif cmd[0] == "rss":
      reply({"maxrss_kib": peak_rss_kib()})
    elif cmd[0] == "matmul":
      reply({"gflops": matmul_gflops()})
    elif cmd[0] == "quit":
      break
    else:
      reply({"error": f"unknown command {line.strip()!r}"})


def main(argv=None) -> None:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--norm", choices=("pre", "post"), default="pre")
  p.add_argument("--worker", action="store_true", help="serve run/loss/rss commands on stdin")
  p.add_argument("--params", help="npz of lnjax parameters (flat 'a/b/c' keys)")
  p.add_argument("--batch", help="npz with int inputs/targets [B, T] (worker mode)")
  p.add_argument("--steps", type=int, default=10, help="standalone mode: steps to time")
  args = p.parse_args(argv)
  if args.worker:
    worker(args)
    return
  # Standalone: random batch, fresh init, prints per-step milliseconds.
  trainer = build(args.norm, args.params)
  g = torch.Generator().manual_seed(0)
  inputs = torch.randint(0, 4096, (32, 128), generator=g)
  targets = torch.randint(0, 4096, (32, 128), generator=g)
  trainer.run(inputs, targets, 3)
  times, loss = trainer.run(inputs, targets, args.steps)
  print(f"torch {torch.__version__} {args.norm}-LN: {count_params(trainer.model):,} params, "
        f"median {1e3 * float(np.median(times)):.1f} ms/step, loss {loss:.4f}")


if __name__ == "__main__":
  main()
