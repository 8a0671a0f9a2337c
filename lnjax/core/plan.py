"""A run's steps compiled for a TPU slice on this host: per-chip memory against the chip's
HBM, FLOPs, bytes, collectives and a roofline bound, before any slice is rented.

  config = lnjax.get_config("lm", "smoke")
  p = plan.plan_run(config, tpu.parse_topology("v5e:2x2"), tasks=lnjax.tasks.get)
  p["train"]["fits"], p["train"]["hbm_total_bytes"], p["train"]["flops"]

The steps are the ones `lnjax train` jits (lnjax/core/build.py's `jit_steps`: the same
model, optimizer, shardings, donation, scan and remat), lowered on ShapeDtypeStructs with
their shardings (nothing is allocated, no batch is read) and compiled by libtpu's compiler
for the slice's devices, as MaxText's train_compile does. A step that needs more HBM than
a chip has fails to compile there with the compiler's own count, which the report keeps.
Without model.vocab_size the data are prepared (the tokenizer decides the vocabulary).
"""

import contextlib
import math
import re
import time

import jax
import ml_collections
import numpy as np

from lnjax.core import build, errors, run as run_lib, sharding, state as state_lib, tpu

GiB = tpu.GiB
COLLECTIVES = ("all-gather", "reduce-scatter", "all-reduce", "all-to-all", "collective-permute")


def plan_run(config: ml_collections.ConfigDict, slice_: tpu.Slice, with_eval: bool = True,
             more_steps: dict | None = None, *, tasks: run_lib.TaskLookup) -> dict:
  """The report of `config`'s train step (and eval step) on `slice_` (module docstring);
  `more_steps`: {name: function(prepare's parts) -> a step's report} (translation's decode,
  lnjax/cli/compile.py). Bad input (a mesh or batch that does not fit the slice, a step
  that does not compile) is a ConfigError. `tasks`: the task registry's lookup
  (lnjax.tasks.get)."""
  parts = prepare(config, slice_, tasks=tasks)
  report = {"topology": slice_.name, "libtpu_topology": slice_.libtpu_topology,
            "num_slices": slice_.num_slices, "num_chips": slice_.num_chips,
            "device_kind": parts["mesh"].devices.flat[0].device_kind,
            "mesh": dict(parts["mesh"].shape), "chip": chip_figures(slice_.chip),
            "num_params": parts["num_params"],
            "model_flops_per_step": parts["model_flops"]}
  steps = {"train": (lambda p: p["train_step"].lower(p["state"], p["batch"]), 1.0)}
  if with_eval:  # The forward pass alone: a third of training's matmuls.
    steps["eval"] = (lambda p: p["eval_step"].lower(p["state"].params, p["batch"]), 1 / 3)
  for name, (lower, share) in steps.items():
    report[name] = compile_report(lambda: lower(parts), slice_, parts["model_flops"] * share)
  if parts["run"].model.scan_layers:
    _extrapolate_depth(config, slice_, steps, report, parts["model_flops"], tasks)
  for name, step_report in (more_steps or {}).items():
    report[name] = step_report(parts)
  return report


