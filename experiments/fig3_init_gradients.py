r"""The paper's Fig. 3: gradient norms at initialization, Post-LN against Pre-LN.

  python experiments/fig3_init_gradients.py --workdir=/tmp/fig3 [--seeds=10]
      [--models=translation,lm] [--depths=6,8,10,12,14] [--batch_tokens=2048]
      [--warmup_steps=250] [--lm_warmup_steps=500]

Xiong et al. 2020, arXiv 2002.04745, §3.3 and Fig. 3: at initialization Post-LN's gradient
of the FFN weights grows towards the output layer and does not shrink with depth, while
Pre-LN's is even across layers and falls like 1/√L; after Post-LN's warm-up its gradients
are near zero. Measured here:

  translation  the paper's IWSLT shape (6+6 layers, d_model 512, FFN 1024, 4 heads,
               shared embeddings) on real De-En batches of Multi30k (the IWSLT14 train
               split, and so its vocabulary, is not in the data dir; its validation text
               alone would be a smaller sample), joint SentencePiece 8000;
  lm           the 8-layer 2.6M-parameter decoder-only LM of the course workshop on
               tiny_shakespeare (configs/lm.py:size=course).

For each: (a, b) ‖∂L/∂W¹‖_F and ‖∂L/∂W²‖_F of every layer's FFN, mean ± std over
--seeds initializations (the seed of a run: the same parameters `python -m lnjax.main`
would start from), Post-LN and Pre-LN at init, and Post-LN after --warmup_steps of
training with a linear warm-up to the config's peak learning rate (trained by
lnjax.core.train, its checkpoint restored by lnjax.core.checkpoint.restore_run, then measured);
(c, d) the last layer's W² gradient for models of --depths total layers (translation:
half encoder, half decoder). L is the mean per-token NLL over the batches' real target
tokens (fairseq's normalization: summed loss / target tokens; without label smoothing).
The batches are fixed: --num_batches spread over the validation split's length buckets.

Writes results.json, report.md, fig3_<model>.png into --workdir; the warm-up runs go to
--workdir/<model>_post_ln_warmup/ (re-running reuses them).
"""

import json
import os
import time

from absl import app, flags, logging

from lnjax.core import allocator
allocator.tune_glibc_malloc()  # glibc malloc for XLA:CPU, before JAX starts
from lnjax.analysis import init_gradients  # noqa: E402

_WORKDIR = flags.DEFINE_string("workdir", None, "Where results, plots and warm-up runs go.",
                               required=True)
_SEEDS = flags.DEFINE_integer("seeds", 10, "Initializations per measurement.")
_MODELS = flags.DEFINE_list("models", ["translation", "lm"], "translation and/or lm.")
_DEPTHS = flags.DEFINE_list("depths", ["6", "8", "10", "12", "14"],
                            "Total layers of the depth panels (c, d).")
_BATCH_TOKENS = flags.DEFINE_integer("batch_tokens", 2048,
                                     "Translation: target tokens per batch (fairseq --max-tokens).")
_NUM_BATCHES = flags.DEFINE_integer("num_batches", 2, "Fixed real batches per gradient.")
_WARMUP = flags.DEFINE_integer("warmup_steps", 250, "Translation: Post-LN warm-up steps.")
_LM_WARMUP = flags.DEFINE_integer("lm_warmup_steps", 500, "LM: Post-LN warm-up steps.")
_SMOKE = flags.DEFINE_bool("smoke", False, "Tiny models and data sizes (tests use it).")

# Xiong et al. 2020, arXiv 2002.04745, read off Fig. 3 (c, d): last-layer W² gradient against depth.
PAPER_LAST_W2 = {"pre": {6: 0.3, 14: 0.13}, "post": {6: 1.6, 14: 1.6}}


def make_config(model: str, norm: str, total_layers: int | None = None):
  return init_gradients.make_config(model, norm, total_layers, smoke=_SMOKE.value,
                                    batch_tokens=_BATCH_TOKENS.value)


