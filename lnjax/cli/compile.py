"""`python -m lnjax.cli.compile` (`lnjax compile`): a run's steps compiled for a TPU slice
on this host, no TPU needed (libtpu's compiler; lnjax/core/plan.py): per-chip memory
against the chip's HBM, FLOPs, bytes, collectives and a roofline bound on step time and
MFU. Translation runs also get their beam-search decode step.

  lnjax compile --config=lm:smoke --topology=v5e:2x2
  lnjax compile --config=lm:smoke --topology=v5e-8 --mesh=fsdp=4,model=2 --output=plan.json
  lnjax compile --config=iwslt14_de_en --config.model.vocab_size=10000 --topology=v5p-8
  lnjax compile --config=lm:smoke --topology=v5e:2x2 --num_slices=2   # data across slices

Exit codes: 0 every step fits, 1 a step misses the chip's HBM (the report says by how
much), 2 bad input (an unknown topology, a mesh that is not the slice's chip count, a batch
the data axes do not divide, a step that does not compile): one line, nothing written;
143 stopped by SIGTERM or SIGUSR1, libtpu's compile included: one line, nothing written.
"""

import json
import sys

from absl import app, flags, logging
from ml_collections import config_flags

from lnjax import cli, tasks
from lnjax.core import errors, fileio, plan, preemption, sharding, tpu

_CONFIG = config_flags.DEFINE_config_file("config", None, "Config file[:presets].",
                                          lock_config=True)
_TOPOLOGY = flags.DEFINE_string("topology", None, "The TPU slice: v5e:2x4, v5e-8, v5p-8, "
                                "v6e:4x4, v4-8, ... (libtpu's AxB[xC] or Cloud TPU's name).",
                                required=True)
_NUM_SLICES = flags.DEFINE_integer("num_slices", 1, "Slices joined by the data-center "
                                   "network (multislice); the data axis spans them unless "
                                   "mesh.dcn_* say otherwise.")
cli.number("num_slices", 1)
_MESH = flags.DEFINE_string("mesh", None, "Mesh axes within a slice, e.g. fsdp=8 or "
                            "data=2,fsdp=2,model=2 (unnamed axes 1); default: the config's "
                            "mesh section (data=-1: every chip on data).")
_OUTPUT = flags.DEFINE_string("output", None, "Write the report as JSON here too.")
_EVAL = flags.DEFINE_bool("eval", True, "Also compile the eval step (and translation's "
                          "decode step).")
STOPPED = "lnjax compile: {signal}: stopped; nothing written"  # SIGTERM, SIGUSR1.


def mesh_override(text: str) -> dict:
  """'fsdp=4,model=2' -> {'mesh.data': 1, 'mesh.fsdp': 4, 'mesh.model': 2}."""
  values, given = {axis: 1 for axis in sharding.MESH_AXES}, set()
  for part in filter(None, text.split(",")):
    axis, _, size = part.partition("=")
    if axis.strip() not in values or not size.strip().lstrip("-").isdigit():
      raise errors.ConfigError(f"--mesh={text!r}: give AXIS=SIZE pairs, axes "
                               f"{', '.join(sharding.MESH_AXES)} (e.g. fsdp=4,model=2)")
    if axis.strip() in given:
      raise errors.ConfigError(f"--mesh={text!r}: axis {axis.strip()} given twice")
    given.add(axis.strip())
    values[axis.strip()] = int(size)
  return {f"mesh.{axis}": size for axis, size in values.items()}


def decode_report(parts: dict) -> dict:
  """Translation's beam search (decode.beam_size; greedy at 1) on the longest source
  bucket, as an evaluation decodes it (lnjax/inference/evaluate.py)."""
  from lnjax.data import translation as mt_data
  from lnjax.inference import decode, evaluate
  run, src = parts["run"], parts["batch"]["inputs"]
  cfg = run.section(evaluate.DecodeConfig)
  steps = min(src.shape[1] + cfg.max_extra_len, run.model.max_len)
  args = (parts["setup"].model, parts["state"].params, src)
  ids = {"max_len": steps, "bos_id": mt_data.BOS_ID, "eos_id": mt_data.EOS_ID}
  if cfg.beam_size == 1:
    lower = lambda: decode.greedy.lower(*args, **ids)
  else:
    lower = lambda: decode.beam_search.lower(*args, beam_size=cfg.beam_size,
                                             length_penalty=cfg.length_penalty, **ids)
  report = plan.compile_report(lower, parts["slice"], 0.0)
  report.update(rows=src.shape[0], source_len=src.shape[1], decode_steps=steps,
                beam_size=cfg.beam_size)
  return report


