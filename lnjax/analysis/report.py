r"""Measure a run at initialization or from a checkpoint (Xiong et al. 2020, §3).

  python -m lnjax.cli.analyze --workdir=DIR [--step=N|init|latest] [--batches=4] [--lr=5e-4]
      [--sharpness=20]

Restores the run in DIR (its config, parameters and optimizer state) on whatever devices
are present, or initializes it from its config (`--step=init`, the run's seed), feeds
the first `--batches` held-out batches (real data, fixed), and writes into
DIR/analysis/<step>/: analysis.json, report.md and PNG plots of
  - ‖∂L/∂W‖_F per layer for the FFN weights W¹, W² and the attention projections
    (encoder and decoder separately), L the mean per-token NLL;
  - ‖x‖²/d of every norm's input and output (the main path before and after each norm);
  - each norm's Jacobian spectral norm at its actual inputs (power iteration with
    jvp/vjp) beside √d/‖x − μ‖ (μ = 0 for RMSNorm and ScaleNorm);
  - ‖Δw‖/‖w‖ of one step of the run's optimizer at learning rate `--lr`;
  - with `--sharpness=N`, the Hessian's largest eigenvalue, raw and under Adam's
    preconditioner from the checkpoint's optimizer state, by N Lanczos iterations, and the
    rate at Adam's stability threshold (lnjax/analysis/sharpness.py).
"""

import functools
import os
import re

from lnjax.core import fileio


def load(workdir: str, step: str):
  """(the run built on one device (lnjax/core/build.py), its parameters, the step label, and
  (optimizer state, step) of a checkpoint restored as it is: None at init and for an
  average, whose parameters no optimizer state belongs to)."""
  from lnjax import tasks
  from lnjax.core import averaging, build, checkpoint, errors

  mesh = build.one_device_mesh()
  if step == "init":
    config = checkpoint.load_config(workdir)
    if config is None:
      raise errors.CheckpointError(f"{workdir} holds no config.json: not an lnjax workdir")
    b = build.build(config, mesh, tasks=tasks.get, whole_data=True)
    return b, b.init_state().params, "init", None
  chosen = averaging.restore(workdir, step, mesh, flag="--step", tasks=tasks.get,
                             also="init")
  r = chosen.restored
  averaged = step.startswith("avg:")
  return (build.build(r.config, mesh, tasks=tasks.get, whole_data=True), chosen.params,
          chosen.label if averaged else str(r.step),
          None if averaged else (r.state.opt_state, r.step))


def unrolled(run, setup, params):
  """A run trained with `model.scan_layers`: the unrolled model's (run, setup) and its
  parameters unstacked into layer_0, layer_1, ..., so every probe names every layer.
  Other runs as they are."""
  if not run.model.scan_layers:
    return run, setup, params
  import dataclasses

  from lnjax.core import state as state_lib
  from lnjax.models.transformer import unscan_params

  model = dataclasses.replace(run.model, scan_layers=False)
  plain = state_lib.make_setup(model, run.opt, run.train.num_steps, task=run.task)
  return dataclasses.replace(run, model=model), plain, unscan_params(params, run.model)


def analyze(workdir: str, step: str = "latest", num_batches: int = 4, lr: float | None = None,
            sharpness_iters: int = 0):
  """The run at `step`: loss, per-weight gradient norms and update ratios, every norm's
  input and output and its Jacobian, and with `sharpness_iters` > 0 the loss's sharpness
  (`sharpness`); written to WORKDIR/analysis/STEP (analysis.json, report.md, plots)."""
  from lnjax.core import errors
  from lnjax.analysis import probes

  errors.check_int("--batches", num_batches, 1)
  errors.check_int("--sharpness", sharpness_iters, 0)
  if lr is not None:
    errors.check_range("--lr", lr, low=0.0, low_open=True, high=float("inf"), high_open=True)
  built, params, label, trained = load(workdir, step)
  out = os.path.join(workdir, "analysis", label)
  fileio.refuse_run_files("--step", step, [out], own=[workdir])  # Before any work.
  batches = built.eval_batches(num_batches)
  sharp = sharpness(built, params, trained, batches, sharpness_iters) if sharpness_iters else None
  run, setup, params = unrolled(built.run, built.setup, params)
  lr = lr or run.opt.learning_rate
  grad_norms, update_ratios, loss = probes.gradient_and_update_norms(setup, params, batches,
                                                                     run.opt, lr)
  records = probes.norm_inputs(setup, params, batches[0])
  result = {
      "workdir": fileio.abspath(workdir), "step": label, "norm_position": run.model.norm_position,
      "num_batches": len(batches), "loss": loss,
      "loss_normalization": "mean per-token NLL (nats) over the batches' real target tokens",
      "gradient_norms": grad_norms,
      "norms": {p: {"in_sq": r["in_sq"], "out_sq": r["out_sq"]} for p, r in records.items()},
      "norm_jacobians": probes.ln_jacobians(records),
      "update_ratios": update_ratios, "update_lr": lr,
      "num_layers": run.model.num_layers, "d_model": run.model.d_model,
  }
  if sharp is not None:
    result["sharpness"] = sharp
  fileio.makedirs(out)
  fileio.write_text(os.path.join(out, "analysis.json"), fileio.json_text(result))
  _plots(result, out)
  _report(result, out)
  return result, out


