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

The same file holds the peers of benchmarks/suite.py's other two models, written alike
(`TorchEncoderDecoder`, `TorchBert`: below the LM), each loadable from lnjax's initial
parameters so that the initial losses can be compared.

This module imports neither jax nor lnjax, so `--worker` mode times PyTorch in a process
with glibc's default allocator settings (lnjax tunes malloc at import; see
lnjax/core/allocator.py). The worker reads commands on stdin, one per line, and answers one JSON
line each:
  run N     -> {"times": [seconds per step ...], "loss": float}
  loss      -> {"loss": float}                (forward only, no update)
  rss       -> {"maxrss_kib": int, "device_peak_mib": float | None}
               (peak RSS of the worker alone: VmHWM; on CUDA also the allocator's peak)
  matmul [N] -> {"gflops": float}          (torch.mm N² (2048²) in the worker's dtype, for context)
  quit
`--device cuda --dtype bfloat16` (benchmarks/suite.py on a GPU) runs the model on the GPU
under torch.autocast(bfloat16): parameters and Adam stay float32, matmuls in bf16, as
lnjax's model.dtype='bfloat16' does.
"""

import argparse
import contextlib
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


class Precision:
  """Where the model runs and in which compute dtype: autocast to bfloat16 when asked
  (parameters, gradients and Adam stay float32); `sync` waits for the device's queue."""

  def __init__(self, device: str = "cpu", dtype: str = "float32"):
    self.device = torch.device(device)
    self.bf16 = dtype == "bfloat16"

  def autocast(self):
    if not self.bf16:
      return contextlib.nullcontext()
    return torch.autocast(self.device.type, dtype=torch.bfloat16)

  def sync(self):
    if self.device.type == "cuda":
      torch.cuda.synchronize(self.device)


FLOAT32 = Precision()


class Trainer:
  """One step = forward + cross-entropy (mean over tokens) + backward + Adam."""

  def __init__(self, model: TorchLM, lr=1e-3, betas=(0.9, 0.98), eps=1e-8,
               precision: Precision = FLOAT32):
    self.model, self.precision = model.to(precision.device), precision
    self.opt = torch.optim.Adam(model.parameters(), lr=lr, betas=betas, eps=eps)

  def _nll(self, inputs, targets):
    with self.precision.autocast():
      logits = self.model(inputs)
    return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), targets.view(-1))

  def step(self, inputs, targets) -> torch.Tensor:
    self.opt.zero_grad(set_to_none=True)
    loss = self._nll(inputs, targets)
    loss.backward()
    self.opt.step()
    return loss.detach()

  @torch.no_grad()
  def loss(self, inputs, targets) -> float:
    return float(self._nll(inputs, targets))

  def run(self, inputs, targets, n: int):
    times, loss = [], None
    for _ in range(n):
      t0 = time.perf_counter()
      loss = self.step(inputs, targets)
      self.precision.sync()
      times.append(time.perf_counter() - t0)
    return times, float(loss)


# ---------------------------------------------------------------------------------------
# The encoder-decoder and the masked LM of benchmarks/suite.py.

NEG_INF = -1e9  # lnjax/models/layers.py's additive mask value.


def padding_mask(tokens):
  """[B, 1, 1, S] additive mask hiding padded keys (token 0), as lnjax's padding_bias."""
  return torch.where(tokens[:, None, None, :] > 0, 0.0, NEG_INF)


