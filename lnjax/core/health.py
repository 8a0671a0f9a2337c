"""The stability instrument: per-layer health inside the train step, an early warning read
off it, and the 6σ skip-step rule as an optax transform.

Health (`train.health=log|warn`) is computed inside the compiled train step, from what the
step already holds (no second forward or backward pass): for every layer and sub-layer the
RMS of the gradient, of the optimizer update and of the parameters. At log steps a
forward pass of its own (lnjax/core/steps.py's `activation_step`: the step's parameters,
batch and dropout masks) reads the values the model sows into its 'intermediates'
collection (lnjax/models: nothing is computed unless a caller asks for that collection):
the RMS of the residual stream entering each layer, the largest attention logit of each
attention sub-layer, and the output logits' largest value and mean log-partition z. Names
are stable:

  health/layer_3/self_attn/update_rms   health/layer_3/ffn/grad_rms   health/embed/param_rms
  health/layer_3/residual_rms           health/layer_3/self_attn/max_logit
  health/output_logit_max               health/output_z_mean
  (encoder-decoder: health/encoder/layer_0/..., health/decoder/layer_0/cross_attn/...)

Every statistic is a global reduction inside jit, so under data, FSDP or tensor sharding
XLA sums across the shards and the value equals the single-device one.

Why these: large runs report per-layer optimizer-update-norm spikes, larger in the lower
layers, before the loss spikes (marin's 32B run with levanter); Wortsman et al. (arXiv
2309.14322) find attention-logit growth and output-logit divergence at high learning
rates in small models, removed by QK-norm and z-loss. The field's reaction is the skip-step
rule of OLMo-core's SkipStepOptimizer and levanter's optax port: no update when the loss or
the gradient norm is more than 6σ above the mean of a trailing 128-step window
(`skip_spikes` here, `SigmaRule` its host-side twin); PaLM (arXiv 2204.02311 §5.1)
restarted ~100 steps before a spike and skipped ~200-500 batches by hand.
"""

import re
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from lnjax.models import transformer

HEALTH_MODES = ("off", "log", "warn")  # train.health
PREFIX = "health"
_LAYER = re.compile(r"layer_\d+")
_SUBLAYER = re.compile(r"(self_attn|cross_attn|ffn)")  # Its norms and shortcut go with it.
_LAYER_GRAD = re.compile(PREFIX + r"/((?:encoder|decoder)/)?layer_(\d+)/[^/]+/grad_rms")


def _keys(path) -> tuple[str, ...]:
  return tuple(str(k.key) for k in path if isinstance(k, jax.tree_util.DictKey))


def _group(keys: tuple[str, ...]) -> str:
  """A parameter's group: its layer and sub-layer (`layer_0/self_attn`, the sub-layer's
  norms included), or the module holding it outside the layers (`embed`, `final_norm`)."""
  for i, key in enumerate(keys):
    if _LAYER.fullmatch(key):
      sub = _SUBLAYER.match(keys[i + 1]) if i + 1 < len(keys) - 1 else None
      return "/".join(keys[:i + 1] + ((sub.group(1),) if sub else ()))
  return "/".join(keys[:-1]) or keys[-1]


def _per_layer(tree, cfg):
  """Scanned layers (a leading 'layers' axis) as layer_0, layer_1, ...; slicing inside jit."""
  return transformer.unscan_params(tree, cfg) if cfg.scan_layers else tree


def rms_by_group(tree, cfg, stat: str) -> dict[str, jax.Array]:
  """{'health/<group>/<stat>': √(mean of the squares of the group's entries)} of a
  parameter-shaped tree (gradients, updates or parameters); jittable.

  Each leaf is first reduced to the sums of squares along its leading axis, then split
  into layers: a scanned stack's [layers, ...] weight is read by one reduction, never
  sliced. (Slicing first kept a float32 copy of every stacked update on TPU: Llama 2 7B
  on v5p-8 needed 37.65 GB a chip, 32.96 GB since, 32.78 without the statistics;
  `python benchmarks/tpu_plans.py --models=llama7b --slices=v5p-8 --meshes=fsdp
  --remats=nothing_saveable --placements=pre`, 2026-12-05.)"""
  def lead_sums(x):
    x = jnp.square(jnp.asarray(x).astype(jnp.float32))
    return jnp.sum(x, axis=tuple(range(1, x.ndim))) if x.ndim > 1 else x

  def lead_counts(x):  # The entries behind each of lead_sums' values.
    shape = np.shape(x)
    # (Views of one number: no host array as long as the parameter's leading axis.)
    if len(shape) <= 1:
      return np.broadcast_to(np.int64(1), shape)
    return np.broadcast_to(np.prod(shape[1:], dtype=np.int64), shape[:1])

  sq, counts = _per_layer(jax.tree.map(lead_sums, tree), cfg), _per_layer(
      jax.tree.map(lead_counts, tree), cfg)
  sums: dict[str, Any] = {}
  for (path, leaf), n in zip(jax.tree_util.tree_flatten_with_path(sq)[0],
                             jax.tree.leaves(counts)):
    group = _group(_keys(path))
    s, total = sums.get(group, (0.0, 0))
    sums[group] = (s + jnp.sum(leaf), total + int(np.sum(n)))
  # (The count as a float: a group past 2³¹ entries, a 400B model's FFN, overflows int32.)
  return {f"{PREFIX}/{g}/{stat}": jnp.sqrt(s / float(max(n, 1))) for g, (s, n) in sums.items()}


