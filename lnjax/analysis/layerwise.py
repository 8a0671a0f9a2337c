r"""The gradient statistics and the layer-removal profile of a decoder-only LM
(models.TransformerLM, unrolled layers) one layer at a time: the numbers of
lnjax.analysis.probes.gradient_and_update_norms and lnjax.analysis.removal.layer_removal
without the whole model's gradient, or a float32 copy of all its weights, in memory at once
(XLA:CPU computes bfloat16 dots in float32; the whole-model gradient of a 1B bfloat16 model
peaks at 5.3x its weight bytes, BENCHMARKS.md).

  forward   x_0 = begin(embed(tokens)), x_{i+1} = block_i(x_i); every layer's input x_i is
            kept (B×T×D per batch). One compiled block serves every layer of one sliding
            window, its parameters an argument.
  loss      L = Σ_bt w_bt (lse_bt − z_bt[y_bt]) / Σ_bt w_bt, z the logits and
            lse = log Σ_v exp z_v, taken over chunks of CHUNK_ROWS vocabulary entries of the
            output matrix (the tied embedding E [V, D] or W_out [D, V]).
  backward  g_L = ∂L/∂x_L, chunk by chunk (∂L/∂z = (softmax(z) − onehot(y))·w/Σw); then
            (G_i, g_i) = vjp(block_i at x_i)(g_{i+1}) from the last layer down. Layer i's
            gradient G_i is reduced at once to ‖G‖_F, ‖U‖_F and ‖W‖_F of each weight, U the
            first update of the optimizer (elementwise in G and W: Adam, AdamW, RAdam, SGD
            without global-norm clipping), and dropped.
  output    ∂L/∂E = the output's part + the input's rows (∂L/∂x_0 scatter-added at the
            tokens), one chunk of rows at a time; its sums of squares added over chunks.
  removal   the loss without layer i: block_{L-1}(… block_{i+1}(x_i)) through the output,
            from the kept x_i (as removal.layer_removal: layer i's input passed on).
  norms     every norm's input and output (probes.norm_inputs) recorded piece by piece on
            the kept streams: no logits, no float32 copy of the output matrix.
"""

import dataclasses
import functools
import math
import re

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from flax import traverse_util

from lnjax.analysis import probes, removal
from lnjax.core import allocator
from lnjax.models import layers, norms, placement
from lnjax.models.config import ModelConfig
from lnjax.models.transformer import Block, Embed, output_logits

CHUNK_ROWS = 8192  # Vocabulary entries of the output matrix per compiled chunk.
# After each piece its freed float32 temporaries go back to the OS: under the analyze
# command's glibc settings (core/allocator.py) the heap's holes would stay resident.
_release = allocator.release_free_memory
_LAYER = re.compile(r"layer_(\d+)")
_INPUT = ("embed", "embed_norm")  # TransformerLM's parameters before layer 0 (embed_norm: Peri-LN).


def applies(task_name: str, cfg: ModelConfig) -> bool:
  """Whether the model is one this module takes apart: a TransformerLM with unrolled layers
  and an output of one matrix (not nGPT's, whose logits carry a learned per-entry scale)."""
  return task_name == "lm" and not cfg.scan_layers and cfg.norm_position != "ngpt"


class _Input(nn.Module):
  """TransformerLM up to layer 0: the stream x_0 = begin(embed(tokens))."""
  cfg: ModelConfig

  @nn.compact
  def __call__(self, tokens_BxT):
    x_BxTxD = Embed(self.cfg, name="embed")(tokens_BxT, deterministic=True)
    return placement.begin(self.cfg, x_BxTxD)


class _Output(nn.Module):
  """TransformerLM after its last layer: the logits of `cfg.vocab_size` entries (a chunk of
  the output matrix's, given as the parameter) on the stream x_L."""
  cfg: ModelConfig

  @nn.compact
  def __call__(self, stream):
    x_BxTxD = placement.end(self.cfg, stream, name="final_norm")
    return output_logits(self.cfg, Embed(self.cfg, name="embed"), x_BxTxD)


class _End(nn.Module):
  """TransformerLM's final norm (placement.end) alone."""
  cfg: ModelConfig

  @nn.compact
  def __call__(self, stream):
    return placement.end(self.cfg, stream, name="final_norm")


