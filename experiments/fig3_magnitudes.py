r"""Fig. 3's magnitudes isolated: what moves the last decoder layer's W² gradient at init.

  python experiments/fig3_magnitudes.py --workdir=/tmp/fig3mag [--seeds=10]
      [--label_smoothing=0,0.1] [--tokens=1024,4096,16384]
      [--vocabs=unigram:8000,bpe:10000] [--inits=lnjax,sinusoidal,fairseq] [--max_len=32]
  python experiments/fig3_magnitudes.py --workdir=/tmp/fig3mag --report_only

REPRODUCTION.md's Fig. 3 section measured ‖∂L/∂W²‖_F of the last decoder layer of the
paper's 6+6 × 512 model (d_model 512, FFN 1024, 4 heads) at initialization at 1.91
(Post-LN) and 1.30 (Pre-LN), where the paper's Fig. 3 reads ≈1.6 and ≈0.3, and named three
candidate causes without isolating them. This script crosses them, on the same model
setup as experiments/fig3_init_gradients.py (lnjax/analysis/init_gradients.py's make_config
and Measurer: the run's own initialization, dropout off):

  label smoothing   the loss differentiated: NLL (ε 0) or fairseq's label-smoothed loss
                    (ε 0.1), both summed over target tokens / target tokens;
  tokens            the gradient averaged over ~1k, ~4k or ~16k target tokens (one
                    GPU's 4096-token batch is the middle one): a norm of a noisy mean
                    falls towards the norm of the expected gradient as tokens grow;
  vocabulary        Multi30k's joint SentencePiece unigram 8000 (the configs') against a
                    joint SentencePiece BPE of 10,000 trained on Multi30k's train split
                    (fairseq's IWSLT14 recipe is a ≈10k BPE; IWSLT14's train split is not
                    prepared in the data dir).
  initialization    lnjax's (learned positions N(0, 0.02); query/key/value Xavier-uniform)
                    against fairseq's transformer_iwslt_de_en: sinusoidal positions
                    (`sinusoidal`), and with them query/key/value Xavier-uniform at gain
                    1/√2 (`fairseq`; its MultiheadAttention since the in_proj days). The
                    rest already is fairseq's: embeddings N(0, D^-½) × √D, tied output,
                    Xavier-uniform FFN and output projections, zero biases. Measured with
                    the first vocabulary only.

The sentences are the same for every cell: a fixed random sample (seed 0) of Multi30k
train pairs of at most --max_len tokens on both sides under every vocabulary, cut into
equal chunks of rows holding ~min(--tokens) target tokens each (one padded shape, so one
compilation per model). Per seed and norm, one forward pass over all chunks gives each
chunk's summed-loss gradient of W² for both ε (a VJP w.r.t. that one weight only); a
~k-token gradient is the sum over a group of k/min(tokens) chunks divided by its tokens,
its norm averaged over the groups of the sample. Each cell: mean ± std over --seeds.

An existing results.json in --workdir with the same sentences, seeds, ε and tokens is
extended: only its missing (norm, vocabulary, initialization) passes are measured.

Writes results.json, report.md (the table, each factor's effect as a ratio against the
baseline cell: Post-LN / Pre-LN, ε 0, ~4k tokens, unigram 8000, the earlier Fig. 3
measurement's setting) and fig3_magnitudes.png into --workdir.
"""

import json
import os
import sys
import time

from absl import app, flags, logging

from lnjax.core import allocator
allocator.tune_glibc_malloc()  # glibc malloc for XLA:CPU, before JAX starts

from lnjax.analysis import init_gradients  # noqa: E402

_WORKDIR = flags.DEFINE_string("workdir", None, "Where results.json, report.md and the PNG go.",
                               required=True)
_SEEDS = flags.DEFINE_integer("seeds", 10, "Initializations per cell.")
_SMOKE = flags.DEFINE_bool("smoke", False, "Tiny models and data sizes (tests use it).")