def sown_statistics(intermediates, cfg) -> dict[str, jax.Array]:
  """{'health/<module path>/<name>': value} of the values the model sowed (the last one
  where a module sowed twice); jittable."""
  out = {}
  for path, leaf in jax.tree_util.tree_flatten_with_path(_per_layer(intermediates, cfg))[0]:
    out[f"{PREFIX}/" + "/".join(_keys(path))] = jnp.asarray(leaf, jnp.float32)
  return out


def step_statistics(cfg, params, grads, updates) -> dict[str, jax.Array]:
  """The health/ scalars of every train step (jittable): RMS of gradient, update and
  parameters (those the gradient was taken at) per layer and sub-layer. The sown ones come
  from their own forward pass at log steps (sown_statistics, lnjax/core/steps.py)."""
  stats = {}
  for stat, tree in (("grad_rms", grads), ("update_rms", updates), ("param_rms", params)):
    stats.update(rms_by_group(tree, cfg, stat))
  return stats


# ---- The early warning. -----------------------------------------------------------------

# The statistics the rule watches (name suffixes). The update RMS is read per unit of
# learning rate, so that warm-up and decay do not look like spikes.
WATCHED = ("update_rms", "max_logit", "output_logit_max")


class EarlyWarning:
  """Warns when a watched statistic of some layer exceeds `factor` × the median of its own
  trailing `window` steps (after `min_history` steps of it), once per excursion: a series
  warns again only after it has come back below the threshold. Host-side, deterministic
  (the same metrics give the same warnings on every process and every rerun).

  A ratio to its own median, not a z-score: a layer's update RMS is steady for hundreds of
  steps and then jumps by integer factors before a loss spike, and the median ignores the
  jump itself once it is in the window.

  Defaults chosen on the first 28 runs of benchmarks/early_warning.py (2026-12-02): 6× after
  100 steps warned of as many failures as 3× after 20 and fired 4.5× less often on runs
  that trained (5.0 against 22.4 per 1000 steps). On the grid's 16 later runs, held out
  from that choice: with the vanishing-gradient rule, precision 0.89, recall 1.00, 2.3
  false warnings per 1000 steps (BENCHMARKS.md, "Early warning").
  """

  def __init__(self, factor: float = 6.0, window: int = 100, min_history: int = 100,
               watched: tuple[str, ...] = WATCHED):
    self.factor, self.window, self.min_history, self.watched = factor, window, min_history, watched
    self._history: dict[str, list[float]] = {}
    self._alarmed: set[str] = set()

  def _value(self, name: str, stats: dict, lr: float) -> float | None:
    value = stats[name]
    if name.endswith("update_rms"):
      return value / lr if lr > 0 else None
    return value

  def __call__(self, step: int, stats: dict[str, float], learning_rate: float) -> list[dict]:
    """This step's warnings, largest ratio first: [{'step', 'name', 'value', 'median',
    'ratio', 'line'}]; `stats` holds the step's health/ scalars."""
    warnings = []
    for name in sorted(stats):
      if not name.startswith(PREFIX + "/") or not name.endswith(self.watched):
        continue
      value = self._value(name, stats, learning_rate)
      if value is None or not np.isfinite(value):
        continue
      history = self._history.setdefault(name, [])
      if len(history) >= self.min_history:
        median = float(np.median(history))
        ratio = value / median if median > 0 else 0.0
        if ratio >= self.factor and name not in self._alarmed:
          self._alarmed.add(name)
          w = {"step": step, "name": name, "value": value, "median": median, "ratio": ratio}
          warnings.append({**w, "line": warning_line(w, self.window)})
        elif ratio < self.factor:
          self._alarmed.discard(name)
      history.append(value)
      del history[:-self.window]
    return sorted(warnings, key=lambda w: -w["ratio"])

  def history(self) -> dict:
    """What a checkpoint keeps (JSON), so that a resumed run warns as an uninterrupted one."""
    return {"series": {k: list(v) for k, v in self._history.items()},
            "alarmed": sorted(self._alarmed)}

  def set_history(self, saved: dict) -> None:
    self._history = {k: list(v) for k, v in saved.get("series", {}).items()}
    self._alarmed = set(saved.get("alarmed", []))