@functools.partial(jax.jit, static_argnums=0)
def _input(cfg, params_in, tokens_BxT):
  """x_0."""
  return _Input(cfg).apply({"params": params_in}, tokens_BxT)


def _apply_block(cfg: ModelConfig, index: int, window: int, params, stream):
  t = jax.tree.leaves(stream)[0].shape[1]
  return Block(cfg, causal=True, index=index).apply({"params": params}, stream,
                                                    layers.causal_bias(t), None, None, window)


@functools.partial(jax.jit, static_argnums=(0, 1, 2))
def _block(cfg, index, window, params, stream):
  """x_{i+1} = block_i(x_i)."""
  return _apply_block(cfg, index, window, params, stream)


@functools.partial(jax.jit, static_argnums=(0, 1, 2))
def _block_vjp(cfg, index, window, params, stream, g_out):
  """(∂L/∂params_i, ∂L/∂x_i) from g_out = ∂L/∂x_{i+1}."""
  _, vjp = jax.vjp(lambda p, s: _apply_block(cfg, index, window, p, s), params, stream)
  return vjp(g_out)


def _layer_key(cfg: ModelConfig, i: int) -> tuple[int, int]:
  """(index, window) of layer i's compiled block: index 0 wherever the placement's block
  does not depend on it (removal.INDEPENDENT_OF_DEPTH), so that one compilation serves."""
  index = 0 if cfg.norm_position in removal.INDEPENDENT_OF_DEPTH else i
  return index, cfg.layer_windows()[i]


# ---- the output, chunk by chunk


def _matrix_at(cfg: ModelConfig) -> tuple[str, str, int]:
  """(module, parameter, vocabulary axis) of the output matrix: the tied embedding E [V, D]
  or the logits layer's W_out [D, V]."""
  return ("embed", "embedding", 0) if cfg.tie_embeddings else ("logits", "kernel", 1)


def chunks(vocab_size: int, rows: int | None = None) -> list[tuple[int, int]]:
  """[(start, size)] covering [0, V) in ⌈V/rows⌉ chunks (rows: CHUNK_ROWS) of near-equal
  size (at most two distinct sizes: two compilations)."""
  n = math.ceil(vocab_size / (rows or CHUNK_ROWS))
  size = math.ceil(vocab_size / n)
  return [(a, min(size, vocab_size - a)) for a in range(0, vocab_size, size)]


def _output_rest(params, cfg: ModelConfig) -> dict:
  """The output's parameters but its matrix: the final norm (and the learned positions,
  which a tied Embed declares)."""
  module, name, _ = _matrix_at(cfg)
  rest = {k: v for k, v in params.items()
          if not _LAYER.fullmatch(k) and k not in ("embed_norm", "logits")}
  rest["embed"] = {k: v for k, v in params["embed"].items() if k != "embedding"}
  if module != "embed":
    del rest["embed"]  # (untied, the output reads no embedding)
  return rest


def _with_matrix(rest: dict, cfg: ModelConfig, matrix) -> dict:
  module, name, _ = _matrix_at(cfg)
  return {**rest, module: {**rest.get(module, {}), name: matrix}}


def _slice(cfg: ModelConfig, matrix, start, size: int):
  """The output matrix's entries [start, start + size) of the vocabulary."""
  return jax.lax.dynamic_slice_in_dim(matrix, start, size, _matrix_at(cfg)[2])


def _chunk_logits(cfg: ModelConfig, chunk, rest, stream):
  """z [B, T, C] of the C vocabulary entries of `chunk` (a slice of the output matrix)."""
  size = chunk.shape[_matrix_at(cfg)[2]]
  return _Output(dataclasses.replace(cfg, vocab_size=size)).apply(
      {"params": _with_matrix(rest, cfg, chunk)}, stream)


