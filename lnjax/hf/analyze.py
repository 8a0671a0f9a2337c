"""lnjax's analyses on a Hugging Face GPT-2 or BERT, with the loss of its own objective on
a text (`python -m lnjax.cli.analyze --hf=DIR_OR_NAME --text=FILE`).

The text is tokenized by the model's own tokenizer and cut into windows of `seq_len`
tokens: GPT-2 predicts each next token; BERT sees [CLS] window [SEP] with 15% of the
window's tokens (at least one, the same seeded choice every run) replaced by [MASK] and
predicts them. On these batches: the analyses of lnjax.analysis.report (per-layer gradient norms,
‖x‖²/d around every LayerNorm, the norms' Jacobians, update ratios) and the layer-removal
profile (lnjax.analysis.removal); GPT-2 and the modern decoders measured one layer at a
time (lnjax.analysis.layerwise: the same numbers, below 2× the weight bytes in memory).
"""

import os
import re
import textwrap

import numpy as np

from lnjax.core import errors, fileio
from lnjax.hf import checkpoint as hf, tokenizer as hf_tokenizer
from lnjax.hf.checkpoint import HFError

MASK_FRACTION = 0.15  # BERT's (Devlin et al. 2019, §3.1).
_REPO_ID = re.compile(r"[A-Za-z0-9][\w.-]*(/[\w.-]+)?")
_HUB_FILES = ["config.json", "*.safetensors", "model.safetensors.index.json", "tokenizer*",
              "vocab*", "merges.txt", "special_tokens_map.json"]


def resolve(source: str) -> str:
  """A local model folder as it is; a hub name (gpt2, google-bert/bert-base-uncased) as
  the folder of huggingface_hub's cache, fetched when online."""
  if os.path.isdir(source):
    return source
  if os.path.exists(source) or not _REPO_ID.fullmatch(source):
    raise HFError(f"{source} is not a model folder (nor a Hugging Face hub name)")
  from huggingface_hub import snapshot_download

  try:
    return snapshot_download(source, allow_patterns=_HUB_FILES)
  except Exception as e:  # Offline: LocalEntryNotFoundError, connection errors, 404s.
    reason = str(e).strip().splitlines()[0][:200] if str(e).strip() else type(e).__name__
    raise HFError(f"could not fetch {source!r} from the Hugging Face hub ({reason}); "
                  "offline, pass a local model folder") from None


def read_text(path: str) -> str:
  try:
    with open(path, "rb") as f:
      raw = f.read()
  except OSError as e:
    raise HFError(f"--text={path}: {e.strerror or e}") from None
  try:
    text = raw.decode("utf-8")
  except UnicodeDecodeError as e:
    raise HFError(f"--text={path} is not UTF-8 text (byte {raw[e.start]:#04x} at offset "
                  f"{e.start})") from None
  if not text.strip():
    raise HFError(f"--text={path} is empty")
  return text


def read_token_ids(path: str, vocab_size: int) -> np.ndarray:
  """Token ids from a .npy file (any integer array, flattened) or a text file of integers
  separated by white space; each checked to be in [0, vocab_size)."""
  try:
    if path.endswith(".npy"):
      ids = np.load(path, allow_pickle=False)
    else:
      with open(path, encoding="utf-8") as f:
        ids = np.asarray([int(t) for t in f.read().split()], np.int64)
  except (OSError, ValueError, UnicodeDecodeError) as e:
    reason = getattr(e, "strerror", None) or str(e).splitlines()[0][:160]
    raise HFError(f"--token_ids={path}: {reason} (a .npy array of integers, or integers "
                  "separated by white space)") from None
  if ids.dtype.kind not in "iu" or ids.size < 2:
    raise HFError(f"--token_ids={path}: needs at least 2 integer token ids, found "
                  f"{ids.size} of dtype {ids.dtype}")
  ids = ids.reshape(-1)
  if ids.min() < 0 or ids.max() >= vocab_size:
    bad = int(ids.min() if ids.min() < 0 else ids.max())
    raise HFError(f"--token_ids={path}: id {bad} is outside the model's vocabulary "
                  f"[0, {vocab_size})")
  return ids.astype(np.int32)


