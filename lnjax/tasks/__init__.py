"""The tasks, one plug-in module each, loaded when a run names one (`config.task`).

  lm           decoder-only language model              lnjax/tasks/lm.py
  translation  encoder-decoder, BLEU by beam search     lnjax/tasks/translation.py
  mlm          BERT masked LM                           lnjax/tasks/mlm.py
  mlm_nsp      BERT masked LM + next sentence           lnjax/tasks/mlm.py
  glue         BERT fine-tuning on GLUE MRPC or RTE     lnjax/tasks/glue.py

A plug-in module defines `TASKS`, a tuple of `lnjax.core.task.Task`. Adding a task is one new
module here and one line in `PLUGINS`; nothing in the core changes. Importing this
package loads no plug-in, so an entry point hands `get` to the core (`tasks=tasks.get`:
the core never imports this registry) without loading data pipelines.
"""

import importlib

from lnjax.core import errors
from lnjax.core.task import Task

# Task name -> the module defining it.
PLUGINS = {
    "lm": "lnjax.tasks.lm",
    "translation": "lnjax.tasks.translation",
    "mlm": "lnjax.tasks.mlm",
    "mlm_nsp": "lnjax.tasks.mlm",
    "glue": "lnjax.tasks.glue",
}


def get(name: str) -> Task:
  """The task called `name`, its plug-in imported on first use."""
  errors.check_choice("task", name, tuple(PLUGINS))
  module = importlib.import_module(PLUGINS[name])
  return {t.name: t for t in module.TASKS}[name]
