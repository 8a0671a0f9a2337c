r"""Stability maps: final held-out loss (or BLEU) over peak learning rate × warm-up, a
panel per norm placement, on the LM or on Multi30k translation.

  python experiments/stability_map.py --workdir=/tmp/stability [--steps=3000] [--size=course]
  python experiments/stability_map.py --workdir=/tmp/stability --steps=300 --size=tiny  # a sketch
  python experiments/stability_map.py --workdir=/tmp/zoo_lm --sweep=zoo --steps=400 --batch_size=8
  python experiments/stability_map.py --workdir=/tmp/zoo_mt --task=multi30k --sweep=zoo \
      --steps=300 --size=map
  python experiments/stability_map.py --workdir=/tmp/stability --steps=600 --batch_size=8 \
      --learning_rates=1e-3,1e-2 --warmups=0,100,500 --parallel=2       # a few cells
  python experiments/stability_map.py --workdir=/tmp/stability --report_only

--sweep=stability (the default; configs/lm.py's `stability` sweep): Post-LN and Pre-LN ×
peak lr 1e-4, 3e-4, 1e-3, 3e-3, 1e-2 × linear warm-up over 0, 100, 500, 2000 steps,
constant lr after it, on tiny_shakespeare, by default with the course model of
the course workshop (8 layers, 2.6M parameters): 40 runs, about 20 minutes each at 3000 steps on
2 CPU cores, so `--steps`, `--size` and `--batch_size` shrink it.

--sweep=zoo: every placement of lnjax.models.placement (Post-LN, Pre-LN, Sandwich, Peri,
DeepNorm, NormFormer, ResiDual, Admin, Mix-LN, B2T, DyT, LayerNorm Scaling, OLMo 2, nGPT)
without warm-up over the rates of the config's `zoo` sweep: which placements train without
warm-up, up to which rate. With --task=multi30k (every placement but the decoder-only
nGPT) the runs are configs/multi30k_de_en.py's encoder-decoder (--size=cpu its
own 3+3 d256; --size=map 3+3 d128 with FFN 512 and 2048-token batches) at a constant rate,
Mix-LN with α = 1/3 (one Post-LN layer of three; the paper's 0.25 gives none at this
depth), scored by the held-out loss on the validation split against its unigram baseline (no
decoding: a stuck or diverged model decodes to the length limit; BLEU of full runs is
experiments/multi30k_warmup.py's).

The runs go through the sweep launcher (re-running skips finished runs and resumes
interrupted ones). stability_map.png shows each cell's final result, diverged cells red,
cells stuck at the unigram baseline grey; report.md has the same maps as tables, the run
table, and per placement how many cells trained. The paper's claim (Xiong et al. 2020):
Post-LN needs warm-up, more of it at higher rates; Pre-LN trains without it across the
rates.
"""

import math
import os

from absl import app, flags, logging

from lnjax.core import allocator
allocator.tune_glibc_malloc()  # glibc malloc for XLA:CPU, before JAX starts
from lnjax import sweep
from lnjax.sweep import launcher, report

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

_WORKDIR = flags.DEFINE_string("workdir", None, "Root folder of the runs and the report.",
                               required=True)
_STEPS = flags.DEFINE_integer("steps", 3000, "Training steps per run.")
_TASK = flags.DEFINE_enum("task", "lm", ["lm", "multi30k"], "configs/lm.py or "
                          "configs/multi30k_de_en.py.")
_SWEEP = flags.DEFINE_enum("sweep", "stability", ["stability", "zoo"],
                           "stability: Post-/Pre-LN × lr × warm-up (LM only); zoo: every "
                           "placement × lr without warm-up.")
_SIZE = flags.DEFINE_string("size", None, "LM: tiny | small | course (configs/lm.py, default "
                            "course); multi30k: cpu (the config's) | map (default).")
_BATCH = flags.DEFINE_integer("batch_size", None, "LM sequences per batch (default: the "
                              "config's, 32 for the course model).")
_PARALLEL = flags.DEFINE_integer("parallel", 1, "Runs at once, each on its own devices.")
_DEVICES_PER_RUN = flags.DEFINE_integer("devices_per_run", None,
                                        "Devices per run (default: all / --parallel).")
_RATES = flags.DEFINE_list("learning_rates", None, "Only the sweep's cells at these peak "
                          "rates (default: all of them).")
_WARMUPS = flags.DEFINE_list("warmups", None, "Only the sweep's cells at these warm-up "
                             "lengths (steps), e.g. 0,100,500.")
_REPORT_ONLY = flags.DEFINE_bool("report_only", False, "Gather the runs; train nothing.")


