"""MaxText's own train_compile for Llama-2-7B on a TPU topology, run in MaxText's venv
(benchmarks/maxtext_peer.sh), its per-chip memory and FLOPs as JSON: the peer of
`lnjax compile` in BENCHMARKS.md ("TPU plans").

  bash benchmarks/maxtext_peer.sh run v5p-8 fsdp /tmp/maxtext_v5p8.json [KEY=VALUE ...]

MaxText's settings, as close as it gets to lnjax's Llama-style 7B plan: llama2-7b, fsdp
over every chip (ici_fsdp_parallelism=-1) or data (ici_data_parallelism=-1), bf16
compute over fp32 weights, remat_policy=full (lnjax's nothing_saveable), scanned layers,
dot-product attention (no Pallas kernel: the same arithmetic as lnjax's plain attention),
AdamW, the batch and length of the lnjax plan (per_device_batch_size, max_target_length).

XLA counts a scanned loop's body once, so MaxText's FLOPs of the scanned 32 layers are one
layer's plus the rest. The like-for-like step FLOPs come from unrolled probes, as
lnjax/core/plan.py's depth extrapolation does (f(32) = f(1) + 31·(f(2) - f(1))):

  MAXTEXT_SCAN=false bash benchmarks/maxtext_peer.sh run v5p-8 fsdp /tmp/l1.json \
      base_num_decoder_layers=1 override_model_config=true      # and =2
"""

import json
import os
import re
import subprocess
import sys
import time


def main(topology: str, mesh: str, out: str, *extra: str) -> None:
  axis = {"fsdp": "ici_fsdp_parallelism=-1", "data": "ici_data_parallelism=-1 "
          "ici_fsdp_parallelism=1"}[mesh]
  import maxtext  # (Here only to find its configs folder.)
  base = os.path.join(os.path.dirname(maxtext.__file__), "configs", "base.yml")
  args = [base, "model_name=llama2-7b", f"compile_topology={topology}",
          "compile_topology_num_slices=1", "run_name=lnjax_peer", "dataset_type=synthetic",
          "remat_policy=full", "scan_layers=" + os.environ.get("MAXTEXT_SCAN", "true"), "attention=dot_product",
          "dtype=bfloat16", "weight_dtype=float32", "per_device_batch_size=1",
          "max_target_length=2048", "enable_checkpointing=false", *axis.split(), *extra]
  env = {**os.environ, "ALLOW_MULTIPLE_LIBTPU_LOAD": "1", "TPU_SKIP_MDS_QUERY": "1",
         "TPU_WORKER_HOSTNAMES": "localhost", "JAX_PLATFORMS": "cpu"}
  t0 = time.perf_counter()
  r = subprocess.run([sys.executable, "-m", "maxtext.trainers.pre_train.train_compile", *args],
                     capture_output=True, text=True, env=env)
  seconds = time.perf_counter() - t0
  text = r.stdout + r.stderr
  result = {"topology": topology, "mesh": mesh, "args": args[1:], "returncode": r.returncode,
            "wall_seconds": seconds}
  memory = re.search(r"Memory analysis: CompiledMemoryStats\((.*?)\)", text)
  cost = re.search(r"Cost analysis: (\{.*?\})\s*$", text, re.M)
  if memory:
    result["memory"] = {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", memory.group(1))}
    m = result["memory"]
    result["hbm_total_bytes"] = (m["argument_size_in_bytes"] + m["output_size_in_bytes"]
                                 - m["alias_size_in_bytes"] + m["temp_size_in_bytes"]
                                 + m["generated_code_size_in_bytes"])
  if cost:
    flops = re.search(r"'flops': ([\d.e+]+)", cost.group(1))
    accessed = re.search(r"'bytes accessed': ([\d.e+]+)", cost.group(1))
    result["flops"] = float(flops.group(1)) if flops else None
    result["hbm_bytes_accessed"] = float(accessed.group(1)) if accessed else None
  if r.returncode:
    result["error"] = [l for l in text.splitlines() if l.strip()][-15:]
  with open(out, "w") as f:
    json.dump(result, f, indent=2)
  print(json.dumps({k: v for k, v in result.items() if k != "args"}, indent=2)[:3000])


if __name__ == "__main__":
  main(*sys.argv[1:])
