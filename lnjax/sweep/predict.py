r"""A cell's highest stable learning rate predicted from its first steps (issue 61), without
the search (lnjax/sweep/stability.py): a short run of the cell's model at one reference
rate, no warm-up, with the per-layer health statistics at every step
(lnjax/core/health.py), gives a handful of features (and, where the fit asks for it, a
second run at ten times the rate gives each feature's change per decade of rate); a ridge
regression of log10(edge) on them, fitted on the atlas's searched cells (experiments/atlas),
predicts the edge.

  record = read_run(workdir)             # a finished feature run -> its compact record
  x = features(record, depth, warmup)    # ... -> feature dict (second=: the 10× run's record)
  model = fit(rows, edges, names, lam, fitted_for, groups)   # -> Model
  model.predict(x) -> (edge, low, high)  # low, high: the leave-one-placement-out interval

The command: `lnjax stability --predict` (lnjax/cli/stability.py); the fit and its
validation: experiments/edge_predictor.py.
"""

import dataclasses
import json
import math
import os

import numpy as np

from lnjax.core import errors

STEPS = 20  # The feature run's length (the search spends ~2000-4500 steps a cell).
REFERENCE_LR = 1e-3  # Its rate (configs/lm.py's own), constant from step 1.
SECOND_LR = 1e-2  # The optional second run's: ten times the reference, the same steps.
COEFFICIENTS = os.path.join(os.path.dirname(__file__), "edge_predictor.json")


def feature_config(config, placement: str, depth: int, steps: int = STEPS,
                   lr: float = REFERENCE_LR):
  """The feature run of (placement, depth): `config` (the atlas's: configs/lm.py:size=small,
  batches of 16) at `lr` without warm-up for `steps` steps, health logged at every step, the
  layers scanned (one compilation for any depth), nothing stopped or rolled back."""
  c = config.unlock() if hasattr(config, "unlock") else config
  c.model.norm_position, c.model.num_layers, c.model.scan_layers = placement, depth, True
  c.opt.learning_rate, c.opt.warmup_steps, c.opt.schedule = lr, 0, "constant"
  c.train.num_steps, c.train.log_every_steps, c.train.eval_every_steps = steps, 1, steps
  c.train.checkpoint_every_steps, c.train.health = steps, "log"
  c.train.on_instability = "none"
  return c


def _layer_series(row: dict, stat: str) -> list[float] | None:
  """Per layer (0, 1, ...) the largest of its sub-layers' `stat` in one metrics row; None
  where the row has none finite (a step that diverged writes its statistics as null)."""
  layers: dict[int, float] = {}
  for name, value in row.items():
    parts = name.split("/")
    if value is not None and len(parts) >= 3 and parts[0] == "health" and parts[
        1].startswith("layer_") and parts[-1] == stat and math.isfinite(value):
      i = int(parts[1][len("layer_"):])
      layers[i] = max(layers.get(i, -math.inf), float(value))
  return [layers[i] for i in sorted(layers)] or None


def read_run(workdir: str) -> dict:
  """A finished feature run's compact record: per step the train loss, gradient norm, the
  output logits' largest value, and per layer the gradient RMS, update RMS, largest
  attention logit and residual RMS (each layer's sub-layers pooled as the max)."""
  steps: dict[int, dict] = {}
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    for line in f:
      row = json.loads(line)
      steps.setdefault(int(row["step"]), {}).update(row)
  record = {"step": [], "loss": [], "grad_norm": [], "output_logit_max": [], "grad_rms": [],
            "update_rms": [], "max_logit": [], "residual_rms": []}
  for step in sorted(steps):
    row = steps[step]
    if "train_loss" not in row:
      continue
    record["step"].append(step)
    record["loss"].append(row["train_loss"])
    record["grad_norm"].append(row.get("grad_norm"))
    record["output_logit_max"].append(row.get("health/output_logit_max"))
    for stat in ("grad_rms", "update_rms", "max_logit", "residual_rms"):
      record[stat].append(_layer_series(row, stat))
  with open(os.path.join(workdir, "summary.json")) as f:
    summary = json.load(f)
  record.update(status=summary["status"], eval_loss=summary.get("eval_loss"),
                unigram_baseline=summary.get("unigram_baseline"))
  return _rounded(record)


