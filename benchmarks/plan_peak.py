"""The plan's predicted memory beside the measured peak (gpu_check.sh's `plan` part): the
IWSLT-size encoder-decoder's train step compiled by `lnjax compile`'s library
(lnjax/core/plan.py) for the devices attached here, its per-device total from XLA's memory
analysis, then a few real steps and JAX's peak_bytes_in_use of device 0.

  python benchmarks/plan_peak.py [--dry_run]   # --dry_run: suite.py's tiny sizes

On the CPU JAX keeps no device memory statistics: the measured column says so.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_env  # noqa: E402,F401  (first: lnjax on the path, malloc tuned before JAX)

import argparse  # noqa: E402

import jax  # noqa: E402
import numpy as np  # noqa: E402

import lnjax  # noqa: E402
from lnjax import tasks  # noqa: E402
import suite  # noqa: E402
from lnjax.core import plan, run, sharding, state as state_lib  # noqa: E402

STEPS = 3
IWSLT = dict(num_layers=6, d_model=512, num_heads=4, d_ff=1024, vocab_size=8000)


def config_of(dry: bool):
  c = lnjax.get_config("multi30k_de_en").unlock()
  for key, value in (suite.DRY_MODEL if dry else IWSLT).items():
    c.model[key] = value
  c.model.dtype, c.model.max_len = "bfloat16", 256
  c.data.max_tokens, c.data.max_len = (256, 16) if dry else (4096, 128)
  return c.lock()


def check(dry: bool) -> dict:
  """{"predicted": plan's memory report, "measured_peak_bytes": int or None, ...}."""
  config = config_of(dry)
  mesh = sharding.make_mesh(run.resolve_config(config, tasks=tasks.get).mesh)
  parts = plan.prepare(config, mesh=mesh, tasks=tasks.get)
  device = jax.devices()[0]
  limit = (device.memory_stats() or {}).get("bytes_limit", float("inf"))
  compiled = parts["train_step"].lower(parts["state"], parts["batch"]).compile()
  predicted = plan.memory_report(compiled, limit)
  state = state_lib.init_state(parts["setup"], mesh, 0)
  rng = np.random.default_rng(0)
  batch = {k: jax.device_put(rng.integers(1, 50, x.shape).astype(x.dtype), x.sharding)
           for k, x in parts["batch"].items()}
  for _ in range(STEPS):
    state, metrics = parts["train_step"](state, batch)
  jax.block_until_ready(metrics)
  peak = (device.memory_stats() or {}).get("peak_bytes_in_use")
  return {"device": device.device_kind, "devices": len(jax.devices()),
          "batch": "×".join(map(str, parts["batch"]["inputs"].shape)),
          "predicted": predicted, "measured_peak_bytes": peak,
          "loss": float(metrics["train_loss"])}


def render(r: dict) -> str:
  mib = lambda b: f"{b / 2**20:,.1f}"
  p = r["predicted"]
  measured = (mib(r["measured_peak_bytes"]) if r["measured_peak_bytes"] is not None
              else "— (no device memory statistics on this backend)")
  ratio = (f"{r['measured_peak_bytes'] / p['hbm_total_bytes']:.2f}"
           if r["measured_peak_bytes"] else "—")
  return "\n".join([
      "| device | batch | predicted arguments MiB | predicted temporaries MiB | predicted "
      "total MiB | measured peak MiB (JAX peak_bytes_in_use) | measured / predicted |",
      "|---|---|---:|---:|---:|---:|---:|",
      f"| {r['devices']} × {r['device']} | {r['batch']} | {mib(p['argument_bytes'])} | "
      f"{mib(p['temp_bytes'])} | {mib(p['hbm_total_bytes'])} | {measured} | {ratio} |"])


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--dry_run", action="store_true")
  args = p.parse_args(argv)
  r = check(args.dry_run)
  print(render(r), flush=True)
  return 0 if np.isfinite(r["loss"]) else 1


if __name__ == "__main__":
  sys.exit(main())
