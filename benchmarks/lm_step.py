"""Train-step benchmark: lnjax (JAX/Flax, jit) against the same model in eager PyTorch.

  python benchmarks/lm_step.py [--steps N] [--rounds R] [--norm pre|post]
                               [--weight-grad autodiff|transposed]
                               [--torch-separate] [--out BENCHMARKS.md] [--json FILE]

The model of the foundation issue: decoder-only LM, 8 layers, d_model 128, 4 heads, FFN 512,
vocab 4096 (untied output projection), learned positions, sequence 128, batch 32:
2,651,392 parameters (Pre-LN; Post-LN has no final norm: 2,651,136). One step = forward +
cross-entropy + backward + Adam, parameters and optimizer state donated (lnjax's own
`steps.train_step`, jitted as lnjax's trainer jits it). Dropout 0, so both frameworks do
the same work; the PyTorch peer (benchmarks/torch_peer.py) starts from lnjax's initial
parameters, and the two initial losses are checked to agree.

Timing: both are compiled/warmed up, then R rounds alternate a block of N lnjax steps, a
block of N PyTorch steps (same process) and, with --torch-separate, a block of N PyTorch
steps in a worker process that never imports lnjax (so it runs with glibc's default
malloc settings). Every round also samples the float32 matmul peak (JAX, 2048²). Reported:
medians (and minima) of the per-step times over all rounds; the machine is shared, so
medians of interleaved blocks are the figures to trust.

`--steps 2` is the quick self-check (< 60 s): it asserts equal parameter counts, matching
initial losses and finite times, and exits non-zero otherwise.
"""

import os
import sys

import bench_env  # noqa: E402,F401  (first: lnjax on the path, malloc tuned before JAX)

import argparse  # noqa: E402
import datetime  # noqa: E402
import functools  # noqa: E402
import json  # noqa: E402
import platform  # noqa: E402
import re  # noqa: E402
import resource  # noqa: E402
import shlex  # noqa: E402
import subprocess  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402

import jax  # noqa: E402
import numpy as np  # noqa: E402

from lnjax import tasks  # noqa: E402
from lnjax.core import allocator, optim, sharding, state as state_lib, steps
from lnjax.models import ModelConfig, count_params  # noqa: E402

BATCH, SEQ = 32, 128
MODEL = dict(vocab_size=4096, num_layers=8, d_model=128, num_heads=4, d_ff=512, max_len=128)


# ---------------------------------------------------------------------------------------
# FLOPs.

def flops_per_token(num_layers, d_model, d_ff, vocab_size, seq_len, **_) -> dict:
  """Training FLOPs per token: 6·N_matmul + 12·L·T·D (PaLM appendix B convention).

  N_matmul counts the weights of every matmul: per layer Q, K, V, O (4·D²) and the FFN
  (2·D·F), plus the output projection (D·V). Not counted: the input embedding and
  positions (lookups), biases and norm parameters (no matmul). 6 = 2 (multiply-add)
  × 3 (forward, input gradient, weight gradient).
  Attention's QKᵀ and AV are 2·T·D multiply-adds per token per layer forward = 4·T·D
  FLOPs, ×3 for forward + backward = 12·L·T·D. The causal mask is not discounted.
  """
  n_matmul = num_layers * (4 * d_model * d_model + 2 * d_model * d_ff) + d_model * vocab_size
  dense = 6 * n_matmul
  attention = 12 * num_layers * seq_len * d_model
  return {"n_matmul": n_matmul, "dense": dense, "attention": attention,
          "total": dense + attention}


FLOP_FORMULA = (
    "FLOPs/step = tokens × (6·N_matmul + 12·L·T·D), tokens = B·T = 32·128 = 4096;\n"
    "N_matmul = L·(4·D² + 2·D·F) + D·V = 8·(4·128² + 2·128·512) + 128·4096 = 2,097,152\n"
    "  (Q, K, V, O and FFN weights, and the output projection; the input embedding and\n"
    "  positions are lookups and, like biases and norm parameters, are not counted);\n"
    "12·L·T·D = 12·8·128·128 = 1,572,864 (QKᵀ and AV, forward + backward, full T×T: the\n"
    "  causal mask is not discounted);\n"
    "per token 6·2,097,152 + 1,572,864 = 14,155,776; per step × 4096 = 57.98 GFLOP.\n"
    "MFU = FLOPs/step ÷ step time ÷ measured float32 matmul peak (JAX jit, 2048×2048 @ "
    "2048×2048, 2·2048³ FLOPs).")


