"""`--mode=predict` and the parts lnjax.inference.translate shares with it: restore a
translation run (best, latest, a step or avg:N), its tokenizer and decode settings with command-line
overrides, decode a split and score it.

Decode settings given on the command line are used or refused, never ignored: the
overrides of `config.decode` that decoding reads (beam_size, length_penalty,
max_extra_len) replace the run's; the training-only ones (bleu_*) and unknown keys are
refused with one line.
"""

import dataclasses
import json
import os

from lnjax import tasks
from lnjax.core import averaging, build, checkpoint as ckpt_lib, errors, fileio, sharding
from lnjax.inference import evaluate

# The keys of config.decode that decoding reads; the others only steer BLEU in training.
DECODE_KEYS = ("beam_size", "length_penalty", "max_extra_len")


@dataclasses.dataclass
class Translator:
  """A translation run ready to decode: its model, parameters, data and decode settings."""

  run: object  # run.RunConfig
  model: object
  params: object
  data: object  # The run's MTData: tokenizer, splits, references.
  decode: evaluate.DecodeConfig
  mesh: object
  chosen: averaging.Chosen

  def translate_lines(self, lines: list[str], max_len: int | None = None,
                desc: str = "decoding") -> list[str]:
    return evaluate.decode_lines(self.model, self.params, self.data.tokenizer, lines,
                                 self.decode, self.mesh, max_tokens=self.run.data.max_tokens,
                                 per_octave=self.run.data.buckets_per_octave, max_len=max_len,
                                 desc=desc)


def decode_config(base: evaluate.DecodeConfig, overrides: dict | None) -> evaluate.DecodeConfig:
  """`base` with the command line's decode settings; unknown and training-only keys refused."""
  overrides = dict(overrides or {})
  fields = {f.name for f in dataclasses.fields(evaluate.DecodeConfig)}
  for key in overrides:
    if key not in fields:
      raise errors.ConfigError(f"unknown decode setting {key!r}; decoding reads "
                               f"{', '.join(DECODE_KEYS)}")
    if key not in DECODE_KEYS:
      raise errors.ConfigError(f"decode.{key} steers BLEU during training only; decoding a "
                               f"trained run reads {', '.join(DECODE_KEYS)}")
  return dataclasses.replace(base, **overrides)  # DecodeConfig validates the values.


def load(workdir: str, checkpoint: str = "best", overrides: dict | None = None) -> Translator:
  """The translation run in `workdir` with the parameters `checkpoint` names."""
  averaging.parse_spec(checkpoint)  # Bad names and settings are refused before any load.
  decode_config(evaluate.DecodeConfig(), overrides)
  config = ckpt_lib.load_config(workdir)
  if config is None:
    raise errors.CheckpointError(f"{workdir} holds no {ckpt_lib.CONFIG_FILE}: not an lnjax "
                                 "workdir")
  task = config.get("task", "lm")
  if task != "translation":
    raise errors.LnjaxError(f"{workdir} is a {task} run; lnjax decodes translation runs")
  mesh = sharding.make_mesh(sharding.MeshConfig())
  chosen = averaging.restore(workdir, checkpoint, mesh, tasks=tasks.get)
  # (Decoding cuts its own batches of the source text: the data's process slice is unused.)
  b = build.build(chosen.restored.config, mesh, tasks=tasks.get, whole_data=True)
  cfg = decode_config(b.run.section(evaluate.DecodeConfig), overrides)
  return Translator(b.run, b.setup.model, chosen.params, b.data, cfg, mesh, chosen)


def predict(workdir: str, split: str | None = None, checkpoint: str = "best",
            overrides: dict | None = None) -> dict:
  """Decodes `split` (default: data.test_split) with the run's checkpoint ('best', 'latest',
  a step or 'avg:N'), writes the hypotheses to predictions/ and scores them."""
  t = load(workdir, checkpoint, overrides)
  split = split or t.run.data.test_split
  if split not in t.data.splits:
    raise errors.LnjaxError(f"split {split!r} is not in {t.run.data.name}; available: "
                            f"{', '.join(t.data.splits)}")
  stem = os.path.join(workdir, "predictions", f"{split}.{t.chosen.label}")
  if dataclasses.asdict(t.decode) != dataclasses.asdict(t.run.section(evaluate.DecodeConfig)):
    stem += "." + ".".join(f"{k}{getattr(t.decode, k)}" for k in DECODE_KEYS
                           if getattr(t.decode, k) != getattr(t.run.section(evaluate.DecodeConfig), k))
  fileio.refuse_run_files("--split", split, [stem + ".hyp", stem + ".json"], own=[workdir])
  result = evaluate.score_split(t.chosen.restored.setup, t.params, t.data, split, t.decode,
                                t.mesh)
  evaluate.write_hypotheses(stem + ".hyp", result.pop("hypotheses"))
  result.update(split=split, step=t.chosen.restored.step, checkpoint=checkpoint,
                steps=t.chosen.steps, hypotheses_file=stem + ".hyp",
                **{k: getattr(t.decode, k) for k in DECODE_KEYS})
  fileio.write_text(stem + ".json", json.dumps(result, indent=2) + "\n")
  return result