def notes(maps: list[report.StabilityMap], steps: int) -> list[str]:
  """Per placement: how many cells trained, were stuck, diverged, are unfinished, and the
  highest peak rate at which it trained without warm-up."""
  kinds = (report.OK, report.STUCK, report.ABOVE, "diverged")
  lines = ["| placement | trained | stuck at the unigram baseline | above it | diverged | "
           "failed or unfinished | highest lr trained without warm-up |",
           "|---|---|---|---|---|---|---|"]
  for m in maps:
    states = [c.state for c in m.cells.values()]
    counts = [states.count(k) for k in kinds]
    trained = [lr for (w, lr), c in m.cells.items() if w == 0 and c.state == report.OK]
    lines.append(f"| {m.panel} | " + " | ".join(map(str, counts))
                 + f" | {len(states) - sum(counts)} | "
                 + (f"{max(trained):g} |" if trained else "none |"))
  if steps < max(w for m in maps for w in m.warmups):
    lines += ["", f"At {steps} steps a run, the longer warm-ups never reach their peak rate."]
  return lines


# Multi30k at map size: the config's 3+3 layers at half its width, half its batch.
MT_MAP_SIZE = {"model.d_model": 128, "model.num_heads": 4, "model.d_ff": 512,
               "data.max_tokens": 2048}
# Mix-LN's α for 3 layers a stack: ⌊αL⌋ = 1 Post-LN layer (the paper's 0.25 gives none).
MT_MIX_POST_FRACTION = 1 / 3


def setup(task: str, sweep_arg: str, size: str | None, steps: int,
          batch_size: int | None) -> tuple[str, dict, str]:
  """(config argument, fixed overrides, size) of the sweep on `task`."""
  fixed = {"train.num_steps": steps}
  if task == "lm":
    size = size or "course"
    if batch_size:
      fixed["data.batch_size"] = batch_size
    return os.path.join(REPO, "configs", "lm.py") + f":size={size}", fixed, size
  if sweep_arg != "zoo":
    raise app.UsageError("--task=multi30k has the zoo sweep only (its warm-up studies are "
                         "experiments/multi30k_warmup.py and the fig2/fig4 sweeps)")
  size = size or "map"
  if size not in ("cpu", "map"):
    raise app.UsageError(f"--size={size}: --task=multi30k takes cpu or map")
  fixed.update(MT_MAP_SIZE if size == "map" else {})
  fixed["model.mix_post_fraction"] = MT_MIX_POST_FRACTION
  # Held-out loss four times a run against the unigram baseline; no decoding (a stuck or
  # diverged model decodes to the length limit, the slowest part of a short run).
  fixed.update({"train.eval_every_steps": max(steps // 4, 1),
                "train.checkpoint_every_steps": max(steps // 4, 1),
                "decode.bleu_in_training": False})
  return os.path.join(REPO, "configs", "multi30k_de_en.py") + ":norm=pre", fixed, size


def main(argv):
  del argv
  logging.set_verbosity(logging.WARNING)
  config, fixed, size = setup(_TASK.value, _SWEEP.value, _SIZE.value, _STEPS.value,
                              _BATCH.value)
  root = _WORKDIR.value
  runs = sweep.expand(config, _SWEEP.value, fixed)
  if _RATES.value:
    rates = [float(r) for r in _RATES.value]
    runs = [r for r in runs if any(math.isclose(r.setting("opt.learning_rate"), x)
                                   for x in rates)]
    if not runs:
      raise app.UsageError(f"--learning_rates={','.join(_RATES.value)}: no run of the "
                           f"{_SWEEP.value} sweep has these rates")
  if _WARMUPS.value:
    warmups = [int(w) for w in _WARMUPS.value]
    runs = [r for r in runs if r.setting("opt.warmup_steps") in warmups]
    if not runs:
      raise app.UsageError(f"--warmups={','.join(_WARMUPS.value)}: no run of the "
                           f"{_SWEEP.value} sweep has these warm-ups")
  if not _REPORT_ONLY.value:
    launcher.run_to_the_end(config, _SWEEP.value, runs, root, fixed, parallel=_PARALLEL.value,
                            devices_per_run=_DEVICES_PER_RUN.value)
  maps = report.stability_maps(runs, report.gather(root, runs))
  result = report.write(
      root, runs, title=f"Stability map ({_SWEEP.value}): {_TASK.value} size={size}, "
      f"{_STEPS.value} steps" + (f", batch {_BATCH.value}" if _BATCH.value else ""),
      command=(f"python experiments/stability_map.py --workdir={root} --task={_TASK.value} "
               f"--sweep={_SWEEP.value} --steps={_STEPS.value} --size={size}"
               + (f" --batch_size={_BATCH.value}" if _BATCH.value else "")
               + (f" --learning_rates={','.join(_RATES.value)}" if _RATES.value else "")
               + (f" --warmups={','.join(_WARMUPS.value)}" if _WARMUPS.value else "")),
      notes=tuple(notes(maps, _STEPS.value)))
  print("\n".join(result["markdown"]))
  print(f"\nReport: {result['paths']['report.md']}")


if __name__ == "__main__":
  app.run(main)
