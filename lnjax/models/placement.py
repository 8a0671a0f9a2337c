"""Where the norm goes: the one place that knows each `norm_position`.

A Transformer layer is a chain of sub-layers F (self-attention, cross-attention, FFN),
each wrapped in a residual connection. The placements differ only in where the norm
sits around that connection, so each one is a single branch of `residual` below, with
its formula beside it (Xiong et al. 2020, §3.1 and Fig. 1):

  post:  x_{l+1} = LN(x_l + F(x_l))          original Transformer, BERT
  pre:   x_{l+1} = x_l + F(LN(x_l)),  plus one LN on the final output

`begin` turns the embedding into the residual stream, `residual` advances it by one
sub-layer, and `end` turns it into what the output projection reads. Placements that
carry more than one stream (ResiDual) or scale the shortcut (DeepNorm, Admin) add a
branch to each of these three functions and nothing anywhere else.
"""

from typing import Callable

import jax

from lnjax.models import norms

NORM_POSITIONS = ("post", "pre")


def begin(cfg, x_BxTxD: jax.Array):
  """The residual stream entering layer 0."""
  return x_BxTxD


def residual(cfg, name: str, stream, sublayer: Callable, dropout: Callable):
  """Advances the stream by one sub-layer F = `sublayer`, with `dropout` on F's output.

  Must be called inside a Flax module's compact method: the norms it makes become
  that module's children, named `{name}_norm`.
  """
  norm = lambda suffix: norms.make_norm(cfg.norm_kind, cfg.norm_eps, cfg.dtype, f"{name}_{suffix}")
  x = stream
  if cfg.norm_position == "post":
    return norm("norm")(x + dropout(sublayer(x)))  # x = LN(x + F(x))
  if cfg.norm_position == "pre":
    return x + dropout(sublayer(norm("norm")(x)))  # x = x + F(LN(x))
  raise ValueError(f"model.norm_position={cfg.norm_position!r} is not one of: "
                   f"{', '.join(NORM_POSITIONS)}")


def end(cfg, stream, name: str = "final_norm") -> jax.Array:
  """The stream after the last layer, as the output projection (or decoder) reads it."""
  x = stream
  if cfg.norm_position == "post":
    return x  # Every sub-layer already ended in a norm.
  if cfg.norm_position == "pre":
    # Pre-LN's stream is a sum of un-normalized sub-layer outputs; without this final
    # LN its scale grows with depth (REFERENCE §1: a common bug in public code).
    return norms.make_norm(cfg.norm_kind, cfg.norm_eps, cfg.dtype, name)(x)
  raise ValueError(f"model.norm_position={cfg.norm_position!r} is not one of: "
                   f"{', '.join(NORM_POSITIONS)}")