def prepare(config: ml_collections.ConfigDict, slice_: tpu.Slice | None = None,
            mesh=None, *, tasks: run_lib.TaskLookup) -> dict:
  """Mesh, setup, jitted steps and abstract state and batch of `config` on `slice_`, or
  on `mesh` (the devices attached here: benchmarks/plan_peak.py)."""
  run = run_lib.resolve_config(config, tasks=tasks)
  if run.task.batch_shapes is None:
    raise errors.ConfigError(f"task {run.task.name!r} does not describe its batches "
                             "(Task.batch_shapes): it cannot be compiled ahead")
  mesh = mesh if mesh is not None else slice_mesh(run.mesh, slice_)
  batch_shards = mesh.shape["data"] * mesh.shape["fsdp"]
  if getattr(run.data, "batch_size", 0) % batch_shards:
    raise errors.ConfigError(f"data.batch_size={run.data.batch_size} must be divisible by "
                             f"mesh data×fsdp={batch_shards}")
  run, steps_per_epoch = _with_vocabulary(config, run, batch_shards)
  # Decay boundaries in epochs need the epoch's length; where the data were not read, one
  # step an epoch: where the schedule's steps fall changes no buffer and no FLOP.
  setup = build.run_setup(run, steps_per_epoch or (1 if run.opt.decay_epochs else None))
  _, batch_sharding, train_step, eval_step, _ = build.jit_steps(run, setup, mesh)
  state = state_lib.abstract_state(setup, mesh)
  batch = {k: jax.ShapeDtypeStruct(shape, dtype, sharding=batch_sharding)
           for k, (shape, dtype) in run.task.batch_shapes(run.data, batch_shards).items()}
  num_params = sum(x.size for x in jax.tree.leaves(state.params))
  # Kaplan et al. 2020 (arXiv 2001.08361, C ≈ 6N per token): 2N forward, 4N backward, a
  # token being a position of the model's input (encoder and decoder inputs are equally
  # long here: each side's parameters see one side's tokens). Attention's T² term aside.
  tokens = math.prod(batch["inputs"].shape)
  return {"run": run, "slice": slice_, "mesh": mesh, "setup": setup, "state": state, "batch": batch,
          "train_step": train_step, "eval_step": eval_step, "num_params": int(num_params),
          "model_flops": 6.0 * num_params * tokens}


def slice_mesh(cfg: sharding.MeshConfig, slice_: tpu.Slice):
  """The (data, fsdp, model) mesh over every chip of the slice; multislice: data across
  the slices unless the config's dcn_* axes say otherwise. A mesh that leaves chips idle
  or asks for more is a ConfigError."""
  if math.prod(cfg.dcn_shape) == 1 and slice_.num_slices > 1:
    cfg = sharding.MeshConfig(data=cfg.data, fsdp=cfg.fsdp, model=cfg.model,
                              dcn_data=slice_.num_slices)
  if math.prod(cfg.dcn_shape) != slice_.num_slices:
    raise errors.ConfigError(f"mesh: dcn_data×dcn_fsdp×dcn_model={math.prod(cfg.dcn_shape)} "
                             f"differs from the {slice_.num_slices} slices of --num_slices")
  ici = cfg.shape(slice_.chips_per_slice)
  if math.prod(ici) != slice_.chips_per_slice:
    raise errors.ConfigError(
        f"mesh: data×fsdp×model={'×'.join(map(str, ici))}={math.prod(ici)} differs from the "
        f"{slice_.chips_per_slice} chips of {slice_.name}")
  return sharding.make_mesh(cfg, tpu.topology_devices(slice_))


def _with_vocabulary(config, run: run_lib.RunConfig, batch_shards: int):
  """(run, steps per epoch): model.vocab_size as given, else the data's (prepared as a run
  prepares them: the tokenizer decides)."""
  if run.model.vocab_size:
    return run, None
  data = run.task.make_data(run.data, run.seed, 0, 1, batch_shards)
  _, run = build.complete_config(config, run, data)
  return run, data.steps_per_epoch