# What a prediction must share with the fit: the task and the block (refused otherwise), and
# the size (a prediction for another size is an extrapolation, said so). A key the config
# lacks counts as its default (the modern block's keys: the fit's block has their defaults).
BLOCK_KEYS = ("model.pos_emb", "model.activation", "model.gated_ffn", "model.norm_kind",
              "model.use_bias", "model.num_kv_heads", "model.qk_norm", "model.attn_logit_softcap",
              "model.final_logit_softcap", "model.sliding_window", "model.norm_unit_offset",
              "model.tie_embeddings", "opt.name")
SIZE_KEYS = ("model.d_model", "model.num_heads", "model.d_ff", "data.name", "data.tokenizer",
             "data.batch_size", "data.seq_len", "model.vocab_size", "model.max_len")
# Every other model.* and opt.* key is recorded too and must match (β₁, ε, dtype, dropout,
# the embedding's scale...: each changes the edge), but for the cell's own and those that
# change how a value is computed, not the value.
CELL_KEYS = ("model.norm_position", "model.num_layers", "opt.learning_rate",
             "opt.warmup_steps")
HOW_KEYS = ("model.attention_impl", "model.remat_policy", "model.scan_layers",
            "model.weight_grad")
BLOCK_DEFAULTS = {"model.gated_ffn": False, "model.num_kv_heads": 0,
                  "model.attn_logit_softcap": 0.0, "model.final_logit_softcap": 0.0,
                  "model.sliding_window": 0, "model.norm_unit_offset": False}


def _get(config, key: str):
  node = config
  for part in key.split("."):
    if part not in node:
      return BLOCK_DEFAULTS.get(key)
    node = node[part]
  return node


def describe_config(config) -> dict:
  """The keys a fit records of its config: task, block, size, and the rest of the model's
  and optimizer's (as JSON has them: tuples as lists)."""
  named = BLOCK_KEYS + SIZE_KEYS + CELL_KEYS + HOW_KEYS
  rest = {f"{section}.{k}": v for section in ("model", "opt") for k, v in config[section].items()
          if f"{section}.{k}" not in named}
  return json.loads(json.dumps({"task": config.task, **{
      k: _get(config, k) for k in BLOCK_KEYS + SIZE_KEYS}, **rest}))


def check_fitted(model: "Model", config, placement: str, depth: int, warmup: int) -> list[str]:
  """Refuses (ConfigError, one line) a cell the fit cannot speak for: another task or block,
  a placement, depth or warm-up outside the fit's; returns notes on a size that differs."""
  fitted = model.fitted_for
  mine = describe_config(config)
  where = (f"the predictor ({os.path.basename(COEFFICIENTS)}) was fitted on "
           f"{fitted['config']}")
  for key in ("task",) + BLOCK_KEYS:
    if key in fitted["keys"] and mine[key] != fitted["keys"][key]:
      raise errors.ConfigError(f"--predict: {key}={mine[key]}: {where} with "
                               f"{key}={fitted['keys'][key]}; no prediction for another "
                               "task or block")
  for key, value in fitted["keys"].items():
    if key not in ("task",) + BLOCK_KEYS + SIZE_KEYS and key in mine and mine[key] != value:
      raise errors.ConfigError(f"--predict: {key}={mine[key]}: {where} with {key}={value}; "
                               "no prediction for another setting of the model or optimizer")
  if placement not in fitted["placements"]:
    raise errors.ConfigError(f"--predict: placement {placement}: {where} with "
                             f"{', '.join(fitted['placements'])}")
  low, high = fitted["depths"]
  if not low <= depth <= high:
    raise errors.ConfigError(f"--predict: --depths={depth}: {where} at depths {low}..{high}")
  low, high = fitted["warmups"]
  if not low <= warmup <= high:
    raise errors.ConfigError(f"--predict: --warmups={warmup}: {where} with warm-ups "
                             f"{low}..{high}")
  return [f"{k}={mine[k]} (fitted: {fitted['keys'][k]})" for k in SIZE_KEYS
          if k in fitted["keys"] and mine[k] != fitted["keys"][k]]


