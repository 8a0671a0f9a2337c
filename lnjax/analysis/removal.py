"""The layer-removal profile: how much the loss rises when one layer's block is skipped.

Skipping layer i passes its input stream on unchanged (x_{i+1} = x_i), for Pre-LN both
residual sub-layers and for Post-LN their norms too. It is computed as the same model one
layer shallower, with layers i+1.. moved down one place: one compilation serves every i.
This holds for placements whose blocks do not depend on their index or on the depth
(`INDEPENDENT_OF_DEPTH`); Mix-LN places layers by index and DeepNorm's α, β depend on L.
Local and global attention layers (`model.attention_pattern`, which gives each index its
own window) keep their own kind when they move down: one compilation per pattern.
(Cf. Gromov et al. 2024, arXiv 2403.17887, on pruning deep layers of pretrained LMs.)
"""

import dataclasses
import re
from collections.abc import Mapping

import jax

from lnjax.analysis import probes

INDEPENDENT_OF_DEPTH = ("pre", "post", "sandwich", "peri", "normformer", "b2t", "hybridnorm",
                        "derf", "olmo2")
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
  None for a one-layer model or a placement outside INDEPENDENT_OF_DEPTH."""
  cfg = setup.model.cfg
  full = float(jax.jit(lambda p: probes.mean_loss(p, setup, batches))(params))
  if cfg.num_layers < 2 or cfg.norm_position not in INDEPENDENT_OF_DEPTH:
    return {"loss": full, "increase": None}
  losses = {}  # One compilation per attention pattern of the shallower model.

  def loss_without(i):
    pattern = _pattern_without(cfg, i)
    if pattern not in losses:
      fields = {"attention_pattern": pattern} if pattern else {}
      if pattern and "local" not in pattern.split(","):  # (only global layers left)
        fields["sliding_window"] = 0
      fewer = dataclasses.replace(cfg, num_layers=cfg.num_layers - 1, **fields)
      shallower = dataclasses.replace(setup, model=setup.model.clone(cfg=fewer))
      losses[pattern] = jax.jit(lambda p, s=shallower: probes.mean_loss(p, s, batches))
    return float(losses[pattern](without_layer(params, i)))

  return {"loss": full, "increase": [loss_without(i) - full for i in range(cfg.num_layers)]}


def _pattern_without(cfg, index: int) -> str:
  """The shallower model's attention pattern: every later layer keeps its own local or
  global attention (model.attention_pattern, a cycle over the layers) when it moves down
  one place; '' for a model whose layers all attend alike."""
  cycle = getattr(cfg, "attention_pattern", "global").split(",")
  if len(set(cycle)) == 1:
    return ""
  kinds = [cycle[i % len(cycle)] for i in range(cfg.num_layers)]
  return ",".join(kinds[:index] + kinds[index + 1:])
