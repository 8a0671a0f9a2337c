"""Does libtpu (requirements.txt: `lnjax compile`) slow down or clutter CPU runs? JAX
loads it at its first jax.devices() to look for TPU chips, unless JAX_PLATFORMS says cpu
(which lnjax's commands set on a host with no TPU and no NVIDIA GPU: lnjax/core/tpu.py).

  python benchmarks/libtpu_probe.py [--repeats=5] [--out=/tmp/libtpu_probe.json]

Each measurement alternates the two settings, `probe` (JAX_PLATFORMS empty: JAX looks
for every platform, libtpu included) and `cpu` (JAX_PLATFORMS=cpu), and reports medians:
JAX's backend start-up in a fresh process, a smoke training run (lnjax.main), and the fast
tier of two test files; plus what each wrote on stderr.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STARTUP = ("import time, jax; t = time.perf_counter(); jax.devices(); "
           "print(time.perf_counter() - t)")


def _env(mode: str) -> dict:
  env = {k: v for k, v in os.environ.items() if k != "JAX_PLATFORMS"}
  env["JAX_PLATFORMS"] = "" if mode == "probe" else "cpu"
  env["PYTHONPATH"] = REPO
  return env


def _timed(argv: list[str], mode: str) -> tuple[float, str, str]:
  t0 = time.perf_counter()
  r = subprocess.run(argv, capture_output=True, text=True, env=_env(mode), cwd=REPO)
  if r.returncode:
    raise SystemExit(f"{' '.join(argv)} ({mode}): exit {r.returncode}: {r.stderr[-800:]}")
  return time.perf_counter() - t0, r.stdout, r.stderr


def measure(name: str, argv_of, repeats: int) -> dict:
  out = {}
  for mode in ("probe", "cpu") * repeats:
    seconds, stdout, stderr = _timed(argv_of(), mode)
    row = out.setdefault(mode, {"seconds": [], "stderr_lines": set()})
    row["seconds"].append(float(stdout.split()[-1]) if name == "backend_start" else seconds)
    row["stderr_lines"] |= {l for l in stderr.splitlines() if l.strip()}
  return {mode: {"median_seconds": statistics.median(r["seconds"]), "seconds": r["seconds"],
                 "stderr_lines": sorted(r["stderr_lines"])[:10]} for mode, r in out.items()}


def main() -> None:
  parser = argparse.ArgumentParser()
  parser.add_argument("--repeats", type=int, default=5)
  parser.add_argument("--out", default=os.path.join(tempfile.gettempdir(), "libtpu_probe.json"))
  args = parser.parse_args()
  work = tempfile.mkdtemp(prefix="libtpu_probe_")
  count = iter(range(10**6))
  result = {"date": time.strftime("%Y-%m-%d"), "repeats": args.repeats}
  result["backend_start"] = measure("backend_start", lambda: [sys.executable, "-c", STARTUP],
                                    args.repeats)
  result["smoke_train"] = measure("smoke_train", lambda: [
      sys.executable, "-m", "lnjax.main", "--config=lm:smoke",
      f"--workdir={work}/run{next(count)}"], max(1, args.repeats // 2))
  result["fast_tier"] = measure("fast_tier", lambda: [
      sys.executable, "-m", "pytest", "-q", "-m", "not slow", "-p", "no:cacheprovider",
      "tests/test_configs.py", "tests/test_sharding.py"], max(1, args.repeats // 2))
  with open(args.out, "w") as f:
    json.dump(result, f, indent=2)
  for key in ("backend_start", "smoke_train", "fast_tier"):
    r = result[key]
    print(f"{key}: probe {r['probe']['median_seconds']:.2f} s, cpu "
          f"{r['cpu']['median_seconds']:.2f} s; stderr probe {len(r['probe']['stderr_lines'])}"
          f" distinct lines, cpu {len(r['cpu']['stderr_lines'])}")


if __name__ == "__main__":
  main()
