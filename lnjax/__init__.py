"""lnjax: where the normalization goes in a Transformer (Xiong et al., ICML 2020), in JAX/Flax.

The Python API (docs/api.md): lnjax.get_config(name, preset), lnjax.train(config, workdir),
lnjax.load(workdir, checkpoint), lnjax.analyze(workdir, ...), lnjax.compare(workdirs, ...).

Importing lnjax changes nothing in the process and loads no JAX: the API's modules load
on first use. The commands (lnjax.main, lnjax/cli/) tune glibc's allocator for XLA:CPU
themselves (lnjax/core/allocator.py).

The folders are the layers: core/ (config sections, run, state, checkpoints, the loop and
its hooks), models/, tasks/, data/, inference/ (decode, evaluate, translate, export),
analysis/, hf/ (Hugging Face checkpoints), sweep/, configs/, and cli/ (every command).
"""

import importlib

__version__ = "0.1.0"
__all__ = ["get_config", "train", "load", "analyze", "compare"]


def __getattr__(name: str):
  """The API's functions, from lnjax.api, loaded on first use."""
  if name in __all__:
    return getattr(importlib.import_module("lnjax.api"), name)
  raise AttributeError(f"module 'lnjax' has no attribute {name!r}")
