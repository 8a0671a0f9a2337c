r"""A stability map of the LM: Post-LN and Pre-LN over peak learning rate × warm-up.

  python experiments/stability_map.py --workdir=/tmp/stability [--steps=3000] [--size=course]
      [--parallel=1]
  python experiments/stability_map.py --workdir=/tmp/stability --steps=300 --size=tiny  # a sketch
  python experiments/stability_map.py --workdir=/tmp/stability --report_only

The `stability` sweep of configs/lm.py: Post-LN and Pre-LN × peak lr 1e-4, 3e-4, 1e-3,
3e-3, 1e-2 × linear warm-up over 0, 100, 500, 2000 steps, constant lr after it, on
tiny_shakespeare, by default with the course model of REFERENCE §6 (8 layers,
2.6M parameters): 40 runs, about 20 minutes each at 3000 steps on 2 CPU cores, so
`--steps` and `--size` shrink it. The runs go through the sweep launcher (re-running
skips finished runs and resumes interrupted ones). stability_map.png shows the final
held-out loss per cell, diverged cells red, cells stuck at the unigram baseline grey;
report.md has the same maps as tables, the run table, and per placement how many
cells trained. The paper's claim (Xiong et al. 2020): Post-LN needs warm-up, more of it at
higher rates; Pre-LN trains without it across the rates.
"""

import os

from absl import app, flags, logging

import lnjax  # noqa: F401  (allocator settings before anything else)
from lnjax import sweep
from lnjax.sweep import launcher, report

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

_WORKDIR = flags.DEFINE_string("workdir", None, "Root folder of the runs and the report.",
                               required=True)
_STEPS = flags.DEFINE_integer("steps", 3000, "Training steps per run.")
_SIZE = flags.DEFINE_enum("size", "course", ["tiny", "small", "course"],
                          "Model size preset of configs/lm.py.")
_PARALLEL = flags.DEFINE_integer("parallel", 1, "Runs at once, each on its own devices.")
_DEVICES_PER_RUN = flags.DEFINE_integer("devices_per_run", None,
                                        "Devices per run (default: all / --parallel).")
_REPORT_ONLY = flags.DEFINE_bool("report_only", False, "Gather the runs; train nothing.")


def notes(maps: list[report.StabilityMap], steps: int) -> list[str]:
  """Per placement: how many cells trained, were stuck, diverged, are unfinished."""
  kinds = (report.OK, report.STUCK, report.ABOVE, "diverged")
  lines = ["| placement | trained | stuck at the unigram baseline | above it | diverged | "
           "failed or unfinished |", "|---|---|---|---|---|---|"]
  for m in maps:
    states = [c.state for c in m.cells.values()]
    counts = [states.count(k) for k in kinds]
    lines.append(f"| {m.panel} | " + " | ".join(map(str, counts))
                 + f" | {len(states) - sum(counts)} |")
  if steps < max(w for m in maps for w in m.warmups):
    lines += ["", f"At {steps} steps a run, the longer warm-ups never reach their peak rate."]
  return lines


def main(argv):
  del argv
  logging.set_verbosity(logging.WARNING)
  config = os.path.join(REPO, "configs", "lm.py") + f":size={_SIZE.value}"
  root, fixed = _WORKDIR.value, {"train.num_steps": _STEPS.value}
  runs = sweep.expand(config, "stability", fixed)
  if not _REPORT_ONLY.value:
    launcher.run_to_the_end(config, "stability", runs, root, fixed, parallel=_PARALLEL.value,
                            devices_per_run=_DEVICES_PER_RUN.value)
  maps = report.stability_maps(runs, report.gather(root, runs))
  result = report.write(
      root, runs, title=f"Stability map: Post-LN and Pre-LN, LM size={_SIZE.value}, "
      f"{_STEPS.value} steps",
      command=(f"python experiments/stability_map.py --workdir={root} --steps={_STEPS.value} "
               f"--size={_SIZE.value}"),
      notes=tuple(notes(maps, _STEPS.value)))
  print("\n".join(result["markdown"]))
  print(f"\nReport: {result['paths']['report.md']}")


if __name__ == "__main__":
  app.run(main)