def _rounded(x):
  if isinstance(x, float):
    return float(f"{x:.5g}") if math.isfinite(x) else None
  if isinstance(x, list):
    return [_rounded(v) for v in x]
  if isinstance(x, dict):
    return {k: _rounded(v) for k, v in x.items()}
  return x


# ---- Features. ------------------------------------------------------------------------------

def _log(x: float | None) -> float:
  return math.log10(x) if x is not None and x > 0 else math.log10(1e-12)


def _share(layers: list[float]) -> float:
  """The first layer's gradient RMS over the largest layer's (VanishingGradient's ratio)."""
  top = max(layers)
  return layers[0] / top if top > 0 else 1.0


def _tail(series: list, n: int = 5) -> list:
  return [v for v in series[-n:] if v is not None]


def features(record: dict, depth: int, warmup: int, lr: float = REFERENCE_LR,
             second: dict | None = None, second_lr: float = SECOND_LR,
             sharpness: dict | None = None) -> dict[str, float]:
  """The predictor's inputs of one cell: its depth and warm-up, and from its feature run
  (`read_run`, at rate `lr`) the gradient at initialization (the last layer's RMS, the
  paper's quantity, Xiong et al. 2020, arXiv 2002.04745, §3.3; the first layer's share), and
  over the run how the gradient, the attention logits, the output logits and the residual
  stream grew, the Adam update per unit of rate and the loss's drop. A run that diverged
  keeps its last finite values. With `second` (the same steps at `second_lr`): each of these
  run features' change per decade of rate, 'slope_<name>', and 'diverged_high' (1.0 where
  that run diverged). With `sharpness` (experiments/edge_sharpness.py's entry: the run's
  Hessian at its last step, lnjax/analysis/sharpness.py): 'log_adam_edge', log10 of
  38/λ_max(P⁻¹H), and 'log_sharpness', log10 λ_max(H)."""
  x = {"log_depth": math.log10(depth), "warmup": warmup / 500.0, **_run_features(record, lr)}
  if sharpness is not None:
    x["log_adam_edge"] = _log(sharpness["adam_edge"])
    x["log_sharpness"] = _log(sharpness["sharpness"])
  if second is not None:
    decades = math.log10(second_lr / lr)
    high = _run_features(second, second_lr)
    for name in RUN_FEATURES:
      x[f"slope_{name}"] = (high[name] - x[name]) / decades
    x["diverged_high"] = float(second.get("status") == "diverged")
  return x


RUN_FEATURES = ("init_last_grad", "init_first_share", "end_first_share", "grad_growth",
                "update_per_lr", "logit_growth", "output_logit_growth", "residual_growth",
                "loss_drop")


def _run_features(record: dict, lr: float) -> dict[str, float]:
  g, u = record["grad_rms"], record["update_rms"]
  logit = [max(v) for v in record["max_logit"] if v]
  resid = [v[-1] for v in record["residual_rms"] if v]
  loss = [v for v in record["loss"] if v is not None]
  top = lambda layers: max(layers)
  end_g = [top(v) for v in _tail(g)]
  end_u = [sum(v) / len(v) for v in _tail(u)]
  return {
      "init_last_grad": _log(g[0][-1]),
      "init_first_share": _log(_share(g[0])),
      "end_first_share": _log(sum(_share(v) for v in _tail(g)) / len(_tail(g))),
      "grad_growth": _log(sum(end_g) / len(end_g) / top(g[0])),
      "update_per_lr": _log(sum(end_u) / len(end_u) / lr),
      "logit_growth": _log(logit[-1] / logit[0]) if logit else 0.0,
      "output_logit_growth": _log(_tail(record["output_logit_max"])[-1]
                                  / record["output_logit_max"][0]),
      "residual_growth": _log(resid[-1] / resid[0]) if resid else 0.0,
      "loss_drop": loss[0] - sum(loss[-5:]) / len(loss[-5:]),
  }