# ---------------------------------------------------------------------------------------
# Measurements.

def matmul_peak_sample(reps: int = 5, n: int = 2048, dtype: str = "float32") -> list[float]:
  """GFLOP/s of `reps` n×n @ n×n matmuls (float32, or bfloat16 on a GPU) under jax.jit."""
  f = _matmul_fn()
  a, b = _matmul_operands(n, dtype)
  jax.block_until_ready(f(a, b))
  out = []
  for _ in range(reps):
    t0 = time.perf_counter()
    jax.block_until_ready(f(a, b))
    out.append(2 * n**3 / (time.perf_counter() - t0) / 1e9)
  return out


@functools.cache
def _matmul_fn():
  return jax.jit(lambda a, b: a @ b)


@functools.cache
def _matmul_operands(n, dtype="float32"):
  ka, kb = jax.random.split(jax.random.key(1))
  return (jax.random.normal(ka, (n, n), dtype), jax.random.normal(kb, (n, n), dtype))


def maxrss_mib() -> float:
  return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB.


def vmhwm_mib() -> float:
  """This process's own peak RSS (VmHWM): in a worker process, unlike ru_maxrss, which
  Linux carries over fork + exec from the parent."""
  try:
    with open("/proc/self/status") as f:
      for line in f:
        if line.startswith("VmHWM:"):
          return int(line.split()[1]) / 1024
  except OSError:
    pass
  return maxrss_mib()


def flatten(tree, prefix="") -> dict:
  if isinstance(tree, dict):
    out = {}
    for k, v in tree.items():
      out.update(flatten(v, f"{prefix}{k}/"))
    return out
  return {prefix[:-1]: np.asarray(tree)}


class TrainStep:
  """lnjax's train_step for any model config and task, jitted exactly as lnjax.core.train jits
  it, on one CPU device, on a fixed host batch (benchmarks/depth.py and suite.py use it
  for other models and depths)."""

  def __init__(self, cfg: ModelConfig, host_batch: dict, task=tasks.get("lm"),
               keep_initial_params: bool = True, phase=lambda name: None):
    """`phase(name)` is called after "state" (initialized), "compile" (the train step
    lowered and compiled) and "eval" (the eval step compiled and run once)."""
    self.cfg = cfg
    setup = state_lib.make_setup(cfg, optim.OptConfig(name="adam", learning_rate=1e-3),
                                 num_steps=1000, task=task)
    mesh = sharding.make_mesh(sharding.MeshConfig(data=1), jax.devices()[:1])
    self.state = state_lib.init_state(setup, mesh, seed=0)
    self.num_params = count_params(self.state.params)
    phase("state")
    shard = state_lib.state_shardings(setup, mesh)
    batch_shard = sharding.batch_sharding(mesh)
    self.host_batch = host_batch
    self.batch = sharding.global_batch(host_batch, batch_shard)
    self._jit = lambda **step_options: jax.jit(
        functools.partial(steps.train_step, setup=setup, label_smoothing=0.0, seed=0,
                          **step_options),
        in_shardings=(shard, batch_shard), out_shardings=(shard, sharding.replicated(mesh)),
        donate_argnums=0)
    self._activation_step = jax.jit(functools.partial(steps.activation_step, setup=setup,
                                                      seed=0))
    t0 = time.perf_counter()
    lowered = self._jit().lower(self.state, self.batch)
    t1 = time.perf_counter()
    self.compiled = lowered.compile()
    self.variants = {"": self.compiled}
    t2 = time.perf_counter()
    self.lower_s, self.compile_s = t1 - t0, t2 - t1
    phase("compile")
    mem = self.compiled.memory_analysis()
    self.xla_temp_mib = getattr(mem, "temp_size_in_bytes", 0) / 2**20 if mem else None
    self.xla_args_mib = getattr(mem, "argument_size_in_bytes", 0) / 2**20 if mem else None
    # The initial held-out-style loss (no update), for the cross-framework check.
    eval_fn = jax.jit(functools.partial(steps.eval_step, setup=setup))
    nll, count = eval_fn(self.state.params, self.batch)
    self.initial_loss = float(nll) / float(count)
    phase("eval")
    self.initial_params = (flatten(jax.device_get(self.state.params)) if keep_initial_params
                           else None)
    self.loss = None
    self.footprint = allocator.Footprint()  # As the trainer's Memory hook, after each step.

  def add_variant(self, name: str, log_step: bool = False, **step_options) -> None:
    """Compiles the same step with other train_step options (`health=True`, ...), run by
    `run(n, name)` on the same state; `log_step`: with the activation statistics' forward
    pass before it, as a run's log steps take it (lnjax/core/health_hooks.py)."""
    step = self._jit(**step_options).lower(self.state, self.batch).compile()
    if log_step:
      forward = self._activation_step.lower(self.state.params, self.batch,
                                            self.state.step).compile()
      def logged(state, batch, step=step, forward=forward):
        sown = forward(state.params, batch, state.step)
        state, metrics = step(state, batch)
        return state, {**metrics, **sown}
      self.variants[name] = logged
    else:
      self.variants[name] = step

  def run(self, n: int, variant: str = "") -> list[float]:
    times = []
    for _ in range(n):
      t0 = time.perf_counter()
      self.state, metrics = self.variants[variant](self.state, self.batch)
      jax.block_until_ready((self.state, metrics))
      self.footprint.after_step()
      times.append(time.perf_counter() - t0)
    self.loss = float(metrics["train_loss"])
    return times