@functools.partial(jax.jit, static_argnums=(0, 1))
def _partition(cfg, size, matrix, rest, stream, targets_BxT, start):
  """(log Σ_v exp z_v, z_y where y falls in the chunk else 0) over one chunk, each [B, T]."""
  z_BxTxC = _chunk_logits(cfg, _slice(cfg, matrix, start, size), rest, stream)
  local_BxT = targets_BxT - start
  inside_BxT = (local_BxT >= 0) & (local_BxT < size)
  z_y = jnp.take_along_axis(z_BxTxC, jnp.clip(local_BxT, 0, size - 1)[..., None], -1)[..., 0]
  return jax.nn.logsumexp(z_BxTxC, -1), jnp.where(inside_BxT, z_y, 0.0)


def _cotangent(z_BxTxC, targets_BxT, scale_BxT, lse_BxT, start):
  """∂L/∂z on one chunk: (softmax(z) − onehot(y))·w/Σw."""
  size = z_BxTxC.shape[-1]
  onehot = (start + jnp.arange(size)) == targets_BxT[..., None]
  p = jnp.exp(z_BxTxC - lse_BxT[..., None])
  return (p - onehot) * scale_BxT[..., None]


@functools.partial(jax.jit, static_argnums=(0, 1))
def _output_vjp(cfg, size, matrix, rest, stream, targets_BxT, scale_BxT, lse_BxT, start):
  """One chunk's share of (∂L/∂rest, ∂L/∂x_L)."""
  chunk = _slice(cfg, matrix, start, size)
  z, vjp = jax.vjp(lambda r, s: _chunk_logits(cfg, chunk, r, s), rest, stream)
  return vjp(_cotangent(z, targets_BxT, scale_BxT, lse_BxT, start))


@functools.partial(jax.jit, static_argnums=(0, 1))
def _matrix_vjp(cfg, size, matrix, rest, stream, targets_BxT, scale_BxT, lse_BxT, start):
  """The output's part of ∂L/∂(the matrix's chunk), in float32."""
  z, vjp = jax.vjp(lambda m: _chunk_logits(cfg, m, rest, stream),
                   _slice(cfg, matrix, start, size))
  return vjp(_cotangent(z, targets_BxT, scale_BxT, lse_BxT, start))[0].astype(jnp.float32)


@functools.partial(jax.jit, static_argnums=0)
def _input_vjp(cfg, params_in, tokens_BxT, g_stream):
  """(∂L/∂(input parameters but E), ∂L/∂E[tokens] as rows [B·T, D]) from g_stream = ∂L/∂x_0:
  Embed applied to the gathered rows as its table, so that no [V, D] gradient is formed."""
  n = tokens_BxT.size
  rows_NxD = jnp.take(params_in["embed"]["embedding"], tokens_BxT.reshape(-1), axis=0)
  rest = {**params_in, "embed": {k: v for k, v in params_in["embed"].items() if k != "embedding"}}
  as_table = lambda r, rows: _Input(dataclasses.replace(cfg, vocab_size=n)).apply(
      {"params": {**r, "embed": {**r["embed"], "embedding": rows}}},
      jnp.arange(n).reshape(tokens_BxT.shape))
  _, vjp = jax.vjp(as_table, rest, rows_NxD)
  return vjp(g_stream)


@functools.partial(jax.jit, static_argnums=0)
def _rows_into(size, start, ids_N, rows_NxD):
  """Σ of the rows whose id falls in [start, start + size), at their row: [size, D] float32."""
  local_N = ids_N - start
  local_N = jnp.where((local_N >= 0) & (local_N < size), local_N, size)  # (dropped)
  zeros = jnp.zeros((size, rows_NxD.shape[-1]), jnp.float32)
  return zeros.at[local_N].add(rows_NxD.astype(jnp.float32), mode="drop")


# ---- forward


@dataclasses.dataclass
class Forward:
  """One forward pass of `batches`, kept for the backward walk and the layer removal."""

  cfg: ModelConfig
  params: dict
  batches: list[dict]
  streams: list[list]  # streams[b][i]: batch b's stream entering layer i; [b][L]: after the last.
  lse: list  # Per batch, log Σ_v exp z_v [B, T].
  count: float  # Σ w over all batches.
  loss: float  # L, the mean NLL (nats).


