"""benchmarks/rss_trace.py: a command's resident memory over time, between its output lines."""

import os
import re
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CHILD = ("import sys, time, numpy as np; a = np.ones(48 << 20); print('allocated', flush=True); "
         "time.sleep(0.5); sys.exit(3)")  # 384 MiB of float64, touched.


@pytest.mark.slow
def test_the_peak_holds_the_child_allocation_and_its_exit_code_passes_through():
  r = subprocess.run([sys.executable, "benchmarks/rss_trace.py", "--print_every", "0.1", "--",
                      sys.executable, "-c", CHILD], cwd=REPO, capture_output=True, text=True,
                     timeout=120)
  assert r.returncode == 3, r.stdout + r.stderr
  lines = r.stdout.splitlines()
  assert re.fullmatch(r"\s*[\d.]+  allocated", next(l for l in lines if "allocated" in l))
  peak = int(re.fullmatch(r"exit 3; peak RSS (\d+) MiB \(sampled every 0.05 s\)", lines[-1])[1])
  assert peak >= 384, lines[-1]
  rss = [int(m[1]) for l in lines if (m := re.search(r"rss (\d+) MiB", l))]
  assert rss and max(rss) <= peak


def test_no_command_is_a_usage_error():
  r = subprocess.run([sys.executable, "benchmarks/rss_trace.py"], cwd=REPO, capture_output=True,
                     text=True, timeout=60)
  assert r.returncode == 2 and "a command to run is required" in r.stderr