def sharpness(built, params, trained, batches, iters: int) -> dict:
  """λ_max of the loss's Hessian on `batches` by `iters` Lanczos iterations and, where the
  checkpoint holds Adam's second moment, λ_max(P⁻¹H) under Adam's preconditioner and the
  rate at Adam's stability threshold; for SGD the rate at its own threshold on λ_max(H)
  (lnjax/analysis/sharpness.py)."""
  from lnjax.analysis import probes
  from lnjax.core import errors

  loss = functools.partial(probes.mean_loss, setup=built.setup, batches=batches)
  try:
    return _sharpness(built, params, trained, loss, iters)
  except MemoryError as e:
    raise errors.LnjaxError(f"--sharpness={iters}: {e}") from None


def _sharpness(built, params, trained, loss, iters: int) -> dict:
  import jax

  from lnjax.analysis import sharpness as sharpness_lib
  from lnjax.core import errors

  if not all(bool(jax.numpy.isfinite(x).all()) for x in jax.tree.leaves(params)):
    raise errors.LnjaxError("--sharpness: the checkpoint's parameters are not all finite "
                            "(a run that diverged): no Hessian; pick an earlier --step")
  top, estimates = sharpness_lib.hessian_top(loss, params, iters=iters)
  out = {"iters": iters, "hessian_top": top, "hessian_estimates": estimates}
  if top <= 0:  # No positive curvature found (one iteration: a Rayleigh quotient): no edge.
    out["no_threshold"] = f"λ_max(H) found ≤ 0 in {iters} iteration(s) (more iterations?)"
    return out
  opt = built.run.opt
  # Where the run itself sits: its last update's rate η times λ over the threshold (Cohen et
  # al.'s edge of stability is 1).
  count = sharpness_lib.update_count(*trained) if trained else None
  lr_now = float(built.setup.schedule(max(count - 1, 0))) if trained else None
  if lr_now is not None:
    out["lr_at_step"] = lr_now
  if opt.name == "sgd":  # No preconditioner: H itself against gradient descent's threshold.
    threshold = sharpness_lib.sgd_threshold(opt.momentum, opt.nesterov)
    out.update(sgd_threshold=threshold, sgd_edge=threshold / top, sgd_momentum=opt.momentum,
               sgd_nesterov=opt.nesterov)
    if lr_now is not None:
      out["edge_fraction"] = lr_now * top / threshold
    return out
  if opt.name == "radam":  # Its rectified (or, early, unpreconditioned) steps are not Adam's.
    out["adam"] = "RAdam's rectified steps are not Adam's preconditioned ones"
    return out
  try:
    precond = sharpness_lib.adam_precond(trained[0], opt.b1, opt.b2,
                                         opt.eps) if trained else None
  except ValueError as e:  # Not Adam, or no update yet.
    out["adam"] = str(e)
    return out
  if precond is None:
    out["adam"] = "no optimizer state (the initialization, or an average of checkpoints)"
    return out
  top, estimates = sharpness_lib.hessian_top(loss, params, precond=precond, iters=iters)
  out["adam_frozen"] = int(sum((x == float("inf")).sum() for x in jax.tree.leaves(precond)))
  if top <= 0:
    out["no_threshold"] = f"λ_max(P⁻¹H) found ≤ 0 in {iters} iteration(s)"
    return out
  out.update(adam_top=top, adam_estimates=estimates, adam_edge=sharpness_lib.adam_edge(
      top, opt.b1), adam_threshold=sharpness_lib.adam_threshold(opt.b1),
             edge_fraction=lr_now * top / sharpness_lib.adam_threshold(opt.b1))
  return out


# 'layer_3/...' (LM), 'encoder/layer_3/...', 'decoder/...', 'bert/stack/layer_3/...' (BERT).
_LAYER = re.compile(r"^(?:(.+?)/)?layer_(\d+)/(.+)$")