# ---- The model: ridge regression of log10(edge), its interval from held-out residuals. -------

@dataclasses.dataclass
class Model:
  names: list[str]  # Feature names (the columns), warm-up interactions included.
  mean: list[float]
  scale: list[float]
  coef: list[float]
  intercept: float
  lam: float  # The ridge penalty on the standardized coefficients.
  interval: tuple[float, float]  # log10 quantiles (10%, 90%) of held-out residuals.
  fitted_for: dict  # What the features were measured on: a prediction elsewhere is refused.

  def log_edge(self, x: dict[str, float]) -> float:
    v = (design([x], self.names) - np.asarray(self.mean)) / np.asarray(self.scale)
    return float((v @ np.asarray(self.coef))[0] + self.intercept)

  def predict(self, x: dict[str, float]) -> tuple[float, float, float]:
    """(edge, low, high): the prediction and its 10%-90% interval (held-out residuals)."""
    y = self.log_edge(x)
    return 10 ** y, 10 ** (y + self.interval[0]), 10 ** (y + self.interval[1])

  def save(self, path: str) -> None:
    with open(path, "w") as f:
      json.dump(dataclasses.asdict(self), f, indent=1)
      f.write("\n")

  @classmethod
  def load(cls, path: str = COEFFICIENTS) -> "Model":
    with open(path) as f:
      d = json.load(f)
    return cls(**{**d, "interval": tuple(d["interval"])})


def design(rows: list[dict], names: list[str]) -> np.ndarray:
  """The design matrix: a column per name; 'a*b' is the product of a and b."""
  def value(x, name):
    a, _, b = name.partition("*")
    return x[a] * x[b] if b else x[a]
  return np.array([[value(x, n) for n in names] for x in rows], dtype=np.float64)


def ridge(X: np.ndarray, y: np.ndarray, lam: float):
  """(mean, scale, coef, intercept) minimizing |y - b - Z coef|² + lam |coef|², Z the
  standardized X."""
  mean, scale = X.mean(0), X.std(0)
  scale[scale < 1e-9] = 1.0  # A constant column (one depth only, say) weighs nothing.
  Z = (X - mean) / scale
  b = y.mean()
  coef = np.linalg.solve(Z.T @ Z + lam * np.eye(Z.shape[1]), Z.T @ (y - b))
  return mean, scale, coef, b


def fit(rows: list[dict], edges: list[float], names: list[str], lam: float,
        fitted_for: dict, groups: list[str] | None = None,
        residuals: np.ndarray | None = None) -> Model:
  """The ridge model of log10(edge) on `names`; its interval from `residuals` (log10
  prediction − log10 edge, held out: the selection's, `nested`), else from this model's
  leave-one-group-out residuals with `groups` (a placement per row), else the in-sample
  ones."""
  X, y = design(rows, names), np.log10(np.asarray(edges, dtype=np.float64))
  if residuals is None and groups:
    residuals = held_out(rows, edges, names, lam, groups) - y
  mean, scale, coef, b = ridge(X, y, lam)
  if residuals is None:
    residuals = ((X - mean) / scale) @ coef + b - y
  low, high = np.quantile(-np.asarray(residuals), [0.1, 0.9])  # edge = prediction × 10^(−r).
  return Model(list(names), mean.tolist(), scale.tolist(), coef.tolist(), float(b), lam,
               (float(low), float(high)), dict(fitted_for))


def held_out(rows, edges, names, lam, groups) -> np.ndarray:
  """log10 predictions of each row by the model fitted without its group's rows."""
  X, y = design(rows, names), np.log10(np.asarray(edges, dtype=np.float64))
  groups = np.asarray(groups)
  out = np.empty_like(y)
  for g in np.unique(groups):
    test = groups == g
    mean, scale, coef, b = ridge(X[~test], y[~test], lam)
    out[test] = ((X[test] - mean) / scale) @ coef + b
  return out