class MultiHeadAttention(nn.Module):
  """Self-attention with one fused QKV projection, or cross-attention with a query
  projection and a fused key-value one: the same parameter count as lnjax's separate
  query, key, value."""

  def __init__(self, d_model: int, num_heads: int, cross: bool = False):
    super().__init__()
    self.num_heads, self.cross = num_heads, cross
    if cross:
      self.q, self.kv = nn.Linear(d_model, d_model), nn.Linear(d_model, 2 * d_model)
    else:
      self.qkv = nn.Linear(d_model, 3 * d_model)
    self.out = nn.Linear(d_model, d_model)

  def forward(self, x, memory=None, mask=None, causal=False):
    b, t, d = x.shape
    h = self.num_heads
    if self.cross:
      q, (k, v) = self.q(x), self.kv(memory).split(d, dim=-1)
    else:
      q, k, v = self.qkv(x).split(d, dim=-1)
    heads = lambda y: y.view(b, y.shape[1], h, d // h).transpose(1, 2)  # [B, H, T, hd]
    y = F.scaled_dot_product_attention(heads(q), heads(k), heads(v), attn_mask=mask,
                                       is_causal=causal)
    return self.out(y.transpose(1, 2).reshape(b, t, d))


class Layer(nn.Module):
  """A Pre-LN (x + F(LN(x))) or Post-LN (LN(x + F(x))) Transformer layer: self-attention,
  optional cross-attention, FFN."""

  def __init__(self, d_model, num_heads, d_ff, norm_position, cross=False, activation="relu",
               eps=1e-5):
    super().__init__()
    self.pre = norm_position == "pre"
    self.self_attn = MultiHeadAttention(d_model, num_heads)
    self.self_attn_norm = nn.LayerNorm(d_model, eps=eps)
    self.cross_attn = MultiHeadAttention(d_model, num_heads, cross=True) if cross else None
    self.cross_attn_norm = nn.LayerNorm(d_model, eps=eps) if cross else None
    self.wi, self.wo = nn.Linear(d_model, d_ff), nn.Linear(d_ff, d_model)
    self.ffn_norm = nn.LayerNorm(d_model, eps=eps)
    # lnjax's gelu is flax's default, the tanh approximation.
    self.act = F.relu if activation == "relu" else lambda y: F.gelu(y, approximate="tanh")

  def sublayer(self, x, norm, f):
    return x + f(norm(x)) if self.pre else norm(x + f(x))

  def forward(self, x, self_mask=None, causal=False, memory=None, memory_mask=None):
    x = self.sublayer(x, self.self_attn_norm,
                      lambda h: self.self_attn(h, mask=self_mask, causal=causal))
    if self.cross_attn is not None:
      x = self.sublayer(x, self.cross_attn_norm,
                        lambda h: self.cross_attn(h, memory, mask=memory_mask))
    return self.sublayer(x, self.ffn_norm, lambda h: self.wo(self.act(self.wi(h))))


def sinusoidal_positions(max_len: int, d_model: int) -> torch.Tensor:
  """[max_len, D] fixed positions of Vaswani et al. (arXiv 1706.03762, §3.5):
  P[t, 2i] = sin(t / 10000^(2i/D)), P[t, 2i+1] = cos(t / 10000^(2i/D))."""
  t = torch.arange(max_len, dtype=torch.float32)[:, None]
  angles = t / 10000.0 ** (torch.arange(0, d_model, 2, dtype=torch.float32) / d_model)
  pe = torch.zeros(max_len, d_model)
  pe[:, 0::2] = torch.sin(angles)
  pe[:, 1::2] = torch.cos(angles[:, :d_model // 2])
  return pe


class Embedding(nn.Module):
  """E[tokens]·√D + P[:T], lnjax's Embed: learned positions (a parameter) or sinusoidal
  ones (a fixed buffer, as fairseq's and lnjax's pos_emb='sinusoidal')."""

  def __init__(self, vocab_size, d_model, max_len, pos_emb="learned"):
    super().__init__()
    if pos_emb not in ("learned", "sinusoidal"):
      raise ValueError(f"pos_emb={pos_emb!r}")
    self.d_model = d_model
    self.embedding = nn.Embedding(vocab_size, d_model)
    if pos_emb == "learned":
      self.positions = nn.Parameter(torch.zeros(max_len, d_model))
    else:
      self.register_buffer("positions", sinusoidal_positions(max_len, d_model))

  def forward(self, tokens):
    return self.embedding(tokens) * math.sqrt(self.d_model) + self.positions[:tokens.shape[1]]


def _check_norm(norm_position):
  if norm_position not in ("pre", "post"):
    raise ValueError(f"norm_position={norm_position!r}")


class TorchEncoderDecoder(nn.Module):
  """lnjax's EncoderDecoder with one embedding shared by source, target and the output
  projection (tie_embeddings, share_embeddings), learned or sinusoidal positions, pre or
  post."""

  def __init__(self, vocab_size=8000, num_layers=3, num_decoder_layers=3, d_model=256,
               num_heads=4, d_ff=1024, max_len=256, norm_position="pre", eps=1e-5,
               pos_emb="learned"):
    super().__init__()
    _check_norm(norm_position)
    self.embed = Embedding(vocab_size, d_model, max_len, pos_emb)
    layer = lambda cross: Layer(d_model, num_heads, d_ff, norm_position, cross, eps=eps)
    self.encoder = nn.ModuleList(layer(False) for _ in range(num_layers))
    self.decoder = nn.ModuleList(layer(True) for _ in range(num_decoder_layers))
    final = lambda: nn.LayerNorm(d_model, eps=eps) if norm_position == "pre" else nn.Identity()
    self.encoder_norm, self.decoder_norm = final(), final()

  def forward(self, src, tgt_in):
    mask = padding_mask(src)
    x = self.embed(src)
    for layer in self.encoder:
      x = layer(x, self_mask=mask)
    x = self.encoder_norm(x)
    y = self.embed(tgt_in)
    for layer in self.decoder:
      y = layer(y, causal=True, memory=x, memory_mask=mask)
    return self.decoder_norm(y) @ self.embed.embedding.weight.T


class TorchBert(nn.Module):
  """lnjax's BertPretraining: token·√D + position + segment embeddings, a bidirectional
  pre/post stack, the MLM head at the gathered positions (dense, gelu, LN, tied output +
  bias) and the next-sentence head on the first token's pooled state."""

  def __init__(self, vocab_size=8003, num_layers=4, d_model=256, num_heads=4, d_ff=1024,
               max_len=128, norm_position="pre", eps=1e-12):
    super().__init__()
    _check_norm(norm_position)
    self.embed = Embedding(vocab_size, d_model, max_len)
    self.segment_embed = nn.Parameter(torch.zeros(2, d_model))
    self.layers = nn.ModuleList(Layer(d_model, num_heads, d_ff, norm_position,
                                      activation="gelu", eps=eps) for _ in range(num_layers))
    self.final_norm = (nn.LayerNorm(d_model, eps=eps) if norm_position == "pre"
                       else nn.Identity())
    self.mlm_transform = nn.Linear(d_model, d_model)
    self.mlm_norm = nn.LayerNorm(d_model, eps=eps)
    self.mlm_bias = nn.Parameter(torch.zeros(vocab_size))
    self.pooler = nn.Linear(d_model, d_model)
    self.next_sentence = nn.Linear(d_model, 2)

  def forward(self, tokens, segments, mlm_positions):
    mask = padding_mask(tokens)
    x = self.embed(tokens) + self.segment_embed[segments]
    for layer in self.layers:
      x = layer(x, self_mask=mask)
    x = self.final_norm(x)
    h = torch.gather(x, 1, mlm_positions[..., None].expand(-1, -1, x.shape[-1]))
    h = self.mlm_norm(F.gelu(self.mlm_transform(h), approximate="tanh"))
    mlm = h @ self.embed.embedding.weight.T + self.mlm_bias
    nsp = self.next_sentence(torch.tanh(self.pooler(x[:, 0])))
    return mlm, nsp


def _load(model: nn.Module, sd: dict, flat: dict, used: set) -> None:
  model.load_state_dict(sd, strict=True)
  if set(flat) != used:
    raise ValueError(f"lnjax parameters not mapped: {sorted(set(flat) - used)}")


def _layer_state(flat: dict, src: str, dst: str, used: set) -> dict:
  """lnjax's layer `src` (a/b/layer_i/) -> the state dict entries of `Layer` at `dst`."""
  t = lambda k: torch.from_numpy(np.array(flat[k], dtype=np.float32, order="C", copy=True))
  take = lambda k: (used.add(src + k), t(src + k))[1]
  kernel = lambda k: take(k + "/kernel").T.contiguous()
  sd = {}
  fused = {"self_attn": (("qkv", ("query", "key", "value")),),
           "cross_attn": (("q", ("query",)), ("kv", ("key", "value")))}
  for attn, groups in fused.items():
    if src + f"{attn}/out/kernel" not in flat:
      continue
    for name, parts in groups:
      sd[f"{dst}{attn}.{name}.weight"] = torch.cat([kernel(f"{attn}/{p}") for p in parts], 0)
      sd[f"{dst}{attn}.{name}.bias"] = torch.cat([take(f"{attn}/{p}/bias") for p in parts])
    sd[f"{dst}{attn}.out.weight"] = kernel(f"{attn}/out")
    sd[f"{dst}{attn}.out.bias"] = take(f"{attn}/out/bias")
    sd[f"{dst}{attn}_norm.weight"] = take(f"{attn}_norm/scale")
    sd[f"{dst}{attn}_norm.bias"] = take(f"{attn}_norm/bias")
  for n in ("wi", "wo"):
    sd[f"{dst}{n}.weight"], sd[f"{dst}{n}.bias"] = kernel(f"ffn/{n}"), take(f"ffn/{n}/bias")
  sd[f"{dst}ffn_norm.weight"], sd[f"{dst}ffn_norm.bias"] = take("ffn_norm/scale"), take(
      "ffn_norm/bias")
  return sd


def _norm_state(flat, src, dst, used) -> dict:
  if src + "/scale" not in flat:
    return {}
  used.update({src + "/scale", src + "/bias"})
  t = lambda k: torch.from_numpy(np.array(flat[k], dtype=np.float32, copy=True))
  return {dst + ".weight": t(src + "/scale"), dst + ".bias": t(src + "/bias")}


def load_lnjax_encoder_decoder(model: TorchEncoderDecoder, flat: dict) -> None:
  """lnjax's parameters into `model`. Sinusoidal positions are a parameter in neither
  framework: the model keeps its own table (the initial losses compare the two)."""
  t = lambda k: torch.from_numpy(np.array(flat[k], dtype=np.float32, copy=True))
  used = {"embed/embedding"}
  sd = {"embed.embedding.weight": t("embed/embedding")}
  if isinstance(model.embed.positions, nn.Parameter):
    used.add("embed/positions")
    sd["embed.positions"] = t("embed/positions")
  else:
    sd["embed.positions"] = model.embed.positions
  for stack in ("encoder", "decoder"):
    for i in range(len(getattr(model, stack))):
      sd.update(_layer_state(flat, f"{stack}/layer_{i}/", f"{stack}.{i}.", used))
    sd.update(_norm_state(flat, f"{stack}/final_norm", f"{stack}_norm", used))
  _load(model, sd, flat, used)


def load_lnjax_bert(model: TorchBert, flat: dict) -> None:
  t = lambda k: torch.from_numpy(np.array(flat[k], dtype=np.float32, copy=True))
  used = {"bert/embed/embedding", "bert/embed/positions", "bert/segment_embed", "mlm_bias",
          "mlm_transform/kernel", "mlm_transform/bias", "pooler/kernel", "pooler/bias",
          "next_sentence/kernel", "next_sentence/bias"}
  sd = {"embed.embedding.weight": t("bert/embed/embedding"),
        "embed.positions": t("bert/embed/positions"),
        "segment_embed": t("bert/segment_embed"), "mlm_bias": t("mlm_bias")}
  for n in ("mlm_transform", "pooler", "next_sentence"):
    sd[f"{n}.weight"], sd[f"{n}.bias"] = t(f"{n}/kernel").T.contiguous(), t(f"{n}/bias")
  for i in range(len(model.layers)):
    sd.update(_layer_state(flat, f"bert/stack/layer_{i}/", f"layers.{i}.", used))
  sd.update(_norm_state(flat, "bert/stack/final_norm", "final_norm", used))
  sd.update(_norm_state(flat, "mlm_norm", "mlm_norm", used))
  _load(model, sd, flat, used)


class BatchTrainer:
  """Trainer's step for any model: `objective(model, batch)` -> (the loss minimized, the
  NLL reported); the batch (a dict of tensors) fixed."""

  def __init__(self, model, objective, batch: dict, lr=1e-3, betas=(0.9, 0.98), eps=1e-8,
               precision: Precision = FLOAT32):
    self.model, self.objective, self.precision = model.to(precision.device), objective, precision
    self.batch = {k: v.to(precision.device) for k, v in batch.items()}
    self.opt = torch.optim.Adam(model.parameters(), lr=lr, betas=betas, eps=eps)

  def run(self, n: int):
    times, nll = [], None
    for _ in range(n):
      t0 = time.perf_counter()
      self.opt.zero_grad(set_to_none=True)
      with self.precision.autocast():
        loss, nll = self.objective(self.model, self.batch)
      loss.backward()
      self.opt.step()
      self.precision.sync()
      times.append(time.perf_counter() - t0)
    return times, float(nll)

  @torch.no_grad()
  def loss(self) -> float:
    with self.precision.autocast():
      return float(self.objective(self.model, self.batch)[1])


def _weighted_nll(logits, targets, weights):
  logits = logits.float()  # The loss in float32 under bf16 autocast too, as lnjax's.
  nll = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1),
                        reduction="none")
  return (nll * weights.reshape(-1)).sum() / weights.sum()


def translation_objective(model, batch):
  logits = model(batch["inputs"], batch["decoder_inputs"])
  nll = _weighted_nll(logits, batch["targets"], batch["weights"])
  return nll, nll.detach()


def bert_objective(model, batch):
  """lnjax's _bert_loss: masked-LM NLL per predicted token + next-sentence NLL; reports
  the masked-LM NLL."""
  mlm, nsp = model(batch["inputs"], batch["segment_ids"], batch["mlm_positions"])
  nll = _weighted_nll(mlm, batch["targets"], batch["weights"])
  return nll + F.cross_entropy(nsp, batch["nsp_labels"]), nll.detach()


PEERS = {  # model name -> (class, lnjax parameter loader, objective)
    "mt": (TorchEncoderDecoder, load_lnjax_encoder_decoder, translation_objective),
    "mlm": (TorchBert, load_lnjax_bert, bert_objective),
}


def build_peer(spec: dict, params: dict | None, batch: dict,
               precision: Precision = FLOAT32) -> BatchTrainer:
  """spec = {'model': 'mt' | 'mlm', 'sizes': constructor keywords (norm_position too)};
  params: flat lnjax parameters or None; batch: numpy arrays (ints become int64)."""
  cls, load, objective = PEERS[spec["model"]]
  torch.set_num_threads(os.cpu_count())
  torch.manual_seed(0)
  model = cls(**spec["sizes"])
  if params is not None:
    load(model, params)
  tensors = {k: torch.from_numpy(v.astype(np.int64) if v.dtype.kind in "iu" else v)
             for k, v in batch.items()}
  return BatchTrainer(model, objective, tensors, precision=precision)


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


def matmul_gflops(n: int = 2048, reps: int = 7, precision: Precision = FLOAT32) -> float:
  """Median n×n @ n×n rate of torch.mm in the worker's dtype, GFLOP/s (for context only)."""
  dtype = torch.bfloat16 if precision.bf16 else torch.float32
  a, b = (torch.randn(n, n, dtype=dtype, device=precision.device) for _ in range(2))
  torch.mm(a, b)
  precision.sync()
  ts = []
  for _ in range(reps):
    t0 = time.perf_counter()
    torch.mm(a, b)
    precision.sync()
    ts.append(time.perf_counter() - t0)
  return 2 * n**3 / float(np.median(ts)) / 1e9


def device_peak_mib(precision: Precision) -> float | None:
  if precision.device.type != "cuda":
    return None
  return torch.cuda.max_memory_allocated(precision.device) / 2**20


def build(norm_position: str, params_npz: str | None = None, precision: Precision = FLOAT32,
          **sizes):
  torch.set_num_threads(os.cpu_count())
  torch.manual_seed(0)
  model = TorchLM(norm_position=norm_position, **sizes)
  if params_npz:
    with np.load(params_npz) as f:
      load_lnjax_params(model, {k: f[k] for k in f.files})
  return Trainer(model, precision=precision)


def worker(args) -> None:
  precision = Precision(args.device, args.dtype)
  spec = {}
  if args.spec:  # benchmarks/suite.py's models.
    with open(args.spec) as f:
      spec = json.load(f)
  if spec.get("model") in PEERS or spec.get("model") == "llama":
    # The encoder-decoder, the masked LM, or transformers' LlamaForCausalLM (llama_peer.py).
    with np.load(args.params) as f:
      params = {k: f[k] for k in f.files}
    with np.load(args.batch) as f:
      batch = {k: f[k] for k in f.files}
    if spec["model"] == "llama":
      import llama_peer
      trainer = llama_peer.build(spec, params, batch, precision)
    else:
      trainer = build_peer(spec, params, batch, precision)
    run, loss = trainer.run, trainer.loss
  else:  # The LM: the spec's sizes, or benchmarks/lm_step.py's (TorchLM's defaults).
    sizes = dict(spec.get("sizes", {}))
    trainer = build(sizes.pop("norm_position", args.norm), args.params, precision, **sizes)
    with np.load(args.batch) as f:
      inputs = torch.from_numpy(f["inputs"].astype(np.int64)).to(precision.device)
      targets = torch.from_numpy(f["targets"].astype(np.int64)).to(precision.device)
    run = lambda n: trainer.run(inputs, targets, n)
    loss = lambda: trainer.loss(inputs, targets)
  reply = lambda obj: (sys.stdout.write(json.dumps(obj) + "\n"), sys.stdout.flush())
  reply({"ready": True, "num_params": count_params(trainer.model),
         "num_threads": torch.get_num_threads()})
  for line in sys.stdin:
    cmd = line.split()
    if not cmd:
      continue
    if cmd[0] == "run":
      times, last = run(int(cmd[1]))
      reply({"times": times, "loss": last})
    elif cmd[0] == "loss":
      reply({"loss": loss()})
    elif cmd[0] == "rss":
      reply({"maxrss_kib": peak_rss_kib(), "device_peak_mib": device_peak_mib(precision)})
    elif cmd[0] == "matmul":
      reply({"gflops": matmul_gflops(*map(int, cmd[1:2]), precision=precision)})
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
  p.add_argument("--spec", help="worker mode, suite models: JSON {'model': 'lm' | 'mt' | "
                 "'mlm', 'sizes': {...}}; for mt and mlm the batch npz holds the whole "
                 "lnjax batch")
  p.add_argument("--steps", type=int, default=10, help="standalone mode: steps to time")
  p.add_argument("--device", default="cpu", help="cpu | cuda | cuda:N (worker mode)")
  p.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32",
                 help="compute dtype (worker mode): bfloat16 = autocast, float32 parameters")
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
