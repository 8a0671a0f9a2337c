"""Hugging Face GPT-2 and BERT folders imported into lnjax's own models, and lnjax models
exported as such folders (lnjax/hf/checkpoint.py, lnjax/hf/tokenizer.py, lnjax/hf/analyze.py).

No network: small models with random weights are built from transformers' own config
classes, saved with save_pretrained beside a tokenizer trained here (byte-level BPE for
GPT-2, WordPiece for BERT) on the embedded Tiny Shakespeare, and compared with
transformers on the same padded batch.
"""

import functools
import gzip
import json
import os
import sys

import numpy as np
import pytest

from lnjax.hf import checkpoint as hf, tokenizer as hf_tokenizer
from conftest import (assert_layer_removal_is_the_block_passing_its_input_on, edit_hf_config,
                      read_only, run_command_lines)
import forkserver
from quiet_runs import NO_HEALTH

CORPUS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                      "lnjax", "data", "corpora", "tiny_shakespeare", "input.txt.gz")
TEXTS = ["First Citizen:\nBefore we proceed any further, hear me speak.",
         "All:\nSpeak, speak.",
         "You are all resolved rather to die than to famish?",
         "Ünïcode ☃ and an unseen word: zyzzyva"]


def corpus_lines(n: int = 400) -> list[str]:
  with gzip.open(CORPUS, "rt", encoding="utf-8") as f:
    text = f.read(40_000)
  return [line for line in text.split("\n") if line.strip()][:n]


def _randomize(model, seed: int) -> None:
  """Every weight random (LayerNorm γ, β and the biases too, which transformers
  initializes to 1 and 0: a mapping that dropped them would still agree)."""
  import torch

  gen = torch.Generator().manual_seed(seed)
  with torch.no_grad():
    for p in model.parameters():
      p.copy_(torch.randn(p.shape, generator=gen) * 0.2)


def make_gpt2(folder, tie: bool = True, seed: int = 0):
  import transformers
  from tokenizers import ByteLevelBPETokenizer

  bpe = ByteLevelBPETokenizer()
  bpe.train_from_iterator(corpus_lines(), vocab_size=300, min_frequency=2,
                          special_tokens=["<|endoftext|>"], show_progress=False)
  os.makedirs(folder, exist_ok=True)
  bpe.save_model(str(folder))  # vocab.json, merges.txt: as the hub's gpt2
  tok = transformers.GPT2Tokenizer.from_pretrained(folder)
  tok.save_pretrained(folder)
  config = transformers.GPT2Config(vocab_size=len(tok), n_positions=64, n_embd=32, n_layer=2,
                                   n_head=4, tie_word_embeddings=tie, bos_token_id=0,
                                   eos_token_id=0, layer_norm_epsilon=1e-3)  # (not the default)
  model = transformers.GPT2LMHeadModel(config).eval()
  _randomize(model, seed)
  model.save_pretrained(folder)
  return model


def make_bert(folder, masked_lm: bool = True, seed: int = 1):
  import transformers
  from tokenizers import BertWordPieceTokenizer

  wp = BertWordPieceTokenizer(lowercase=True)
  wp.train_from_iterator(corpus_lines(), vocab_size=250, min_frequency=2, show_progress=False)
  os.makedirs(folder, exist_ok=True)
  wp.save_model(str(folder))  # vocab.txt: [PAD] 0, [UNK], [CLS], [SEP], [MASK], ...
  tok = transformers.BertTokenizer.from_pretrained(folder)
  tok.save_pretrained(folder)
  config = transformers.BertConfig(vocab_size=len(tok), hidden_size=32, num_hidden_layers=2,
                                   num_attention_heads=4, intermediate_size=64,
                                   max_position_embeddings=64)
  cls = transformers.BertForMaskedLM if masked_lm else transformers.BertModel
  model = cls(config).eval()
  _randomize(model, seed)
  model.save_pretrained(folder)
  return model


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
  root = tmp_path_factory.mktemp("hf")
  models = {"gpt2": make_gpt2(root / "gpt2"), "bert": make_bert(root / "bert"),
            "bert_base": make_bert(root / "bert_base", masked_lm=False)}
  return root, models


def _hf_batch(folder, padding_side: str):
  import transformers

  tok = transformers.AutoTokenizer.from_pretrained(folder)
  if tok.pad_token is None:
    tok.pad_token = tok.eos_token
  tok.padding_side = padding_side
  return tok, tok(TEXTS, padding=True, return_tensors="np")