def lm_batch(vocab_size: int = MODEL["vocab_size"], batch: int = BATCH, seq: int = SEQ) -> dict:
  """Random tokens [B, T + 1] as the LM's inputs and targets (seed 0), every weight 1."""
  rng = np.random.default_rng(0)
  tokens = rng.integers(0, vocab_size, (batch, seq + 1), dtype=np.int32)
  return {"inputs": tokens[:, :-1], "targets": tokens[:, 1:],
          "weights": np.ones((batch, seq), np.float32)}


class LnjaxStep(TrainStep):
  """The benchmark's LM (MODEL) under `norm`, dropout 0."""

  def __init__(self, norm: str, **model_overrides):
    cfg = ModelConfig(**{**MODEL, **model_overrides}, norm_position=norm, dropout_rate=0.0)
    super().__init__(cfg, lm_batch(cfg.vocab_size))


class TorchWorker:
  """benchmarks/torch_peer.py --worker in a subprocess that never imports lnjax or JAX."""

  def __init__(self, norm: str, params: dict, host_batch: dict, tmpdir: str):
    pfile, bfile = os.path.join(tmpdir, "params.npz"), os.path.join(tmpdir, "batch.npz")
    np.savez(pfile, **params)
    np.savez(bfile, inputs=host_batch["inputs"], targets=host_batch["targets"])
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    self.proc = subprocess.Popen(
        [sys.executable, os.path.join(bench_env.HERE, "torch_peer.py"), "--worker", "--norm", norm,
         "--params", pfile, "--batch", bfile],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env, bufsize=1)
    hello = self._hello()
    self.num_params, self.num_threads = hello["num_params"], hello["num_threads"]
    self.loss = None

  def _hello(self) -> dict:
    """The worker's first reply; a worker that dies before it is ended, not left running."""
    try:
      return self._read()
    except Exception:
      self.kill()
      raise

  def _read(self) -> dict:
    line = self.proc.stdout.readline()
    if not line:
      status = self.proc.poll()
      raise RuntimeError("the worker closed its output without answering ("
                         + ("still running" if status is None else f"exit status {status}")
                         + "; its error, if any, is above)")
    return json.loads(line)

  def ask(self, cmd: str) -> dict:
    self.proc.stdin.write(cmd + "\n")
    self.proc.stdin.flush()
    return self._read()

  def run(self, n: int) -> list[float]:
    r = self.ask(f"run {n}")
    self.loss = r["loss"]
    return r["times"]

  def close(self):
    try:
      self.proc.stdin.write("quit\n")
      self.proc.stdin.close()
    except OSError:
      pass
    try:
      self.proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
      self.kill()

  def kill(self):
    """Ends the worker now, whatever it is doing (a failed start, a hung exit)."""
    self.proc.kill()
    self.proc.wait()