def last_layer(model: str, num_layers: int) -> str:
  """Path of the last layer's FFN W² (the output layer's, in the decoder)."""
  stack = "decoder/" if model == "translation" else ""
  return f"{stack}layer_{num_layers - 1}/ffn/wo/kernel"


def ffn_per_layer(norms: dict, model: str, num_layers: int) -> dict:
  """{'w1': [...], 'w2': [...]} in network order (translation: encoder, then decoder)."""
  stacks = ("encoder/", "decoder/") if model == "translation" else ("",)
  return {w: [norms[f"{s}layer_{i}/ffn/{name}/kernel"] for s in stacks for i in range(num_layers)]
          for w, name in (("w1", "wi"), ("w2", "wo"))}


def warmed_up_params(model: str, root: str, steps: int):
  """Train Post-LN with a linear warm-up over `steps` steps (lnjax.core.train, checkpointed),
  restore the checkpoint on one device, return (params, summary)."""
  from lnjax import tasks
  from lnjax.core import build, checkpoint, train

  config = make_config(model, "post")
  with config.unlocked():
    config.opt.schedule, config.opt.warmup_steps = "constant", steps
    config.train.num_steps = max(steps, 1)
    config.train.eval_every_steps = config.train.checkpoint_every_steps = max(steps, 1)
  workdir = os.path.join(root, f"{model}_post_ln_warmup")
  summary = train.train_and_evaluate(config, workdir, tasks=tasks.get)
  restored = checkpoint.restore_run(workdir, None, build.one_device_mesh(), tasks=tasks.get)
  return restored.state.params, summary


def measure_model(model: str, root: str) -> dict:
  import numpy as np

  seeds = range(_SEEDS.value)
  depths = [int(d) for d in _DEPTHS.value]
  out = {"per_layer": {}, "depth": {"post": {}, "pre": {}}}
  data = None  # Prepared once, by the first Measurer.
  for norm in ("post", "pre"):
    t0 = time.time()
    m = init_gradients.Measurer(make_config(model, norm), data, _NUM_BATCHES.value)
    data, batches = m.data, m.batches
    layers = m.run.model.num_layers
    rows = [ffn_per_layer(m.grad_norms(m.init(s)), model, layers) for s in seeds]
    out["per_layer"][f"{norm}_init"] = {
        w: {"mean": np.mean([r[w] for r in rows], 0).tolist(),
            "std": np.std([r[w] for r in rows], 0).tolist()} for w in ("w1", "w2")}
    print(f"{model} {norm}-LN at init, {layers} layers per stack, {len(rows)} seeds: "
          f"last W² {out['per_layer'][f'{norm}_init']['w2']['mean'][-1]:.3f} "
          f"({time.time() - t0:.0f} s)", flush=True)
  out["num_batches"] = len(batches)
  out["target_tokens"] = int(sum(float(np.sum(b["weights"])) for b in batches))
  steps = _WARMUP.value if model == "translation" else _LM_WARMUP.value
  params, summary = warmed_up_params(model, root, steps)
  m = init_gradients.Measurer(make_config(model, "post"), data, _NUM_BATCHES.value)
  after = ffn_per_layer(m.grad_norms(params), model, m.run.model.num_layers)
  out["per_layer"]["post_after_warmup"] = {w: {"mean": after[w], "std": [0.0] * len(after[w])}
                                           for w in after}
  out["warmup"] = {"steps": steps, "peak_lr": m.run.opt.learning_rate,
                   "train_loss": summary.get("last_finite_train_loss"),
                   "eval_loss": summary.get("eval_loss")}
  print(f"{model} Post-LN after {steps} warm-up steps: last W² {after['w2'][-1]:.4f}", flush=True)
  for norm in ("post", "pre"):
    for total in depths:
      t0 = time.time()
      m = init_gradients.Measurer(make_config(model, norm, total), data, _NUM_BATCHES.value)
      path = last_layer(model, m.run.model.num_layers)
      values = [m.grad_norms(m.init(s))[path] for s in seeds]
      out["depth"][norm][str(total)] = {"mean": float(np.mean(values)),
                                       "std": float(np.std(values))}
      print(f"{model} {norm}-LN, {total} layers: last-layer W² {np.mean(values):.3f} ± "
            f"{np.std(values):.3f} ({time.time() - t0:.0f} s)", flush=True)
  return out


