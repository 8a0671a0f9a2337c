"""Input pipeline throughput alone, against what the train step consumes: lnjax's real
data pipelines (the ones `lnjax.main` trains from) on the corpora in data.data_dir ($LNJAX_DATA_DIR).

  python benchmarks/input_pipeline.py --out BENCHMARKS.md    # ~3 min on 2 cores
  python benchmarks/input_pipeline.py --quick                # 50 batches, 1 timed step
  python benchmarks/input_pipeline.py --pipelines lm,mt,mlm  # BERT's masking pipeline too

Pipelines (each built from its config file, as a run builds it, through the task's
make_data):
  lm   configs/lm.py:size=course: tiny_shakespeare, SentencePiece 4096, 32 × 128 windows
       (the 2.6M LM's data).
  mt   configs/multi30k_de_en.py:norm=pre: Multi30k de→en, joint SentencePiece 8000,
       length-bucketed batches of ≤ 4096 tokens a side.
  mlm  configs/bert.py:size=cpu: WikiText-2 sentence pairs, per-step dynamic masking.

For each: setup time (corpus preparation and tokenizer, from the cache when present),
then --batches batches drawn from the train iterator, timed twice: the iterator alone
(`next`), and the iterator plus the host-to-device transfer the training loop does
(`sharding.global_batch`). Tokens are the step's tokens: real target tokens
(weights > 0) for lm and mt, input positions for mlm. The step's demand: lnjax's train
step (benchmarks/lm_step.py's TrainStep, the config's model and dropout) on the
pipeline's first batch, median of --steps steps after 2 warm-up steps, in tokens/s. The
issue's bar: pipeline ≥ 10× the step's demand.
"""

import os
import sys

import bench_env  # noqa: E402,F401  (first: lnjax on the path, malloc tuned before JAX)

import argparse  # noqa: E402
import dataclasses  # noqa: E402
import importlib.util  # noqa: E402
import json  # noqa: E402
import time  # noqa: E402

import jax  # noqa: E402
import numpy as np  # noqa: E402

import lm_step  # noqa: E402
from lnjax import tasks  # noqa: E402
from lnjax.core import run as run_lib, sharding  # noqa: E402

PIPELINES = {  # name -> (config file, preset)
    "lm": ("configs/lm.py", "size=course"),
    "mt": ("configs/multi30k_de_en.py", "norm=pre"),
    "mlm": ("configs/bert.py", "size=cpu"),
}
MIN_RATIO = 10.0


def load_run(name: str):
  path, arg = PIPELINES[name]
  spec = importlib.util.spec_from_file_location("config", os.path.join(bench_env.REPO, path))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return run_lib.resolve_config(module.get_config(arg), tasks=tasks.get)


def step_tokens(name: str, batch: dict) -> int:
  """The tokens one batch gives the step: real targets (lm, mt) or input positions (mlm)."""
  if name == "mlm":
    return int(batch["inputs"].size)
  return int(np.count_nonzero(batch["weights"]))


def time_iterator(name, data, num_batches: int, transfer) -> dict:
  """Seconds and tokens of `num_batches` batches, after one untimed batch."""
  it = data.train_iter()
  next(it)
  tokens, padded = 0, 0
  t0 = time.perf_counter()
  for _ in range(num_batches):
    batch = next(it)
    if transfer is not None:
      jax.block_until_ready(transfer(batch))
    tokens += step_tokens(name, batch)
    padded += int(batch["inputs"].size + batch.get("decoder_inputs", batch["inputs"][:0]).size)
  seconds = time.perf_counter() - t0
  return {"seconds": seconds, "tokens": tokens, "padded_positions": padded,
          "tokens_per_s": tokens / seconds, "batches_per_s": num_batches / seconds}


