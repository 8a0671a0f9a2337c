"""Compile time and step time against depth, layers scanned (`model.scan_layers`) and
unrolled: the LM of benchmarks/lm_step.py (d_model 128, 4 heads, FFN 512, vocab 4096,
seq 128, batch 32, Pre-LN, dropout 0, Adam, donated state) at 6, 12, 24 and 48 layers.

  python benchmarks/depth.py --out BENCHMARKS.md            # the table below, ~10 min
  python benchmarks/depth.py --quick                        # 2 and 4 layers, < 2 min
  python benchmarks/depth.py --layers 6,48 --variants unrolled,scanned,scanned+nothing_saveable

Every (depth, variant) runs in a fresh worker process (this script with --worker): its
compile times are a cold process's (JAX's persistent compilation cache off), its peak
RSS its own. Compile time is reported in its two parts: `lower` (tracing the train step
and emitting StableHLO: jax.jit(...).lower) and `compile` (XLA: .compile()). A variant is
`unrolled` or `scanned`, optionally `+<remat policy>` (model.remat_policy). Step times:
median of --steps steps after 2 warm-up steps; --rounds R repeats the whole grid R times
(medians over rounds). The issue's target: scanned compile (lower + compile) at 48 layers
at most 1.5× that at 6 layers.
"""

import os
import sys

import bench_env  # noqa: E402,F401  (first: lnjax on the path, malloc tuned before JAX)

import argparse  # noqa: E402
import json  # noqa: E402
import subprocess  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402

LAYERS = (6, 12, 24, 48)
VARIANTS = ("unrolled", "scanned")
WARMUP = 2
TARGET_RATIO = 1.5


def parse_variant(variant: str) -> dict:
  """'scanned+nothing_saveable' -> {'scan_layers': True, 'remat_policy': 'nothing_saveable'}."""
  kind, _, policy = variant.partition("+")
  if kind not in VARIANTS:
    raise SystemExit(f"variant {variant!r}: not unrolled[+policy] or scanned[+policy]")
  return {"scan_layers": kind == "scanned", "remat_policy": policy or "none"}


# ---------------------------------------------------------------------------------------
# Worker: one depth, one variant, in its own process.

def worker(num_layers: int, variant: str, steps: int) -> dict:
  import jax  # noqa: PLC0415
  jax.config.update("jax_enable_compilation_cache", False)
  import lm_step  # noqa: PLC0415

  ln = lm_step.LnjaxStep("pre", num_layers=num_layers, **parse_variant(variant))
  ln.run(WARMUP)
  times = ln.run(steps)
  return {"layers": num_layers, "variant": variant, "num_params": ln.num_params,
          "lower_s": ln.lower_s, "compile_s": ln.compile_s, "xla_temp_mib": ln.xla_temp_mib,
          "xla_args_mib": ln.xla_args_mib, "times": times, "initial_loss": ln.initial_loss,
          "loss": ln.loss, "peak_rss_mib": lm_step.vmhwm_mib()}


def run_worker(num_layers: int, variant: str, steps: int) -> dict:
  out = subprocess.run(
      [sys.executable, os.path.abspath(__file__), "--worker", str(num_layers), variant,
       "--steps", str(steps)], capture_output=True, text=True, check=False)
  if out.returncode:
    raise RuntimeError(f"worker {num_layers} {variant} failed:\n{out.stderr[-3000:]}")
  return json.loads(out.stdout.strip().splitlines()[-1])


# ---------------------------------------------------------------------------------------
# Report.

def summarize(runs: list[dict]) -> list[dict]:
  """Per (layers, variant): medians over rounds of the compile parts, pooled step times."""
  rows = {}
  for r in runs:
    rows.setdefault((r["layers"], r["variant"]), []).append(r)
  out = []
  for (layers, variant), rs in sorted(rows.items()):
    times = np.concatenate([r["times"] for r in rs]) * 1e3
    lower = float(np.median([r["lower_s"] for r in rs]))
    comp = float(np.median([r["compile_s"] for r in rs]))
    out.append({"layers": layers, "variant": variant, "num_params": rs[0]["num_params"],
                "lower_s": lower, "compile_s": comp, "total_s": lower + comp,
                "step_ms": float(np.median(times)), "step_min_ms": float(times.min()),
                "xla_temp_mib": rs[0]["xla_temp_mib"],
                "peak_rss_mib": float(np.median([r["peak_rss_mib"] for r in rs])),
                "loss": rs[-1]["loss"], "rounds": len(rs)})
  return out


