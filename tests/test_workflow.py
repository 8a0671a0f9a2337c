"""The researcher's workflow (issue 20): translate any input, checkpoint averaging, export,
comparing runs, W&B and TensorBoard, progress, --print_config.

One smoke Multi30k run (module fixture) serves the decoding, averaging and export tests;
the command lines run as subprocesses on one CPU device, as a user runs them.
"""

import concurrent.futures
import glob
import json
import os
import struct
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import sacrebleu

from configs import glue as glue_config
from configs import lm as lm_config
from configs import multi30k_de_en
from lnjax import tasks
from lnjax.analysis import compare
from lnjax.configs import doc as config_doc
from lnjax.core import averaging, checkpoint, metrics, progress, train
from lnjax.inference import export
import forkserver
from quiet_runs import NO_HEALTH

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SPLIT = "test_2017_mscoco"  # 100 sentences in the fixture corpora (461 in Multi30k).


def _one_device_env(**extra):
  flags = [f for f in os.environ.get("XLA_FLAGS", "").split()
           if not f.startswith("--xla_force_host_platform_device_count")]
  return {**os.environ, "XLA_FLAGS": " ".join(flags), **extra}


def cli(module, *args, stdin=None, code=0, env=None):
  r = forkserver.run([sys.executable, "-m", module, *args], cwd=REPO, input=stdin,
                     env=env or _one_device_env(), capture_output=True, text=True, timeout=600)
  assert r.returncode == code, (r.returncode, r.stdout[-1500:], r.stderr[-3000:])
  return r


@pytest.fixture(scope="module")
def mt_run(tmp_path_factory):
  """configs/multi30k_de_en.py:smoke, 20 steps, checkpoints at 10 and 20, BLEU on SPLIT;
  without train.health's statistics, which no test here reads (tests/quiet_runs.py)."""
  config = multi30k_de_en.get_config("smoke")
  with config.unlocked():
    config.train.health = NO_HEALTH
    config.mesh.data = 1
    config.train.eval_every_steps = 10
    config.decode.bleu_split = SPLIT
  wd = str(tmp_path_factory.mktemp("workflow") / "mt")
  assert train.train_and_evaluate(config, wd, tasks=tasks.get)["status"] == "completed"
  return wd


def _sources_and_refs(wd):
  from lnjax.inference import predict
  t = predict.load(wd, "latest")
  return t.data.sources(SPLIT), t.data.references(SPLIT)


@pytest.fixture(scope="module")
def predicted(mt_run):
  """SPLIT decoded by `lnjax.main --mode=predict` with the run's own settings (checkpoint
  best, beam 2): (its result JSON, its hypotheses)."""
  r = cli("lnjax.main", "--mode=predict", f"--workdir={mt_run}", f"--split={SPLIT}")
  hyp = r.stdout.rsplit("hypotheses in ", 1)[1].strip()
  result = json.load(open(hyp[:-4] + ".json"))
  assert result["beam_size"] == 2 and result["checkpoint"] == "best", result
  return result, open(hyp).read().splitlines()


# ---- Translate anything.

@pytest.mark.slow
def test_translate_on_stdin_and_on_a_file_reproduces_predict(mt_run, predicted, tmp_path):
  result, hypotheses = predicted
  assert len(hypotheses) == 100
  sources, refs = _sources_and_refs(mt_run)
  src_file, ref_file = tmp_path / "src.de", tmp_path / "ref.en"
  src_file.write_text("\n".join(sources) + "\n")
  ref_file.write_text("\n".join(refs) + "\n")

  # On stdin, with an empty line among them: an empty line out there, the others predict's.
  piped = cli("lnjax.cli.translate", f"--workdir={mt_run}",
              stdin="\n".join(sources[:50] + [""] + sources[50:]) + "\n")
  assert piped.stdout.splitlines() == hypotheses[:50] + [""] + hypotheses[50:]
  from_file = cli("lnjax.cli.translate", f"--workdir={mt_run}", f"--input={src_file}",
                  f"--reference={ref_file}")
  assert from_file.stdout.splitlines() == hypotheses
  # The score on stderr, with sacreBLEU's signature, is predict's; the run's beam size.
  line = from_file.stderr.strip().splitlines()[-1]
  assert line.startswith(f"BLEU {result['bleu']:.2f} (nrefs:1|case:mixed|eff:no|tok:13a"), line
  assert line.endswith("beam 2"), line
  # ... and sacreBLEU's own score of the printed translations against the references.
  score = sacrebleu.corpus_bleu(from_file.stdout.splitlines(), [refs]).score
  assert score == pytest.approx(result["bleu"], abs=1e-6)


