"""The Python half of benchmarks/gpu_check.sh: attention kernels checked against each
other and timed, and a 300-step IWSLT-size encoder-decoder run with cuDNN flash attention.

  python benchmarks/gpu_check.py --out BENCHMARKS.md   # on a GPU: its gpu_check section
  python benchmarks/gpu_check.py --quick               # CPU-size self-check; writes nothing
  python benchmarks/gpu_check.py --dry_run             # the GPU path at tiny sizes, anywhere
  python benchmarks/gpu_check.py --parts run --out BENCHMARKS.md   # 2. alone

1. Attention kernels (`model.attention_impl`): the loss and parameter gradients of the
   IWSLT-size encoder-decoder (6+6 layers, D 512, 4 heads of 128, F 1024, V 10000; a
   64 × 64-token batch, sources padded to random lengths) with lnjax's own attention
   (plain), jax.nn.dot_product_attention's XLA implementation (xla) and cuDNN's flash
   attention (cudnn, bf16 on NVIDIA GPUs only), each against plain in the same dtype, and
   the time of one jitted forward and backward pass. A difference above the tolerance
   fails the check (exit 1); a kernel JAX does not offer here is reported as such.
2. The run: `python -m lnjax.main` on configs/iwslt14_de_en.py:norm=pre for 300 steps in
   bf16 with the fastest kernel that passed 1 (cudnn where offered), no BLEU decoding;
   on Multi30k with the same model when the IWSLT14 training set is not prepared here,
   and on the Multi30k excerpt of tests/fixtures/corpora (2,000 pairs) when Multi30k
   cannot be downloaded either (a lent GPU machine has no network).
   Reported: losses, held-out loss, tokens/s after compilation, wall time.
--quick: a small model (2+2 layers, D 128) in float32 and bf16, plain against xla, and
the LM smoke run (20 steps) through lnjax.main with model.attention_impl=xla.
--dry_run: the GPU path itself (the IWSLT model's structure, every kernel, both dtypes,
the run with its data fallbacks) at suite.py's --dry_run sizes and 2 steps; writes
nothing. tests/test_gpu_check.py runs it on the CPU (cudnn then reported as not offered).
"""

import os
import sys

import bench_env  # noqa: E402  (first: lnjax on the path, malloc tuned before JAX)

bench_env.share_the_gpu()  # The attention check here, then a training run beside it.

import argparse  # noqa: E402
import dataclasses  # noqa: E402
import json  # noqa: E402
import re  # noqa: E402
import subprocess  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402

import flax.linen as nn  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402

import lm_step  # noqa: E402
import plan_peak  # noqa: E402
import suite  # noqa: E402
from lnjax.models import EncoderDecoder, ModelConfig  # noqa: E402

TAG, RUN_TAG = "gpu_check", "gpu_check_run"  # Its sections of BENCHMARKS.md, and the
PLAN_TAG = "gpu_check_plan"  # plan beside the measured peak (benchmarks/plan_peak.py).
# Largest allowed difference from the plain kernel in the same dtype: relative loss
# difference and relative L2 norm of the gradients' difference.
TOLERANCE = {"float32": (1e-5, 1e-4), "bfloat16": (1e-2, 5e-2)}
RUN_STEPS, QUICK_STEPS, DRY_STEPS = 300, 20, 2
RUN_TIMEOUT_S = 300  # The most one `python -m lnjax.main` run is given.


# ---------------------------------------------------------------------------------------
# 1. Attention kernels.