def make_batches(task: str, tok, text_or_ids, seq_len: int, num_batches: int,
                 batch_size: int) -> list[dict]:
  """Up to `num_batches` batches of `batch_size` windows (fewer if the text is short) of a
  text (encoded by `tok`) or of token ids. BERT's windows need `tok`'s [CLS], [SEP], [MASK]."""
  if isinstance(text_or_ids, str):
    ids = tok.encode(text_or_ids, add_special_tokens=False)
  else:
    ids = np.asarray(text_or_ids, np.int32)
  width = seq_len + 1 if task == "lm" else seq_len - 2  # Tokens per window.
  if len(ids) < 2:
    raise HFError(f"the text is {len(ids)} token long: too short to score")
  if width < 1:
    raise HFError(f"a window of {seq_len} positions leaves no room for a token between "
                  "[CLS] and [SEP] (BERT needs max_position_embeddings >= 3)")
  n = min(len(ids) // width, num_batches * batch_size)
  if n == 0:  # A text shorter than one window: one shorter window.
    n, width = 1, len(ids)
  windows_NxW = np.asarray(ids[: n * width], np.int32).reshape(n, width)
  if task == "lm":
    rows = [{"inputs": w[:-1], "targets": w[1:], "weights": np.ones(width - 1, np.float32)}
            for w in windows_NxW]
  else:
    if tok is None or None in (tok.cls_id, tok.sep_id, tok.mask_id):
      raise HFError("the tokenizer has no [CLS], [SEP] or [MASK] token (or none was given: "
                    "--tokenizer): cannot build BERT's masked-LM inputs")
    rng = np.random.RandomState(0)
    p = max(1, round(MASK_FRACTION * width))
    rows = []
    for w in windows_NxW:
      chosen_P = np.sort(rng.choice(width, p, replace=False))
      masked = w.copy()
      masked[chosen_P] = tok.mask_id
      tokens = np.concatenate([[tok.cls_id], masked, [tok.sep_id]]).astype(np.int32)
      rows.append({"inputs": tokens, "segment_ids": np.zeros_like(tokens),
                   "mlm_positions": (chosen_P + 1).astype(np.int32), "targets": w[chosen_P],
                   "weights": np.ones(p, np.float32)})
  return [{k: np.stack([r[k] for r in rows[i:i + batch_size]]) for k in rows[0]}
          for i in range(0, len(rows), batch_size)]


def analyze_flags(source: str | None, text_file: str | None, output: str | None,
                  num_batches: int, lr: float | None, *, report, tokenizer: str | None = None,
                  token_ids: str | None = None):
  """`analyze` on lnjax.analysis.report's flags, each checked first."""
  if source is None:
    raise HFError("lnjax.analysis.report needs --workdir=RUN or --hf=DIR_OR_NAME")
  if (text_file is None) == (token_ids is None):
    raise HFError("--hf needs --text=FILE (the text its loss is measured on) or "
                  "--token_ids=FILE (token ids), one of the two")
  errors.check_int("--batches", num_batches, 1)
  if lr is not None:
    errors.check_range("--lr", lr, low=0.0, low_open=True)
  memory_first_scheduling()
  return analyze(source, text_file, output, num_batches, lr, report=report,
                 tokenizer=tokenizer, token_ids=token_ids)


# XLA:CPU computes bfloat16 dots in float32; its concurrency-optimized scheduler converts
# every weight before the first layer runs, so a bfloat16 model's forward pass holds a
# float32 copy of all its weights (a 236 MiB model: +480 MiB, +146 MiB without it;
# BENCHMARKS.md, 2026-12-05). The memory-first scheduler, for the analysis command only.
_XLA_MEMORY_FIRST = "--xla_cpu_enable_concurrency_optimized_scheduler=false"


def memory_first_scheduling() -> None:
  """Asks XLA:CPU for its memory-minimizing scheduler (effective before JAX's CPU backend
  starts: the analyze command calls it first)."""
  flags = os.environ.get("XLA_FLAGS", "")
  if "concurrency_optimized_scheduler" not in flags:
    os.environ["XLA_FLAGS"] = f"{flags} {_XLA_MEMORY_FIRST}".strip()


def tokenizer_for(folder: str, tokenizer: str | None):
  """The tokenizer of `tokenizer` (a folder or hub name) if given, else the model folder's;
  None if neither has one and none is needed."""
  source = folder if tokenizer is None else resolve(tokenizer)
  try:
    return hf_tokenizer.load(source)
  except HFError as e:
    if tokenizer is None and "has no tokenizer" in str(e):
      raise HFError(f"{e}: name one with --tokenizer=DIR_OR_NAME, or give token ids with "
                    "--token_ids=FILE") from None
    raise


def analyze(source: str, text_file: str | None, output: str | None = None,
            num_batches: int = 4, lr: float | None = None, seq_len: int = 128,
            batch_size: int = 4, *, report, tokenizer: str | None = None,
            token_ids: str | None = None):
  """Writes analysis.json, report.md and plots of the imported model into `output`
  (default: ./hf_analysis/<name>); returns (result, output). `report(result, output)`:
  the writer of report.md and the plots (lnjax.analysis.report.figures for a run's).
  The text is `text_file` tokenized by the folder's tokenizer or `tokenizer`'s, or the ids
  of `token_ids` (read_token_ids)."""
  text = read_text(text_file) if text_file is not None else None
  folder = resolve(source)
  imported = hf.read_folder(folder)
  if imported.task == "encoder":
    raise HFError(f"{source}: BertModel has no masked-LM head, so no loss of its own "
                  "objective to analyze (use a BertForMaskedLM folder)")
  tok = None
  if text is not None or tokenizer is not None or imported.task == "mlm":
    tok = tokenizer_for(folder, tokenizer)
    if tok.vocab_size > imported.cfg.vocab_size:
      raise HFError(f"{tokenizer or folder}: the tokenizer has {tok.vocab_size} tokens, the "
                    f"model {imported.cfg.vocab_size}")
  data = text if text is not None else read_token_ids(token_ids, imported.cfg.vocab_size)
  batches = make_batches(imported.task, tok, data, min(seq_len, imported.cfg.max_len),
                         num_batches, batch_size)
  result = measure(imported, batches, lr)
  result.update(workdir=source, text=os.path.abspath(text_file or token_ids),
                tokenizer=None if tok is None else (tokenizer or "the model folder's"))
  out = output or os.path.join("hf_analysis", source.rstrip("/").split("/")[-1])
  fileio.makedirs(out)
  fileio.write_text(os.path.join(out, "analysis.json"), fileio.json_text(result))
  report(result, out)
  _removal_report(result, out)
  return result, out


def measure(imported, batches, lr: float | None = None) -> dict:
  """lnjax.analysis's measurements of an imported model on `batches`."""
  import dataclasses

  from lnjax import tasks
  from lnjax.core import optim, state as state_lib
  from lnjax.analysis import layerwise, probes, removal

  task = tasks.get(imported.task)
  opt = optim.OptConfig()
  setup = state_lib.Setup(task, imported.model, None, None)
  params, lr = imported.params, lr or opt.learning_rate
  if layerwise.applies(imported.task, imported.cfg):
    # GPT-2 and the modern decoders: one layer's gradient (and its float32 temporaries) at
    # a time, the output matrix by vocabulary chunks (the same numbers).
    forward = layerwise.forward(imported.cfg, params, batches)
    grad_norms, update_ratios = layerwise.gradient_and_update_norms(forward, opt, lr)
    profile = layerwise.layer_removal(forward)
    records = layerwise.norm_inputs(forward)
    del forward
  else:
    # BERT: the gradients with each layer recomputed in the backward pass, the activations
    # of one layer held at a time (the same parameters, the same numbers).
    remat = hf.make_model(imported.task, dataclasses.replace(imported.cfg,
                                                             remat_policy="nothing_saveable"))
    grad_norms, update_ratios, _ = probes.gradient_and_update_norms(  # Loss: the profile's.
        state_lib.Setup(task, remat, None, None), params, batches, opt, lr)
    profile = removal.layer_removal(setup, params, batches)
    records = probes.norm_inputs(setup, params, batches[0])
  cfg = imported.cfg
  return {
      "step": "pretrained", "architecture": imported.architecture,
      "norm_position": cfg.norm_position, "placement": imported.placement,
      "num_layers": cfg.num_layers, "d_model": cfg.d_model, "dtype": cfg.dtype,
      "num_batches": len(batches), "tokens_per_window": int(batches[0]["inputs"].shape[1]),
      "loss": profile["loss"],
      "loss_normalization": ("mean per-token NLL (nats) of the next token" if imported.task == "lm"
                             else "mean NLL (nats) of the masked tokens"),
      "gradient_norms": grad_norms,
      "norms": {p: {"in_sq": r["in_sq"], "out_sq": r["out_sq"]} for p, r in records.items()},
      "norm_jacobians": probes.ln_jacobians(records),
      "update_ratios": update_ratios, "update_lr": lr, "update_optimizer": opt.name,
      "layer_removal": profile,
  }


def _removal_report(result: dict, out: str) -> None:
  """Retitles report.md for the imported model and adds the layer-removal profile (table
  and plot)."""
  path = os.path.join(out, "report.md")
  lines = fileio.read_text(path).split("\n")
  lines[0] = (f"# Analysis of {result['architecture']} from {result['workdir']} on "
              f"{result['text']}")
  increase = result["layer_removal"]["increase"]
  lines += ["## Layer removal", "",
            f"Loss {result['loss']:.4f}; the increase when one layer's block is skipped:", ""]
  if increase is None:
    lines += ["(not defined for this depth or placement)", ""]
  else:
    lines += ["| layer | Δ loss |", "|---|---|"]
    lines += [f"| {i} | {d:+.4f} |" for i, d in enumerate(increase, 1)]
    lines += ["", "![layer removal](layer_removal.png)", ""]
    _removal_plot(result, out)
  fileio.write_text(path, "\n".join(lines))


def _removal_plot(result: dict, out: str):
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  increase = result["layer_removal"]["increase"]
  from lnjax.analysis import plotting

  from lnjax.analysis import report

  n = len(increase)
  fig, ax = plt.subplots(figsize=(max(6, 0.22 * n + 2), 3.9))
  layers_L = np.arange(1, n + 1)  # Counted from 1, as in gradients.png.
  ax.bar(layers_L, increase, width=0.8)
  ax.set_xlim(0.4, n + 0.6)  # Every bar whole, the last one too.
  ax.set_xlabel("layer skipped (1 = next to the input)")
  ax.set_ylabel("loss increase (nats/token)")
  if n <= 40:
    ax.set_xticks(layers_L)
  else:
    plotting.integer_ticks(ax)
  ax.axhline(0.0, color="black", lw=0.8)
  ax.set_title("\n".join(textwrap.wrap(f"{report.figure_title(result)}: layer removal",
                                       int(fig.get_figwidth() * 11))), fontsize=10)
  ax.grid(alpha=0.3, axis="y")
  fig.tight_layout()
  placement = result.get("placement") or plotting.placement_label(result["norm_position"])
  plotting.add_caption(fig, f"{result['architecture']} as {placement}, {plotting.layers(n)}; "
                            f"loss {result['loss']:.4f} nats/token on "
                            f"{plotting.short_path(result['text'])}")
  return plotting.save(fig, os.path.join(out, "layer_removal.png"))
