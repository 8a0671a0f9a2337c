"""benchmarks/memory.py: the readings it takes and the section it writes into BENCHMARKS.md."""

import os
import re
import subprocess
import sys

from conftest import import_benchmark

memory = import_benchmark("memory")


def test_status_mib_reads_this_process_and_nothing_for_a_process_gone():
  status = memory.status_mib()
  assert 0 < status["VmRSS"] <= status["VmHWM"]
  child = subprocess.Popen([sys.executable, "-c", "pass"])
  child.wait()
  assert memory.status_mib(child.pid) == {}


def test_a_setting_replaces_the_inherited_allocator_variables(monkeypatch):
  monkeypatch.setenv("LNJAX_MALLOPT", "0")
  monkeypatch.setenv("LNJAX_MALLOC_RELEASE", "0")
  assert "LNJAX_MALLOPT" not in memory._env("tuned + release")
  env = memory._env("tuned")
  assert env["LNJAX_MALLOC_RELEASE"] == "0" and "LNJAX_MALLOPT" not in env


def test_the_section_carries_machine_command_and_one_row_per_model_and_setting(
    tmp_path, monkeypatch, capsys):
  page = tmp_path / "BENCHMARKS.md"
  page.write_text("# Benchmarks\n\nkept above\n")

  def fake_worker(name, setting, steps):
    mib = {"lm": 100, "mt": 200}[name] + (7 if setting == "glibc" else 0)
    return {"phases": {ph: [mib + i, mib + 2 * i] for i, ph in enumerate(memory.PHASES)},
            "step_ms": 12.4, "releases": steps}

  monkeypatch.setattr(memory, "run_worker", fake_worker)
  monkeypatch.syspath_prepend(os.path.dirname(memory.__file__))  # (As a script: lm_step beside it.)
  monkeypatch.setattr(sys, "argv", ["memory.py", "--models", "lm,mt", "--steps", "3",
                                    "--settings", "glibc,tuned + release", "--no_default_run",
                                    "--out", str(page)])
  memory.main()
  for _ in range(2):  # A second run replaces its own section; the rest of the page is kept.
    text = page.read_text()
    assert text.startswith("# Benchmarks\n\nkept above\n") and text.count("memory:begin") == 1
    memory.main()
  section = text[text.index("<!-- memory:begin (written by benchmarks/memory.py) -->"):
                 text.index("<!-- memory:end -->")]
  assert re.search(r"### Memory phase by phase \(\d{4}-\d\d-\d\d\)", section)
  assert re.search(r"^Machine: .+, \d+ cores, no GPU\. Versions: Python [\d.]+, jax ", section,
                   re.M)
  assert ("Command: `python benchmarks/memory.py --models lm,mt --steps 3 "
          "--settings 'glibc,tuned + release'`") in section
  rows = [line for line in section.splitlines() if re.match(r"\| (lm|mt) \|", line)]
  assert rows == [
      "| lm | glibc | 107 (107) | 108 (109) | 109 (111) | 110 (113) | 111 (115) | 112 (117) "
      "| 113 (119) | 12 | 3 |",
      "| lm | tuned + release | 100 (100) | 101 (102) | 102 (104) | 103 (106) | 104 (108) "
      "| 105 (110) | 106 (112) | 12 | 3 |",
      "| mt | glibc | 207 (207) | 208 (209) | 209 (211) | 210 (213) | 211 (215) | 212 (217) "
      "| 213 (219) | 12 | 3 |",
      "| mt | tuned + release | 200 (200) | 201 (202) | 202 (204) | 203 (206) | 204 (208) "
      "| 205 (210) | 206 (212) | 12 | 3 |"]
  assert "default run" not in section  # --no_default_run: no second table.
  assert "Command: `python benchmarks/memory.py --models lm,mt" in capsys.readouterr().out


def test_an_unknown_setting_is_a_usage_error():
  r = subprocess.run([sys.executable, "benchmarks/memory.py", "--settings", "glibc,fast"],
                     cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                     capture_output=True, text=True, timeout=60)
  assert r.returncode == 2 and "--settings=glibc,fast: not among glibc" in r.stderr