def plot(model: str, r: dict, path: str, config: dict | None = None, seeds: int = 0) -> None:
  """Per-layer FFN gradient norms (a, b) and the last layer's W² against depth (c, d);
  `config`: the model's (for the caption), `seeds`: the initializations measured."""
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  from lnjax.analysis import plotting

  grad = f"‖∂L/∂W‖_F (L in {plotting.LOSS_UNIT})"
  warmup = r["warmup"]["steps"]
  fig, axes = plt.subplots(1, 4, figsize=(17, 4))
  styles = {
      "post_init": (f"{plotting.placement_label('post')}, at init", "tab:red"),
      "pre_init": (f"{plotting.placement_label('pre')}, at init", "tab:blue"),
      "post_after_warmup": (plotting.legend_label({"model.norm_position": "post",
                                                   "opt.warmup_steps": warmup})
                            + ", trained through it (1 seed)", "tab:green")}
  for ax, w, title in ((axes[0], "w1", "(a) W¹ of the FFN"), (axes[1], "w2", "(b) W² of the FFN")):
    for key, (label, color) in styles.items():
      v = r["per_layer"][key][w]
      x = range(1, len(v["mean"]) + 1)
      ax.errorbar(x, v["mean"], yerr=v["std"], marker="o", ms=3, capsize=2, label=label,
                  color=color)
    if model == "translation":
      ax.axvline(len(v["mean"]) / 2 + 0.5, color="grey", lw=0.8, ls=":")
    n = len(v["mean"]) // 2
    ax.set_xlabel("layer" + (f" (encoder 1–{n} | decoder {n + 1}–{2 * n})"
                             if model == "translation" else ""))
    ax.set_ylabel(grad.replace("W‖", "W¹‖" if w == "w1" else "W²‖"))
    ax.set_title(title)
    plotting.integer_ticks(ax)
    ax.grid(alpha=0.3)
  axes[0].legend(fontsize=8)
  for ax, norm, title, color in ((axes[2], "pre", "(c) last-layer W²", "tab:blue"),
                                 (axes[3], "post", "(d) last-layer W²", "tab:red")):
    d = r["depth"][norm]
    xs = [int(k) for k in d]
    ax.errorbar(xs, [d[k]["mean"] for k in d], yerr=[d[k]["std"] for k in d], marker="o",
                capsize=3, color=color, label=f"{plotting.placement_label(norm)}, at init")
    if model == "translation":
      paper = PAPER_LAST_W2[norm]
      ax.plot(list(paper), list(paper.values()), "k--", marker="x",
              label="Xiong et al. 2020, Fig. 3 (read off)")
    ax.set_xlabel("total layers" + (" (encoder + decoder)" if model == "translation" else ""))
    ax.set_ylabel(grad.replace("W‖", "W²‖"))
    ax.set_title(f"{title}: {plotting.placement_label(norm)}")
    ax.set_ylim(bottom=0)
    plotting.integer_ticks(ax)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
  fig.suptitle(f"FFN gradient norms at initialization: {plotting.task_label(model)}")
  fig.tight_layout()
  # Mean ± std error bars (results.json keeps no per-seed values for a min–max band).
  c = config or {}
  size = plotting.setup_caption({"task": c.get("task"), "model": c.get("model", {})})
  plotting.add_caption(fig, "; ".join(filter(None, (
      size, f"{seeds} seeds at init (mean ± std)" if seeds else "",
      f"{r['num_batches']} fixed batches, {r['target_tokens']:,} target tokens",
      f"warm-up to lr {r['warmup']['peak_lr']:g}"))))
  plotting.save(fig, path, dpi=120)