def bench(name: str, num_batches: int, steps: int) -> dict:
  t0 = time.perf_counter()
  run = load_run(name)
  data = run.task.make_data(run.data, run.seed, 0, 1, 1)
  setup_s = time.perf_counter() - t0
  mesh = sharding.make_mesh(sharding.MeshConfig(data=1), jax.devices()[:1])
  shard = sharding.batch_sharding(mesh)
  alone = time_iterator(name, data, num_batches, None)
  moved = time_iterator(name, data, num_batches,
                        lambda b: sharding.global_batch(
                            {k: v for k, v in b.items() if k != "index"}, shard))
  first = next(data.train_iter())
  cfg = dataclasses.replace(run.model, vocab_size=data.vocab_size)
  step = lm_step.TrainStep(cfg, first, run.task, keep_initial_params=False)
  step.run(2)
  step_s = float(np.median(step.run(steps)))
  demand = step_tokens(name, first) / step_s
  return {"name": name, "setup_s": setup_s, "num_batches": num_batches, "alone": alone,
          "with_transfer": moved, "step_ms": 1e3 * step_s,
          "step_batch_shape": {k: list(v.shape) for k, v in first.items()},
          "step_tokens": step_tokens(name, first), "demand_tokens_per_s": demand,
          "ratio": moved["tokens_per_s"] / demand, "num_params": step.num_params}


def render(results: list[dict]) -> str:
  lines = ["| pipeline | setup s | batches/s (+ transfer) | tokens/s (iterator) | tokens/s (+ transfer) | "
           "step ms | step's demand tokens/s | pipeline / demand |",
           "|---|---:|---:|---:|---:|---:|---:|---:|"]
  for r in results:
    lines.append(
        f"| {r['name']} | {r['setup_s']:.1f} | {r['with_transfer']['batches_per_s']:,.0f} | "
        f"{r['alone']['tokens_per_s']:,.0f} | {r['with_transfer']['tokens_per_s']:,.0f} | "
        f"{r['step_ms']:.0f} | {r['demand_tokens_per_s']:,.0f} | **{r['ratio']:,.0f}×** "
        f"({'met' if r['ratio'] >= MIN_RATIO else 'NOT met'}) |")
  return "\n".join(lines)


def section(results, command, loads) -> str:
  mi = lm_step.machine_info()
  shapes = "; ".join(f"{r['name']} {r['step_batch_shape']['inputs']} "
                     f"({r['step_tokens']:,} tokens)" for r in results)
  return lm_step.section_text(
      "input_pipeline", "benchmarks/input_pipeline.py", "Input pipeline against the step's "
      "demand", mi, command, [
          render(results),
          "",
          f"- {results[0]['num_batches']} train batches per pipeline, after one; tokens: real "
          "target tokens (lm, mt), input positions (mlm). '+ transfer' adds "
          "`sharding.global_batch` (host → device), as the training loop does each step.",
          f"- Demand: lnjax's train step on the pipeline's first batch ({shapes}); setup: "
          "corpus and tokenizer from lnjax's cache when present.",
          f"- Load average (1 min) at start / end: {loads[0]:.2f} / {loads[1]:.2f}."])


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--pipelines", default="lm,mt", help="lm,mt,mlm (comma-separated)")
  p.add_argument("--batches", type=int, default=500, help="timed batches per pipeline")
  p.add_argument("--steps", type=int, default=5, help="timed train steps (the demand)")
  p.add_argument("--quick", action="store_true", help="50 batches, 1 timed step")
  p.add_argument("--out", help="Markdown file whose input_pipeline section is replaced")
  p.add_argument("--json", help="write the raw results here")
  args = p.parse_args(argv)
  if args.quick:
    args.batches, args.steps = 50, 1
  names = lm_step.choices("--pipelines", args.pipelines, PIPELINES)
  command = lm_step.command_line("input_pipeline.py", argv)
  loads = [os.getloadavg()[0]]
  results = []
  for n in names:
    results.append(bench(n, args.batches, args.steps))
    r = results[-1]
    print(f"{n}: {r['with_transfer']['tokens_per_s']:,.0f} tokens/s with transfer, step "
          f"{r['step_ms']:.0f} ms = {r['demand_tokens_per_s']:,.0f} tokens/s: "
          f"{r['ratio']:.0f}×", flush=True)
  loads.append(os.getloadavg()[0])
  print()
  print(render(results))
  if args.out:
    lm_step.update_section(args.out, section(results, command, loads), "input_pipeline")
    print(f"updated {args.out}")
  if args.json:
    with open(args.json, "w") as f:
      json.dump(results, f, indent=1)
  return 0


if __name__ == "__main__":
  sys.exit(main())