@pytest.mark.slow
@pytest.mark.parametrize("name,padding_side", [("gpt2", "right"), ("gpt2", "left"),
                                               ("bert", "right"), ("bert_base", "right")])
def test_imported_logits_equal_transformers_on_a_padded_batch(folders, name, padding_side):
  import torch

  root, models = folders
  tok, batch = _hf_batch(root / name, padding_side)
  with torch.no_grad():
    out = models[name](input_ids=torch.tensor(batch["input_ids"]),
                       attention_mask=torch.tensor(batch["attention_mask"]))
  expected = (out.logits if hasattr(out, "logits") else out.last_hidden_state).numpy()
  imported = hf.read_folder(str(root / name))
  assert imported.cfg.norm_position == ("pre" if name == "gpt2" else "post")
  assert imported.cfg.norm_eps == (1e-3 if name == "gpt2" else 1e-12)  # (BERT's ε)
  got = np.asarray(hf.logits(imported, batch["input_ids"], batch["attention_mask"]))
  real = batch["attention_mask"].astype(bool)
  assert got.shape == expected.shape
  assert (batch["attention_mask"] == 0).any()  # The batch is padded.
  np.testing.assert_allclose(got[real], expected[real], atol=1e-4, rtol=0)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["gpt2", "bert"])
def test_token_ids_equal_the_hugging_face_tokenizer(folders, name):
  import transformers

  root, _ = folders
  theirs = transformers.AutoTokenizer.from_pretrained(root / name)
  ours = hf_tokenizer.load(str(root / name))
  for text in TEXTS + corpus_lines(40):
    assert ours.encode(text).tolist() == theirs(text)["input_ids"], text
  if name == "bert":
    assert ours.mask_id == theirs.mask_token_id and ours.pad_id == theirs.pad_token_id
    os.remove(root / name / "tokenizer.json")  # vocab.txt alone: the same ids
    ours = hf_tokenizer.load(str(root / name))
    for text in TEXTS:
      assert ours.encode(text).tolist() == theirs(text)["input_ids"], text


# ---- lnjax -> Hugging Face (lnjax.inference.export --format=hf)


def _trained(workdir, config):
  from lnjax import tasks
  from lnjax.core import train

  config.train.num_steps = config.train.eval_every_steps = config.train.checkpoint_every_steps = 2
  # No train.health statistics (tests/quiet_runs.py): the weights exported are the same;
  # the 6 exports 29.1 -> 26.8 s of CPU (cold compilation cache, 2026-12-07, 2-core machine).
  config.train.health = NO_HEALTH
  train.train_and_evaluate(config, str(workdir), tasks=tasks.get)
  return str(workdir)


def _lm_config(**model):
  from test_train import smoke_config

  return smoke_config(**{f"model.{k}": v for k, v in model.items()})


def _bert_config(**model):
  from test_bert import bert_smoke_config

  c = bert_smoke_config()
  c.model.embed_norm = True
  for k, v in model.items():
    c.model[k] = v
  return c


def _with_data(config, **data):
  for k, v in data.items():
    config.data[k] = v
  return config


EXPORTS = {
    # lnjax's default LM: ReLU, untied output, √D-scaled embedding (written untied).
    "lm_default": lambda: _lm_config(),
    # Tied and unscaled: GPT-2's own layout, tanh-GELU.
    "lm_tied_gelu": lambda: _lm_config(tie_embeddings=True, scale_embeddings=False,
                                       activation="gelu"),
    # A SentencePiece unigram vocabulary.
    "lm_sentencepiece": lambda: _with_data(_lm_config(), tokenizer="sentencepiece",
                                           vocab_size=200),
    # BERT (mlm_nsp, Post-LN, tied, √D-scaled): BertForMaskedLM with the NSP head left out.
    "bert": lambda: _bert_config(),
    # The modern block's families (configs/llama.py): LlamaForCausalLM, Gemma2ForCausalLM.
    "llama": lambda: _llama_config("family=llama,smoke"),
    "gemma2": lambda: _llama_config("family=gemma2,smoke"),
}


def _llama_config(preset: str):
  import lnjax

  return lnjax.get_config("llama", preset)


