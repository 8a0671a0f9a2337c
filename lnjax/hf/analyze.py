"""lnjax's analyses on a Hugging Face GPT-2 or BERT, with the loss of its own objective on
a text (`python -m lnjax.cli.analyze --hf=DIR_OR_NAME --text=FILE`).

The text is tokenized by the model's own tokenizer and cut into windows of `seq_len`
tokens: GPT-2 predicts each next token; BERT sees [CLS] window [SEP] with 15% of the
window's tokens (at least one, the same seeded choice every run) replaced by [MASK] and
predicts them. On these batches: the analyses of lnjax.analysis.report (per-layer gradient norms,
‖x‖²/d around every LayerNorm, the norms' Jacobians, update ratios) and the layer-removal
profile (lnjax.analysis.removal).
"""

import json
import os
import re

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


def make_batches(task: str, tok: hf_tokenizer.HFTokenizer, text: str, seq_len: int,
                 num_batches: int, batch_size: int) -> list[dict]:
  """Up to `num_batches` batches of `batch_size` windows (fewer if the text is short)."""
  ids = tok.encode(text, add_special_tokens=False)
  width = seq_len + 1 if task == "lm" else seq_len - 2  # Tokens per window.
  if len(ids) < 2:
    raise HFError(f"the text is {len(ids)} token long: too short to score")
  n = min(len(ids) // width, num_batches * batch_size)
  if n == 0:  # A text shorter than one window: one shorter window.
    n, width = 1, len(ids)
  windows_NxW = np.asarray(ids[: n * width], np.int32).reshape(n, width)
  if task == "lm":
    rows = [{"inputs": w[:-1], "targets": w[1:], "weights": np.ones(width - 1, np.float32)}
            for w in windows_NxW]
  else:
    if None in (tok.cls_id, tok.sep_id, tok.mask_id):
      raise HFError("the tokenizer has no [CLS], [SEP] or [MASK] token: cannot build BERT's "
                    "masked-LM inputs")
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
                  num_batches: int, lr: float | None, *, report):
  """`analyze` on lnjax.analysis.report's flags, each checked first."""
  if source is None:
    raise HFError("lnjax.analysis.report needs --workdir=RUN or --hf=DIR_OR_NAME")
  if text_file is None:
    raise HFError("--hf needs --text=FILE, the text its loss is measured on")
  errors.check_int("--batches", num_batches, 1)
  if lr is not None:
    errors.check_range("--lr", lr, low=0.0, low_open=True)
  return analyze(source, text_file, output, num_batches, lr, report=report)


def analyze(source: str, text_file: str, output: str | None = None, num_batches: int = 4,
            lr: float | None = None, seq_len: int = 128, batch_size: int = 4, *, report):
  """Writes analysis.json, report.md and plots of the imported model into `output`
  (default: ./hf_analysis/<name>); returns (result, output). `report(result, output)`:
  the writer of report.md and the plots (lnjax.analysis.report.figures for a run's)."""
  import jax

  from lnjax import tasks
  from lnjax.core import optim, state as state_lib
  from lnjax.analysis import probes, removal

  text = read_text(text_file)
  folder = resolve(source)
  imported = hf.read_folder(folder)
  if imported.task == "encoder":
    raise HFError(f"{source}: BertModel has no masked-LM head, so no loss of its own "
                  "objective to analyze (use a BertForMaskedLM folder)")
  tok = hf_tokenizer.load(folder)
  if tok.vocab_size > imported.cfg.vocab_size:
    raise HFError(f"{folder}: the tokenizer has {tok.vocab_size} tokens, the model "
                  f"{imported.cfg.vocab_size}")
  task = tasks.get(imported.task)
  opt = optim.OptConfig()
  setup = state_lib.Setup(task, imported.model, None, None)
  batches = make_batches(imported.task, tok, text, min(seq_len, imported.cfg.max_len),
                         num_batches, batch_size)
  params = jax.tree.map(jax.numpy.asarray, imported.params)
  grads = probes.gradients(setup, params, batches)
  lr = lr or opt.learning_rate
  records = probes.norm_inputs(setup, params, batches[0])
  profile = removal.layer_removal(setup, params, batches)
  name = source.rstrip("/").split("/")[-1]
  result = {
      "workdir": source, "step": "pretrained", "architecture": imported.architecture,
      "norm_position": imported.cfg.norm_position, "num_batches": len(batches),
      "tokens_per_window": int(batches[0]["inputs"].shape[1]), "text": os.path.abspath(text_file),
      "loss": profile["loss"],
      "loss_normalization": ("mean per-token NLL (nats) of the next token" if imported.task == "lm"
                             else "mean NLL (nats) of the masked tokens"),
      "gradient_norms": probes.gradient_norms(grads),
      "norms": {p: {"in_sq": r["in_sq"], "out_sq": r["out_sq"]} for p, r in records.items()},
      "norm_jacobians": probes.ln_jacobians(records),
      "update_ratios": probes.update_ratios(grads, params, opt, lr), "update_lr": lr,
      "update_optimizer": opt.name,
      "layer_removal": profile,
  }
  out = output or os.path.join("hf_analysis", name)
  fileio.makedirs(out)
  fileio.write_text(os.path.join(out, "analysis.json"), json.dumps(result, indent=1))
  report(result, out)
  _removal_report(result, out)
  return result, out


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
    lines += [f"| {i} | {d:+.4f} |" for i, d in enumerate(increase)]
    lines += ["", "![layer removal](layer_removal.png)", ""]
    _removal_plot(result, out)
  fileio.write_text(path, "\n".join(lines))


def _removal_plot(result: dict, out: str):
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  increase = result["layer_removal"]["increase"]
  from lnjax.analysis import plotting

  fig, ax = plt.subplots(figsize=(6, 3.9))
  ax.bar(range(len(increase)), increase)
  ax.set_xlabel("layer skipped (0 = next to the input)")
  ax.set_ylabel("loss increase (nats/token)")
  plotting.integer_ticks(ax)
  ax.set_title(f"{result['architecture']} "
               f"({plotting.placement_label(result['norm_position'])}): layer removal")
  ax.grid(alpha=0.3, axis="y")
  fig.tight_layout()
  plotting.add_caption(fig, f"{result['architecture']}, {plotting.layers(len(increase))}; "
                            f"loss {result['loss']:.4f} nats/token on {result['text']}")
  return plotting.save(fig, os.path.join(out, "layer_removal.png"))