def log_partition(cfg: ModelConfig, params, stream, targets_BxT):
  """(lse [B, T], z_y [B, T]) of the logits z on the stream after the last layer."""
  matrix_module, matrix_name, _ = _matrix_at(cfg)
  matrix, rest = params[matrix_module][matrix_name], _output_rest(params, cfg)
  lse_BxT, z_y_BxT = None, 0.0
  for start, size in chunks(cfg.vocab_size):
    lse_c, z_y_c = _partition(cfg, size, matrix, rest, stream, targets_BxT, start)
    lse_BxT = lse_c if lse_BxT is None else jnp.logaddexp(lse_BxT, lse_c)
    z_y_BxT = z_y_BxT + z_y_c
  return lse_BxT, z_y_BxT


def _nll_sum(lse_BxT, z_y_BxT, batch) -> float:
  return float(jnp.sum(jnp.asarray(batch["weights"], jnp.float32) * (lse_BxT - z_y_BxT)))


def forward(cfg: ModelConfig, params, batches: list[dict]) -> Forward:
  """x_0 … x_L of every batch, and the loss."""
  params_in = {k: params[k] for k in _INPUT if k in params}
  streams, lses, total = [], [], 0.0
  for batch in batches:
    stream = _input(cfg, params_in, jnp.asarray(batch["inputs"]))
    kept = [stream]
    for i in range(cfg.num_layers):
      stream = _block(cfg, *_layer_key(cfg, i), params[f"layer_{i}"], stream)
      kept.append(stream)
    lse_BxT, z_y_BxT = log_partition(cfg, params, stream, jnp.asarray(batch["targets"]))
    total += _nll_sum(lse_BxT, z_y_BxT, batch)
    streams.append(kept)
    lses.append(lse_BxT)
  count = float(sum(np.sum(np.asarray(b["weights"], np.float32)) for b in batches))
  _release()
  return Forward(cfg, params, batches, streams, lses, count, total / count)


# ---- gradient statistics


def _square_sums(tx):
  """f(params, grads) -> (Σg², Σu², Σw²) per leaf, u the first update of `tx` (the gradient
  in the parameters' dtype, as jax.grad gives it)."""

  def sums(params, grads):
    grads = jax.tree.map(lambda g, p: g.astype(p.dtype), grads, params)
    updates, _ = tx.update(grads, tx.init(params), params)
    square = lambda tree: jax.tree.map(lambda x: jnp.sum(jnp.square(x.astype(jnp.float32))), tree)
    return square(grads), square(updates), square(params)

  return jax.jit(sums)


def _named(tree, prefix: str = "") -> dict:
  """{'layer_3/ffn/wo/kernel': leaf, ...}."""
  return {prefix + "/".join(k): v for k, v in traverse_util.flatten_dict(tree).items()}


def _add(a: dict, b: dict) -> dict:
  return {k: a[k] + b[k] if k in a and k in b else a.get(k, b.get(k)) for k in {**a, **b}}


class _Sums:
  """Σg², Σu², Σw² per weight name, added up over the pieces a weight is taken in."""

  def __init__(self, tx):
    self.sums, self.of = {}, _square_sums(tx)

  def add(self, params, grads, prefix: str = ""):
    for kind, tree in zip("guw", self.of(params, grads)):
      for k, v in _named(tree, prefix).items():
        self.sums[kind, k] = self.sums.get((kind, k), 0.0) + float(v)

  def norms(self) -> tuple[dict, dict]:
    """(gradient_norms, update_ratios), as probes.gradient_and_update_norms gives them."""
    names = sorted({k for _, k in self.sums}, key=lambda k: k.split("/"))
    root = lambda kind, k: math.sqrt(self.sums[kind, k])
    return ({k: root("g", k) for k in names},
            {k: root("u", k) / max(root("w", k), 1e-30) for k in names})


def _output_backward(fw: Forward, scales: list):
  """(∂L/∂x_L per batch, ∂L/∂(the output's parameters but its matrix))."""
  cfg, params = fw.cfg, fw.params
  matrix_module, matrix_name, _ = _matrix_at(cfg)
  matrix, rest = params[matrix_module][matrix_name], _output_rest(params, cfg)
  g_streams, g_rest = [], {}
  for b, batch in enumerate(fw.batches):
    g_stream = None
    for start, size in chunks(cfg.vocab_size):
      g_r, g_s = _output_vjp(cfg, size, matrix, rest, fw.streams[b][-1],
                             jnp.asarray(batch["targets"]), scales[b], fw.lse[b], start)
      g_stream = g_s if g_stream is None else jax.tree.map(jnp.add, g_stream, g_s)
      g_rest = _add(g_rest, _named(g_r))
    g_streams.append(g_stream)
  _release()
  return g_streams, g_rest