def warning_line(w: dict, window: int) -> str:
  """`warning: step 412: layer 0 self_attn update_rms 4.1× its 100-step median; loss may
  diverge`."""
  where = w["name"][len(PREFIX) + 1:].split("/")
  where = [p.replace("layer_", "layer ") for p in where]
  return (f"warning: step {w['step']}: {' '.join(where)} {w['ratio']:.1f}× its {window}-step "
          "median; loss may diverge")


class VanishingGradient:
  """Warns when the gradient reaching a stack's first layer stays below `ratio` × the
  largest layer's gradient (RMS, the layer's sub-layers pooled as the max) for `patience`
  consecutive steps, once per excursion: the lower layers have stopped learning.

  The spike rule above cannot see this failure: nothing jumps. It is how Post-LN without
  warm-up fails at depth (Liu et al. 2020, arXiv 2004.08249, §3: gradients vanish in the
  lower layers of a Post-LN stack): in this project's 12-layer character LM at lr 3e-3 the
  first layer's gradient RMS fell from 1.6e-3 to 1e-12 within 20 steps while the last
  layer's stayed between 3e-4 and 1e-2, and the loss sat at the unigram baseline from step
  10 on (benchmarks/early_warning.py; REPRODUCTION.md). In a Pre-LN stack the gradient
  reaches the first layer undiminished (Xiong et al. 2020, arXiv 2002.04745, §3.3)."""

  def __init__(self, ratio: float = 1e-3, patience: int = 3):
    self.ratio, self.patience = ratio, patience
    self._below: dict[str, int] = {}  # Stack -> consecutive steps below the ratio.
    self._alarmed: set[str] = set()

  @staticmethod
  def layer_gradients(stats: dict[str, float]) -> dict[str, dict[int, float]]:
    """{stack prefix ('', 'encoder/', 'decoder/'): {layer: its largest sub-layer grad RMS}}."""
    stacks: dict[str, dict[int, float]] = {}
    for name, value in stats.items():
      m = _LAYER_GRAD.fullmatch(name)
      if m and np.isfinite(value):
        layers = stacks.setdefault(m.group(1) or "", {})
        layer = int(m.group(2))
        layers[layer] = max(layers.get(layer, 0.0), float(value))
    return stacks

  @classmethod
  def first_layer_ratios(cls, stats: dict[str, float]) -> dict[str, tuple[float, dict]]:
    """{stack prefix: (layer 0's gradient RMS / the largest layer's, {layer: grad RMS})} of
    the stacks with a layer 0 and another layer: what the rule compares with `ratio`."""
    out = {}
    for stack, layers in cls.layer_gradients(stats).items():
      if len(layers) >= 2 and 0 in layers:
        top = max(layers.values())
        out[stack] = (layers[0] / top if top > 0 else 1.0, layers)
    return out

  def __call__(self, step: int, stats: dict[str, float]) -> list[dict]:
    """This step's warnings: [{'step', 'name' (the first layer's grad_rms), 'value',
    'top' (the largest layer's), 'ratio', 'line'}]."""
    warnings = []
    for stack, (ratio, layers) in sorted(self.first_layer_ratios(stats).items()):
      below = self._below[stack] = self._below.get(stack, 0) + 1 if ratio < self.ratio else 0
      if below == 0:
        self._alarmed.discard(stack)
      elif below >= self.patience and stack not in self._alarmed:
        self._alarmed.add(stack)
        last = max(layers, key=layers.get)
        warnings.append({
            "step": step, "name": f"{PREFIX}/{stack}layer_0/grad_rms", "value": layers[0],
            "top": layers[last], "ratio": ratio,
            "line": (f"warning: step {step}: {stack.replace('/', ' ')}layer 0 grad_rms "
                     f"{layers[0]:.2g} is {ratio:.1e}× layer {last}'s for {below} steps; the "
                     "lower layers have stopped learning (the loss may stall at the "
                     "unigram baseline)")})
    return warnings

  def history(self) -> dict:
    return {"below": dict(self._below), "alarmed": sorted(self._alarmed)}

  def set_history(self, saved: dict) -> None:
    self._below = dict(saved.get("below", {}))
    self._alarmed = set(saved.get("alarmed", []))