def per_layer(values: dict, suffix: str) -> dict:
  """{stack: [(layer, value)]} for the entries ending in `suffix` ('ffn/wi/kernel', ...)."""
  out = {}
  for path, v in values.items():
    m = _LAYER.match(path)
    if m and m.group(3) == suffix:
      out.setdefault(m.group(1) or "lm", []).append((int(m.group(2)), v))
  return {k: sorted(v) for k, v in out.items()}


_STACKS = {"lm": "language model", "encoder": "encoder", "decoder": "decoder"}


def ffn_input_suffix(values: dict) -> str:
  """W¹'s entry: 'ffn/wi/kernel', or the gate's 'ffn/wi_gate/kernel' in a gated FFN
  (`model.gated_ffn`: SwiGLU, GeGLU)."""
  gated = any(path.endswith("ffn/wi_gate/kernel") for path in values)
  return "ffn/wi_gate/kernel" if gated else "ffn/wi/kernel"


def _plots(result: dict, out: str):
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  from lnjax.analysis import plotting

  panels = [(ffn_input_suffix(result["gradient_norms"]), "FFN input weight W¹", "‖∂L/∂W¹‖_F"),
            ("ffn/wo/kernel", "FFN output weight W²", "‖∂L/∂W²‖_F"),
            ("self_attn/value/kernel", "self-attention value W_V", "‖∂L/∂W_V‖_F")]
  fig, axes = plt.subplots(1, 4, figsize=(17, 4.0))
  for ax, (suffix, title, ylabel) in zip(axes, panels):
    for stack, pts in per_layer(result["gradient_norms"], suffix).items():
      ax.plot([p[0] + 1 for p in pts], [p[1] for p in pts], "o-",
              label=_STACKS.get(stack, stack.replace("/stack", "")))
    ax.set_title(f"gradient of the {title}")
    ax.set_xlabel("layer (1 = next to the input)")
    ax.set_ylabel(f"{ylabel} (Frobenius; L in nats/token)")
    plotting.integer_ticks(ax)
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
      ax.legend(fontsize=8)
  ax = axes[3]
  # (A norm whose every sampled input is its own mean, x = μ, has no √d/‖x − μ‖: None.)
  jac = {k: v for k, v in result["norm_jacobians"].items() if v["sqrt_d_over_norm"] is not None}
  ax.set_title("norm Jacobians at their inputs")
  if jac:
    ax.loglog([v["sqrt_d_over_norm"] for v in jac.values()],
              [v["spectral_norm"] for v in jac.values()], "o", label="a norm layer")
    lim = [min(v["sqrt_d_over_norm"] for v in jac.values()) * 0.8,
           max(v["sqrt_d_over_norm"] for v in jac.values()) * 1.25]
    ax.loglog(lim, lim, "k--", label="y = x")
    ax.set_xlabel("√d / ‖x − μ‖ at the norm's input\n(μ = 0 for RMSNorm)")
    ax.set_ylabel("‖J_norm(x)‖₂ (spectral norm)")
    plotting.plain_log_ticks(ax)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
  else:  # (a model without norms)
    ax.text(0.5, 0.5, "no norm layers",
            ha="center", va="center", transform=ax.transAxes)
    ax.set_axis_off()
  fig.suptitle(figure_title(result))
  fig.tight_layout()
  size = (f"{plotting.layers(result['num_layers'])}, d_model {result['d_model']}; "
          if result.get("num_layers") else "")
  if result.get("architecture"):  # A Hugging Face model (lnjax/hf/analyze.py)
    plotting.add_caption(fig, f"{result['architecture']} as {result['placement']}, {size}"
                              f"{result.get('dtype', 'float32')}; gradients of the mean loss "
                              f"({result['loss']:.4f} nats/token) over {result['num_batches']} "
                              f"batches of {result['tokens_per_window']} tokens of "
                              f"{plotting.short_path(result['text'])}")
  else:
    plotting.add_caption(fig, f"{_placement(result)}, {size}step {result['step']}; gradients of "
                              f"the mean loss ({result['loss']:.4f} nats/token) over "
                              f"{result['num_batches']} held-out batches; 1 seed")
  return plotting.save(fig, os.path.join(out, "gradients.png"))