def select(rows, edges, candidates: dict[str, list[str]], lambdas, groups) -> tuple[str, float]:
  """The (candidate, penalty) whose leave-one-group-out predictions of these rows have the
  smallest mean |log10 error|: the selection, on whatever rows it is given."""
  y = np.log10(np.asarray(edges, dtype=np.float64))
  return min(((label, lam) for label in candidates for lam in lambdas),
             key=lambda c: float(np.mean(np.abs(
                 held_out(rows, edges, candidates[c[0]], c[1], groups) - y))))


def nested(rows, edges, candidates: dict[str, list[str]], lambdas, groups):
  """Leave-one-group-out predictions (log10) of the whole procedure, the selection
  (`select`) included: each group's rows predicted by the candidate and penalty chosen,
  and fitted, on the other groups' rows alone. Returns (predictions, {group: choice})."""
  groups = np.asarray(groups)
  out, picks = np.empty(len(rows)), {}
  for g in np.unique(groups):
    train = np.flatnonzero(groups != g)
    sub, sub_edges = [rows[i] for i in train], [edges[i] for i in train]
    picks[str(g)] = label, lam = select(sub, sub_edges, candidates, lambdas, groups[train])
    model = fit(sub, sub_edges, candidates[label], lam, {})
    for i in np.flatnonzero(groups == g):
      out[i] = model.log_edge(rows[i])
  return out, picks


def scores(predicted_log10: np.ndarray, edges) -> dict:
  """Median error factor and the fraction within 2× of the searched edges."""
  factor = 10 ** np.abs(np.asarray(predicted_log10) - np.log10(np.asarray(edges)))
  return {"median_factor": float(np.median(factor)),
          "within_2x": float(np.mean(factor <= 2.0)), "cells": int(factor.size)}


# ---- The command's part: feature runs, then a line per cell. --------------------------------

def predict_cells(config_arg: str, fixed: dict, placements, depths, warmups, workdir: str,
                  model: Model | None = None) -> list[str]:
  """`lnjax stability --predict`: every cell checked against the fit first (one refusal line,
  exit 2, before any run), then per (placement, depth) one feature run in
  WORKDIR/predict/norm=P,layers=D (and, where the fit reads a second rate, one in
  ...,lr=R; a finished one is read again, not rerun), and a line per cell with the
  predicted highest stable rate and its interval."""
  from lnjax import sweep as sweep_lib, tasks
  from lnjax.core import preemption, train as train_lib
  model = model or Model.load()
  configs, notes = {}, []
  for p in placements:
    for d in depths:
      configs[p, d] = sweep_lib.base_config(config_arg, {**fixed, "model.norm_position": p,
                                                         "model.num_layers": d})
      for w in warmups:
        notes = check_fitted(model, configs[p, d], p, d, w)
  fitted = model.fitted_for
  lr, second_lr = fitted["lr"], fitted.get("second_lr")
  runs = f"a {fitted['steps']}-step run at lr {lr:g}" + (
      f" and one at {second_lr:g}" if second_lr else "")
  lines = [f"Predicted from {runs} (lnjax/sweep/predict.py, fitted on {fitted['config']}; "
           "10%-90% interval from its leave-one-placement-out errors)"]
  if notes:
    lines.append("note: an extrapolation, this config's size differs from the fit's: "
                 + ", ".join(notes))

  def run(config, p, d, rate, suffix):
    run_dir = os.path.join(workdir, "predict", f"norm={p},layers={d}{suffix}")
    summary = train_lib.train_and_evaluate(feature_config(
        config.copy_and_resolve_references(), p, d, fitted["steps"], rate), run_dir,
        tasks=tasks.get)
    if summary["status"] == "preempted":  # Its checkpoint kept: the same command resumes.
      raise preemption.Preempted(preemption.requested() or "SIGTERM")
    return read_run(run_dir)

  for (p, d), config in configs.items():
    record = run(config, p, d, lr, "")
    second = run(config, p, d, second_lr, f",lr={second_lr:g}") if second_lr else None
    for w in warmups:
      edge, low, high = model.predict(features(record, d, w, lr, second, second_lr or SECOND_LR))
      lines.append(f"{p}, {d} layers, warm-up {w}: predicted highest stable lr {edge:.3g} "
                   f"(interval {low:.3g}–{high:.3g})")
  return lines
