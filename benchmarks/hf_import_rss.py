"""Peak resident memory of `lnjax analyze --hf` on a 1B-shape bfloat16 checkpoint, against
its weight bytes (issue 59: below 2x).

  python benchmarks/hf_import_rss.py [--folder /tmp/llama_1b] [--shape 1b|small] [--read_only]

Writes (once) a LlamaForCausalLM folder of Llama 3.2 1B's shape (d_model 2048, 16 layers,
32 heads, 8 K/V heads, FFN 8192, vocabulary 128256, tied; 1.24e9 parameters) with random
bfloat16 weights in two safetensors shards and an index, and 200 random token ids; then
runs `python -m lnjax.cli.analyze --hf=FOLDER --token_ids=... --batches=1` under
benchmarks/rss_trace.py and prints the peak RSS beside the weight bytes. The folder's
max_position_embeddings is 32, so the analysis scores windows of 32 tokens (the shape of
every weight is the 1B model's; only the window is short, to keep the CPU time small).
`--shape small` writes a 4-layer, d_model 512 model instead (a quick check of the script),
`--shape mid` an 8-layer, d_model 1024 one of 0.35 GiB (about a minute; its ratio is
dominated by the process's own 0.7 GiB).
`--read_only` measures lnjax.hf.checkpoint.read_folder alone: the peak RSS growth while
the folder is read (VmHWM reset through /proc/self/clear_refs after JAX has started).
"""

import argparse
import json
import os
import re
import subprocess
import sys

import numpy as np

SHAPES = {"1b": dict(hidden_size=2048, num_hidden_layers=16, num_attention_heads=32,
                     num_key_value_heads=8, intermediate_size=8192, vocab_size=128256),
          "mid": dict(hidden_size=1024, num_hidden_layers=8, num_attention_heads=16,
                      num_key_value_heads=4, intermediate_size=4096, vocab_size=64128),
          "small": dict(hidden_size=512, num_hidden_layers=4, num_attention_heads=8,
                        num_key_value_heads=2, intermediate_size=2048, vocab_size=32000)}


def tensor_shapes(c: dict) -> dict[str, tuple[int, ...]]:
  d, f, hd = c["hidden_size"], c["intermediate_size"], c["hidden_size"] // c["num_attention_heads"]
  kv = c["num_key_value_heads"] * hd
  shapes = {"model.embed_tokens.weight": (c["vocab_size"], d), "model.norm.weight": (d,)}
  for i in range(c["num_hidden_layers"]):
    p = f"model.layers.{i}."
    shapes.update({p + "self_attn.q_proj.weight": (d, d), p + "self_attn.k_proj.weight": (kv, d),
                   p + "self_attn.v_proj.weight": (kv, d), p + "self_attn.o_proj.weight": (d, d),
                   p + "mlp.gate_proj.weight": (f, d), p + "mlp.up_proj.weight": (f, d),
                   p + "mlp.down_proj.weight": (d, f), p + "input_layernorm.weight": (d,),
                   p + "post_attention_layernorm.weight": (d,)})
  return shapes


def write_folder(folder: str, shape: str) -> int:
  """The random bfloat16 folder (two shards, one written at a time); its weight bytes."""
  import ml_dtypes
  from safetensors.numpy import save_file

  config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", **SHAPES[shape],
            "max_position_embeddings": 32, "rms_norm_eps": 1e-5, "hidden_act": "silu",
            "tie_word_embeddings": True, "rope_theta": 500000.0, "dtype": "bfloat16"}
  shapes = tensor_shapes(config)
  names = sorted(shapes)
  shards = {"model-00001-of-00002.safetensors": names[: len(names) // 2],
            "model-00002-of-00002.safetensors": names[len(names) // 2:]}
  nbytes = sum(2 * int(np.prod(s)) for s in shapes.values())
  if os.path.isfile(os.path.join(folder, "model.safetensors.index.json")):
    return nbytes
  os.makedirs(folder, exist_ok=True)
  rng = np.random.default_rng(0)
  for shard, keys in shards.items():
    save_file({k: (rng.standard_normal(shapes[k], np.float32) * 0.02).astype(ml_dtypes.bfloat16)
               for k in keys}, os.path.join(folder, shard), metadata={"format": "pt"})
  with open(os.path.join(folder, "model.safetensors.index.json"), "w") as f:
    json.dump({"metadata": {"total_size": nbytes},
               "weight_map": {k: s for s, keys in shards.items() for k in keys}}, f)
  with open(os.path.join(folder, "config.json"), "w") as f:
    json.dump(config, f, indent=1)
  return nbytes


# The child that measures a read: argv folder [dtype]; prints the peak RSS growth, the
# process peak (bytes) and the parameters' dtype (tests/test_hf_modern.py runs it too).
READ_CHILD = r"""
import sys, jax, numpy as np
jax.device_put(np.ones(4)).block_until_ready()  # JAX and its CPU client started
from lnjax.hf import checkpoint as hf
def status(key):
  for line in open("/proc/self/status"):
    if line.startswith(key):
      return int(line.split()[1]) * 1024
before = status("VmRSS:")
with open("/proc/self/clear_refs", "w") as f:
  f.write("5")  # VmHWM := VmRSS (Linux)
imported = hf.read_folder(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else None)
jax.tree.map(lambda x: x.block_until_ready(), imported.params)
print(status("VmHWM:") - before, status("VmHWM:"), imported.cfg.dtype)
"""


def main():
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--folder", default="/tmp/lnjax_llama_1b_bf16")
  p.add_argument("--shape", default="1b", choices=sorted(SHAPES))
  p.add_argument("--read_only", action="store_true")
  args = p.parse_args()
  nbytes = write_folder(args.folder, args.shape)
  if args.read_only:
    out = subprocess.run([sys.executable, "-c", READ_CHILD, args.folder], capture_output=True,
                         text=True, check=True)
    growth, peak, dtype = out.stdout.split()
    print(f"weights {nbytes / 2**30:.2f} GiB (bfloat16); read_folder: peak RSS growth "
          f"{int(growth) / 2**30:.2f} GiB = {int(growth) / nbytes:.2f}x the weight bytes, "
          f"process peak {int(peak) / 2**30:.2f} GiB, parameters in {dtype}")
    return
  ids = os.path.join(args.folder, "ids.txt")
  with open(ids, "w") as f:
    vocab = SHAPES[args.shape]["vocab_size"]
    f.write(" ".join(map(str, np.random.default_rng(1).integers(0, vocab, 200))))
  here = os.path.dirname(os.path.abspath(__file__))
  command = [sys.executable, os.path.join(here, "rss_trace.py"), "--print_every", "10", "--",
             sys.executable, "-m", "lnjax.cli.analyze", f"--hf={args.folder}",
             f"--token_ids={ids}", "--batches=1", f"--output={args.folder}_report"]
  print("$", " ".join(command), flush=True)
  out = subprocess.run(command, capture_output=True, text=True)
  print(out.stdout[-3000:], out.stderr[-2000:])
  peak = re.search(r"peak RSS (\d+) MiB", out.stdout)
  if out.returncode or not peak:
    sys.exit(f"the analysis failed (exit {out.returncode})")
  peak_bytes = int(peak.group(1)) * 2**20
  print(f"weights {nbytes / 2**30:.2f} GiB (bfloat16), peak RSS {peak_bytes / 2**30:.2f} GiB: "
        f"{peak_bytes / nbytes:.2f}x the weight bytes")


if __name__ == "__main__":
  main()