def ratios(rows: list[dict]) -> list[str]:
  """Compile time at the deepest over the shallowest depth, per variant."""
  lines = []
  for variant in sorted({r["variant"] for r in rows}):
    rs = sorted((r for r in rows if r["variant"] == variant), key=lambda r: r["layers"])
    if len(rs) < 2:
      continue
    lo, hi = rs[0], rs[-1]
    total = hi["total_s"] / lo["total_s"]
    verdict = ""
    if variant.startswith("scanned"):
      verdict = (f" (target ≤ {TARGET_RATIO}: "
                 f"{'met' if total <= TARGET_RATIO else 'NOT met'})")
    lines.append(f"- {variant}: compile at {hi['layers']} layers / at {lo['layers']} layers = "
                 f"**{total:.2f}×** (lower + compile){verdict}; XLA compile alone "
                 f"{hi['compile_s'] / lo['compile_s']:.2f}×; step time "
                 f"{hi['step_ms'] / lo['step_ms']:.2f}× for {hi['layers'] / lo['layers']:.0f}× "
                 "the layers.")
  return lines


def render(rows: list[dict]) -> str:
  lines = ["| layers | variant | parameters | lower s | XLA compile s | total s | step ms "
           "(median) | step ms (min) | ms / layer | XLA temp MiB | peak RSS MiB |",
           "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
  for r in rows:
    lines.append(
        f"| {r['layers']} | {r['variant']} | {r['num_params']:,} | {r['lower_s']:.2f} | "
        f"{r['compile_s']:.2f} | {r['total_s']:.2f} | {r['step_ms']:.1f} | "
        f"{r['step_min_ms']:.1f} | {r['step_ms'] / r['layers']:.1f} | "
        f"{r['xla_temp_mib']:.0f} | {r['peak_rss_mib']:.0f} |")
  return "\n".join(lines + [""] + ratios(rows))


def section(rows, command, machine, steps, rounds, loads) -> str:
  import lm_step  # noqa: PLC0415
  return lm_step.section_text(
      "depth", "benchmarks/depth.py", "Depth: compile and step time, scanned and unrolled",
      machine, command, [
          render(rows),
          "",
          "- Model: benchmarks/lm_step.py's LM (D 128, 4 heads, F 512, V 4096, Pre-LN, dropout 0) "
          "at each depth; batch 32 × seq 128; lnjax's train_step with Adam, state donated.",
          "- Each row a fresh process (no compilation cache): lower = trace + StableHLO, XLA "
          "compile = `.compile()`; the state's init is not counted. Step: median of "
          f"{steps} steps × {rounds} round(s) after {WARMUP} warm-up steps. Peak RSS: the "
          "worker's VmHWM. XLA temp: the step's scratch from XLA's buffer assignment.",
          f"- Load average (1 min) at start / end: {loads[0]:.2f} / {loads[1]:.2f}."])


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--layers", default=",".join(map(str, LAYERS)), help="depths, comma-separated")
  p.add_argument("--variants", default=",".join(VARIANTS),
                 help="unrolled|scanned[+remat policy], comma-separated")
  p.add_argument("--steps", type=int, default=5, help="timed steps per run")
  p.add_argument("--rounds", type=int, default=1, help="times the whole grid is run")
  p.add_argument("--quick", action="store_true", help="2 and 4 layers, 2 steps: self-check")
  p.add_argument("--out", help="Markdown file whose depth section is added or replaced")
  p.add_argument("--json", help="write the raw results here")
  p.add_argument("--worker", nargs=2, metavar=("LAYERS", "VARIANT"), help=argparse.SUPPRESS)
  args = p.parse_args(argv)
  if args.worker:
    print(json.dumps(worker(int(args.worker[0]), args.worker[1], args.steps)))
    return 0
  layers = [2, 4] if args.quick else [int(x) for x in args.layers.split(",")]
  steps = 2 if args.quick else args.steps
  variants = args.variants.split(",")
  for v in variants:
    parse_variant(v)
  import lm_step  # noqa: PLC0415  (the parent only times its workers)
  command = lm_step.command_line("depth.py", argv)
  loads = [os.getloadavg()[0]]
  t0 = time.perf_counter()
  runs = []
  for r in range(args.rounds):
    for n in layers:
      for v in variants:
        res = run_worker(n, v, steps)
        runs.append(res)
        print(f"round {r + 1}/{args.rounds} {n:3d} layers {v:28s} lower {res['lower_s']:6.2f} s"
              f"  compile {res['compile_s']:6.2f} s  step {1e3 * np.median(res['times']):7.1f}"
              f" ms  (load {os.getloadavg()[0]:.1f})", flush=True)
  loads.append(os.getloadavg()[0])
  rows = summarize(runs)
  print()
  print(render(rows))
  print(f"\nwall time {time.perf_counter() - t0:.0f} s")
  failures = [f"{r['layers']} {r['variant']}: bad step time or loss" for r in rows
              if not (np.isfinite(r["step_ms"]) and r["step_ms"] > 0 and np.isfinite(r["loss"]))]
  if args.out:
    lm_step.update_section(args.out, section(rows, command, lm_step.machine_info(), steps,
                                             args.rounds, loads), "depth")
    print(f"updated {args.out}")
  if args.json:
    with open(args.json, "w") as f:
      json.dump({"runs": runs, "rows": rows}, f, indent=1)
  for f in failures:
    print("FAIL:", f, file=sys.stderr)
  return 1 if failures else 0


if __name__ == "__main__":
  sys.exit(main())
