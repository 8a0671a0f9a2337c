"""Fit tables for TPU slices (BENCHMARKS.md, "TPU plans"): lnjax's models compiled by
`lnjax compile`'s library (lnjax/core/plan.py) for v5e-8, v5e-16, v5p-8 and v6e-8 under
data, fsdp and fsdp+tensor meshes, remat policies and norm placements; per slice, the
configuration that fits with the most headroom and the one with the highest MFU bound.

  python benchmarks/tpu_plans.py --models=lm125m --out=/tmp/tpu_plans   # a part of the grid
  python benchmarks/tpu_plans.py --out=/tmp/tpu_plans                  # everything (hours)

Writes OUT.md (tables) and OUT.json (every report), row by row (a long grid can be
stopped and read). Models (Llama-style shapes on today's decoder: pre-RMSNorm, no
biases, bf16 compute over fp32 parameters, scanned layers; an ungated FFN 1.5× as wide
as Llama's gated one has its parameters and FLOPs; learned positions instead of RoPE):
lm125m (12×768), lm1b (16×2048), lm7b (32×4096, Llama-2-7B's 6.7 B parameters), the
paper's 6+6×512 encoder-decoder (iwslt14_de_en), BERT-base (bert:size=base); and the
modern block itself (configs/llama.py, family=llama: RoPE, SwiGLU, RMSNorm, its sizes'
own shapes and vocabularies) as llama125m, llama1b (Llama 3.2 1B) and llama7b (Llama 2 7B),
at sequence 2048.
"""

import argparse
import itertools
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import lnjax  # noqa: E402
from lnjax import tasks  # noqa: E402
from lnjax.core import errors, plan, tpu  # noqa: E402

SLICES = ("v5e-8", "v5e-16", "v5p-8", "v6e-8")
MESHES = {"data": {"data": -1, "fsdp": 1, "model": 1}, "fsdp": {"data": 1, "fsdp": -1, "model": 1},
          "fsdp+tensor": {"data": 1, "fsdp": -1, "model": 2}}
REMATS = ("none", "dots_saveable", "nothing_saveable")
PLACEMENTS = ("pre", "post", "resi_dual", "sandwich", "ngpt")
# name: (config, preset, L, D, H, F, V, seq, batch per chip)
MODELS = {
    "lm125m": ("lm", "", 12, 768, 12, 4608, 32000, 2048, 4),
    "lm1b": ("lm", "", 16, 2048, 32, 12288, 32000, 2048, 2),
    "lm7b": ("lm", "", 32, 4096, 32, 16512, 32000, 2048, 1),
    "encdec": ("iwslt14_de_en", "", 6, 512, 8, 2048, 10000, 0, 0),
    "bert_base": ("bert", "size=base", 12, 768, 12, 3072, 30522, 128, 32),
    # configs/llama.py's shapes as they are (None: the preset's).
    "llama125m": ("llama", "family=llama,size=125m", None, None, None, None, None, 2048, 4),
    "llama1b": ("llama", "family=llama,size=1b", None, None, None, None, None, 2048, 2),
    "llama7b": ("llama", "family=llama,size=7b", None, None, None, None, None, 2048, 1),
}


def config_of(model: str, slice_: tpu.Slice, mesh: str, remat: str, placement: str,
              health: str = ""):
  """`health`: train.health ('' = the config's own, warn: the per-layer statistics every
  step computes, which keep a float32 copy of the updates; off: as MaxText's step)."""
  name, preset, L, D, H, F, V, seq, per_chip = MODELS[model]
  c = lnjax.get_config(name, preset).unlock()
  if health:
    c.train.health = health
  m = c.model
  if L is not None:
    m.num_layers, m.d_model, m.num_heads, m.d_ff, m.vocab_size = L, D, H, F, V
  m.dtype, m.scan_layers, m.remat_policy, m.norm_position = "bfloat16", True, remat, placement
  m.dropout_rate = 0.0
  if name == "llama":
    m.max_len = c.data.seq_len = seq
  if name == "lm":
    m.norm_kind, m.use_bias, m.max_len = "rmsnorm", False, seq
    c.data.seq_len, c.data.tokenizer = seq, "sentencepiece"
  if seq and "batch_size" in c.data:
    c.data.batch_size = per_chip * slice_.num_chips
  if name == "iwslt14_de_en":
    c.data.max_tokens = 4096 * slice_.num_chips  # fairseq's 4096 tokens a GPU, a chip here.
  for axis, size in MESHES[mesh].items():
    c.mesh[axis] = size
  return c.lock()