@pytest.mark.slow
def test_a_beam_size_override_is_used_or_refused(mt_run, predicted):
  """--beam_size (translate) and --config.decode.beam_size (--mode=predict, without
  --config) decode with beam 1: the same hypotheses, not all the beam-2 ones. Bad
  settings are refused in one line, exit 2: on lnjax.main's command line (--config with
  --mode=predict), and by predict.predict and translate_run, the functions lnjax.main
  --mode=predict and lnjax.cli.translate hand the decode settings to (and whose errors
  they print as one line, exit code and all)."""
  from lnjax.core import errors
  from lnjax.inference import predict, translate

  refusals = (
      (["--mode=predict", "--config=configs/multi30k_de_en.py:smoke",
        "--config.decode.beam_size=1"], "drop --config"),
  )
  with concurrent.futures.ThreadPoolExecutor(4) as pool:
    used = [pool.submit(cli, *args) for args in (
        ("lnjax.cli.translate", f"--workdir={mt_run}", f"--split={SPLIT}", "--beam_size=1"),
        # --mode=predict uses --config.decode.beam_size (given without --config) ...
        ("lnjax.main", "--mode=predict", f"--workdir={mt_run}", f"--split={SPLIT}",
         "--config.decode.beam_size=1"))]
    refused = [pool.submit(cli, "lnjax.main", f"--workdir={mt_run}", *args, stdin="", code=2)
               for args, _ in refusals]
    # Their refusals are these functions' errors (cli.fail(str(e), e.exit_code)).
    for call, message in (
        (lambda: predict.predict(mt_run, SPLIT, overrides={"beam_size": 0}), "beam_size=0"),
        (lambda: predict.predict(mt_run, SPLIT, overrides={"bleu_split": "x"}),
         "training only"),
        (lambda: translate.translate_run(mt_run, [""], overrides={"beam_size": 0}),
         "decode.beam_size=0 must be an integer >= 1"),
        (lambda: translate.translate_run(mt_run, [""], max_len=100000),
         "--max_len=100000 must be in 1..256"),
        (lambda: translate.translate_run(mt_run, [""], "avg:9"),
         "keeps 2 checkpoint(s) (10, 20)")):
      with pytest.raises(errors.LnjaxError) as e:
        call()
      assert message in str(e.value) and "\n" not in str(e.value), str(e.value)
      assert e.value.exit_code == 2
  beam1, r = (f.result() for f in used)
  assert "beam 1" in beam1.stderr
  changed = sum(a != b for a, b in zip(beam1.stdout.splitlines(), predicted[1]))
  assert changed > 0
  assert "beam 1" in r.stdout
  hyp = r.stdout.rsplit("hypotheses in ", 1)[1].strip()
  assert open(hyp).read().splitlines() == beam1.stdout.splitlines()
  assert json.load(open(hyp[:-4] + ".json"))["beam_size"] == 1
  # ... and refuses what it would otherwise ignore, in one line.
  for (_, message), future in zip(refusals, refused):
    r = future.result()
    assert message in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr


# ---- Checkpoint averaging.

@pytest.mark.slow
def test_averaging_two_checkpoints_is_the_mean_of_their_parameters(mt_run, tmp_path):
  chosen = averaging.restore(mt_run, "avg:2", tasks=tasks.get)
  assert chosen.steps == [10, 20] and chosen.label == "avg2-step20"
  a = checkpoint.restore_run(mt_run, step=10, tasks=tasks.get).state.params
  b = checkpoint.restore_run(mt_run, step=20, tasks=tasks.get).state.params
  for x, y, m in zip(jax.tree.leaves(a), jax.tree.leaves(b), jax.tree.leaves(chosen.params)):
    np.testing.assert_array_equal(np.asarray(m), (np.asarray(x) + np.asarray(y)) / 2)
  assert any(not np.array_equal(x, y) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))
  # Written as a new run that every tool reads.
  out = str(tmp_path / "avg")
  r = cli("lnjax.cli.average", f"--workdir={mt_run}", "--last=2", f"--output={out}")
  assert "averaged steps 10, 20" in r.stdout
  saved = checkpoint.restore_run(out, tasks=tasks.get)
  assert saved.step == 20
  for x, m in zip(jax.tree.leaves(saved.state.params), jax.tree.leaves(chosen.params)):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(m))
  assert json.load(open(os.path.join(out, averaging.AVERAGE_FILE)))["steps"] == [10, 20]


