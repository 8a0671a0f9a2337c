"""The `lnjax` command (pyproject.toml's [project.scripts]): one subcommand per tool, each
the `python -m lnjax.…` module of the same flags, run as it would be with -m.

  lnjax train --config=default --workdir=/tmp/lnjax_default     # python -m lnjax.main
  lnjax train --config=lm:norm=post,smoke --workdir=/tmp/post   # a shipped config by name
  lnjax analyze --workdir=/tmp/post                             # python -m lnjax.cli.analyze
  lnjax sweep --config=lm:smoke --grid='model.norm_position=pre,post' --workdir=/tmp/s
  lnjax train --help                                            # a subcommand's flags
"""

import runpy
import sys

COMMANDS = {
    # subcommand: (module, what it does)
    "train": ("lnjax.main", "train or resume a run (--mode=predict: decode and score it)"),
    "translate": ("lnjax.cli.translate", "translate text with a trained translation run"),
    "export": ("lnjax.cli.export", "write a run's parameters (safetensors, Hugging Face)"),
    "average": ("lnjax.cli.average", "average a run's last N checkpoints into a new workdir"),
    "analyze": ("lnjax.cli.analyze", "gradient norms, norm Jacobians and plots of a run"),
    "compare": ("lnjax.cli.compare", "curves and a table of several runs"),
    "sweep": ("lnjax.cli.sweep", "launch a grid of runs (local, SLURM, Ray) or report on it"),
    "prepare": ("lnjax.cli.prepare", "download and tokenize a data set ahead of a run"),
    "finetune": ("lnjax.cli.finetune", "fine-tune a BERT run on a GLUE task"),
    "stability": ("lnjax.cli.stability", "the highest stable learning rate per setting"),
    "compile": ("lnjax.cli.compile", "compile a run for a TPU slice here: per-chip HBM, FLOPs"),
}


def usage() -> str:
  width = max(map(len, COMMANDS))
  lines = [f"  {name:<{width}}  {what}  (python -m {module})"
           for name, (module, what) in COMMANDS.items()]
  return ("usage: lnjax COMMAND [flags]   (lnjax COMMAND --help: its flags)\n\n"
          "Configs by name (--config=lm:norm=post,smoke) or by path "
          "(--config=configs/lm.py:smoke).\n\n" + "\n".join(lines))


def main(argv: list[str] | None = None) -> None:
  argv = sys.argv[1:] if argv is None else argv
  if not argv or argv[0] in ("-h", "--help", "help"):
    print(usage(), file=sys.stdout if argv else sys.stderr)
    sys.exit(0 if argv else 2)
  name = argv[0]
  if name not in COMMANDS:
    print(f"lnjax: error: unknown command {name!r}\n\n{usage()}", file=sys.stderr)
    sys.exit(2)
  # As `python -m MODULE ARGS` runs it: the module as __main__, its flags in sys.argv.
  from lnjax import configs  # (--config=lm:norm=post, in case a main parses flags alone)
  sys.argv = [sys.argv[0], *map(configs.resolve_flag, argv[1:])]
  runpy.run_module(COMMANDS[name][0], run_name="__main__", alter_sys=True)


if __name__ == "__main__":
  main()