def compile_report(lower, slice_: tpu.Slice, model_flops: float) -> dict:
  """Lowers and compiles one step (`lower()` -> jax Lowered) and reports it per chip."""
  t0 = time.perf_counter()
  try:
    lowered = lower()
  except errors.LnjaxError:
    raise
  except Exception as e:  # A model that does not trace on this mesh.
    raise errors.ConfigError(f"the step does not lower for {slice_.name}: "
                             f"{_first_line(e)}") from None
  t1 = time.perf_counter()
  try:
    with _no_persistent_cache():
      compiled = lowered.compile()
  except Exception as e:  # libtpu: an out-of-memory step is a compile error.
    missing = _hbm_shortfall(str(e))
    if missing is None:
      raise errors.ConfigError(f"the step does not compile for {slice_.name}: "
                               f"{_first_line(e)}") from None
    return {**missing, "fits": False, "lower_seconds": t1 - t0,
            "compile_seconds": time.perf_counter() - t1,
            "verdict": f"misses by {missing['hbm_missing_bytes'] / GiB:.2f} GiB"}
  seconds = time.perf_counter() - t1
  hlo = compiled.as_text()  # (Tens of MB at 7B: read once.)
  return {**memory_report(compiled, slice_.chip.hbm_bytes),
          **cost_report(compiled, slice_.chip, model_flops / slice_.num_chips, lowered,
                        slice_.num_chips, hlo),
          "collectives": collectives(hlo),
          "lower_seconds": t1 - t0, "compile_seconds": seconds}


@contextlib.contextmanager
def _no_persistent_cache():
  """JAX's persistent compilation cache (a run's train.compilation_cache_dir, the tests')
  off for this compile: it can store a TPU program compiled here, not load one back
  without a TPU client (a warning per compile, and the compile again). jax decides once per
  process whether the cache is used (`is_cache_used`), so the option alone is not read
  after a first compile: the decision is reset on the way in and out."""
  from jax._src import config as jax_config  # (The option's context manager.)
  from jax.experimental.compilation_cache import compilation_cache
  compilation_cache.reset_cache()
  try:
    with jax_config.enable_compilation_cache(False):
      yield
  finally:
    compilation_cache.reset_cache()


def memory_report(compiled, capacity: float) -> dict:
  """Per-chip bytes of the compiled step: arguments (state, batch), outputs, temporaries
  (activations, gradients, XLA's scratch) and the program, donated state counted once
  (alias); against a chip's `capacity` in bytes."""
  m = compiled.memory_analysis()
  total = (m.argument_size_in_bytes + m.output_size_in_bytes - m.alias_size_in_bytes
           + m.temp_size_in_bytes + m.generated_code_size_in_bytes)
  fits = total <= capacity
  headroom = capacity - total  # (int for a chip's capacity; inf where none is known.)
  return {"argument_bytes": int(m.argument_size_in_bytes),
          "output_bytes": int(m.output_size_in_bytes),
          "alias_bytes": int(m.alias_size_in_bytes), "temp_bytes": int(m.temp_size_in_bytes),
          "code_bytes": int(m.generated_code_size_in_bytes), "hbm_total_bytes": int(total),
          "hbm_capacity_bytes": capacity, "hbm_headroom_bytes": headroom,
          "fits": bool(fits),
          "verdict": "fits" if fits else f"misses by {-headroom / GiB:.2f} GiB"}


def cost_report(compiled, chip: tpu.Chip, model_flops_per_chip: float, lowered=None,
                num_chips: int = 1, hlo: str | None = None) -> dict:
  """FLOPs and HBM bytes of one step on one chip and their roofline (`cost_source`:
  "compiled", XLA's cost analysis of the partitioned program, or "lowered", see
  step_cost)."""
  cost, source = step_cost(compiled, lowered, num_chips, hlo)
  return {"cost_source": source,
          "compiler_optimal_seconds": float(cost.get("optimal_seconds", float("nan"))),
          **roofline(float(cost.get("flops", 0.0)), float(cost.get("bytes accessed", 0.0)),
                     chip, model_flops_per_chip)}