# ---- Export.

def _logits(model, params):
  src = jnp.asarray(np.random.default_rng(0).integers(4, 500, (3, 11)), jnp.int32)
  tgt = jnp.asarray(np.random.default_rng(1).integers(4, 500, (3, 9)), jnp.int32)
  return np.asarray(model.apply({"params": params}, src, tgt))


@pytest.mark.slow
def test_safetensors_export_round_trips_the_logits_exactly(mt_run, tmp_path):
  from safetensors.numpy import load_file

  chosen = averaging.restore(mt_run, "best", tasks=tasks.get)
  expected = _logits(chosen.restored.setup.model, chosen.params)
  out = str(tmp_path / "f32")
  r = cli("lnjax.cli.export", f"--workdir={mt_run}", "--format=safetensors", f"--output={out}")
  [best] = chosen.steps  # The step with the best held-out score (10 or 20).
  assert f"45,696 parameters (float32, checkpoint best, steps {best})" in r.stdout
  assert sorted(os.listdir(out)) == ["config.json", "model.safetensors", "tokenizer.model"]
  flat = load_file(os.path.join(out, "model.safetensors"))
  assert "decoder.layer_0.ffn.wi.kernel" in flat
  assert all(v.dtype == np.float32 for v in flat.values())
  # Each tensor is the checkpoint's parameter of that name, read without lnjax.inference.export (a
  # round trip through export.load alone would not see two names swapped both ways).
  by_name = {".".join(p.key for p in path): np.asarray(v) for path, v in
             jax.tree_util.tree_flatten_with_path(chosen.params)[0]}
  assert sorted(flat) == sorted(by_name)
  for name, value in flat.items():
    np.testing.assert_array_equal(value, by_name[name], err_msg=name)
  loaded = export.load(out)
  assert type(loaded.model).__name__ == "EncoderDecoder"
  assert loaded.config["model"]["d_model"] == 32 and loaded.config["steps"] == [best]
  np.testing.assert_array_equal(_logits(loaded.model, loaded.params), expected)

  # bfloat16: the logits of the parameters rounded to bfloat16.
  out16 = str(tmp_path / "bf16")
  export.export(mt_run, out16, "best", "bfloat16")
  assert all(str(v.dtype) == "bfloat16" for v in load_file(
      os.path.join(out16, "model.safetensors")).values())
  rounded = jax.tree.map(lambda x: x.astype(jnp.bfloat16).astype(jnp.float32), chosen.params)
  loaded16 = export.load(out16)
  np.testing.assert_array_equal(_logits(loaded16.model, loaded16.params),
                                _logits(chosen.restored.setup.model, rounded))
  assert not np.array_equal(_logits(loaded16.model, loaded16.params), expected)


# ---- Comparing runs.

def _fake_run(root, name, norm, losses, bleu=None):
  """A workdir as training leaves it, written through the real metrics writer."""
  wd = os.path.join(root, name)
  os.makedirs(wd)
  writer = metrics.MetricWriter(wd, tensorboard=False)
  for step, loss in enumerate(losses, 1):
    writer.write(step, {"train_loss": loss, "learning_rate": 1e-3})
    if step % 2 == 0:
      writer.write(step, {"eval_loss": loss + 0.1, **({"eval_bleu": bleu * step} if bleu else {})})
  writer.close()
  json.dump({"status": "completed", "step": len(losses)}, open(os.path.join(wd, "summary.json"), "w"))
  json.dump({"model": {"norm_position": norm}}, open(os.path.join(wd, "config.json"), "w"))
  return wd