def figure_title(result: dict) -> str:
  """What a figure of `result` shows: the run (its folder) or the imported model, its
  placement and step ('…/runs/lm_post: Post-LN, step 20'; 'Gemma2ForCausalLM from
  /models/gemma: Sandwich-LN, pretrained')."""
  from lnjax.analysis import plotting

  where = plotting.short_path(result["workdir"]) if result.get("workdir") else ""
  if result.get("architecture"):
    return f"{result['architecture']} from {where}: {_placement(result)}, {result['step']}"
  return f"{where + ': ' if where else ''}{_placement(result)}, step {result['step']}"


def _placement(result: dict) -> str:
  """'Post-LN' / 'Pre-LN' for the paper's two, the placement's own name for the zoo's."""
  from lnjax.analysis import plotting

  return plotting.placement_label(result["norm_position"])


def _report(result: dict, out: str) -> None:
  lines = [f"# Analysis of {result['workdir']} at step {result['step']}", "",
           f"{_placement(result)}; loss {result['loss']:.4f} ({result['loss_normalization']},"
           f" {result['num_batches']} held-out batches).", "", *_sharpness_lines(result),
           "| layer | ‖∂L/∂W¹‖ | ‖∂L/∂W²‖ | ‖Δw‖/‖w‖ of W² at lr "
           f"{result['update_lr']:g} |", "|---|---|---|---|"]
  by_layer = lambda values, suffix: {f"{stack}/{layer}": v for stack, pts in
                                     per_layer(values, suffix).items() for layer, v in pts}
  w1 = by_layer(result["gradient_norms"], ffn_input_suffix(result["gradient_norms"]))
  w2 = by_layer(result["gradient_norms"], "ffn/wo/kernel")
  ur = by_layer(result["update_ratios"], "ffn/wo/kernel")
  for key in w1:
    lines.append(f"| {key} | {w1[key]:.4g} | {w2.get(key, float('nan')):.4g} | "
                 f"{ur.get(key, float('nan')):.3g} |")
  lines += ["", "| norm | ‖x‖²/d in | ‖y‖²/d out | ‖J‖₂ | "
            "√d/‖x − μ‖ (μ = 0: RMSNorm; nGPT: 1/‖x‖) |",
            "|---|---|---|---|---|"]
  for path, r in result["norms"].items():
    j = result["norm_jacobians"][path]
    bound = "—" if j["sqrt_d_over_norm"] is None else f"{j['sqrt_d_over_norm']:.4f}"
    lines.append(f"| {path} | {r['in_sq']:.3f} | {r['out_sq']:.3f} | {j['spectral_norm']:.4f} | "
                 f"{bound} |")
  lines += ["", "![gradients](gradients.png)", ""]
  fileio.write_text(os.path.join(out, "report.md"), "\n".join(lines))


def _sharpness_lines(result: dict) -> list[str]:
  sharp = result.get("sharpness")
  if sharp is None:
    return []
  iterations = "iteration" if sharp["iters"] == 1 else "iterations"
  line = (f"Sharpness ({sharp['iters']} Lanczos {iterations}): λ_max(H) = "
          f"{sharp['hessian_top']:.4g}")
  if "adam_top" in sharp:
    line += ("; under Adam's preconditioner P = (1 − β₁ᵗ)(√v̂ + ε), λ_max(P⁻¹H) = "
             f"{sharp['adam_top']:.4g}:"
             f" Adam is stable on the quadratic model below lr {sharp['adam_threshold']:.3g}/λ ="
             f" {sharp['adam_edge']:.3g} (Cohen et al., arXiv 2207.14484)")
    if sharp.get("adam_frozen"):
      line += (f"; {sharp['adam_frozen']:,} parameters without a gradient yet (v̂ = 0, "
               "Adam has not moved them) left out of P⁻¹H")
  elif "sgd_edge" in sharp:
    how = (f"with {'Nesterov' if sharp['sgd_nesterov'] else 'heavy-ball'} momentum "
           f"{sharp['sgd_momentum']:g}" if sharp["sgd_momentum"] else "without momentum")
    line += (f": SGD {how} is stable on the quadratic model below lr "
             f"{sharp['sgd_threshold']:.3g}/λ = {sharp['sgd_edge']:.3g} (Cohen et al., arXiv "
             "2103.00065)")
  else:
    line += (f"; no stability threshold: {sharp['no_threshold']}" if "no_threshold" in sharp
             else f"; Adam's: not measured ({sharp['adam']})")
  if "edge_fraction" in sharp:
    line += (f". The run's last update, at lr {sharp['lr_at_step']:.3g}, put η·λ at "
             f"{sharp['edge_fraction']:.3g}× that threshold (1: the edge of stability)")
  return [line + ".", ""]


def figures(result: dict, out: str) -> None:
  _plots(result, out)
  _report(result, out)
