"""What every figure lnjax writes shares: readable names, units, integer ticks, a setup line.

Labels: `placement_label("post")` is "Post-LN" (the names of Xiong et al. 2020,
arXiv 2002.04745, and of each later placement's paper); `legend_label(overrides)` turns
run overrides ({"model.norm_position": "post", "opt.warmup_steps": 500}) into
"Post-LN, warm-up 500"; `placement_color("post")` is its colour in every figure.
`setup_caption(config, ...)` is the one line under a figure
(task, model size, steps, seeds); `add_caption` puts it there. `mean_band` draws the mean
over seeds with the min–max band when there are several; `save` writes the PNG.
matplotlib is imported by the functions that draw only: importing this module stays light.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

# Legend names of the placements (models.NORM_POSITIONS).
PLACEMENT_LABELS = {
    "post": "Post-LN", "pre": "Pre-LN", "sandwich": "Sandwich-LN", "peri": "Peri-LN",
    "deepnorm": "DeepNorm", "normformer": "NormFormer", "resi_dual": "ResiDual",
    "admin": "Admin", "mix": "Mix-LN", "b2t": "B2T", "dyt": "DyT",
    "lns": "LayerNorm Scaling", "olmo2": "OLMo 2", "ngpt": "nGPT", "hybridnorm": "HybridNorm",
    "derf": "Derf"}
# Each placement's colour, the same in every figure: matplotlib's ten default colours
# (tab10), then six darker ones, so no two of the 16 share one.
PLACEMENT_COLORS = dict(zip(PLACEMENT_LABELS, (
    "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
    "#bcbd22", "#17becf", "#000000", "#e6ab02", "#000080", "#800000", "#006400", "#8b008b")))
_COLORS_BY_LABEL = {PLACEMENT_LABELS[n]: c for n, c in PLACEMENT_COLORS.items()}
TASK_LABELS = {"lm": "language model", "translation": "translation",
               "mlm": "masked language model", "glue": "GLUE fine-tuning"}
LOSS_UNIT = "nats/token"  # Every loss lnjax logs: mean NLL per real target token.


def placement_label(name: str) -> str:
  """'Post-LN' for 'post'; a name lnjax does not know is shown as given."""
  return PLACEMENT_LABELS.get(name, str(name))


def placement_color(name: str, k: int = 0) -> str:
  """A placement's colour in every figure, by its name ("post") or its label ("Post-LN");
  one lnjax does not know takes matplotlib's k-th colour."""
  return PLACEMENT_COLORS.get(name) or _COLORS_BY_LABEL.get(name) or f"C{k % 10}"


def task_label(task: str) -> str:
  return TASK_LABELS.get(task, str(task))


def _num(v: Any) -> str:
  return f"{v:g}" if isinstance(v, float) else str(v)


def layers(n: int) -> str:
  return f"{n} layer{'s' if n != 1 else ''}"


def _warmup(v: Any) -> str:
  return f"warm-up {_num(v)}" if v else "no warm-up"


# Override key -> its legend text; other keys read "<last part of the key> <value>".
_OVERRIDE_LABELS = {
    "model.norm_position": placement_label,
    "opt.warmup_steps": _warmup,
    "opt.learning_rate": lambda v: f"lr {_num(v)}",
    "model.num_layers": lambda v: layers(v),
    "model.d_model": lambda v: f"d_model {v}",
    "opt.name": lambda v: str(v),
    "seed": lambda v: f"seed {v}",
}


def override_label(key: str, value: Any) -> str:
  fmt = _OVERRIDE_LABELS.get(key)
  if fmt is not None:
    return fmt(value)
  return f"{key.rsplit('.', 1)[-1].replace('_', ' ')} {_num(value)}"


def legend_label(overrides: Mapping[str, Any], drop: Sequence[str] = ()) -> str:
  """'Post-LN, warm-up 500, lr 0.001' for a run's overrides (keys in `drop` left out)."""
  parts = [override_label(k, v) for k, v in overrides.items() if k not in drop]
  return ", ".join(parts) or "base config"


def run_label(config: Mapping[str, Any]) -> str:
  """A run's legend from its config.json: its placement and warm-up ('Pre-LN, no warm-up')."""
  model, opt = config.get("model", {}), config.get("opt", {})
  parts = []
  if "norm_position" in model:
    parts.append(placement_label(model["norm_position"]))
  if "warmup_steps" in opt:
    parts.append(_warmup(opt["warmup_steps"]))
  return ", ".join(parts)


def setup_caption(config: Mapping[str, Any] | None = None, *, steps: int | None = None,
                  seeds: int | None = None, extra: str = "") -> str:
  """One line: 'language model, 4 layers, d_model 128; 1000 steps; 3 seeds; ...'."""
  config = config or {}
  model, parts = config.get("model", {}), []
  size = []
  if config.get("task"):
    size.append(task_label(config["task"]))
  if model.get("num_layers"):
    size.append(layers(model["num_layers"]))
  if model.get("d_model"):
    size.append(f"d_model {model['d_model']}")
  if size:
    parts.append(", ".join(size))
  if steps is None:
    steps = config.get("train", {}).get("num_steps")
  if steps:
    parts.append(f"{steps:,} steps")
  if seeds:
    parts.append(f"{seeds} seed{'s' if seeds != 1 else ''}"
                 + (" (line: mean, band: min–max)" if seeds > 1 else ""))
  if extra:
    parts.append(extra)
  return "; ".join(parts)