def _layers_backward(fw: Forward, g_streams: list, sums: _Sums) -> list:
  """∂L/∂x_0 per batch; each layer's gradient into `sums` and dropped."""
  cfg, params = fw.cfg, fw.params
  for i in reversed(range(cfg.num_layers)):
    grads = None
    for b in range(len(fw.batches)):
      g_p, g_streams[b] = _block_vjp(cfg, *_layer_key(cfg, i), params[f"layer_{i}"],
                                     fw.streams[b][i], g_streams[b])
      grads = g_p if grads is None else jax.tree.map(jnp.add, grads, g_p)
    sums.add(params[f"layer_{i}"], grads, f"layer_{i}/")
    del grads, g_p
    _release()
  return g_streams


def _matrix_sums(fw: Forward, scales: list, rows: tuple, sums: _Sums) -> None:
  """The output matrix's and the embedding's statistics, one chunk of V at a time: ∂L/∂E
  is the input's rows (`rows`: token ids and ∂L/∂E[id] rows), plus, tied, the output's
  part; untied, W_out has the output's part alone."""
  cfg, params = fw.cfg, fw.params
  matrix_module, matrix_name, axis = _matrix_at(cfg)
  matrix, rest = params[matrix_module][matrix_name], _output_rest(params, cfg)
  embedding = params["embed"]["embedding"]
  for start, size in chunks(cfg.vocab_size):
    head = 0.0
    for b, batch in enumerate(fw.batches):
      head = head + _matrix_vjp(cfg, size, matrix, rest, fw.streams[b][-1],
                                jnp.asarray(batch["targets"]), scales[b], fw.lse[b], start)
    inputs = _rows_into(size, start, *rows)
    if cfg.tie_embeddings:
      grads = {"embed": {"embedding": head + inputs}}
    else:
      grads = {"embed": {"embedding": inputs}, "logits": {"kernel": head}}
    chunk = lambda m, ax: jax.lax.slice_in_dim(m, start, start + size, axis=ax)
    values = {"embed": {"embedding": chunk(embedding, 0)}}
    if not cfg.tie_embeddings:
      values["logits"] = {"kernel": chunk(matrix, axis)}
    sums.add(values, grads)
    del head, inputs, grads, values
    _release()


def gradient_and_update_norms(fw: Forward, opt_cfg, learning_rate: float) -> tuple[dict, dict]:
  """(gradient_norms, update_ratios) as probes.gradient_and_update_norms gives them (the
  loss is layer_removal's), for the loss of `fw`: {'layer_3/ffn/wo/kernel': ‖∂L/∂W‖_F},
  {…: ‖Δw‖/‖w‖ of the first step}."""
  if opt_cfg.grad_clip_norm > 0:
    raise ValueError("global-norm clipping makes the first update depend on the whole "
                     "gradient: the layer-by-layer statistics need opt.grad_clip_norm=0")
  cfg, params = fw.cfg, fw.params
  sums = _Sums(probes.first_step(opt_cfg, learning_rate))
  scales = [jnp.asarray(b["weights"], jnp.float32) / fw.count for b in fw.batches]
  g_streams, g_rest = _output_backward(fw, scales)
  g_streams = _layers_backward(fw, g_streams, sums)
  params_in = {k: params[k] for k in _INPUT if k in params}
  ids, rows, g_in = [], [], {}
  for b, batch in enumerate(fw.batches):
    tokens_BxT = jnp.asarray(batch["inputs"])
    g_i, g_rows = _input_vjp(cfg, params_in, tokens_BxT, g_streams[b])
    g_in = _add(g_in, _named(g_i))
    ids.append(tokens_BxT.reshape(-1))
    rows.append(g_rows)
  small = _add(g_rest, g_in)  # The norms' gains, positions: every parameter but E, W_out.
  flat = _named(params)
  sums.add({k: flat[k] for k in small}, small)
  _matrix_sums(fw, scales, (jnp.concatenate(ids), jnp.concatenate(rows)), sums)
  return sums.norms()


