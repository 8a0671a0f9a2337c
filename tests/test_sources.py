"""Data from anywhere: the embedded default in a fresh copy of the repository, checksummed
downloads from a real HTTP server on 127.0.0.1, tfds: and hf: names, IWSLT14's preparation."""

import contextlib
import dataclasses
import functools
import gzip
import hashlib
import http.server
import importlib.util
import io
import os
import pathlib
import shutil
import sys
import tarfile
import threading

import pytest
import tensorflow_datasets as tfds

from configs import default as default_config
from configs import iwslt14_de_en, multi30k_de_en
from lnjax import tasks
from lnjax.core import build, metrics, train
from lnjax.data import download, paths, prepare, sources
from lnjax.data.paths import DataError
import forkserver
from quiet_runs import NO_HEALTH

REPO = pathlib.Path(__file__).resolve().parents[1]
CORPORA = REPO / "tests" / "fixtures" / "corpora"  # The first lines of the real corpora.


def _git_files() -> list[str]:
  out = forkserver.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                       cwd=REPO, capture_output=True, check=True)
  return [f for f in out.stdout.decode().split("\0")
          if f and ((REPO / f).is_file() or (REPO / f).is_symlink())]


def _clean_env(**extra) -> dict:
  env = {k: v for k, v in os.environ.items()
         if not k.startswith(("LNJAX_DATA", "TFDS_DATA_DIR", "PYTHONPATH"))}
  env.update(extra)
  return env


def _smoke(config, workdir, **data):
  """A smoke run on one device without train.health's statistics (tests/quiet_runs.py): the
  tests here are about the data."""
  with config.unlocked():
    config.mesh.data = 1
    config.train.health = NO_HEALTH
    for k, v in data.items():
      config.data[k] = v
  return train.train_and_evaluate(config, str(workdir), tasks=tasks.get)


def _losses(workdir) -> dict:
  return {r["step"]: r["train_loss"] for r in metrics.read_metrics(str(workdir)) if "train_loss" in r}


# ---------------------------------------------------------------------------
# The embedded default: a fresh copy of the repository, no corpus folder, no network.
# ---------------------------------------------------------------------------


def test_fresh_clone_runs_the_default_smoke_with_no_data_setting(tmp_path):
  clone = tmp_path / "clone"
  for f in _git_files():
    (clone / f).parent.mkdir(parents=True, exist_ok=True)
    if (REPO / f).is_symlink():  # configs/ -> lnjax/configs, as a clone has it.
      (clone / f).symlink_to(os.readlink(REPO / f))
    else:
      shutil.copy2(REPO / f, clone / f)
  assert not (tmp_path / "shared").exists()
  env = _clean_env(LNJAX_DATA_OFFLINE="1", LNJAX_CACHE_DIR=str(tmp_path / "cache"),
                   HOME=str(tmp_path / "home"))
  r = forkserver.run([sys.executable, "-m", "lnjax.main", "--config=configs/default.py:smoke",
                      f"--workdir={tmp_path / 'run'}"], cwd=clone, env=env,
                     capture_output=True, text=True, timeout=600)
  assert r.returncode == 0, r.stderr[-3000:]
  assert "completed at step 20/20" in r.stdout
  # Read from the copy's own package data, never from a corpus folder or the network.
  assert (clone / "lnjax" / "data" / "corpora" / "tiny_shakespeare" / "input.txt.gz").is_file()
  assert not (tmp_path / "cache" / "downloads").exists()


def test_embedded_corpus_is_the_published_file():
  raw = gzip.decompress((paths.EMBEDDED_DIR / "tiny_shakespeare" / "input.txt.gz").read_bytes())
  assert hashlib.sha256(raw).hexdigest() == download.REMOTE[("tiny_shakespeare", "input.txt")].parts[0][1]
  assert (paths.EMBEDDED_DIR / "tiny_shakespeare" / "README.md").is_file()


# ---------------------------------------------------------------------------
# Downloads: a real HTTP server on 127.0.0.1 serving the fixture corpora as a mirror.
# ---------------------------------------------------------------------------