def short_path(path: str, width: int = 48) -> str:
  """A path as a figure names its model or run: whole when short, else its last parts
  after '…' ('…/sweeps/lm/post_w0')."""
  path = str(path).rstrip("/") or "/"
  if len(path) <= width:
    return path
  parts, tail = path.split("/"), ""
  for part in reversed(parts):
    if tail and len(part) + len(tail) + 2 > width:
      break
    tail = f"{part}/{tail}" if tail else part
  return f"…/{tail}"


def add_caption(fig, text: str) -> None:
  """The setup line (or lines, one per '\n') under the figure's axes, each wrapped to the
  figure's width (call after tight_layout)."""
  if not text:
    return
  import textwrap

  # 8-point DejaVu Sans: at most about 13 characters an inch, a line 0.135 in high.
  width = max(30, int(fig.get_figwidth() * 13))
  lines = [wrapped for line in text.split("\n") for wrapped in textwrap.wrap(line, width)]
  fig.text(0.5, 0.01, "\n".join(lines), ha="center", va="bottom", fontsize=8, color="#333333")
  # tight_layout left room for the x labels; the caption's lines go below them.
  room = 0.15 + 0.135 * len(lines)
  fig.subplots_adjust(bottom=min(0.6, fig.subplotpars.bottom + room / fig.get_figheight()))


def save(fig, path: str, dpi: int = 110):
  """Writes `fig` as a PNG to `path` (a local path or a bucket's), closes it, returns it."""
  import io

  import matplotlib.pyplot as plt

  from lnjax.core import fileio

  png = io.BytesIO()
  fig.savefig(png, format="png", dpi=dpi)
  plt.close(fig)
  fileio.write_bytes(path, png.getvalue())
  return fig


def plain_log_ticks(ax) -> None:
  """Log axes labelled 2, 3, 0.5, 0.01, 20000 (not 2×10⁰, 1e−02 or 2e+04): matplotlib's
  LogFormatter writes every tick below 1 or above 10⁴ in exponent form. Minor ticks are
  labelled as the axis has room: all of them within half a decade, those at 2, 3 and
  5 × 10ᵏ within two (70, 80, 90, 100 would overlap), none beyond."""
  import math

  from matplotlib.ticker import FuncFormatter

  plain = FuncFormatter(lambda v, _: f"{v:g}" if v > 0 else "")

  def minor_formatter(axis):
    def label(v, _):
      lo, hi = sorted(axis.get_view_interval())
      decades = math.log10(hi / lo) if lo > 0 else math.inf
      mantissa = round(v / 10 ** math.floor(math.log10(v) + 1e-9)) if v > 0 else 0
      if v <= 0 or decades > 2 or (decades > 0.5 and mantissa not in (2, 3, 5)):
        return ""
      return f"{v:g}"
    return FuncFormatter(label)

  for axis in (ax.xaxis, ax.yaxis):
    if axis.get_scale() == "log":
      axis.set_major_formatter(plain)
      axis.set_minor_formatter(minor_formatter(axis))


def integer_ticks(ax, axis: str = "x") -> None:
  """Ticks only at integers (layers, steps, depths): no 0.96–1.04 on a one-layer axis.
  Call it after drawing: an axis spanning less than 2 is widened to 2 around its middle
  (MaxNLocator keeps integers only where it finds 2 within the limits): layers 1 and 2
  from 0.5 to 2.5, not to a layer 3 the model does not have."""
  from matplotlib.ticker import MaxNLocator

  lo, hi = getattr(ax, f"get_{axis}lim")()
  if abs(hi - lo) < 2:
    middle = (lo + hi) / 2
    getattr(ax, f"set_{axis}lim")(middle - 1, middle + 1)
  getattr(ax, f"{axis}axis").set_major_locator(MaxNLocator(integer=True))


def mean_band(ax, curves: Sequence[tuple[Sequence[float], Sequence[float]]], *,
              label: str, color=None, style: str = "-", **kw):
  """One curve per seed -> their mean at the steps all share, with the min–max band
  shaded when there are several; returns the mean's line."""
  import numpy as np

  curves = [c for c in curves if len(c[0])]
  if not curves:
    return None
  if len(curves) == 1:
    (line,) = ax.plot(curves[0][0], curves[0][1], style, color=color, label=label, **kw)
    return line
  common = sorted(set.intersection(*(set(x) for x, _ in curves)))
  ys = np.array([[dict(zip(x, y))[s] for s in common] for x, y in curves], dtype=float)
  (line,) = ax.plot(common, ys.mean(0), style, color=color,
                    label=f"{label} ({len(curves)} seeds)", **kw)
  ax.fill_between(common, ys.min(0), ys.max(0), color=line.get_color(), alpha=0.2, lw=0)
  return line