def report(results: dict, root: str) -> str:
  lines = ["# Fig. 3 of Xiong et al. 2020: gradient norms at initialization", "",
           f"Command: `python experiments/fig3_init_gradients.py --workdir={root} "
           f"--seeds={_SEEDS.value} --models={','.join(_MODELS.value)} "
           f"--depths={','.join(_DEPTHS.value)}`", "",
           "Loss: mean per-token NLL (nats) over the fixed batches' real target tokens "
           "(fairseq's normalization, summed loss / target tokens, without label smoothing); "
           f"gradient norms are Frobenius norms, mean ± std over {_SEEDS.value} seeds.", ""]
  for model, r in results.items():
    pl = r["per_layer"]
    lines += [f"## {model}", "",
              f"{r['num_batches']} fixed batches, {r['target_tokens']} target tokens. "
              f"Post-LN after warm-up: {r['warmup']['steps']} steps of linear warm-up to "
              f"lr {r['warmup']['peak_lr']:g} (one seed), final train loss "
              f"{r['warmup']['train_loss']:.3f}.", "",
              "Per-layer FFN gradient norms (W¹ / W²), layers in network order"
              + (" (encoder first, then decoder)" if model == "translation" else "") + ":", "",
              "| layer | Post-LN init W¹ | W² | Pre-LN init W¹ | W² | Post-LN after warm-up W¹ | W² |",
              "|---|---|---|---|---|---|---|"]
    for i in range(len(pl["post_init"]["w1"]["mean"])):
      cells = [f"{pl[k][w]['mean'][i]:.3f}" for k in ("post_init", "pre_init", "post_after_warmup")
               for w in ("w1", "w2")]
      lines.append(f"| {i + 1} | " + " | ".join(cells) + " |")
    lines += ["", "Last layer's W² against total depth:", "",
              "| total layers | Pre-LN | Post-LN | paper Pre-LN | paper Post-LN |",
              "|---|---|---|---|---|"]
    for k in r["depth"]["pre"]:
      pre, post = r["depth"]["pre"][k], r["depth"]["post"][k]
      paper = [PAPER_LAST_W2[n].get(int(k)) if model == "translation" else None
               for n in ("pre", "post")]
      fmt = lambda v: "—" if v is None else f"≈{v:g}"
      lines.append(f"| {k} | {pre['mean']:.3f} ± {pre['std']:.3f} | "
                   f"{post['mean']:.3f} ± {post['std']:.3f} | {fmt(paper[0])} | {fmt(paper[1])} |")
    lines += ["", f"![fig3 {model}](fig3_{model}.png)", ""]
  text = "\n".join(lines)
  with open(os.path.join(root, "report.md"), "w") as f:
    f.write(text)
  return text


def main(argv):
  del argv
  logging.set_verbosity(logging.WARNING)
  root = _WORKDIR.value
  os.makedirs(root, exist_ok=True)
  unknown = set(_MODELS.value) - {"translation", "lm"}
  if unknown:
    raise app.UsageError(f"--models: unknown {sorted(unknown)}; choose from translation, lm")
  results = {}
  for model in _MODELS.value:
    results[model] = measure_model(model, root)
    plot(model, results[model], os.path.join(root, f"fig3_{model}.png"),
         make_config(model, "post").to_dict(), _SEEDS.value)
    with open(os.path.join(root, "results.json"), "w") as f:
      json.dump(results, f, indent=1)
  print(report(results, root))
  print(f"Report: {os.path.join(root, 'report.md')}")


if __name__ == "__main__":
  app.run(main)