_LABEL_SMOOTHING = flags.DEFINE_list("label_smoothing", ["0", "0.1"], "ε of the loss.")
_TOKENS = flags.DEFINE_list("tokens", ["1024", "4096", "16384"],
                            "Target tokens a gradient is averaged over (each a multiple of "
                            "the smallest).")
_VOCABS = flags.DEFINE_list("vocabs", ["unigram:8000", "bpe:10000"],
                            "Joint SentencePiece vocabularies, TYPE:SIZE.")
_MAX_LEN = flags.DEFINE_integer("max_len", 32, "Longest pair kept (tokens, EOS included).")
_NORMS = flags.DEFINE_list("norms", ["post", "pre"], "Norm placements measured.")
# Each initialization: (model.pos_emb, the gain of every attention's q/k/v kernel, its
# name in the report).
INIT_SETTINGS = {
    "lnjax": ("learned", 1.0, "lnjax (learned positions, q/k/v gain 1)"),
    "sinusoidal": ("sinusoidal", 1.0, "sinusoidal positions"),
    "fairseq": ("sinusoidal", 2 ** -0.5, "fairseq (sinusoidal positions, q/k/v gain 1/√2)"),
}
INITS = tuple(INIT_SETTINGS)
_INITS = flags.DEFINE_list("inits", list(INITS), "Initializations (the first with every "
                           f"vocabulary, the others with the first): {', '.join(INITS)}.")
_REPORT_ONLY = flags.DEFINE_bool("report_only", False, "Rewrite report.md and the PNG from "
                                 "--workdir's results.json; measure nothing.")

# Xiong et al. 2020, arXiv 2002.04745, read off Fig. 3 (c, d), whose x axis is total layers (half
# encoder, half decoder): Post-LN ≈1.6 at every depth; Pre-LN ≈0.3 at 6 and ≈0.13 at 14,
# so ≈0.17 at this model's 12 by linear interpolation (≈0.14–0.21 by a 1/√L fit to
# either end point).
PAPER = {"post": 1.6, "pre": 0.17}
PAPER_TEXT = {"post": "≈1.6", "pre": "≈0.17 (between ≈0.3 at 6 and ≈0.13 at 14 layers)"}


def vocab_config(norm: str, vocab: str, init: str = "lnjax"):
  model_type, size = vocab.split(":")
  c = init_gradients.make_config("translation", norm, smoke=_SMOKE.value)
  with c.unlocked():
    c.model.pos_emb = INIT_SETTINGS[init][0]
    c.data.sp_model_type = model_type
    if not _SMOKE.value:
      c.data.vocab_size = int(size)
  return c


def train_split(config):
  """(MTData, the train split's token ids) of this config's vocabulary."""
  from lnjax import tasks
  from lnjax.core import build
  data = build.build(config, build.one_device_mesh(), tasks=tasks.get, whole_data=True).data
  return data, data._split("train", with_text=False)


def sample_pairs(lengths: list, rows_per_chunk_of, chunks: int, max_len: int):
  """Pair ids (seed 0) whose both sides fit max_len under every vocabulary; the rows of a
  chunk from the first vocabulary's mean target length."""
  import numpy as np
  ok = np.ones_like(lengths[0][0], bool)
  for src, tgt in lengths:
    ok &= (src <= max_len) & (tgt <= max_len)
  ids = np.random.default_rng(0).permutation(np.flatnonzero(ok))
  rows = rows_per_chunk_of(float(lengths[0][1][ok].mean()))
  return ids[:rows * chunks].reshape(chunks, rows), float(ok.mean())