class TorchInProcess:

  def __init__(self, norm: str, params: dict, host_batch: dict):
    import torch  # noqa: PLC0415  Only now, so lnjax's figures are taken before torch loads.
    import torch_peer  # noqa: PLC0415
    self.torch, self.peer = torch, torch_peer
    torch.set_num_threads(os.cpu_count())
    torch.manual_seed(0)
    model = torch_peer.TorchLM(norm_position=norm, **MODEL)
    torch_peer.load_lnjax_params(model, params)
    self.trainer = torch_peer.Trainer(model)
    self.num_params = torch_peer.count_params(model)
    self.num_threads = torch.get_num_threads()
    self.inputs = torch.from_numpy(host_batch["inputs"].astype(np.int64))
    self.targets = torch.from_numpy(host_batch["targets"].astype(np.int64))
    self.initial_loss = self.trainer.loss(self.inputs, self.targets)
    self.loss = None

  def run(self, n: int) -> list[float]:
    times, self.loss = self.trainer.run(self.inputs, self.targets, n)
    return times


# ---------------------------------------------------------------------------------------
# Report.

def machine_info() -> dict:
  model_name = platform.processor() or "?"
  try:
    out = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10).stdout
    m = re.search(r"^Model name:\s*(.+)$", out, re.M)
    model_name = m.group(1).strip() if m else model_name
  except (OSError, subprocess.SubprocessError):
    pass
  import flax, jaxlib, optax  # noqa: E401, PLC0415
  versions = {"python": platform.python_version(), "jax": jax.__version__,
              "jaxlib": jaxlib.__version__, "flax": flax.__version__, "optax": optax.__version__,
              "numpy": np.__version__}
  try:
    from importlib.metadata import version  # noqa: PLC0415
    versions["torch"] = version("torch")
  except Exception:  # noqa: BLE001
    versions["torch"] = "?"
  return {"cpu": model_name, "cores": os.cpu_count(), "versions": versions,
          "date": datetime.date.today().isoformat()}


def machine_line(mi: dict, accelerator: str = "no GPU") -> str:
  """The "Machine: …" line every section a benchmark writes into BENCHMARKS.md carries:
  CPU, cores, accelerator and the versions of what was timed (`mi` from machine_info)."""
  versions = ", ".join(f"{'Python' if name == 'python' else name} {mi['versions'][name]}"
                       for name in ("python", "jax", "jaxlib", "flax", "optax", "torch", "numpy"))
  return f"Machine: {mi['cpu']}, {mi['cores']} cores, {accelerator}. Versions: {versions}."


def section_text(tag: str, writer: str, title: str, mi: dict, command: str,
                 body: list[str], accelerator: str = "no GPU") -> str:
  """A BENCHMARKS.md section as every benchmark writes it (update_section's markers, which
  name `writer`, the script that wrote it): the dated title, the machine, the command,
  then `body`."""
  return "\n".join([f"<!-- {tag}:begin (written by {writer}) -->",
                    f"### {title} ({mi['date']})", "", machine_line(mi, accelerator), "",
                    f"Command: `{command}`", "", *body, f"<!-- {tag}:end -->"])


def stats(times: list[float]) -> dict:
  a = np.asarray(times) * 1e3
  return {"median_ms": float(np.median(a)), "min_ms": float(a.min()),
          "p25_ms": float(np.percentile(a, 25)), "p75_ms": float(np.percentile(a, 75)),
          "n": int(a.size)}


