"""A command's resident memory over time, interleaved with its output lines.

  python benchmarks/rss_trace.py [--every 0.05] [--print_every 2] -- python -m lnjax.main ...

Polls the child's VmRSS and VmHWM (/proc/PID/status) every --every seconds and prints one
line per --print_every seconds, between the child's own output lines, each with the time
since the start; ends with the peak (VmHWM's last value). Linux only. Shows which phase of a
run (compiling a step, evaluating, saving) raises the peak, which a peak alone cannot.
"""

import argparse
import subprocess
import sys
import threading
import time

from memory import status_mib  # (benchmarks/memory.py: VmRSS and VmHWM of a process)


def main():
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--every", type=float, default=0.05, help="seconds between samples")
  p.add_argument("--print_every", type=float, default=2.0, help="seconds between RSS lines")
  p.add_argument("command", nargs=argparse.REMAINDER, help="the command, after --")
  args = p.parse_args()
  command = args.command[1:] if args.command[:1] == ["--"] else args.command
  if not command:
    p.error("a command to run is required, after --")
  t0 = time.monotonic()
  proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)

  def echo():  # The child's lines, as they come.
    for line in proc.stdout:
      print(f"{time.monotonic() - t0:7.1f}  {line.rstrip()}", flush=True)
  reader = threading.Thread(target=echo)
  reader.start()
  peak, printed = 0, -args.print_every
  while proc.poll() is None:
    sample = status_mib(proc.pid)
    if sample:
      peak = max(peak, sample["VmHWM"])
      now = time.monotonic() - t0
      if now - printed >= args.print_every:
        print(f"{now:7.1f}  rss {sample['VmRSS']:.0f} MiB, peak so far {sample['VmHWM']:.0f} MiB",
              flush=True)
        printed = now
    time.sleep(args.every)
  reader.join()
  print(f"exit {proc.returncode}; peak RSS {peak:.0f} MiB (sampled every {args.every:g} s)")
  sys.exit(proc.returncode)


if __name__ == "__main__":
  main()