def run_plan(config, slice_: tpu.Slice, with_eval: bool) -> dict:
  decodes = with_eval and config.get("task") == "translation"
  return plan.plan_run(config, slice_, with_eval=with_eval,
                       more_steps={"decode": decode_report} if decodes else {},
                       tasks=tasks.get)


def _gib(n) -> str:
  """Bytes in GiB, or MiB/KiB below a GiB."""
  for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
    if abs(n) >= size or unit == "KiB":
      return f"{n / size:.2f} {unit}"


def format_report(r: dict) -> str:
  """The report as the console shows it: one block per step."""
  mesh = "×".join(f"{k}={v}" for k, v in r["mesh"].items())
  slices = f", {r['num_slices']} slices" if r["num_slices"] > 1 else ""
  lines = [f"{r['topology']} ({r['libtpu_topology']}, {r['num_chips']} × {r['device_kind']}"
           f"{slices}), mesh {mesh}; {r['num_params']:,} parameters; per chip:"]
  for step in ("train", "eval", "decode"):
    s = r.get(step)
    if s is None:
      continue
    if "argument_bytes" not in s:  # Out of memory: the compiler's count.
      lines.append(f"  {step:<6} DOES NOT FIT, {s['verdict']}: needs "
                   f"{_gib(s['hbm_required_bytes'])} of {_gib(s['hbm_available_bytes'])} "
                   f"({s['compiler_message']})")
      continue
    c = ", ".join(f"{k} {v['count']}×/{_gib(v['bytes'])}" for k, v in s["collectives"].items()
                  if v["count"])
    lines += [f"  {step:<6} HBM {_gib(s['hbm_total_bytes'])} of {_gib(s['hbm_capacity_bytes'])}"
              f" -> {s['verdict']} (arguments {_gib(s['argument_bytes'])}, outputs "
              f"{_gib(s['output_bytes'])}, donated {_gib(s['alias_bytes'])}, temporaries "
              f"{_gib(s['temp_bytes'])})",
              f"         {s['flops']:.3e} FLOPs, {s['hbm_bytes_accessed']:.3e} bytes accessed;"
              f" step >= {s['step_seconds_bound'] * 1e3:.3f} ms ({s['bound_by']}-bound), "
              f"MFU <= {s['mfu_bound']:.1%}; compiled in {s['compile_seconds']:.1f} s",
              f"         collectives: {c or 'none'}"]
  return "\n".join(lines)


def main(argv):
  cli.refuse_arguments(argv, prog="lnjax compile")
  logging.set_verbosity(logging.FATAL)
  if _CONFIG.value is None:
    cli.fail("--config is required (e.g. --config=lm:smoke)", prog="lnjax compile")
  try:
    if _OUTPUT.value is not None:  # Checked before the compile, not after it.
      errors.check_path("--output", _OUTPUT.value)
      if fileio.isdir(_OUTPUT.value):
        raise errors.ConfigError(f"--output={_OUTPUT.value} is a folder: name a file (the "
                                 "report's JSON)")
      fileio.refuse_run_files("--output", _OUTPUT.value, [_OUTPUT.value])
      fileio.check_output_file("--output", _OUTPUT.value)
    # SIGTERM while libtpu compiles (minutes for a 7B model): one line and exit 143 within
    # seconds (preemption's watcher), not libtpu's own handler's stack dump.
    with preemption.ends_in_one_line(STOPPED):
      slice_ = tpu.parse_topology(_TOPOLOGY.value, _NUM_SLICES.value)
      config = _CONFIG.value.unlock()
      for key, value in (mesh_override(_MESH.value) if _MESH.value else {}).items():
        section, name = key.split(".")
        config[section][name] = value
      report = run_plan(config.lock(), slice_, _EVAL.value)
  except errors.LnjaxError as e:
    cli.fail(str(e), prog="lnjax compile")
  print(format_report(report), flush=True)
  if _OUTPUT.value:
    fileio.write_text(fileio.resolve(_OUTPUT.value), json.dumps(report, indent=2) + "\n")
  fits = all(report[s]["fits"] for s in ("train", "eval", "decode") if s in report)
  sys.exit(0 if fits else 1)


if __name__ == "__main__":
  app.run(main, flags_parser=lambda a: cli.parse_flags(a, prog="lnjax compile"))