@pytest.mark.slow
def test_compare_writes_a_png_with_every_run_in_it(tmp_path):
  import matplotlib.image
  import matplotlib.pyplot as plt

  runs = [_fake_run(str(tmp_path / "a"), "post", "post", [7.0, 6.0, 5.5, 5.4], bleu=1.0),
          _fake_run(str(tmp_path / "a"), "pre", "pre", [7.0, 5.0, 4.0, 3.5], bleu=2.0),
          _fake_run(str(tmp_path / "b"), "pre", "pre", [7.0, 6.5, 6.4, 6.3])]
  out = str(tmp_path / "report" / "cmp")
  r = cli("lnjax.cli.compare", *runs, f"--output={out}")
  # Distinct names for two runs called 'pre'; one table row per run.
  for name in ("| a/post | post | completed | 4 |", "| a/pre | pre |", "| b/pre | pre |"):
    assert name in r.stdout
  assert "3.5000" in r.stdout and "8.00 (step 4)" in r.stdout  # Final loss; best BLEU.
  assert "![curves](cmp.png)" in open(out + ".md").read()
  # Every run's colour is drawn in the image.
  image = matplotlib.image.imread(out + ".png")[..., :3]
  colors = plt.rcParams["axes.prop_cycle"].by_key()["color"][:3]
  for c in colors:
    rgb = np.array(matplotlib.colors.to_rgb(c))
    assert (np.abs(image - rgb).max(-1) < 0.02).sum() > 200, c
  table = compare.table([compare.load_run(w) | {"name": w} for w in runs])
  assert table.count("\n") == 5


@pytest.mark.slow  # Starts lnjax.cli.compare (which imports JAX).
def test_compare_refuses_a_folder_that_is_not_a_run(tmp_path):
  r = cli("lnjax.cli.compare", str(tmp_path), code=2)
  assert "not a run" in r.stderr


# ---- Tracking: W&B (offline) and TensorBoard.

def _wandb_records(path):
  """The protobuf records of a .wandb file (LevelDB-style log: 32 KiB blocks of chunks
  with a 7-byte header: CRC, length, type FULL=1 FIRST=2 MIDDLE=3 LAST=4)."""
  from wandb.proto import wandb_internal_pb2
  data = open(path, "rb").read()
  assert data[:4] == b":W&B"
  pos, chunks, out = 7, b"", []
  while pos + 7 <= len(data):
    left = 32768 - pos % 32768
    _, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
    if left < 7 or (length == 0 and kind == 0):
      pos += left
      continue
    chunks += data[pos + 7:pos + 7 + length]
    pos += 7 + length
    if kind in (1, 4):
      record = wandb_internal_pb2.Record()
      record.ParseFromString(chunks)
      out.append(record)
      chunks = b""
  return out


@pytest.mark.slow
def test_wandb_offline_and_tensorboard_get_the_scalars_of_metrics_jsonl(tmp_path):
  from tensorboard.backend.event_processing import event_accumulator

  wd = str(tmp_path / "lm")
  env = _one_device_env(WANDB_MODE="offline", WANDB_SILENT="true")
  cli("lnjax.main", "--config=configs/lm.py:smoke", f"--workdir={wd}",
      "--config.train.wandb_project=lnjax-test", "--config.train.tensorboard=True", env=env)
  logged = {r["step"]: r["train_loss"] for r in metrics.read_metrics(wd) if "train_loss" in r}
  assert sorted(logged) == [5, 10, 15, 20]

  [path] = glob.glob(os.path.join(wd, "wandb", "offline-run-*", "run-*.wandb"))
  records = _wandb_records(path)
  [run] = [r.run for r in records if r.WhichOneof("record_type") == "run"]
  assert run.project == "lnjax-test" and run.display_name == "lm"
  config = {i.key: json.loads(i.value_json) for i in run.config.update}
  assert config["model"]["norm_position"] == "pre" and config["train"]["num_steps"] == 20
  history = [{"/".join(i.nested_key) or i.key: json.loads(i.value_json) for i in r.history.item}
             for r in records if r.WhichOneof("record_type") == "history"]
  wandb_loss = {h["_step"]: h["train_loss"] for h in history if "train_loss" in h}
  assert wandb_loss == pytest.approx(logged, abs=0, rel=1e-7)
  assert any("eval_loss" in h for h in history)

  events = event_accumulator.EventAccumulator(os.path.join(wd, "tensorboard"))
  events.Reload()
  tb = {e.step: e.value for e in events.Scalars("train_loss")}
  assert tb == pytest.approx(logged, rel=1e-6)


