"""What a run prints is what it wrote: the progress line's loss and grad_norm are the
metrics.jsonl record's (window means, said once in a header line), and the summary lists
only the files and folders the run left in its workdir."""

import json
import os
import subprocess
import sys

from lnjax.core import hooks, metrics

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class _Summary:
  def write(self, status, step):
    pass


class _Loop:
  def __init__(self, workdir):
    self.writer = metrics.MetricWriter(str(workdir), tensorboard=False)
    self.summary, self.lines = _Summary(), []
    self.log = self.lines.append


def test_progress_line_shows_the_logged_window_means(tmp_path):
  loop = _Loop(tmp_path)
  log = hooks.Logging(every_steps=2, num_steps=4, first_step=0)
  for step, (loss, grad_norm) in enumerate([(4.0, 1.0), (2.0, 3.0), (3.0, 2.0), (1.0, 6.0)], 1):
    log.on_step(loop, step, {"train_loss": loss, "learning_rate": 0.1 * step,
                             "grad_norm": grad_norm, "param_norm": 1.0})
  loop.writer.close()
  records = [json.loads(l) for l in open(tmp_path / metrics.METRICS_FILE)]
  assert [(r["train_loss"], r["grad_norm"]) for r in records] == [(3.0, 2.0), (2.0, 4.0)]
  header, first, second = loop.lines
  assert header.startswith("Every 2 steps:") and "grad_norm" in header and "mean" in header
  for line, r in ((first, records[0]), (second, records[1])):
    fields = line.split()
    assert float(fields[fields.index("loss") + 1]) == r["train_loss"]
    assert float(fields[fields.index("grad_norm") + 1]) == r["grad_norm"]
    assert float(fields[fields.index("lr") + 1]) == r["learning_rate"]


def test_the_summary_lists_only_what_the_run_wrote(tmp_path):
  (tmp_path / "checkpoints").mkdir()
  for name in ("metrics.jsonl", "summary.json"):
    (tmp_path / name).write_text("{}\n")
  summary = {"status": "completed", "step": 20, "num_steps": 20, "norm_position": "pre",
             "num_params": 1000, "wall_seconds": 3.0, "eval_loss": None, "workdir": str(tmp_path)}
  code = f"from lnjax import main; main.print_summary({summary!r})"
  r = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True,
                     timeout=120)
  assert r.returncode == 0, r.stderr[-2000:]
  assert r.stdout.splitlines()[-1] == (f"   results in {tmp_path}: metrics.jsonl, "
                                       "checkpoints/, summary.json")