@pytest.mark.slow
@pytest.mark.parametrize("name", list(EXPORTS))
def test_exported_folder_gives_the_same_logits_in_transformers(tmp_path, name):
  import torch
  import transformers

  from lnjax import tasks
  from lnjax.core import averaging
  from lnjax.inference import export

  workdir = _trained(tmp_path / "run", EXPORTS[name]())
  out = str(tmp_path / "hf")
  result = export.export(workdir, out, "latest", "float32", "hf")
  assert {"config.json", "model.safetensors", "tokenizer.json"} <= set(result["files"])
  bert = name == "bert"
  auto = transformers.AutoModelForMaskedLM if bert else transformers.AutoModelForCausalLM
  theirs = auto.from_pretrained(out).eval()
  tok = transformers.AutoTokenizer.from_pretrained(out)
  texts = ["First Citizen:\nBefore we", "All:\nSpeak, speak."]  # (max_len 32)
  batch = tok(texts, padding=True, return_tensors="np")
  chosen = averaging.restore(workdir, "latest", tasks=tasks.get)
  run = chosen.restored.run
  data = run.task.make_data(run.data, run.seed, 0, 1, 1)
  for text, ids in zip(texts, batch["input_ids"]):  # The run's own token ids.
    expected = data.tokenizer.encode(text).tolist()
    if bert:
      expected = [data.vocab.cls_id] + expected + [data.vocab.sep_id]
    assert ids[: len(expected)].tolist() == expected
  with torch.no_grad():
    want = theirs(input_ids=torch.tensor(batch["input_ids"]),
                  attention_mask=torch.tensor(batch["attention_mask"])).logits.numpy()
  imported = hf.Imported(out, "", "mlm" if bert else "lm", run.model,
                         hf.make_model("mlm" if bert else "lm", run.model), chosen.params, {})
  got = np.asarray(hf.logits(imported, batch["input_ids"], batch["attention_mask"]))
  real = batch["attention_mask"].astype(bool)
  np.testing.assert_allclose(got[real], want[real], atol=1e-4, rtol=0)


# ---- Refusals, the layer-removal profile, the analysis command (no torch needed)


def lnjax_folder(folder, task: str = "lm", **model) -> str:
  """A Hugging Face folder written by lnjax from a random lnjax model (hf.to_hf), with a
  character tokenizer: valid input for the import, made without transformers."""
  chars, cfg, model, params, config, tensors = _lnjax_weights(task, tuple(sorted(model.items())))
  hf.write_folder(str(folder), config, tensors)
  hf_tokenizer.write(str(folder), hf_tokenizer.char_tokenizer(chars), cfg.max_len,
                     bert=task == "mlm")
  return str(folder), model, params


@functools.cache
def _lnjax_weights(task: str, model: tuple):
  """lnjax_folder's model, weights and tensors, made once per (task, options): 13 tests ask
  for 4 models (init op by op, then to_hf). Read-only: the tests edit the written folder."""
  import jax

  from lnjax.models import ModelConfig

  chars = "".join(sorted(set("".join(TEXTS + corpus_lines(50)))))
  vocab = len(chars) + 2 + (3 if task == "mlm" else 0)
  defaults = dict(norm_position="pre", tie_embeddings=True, scale_embeddings=False,
                  activation="gelu") if task == "lm" else dict(
                      norm_position="post", embed_norm=True, activation="gelu_erf",
                      norm_eps=1e-12, tie_embeddings=True, scale_embeddings=False)
  cfg = ModelConfig(vocab_size=vocab, num_layers=3, d_model=16, num_heads=2, d_ff=32,
                    max_len=64, dropout_rate=0.0, **{**defaults, **dict(model)})
  model = hf.make_model(task, cfg)
  params = jax.tree.map(lambda x: np.asarray(x) + 0.1 * np.random.RandomState(0).randn(*x.shape),
                        hf._init(model, task))  # LN γ, β and biases away from 1 and 0
  config, tensors = hf.to_hf(task, cfg, params)
  tensors = {k: v.astype(np.float32) for k, v in tensors.items()}
  read_only(params, tensors)
  # (With the exports' health off: the file 52.1, 52.4 -> 48.7, 47.6 s of CPU, cold
  # compilation cache, 2026-12-07, 2-core machine.)
  return chars, cfg, model, params, config, tensors


def _edit_tensors(folder, edit):
  from safetensors.numpy import load_file, save_file

  path = os.path.join(folder, "model.safetensors")
  tensors = load_file(path)
  edit(tensors)
  save_file(tensors, path)