def render(res: dict) -> str:
  f = res["flops"]
  peak = res["peak_gflops"]
  rows = [("lnjax (JAX jit)", "lnjax"), ("PyTorch eager, same process¹", "torch")]
  if "torch_separate" in res["impls"]:
    rows.append(("PyTorch eager, separate process²", "torch_separate"))
  lines = [
      "| implementation | step ms (median) | step ms (min) | IQR ms | tokens/s | MFU | "
      "lnjax / this |",
      "|---|---:|---:|---:|---:|---:|---:|"]
  ln = res["impls"]["lnjax"]["median_ms"]
  for label, key in rows:
    s = res["impls"][key]
    tps = BATCH * SEQ / (s["median_ms"] / 1e3)
    mfu = f["total"] * BATCH * SEQ / (s["median_ms"] / 1e3) / (peak * 1e9)
    lines.append(f"| {label} | {s['median_ms']:.1f} | {s['min_ms']:.1f} | "
                 f"{s['p25_ms']:.0f}–{s['p75_ms']:.0f} | {tps:,.0f} | {100 * mfu:.1f}% | "
                 f"{ln / s['median_ms']:.2f} |")
  m = res["memory"]
  notes = [
      "",
      f"- Model: {res['norm']}-LN, {res['num_params']:,} parameters in both frameworks; batch "
      f"{BATCH} × seq {SEQ} = {BATCH * SEQ} tokens/step; {res['rounds']} rounds × "
      f"{res['steps']} steps per implementation, interleaved, after {res['warmup']} warm-up "
      "steps each.",
      f"- float32 matmul peak (JAX jit, 2048², median of {res['peak_samples']} samples taken "
      f"across the rounds): **{peak:.0f} GFLOP/s**; torch.mm 2048² for context: "
      f"{res['torch_mm_gflops']:.0f} GFLOP/s.",
      f"- FLOPs/step: {f['total'] * BATCH * SEQ / 1e9:.2f} GFLOP "
      f"(6·N_matmul = {f['dense']:,} + 12·L·T·D = {f['attention']:,} per token).",
      f"- lnjax / PyTorch (same process): {res['ratio']:.2f} (ratio of medians); paired "
      f"per-round ratio median {res['paired_ratio']:.2f}.",
      f"- lnjax compile: lower {res['lower_s']:.2f} s + XLA compile {res['compile_s']:.2f} s.",
      f"- Memory (peak RSS = getrusage ru_maxrss, process-wide): after lnjax's compile "
      f"{m['rss_compiled_mib']:.0f} MiB, after its warm-up steps (before torch was "
      f"imported) {m['rss_lnjax_mib']:.0f} MiB; at the end (lnjax + PyTorch in one process) "
      f"{m['rss_end_mib']:.0f} MiB"
      + (f"; PyTorch worker process {m['rss_torch_worker_mib']:.0f} MiB"
         if "rss_torch_worker_mib" in m else "")
      + f". XLA buffer assignment: {m['xla_temp_mib']:.0f} MiB temp + "
      f"{m['xla_args_mib']:.0f} MiB arguments (donated). JAX device memory_stats on CPU: "
      f"{m['jax_memory_stats']}.",
      f"- Final train loss after {res['total_steps']} identical steps: lnjax "
      f"{res['final_loss']['lnjax']:.4f}, PyTorch {res['final_loss']['torch']:.4f}"
      + (f", PyTorch worker {res['final_loss']['torch_separate']:.4f}"
         if "torch_separate" in res["final_loss"] else "")
      + f" (initial {res['initial_loss']['lnjax']:.4f} / {res['initial_loss']['torch']:.4f}).",
      f"- Load average (1 min) at start / end: {res['loadavg'][0]:.2f} / "
      f"{res['loadavg'][1]:.2f} on {res['machine']['cores']} cores.",
      "",
      f"¹ Same process as lnjax, so lnjax's glibc malloc settings (lnjax/core/allocator.py: one "
      f"arena, no mmap, raised trim threshold; in effect: {res['malloc_fix']}) apply to "
      f"PyTorch too. torch threads: {res['torch_threads']}. MFU of every row is against the "
      "JAX-measured peak.",
  ]
  if "torch_separate" in res["impls"]:
    notes.append("² A worker process that imports neither lnjax nor JAX: glibc's default "
                 "malloc settings (MALLOC_* variables removed from its environment).")
  return "\n".join(lines + notes)


def section(res: dict, command: str) -> str:
  return section_text(section_tag(res), "benchmarks/lm_step.py",
                      f"Train step, {res['norm']}-LN{_variant(res)}", res["machine"], command,
                      [render(res), "", "FLOP formula:", "", "```", FLOP_FORMULA, "```"])