class _Mirror(http.server.SimpleHTTPRequestHandler):
  requests: list = []
  corrupt: set = set()  # paths served with one byte changed
  cut: set = set()  # paths whose transfer stops halfway

  def log_message(self, *args):
    pass

  def do_GET(self):
    type(self).requests.append(self.path)
    local = pathlib.Path(self.translate_path(self.path))
    if self.path not in self.corrupt | self.cut or not local.is_file():
      return super().do_GET()
    body = bytearray(local.read_bytes())
    self.send_response(200)
    self.send_header("Content-Length", str(len(body)))
    self.end_headers()
    if self.path in self.corrupt:
      body[len(body) // 2] ^= 0xFF
      self.wfile.write(bytes(body))
    else:
      self.wfile.write(bytes(body[: len(body) // 2]))
      self.wfile.flush()
      self.close_connection = True
      self.connection.shutdown(2)


@contextlib.contextmanager
def _serve(root: pathlib.Path):
  _Mirror.requests, _Mirror.corrupt, _Mirror.cut = [], set(), set()
  server = http.server.ThreadingHTTPServer(
      ("127.0.0.1", 0), functools.partial(_Mirror, directory=str(root)))
  thread = threading.Thread(target=server.serve_forever, daemon=True)
  thread.start()
  try:
    yield f"http://127.0.0.1:{server.server_address[1]}"
  finally:
    server.shutdown()
    server.server_close()


@pytest.fixture
def mirror(tmp_path, monkeypatch):
  """A mirror of the Multi30k and newstest2014 files on 127.0.0.1 (the fixtures' first
  lines, in the published layout: gzipped text, plain SGML), the recorded checksums
  replaced by the served files' own; downloads on, an empty data dir and cache."""
  root = tmp_path / "mirror"
  shutil.copytree(CORPORA / "multi30k", root / "multi30k")
  (root / "wmt14_newstest2014_de-en").mkdir()
  for name in ("newstest2014-deen-src.de.sgm", "newstest2014-deen-ref.en.sgm"):
    (root / "wmt14_newstest2014_de-en" / name).write_bytes(
        gzip.decompress((CORPORA / "wmt14_newstest2014_de-en" / f"{name}.gz").read_bytes()))
  for key, remote in list(download.REMOTE.items()):
    if key[0] in ("multi30k", "wmt14_newstest2014_de-en"):
      parts = tuple((p, hashlib.sha256((root / key[0] / p).read_bytes()).hexdigest())
                    for p, _ in remote.parts)
      monkeypatch.setitem(download.REMOTE, key, dataclasses.replace(remote, parts=parts))
  monkeypatch.delenv("LNJAX_DATA_OFFLINE", raising=False)
  monkeypatch.setenv("LNJAX_DATA_DIR", str(tmp_path / "empty"))
  monkeypatch.setenv("LNJAX_CACHE_DIR", str(tmp_path / "cache"))
  with _serve(root) as url:
    monkeypatch.setenv("LNJAX_DATA_MIRROR", url)
    yield url, tmp_path / "cache" / "downloads"


def test_first_use_downloads_verifies_and_trains_then_reuses(mirror, tmp_path):
  """A run's first use of Multi30k downloads every split's two files once each, keeps the
  served bytes and trains; a second run's preparation (build.build, what a run does before
  its first step: corpus, tokenizer, model setup) asks the mirror for nothing."""
  url, downloads = mirror
  config = multi30k_de_en.get_config("smoke")
  with config.unlocked():
    config.train.num_steps, config.train.eval_every_steps = 4, 4
    config.decode.bleu_in_training = False
    # Seed 9: the 4 batches in one length bucket, one train step to compile (seed 0's: two).
    config.seed = 9
  summary = _smoke(config, tmp_path / "run")
  assert summary["status"] == "completed" and summary["step"] == 4
  got = sorted(p.split("/")[-1] for p in _Mirror.requests)
  assert got == sorted(download._MULTI30K_SHA), got  # every split's two files, once each
  for name in download._MULTI30K_SHA:  # the served bytes, nothing else left behind
    assert (downloads / "multi30k" / name).read_bytes() == (CORPORA / "multi30k" / name).read_bytes()
  assert sorted(os.listdir(downloads / "multi30k")) == sorted(download._MULTI30K_SHA)
  # Second use: nothing downloaded.
  _Mirror.requests.clear()
  built = build.build(config, tasks=tasks.get)
  assert built.data.num_train_pairs > 0 and built.run.data.name == "multi30k_de_en"
  assert _Mirror.requests == []


def test_sgm_test_set_download_equals_the_extracted_text(mirror):
  _, downloads = mirror
  path = paths.find_corpus_file(None, "wmt14_newstest2014_de-en", "newstest2014.de", "?")
  assert path == downloads / "wmt14_newstest2014_de-en" / "newstest2014.de"
  want = gzip.decompress((CORPORA / "wmt14_newstest2014_de-en" / "newstest2014.de.gz").read_bytes())
  assert path.read_bytes() == want  # the <seg> texts, as sacreBLEU reads the .sgm
  assert len(want.decode().splitlines()) == 100


def test_corrupt_file_is_refused_and_nothing_is_kept(mirror):
  _, downloads = mirror
  _Mirror.corrupt.add("/multi30k/test_2017_mscoco.de.gz")
  with pytest.raises(DataError, match="checksum mismatch") as e:
    paths.find_corpus_file(None, "multi30k", "test_2017_mscoco.de", "?")
  assert "\n" not in str(e.value) and "/multi30k/test_2017_mscoco.de.gz" in str(e.value)
  assert not any(p.is_file() for p in downloads.rglob("*")), list(downloads.rglob("*"))
  _Mirror.corrupt.clear()  # A good copy afterwards is taken.
  assert paths.find_corpus_file(None, "multi30k", "test_2017_mscoco.de", "?").is_file()


def test_http_404_is_one_line_naming_url_file_and_folder(mirror):
  url, downloads = mirror
  with pytest.raises(DataError) as e:
    paths.find_corpus_file(None, "glue_rte", "dev.tsv", "?")  # not on this mirror
  msg = str(e.value)
  assert "\n" not in msg and "404" in msg
  assert f"{url}/glue_rte/dev_copy.tsv" not in msg and f"{url}/glue_rte/dev.tsv" in msg
  assert str(downloads / "glue_rte") in msg
  assert not any(p.is_file() for p in downloads.rglob("*"))


def test_transfer_cut_halfway_leaves_no_file(mirror):
  _, downloads = mirror
  _Mirror.cut.add("/multi30k/val.en.gz")
  with pytest.raises(DataError, match="cannot download"):
    paths.find_corpus_file(None, "multi30k", "val.en", "?")
  assert not any(p.is_file() for p in downloads.rglob("*")), list(downloads.rglob("*"))


# ---------------------------------------------------------------------------
# tfds: a small real TFDS data set prepared to array_record here, read by name.
# ---------------------------------------------------------------------------


def _shakespeare_docs():
  text = gzip.decompress((paths.EMBEDDED_DIR / "tiny_shakespeare" / "input.txt.gz").read_bytes())
  paras = text.decode().split("\n\n")
  return paras[:3000], paras[3000:3400]


def _multi30k_pairs(stem: str, n: int):
  de = gzip.decompress((CORPORA / "multi30k" / f"{stem}.de.gz").read_bytes()).decode().splitlines()
  en = gzip.decompress((CORPORA / "multi30k" / f"{stem}.en.gz").read_bytes()).decode().splitlines()
  return de[:n], en[:n]


class LnjaxTestLm(tfds.core.GeneratorBasedBuilder):
  """Tiny Shakespeare paragraphs as a catalog-style TFDS data set ('text' feature)."""

  VERSION = tfds.core.Version("1.0.0")

  def _info(self):
    return tfds.core.DatasetInfo(builder=self, features=tfds.features.FeaturesDict(
        {"text": tfds.features.Text()}))

  def _split_generators(self, dl_manager):
    train, val = _shakespeare_docs()
    return {"train": self._generate_examples(train), "validation": self._generate_examples(val)}

  def _generate_examples(self, docs):
    for i, doc in enumerate(docs):
      yield i, {"text": doc}


class LnjaxTestMt(tfds.core.GeneratorBasedBuilder):
  """Multi30k pairs with TFDS's translation layout (features named 'de' and 'en')."""

  VERSION = tfds.core.Version("1.0.0")

  def _info(self):
    return tfds.core.DatasetInfo(builder=self, features=tfds.features.Translation(
        languages=("de", "en")))

  def _split_generators(self, dl_manager):
    return {"train": self._generate_examples(*_multi30k_pairs("train", 2000)),
            "validation": self._generate_examples(*_multi30k_pairs("val", 200))}

  def _generate_examples(self, de, en):
    for i, (d, e) in enumerate(zip(de, en)):
      yield i, {"de": d, "en": e}


def _tfds_prepare(builder_cls, data_dir) -> None:
  """`builder_cls` prepared as array_record in data_dir, as lnjax's own builders are."""
  with paths.tfds_scratch():  # (Nothing left in the temp folder.)
    builder = builder_cls(data_dir=str(data_dir), file_format="array_record")
  builder.download_and_prepare()


@pytest.fixture(scope="module")
def tfds_dir(tmp_path_factory):
  root = tmp_path_factory.mktemp("tfds")
  for cls in (LnjaxTestLm, LnjaxTestMt):
    _tfds_prepare(cls, root)
  return str(root)


def test_tfds_source_reads_by_name_in_order(tfds_dir):
  src = sources.open_external("tfds:lnjax_test_lm", tfds_dir)
  assert src.available_splits == ("train", "validation")
  texts = src.texts("validation")
  assert sorted(texts) == sorted(_shakespeare_docs()[1])
  assert src.fingerprint == sources.open_external("tfds:lnjax_test_lm", tfds_dir).fingerprint
  with pytest.raises(DataError, match="has no split 'test'"):
    src.texts("test")
  with pytest.raises(DataError, match="no feature 'body'"):
    src.texts("train", "body")
  with pytest.raises(DataError, match="not a TFDS data set"):
    sources.open_external("tfds:no_such_dataset_here", tfds_dir)


@pytest.mark.slow
def test_lm_smoke_trains_on_a_tfds_source(tfds_dir, tmp_path):
  summary = _smoke(default_config.get_config("smoke"), tmp_path / "run",
                   name="tfds:lnjax_test_lm", tfds_data_dir=tfds_dir)
  assert summary["status"] == "completed"
  losses = _losses(tmp_path / "run")
  assert losses[20] < losses[5], losses
  assert "tensorflow" not in sys.modules


def test_translation_smoke_trains_on_a_tfds_source(tfds_dir, tmp_path):
  """The translation smoke on a tfds: data set's pairs: completes, the loss of steps 6-10
  below that of steps 1-5 (10 steps: each new batch shape costs a compilation)."""
  config = multi30k_de_en.get_config("smoke")
  with config.unlocked():
    config.data.test_split = "validation"
    config.decode.bleu_in_training = False
    config.train.num_steps, config.train.eval_every_steps = 10, 10
  summary = _smoke(config, tmp_path / "run", name="tfds:lnjax_test_mt", tfds_data_dir=tfds_dir)
  assert summary["status"] == "completed" and summary["step"] == 10
  losses = _losses(tmp_path / "run")
  assert losses[10] < losses[5], losses


@pytest.mark.slow
def test_unprepared_tfds_name_offline_is_one_line_and_leaves_no_workdir(tmp_path):
  wd = tmp_path / "run"
  env = _clean_env(LNJAX_DATA_OFFLINE="1", LNJAX_CACHE_DIR=str(tmp_path / "cache"),
                   TFDS_DATA_DIR=str(tmp_path / "tfds"))
  r = forkserver.run([sys.executable, "-m", "lnjax.main", "--config=configs/default.py:smoke",
                      "--config.data.name=tfds:lm1b", f"--workdir={wd}"], cwd=REPO, env=env,
                     capture_output=True, text=True, timeout=300)
  assert r.returncode == 2, (r.stdout[-2000:], r.stderr[-2000:])
  lines = [l for l in r.stderr.splitlines() if l.strip() and not l.startswith(("WARNING", "I0", "W0"))]
  assert len(lines) == 1 and "tfds:lm1b is not prepared" in lines[0], r.stderr
  assert "Traceback" not in r.stderr and "tfds build lm1b" in lines[0]
  if NO_TENSORFLOW:  # The pinned environment: preparing needs the tfds-build extra.
    assert "needs TensorFlow" in lines[0] and "pip install lnjax[tfds-build]" in lines[0]
  assert not wd.exists()


NO_TENSORFLOW = importlib.util.find_spec("tensorflow") is None

# A builder in a package, as TFDS's catalog builders are (tensorflow_datasets.text.lm1b):
# TFDS locates a packaged builder's code through importlib_resources, which requirements.txt
# pins (a builder defined in a test module skips that path).
_PACKAGED_BUILDER = '''
import tensorflow_datasets as tfds

class LnjaxPackagedLm(tfds.core.GeneratorBasedBuilder):
  VERSION = tfds.core.Version("1.0.0")

  def _info(self):
    return tfds.core.DatasetInfo(builder=self, features=tfds.features.FeaturesDict(
        {"text": tfds.features.Text()}))

  def _split_generators(self, dl_manager):
    return {"train": self._generate_examples(40), "test": self._generate_examples(7)}

  def _generate_examples(self, n):
    for i in range(n):
      yield i, {"text": f"line {i} of the packaged builder"}
'''


def test_packaged_tfds_builder_prepares_and_reads_as_array_record(tmp_path, monkeypatch):
  pkg = tmp_path / "src" / "lnjax_tfds_pkg"
  pkg.mkdir(parents=True)
  (pkg / "__init__.py").write_text("")
  (pkg / "packaged_lm.py").write_text(_PACKAGED_BUILDER)
  monkeypatch.syspath_prepend(str(tmp_path / "src"))
  from lnjax_tfds_pkg import packaged_lm

  assert packaged_lm.LnjaxPackagedLm.code_path.name == "packaged_lm.py"
  root = tmp_path / "tfds"
  _tfds_prepare(packaged_lm.LnjaxPackagedLm, root)
  assert list(root.rglob("*.array_record*"))
  src = sources.open_external("tfds:lnjax_packaged_lm", str(root))
  assert src.available_splits == ("test", "train")
  assert sorted(src.texts("test")) == sorted(f"line {i} of the packaged builder" for i in range(7))
  assert len(src.texts("train")) == 40


@pytest.mark.slow
@pytest.mark.skipif(not NO_TENSORFLOW, reason="checks the message given without TensorFlow")
def test_wmt14_from_tfds_without_tensorflow_names_the_extra(tmp_path):
  r = forkserver.run([sys.executable, "-m", "lnjax.cli.prepare", "wmt14_en_de",
                      f"--tfds_data_dir={tmp_path / 'tfds'}"], cwd=REPO,
                     env=_clean_env(LNJAX_DATA_OFFLINE="1"), capture_output=True, text=True,
                     timeout=300)
  assert r.returncode == 2, (r.stdout[-2000:], r.stderr[-2000:])
  lines = [l for l in r.stderr.splitlines() if l.strip() and not l.startswith(("WARNING", "I0", "W0"))]
  assert len(lines) == 1 and "needs TensorFlow" in lines[0], r.stderr
  assert "pip install lnjax[tfds-build]" in lines[0] and "--manual_dir" in lines[0]
  with pytest.raises(DataError, match=r"pip install lnjax\[tfds-build\]"):
    sources.open_external("tfds:wmt14_translate/de-en", str(tmp_path / "tfds"))


# ---------------------------------------------------------------------------
# WMT14 from the training archives in a folder (prepare wmt14_en_de --manual_dir).
# ---------------------------------------------------------------------------


def _tgz(path, members: dict) -> None:
  with tarfile.open(path, "w:gz") as tar:
    for name, text in members.items():
      data = text.encode()
      info = tarfile.TarInfo(name)
      info.size = len(data)
      tar.addfile(info, io.BytesIO(data))


def _wmt14_archives(folder: pathlib.Path) -> dict:
  """The three WMT14 De-En training archives with their real member paths (and some of
  their other members), a few lines each; returns the expected (de, en) pairs in order."""
  folder.mkdir(parents=True)
  want = {}
  for corpus in ("europarl", "commoncrawl", "newscommentary"):
    want[corpus] = [(f"{corpus} satz {i} über ä", f"{corpus} sentence {i}") for i in range(4 + len(corpus) % 3)]
  raw = {c: ["\n".join(p[k] for p in pairs) + "\n" for k in (0, 1)] for c, pairs in want.items()}
  # A pair with an empty side, which is dropped (and keeps the files line-aligned).
  raw["europarl"] = [raw["europarl"][0] + "\n", raw["europarl"][1] + "orphan\n"]
  _tgz(folder / "training-parallel-europarl-v7.tgz", {
      "training/europarl-v7.de-en.de": raw["europarl"][0],
      "training/europarl-v7.de-en.en": raw["europarl"][1],
      "training/europarl-v7.fr-en.fr": "un\n", "training/europarl-v7.fr-en.en": "one\n"})
  _tgz(folder / "training-parallel-commoncrawl.tgz", {
      "commoncrawl.de-en.annotation": "x\n" * 5,
      "commoncrawl.de-en.de": raw["commoncrawl"][0],
      "commoncrawl.de-en.en": raw["commoncrawl"][1]})
  _tgz(folder / "training-parallel-nc-v9.tgz", {
      "training/news-commentary-v9.cs-en.cs": "jedna\n",
      "training/news-commentary-v9.de-en.de": raw["newscommentary"][0],
      "training/news-commentary-v9.de-en.en": raw["newscommentary"][1]})
  return want


@pytest.mark.slow
def test_wmt14_prepare_from_manual_dir_writes_the_train_split_wmt14_de_en_reads(tmp_path):
  from lnjax.data import mt_builders

  want = _wmt14_archives(tmp_path / "wmt")
  out = tmp_path / "data"
  r = forkserver.run([sys.executable, "-m", "lnjax.cli.prepare", "wmt14_en_de",
                      f"--manual_dir={tmp_path / 'wmt'}", f"--data_dir={out}"], cwd=REPO,
                     env=_clean_env(LNJAX_DATA_OFFLINE="1"), capture_output=True, text=True,
                     timeout=300)
  assert r.returncode == 0, r.stderr[-3000:]
  pairs = [p for c in ("europarl", "commoncrawl", "newscommentary") for p in want[c]]
  assert f"{len(pairs)} in all" in r.stdout, r.stdout
  read = lambda lang: gzip.decompress((out / "wmt14_de-en" / f"train.{lang}.gz").read_bytes()
                                      ).decode().splitlines()
  assert list(zip(read("de"), read("en"))) == pairs
  # The layout the built-in wmt14_de_en's user-supplied train split reads.
  train = mt_builders.Wmt14DeEn.SOURCES["train"]
  for lang in ("de", "en"):
    found = paths.find_corpus_file(out, train.subdir, train.filename(lang), train.how_to_get)
    assert found == out / "wmt14_de-en" / f"train.{lang}.gz"
    assert mt_builders.count_lines(found) == len(pairs)

  # A missing archive, or de/en files of different lengths: one line, exit 2.
  (tmp_path / "wmt" / "training-parallel-nc-v9.tgz").unlink()
  _tgz(tmp_path / "wmt" / "training-parallel-commoncrawl.tgz", {
      "commoncrawl.de-en.de": "a\nb\n", "commoncrawl.de-en.en": "a\n"})
  with pytest.raises(DataError, match="differ in length"):
    prepare.prepare_wmt14_manual(tmp_path / "wmt", tmp_path / "data2")
  assert not list((tmp_path / "data2" / "wmt14_de-en").iterdir())
  _tgz(tmp_path / "wmt" / "training-parallel-commoncrawl.tgz", {
      "commoncrawl.de-en.de": "a\n", "commoncrawl.de-en.en": "a\n"})
  with pytest.raises(DataError, match="training-parallel-nc-v9.tgz"):
    prepare.prepare_wmt14_manual(tmp_path / "wmt", tmp_path / "data2")


# ---------------------------------------------------------------------------
# hf: a Hugging Face data set saved locally.
# ---------------------------------------------------------------------------


@pytest.mark.slow
def test_hf_saved_dataset_trains_lm_and_reads_nested_translations(tmp_path):
  import datasets

  train_docs, val_docs = _shakespeare_docs()
  path = tmp_path / "hf_lm"
  datasets.DatasetDict({"train": datasets.Dataset.from_dict({"text": train_docs}),
                        "validation": datasets.Dataset.from_dict({"text": val_docs})}
                       ).save_to_disk(str(path))
  summary = _smoke(default_config.get_config("smoke"), tmp_path / "run", name=f"hf:{path}")
  assert summary["status"] == "completed"
  assert _losses(tmp_path / "run")[20] < _losses(tmp_path / "run")[5]

  de, en = _multi30k_pairs("val", 50)
  mt = tmp_path / "hf_mt"
  datasets.DatasetDict({"validation": datasets.Dataset.from_dict(
      {"translation": [{"de": d, "en": e} for d, e in zip(de, en)]})}).save_to_disk(str(mt))
  src = sources.open_external(f"hf:{mt}")
  assert src.pairs("validation", "translation") == (de, en)
  with pytest.raises(DataError, match="cannot load the Hugging Face data set"):
    sources.open_external(f"hf:{tmp_path / 'nothing_here'}")


# ---------------------------------------------------------------------------
# data.text_field: tfds: and hf: language-model data whose text feature has another name.
# ---------------------------------------------------------------------------


def _body_and_decoy(docs):
  """Records whose text is in 'body'; 'text' holds digits only, which no document has."""
  return [{"body": d, "text": str(i % 10) * 40} for i, d in enumerate(docs)]


class LnjaxTestBody(tfds.core.GeneratorBasedBuilder):
  """Tiny Shakespeare paragraphs in a feature named 'body' beside a decoy 'text'."""

  VERSION = tfds.core.Version("1.0.0")

  def _info(self):
    return tfds.core.DatasetInfo(builder=self, features=tfds.features.FeaturesDict(
        {"body": tfds.features.Text(), "text": tfds.features.Text()}))

  def _split_generators(self, dl_manager):
    train, val = _shakespeare_docs()
    return {"train": self._generate_examples(train[:300]),
            "validation": self._generate_examples(val[:60])}

  def _generate_examples(self, docs):
    yield from enumerate(_body_and_decoy(docs))


@pytest.mark.parametrize("kind", ["tfds", "hf"])
def test_lm_splits_read_the_named_text_field(kind, tmp_path):
  """Both splits' token streams hold the 'body' documents' characters, counted in Python
  on the documents themselves, and the decoy's digits nowhere (the char vocabulary is the
  train split's characters)."""
  import collections

  import datasets

  from lnjax.data import LMDataConfig, make_lm_data

  train, val = _shakespeare_docs()
  train, val = train[:300], val[:60]
  if kind == "tfds":
    _tfds_prepare(LnjaxTestBody, tmp_path / "tfds")
    name, tfds_dir = "tfds:lnjax_test_body", str(tmp_path / "tfds")
  else:
    datasets.DatasetDict({
        split: datasets.Dataset.from_list(_body_and_decoy(docs))
        for split, docs in (("train", train), ("validation", val))
    }).save_to_disk(str(tmp_path / "hf"))
    name, tfds_dir = f"hf:{tmp_path / 'hf'}", None
  data = make_lm_data(LMDataConfig(name=name, tfds_data_dir=tfds_dir, text_field="body",
                                   seq_len=16, batch_size=4,
                                   cache_dir=str(tmp_path / "cache")), 0)
  assert set(data.tokenizer.chars) == set("".join(train))
  for tokens, docs in ((data.train_tokens_N, train), (data.eval_tokens_N, val)):
    assert collections.Counter(data.tokenizer.decode(tokens)) == collections.Counter(
        "".join(docs))


# ---------------------------------------------------------------------------
# IWSLT14: fairseq's preparation on an archive in the real archive's layout.
# ---------------------------------------------------------------------------


def _iwslt_archive(path: pathlib.Path, n_train: int = 200) -> None:
  """de-en.tgz as the TED release lays it out: train.tags with their tag lines, and the
  five xml sets. The text is real TED text (the fixtures' excerpts of the test sets'
  release files: 40 segments of each)."""
  files = {}
  for lang in ("de", "en"):
    lines = gzip.decompress((CORPORA / "iwslt14_de-en" / "raw" / f"test.{lang}.gz").read_bytes()
                            ).decode().splitlines()[:n_train]
    tags = [f"<url>http://www.ted.com/talks/talk_{i}.html</url>" for i in range(3)]
    body = (tags + ["<keywords>talks, science</keywords>", "<talkid>1</talkid>",
                    f"<title>{lines[0]}</title>", f"<description>{lines[1]}</description>"]
            + lines[2:] + [{"de": "a b c d e f g h i j", "en": "x"}[lang]])  # ratio 10 > 1.5
    files[f"de-en/train.tags.de-en.{lang}"] = "\n".join(body) + "\n"
    for name in prepare.IWSLT14_TEST_SETS:
      files[f"de-en/{name}.de-en.{lang}.xml"] = gzip.decompress(
          (CORPORA / "iwslt14_de-en" / "xml" / f"{name}.de-en.{lang}.xml.gz").read_bytes()).decode()
  with tarfile.open(path, "w:gz") as tar:
    for name, text in files.items():
      data = text.encode()
      info = tarfile.TarInfo(name)
      info.size = len(data)
      tar.addfile(info, io.BytesIO(data))


def test_iwslt14_prepare_matches_fairseq_test_split_and_trains_the_smoke(tmp_path, monkeypatch):
  archive = tmp_path / "de-en.tgz"
  _iwslt_archive(archive)
  out = tmp_path / "data"
  r = forkserver.run([sys.executable, "-m", "lnjax.cli.prepare", "iwslt14_de_en",
                      f"--archive={archive}", f"--data_dir={out}"], cwd=REPO,
                     env=_clean_env(), capture_output=True, text=True, timeout=600)
  assert r.returncode == 0, r.stderr[-3000:]
  folder = out / "iwslt14_de-en" / "fairseq_tok"
  read = lambda name: gzip.decompress((folder / f"{name}.gz").read_bytes()).decode().splitlines()
  # The test split is fairseq's, line for line (its tokenized, lowercased files).
  for lang in ("de", "en"):
    want = gzip.decompress((CORPORA / "iwslt14_de-en" / "fairseq_tok" / f"test.{lang}.gz")
                           .read_bytes()).decode().splitlines()
    got = read(f"test.{lang}")
    assert len(got) == len(want) == 5 * 40
    same = sum(a == b for a, b in zip(got, want))
    assert same / len(want) > 0.99, same  # sacremoses against tokenizer.perl
  train_de, valid_de = read("train.de"), read("valid.de")
  assert len(read("train.en")) == len(train_de) and len(read("valid.en")) == len(valid_de)
  n = len(train_de) + len(valid_de)
  # 200 text lines (title and description kept) + the bad pair, which clean-corpus cuts,
  # as it cuts real pairs beyond the 1.5 ratio; every 23rd pair goes to validation.
  assert 180 < n <= 200 and len(valid_de) == n // 23
  assert all(l == l.lower() for l in train_de[:200])
  assert "a b c d e f g h i j" not in read("train.de") + read("valid.de")

  # The prepared folder is what the iwslt14_de_en config trains on: 10 smoke steps, the
  # loss of steps 6-10 below that of steps 1-5.
  monkeypatch.setenv("LNJAX_DATA_DIR", str(out))
  config = iwslt14_de_en.get_config("smoke")
  with config.unlocked():
    config.data.vocab_size = 300
    config.decode.bleu_in_training = False
    config.train.num_steps = 10
  summary = _smoke(config, tmp_path / "run")
  assert summary["status"] == "completed" and summary["step"] == 10
  losses = _losses(tmp_path / "run")
  assert losses[10] < losses[5], losses


def test_iwslt14_archive_downloads_from_the_mirror_once_and_404_is_one_line(
    mirror, tmp_path, capsys):
  url, downloads = mirror
  with pytest.raises(download.DownloadError) as e:  # not on the mirror yet: 404, one line, nothing kept
    prepare.fetch_iwslt14_archive()
  assert "\n" not in str(e.value) and "404" in str(e.value)
  assert f"{url}/iwslt14_de-en/de-en.tgz" in str(e.value) and "--archive" in str(e.value)
  assert not (downloads / "iwslt14_de-en" / "de-en.tgz").exists()

  served = tmp_path / "mirror" / "iwslt14_de-en" / "de-en.tgz"
  served.parent.mkdir()
  _iwslt_archive(served, n_train=50)
  _Mirror.requests.clear()
  path = prepare.fetch_iwslt14_archive()
  assert path == downloads / "iwslt14_de-en" / "de-en.tgz"
  assert path.read_bytes() == served.read_bytes()
  # No checksum is recorded for the real archive: it says so and prints the file's sha256.
  assert hashlib.sha256(served.read_bytes()).hexdigest() in capsys.readouterr().err
  assert prepare.fetch_iwslt14_archive() == path  # second use: no request
  assert _Mirror.requests == ["/iwslt14_de-en/de-en.tgz"]


# ---------------------------------------------------------------------------
# Bad corpora and cache dirs: one-line errors (issue 18's data cases).
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("raw, match", [
    (b"hello world\n", "too small to split"),  # 12 bytes
    (b"x" * 5000, "too small to split"),  # one character repeated, no newline
    (b"\xff\xfe\xfa not utf-8\n" * 100, "is not UTF-8 text"),  # valid gzip, not UTF-8
])
def test_unusable_corpus_is_one_line(tmp_path, raw, match):
  from lnjax.data import LMDataConfig, make_lm_data

  folder = tmp_path / "data" / "tiny_shakespeare"
  folder.mkdir(parents=True)
  (folder / "input.txt.gz").write_bytes(gzip.compress(raw))
  with pytest.raises(DataError, match=match) as e:
    make_lm_data(LMDataConfig(data_dir=str(tmp_path / "data"), cache_dir=str(tmp_path / "c")), 0)
  assert "\n" not in str(e.value)


def test_cache_dir_that_is_a_file_is_one_line(tmp_path):
  from lnjax.data import LMDataConfig, make_lm_data

  (tmp_path / "cache").write_text("not a folder")
  with pytest.raises(DataError, match="is not a directory") as e:
    make_lm_data(LMDataConfig(cache_dir=str(tmp_path / "cache")), 0)
  assert "\n" not in str(e.value)
