"""One suite model's train step alone in this process: XLA's scratch, step time and peak RSS
under a layer layout and remat policy, and how the order of step calls moves the peak.

  python benchmarks/step_memory.py --model mt                        # unrolled, no remat
  python benchmarks/step_memory.py --model mt --scan --remat nothing_saveable
  python benchmarks/step_memory.py --model mt --calls 2,5,5,5,5,5     # the suite's pattern
  LNJAX_MALLOPT=0 LD_PRELOAD=/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4 \
      python benchmarks/step_memory.py --model lm --calls 3,21        # another allocator

The model, batch and step are benchmarks/suite.py's (Pre-LN, float32, one CPU device);
`--calls` runs the step in groups (the first group untimed); `--keep_params` keeps and saves
the initial parameters as the suite's worker does. Prints one line.
"""

import bench_env  # noqa: F401  (first: lnjax on the path, malloc tuned before JAX)

import argparse  # noqa: E402
import dataclasses  # noqa: E402
import os  # noqa: E402
import tempfile  # noqa: E402

import numpy as np  # noqa: E402

import lm_step  # noqa: E402
import suite  # noqa: E402
from lnjax.models.config import REMAT_POLICIES  # noqa: E402


def main(argv=None) -> str:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--model", choices=suite.DEFAULT_MODELS, default="lm")
  p.add_argument("--scan", action="store_true", help="model.scan_layers=True")
  p.add_argument("--remat", choices=REMAT_POLICIES, default="none")
  p.add_argument("--calls", default="3,9", help="steps per call; the first call untimed")
  p.add_argument("--keep_params", action="store_true")
  args = p.parse_args(argv)
  calls = [int(n) for n in args.calls.split(",")]
  cfg = dataclasses.replace(suite.model_config(args.model, "pre"), scan_layers=args.scan,
                            remat_policy=args.remat)
  step = lm_step.TrainStep(cfg, suite.make_batch(args.model, cfg), task=suite.TASKS[args.model],
                           keep_initial_params=args.keep_params)
  if args.keep_params:
    with tempfile.TemporaryDirectory() as d:
      np.savez(os.path.join(d, "params.npz"), **step.initial_params)
  step.run(calls[0])
  times = sorted(t for n in calls[1:] for t in step.run(n))
  line = (f"{args.model} scan={args.scan} remat={args.remat} calls={args.calls}: XLA temp "
          f"{step.xla_temp_mib:.0f} MiB, step median {1e3 * np.median(times):.0f} ms, "
          f"peak RSS {lm_step.vmhwm_mib():.0f} MiB")
  print(line, flush=True)
  return line


if __name__ == "__main__":
  main()