def test_wandb_is_off_by_default():
  assert lm_config.get_config("smoke").train.wandb_project == ""
  assert multi30k_de_en.get_config().train.wandb_project == ""


# ---- Progress.

def test_progress_is_quiet_off_a_terminal_except_for_periodic_lines(capsys, monkeypatch):
  monkeypatch.setenv("LNJAX_PROGRESS_SECONDS", "3600")
  bar = progress.Bar(100, "decoding x", unit="sentences")
  bar.update(50)
  bar.close()
  assert capsys.readouterr().err == ""  # (pytest's stderr is not a terminal.)
  monkeypatch.setenv("LNJAX_PROGRESS_SECONDS", "0")
  bar = progress.Bar(100, "decoding x", unit="sentences")
  bar.update(40)
  bar.update(60)  # Done: no line for the end.
  err = capsys.readouterr().err.splitlines()
  assert len(err) == 1 and err[0].startswith("decoding x: 40/100 sentences (40%)"), err


def test_a_first_time_compile_is_named():
  p = metrics.Progress(num_steps=100, first_step=0, num_shapes=7)
  assert p.compiling((64, 16)) == "compiling bucket 1/7 (64×16)"
  assert p.compiling((64, 16)) is None
  assert p.compiling((32, 32)) == "compiling bucket 2/7 (32×32)"
  assert metrics.Progress(10, 0).compiling((8, 32)) == "compiling the train step"


# ---- --print_config.

@pytest.mark.slow
def test_print_config_lists_every_key_with_its_value_and_comment():
  r = cli("lnjax.main", "--config=configs/multi30k_de_en.py:smoke", "--print_config")
  lines = [l for l in r.stdout.splitlines() if " = " in l]
  config = multi30k_de_en.get_config("smoke")

  def keys(c, prefix=""):
    for k in c.keys():
      v = c[k]
      yield from keys(v, f"{prefix}{k}.") if hasattr(v, "keys") else [(prefix + k, v)]

  expected = dict(keys(config))
  shown = {l.split(" = ")[0]: l for l in lines}
  assert set(shown) == set(expected)
  for key, value in expected.items():
    assert shown[key].startswith(f"{key} = {value!r}"), shown[key]
  assert sum("  # " in l for l in lines) >= 0.9 * len(lines)
  assert shown["model.d_model"].endswith("# D")
  assert "# 1 = greedy." in shown["decode.beam_size"]
  assert "| sandwich |" in shown["model.norm_position"]  # A comment continued below its key.
  r = cli("lnjax.main", "--print_config", code=2)
  assert "needs --config" in r.stderr


def test_print_config_comments_a_config_only_finetune_resolves():
  """configs/glue.py has a finetune section that lnjax.tasks.finetune resolves, not run.py: its
  keys' comments come from the dataclasses its sections were built from."""
  lines = [l for l in config_doc.describe(glue_config.get_config(), "configs/glue.py")
           .splitlines() if " = " in l]
  shown = {l.split(" = ")[0]: l for l in lines}
  assert all("  # " in l for l in lines), [l for l in lines if "  # " not in l]
  assert "# mrpc | rte" in shown["data.name"]
  assert "(no pre-training)." in shown["data.init_step"]  # Continued below its key.
  assert "# One run each" in shown["finetune.seeds"]


def test_two_section_classes_with_the_same_field_names_are_refused():
  """--print_config finds a section's dataclass by its key set (sections.built_from): a
  second dataclass with the same field names would be mistaken for the first."""
  import dataclasses

  from lnjax.core import sections

  @dataclasses.dataclass
  class First:
    alpha_for_this_test: int = 1
    beta_for_this_test: str = "b"

  @dataclasses.dataclass
  class Second:
    beta_for_this_test: str = "c"
    alpha_for_this_test: int = 2

  sections.section(First)
  sections.section(First)  # The same class again is fine.
  assert sections.built_from(["beta_for_this_test", "alpha_for_this_test"]) is First
  with pytest.raises(TypeError, match="Second and First have the same field names"):
    sections.section(Second)
