"""The tensors of a Hugging Face folder, read one at a time: model.safetensors, or the shards
model.safetensors.index.json names.

A safetensors file is an 8-byte little-endian header length N, N bytes of JSON
({name: {"dtype": "BF16", "shape": [...], "data_offsets": [begin, end]}, "__metadata__": ...},
offsets counted from the end of the header), then the raw little-endian tensor bytes
(huggingface/safetensors, README "Format"). `TensorIndex` reads the headers only; `read`
reads one tensor's bytes with a positioned read into a fresh numpy array of the stored
dtype. Nothing is memory-mapped, so a bfloat16 checkpoint costs its own bytes once, tensor
by tensor, and never a float32 copy of the whole model (benchmarks/hf_import_rss.py).
"""

import json
import os
import struct

import numpy as np

from lnjax.core import errors

WEIGHTS_FILE, INDEX_FILE = "model.safetensors", "model.safetensors.index.json"
_OTHER_FORMATS = ("pytorch_model.bin", "tf_model.h5", "flax_model.msgpack")
_MAX_HEADER = 100 * 2**20  # safetensors' own limit on the JSON header.


class HFError(errors.LnjaxError):
  """A Hugging Face folder, config or weight file lnjax cannot import or write."""


def _dtypes() -> dict:
  import ml_dtypes

  return {"F64": np.float64, "F32": np.float32, "F16": np.float16, "BF16": ml_dtypes.bfloat16,
          "I64": np.int64, "I32": np.int32, "I16": np.int16, "I8": np.int8, "U8": np.uint8,
          "BOOL": np.bool_}


class TensorIndex:
  """{tensor name: (file, dtype, shape, byte offset)} over a folder's safetensors files."""

  def __init__(self, folder: str):
    self.folder, self.entries = folder, {}
    for name in _files(folder):
      path = os.path.join(folder, name)
      for key, entry in _header(path).items():
        self.entries[key] = (path, *entry)

  def __contains__(self, name: str) -> bool:
    return name in self.entries

  def __iter__(self):
    return iter(sorted(self.entries))

  def shape(self, name: str) -> tuple[int, ...]:
    return self.entries[name][2]

  def dtype(self, name: str):
    return self.entries[name][1]

  def file(self, name: str) -> str:
    return self.entries[name][0]

  def nbytes(self) -> int:
    return sum(int(np.prod(s)) * np.dtype(d).itemsize for _, d, s, _ in self.entries.values())

  def read(self, name: str) -> np.ndarray:
    path, dtype, shape, offset = self.entries[name]
    out = np.empty(shape, dtype)
    with open(path, "rb", buffering=0) as f:
      view = memoryview(out.reshape(-1).view(np.uint8))
      done = 0
      while done < out.nbytes:  # (readinto may return less than asked)
        f.seek(offset + done)
        n = f.readinto(view[done:])
        if not n:
          raise HFError(f"{path} is not a readable safetensors file, truncated or corrupt "
                        f"(tensor {name!r} ends past the end of the file)")
        done += n
    return out


def _files(folder: str) -> list[str]:
  index = os.path.join(folder, INDEX_FILE)
  if os.path.isfile(index):
    try:
      with open(index, encoding="utf-8") as f:
        files = sorted(set(json.load(f)["weight_map"].values()))
      if not all(isinstance(n, str) and n and os.sep not in n for n in files):
        raise ValueError("weight_map's values must be file names in the folder")
    except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError, AttributeError) as e:
      raise HFError(f"{index} is not a readable safetensors index ({e})") from None
    for name in files:
      if not os.path.isfile(os.path.join(folder, name)):
        raise HFError(f"{os.path.join(folder, name)} is missing (named by {INDEX_FILE})")
    return files
  if os.path.isfile(os.path.join(folder, WEIGHTS_FILE)):
    return [WEIGHTS_FILE]
  other = [f for f in _OTHER_FORMATS if os.path.isfile(os.path.join(folder, f))]
  hint = (f" (lnjax reads safetensors only, not {other[0]}: re-save it with transformers' "
          "save_pretrained)") if other else ""
  raise HFError(f"{folder} has no {WEIGHTS_FILE}{hint}")


def _header(path: str) -> dict:
  """{name: (dtype, shape, absolute byte offset)} of one safetensors file, checked against
  the file's size."""
  bad = lambda why: HFError(f"{path} is not a readable safetensors file, truncated or "
                            f"corrupt ({why})")
  size = os.path.getsize(path)
  with open(path, "rb") as f:
    head = f.read(8)
    if len(head) < 8:
      raise bad(f"{size} bytes: no header")
    (n,) = struct.unpack("<Q", head)
    if n > min(_MAX_HEADER, size - 8):
      raise bad(f"a header of {n} bytes in a file of {size}")
    try:
      header = json.loads(f.read(n))
    except (UnicodeDecodeError, ValueError) as e:
      raise bad(f"header: {e}") from None
  if not isinstance(header, dict):
    raise bad("the header is not a JSON object")
  dtypes, out = _dtypes(), {}
  for name, entry in header.items():
    if name == "__metadata__":
      continue
    try:
      dtype, shape = dtypes[entry["dtype"]], tuple(int(s) for s in entry["shape"])
      begin, end = (int(o) for o in entry["data_offsets"])
    except (KeyError, TypeError, ValueError) as e:
      raise bad(f"tensor {name!r}: {type(e).__name__} {e}") from None
    if end - begin != int(np.prod(shape)) * np.dtype(dtype).itemsize or begin < 0:
      raise bad(f"tensor {name!r}: offsets {begin}..{end} do not hold shape {shape}")
    if 8 + n + end > size:
      raise bad(f"tensor {name!r} ends at byte {8 + n + end} of {size}")
    out[name] = (dtype, shape, 8 + n + begin)
  return out


def write(output: str, tensors: dict[str, np.ndarray]) -> None:
  """`tensors` as output/model.safetensors (safetensors' own writer; metadata format=pt, as
  transformers' save_pretrained writes it)."""
  from safetensors.numpy import save_file

  os.makedirs(output, exist_ok=True)
  save_file(tensors, os.path.join(output, WEIGHTS_FILE), metadata={"format": "pt"})