def row_of(model, slice_name, mesh, remat, placement, health: str = "") -> dict:
  slice_ = tpu.parse_topology(slice_name)
  row = {"model": model, "slice": slice_name, "mesh": mesh, "remat": remat,
         "placement": placement, **({"health": health} if health else {})}
  try:
    report = plan.plan_run(config_of(model, slice_, mesh, remat, placement, health), slice_,
                           with_eval=False, tasks=tasks.get)
  except errors.ConfigError as e:
    return {**row, "error": str(e)}
  t = report["train"]
  row.update(num_params=report["num_params"], fits=t["fits"], verdict=t["verdict"],
             hbm_total_bytes=t.get("hbm_total_bytes", t.get("hbm_required_bytes")),
             hbm_headroom_bytes=t.get("hbm_headroom_bytes"), flops=t.get("flops"),
             mfu_bound=t.get("mfu_bound"), step_seconds_bound=t.get("step_seconds_bound"),
             compile_seconds=t["compile_seconds"], collectives=t.get("collectives"))
  return row


def markdown(rows: list[dict]) -> list[str]:
  lines = ["| model | slice | mesh | remat | placement | params | HBM/chip (GiB) | verdict |"
           " FLOPs/chip | step ≥ (ms) | MFU ≤ | compile (s) |", "|" + "---|" * 12]
  for r in rows:
    if "error" in r:
      lines.append(f"| {r['model']} | {r['slice']} | {r['mesh']} | {r['remat']} | "
                   f"{r['placement']} | | | refused: {r['error'][:80]} | | | | |")
      continue
    mfu = f"{r['mfu_bound']:.0%}" if r.get("mfu_bound") is not None else ""
    flops = f"{r['flops']:.3g}" if r.get("flops") else ""
    step = f"{r['step_seconds_bound'] * 1e3:.1f}" if r.get("step_seconds_bound") else ""
    lines.append(f"| {r['model']} | {r['slice']} | {r['mesh']} | {r['remat']} | "
                 f"{r['placement']} | {r['num_params'] / 1e6:,.0f} M | "
                 f"{r['hbm_total_bytes'] / tpu.GiB:.2f} | {r['verdict']} | {flops} | {step} "
                 f"| {mfu} | {r['compile_seconds']:.0f} |")
  return lines + [""] + best(rows)


def best(rows: list[dict]) -> list[str]:
  """Per slice and model: the most headroom among those that fit, the highest MFU bound."""
  out = ["| model | slice | most headroom | highest MFU bound |", "|---|---|---|---|"]
  key = lambda r: f"{r['mesh']}, remat {r['remat']}, {r['placement']}"
  for (model, slice_), group in itertools.groupby(
      sorted(rows, key=lambda r: (r["model"], r["slice"])), lambda r: (r["model"], r["slice"])):
    fit = [r for r in group if r.get("fits")]
    if not fit:
      out.append(f"| {model} | {slice_} | nothing fits | |")
      continue
    roomy = max(fit, key=lambda r: r["hbm_headroom_bytes"])
    fast = max(fit, key=lambda r: r["mfu_bound"])
    out.append(f"| {model} | {slice_} | {key(roomy)} ({roomy['hbm_headroom_bytes'] / tpu.GiB:.1f}"
               f" GiB free) | {key(fast)} ({fast['mfu_bound']:.0%}) |")
  return out


def main() -> None:
  p = argparse.ArgumentParser()
  p.add_argument("--models", default=",".join(MODELS))
  p.add_argument("--slices", default=",".join(SLICES))
  p.add_argument("--meshes", default=",".join(MESHES))
  p.add_argument("--remats", default=",".join(REMATS))
  p.add_argument("--placements", default=",".join(PLACEMENTS))
  p.add_argument("--health", default="", help="train.health of every row (off: no per-layer "
                 "statistics, as MaxText's step); default: each config's own (warn)")
  p.add_argument("--out", default="/tmp/tpu_plans")
  a = p.parse_args()
  rows = []
  grid = itertools.product(a.models.split(","), a.slices.split(","), a.meshes.split(","),
                           a.remats.split(","), a.placements.split(","))
  for combo in grid:
    t0 = time.perf_counter()
    rows.append(row_of(*combo, health=a.health))
    print(f"{' '.join(combo)}: {rows[-1].get('verdict', rows[-1].get('error'))} "
          f"({time.perf_counter() - t0:.0f} s)", flush=True)
    with open(a.out + ".json", "w") as f:
      json.dump({"date": time.strftime("%Y-%m-%d"), "command": " ".join(sys.argv),
                 "rows": rows}, f, indent=2)
    with open(a.out + ".md", "w") as f:
      f.write("\n".join(markdown(rows)) + "\n")


if __name__ == "__main__":
  main()