def step_cost(compiled, lowered=None, num_chips: int = 1,
              hlo: str | None = None) -> tuple[dict, str]:
  """(XLA's cost analysis of one chip's program, "compiled"). XLA:GPU keeps none for a
  compiled program and jax none for a lowered one on a plugin's platform: there, XLA's
  HLO cost analysis of the whole step before partitioning and the GPU passes (run by the
  CPU client, as jax's Lowered.cost_analysis does on the CPU), over the chips, "lowered".
  `hlo`: the compiled program's text where the caller has read it already."""
  cost = compiled.cost_analysis()
  cost = cost[0] if isinstance(cost, (list, tuple)) and cost else cost
  # XLA counts a loop's body once, and under FSDP the partitioner turns all-gathered
  # matmuls into loops (14 in the 125M Llama's fsdp=8 step at depth 1 on v5e-8, none under
  # data=8; its FLOPs read 1.39e12 against data's 1.68e12, 2026-12-05): there the FLOPs
  # are the whole step's before partitioning, over the chips; the bytes stay the chip's.
  looped = bool(cost) and lowered is not None and " while(" in (
      compiled.as_text() if hlo is None else hlo)
  if (cost or lowered is None) and not looped:
    return cost or {}, "compiled"
  from jax._src import xla_bridge  # (jax's own path to XLA's HLO cost analysis.)
  from jax._src.lib import _jax
  whole = _jax.hlo_module_cost_analysis(xla_bridge.get_backend("cpu"),
                                        lowered.compiler_ir("hlo").as_hlo_module())
  if looped:
    return {**cost, "flops": whole["flops"] / num_chips}, "compiled; FLOPs before partitioning"
  return {k: whole[k] / num_chips for k in ("flops", "bytes accessed") if k in whole}, "lowered"


def roofline(flops: float, accessed: float, chip: tpu.Chip, model_flops_per_chip: float):
  """The step takes at least max(FLOPs / peak, bytes / HBM bandwidth); the MFU bound is
  the model's FLOPs (6N per token) over peak × that time."""
  compute_s, memory_s = flops / chip.peak_bf16_flops, accessed / chip.hbm_bandwidth
  bound_s = max(compute_s, memory_s)
  return {"flops": flops, "hbm_bytes_accessed": accessed,
          "roofline_compute_seconds": compute_s, "roofline_hbm_seconds": memory_s,
          "step_seconds_bound": bound_s, "bound_by": "compute" if compute_s >= memory_s else "hbm",
          "model_flops_per_chip": model_flops_per_chip,
          "mfu_bound": model_flops_per_chip / (chip.peak_bf16_flops * bound_s) if bound_s else 0.0}


def _extrapolate_depth(config, slice_: tpu.Slice, steps: dict, report: dict,
                       model_flops: float, tasks: run_lib.TaskLookup) -> None:
  """Per-step FLOPs, bytes and collectives of a scanned stack (model.scan_layers). XLA's
  cost analysis counts a loop's body once: the smoke LM at 4 layers and D 512 on v5e:2x2
  gave 1.16e9 FLOPs scanned, 3.74e9 unrolled (2026-12-05). So the unrolled model is
  compiled at depth 1 and 2 and each count c extended to the run's depth L:
  c(L) = c(1) + (L - 1)·(c(2) - c(1)). Memory stays the scanned program's own."""
  depth = config.model.num_layers
  probes = [prepare(_unrolled(config, d), slice_, tasks=tasks) for d in (1, 2)]
  for name, (lower, share) in steps.items():
    if "flops" not in report[name]:
      continue  # (Out of memory: nothing to count.)
    one, two = (_counts(lower(p), slice_.num_chips) for p in probes)
    line = {k: one[k] + (depth - 1) * (two[k] - one[k]) for k in one}
    r = report[name]
    r.update(flops_scanned_program=r["flops"], depth_extrapolated=True,
             **roofline(line.pop("flops"), line.pop("bytes"), slice_.chip,
                        model_flops * share / slice_.num_chips))
    r["collectives"] = {k: {"count": int(line[f"{k} count"]), "bytes": int(line[f"{k} bytes"])}
                        for k in COLLECTIVES}


def _unrolled(config, depth: int) -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict(config.to_dict())
  c.model.scan_layers, c.model.num_layers = False, depth
  if c.model.get("num_decoder_layers"):
    c.model.num_decoder_layers = depth
  return c