def section_tag(res: dict) -> str:
  """lm_step:<norm>, with :<weight_grad> for a non-default weight gradient."""
  return f"lm_step:{res['norm']}" + _variant(res).replace(", weight gradient ", ":")


def _variant(res: dict) -> str:
  wg = res.get("weight_grad", "autodiff")
  return "" if wg == "autodiff" else f", weight gradient {wg}"


def command_line(script: str, argv) -> str:
  """The command that ran `benchmarks/{script}`, quoted, as the sections record it."""
  args = argv if argv is not None else sys.argv[1:]
  return f"python benchmarks/{script} " + " ".join(shlex.quote(a) for a in args)


def choices(flag: str, value: str, allowed) -> list[str]:
  """A comma-separated flag value, each item one of `allowed` (else exit naming them)."""
  items = value.split(",")
  for item in items:
    if item not in allowed:
      raise SystemExit(f"{flag}: {item!r} is not one of {', '.join(allowed)}")
  return items


def update_section(path: str, text: str, tag: str) -> None:
  """Replaces the `<!-- {tag}:begin ... -->` ... `<!-- {tag}:end -->` section of `path` by
  `text` (which carries the same markers), or appends it."""
  begin = f"<!-- {tag}:begin"
  end = f"<!-- {tag}:end -->"
  old = open(path).read() if os.path.exists(path) else "# Benchmarks\n"
  i, j = old.find(begin), old.find(end)
  if i >= 0 and j > i:
    new = old[:i] + text + old[j + len(end):]
  else:
    new = old.rstrip("\n") + "\n\n" + text + "\n"
  with open(path, "w") as f:
    f.write(new)


# ---------------------------------------------------------------------------------------

