"""lnjax: where the normalization goes in a Transformer (Xiong et al., ICML 2020), in JAX/Flax.

The Python API (docs/api.md): lnjax.get_config(name, preset), lnjax.train(config, workdir),
lnjax.load(workdir, checkpoint), lnjax.analyze(workdir, ...), lnjax.compare(workdirs, ...).

Importing lnjax changes nothing in the process and loads no JAX: the API's modules load
on first use. The entry points (lnjax.main, lnjax.analyze, ...) tune glibc's allocator for
XLA:CPU themselves (lnjax/allocator.py).
"""

import importlib

__version__ = "0.1.0"
__all__ = ["get_config", "train", "load", "analyze", "compare"]


def __getattr__(name: str):
  """get_config and load from lnjax.api; train, analyze and compare are the (callable)
  modules of those names, loaded on first use."""
  if name in ("get_config", "load"):
    return getattr(importlib.import_module("lnjax.api"), name)
  if name in ("train", "analyze", "compare"):
    return importlib.import_module(f"lnjax.{name}")
  raise AttributeError(f"module 'lnjax' has no attribute {name!r}")