BAD_FOLDERS = {
    "not_a_model": (lambda d: os.remove(os.path.join(d, "config.json")),
                    "is not a Hugging Face model folder: it has no config.json"),
    "architecture": (lambda d: edit_hf_config(d, architectures=["MistralForCausalLM"]),
                     "architectures=['MistralForCausalLM'] is not supported"),
    "activation": (lambda d: edit_hf_config(d, activation_function="swish"),
                   "activation_function='swish' is not supported"),
    "layer_scaled_attention": (lambda d: edit_hf_config(d, scale_attn_by_inverse_layer_idx=True),
                               "scale_attn_by_inverse_layer_idx=True is not supported"),
    "missing_tensor": (lambda d: _edit_tensors(d, lambda t: t.pop("transformer.h.2.ln_2.weight")),
                       "has no tensor 'transformer.h.2.ln_2.weight'"),
    "mismatched_shape": (lambda d: edit_hf_config(d, n_inner=48),
                         "tensor 'transformer.h.0.mlp.c_fc.weight' has shape (16, 32), "
                         "config.json implies (16, 48)"),
    "unknown_tensor": (lambda d: _edit_tensors(d, lambda t: t.update(
        {"transformer.h.0.attn.q_attn.weight": np.zeros((16, 16), np.float32)})),
                       "tensor 'transformer.h.0.attn.q_attn.weight' is not supported"),
    "truncated": (lambda d: os.truncate(os.path.join(d, "model.safetensors"),
                                        os.path.getsize(os.path.join(d, "model.safetensors")) // 2),
                  "is not a readable safetensors file, truncated or corrupt"),
    "pytorch_bin_only": (lambda d: os.rename(os.path.join(d, "model.safetensors"),
                                             os.path.join(d, "pytorch_model.bin")),
                         "has no model.safetensors (lnjax reads safetensors only"),
}


@pytest.mark.parametrize("case", list(BAD_FOLDERS))
def test_a_folder_lnjax_cannot_import_is_refused_in_one_line(tmp_path, case):
  folder, _, _ = lnjax_folder(tmp_path / "gpt2")
  hf.read_folder(folder)  # (valid before the edit)
  edit, message = BAD_FOLDERS[case]
  edit(folder)
  with pytest.raises(hf.HFError) as e:
    hf.read_folder(folder)
  assert message in str(e.value) and "\n" not in str(e.value)


def test_bert_fields_lnjax_cannot_carry_are_refused(tmp_path):
  folder, _, _ = lnjax_folder(tmp_path / "bert", "mlm")
  assert hf.read_folder(folder).cfg.embed_norm
  for key, value in [("position_embedding_type", "relative_key"), ("is_decoder", True),
                     ("type_vocab_size", 3)]:
    edit_hf_config(folder, **{key: value})
    with pytest.raises(hf.HFError, match=f"config.json: {key}={value!r} is not supported"):
      hf.read_folder(folder)
    edit_hf_config(folder, **{key: {"position_embedding_type": "absolute", "is_decoder": False,
                                  "type_vocab_size": 2}[key]})


@pytest.mark.parametrize("task,model,message", [
    ("lm", dict(norm_position="post"), "model.norm_position='post' does not map onto "
     "GPT2LMHeadModel: GPT-2 is Pre-LN"),
    ("lm", dict(norm_kind="rmsnorm"), "model.norm_kind='rmsnorm' does not map"),
    ("lm", dict(pos_emb="sinusoidal"), "model.pos_emb='sinusoidal' does not map"),
    ("mlm", dict(embed_norm=False), "model.embed_norm=False does not map onto BertForMaskedLM"),
    ("translation", {}, "task 'translation' has no Hugging Face counterpart"),
])
def test_a_config_that_does_not_map_is_refused_naming_the_field(task, model, message):
  from lnjax.models import ModelConfig

  base = dict(norm_position="post", embed_norm=True) if task == "mlm" else {}
  cfg = ModelConfig(vocab_size=10, num_layers=1, d_model=8, num_heads=2, d_ff=16,
                    **{**base, **model})
  with pytest.raises(hf.HFError, match=message.replace("(", r"\(")):
    hf.to_hf(task, cfg, {})


@pytest.mark.slow
@pytest.mark.parametrize("task", ["lm", "mlm"])
def test_written_folder_imports_back_to_the_same_logits(tmp_path, task):
  """lnjax -> folder -> lnjax, for a √D-scaled untied LM and a scaled tied BERT (written
  untied): the same logits (transformers' side is test_exported_folder_gives_...)."""
  model_options = dict(scale_embeddings=True, tie_embeddings=task == "mlm")
  folder, model, params = lnjax_folder(tmp_path / task, task, **model_options)
  imported = hf.read_folder(folder)
  ids = hf_tokenizer.load(folder).encode(TEXTS[0])[None]
  original = hf.Imported(folder, "", task, model.cfg, model, params, {})
  np.testing.assert_allclose(np.asarray(hf.logits(imported, ids)),
                             np.asarray(hf.logits(original, ids)), atol=1e-5, rtol=0)


@pytest.mark.slow
@pytest.mark.parametrize("norm_position", ["pre", "post"])
def test_layer_removal_equals_the_model_with_that_block_passing_its_input_on(norm_position):
  """removal.layer_removal (a model one layer shallower, later layers moved down) against
  the full model whose block i returns its input, intercepted."""
  import flax.linen as nn
  import jax
  import jax.numpy as jnp

  from lnjax import tasks
  from lnjax.models import ModelConfig, TransformerLM, init_params
  from lnjax.core.state import Setup

  cfg = ModelConfig(vocab_size=20, num_layers=3, d_model=16, num_heads=2, d_ff=32,
                    norm_position=norm_position, dropout_rate=0.0)
  model = TransformerLM(cfg)
  params = nn.unbox(init_params(model, jax.random.key(0), jnp.ones((1, 8), jnp.int32)))
  rng = np.random.RandomState(1)
  tokens = rng.randint(1, 20, (2, 9)).astype(np.int32)
  batches = [{"inputs": tokens[:, :-1], "targets": tokens[:, 1:],
              "weights": np.ones((2, 8), np.float32)}]
  setup = Setup(tasks.get("lm"), model, None, None)
  profile = assert_layer_removal_is_the_block_passing_its_input_on(setup, params, batches, 3)
  assert len(set(np.round(profile["increase"], 6))) == 3  # Three different layers.


def test_text_that_cannot_be_scored_is_refused_in_one_line(tmp_path):
  from lnjax.hf import analyze as hf_analyze

  empty, latin1 = tmp_path / "empty.txt", tmp_path / "latin1.txt"
  empty.write_text(" \n")
  latin1.write_bytes("café".encode("latin-1"))
  for path, message in [(empty, "is empty"), (latin1, "is not UTF-8 text (byte 0xe9 at offset 3)"),
                        (tmp_path / "none.txt", "No such file")]:
    with pytest.raises(hf.HFError, match=message.replace("(", r"\(").replace(")", r"\)")):
      hf_analyze.read_text(str(path))


def _analyze_cli(*args):
  env = {**os.environ, "LNJAX_PROGRESS_SECONDS": "100000", "HF_HUB_OFFLINE": "1"}
  return forkserver.run([sys.executable, "-m", "lnjax.cli.analyze", *args], capture_output=True,
                        text=True, env=env, timeout=600)


@pytest.mark.slow
def test_analyze_cli_on_an_imported_gpt2_writes_the_report_and_layer_removal(tmp_path):
  folder, _, _ = lnjax_folder(tmp_path / "gpt2")
  text = tmp_path / "text.txt"
  text.write_text("\n".join(corpus_lines(200)), encoding="utf-8")
  out = tmp_path / "report"
  proc = _analyze_cli(f"--hf={folder}", f"--text={text}", f"--output={out}", "--batches=2")
  assert proc.returncode == 0, proc.stderr
  assert "GPT2LMHeadModel as Pre-LN (norm_position=pre, LayerNorm): loss" in proc.stdout
  result = json.loads((out / "analysis.json").read_text())
  assert result["norm_position"] == "pre" and result["num_batches"] == 2
  assert result["tokens_per_window"] == 64  # min(128, n_positions)
  assert {f"layer_{i}/ffn/wi/kernel" for i in range(3)} <= set(result["gradient_norms"])
  assert "final_norm" in result["norm_jacobians"]
  assert len(result["layer_removal"]["increase"]) == 3
  report = (out / "report.md").read_text()
  assert "## Layer removal" in report and "Pre-LN" in report
  assert (out / "gradients.png").stat().st_size and (out / "layer_removal.png").stat().st_size


@pytest.mark.slow
def test_analyze_on_an_imported_bert_scores_its_masked_tokens(tmp_path):
  from lnjax.analysis import report as analyze
  from lnjax.hf import analyze as hf_analyze

  folder, _, _ = lnjax_folder(tmp_path / "bert", "mlm")
  text = tmp_path / "text.txt"
  text.write_text("\n".join(corpus_lines(100)), encoding="utf-8")
  result, out = hf_analyze.analyze(folder, str(text), str(tmp_path / "report"), num_batches=1,
                                   seq_len=40, report=analyze.figures)
  assert "## Layer removal" in (tmp_path / "report" / "report.md").read_text()
  assert result["norm_position"] == "post" and result["tokens_per_window"] == 40
  assert "bert/embed_norm" in result["norms"]
  assert len(result["layer_removal"]["increase"]) == 3
  # 15% of the 38 text tokens of each window are masked and scored: 6 per window.
  tok = hf_tokenizer.load(folder)
  batch = hf_analyze.make_batches("mlm", tok, text.read_text(), 40, 1, 4)[0]
  assert batch["mlm_positions"].shape == (4, 6)
  assert (np.take_along_axis(batch["inputs"], batch["mlm_positions"], 1) == tok.mask_id).all()
  assert (batch["inputs"][:, 0] == tok.cls_id).all() and (batch["inputs"][:, -1] == tok.sep_id).all()


@pytest.mark.slow
def test_analyze_cli_refuses_bad_input_in_one_line_with_exit_2(tmp_path):
  folder, _, _ = lnjax_folder(tmp_path / "gpt2")
  text = tmp_path / "text.txt"
  text.write_text("To be, or not to be", encoding="utf-8")
  (tmp_path / "empty.txt").write_text("")
  (tmp_path / "latin1.txt").write_bytes("café".encode("latin-1"))
  (tmp_path / "not_a_model").mkdir()
  truncated = tmp_path / "truncated"
  os.system(f"cp -r {folder} {truncated}")
  os.truncate(truncated / "model.safetensors", 100)
  edited = {}  # Wrong-typed or inconsistent config.json fields (issue 62's tracebacks).
  for name, changes in {"architectures_int": dict(architectures=5),
                        "architectures_nested": dict(architectures=[["GPT2LMHeadModel"]]),
                        "n_layer_float": dict(n_layer=2.5), "n_positions_1": dict(n_positions=1)}.items():
    os.system(f"cp -r {folder} {tmp_path / name}")
    edit_hf_config(tmp_path / name, **changes)
    edited[name] = [f"--hf={tmp_path / name}", f"--text={text}"]
  cases = [
      (edited["architectures_int"], "architectures=5 must be a list holding one architecture"),
      (edited["architectures_nested"], "architectures=[['GPT2LMHeadModel']] must be a list"),
      (edited["n_layer_float"], "config.json: n_layer=2.5 must be an integer >= 1"),
      (edited["n_positions_1"], "tensor 'transformer.wpe.weight' has shape (64, 16), "
                                "config.json implies (1, 16)"),
      ([f"--hf={tmp_path / 'not_a_model'}", f"--text={text}"], "has no config.json"),
      ([f"--hf={truncated}", f"--text={text}"], "is not a readable safetensors file"),
      ([f"--hf={folder}", f"--text={tmp_path / 'empty.txt'}"], "is empty"),
      ([f"--hf={folder}", f"--text={tmp_path / 'latin1.txt'}"], "is not UTF-8 text"),
      ([f"--hf={folder}"], "--hf needs --text=FILE"),
      ([f"--hf={folder}", f"--text={text}", "--sharpness=5"], "not a Hugging Face folder (--hf)"),
      ([f"--hf={folder}", f"--text={text}", f"--token_ids={text}"], "one of the two"),
      (["--hf=openai-community/gpt2", f"--text={text}"],
       "could not fetch 'openai-community/gpt2' from the Hugging Face hub"),
  ]
  # The eleven command lines forked from the tests' warm process (conftest).
  env = {**os.environ, "LNJAX_PROGRESS_SECONDS": "100000", "HF_HUB_OFFLINE": "1"}
  runs = run_command_lines([["lnjax.cli.analyze", *args, f"--output={tmp_path / 'out'}"]
                            for args, _ in cases],
                           env=env)
  for (args, message), (code, _, stderr) in zip(cases, runs, strict=True):
    assert code == 2, (args, stderr)
    assert stderr.startswith("lnjax: error: ") and message in stderr, (args, stderr)
    assert len(stderr.strip().splitlines()) == 1, stderr
  assert not (tmp_path / "out").exists()