# ---- layer removal


def layer_removal(fw: Forward) -> dict:
  """removal.layer_removal's profile: {'loss': L, 'increase': [L without layer i − L]}
  (None for one layer or a placement outside removal.INDEPENDENT_OF_DEPTH); layer i's
  input passed on from the kept x_i through layers i+1 … L-1."""
  cfg = fw.cfg
  if cfg.num_layers < 2 or cfg.norm_position not in removal.INDEPENDENT_OF_DEPTH:
    return {"loss": fw.loss, "increase": None}
  increase = []
  for i in range(cfg.num_layers):
    total = 0.0
    for b, batch in enumerate(fw.batches):
      stream = fw.streams[b][i]
      for j in range(i + 1, cfg.num_layers):
        stream = _block(cfg, *_layer_key(cfg, j), fw.params[f"layer_{j}"], stream)
      total += _nll_sum(*log_partition(cfg, fw.params, stream, jnp.asarray(batch["targets"])),
                        batch)
    increase.append(total / fw.count - fw.loss)
    _release()
  return {"loss": fw.loss, "increase": increase}


# ---- the norms' inputs and outputs


def _norm_calls(apply) -> tuple[dict, dict]:
  """({path: (x, y)}, {path: the norm module, unbound}) of every norm `apply()` calls, in
  the order called."""
  found, modules = {}, {}

  def interceptor(next_fun, args, kwargs, context):
    out = next_fun(*args, **kwargs)
    module = context.module
    if context.method_name == "__call__" and isinstance(module, norms.MODULES):
      path = "/".join(module.path)
      found[path] = (args[0], out)
      modules[path] = module.clone(parent=None, name=None)
    return out

  with nn.intercept_methods(interceptor):
    apply()
  return found, modules


def _piece_norms(apply, *args) -> dict:
  """{path: (module, x, y)} of the norms in `apply(*args)`: their modules found by an
  abstract trace, their values by a compiled one."""
  modules = {}

  def calls(*a):
    found, seen = _norm_calls(lambda: apply(*a))
    modules.update(seen)
    return found

  jax.eval_shape(calls, *args)
  values = _compiled_norms(apply)(*args)
  return {path: (modules[path], *values[path]) for path in modules}


@functools.lru_cache(maxsize=None)
def _compiled_norms(apply):
  return jax.jit(lambda *a: _norm_calls(lambda: apply(*a))[0])


@functools.lru_cache(maxsize=None)
def _input_piece(cfg: ModelConfig):
  """x_0 as a function of (input parameters, tokens): one object per configuration, so
  that each piece compiles once."""
  return lambda p, tokens_BxT: _Input(cfg).apply({"params": p}, tokens_BxT)


@functools.lru_cache(maxsize=None)
def _block_piece(cfg: ModelConfig, index: int, window: int):
  return functools.partial(_apply_block, cfg, index, window)


@functools.lru_cache(maxsize=None)
def _end_piece(cfg: ModelConfig):  # The final norm as a function of (parameters, x_L).
  return lambda p, stream: _End(cfg).apply({"params": p}, stream)


def norm_inputs(fw: Forward, *, num_tokens: int = 8) -> dict:
  """probes.norm_inputs on the first batch, from the kept streams: the input, each block
  and the final norm apart."""
  cfg, params, batch, streams = fw.cfg, fw.params, fw.batches[0], fw.streams[0]
  records = _piece_norms(_input_piece(cfg), {k: params[k] for k in _INPUT if k in params},
                         jnp.asarray(batch["inputs"]))
  for i in range(cfg.num_layers):
    found = _piece_norms(_block_piece(cfg, *_layer_key(cfg, i)), params[f"layer_{i}"],
                         streams[i])
    records.update({f"layer_{i}/{path}": r for path, r in found.items()})
  records.update(_piece_norms(_end_piece(cfg), _output_rest(params, cfg), streams[-1]))
  return probes.summarize_norms(records, params, batch, num_tokens=num_tokens)