class Gradients:
  """Per chunk, the summed-loss gradient of the last decoder layer's W² for each ε."""

  def __init__(self, config, data, epsilons: list[float], init: str = "lnjax"):
    import jax
    import jax.numpy as jnp

    m = init_gradients.Measurer(config, data, num_batches=0)  # The model and its init.
    self.measurer, setup = m, m.setup
    self.layer = f"layer_{m.run.model.num_layers - 1}"

    def with_w2(params, w2):
      dec = dict(params["decoder"])
      layer = dict(dec[self.layer])
      layer["ffn"] = {**layer["ffn"], "wo": {**layer["ffn"]["wo"], "kernel": w2}}
      dec[self.layer] = layer
      return {**params, "decoder": dec}

    def chunk_grads(params, batch):
      def sums(w2):
        outputs = setup.model.apply({"params": with_w2(params, w2)},
                                    *setup.task.model_inputs(batch), deterministic=True)
        return jnp.stack([setup.task.loss(outputs, batch, eps)[0] for eps in epsilons])
      w2 = params["decoder"][self.layer]["ffn"]["wo"]["kernel"]
      values, vjp = jax.vjp(sums, w2)
      eye = jnp.eye(len(epsilons), dtype=values.dtype)
      return jnp.stack([vjp(eye[i])[0] for i in range(len(epsilons))]), batch["weights"].sum()

    # [chunks, ε, d_ff, d_model] summed-loss gradients and [chunks] target tokens.
    self._run = jax.jit(lambda params, chunks: jax.lax.map(
        lambda b: chunk_grads(params, b), chunks))
    self.qkv_gain = INIT_SETTINGS[init][1]

  def __call__(self, seed: int, chunks):
    import numpy as np
    g, n = self._run(scale_qkv(self.measurer.init(seed), self.qkv_gain), chunks)
    return np.asarray(g, np.float64), np.asarray(n, np.float64)


def scale_qkv(params, gain: float):
  """Every attention's query/key/value kernel × gain: a Xavier-uniform sample times
  `gain` is a Xavier-uniform sample at that gain (fairseq's nn.init.xavier_uniform_)."""
  import jax
  if gain == 1.0:
    return params
  return jax.tree_util.tree_map_with_path(
      lambda path, x: x * gain if [getattr(k, "key", None) for k in path[-2:]] in (
          ["query", "kernel"], ["key", "kernel"], ["value", "kernel"]) else x, params)


def group_norms(g, n, group: int) -> float:
  """Mean over consecutive groups of `group` chunks of ‖Σ g / Σ n‖_F, per ε."""
  import numpy as np
  k = g.shape[0] // group
  sums = g[:k * group].reshape(k, group, *g.shape[1:]).sum(1)
  tokens = n[:k * group].reshape(k, group).sum(1)
  norms = np.sqrt((sums ** 2).sum((-1, -2))) / tokens[:, None]  # [groups, ε]
  return norms.mean(0)