def _batch(vocab: int, b: int, t: int) -> dict:
  """Random tokens in [1, V); each source padded after a random length in [t/2, t]."""
  rng = np.random.default_rng(0)
  src_BxS = rng.integers(1, vocab, (b, t), dtype=np.int32)
  src_BxS[np.arange(t)[None, :] >= rng.integers(t // 2, t + 1, (b, 1))] = 0
  tgt_BxT1 = rng.integers(1, vocab, (b, t + 1), dtype=np.int32)
  return {"src": src_BxS, "tgt_in": tgt_BxT1[:, :-1], "tgt_out": tgt_BxT1[:, 1:]}


def _loss_fn(cfg: ModelConfig, batch: dict):
  model = EncoderDecoder(cfg)

  def loss(params):
    logits_BxTxV = model.apply({"params": params}, batch["src"], batch["tgt_in"])
    return optax.softmax_cross_entropy_with_integer_labels(
        logits_BxTxV.astype(jnp.float32), batch["tgt_out"]).mean()
  return loss


def check_attention(cfg: ModelConfig, batch: dict, dtypes, impls, reps: int,
                    deadline: float = float("inf")) -> list[dict]:
  """One row per (dtype, kernel): loss, differences from plain, fwd+bwd time. A kernel
  not begun by `deadline` (time.perf_counter()'s clock) is reported as not measured: on
  the first GPU machine one first call took 197 s of compilation."""
  params = nn.unbox(EncoderDecoder(cfg).init(jax.random.key(0), batch["src"][:1],
                                             batch["tgt_in"][:1])["params"])
  rows = []
  for dtype in dtypes:
    reference = None
    for impl in impls:
      row = {"dtype": dtype, "impl": impl}
      rows.append(row)
      if time.perf_counter() > deadline:
        row["error"] = "not measured: the check's time budget was spent"
        print(f"gpu_check: {dtype} {impl}: {row['error']}", flush=True)
        continue
      # float32 rows in full float32 (a GPU's default is TF32 matmuls).
      precision = "highest" if dtype == "float32" else "default"
      t_first = time.perf_counter()
      try:
        c = dataclasses.replace(cfg, dtype=dtype, attention_impl=impl)
        step = jax.jit(jax.value_and_grad(_loss_fn(c, batch)))
        with jax.default_matmul_precision(precision):
          loss, grads = jax.block_until_ready(step(params))
      except Exception as e:  # noqa: BLE001  A kernel JAX does not offer for this device.
        row["error"] = str(e).strip().splitlines()[0][:160] if str(e).strip() else repr(e)
        print(f"gpu_check: {dtype} {impl}: {row['error']}", flush=True)
        continue
      first_s = time.perf_counter() - t_first
      times = []
      with jax.default_matmul_precision(precision):
        for _ in range(reps):
          t0 = time.perf_counter()
          jax.block_until_ready(step(params))
          times.append(time.perf_counter() - t0)
      leaves = jax.tree_util.tree_leaves_with_path(jax.device_get(grads))
      row.update(loss=float(loss), ms=1e3 * float(np.median(times)),
                 grads={jax.tree_util.keystr(k, simple=True, separator="/"): np.ravel(x)
                        for k, x in leaves})
      print(f"gpu_check: {dtype} {impl}: first call {first_s:.1f} s (compilation included), "
            f"then {row['ms']:.2f} ms", flush=True)  # Progress: the check's longest phase.
      if reference is None:
        reference = row
      row["loss_diff"] = abs(row["loss"] - reference["loss"]) / abs(reference["loss"])
      row.update(_grad_diff(row["grads"], reference["grads"]))
      row["ok"] = (row["loss_diff"] <= TOLERANCE[dtype][0]
                   and row["grad_diff"] <= TOLERANCE[dtype][1] and np.isfinite(row["loss"]))
  for row in rows:
    row.pop("grads", None)
  return rows


def _grad_diff(grads: dict, reference: dict) -> dict:
  """The relative L2 difference of all gradients, and the parameter that holds the largest
  share of its square (where a kernel's gap is, for the next reading)."""
  sq = {name: float(np.sum((g - reference[name]) ** 2)) for name, g in grads.items()}
  gap = sum(sq.values())
  total = max(sum(float(np.sum(r ** 2)) for r in reference.values()), 1e-300)
  worst = max(sq, key=sq.get)
  return {"grad_diff": float(np.sqrt(gap / total)), "worst_param": worst,
          "worst_share": sq[worst] / max(gap, 1e-300)}


def _failure(r: dict) -> str:
  """A failed row's check; where its gradients differ, the parameter holding most of it (a
  row failed on its loss alone, the reference's included, has no gap to place)."""
  return (f"FAILED ({r['worst_share']:.0%} of the gradient gap in "
          f"`{r['worst_param']}`)" if r.get("worst_share") else "FAILED")


def render_attention(rows: list[dict]) -> str:
  lines = ["| dtype | kernel | loss | Δ loss vs plain (rel.) | Δ gradients vs plain (rel. L2) "
           "| fwd+bwd ms | speed-up vs plain | check |",
           "|---|---|---:|---:|---:|---:|---:|---|"]
  plain = {r["dtype"]: r for r in rows if r["impl"] == "plain" and "error" not in r}
  for r in rows:
    if "error" in r:
      lines.append(f"| {r['dtype']} | {r['impl']} | — | — | — | — | — | not offered: "
                   f"{r['error'].replace('|', '/')} |")
      continue
    base = plain.get(r["dtype"])
    speed = f"{base['ms'] / r['ms']:.2f}×" if base else "—"
    lines.append(f"| {r['dtype']} | {r['impl']} | {r['loss']:.5f} | {r['loss_diff']:.1e} | "
                 f"{r['grad_diff']:.1e} | {r['ms']:.1f} | {speed} | "
                 f"{'passed' if r['ok'] else _failure(r)} |")
  return "\n".join(lines)


# ---------------------------------------------------------------------------------------
# 2. The run.

_STEP_LINE = re.compile(r"^step\s+(\d+)/\d+\s+loss\s+(\S+).*?(\d+) tok/s", re.M)


def train_run(config: str, steps: int, workdir: str, log_every: int, flags=(),
              timeout_s: int = RUN_TIMEOUT_S) -> dict:
  """`python -m lnjax.main` for `steps` steps (killed after `timeout_s`); its summary,
  step lines and wall time."""
  cmd = [sys.executable, "-m", "lnjax.main", f"--config={config}", f"--workdir={workdir}",
         f"--config.train.num_steps={steps}", f"--config.train.log_every_steps={log_every}",
         f"--config.train.eval_every_steps={steps}",
         f"--config.train.checkpoint_every_steps={steps}", *flags]
  t0 = time.perf_counter()
  try:
    proc = subprocess.run(cmd, cwd=bench_env.REPO, capture_output=True, text=True, timeout=timeout_s)
    out, returncode = proc.stdout + proc.stderr, proc.returncode
  except subprocess.TimeoutExpired as e:  # Killed: the check's time budget is spent.
    text = lambda b: b.decode(errors="replace") if isinstance(b, bytes) else (b or "")
    out, returncode = text(e.stdout) + text(e.stderr) + f"\ntimed out after {timeout_s} s", 124
  wall = time.perf_counter() - t0
  summary = _read_json(os.path.join(workdir, "summary.json"))
  lines = [(int(s), float(l), int(t)) for s, l, t in _STEP_LINE.findall(out)]
  return {"command": "python " + " ".join(cmd[1:]), "returncode": returncode, "output": out,
          "summary": summary, "lines": lines, "wall_s": wall}


def _read_json(path: str) -> dict:
  try:
    with open(path) as f:
      return json.load(f)
  except (OSError, ValueError):
    return {}


FIXTURE_CORPORA = os.path.join(bench_env.REPO, "tests", "fixtures", "corpora")
EXCERPT_VOCAB = 4000  # SentencePiece finds at most ~5,000 pieces in the excerpt.


def run_on_iwslt_or_multi30k(impl: str, steps: int, log_every: int, dry: bool = False,
                             deadline: float = float("inf")) -> dict:
  """The IWSLT14 run; on Multi30k with the IWSLT model when IWSLT14's training set is
  not prepared here (the first run then stops at its data check, in seconds), and on
  the repository's Multi30k excerpt when Multi30k is not downloaded and cannot be.
  Each try is killed at `deadline` (time.perf_counter()'s clock)."""
  left = lambda: int(max(10, min(RUN_TIMEOUT_S, deadline - time.perf_counter())))
  flags = ["--config.model.dtype=bfloat16", f"--config.model.attention_impl={impl}",
           "--config.decode.bleu_in_training=False"]
  iwslt_model = ["--config.model.num_layers=6", "--config.model.d_model=512",
                 "--config.model.num_heads=4", "--config.model.d_ff=1024"]
  if dry:  # suite.py's --dry_run sizes, after (so instead of) the IWSLT model's.
    flags += [f"--config.model.{k}={v}" for k, v in suite.DRY_MODEL.items() if k != "vocab_size"]
  reason = lambda r: (r["output"].strip().splitlines() or ["?"])[-1].split(";")[0][:100]
  with tempfile.TemporaryDirectory(prefix="gpu_check_") as tmp:
    r = train_run("configs/iwslt14_de_en.py:norm=pre", steps, os.path.join(tmp, "iwslt"),
                  log_every, flags, left())
    r["data"] = "IWSLT14 de→en"
    if r["returncode"] and not r["lines"]:
      why = f"IWSLT14 not prepared here: {reason(r)}"
      r = train_run("configs/multi30k_de_en.py:norm=pre", steps, os.path.join(tmp, "m30k"),
                    log_every, iwslt_model + flags, left())
      r["data"] = f"Multi30k de→en ({why})"
    if r["returncode"] and not r["lines"]:
      why += f"; Multi30k not here: {reason(r)}"
      r = train_run("configs/multi30k_de_en.py:norm=pre", steps, os.path.join(tmp, "excerpt"),
                    log_every, iwslt_model + flags
                    + [f"--config.data.data_dir={FIXTURE_CORPORA}",
                       f"--config.data.vocab_size={EXCERPT_VOCAB}"], left())
      r["data"] = (f"Multi30k's first 2,000 pairs, tests/fixtures/corpora, vocabulary "
                   f"{EXCERPT_VOCAB:,} ({why})")
  return r


def render_run(r: dict, impl: str) -> str:
  s, lines = r["summary"], r["lines"]
  timed = [t for step, _, t in lines if step > lines[0][0]] if lines else []
  tok_s = f"{np.median(timed):,.0f}" if timed else "—"
  first = f"{lines[0][1]:.3f} (step {lines[0][0]})" if lines else "—"
  fmt = lambda v: "—" if v is None else f"{v:.3f}"
  return "\n".join([
      "| data | steps | attention | status | first logged loss | last train loss | "
      "held-out loss | tokens/s (median of the logged windows after the first) | wall s |",
      "|---|---:|---|---|---:|---:|---:|---:|---:|",
      f"| {r['data']} | {s.get('step', '—')} | {impl} | "
      f"{'timed out' if r['returncode'] == 124 else s.get('status', 'exit ' + str(r['returncode']))} "
      f"| {first} | {fmt(s.get('last_finite_train_loss'))} | {fmt(s.get('eval_loss'))} | "
      f"{tok_s} | {r['wall_s']:.0f} |"])


# ---------------------------------------------------------------------------------------

def _section(tag: str, title: str, command: str, body: list[str]) -> str:
  """A BENCHMARKS.md section: the machine, the command, then `body`; the page names paths
  in the repository, not on the machine that measured."""
  mi = lm_step.machine_info()
  flags = os.environ.get("XLA_FLAGS")
  text = lm_step.section_text(
      tag, "benchmarks/gpu_check.sh", title, mi, command,
      ([f"With XLA_FLAGS=`{flags}`.", ""] if flags else []) + body,
      f"{jax.device_count()} × {jax.devices()[0].device_kind}")
  return re.sub(r"--workdir=[^\s`]+", "--workdir=DIR", text.replace(bench_env.REPO + os.sep, ""))


def _stage_table(stages: list) -> list[str]:
  """Rows [name, seconds, note?] as a Markdown table."""
  return ["| stage | seconds | note |", "|---|---:|---|", *[
      f"| {s[0]} | {float(s[1]):.0f} | {s[2] if len(s) > 2 else ''} |" for s in stages]]


def _kernel_check(quick: bool, dry_run: bool) -> tuple:
  """check_attention's model, batch, dtypes, kernels and repetitions for each mode."""
  if quick:
    cfg = ModelConfig(vocab_size=1000, num_layers=2, d_model=128, num_heads=4, d_ff=256,
                      max_len=64, dropout_rate=0.0)
    return cfg, _batch(1000, 8, 64), ("float32", "bfloat16"), ("plain", "xla"), 3
  if dry_run:
    cfg = suite.model_config("mt_iwslt", "pre", dry=True)
    return cfg, _batch(cfg.vocab_size, 4, 16), ("bfloat16", "float32"), ("plain", "xla", "cudnn"), 1
  cfg = dataclasses.replace(suite.model_config("mt_iwslt", "pre"), max_len=64)
  # bf16 first: cudnn, the kernel only a GPU offers, is measured before the budget runs low.
  return cfg, _batch(cfg.vocab_size, 64, 64), ("bfloat16", "float32"), ("plain", "xla", "cudnn"), 10


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--quick", action="store_true", help="CPU-size self-check; writes nothing")
  p.add_argument("--dry_run", action="store_true",
                 help="the GPU path at tiny sizes (suite.py's --dry_run), 2 steps; writes nothing")
  p.add_argument("--parts", default="kernels,run,plan",
                 help="kernels (the attention check), run (the 300-step run), plan (the "
                      "compiled plan's predicted memory beside the measured peak: "
                      "benchmarks/plan_peak.py), comma-separated; each writes its own "
                      "section of --out")
  p.add_argument("--out", help="Markdown file whose gpu_check sections are added or replaced")
  p.add_argument("--budget_s", type=float, default=240,
                 help="seconds for the whole script: the run is killed when they are spent "
                      "and the tables are written with what it logged")
  p.add_argument("--stages", default="",
                 help="gpu_check.sh's earlier stages as NAME=SECONDS[=NOTE],... for the table")
  args = p.parse_args(argv)
  parts = set(args.parts.split(","))
  if not parts or parts - {"kernels", "run", "plan"}:
    p.error(f"--parts: some of kernels, run, plan, not {args.parts!r}")
  write = args.out and jax.default_backend() == "gpu" and not (args.quick or args.dry_run)
  earlier = [s.split("=", 2) for s in args.stages.split(",") if s]  # gpu_check.sh's stages.
  chosen = os.environ.get("GPU_CHECK_STAGES")
  command = (f"GPU_CHECK_STAGES={chosen} " if chosen else "") + "bash benchmarks/gpu_check.sh"
  t0 = time.perf_counter()
  failed = []
  # Without the check, the run uses cudnn on a GPU (it passed there in bf16, 2026-12-04).
  impl = "cudnn" if jax.default_backend() == "gpu" else "xla"
  if "kernels" in parts:
    # Kernels begin within the first 60% of the budget (all of it without the run).
    share = 0.6 if "run" in parts else 1.0
    rows = check_attention(*_kernel_check(args.quick, args.dry_run),
                           deadline=t0 + share * args.budget_s)
    # cudnn in float32 is refused by ModelConfig (bf16 only): not a row worth a line.
    rows = [r for r in rows if not (r["impl"] == "cudnn" and r["dtype"] == "float32")]
    attention_table = render_attention(rows)
    print(attention_table, flush=True)
    failed += [r for r in rows if "error" not in r and not r["ok"]]
    offered = [r for r in rows if r["dtype"] == "bfloat16" and r.get("ok")]
    impl = "cudnn" if any(r["impl"] == "cudnn" for r in offered) else "xla"
    attention_s = time.perf_counter() - t0
    if write:
      lm_step.update_section(args.out, _section(TAG, "GPU check", command, [
          *_stage_table(earlier + [["attention kernels", attention_s]]), "",
          "Attention kernels on the IWSLT-size encoder-decoder (batch 64 × 64, padded "
          "sources; one jitted forward and backward pass, median of 10):",
          "", attention_table, "",
          f"- Tolerances against plain: float32 {TOLERANCE['float32']}, bf16 "
          f"{TOLERANCE['bfloat16']} (relative loss, relative gradient L2)."]), TAG)
      print(f"updated {args.out} ({TAG})")

  if "run" in parts:
    if args.quick:
      with tempfile.TemporaryDirectory(prefix="gpu_check_") as tmp:  # The option's path.
        r = train_run("configs/lm.py:smoke", QUICK_STEPS, os.path.join(tmp, "smoke"), 5,
                      ["--config.model.attention_impl=xla"])
      r["data"] = "tiny_shakespeare, LM smoke model"
      impl = "xla"  # The smoke model is float32: no cudnn.
    else:
      r = run_on_iwslt_or_multi30k(impl, DRY_STEPS if args.dry_run else RUN_STEPS,
                                   1 if args.dry_run else 25, args.dry_run,
                                   deadline=t0 + args.budget_s)
    run_table = render_run(r, impl)
    print(run_table, flush=True)
    if r["returncode"] or r["summary"].get("status") != "completed":
      print(r["output"][-3000:], file=sys.stderr)
      failed.append({"run": r["returncode"]})
    if write:
      # The earlier stages go into the first section this call writes.
      stages = ([] if "kernels" in parts else earlier) + [["300-step run", r["wall_s"]]]
      lm_step.update_section(args.out, _section(
          RUN_TAG, "GPU training run", command, [
              *_stage_table(stages), "",
              "The run (`python -m lnjax.main`, bf16 compute, float32 parameters and Adam):",
              "", run_table, "", f"- Command: `{r['command']}`."]), RUN_TAG)
      print(f"updated {args.out} ({RUN_TAG})")
  if "plan" in parts:
    t_plan = time.perf_counter()
    r = plan_peak.check(args.dry_run)
    plan_table = plan_peak.render(r)
    print(plan_table, flush=True)
    if not np.isfinite(r["loss"]):
      failed.append({"plan": r["loss"]})
    if write:
      lm_step.update_section(args.out, _section(PLAN_TAG, "GPU plan against the measured peak",
          command, [*_stage_table([["plan vs peak", time.perf_counter() - t_plan]]), "",
                    "The IWSLT-size encoder-decoder's train step (bf16 compute), compiled "
                    "by lnjax/core/plan.py for the GPUs attached (XLA's memory analysis: "
                    "arguments + outputs - donated + temporaries + program, per device), "
                    f"then {plan_peak.STEPS} real steps (benchmarks/plan_peak.py):", "",
                    plan_table]), PLAN_TAG)
      print(f"updated {args.out} ({PLAN_TAG})")
  print(f"gpu_check.py: {'FAILED' if failed else 'passed'} in {time.perf_counter() - t0:.0f} s")
  return 1 if failed else 0


if __name__ == "__main__":
  sys.exit(main())