def _counts(lowered, num_chips: int) -> dict:
  with _no_persistent_cache():
    compiled = lowered.compile()
  hlo = compiled.as_text()
  cost, _ = step_cost(compiled, lowered, num_chips, hlo)
  out = {"flops": float(cost.get("flops", 0.0)), "bytes": float(cost.get("bytes accessed", 0.0))}
  for kind, c in collectives(hlo).items():
    out[f"{kind} count"], out[f"{kind} bytes"] = c["count"], c["bytes"]
  return out


# An HLO instruction: `%name = TYPE op(...)`, TYPE one array type or a tuple of them,
# whose layouts may hold one level of parentheses (TPU tiles: {1,0:T(8,128)}).
_INSTRUCTION = re.compile(r"=\s+(\((?:[^()]|\([^()]*\))*\)|[a-z]\w*\[[\d,]*\](?:\{[^}]*\})?)"
                          r"\s+([a-z][\w-]*)\(")
_ARRAY = re.compile(r"\b([a-z]\w*)\[([\d,]*)\]")


def collectives(hlo_text: str) -> dict:
  """{kind: {"count", "bytes"}} of the compiled program's collectives, each counted once
  where it stands in the program (a loop body once: see _extrapolate_depth); bytes: what
  each produces on a chip (an async pair's `-done` result, every array of a combined one;
  its `-start` is not counted)."""
  out = {kind: {"count": 0, "bytes": 0} for kind in COLLECTIVES}
  for m in _INSTRUCTION.finditer(hlo_text):
    op = m.group(2)
    kind = op[:-5] if op.endswith("-done") else op
    if kind in out:
      out[kind]["count"] += 1
      out[kind]["bytes"] += _result_bytes(m.group(1))
  return out


def _result_bytes(type_text: str) -> int:
  return sum(_dtype_bytes(dtype) * math.prod(int(d) for d in dims.split(",") if d)
             for dtype, dims in _ARRAY.findall(type_text))


def _dtype_bytes(name: str) -> int:
  if name == "pred":
    return 1
  try:
    return np.dtype(name).itemsize
  except TypeError:  # bf16, f8e4m3fn, ...: the digits say the bits.
    bits = re.search(r"(\d+)", name)
    return max(1, int(bits.group(1)) // 8) if bits else 0


_SIZE = r"([\d.]+)\s*([KMGT]?)i?B?"
_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def _hbm_shortfall(message: str) -> dict | None:
  """The compiler's own count from an out-of-memory compile error ('... required for HLO
  temporaries (26.84G) exceeds available HBM (15.75G)', or 'Used 20.5G of 15.75G hbm'),
  in bytes; None for any other error."""
  if "RESOURCE_EXHAUSTED" not in message and "memory" not in message.lower():
    return None
  m = (re.search(rf"\({_SIZE}\) exceeds available HBM \({_SIZE}\)", message)
       or re.search(rf"Used {_SIZE} of {_SIZE} hbm", message))
  if m is None:
    return None
  need = float(m.group(1)) * _UNITS[m.group(2)]
  have = float(m.group(3)) * _UNITS[m.group(4)]
  return {"hbm_required_bytes": int(need), "hbm_available_bytes": int(have),
          "hbm_missing_bytes": int(need - have), "compiler_message": _first_line(message)}


def chip_figures(chip: tpu.Chip) -> dict:
  return {"generation": chip.generation, "peak_bf16_flops": chip.peak_bf16_flops,
          "hbm_capacity_bytes": chip.hbm_bytes, "hbm_bandwidth_bytes_per_second":
          chip.hbm_bandwidth, "source": chip.source}


def _first_line(e) -> str:
  lines = [l.strip() for l in str(e).splitlines() if l.strip()]
  return lines[0][:400] if lines else type(e).__name__