def measure(root: str, done: dict | None = None) -> dict:
  """The cells of every (norm, vocabulary, init) pass; `done`: an earlier results.json
  of the same sample, seeds, ε and tokens, whose passes are kept and not measured again."""
  import jax
  import numpy as np

  inits = _INITS.value
  if unknown := sorted(set(inits) - set(INITS)):
    raise app.UsageError(f"--inits: {', '.join(unknown)} not among {', '.join(INITS)}")
  epsilons = [float(e) for e in _LABEL_SMOOTHING.value]
  tokens = sorted(int(t) for t in _TOKENS.value)
  if any(t % tokens[0] for t in tokens):
    raise app.UsageError("--tokens: each must be a multiple of the smallest")
  chunks = tokens[-1] // tokens[0]
  splits = {v: train_split(vocab_config("post", v)) for v in _VOCABS.value}
  lengths = [(sp.src.lengths + 1, sp.tgt.lengths + 1) for _, sp in splits.values()]
  ids, kept = sample_pairs(lengths, lambda mean: max(1, round(tokens[0] / mean)), chunks,
                           _MAX_LEN.value)
  out = {"epsilons": epsilons, "tokens": tokens, "rows_per_chunk": int(ids.shape[1]),
         "chunks": chunks, "max_len": _MAX_LEN.value, "pairs_within_max_len": kept,
         "seeds": _SEEDS.value, "vocabs": {}, "inits": list(inits), "cells": []}
  same = ("epsilons", "tokens", "rows_per_chunk", "chunks", "max_len", "seeds",
          "pairs_within_max_len")
  if done and all(done.get(k) == out[k] for k in same):  # The same sentences and seeds.
    out["cells"] = [c for c in done["cells"] if c["vocab"] in splits]
    out["inits"] = sorted(set(done["inits"]) | set(inits), key=INITS.index)
  elif done:
    print(f"{root}/results.json was measured on other sentences, seeds, ε or tokens: "
          "measuring every pass again and replacing it", flush=True)
  measured = {(c["norm"], c["vocab"], c["init"]) for c in out["cells"]}
  for vi, (vocab, (data, split)) in enumerate(splits.items()):
    batches = [data._make_batch(split, row_ids, ids.shape[1], _MAX_LEN.value)
               for row_ids in ids]
    stacked = {k: np.stack([b[k] for b in batches]) for k in batches[0]}
    out["vocabs"][vocab] = {"vocab_size": data.vocab_size,
                            "target_tokens_per_chunk": float(stacked["weights"].sum() / chunks)}
    for init, norm in [(i, n) for i in (inits if vi == 0 else inits[:1]) for n in _NORMS.value]:
      if (norm, vocab, init) in measured:
        continue
      t0 = time.time()
      grads = Gradients(vocab_config(norm, vocab, init), data, epsilons, init)
      per_seed = []  # [seed][tokens][ε]
      for seed in range(_SEEDS.value):
        g, n = grads(seed, jax.tree.map(np.asarray, stacked))
        per_seed.append([group_norms(g, n, t // tokens[0]) for t in tokens])
        del g
      values = np.asarray(per_seed)
      for ti, t in enumerate(tokens):
        for ei, eps in enumerate(epsilons):
          out["cells"].append({"norm": norm, "vocab": vocab, "init": init, "tokens": t,
                               "epsilon": eps,
                               "mean": float(values[:, ti, ei].mean()),
                               "std": float(values[:, ti, ei].std()),
                               "per_seed": values[:, ti, ei].tolist()})
      print(f"{norm}-LN, {vocab}, {init} init: " + ", ".join(
          f"{t} tok ε {e:g}: {values[:, ti, ei].mean():.3f}" for ti, t in enumerate(tokens)
          for ei, e in enumerate(epsilons)) + f" ({time.time() - t0:.0f} s)", flush=True)
  return out


def load(path: str) -> dict:
  """results.json; one written before the initialization factor holds lnjax's only."""
  with open(path) as f:
    r = json.load(f)
  r.setdefault("inits", ["lnjax"])
  for c in r["cells"]:
    c.setdefault("init", "lnjax")
  return r


def cell(r: dict, **key):
  for c in r["cells"]:
    if all(c[k] == v for k, v in key.items()):
      return c
  return None


def baseline_key(r: dict) -> dict:
  tokens = min(r["tokens"], key=lambda t: abs(t - 4096))
  return {"vocab": next(iter(r["vocabs"])), "init": r["inits"][0], "tokens": tokens,
          "epsilon": r["epsilons"][0]}


def factor_rows(r: dict) -> list[tuple[str, str, dict]]:
  """(factor, the level, the baseline key with that one factor changed)."""
  base = baseline_key(r)
  rows = [("baseline", f"ε {base['epsilon']:g}, ~{base['tokens']} tokens, {base['vocab']}, "
           f"{base['init']} init", base)]
  rows += [("label smoothing", f"ε {e:g}", {**base, "epsilon": e})
           for e in r["epsilons"] if e != base["epsilon"]]
  rows += [("tokens averaged", f"~{t}", {**base, "tokens": t})
           for t in r["tokens"] if t != base["tokens"]]
  rows += [("vocabulary", v, {**base, "vocab": v}) for v in r["vocabs"] if v != base["vocab"]]
  rows += [("initialization", INIT_SETTINGS[i][2], {**base, "init": i}) for i in r["inits"]
           if i != base["init"]]
  return rows


def series(r: dict) -> list[tuple[str, str]]:
  """The (vocabulary, initialization) pairs measured, in flag order."""
  found = {(c["vocab"], c["init"]) for c in r["cells"]}
  return [(v, i) for i in r["inits"] for v in r["vocabs"] if (v, i) in found]


def report(r: dict, root: str, command: str) -> str:
  norms = sorted({c["norm"] for c in r["cells"]}, key=["post", "pre"].index)
  lines = ["# Fig. 3 magnitudes isolated: last decoder layer's W² gradient at init", "",
           f"Command: `{command}`", "",
           f"{r['seeds']} seeds; {r['chunks']} chunks of {r['rows_per_chunk']} Multi30k train "
           f"pairs (≤ {r['max_len']} tokens a side; {100 * r['pairs_within_max_len']:.0f}% of "
           "the pairs), the same sentences for every cell; target tokens a chunk: "
           + ", ".join(f"{v} {d['target_tokens_per_chunk']:.0f} (vocabulary {d['vocab_size']})"
                       for v, d in r["vocabs"].items()) + ".", "",
           "## One factor at a time against the baseline", "",
           "| factor | level | " + " | ".join(f"{n}-LN (× baseline)" for n in norms) + " |",
           "|---|---|" + "---|" * len(norms)]
  for factor, level, key in factor_rows(r):
    cells = []
    for n in norms:
      c, b = cell(r, norm=n, **key), cell(r, norm=n, **baseline_key(r))
      cells.append(f"{c['mean']:.3f} ± {c['std']:.3f} (×{c['mean'] / b['mean']:.2f})")
    lines.append(f"| {factor} | {level} | " + " | ".join(cells) + " |")
  lines.append("| paper (Fig. 3, read off) | IWSLT14, fairseq, 12 layers | "
               + " | ".join(PAPER_TEXT[n] for n in norms) + " |")
  lines += ["", "## Every cell", "",
            "| vocabulary | initialization | tokens | ε | "
            + " | ".join(f"{n}-LN" for n in norms) + " |",
            "|---|---|---|---|" + "---|" * len(norms)]
  for v, i in series(r):
    for t in r["tokens"]:
      for e in r["epsilons"]:
        cells = [cell(r, norm=n, vocab=v, init=i, tokens=t, epsilon=e) for n in norms]
        lines.append(f"| {v} | {i} | ~{t} | {e:g} | "
                     + " | ".join(f"{c['mean']:.3f} ± {c['std']:.3f}" for c in cells) + " |")
  lines += ["", "![Fig. 3 magnitudes](fig3_magnitudes.png)", ""]
  text = "\n".join(lines)
  with open(os.path.join(root, "report.md"), "w") as f:
    f.write(text)
  return text


# Legend names of the initializations (the report's INIT_SETTINGS names are longer).
INIT_LEGEND = {"lnjax": "learned positions", "sinusoidal": "sinusoidal positions",
               "fairseq": "fairseq init (sinusoidal, q/k/v gain 1/√2)"}


def series_label(vocab: str, init: str, epsilon: float) -> str:
  """'unigram 8000, learned positions, label smoothing 0.1'."""
  kind, size = vocab.split(":")
  smoothing = f"label smoothing {epsilon:g}" if epsilon else "no label smoothing"
  return f"{'BPE' if kind == 'bpe' else kind} {size}, {INIT_LEGEND.get(init, init)}, {smoothing}"


def seed_curves(r: dict, cells: list[dict]) -> list[tuple[list, list]]:
  """One (tokens, norms) curve per seed; one of the means where per-seed values are absent."""
  if all(c.get("per_seed") for c in cells):
    return [(r["tokens"], list(ys)) for ys in zip(*(c["per_seed"] for c in cells))]
  return [(r["tokens"], [c["mean"] for c in cells])]


def plot(r: dict, path: str) -> None:
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  from matplotlib.ticker import NullLocator

  from lnjax.analysis import plotting

  norms = sorted({c["norm"] for c in r["cells"]}, key=["post", "pre"].index)
  rows = len(series(r)) * len(r["epsilons"])
  fig, axes = plt.subplots(1, len(norms), figsize=(6 * len(norms), 4 + 0.12 * rows),
                           squeeze=False)
  for ax, n in zip(axes[0], norms):
    for si, (v, i) in enumerate(series(r)):
      for e, style in zip(r["epsilons"], ("-", "--", ":")):
        cs = [cell(r, norm=n, vocab=v, init=i, tokens=t, epsilon=e) for t in r["tokens"]]
        line = plotting.mean_band(ax, seed_curves(r, cs), label=series_label(v, i, e),
                                  style=style, marker="o", color=f"C{si}")
        line.set_label(series_label(v, i, e))  # The caption gives the seeds, once.
    paper = ax.axhline(PAPER[n], color="k", ls="--", lw=1)
    ax.set_xscale("log", base=2)
    plotting.plain_log_ticks(ax)
    # Ticks at the measured token counts, written out (1,024 rather than 2¹⁰ or 1e+03).
    ax.set_xticks(r["tokens"], [f"{t:,}" for t in r["tokens"]])
    ax.xaxis.set_minor_locator(NullLocator())
    ax.set_xlabel("target tokens the gradient is averaged over (log scale)")
    ax.set_ylabel(f"‖∂L/∂W²‖_F, last decoder layer\n(L in {plotting.LOSS_UNIT})")
    ax.set_title(f"{plotting.placement_label(n)} at initialization")
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend([paper], [f"Xiong et al. 2020, Fig. 3: {PAPER_TEXT[n]}"], fontsize=7,
              loc="lower right")
  fig.suptitle("What moves Fig. 3's magnitude: the last decoder layer's W² gradient")
  # The series' legend once, below both panels, where it hides no point (above the
  # caption): a row per series, a column per ε.
  handles, labels = axes[0][0].get_legend_handles_labels()
  by_eps = sorted(range(len(labels)), key=lambda k: k % len(r["epsilons"]))
  height = fig.get_figheight()
  fig.legend([handles[k] for k in by_eps], [labels[k] for k in by_eps], loc="lower center",
             ncol=len(r["epsilons"]), fontsize=7, handlelength=3,
             bbox_to_anchor=(0.5, 0.28 / height))
  fig.tight_layout(rect=(0, (0.17 * len(series(r)) + 0.2) / height, 1, 1))
  plotting.add_caption(fig, "; ".join((
      "translation, 6+6 layers, d_model 512", plotting.setup_caption(seeds=r["seeds"]),
      f"{r['chunks']} chunks of {r['rows_per_chunk']} Multi30k train pairs "
      f"(≤ {r['max_len']} tokens a side)")))
  plotting.save(fig, path, dpi=120)


def main(argv):
  del argv
  logging.set_verbosity(logging.WARNING)
  root = _WORKDIR.value
  os.makedirs(root, exist_ok=True)
  path = os.path.join(root, "results.json")
  if _REPORT_ONLY.value:
    results = load(path)
  else:
    t0 = time.time()
    results = measure(root, load(path) if os.path.exists(path) else None)
    results["seconds"] = time.time() - t0
    results["command"] = ("python experiments/fig3_magnitudes.py "
                          + " ".join(sys.argv[1:])).strip()
    with open(path, "w") as f:
      json.dump(results, f, indent=1)
  plot(results, os.path.join(root, "fig3_magnitudes.png"))
  command = results.get("command", "python experiments/fig3_magnitudes.py")
  print(report(results, root, command))
  print(f"Report: {os.path.join(root, 'report.md')} ({results['seconds']:.0f} s)")


if __name__ == "__main__":
  app.run(main)