class SigmaRule:
  """The field's spike rule, host-side: a value more than `num_sigma` standard deviations
  above the mean of its trailing `window` values (with at least half a window of history)
  is a spike. Applied to the loss and the global gradient norm; every value enters the
  window after the decision (OLMo-core's SkipStepOptimizer, levanter's SkipStepConfig)."""

  def __init__(self, window: int = 128, num_sigma: float = 6.0):
    self.window, self.num_sigma = window, num_sigma
    self._history: dict[str, list[float]] = {}

  def __call__(self, **values: float) -> list[str]:
    """The names of the values that spike."""
    spikes = []
    for name, value in values.items():
      history = self._history.setdefault(name, [])
      if not np.isfinite(value):
        spikes.append(name)  # (Kept out of the window: it would poison the mean for good.)
        continue
      if len(history) >= max(2, self.window // 2):
        mean, std = float(np.mean(history)), max(float(np.std(history)), 1e-6)
        if value > mean + self.num_sigma * std:
          spikes.append(name)
      history.append(float(value))
      del history[:-self.window]
    return spikes

  def history(self) -> dict:
    return {k: list(v) for k, v in self._history.items()}

  def set_history(self, saved: dict) -> None:
    self._history = {k: list(v) for k, v in saved.items()}


# ---- The skip-step rule inside the optimizer. ----------------------------------------------

class SkipSpikesState(NamedTuple):
  inner_state: Any
  losses: jax.Array  # [window] the last losses (a ring buffer) ...
  grad_norms: jax.Array  # [window] ... and global gradient norms
  count: jax.Array  # values seen so far (the ring's next slot is count % window)
  skipped: jax.Array  # updates skipped so far


def skip_spikes(inner: optax.GradientTransformation, window: int = 128,
                num_sigma: float = 6.0) -> optax.GradientTransformationExtraArgs:
  """`inner`, except that a step whose loss (`value=` of update) or gradient norm is more
  than `num_sigma` σ above the mean of the trailing `window` steps (with at least half a
  window of history), or whose loss or norm is not finite, makes no update and leaves
  `inner`'s state as it was. Every step's finite values enter the window after the
  decision."""
  inner = optax.with_extra_args_support(inner)

  def init(params):
    return SkipSpikesState(inner.init(params), jnp.zeros((window,), jnp.float32),
                           jnp.zeros((window,), jnp.float32), jnp.zeros((), jnp.int32),
                           jnp.zeros((), jnp.int32))

  def update(updates, state, params=None, *, value, **extra_args):
    loss, grad_norm = jnp.asarray(value, jnp.float32), optax.tree.norm(updates)
    filled = jnp.arange(window) < state.count

    def spikes(x, history):
      n = jnp.maximum(jnp.sum(filled), 1)
      mean = jnp.sum(jnp.where(filled, history, 0.0)) / n
      std = jnp.sqrt(jnp.sum(jnp.where(filled, jnp.square(history - mean), 0.0)) / n)
      return x > mean + num_sigma * jnp.maximum(std, 1e-6)

    finite = jnp.isfinite(loss) & jnp.isfinite(grad_norm)
    skip = ~finite | (state.count >= max(2, window // 2)) & (
        spikes(loss, state.losses) | spikes(grad_norm, state.grad_norms))
    new_updates, new_inner = inner.update(updates, state.inner_state, params, **extra_args)
    keep = lambda old, new: jnp.where(skip, old, new)
    # A non-finite value stays out of the window (it would poison the mean for good).
    slot = state.count % window
    record = lambda history, x: jnp.where(finite, history.at[slot].set(x), history)
    return (jax.tree.map(lambda u: jnp.where(skip, jnp.zeros_like(u), u), new_updates),
            SkipSpikesState(jax.tree.map(keep, state.inner_state, new_inner),
                            record(state.losses, loss), record(state.grad_norms, grad_norm),
                            state.count + finite.astype(jnp.int32),
                            state.skipped + skip.astype(jnp.int32)))

  return optax.GradientTransformationExtraArgs(init, update)


def skipped_steps(opt_state) -> jax.Array | None:
  """The count of skipped updates held by a `skip_spikes` state, else None."""
  return opt_state.skipped if isinstance(opt_state, SkipSpikesState) else None