def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--steps", type=int, default=5, help="steps per block (2 = quick self-check)")
  p.add_argument("--rounds", type=int, default=5, help="interleaved rounds")
  p.add_argument("--warmup", type=int, default=None,
                 help="warm-up steps per implementation (default 5; 2 with --steps <= 2)")
  p.add_argument("--norm", choices=("pre", "post"), default="pre")
  p.add_argument("--weight-grad", choices=("autodiff", "transposed"), default="autodiff",
                 help="lnjax's model.weight_grad (transposed: dW from a materialized xᵀ); "
                 "a non-default value writes its own section")
  p.add_argument("--torch-separate", action="store_true",
                 help="also time PyTorch in a worker process without lnjax imported")
  p.add_argument("--out", help="Markdown file whose lm_step section is added or replaced")
  p.add_argument("--json", help="write the raw results here")
  args = p.parse_args(argv)
  quick = args.steps <= 2
  warmup = args.warmup if args.warmup is not None else (2 if quick else 5)
  command = command_line("lm_step.py", argv)
  load0 = os.getloadavg()[0]
  t_start = time.perf_counter()

  # lnjax: build, compile, warm up; its memory figures before torch exists.
  ln = LnjaxStep(args.norm, weight_grad=args.weight_grad)
  rss_compiled = maxrss_mib()
  peaks = matmul_peak_sample()
  ln.run(warmup)
  rss_lnjax = maxrss_mib()
  try:
    jax_mem = jax.devices()[0].memory_stats()
  except Exception:  # noqa: BLE001
    jax_mem = None
  jax_mem = ("n/a (None)" if not jax_mem else
             f"peak {jax_mem.get('peak_bytes_in_use', 0) / 2**20:.0f} MiB")

  impls = {"lnjax": ln, "torch": TorchInProcess(args.norm, ln.initial_params, ln.host_batch)}
  tmp = None
  if args.torch_separate:
    tmp = tempfile.TemporaryDirectory(prefix="lm_step_")
    impls["torch_separate"] = TorchWorker(args.norm, ln.initial_params, ln.host_batch, tmp.name)
  torch_mm = impls["torch"].peer.matmul_gflops()

  failures = []
  for name, impl in impls.items():
    if impl.num_params != ln.num_params:
      failures.append(f"{name} has {impl.num_params:,} parameters, lnjax {ln.num_params:,}")
  if abs(impls["torch"].initial_loss - ln.initial_loss) > 1e-3 * abs(ln.initial_loss):
    failures.append(f"initial loss differs: lnjax {ln.initial_loss:.6f}, "
                    f"torch {impls['torch'].initial_loss:.6f}")
  if "torch_separate" in impls:
    w_loss = impls["torch_separate"].ask("loss")["loss"]
    if abs(w_loss - ln.initial_loss) > 1e-3 * abs(ln.initial_loss):
      failures.append(f"initial loss differs: lnjax {ln.initial_loss:.6f}, worker {w_loss:.6f}")
  if failures:
    for f in failures:
      print("FAIL:", f, file=sys.stderr)
    return 1

  for name, impl in impls.items():
    if name != "lnjax":
      impl.run(warmup)

  times = {name: [] for name in impls}
  block_medians = {name: [] for name in impls}
  for r in range(args.rounds):
    round_peaks = matmul_peak_sample(reps=3)
    peaks += round_peaks
    for name, impl in impls.items():
      t = impl.run(args.steps)
      times[name] += t
      block_medians[name].append(float(np.median(t)))
    print(f"round {r + 1}/{args.rounds} (load {os.getloadavg()[0]:.1f}, matmul "
          f"{np.median(round_peaks):.0f} GFLOP/s): " + ", ".join(
        f"{name} {1e3 * block_medians[name][-1]:.0f} ms" for name in impls), flush=True)

  memory = {"rss_compiled_mib": rss_compiled, "rss_lnjax_mib": rss_lnjax, "rss_end_mib": maxrss_mib(),
            "xla_temp_mib": ln.xla_temp_mib, "xla_args_mib": ln.xla_args_mib,
            "jax_memory_stats": jax_mem}
  if "torch_separate" in impls:
    memory["rss_torch_worker_mib"] = impls["torch_separate"].ask("rss")["maxrss_kib"] / 1024
    impls["torch_separate"].close()
    tmp.cleanup()

  res = {
      "norm": args.norm, "weight_grad": args.weight_grad, "steps": args.steps, "rounds": args.rounds, "warmup": warmup,
      "total_steps": warmup + args.rounds * args.steps,
      "num_params": ln.num_params, "flops": flops_per_token(**MODEL, seq_len=SEQ),
      "impls": {name: stats(t) for name, t in times.items()},
      "times_ms": {name: [round(1e3 * x, 2) for x in t] for name, t in times.items()},
      "peak_gflops": float(np.median(peaks)), "peak_samples": len(peaks),
      "torch_mm_gflops": torch_mm,
      "ratio": float(np.median(times["lnjax"]) / np.median(times["torch"])),
      "paired_ratio": float(np.median(np.asarray(block_medians["lnjax"]) /
                                      np.asarray(block_medians["torch"]))),
      "lower_s": ln.lower_s, "compile_s": ln.compile_s, "memory": memory,
      "initial_loss": {"lnjax": ln.initial_loss, "torch": impls["torch"].initial_loss},
      "final_loss": {name: impl.loss for name, impl in impls.items()},
      "loadavg": (load0, os.getloadavg()[0]), "machine": machine_info(),
      "malloc_fix": allocator._applied, "torch_threads": impls["torch"].num_threads,
      "wall_s": time.perf_counter() - t_start,
  }
  for name, s in res["impls"].items():
    if not (np.isfinite(s["median_ms"]) and s["median_ms"] > 0):
      failures.append(f"{name}: bad step time {s['median_ms']}")
  for name, loss in res["final_loss"].items():
    if loss is None or not np.isfinite(loss):
      failures.append(f"{name}: non-finite final loss {loss}")

  print()
  print(render(res))
  print()
  print("FLOP formula:\n" + FLOP_FORMULA)
  print(f"\nwall time {res['wall_s']:.1f} s")
  if args.out:
    update_section(args.out, section(res, command), section_tag(res))
    print(f"updated {args.out}")
  if args.json:
    with open(args.json, "w") as f:
      json.dump(res, f, indent=2, default=str)
  for f in failures:
    print("FAIL:", f, file=sys.stderr)
  return 1 if failures else 0


if __name__ == "__main__":
  sys.exit(main())
