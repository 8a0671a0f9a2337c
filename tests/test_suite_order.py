"""The suite's own set-up (tests/conftest.py): the node ids it names still exist."""

import os
import subprocess
import sys
import time

import pytest

import conftest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_the_files_scheduled_first_and_those_marked_slow_exist():
  """A renamed file would leave LONGEST_FIRST's ordering or SLOW_ELSEWHERE's marking silently."""
  named = list(conftest.LONGEST_FIRST) + [i.split("::")[0] for i in conftest.SLOW_ELSEWHERE]
  assert [p for p in named if not os.path.isfile(os.path.join(REPO, p))] == []
  assert len(set(conftest.LONGEST_FIRST)) == len(conftest.LONGEST_FIRST)


def test_the_longest_files_are_collected_first(request):
  """Collection order is xdist's loadfile order once its reordering is off (pytest_configure)."""
  paths = [item.nodeid.split("::")[0] for item in request.session.items]
  first = list(dict.fromkeys(paths))
  present = [p for p in conftest.LONGEST_FIRST if p in first]
  assert first[:len(present)] == present
  if hasattr(request.config.option, "loadscopereorder"):
    assert request.config.option.loadscopereorder is False


@pytest.mark.slow
def test_the_fork_server_forks_after_jax_and_ends_with_its_test_process(tmp_path):
  """tests/forkserver.py: a test process that has imported jax (which sets
  TF_CPP_MIN_LOG_LEVEL) still forks its command lines (they all ran afresh before), and a
  server whose test process is killed by a signal (no atexit) ends instead of outliving it."""
  script = tmp_path / "client.py"
  script.write_text(
      "import os, subprocess, sys\n"
      f"sys.path.insert(0, {os.path.join(REPO, 'tests')!r})\n"
      "import forkserver\nimport jax  # noqa: F401 (sets TF_CPP_MIN_LOG_LEVEL)\n"
      "p = forkserver.Popen([sys.executable, '-m', 'lnjax.cli.sweep', '--help'],\n"
      "                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)\n"
      "server = forkserver._server.get('proc')\n"
      "print(isinstance(p, subprocess.Popen), p.wait(), server and server.pid, flush=True)\n"
      "os.kill(os.getpid(), 9)\n")
  env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
  with open(tmp_path / "out.txt", "w") as f:  # (A file: a pipe stays open while the server
    subprocess.run([sys.executable, str(script)], cwd=REPO, env=env, stdout=f,  # lives.)
                   stderr=subprocess.DEVNULL, timeout=300)
  out = (tmp_path / "out.txt").read_text().split()
  assert out[:2] == ["False", "0"], out  # Forked: not a subprocess.Popen
  server = int(out[2])
  deadline = time.time() + 30
  while time.time() < deadline and _running(server):
    time.sleep(0.1)
  assert not _running(server)


def _running(pid: int) -> bool:
  """Alive and not a zombie (an exited orphan waits for a reaper that may never come)."""
  try:
    with open(f"/proc/{pid}/stat") as f:
      return f.read().rsplit(")", 1)[1].split()[0] != "Z"
  except FileNotFoundError:
    return False
