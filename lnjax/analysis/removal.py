"""The layer-removal profile: how much the loss rises when one layer's block is skipped.

Skipping layer i passes its input stream on unchanged (x_{i+1} = x_i), for Pre-LN both
residual sub-layers and for Post-LN their norms too. It is computed as the same model one
layer shallower, with layers i+1.. moved down one place: one compilation serves every i.
This holds for placements whose blocks do not depend on their index or on the depth
(`INDEPENDENT_OF_DEPTH`); Mix-LN places layers by index and DeepNorm's α, β depend on L,
and a cycle of local and global layers (`model.attention_pattern`) gives each index its own
window.
(Cf. Gromov et al. 2024, arXiv 2403.17887, on pruning deep layers of pretrained LMs.)
"""

import dataclasses
import re
from collections.abc import Mapping

import jax

from lnjax.analysis import probes

INDEPENDENT_OF_DEPTH = ("pre", "post", "sandwich", "peri", "normformer", "b2t", "hybridnorm",
                        "derf")
_LAYER = re.compile(r"layer_(\d+)")


def without_layer(params, index: int):
  """The parameters with layer `index` of the (single) stack removed and later layers
  renumbered down."""
  if not isinstance(params, Mapping):
    return params
  if "layer_0" in params:
    out = {}
    for key, value in params.items():
      m = _LAYER.fullmatch(key)
      if m is None:
        out[key] = value
      elif int(m.group(1)) != index:
        j = int(m.group(1))
        out[f"layer_{j - 1 if j > index else j}"] = value
    return out
  return {k: without_layer(v, index) for k, v in params.items()}


def layer_removal(setup, params, batches) -> dict:
  """{'loss': the full model's mean NLL, 'increase': [loss(without layer i) - loss]}:
  None for a one-layer model, a placement outside INDEPENDENT_OF_DEPTH or layers whose
  sliding windows differ."""
  cfg = setup.model.cfg
  full = float(jax.jit(lambda p: probes.mean_loss(p, setup, batches))(params))
  if (cfg.num_layers < 2 or cfg.norm_position not in INDEPENDENT_OF_DEPTH
      or len(set(cfg.layer_windows())) > 1):
    return {"loss": full, "increase": None}
  shallower = dataclasses.replace(
      setup, model=setup.model.clone(cfg=dataclasses.replace(cfg, num_layers=cfg.num_layers - 1)))
  loss = jax.jit(lambda p: probes.mean_loss(p, shallower, batches))
  return {"loss": full,
          "increase": [float(loss(without_layer(params, i))) - full
                       for i in range(cfg.num_layers)]}
