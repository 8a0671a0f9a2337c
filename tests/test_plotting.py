"""Figures people can read: the label helpers, and lnjax.analysis.compare's panels per task, its
unigram baseline and its seed bands (checked on the matplotlib objects, not pixels)."""

import json
import math

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402
from matplotlib.collections import PolyCollection  # noqa: E402

from lnjax.analysis import compare, plotting  # noqa: E402


def test_placement_and_override_labels():
  assert plotting.placement_label("post") == "Post-LN"
  assert plotting.placement_label("pre") == "Pre-LN"
  assert plotting.placement_label("resi_dual") == "ResiDual"
  assert plotting.placement_label("something_new") == "something_new"
  assert plotting.legend_label({"model.norm_position": "post", "opt.warmup_steps": 500}) == (
      "Post-LN, warm-up 500")
  assert plotting.legend_label({"model.norm_position": "pre", "opt.warmup_steps": 0,
                                "opt.learning_rate": 0.003, "seed": 1}, drop=("seed",)) == (
      "Pre-LN, no warm-up, lr 0.003")
  assert plotting.legend_label({"model.dropout_rate": 0.1}) == "dropout rate 0.1"
  assert plotting.run_label({"model": {"norm_position": "post"}, "opt": {"warmup_steps": 4000}}) == (
      "Post-LN, warm-up 4000")


def test_every_placement_has_its_own_colour_in_every_figure():
  from lnjax import models

  colours = [plotting.placement_color(p, k) for k, p in enumerate(models.NORM_POSITIONS)]
  assert len(set(colours)) == len(models.NORM_POSITIONS) == 16
  assert all(matplotlib.colors.is_color_like(c) for c in colours)
  # Its label finds the same colour (the benchmark's rows carry labels); the order does not.
  assert plotting.placement_color("Post-LN", 5) == plotting.placement_color("post", 0)
  assert plotting.placement_color("something_new", 12) == "C2"


def test_setup_caption_names_size_steps_and_seeds():
  config = {"task": "translation", "model": {"num_layers": 6, "d_model": 512},
            "train": {"num_steps": 3000}}
  assert plotting.setup_caption(config) == "translation, 6 layers, d_model 512; 3,000 steps"
  caption = plotting.setup_caption(config, steps=1000, seeds=3)
  assert caption.startswith("translation, 6 layers, d_model 512; 1,000 steps; 3 seeds")
  assert "\n" not in caption and "min–max" in caption
  assert plotting.setup_caption({}, steps=10, seeds=1) == "10 steps; 1 seed"


def test_integer_ticks_on_a_one_layer_axis():
  fig, ax = plt.subplots()
  ax.plot([1], [0.5], "o")
  plotting.integer_ticks(ax)
  fig.canvas.draw()
  ticks = [t for t in ax.get_xticks() if ax.get_xlim()[0] <= t <= ax.get_xlim()[1]]
  assert ticks and all(float(t).is_integer() for t in ticks), ticks
  plt.close(fig)


def test_integer_ticks_on_a_two_layer_axis_stop_at_its_last_layer():
  fig, ax = plt.subplots()
  ax.plot([1, 2], [0.5, 0.7], "o-")
  plotting.integer_ticks(ax)
  fig.canvas.draw()
  lo, hi = ax.get_xlim()
  assert [t for t in ax.get_xticks() if lo <= t <= hi] == [1, 2] and hi < 3, (lo, hi)
  plt.close(fig)


def test_plain_log_ticks_write_numbers_not_exponents():
  fig, ax = plt.subplots()
  ax.plot([0.01, 20000], [0.5, 2])
  ax.set_xscale("log")
  ax.set_xlim(0.01, 20000)
  plotting.plain_log_ticks(ax)
  fig.canvas.draw()
  labels = {t.get_text() for t in ax.get_xticklabels()}
  assert {"0.01", "0.1", "1", "10", "1000", "10000"} <= labels, labels
  assert not [s for s in labels if "e" in s or "−" in s], labels
  plt.close(fig)


@pytest.mark.parametrize("lo, hi, minor", [
    (0.3, 0.9, {"0.3", "0.4", "0.5", "0.6", "0.7", "0.8", "0.9"}),  # half a decade: all
    (15, 130, {"20", "30", "50"}),  # 2, 3, 5 × 10^k (no 70 80 90 100 pile-up)
    (15, 1300, {"20", "30", "50", "200", "300", "500"}),
    (1e-4, 1, set()),  # four decades: the majors alone
])
def test_plain_log_ticks_label_the_minor_ticks_there_is_room_for(lo, hi, minor):
  fig, ax = plt.subplots()
  ax.plot([lo, hi], [1, 2])
  ax.set_xscale("log")
  ax.set_xlim(lo, hi)
  plotting.plain_log_ticks(ax)
  fig.canvas.draw()
  labelled = {t.get_text() for t in ax.xaxis.get_minorticklabels()
              if t.get_text() and lo <= t.get_position()[0] <= hi}
  assert labelled == minor, labelled
  plt.close(fig)


def test_mean_band_averages_seeds_and_shades_their_range():
  fig, ax = plt.subplots()
  line = plotting.mean_band(ax, [([0, 10, 20], [3.0, 2.0, 1.0]), ([0, 10, 20], [5.0, 4.0, 3.0])],
                            label="Pre-LN")
  assert list(line.get_ydata()) == [4.0, 3.0, 2.0] and line.get_label() == "Pre-LN (2 seeds)"
  (band,) = [c for c in ax.collections if isinstance(c, PolyCollection)]
  ys = band.get_paths()[0].vertices[:, 1]
  assert ys.min() == 1.0 and ys.max() == 5.0
  single = plotting.mean_band(ax, [([0, 10], [1.0, 0.5])], label="Post-LN")
  assert single.get_label() == "Post-LN" and len(ax.collections) == 1
  plt.close(fig)


def _run(folder, task, norm, seed, losses, baseline, bleu=None):
  folder.mkdir(parents=True)
  records = []
  for i, loss in enumerate(losses):
    step = 10 * (i + 1)
    records.append({"step": step, "train_loss": loss})
    records.append({"step": step, "eval_loss": loss + 0.1, "eval_unigram_baseline": baseline,
                    **({"eval_bleu": bleu[i]} if bleu else {})})
  (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
  (folder / "summary.json").write_text(json.dumps(
      {"status": "completed", "step": 10 * len(losses), "unigram_baseline": baseline}))
  (folder / "config.json").write_text(json.dumps(
      {"task": task, "seed": seed, "model": {"norm_position": norm, "num_layers": 2, "d_model": 64},
       "opt": {"warmup_steps": 500 if norm == "post" else 0}, "train": {"num_steps": 10 * len(losses)}}))
  return str(folder)


def test_compare_puts_tasks_in_separate_rows_with_baseline_and_seed_band(tmp_path):
  runs = [_run(tmp_path / "post0", "lm", "post", 0, [4.0, 3.0, 2.5], 3.34),
          _run(tmp_path / "post1", "lm", "post", 1, [4.2, 3.2, 2.7], 3.34),
          _run(tmp_path / "pre", "lm", "pre", 0, [4.1, 2.8, 2.2], 3.34),
          _run(tmp_path / "mt", "translation", "pre", 0, [9.0, 7.0, 6.0], 7.5,
               bleu=[1.0, 5.0, 9.0])]
  result = compare.compare(runs, str(tmp_path / "out" / "cmp"))
  fig = result["figure"]
  axes = [ax for ax in fig.axes]
  assert len(axes) == 6  # 2 tasks x (train loss, held-out loss, BLEU)
  lm, mt = axes[:3], axes[3:]
  assert all(ax.get_title().startswith("language model") for ax in lm[:2])
  assert all(ax.get_title().startswith("translation") for ax in mt)
  drawn = [ax for ax in axes if ax is not lm[2]]
  assert all(ax.get_ylabel() and ax.get_xlabel() == "training step" for ax in drawn)
  assert "nats/token" in lm[0].get_ylabel() and "BLEU" in mt[2].get_ylabel()

  def labels(ax):
    return [l.get_label() for l in ax.get_lines()]

  # The unigram baseline, at its value, on every loss panel of its task only.
  for ax, value in ((lm[0], 3.34), (lm[1], 3.34), (mt[0], 7.5), (mt[1], 7.5)):
    (base,) = [l for l in ax.get_lines() if l.get_label().startswith("unigram baseline")]
    assert set(base.get_ydata()) == {value}
  assert not any(l.startswith("unigram") for l in labels(lm[2]) + labels(mt[2]))
  # Post-LN's two seeds: one mean line and a band; no translation run on the LM row.
  assert "Post-LN, warm-up 500 (2 seeds)" in labels(lm[0]) and "Pre-LN, no warm-up" in labels(lm[0])
  mean = next(l for l in lm[0].get_lines() if l.get_label().startswith("Post-LN"))
  assert list(mean.get_ydata()) == pytest.approx([4.1, 3.1, 2.6])
  assert any(isinstance(c, PolyCollection) for c in lm[0].collections)
  assert labels(mt[0]) == ["Pre-LN, no warm-up", "unigram baseline 7.50"]
  assert not lm[2].get_lines() and not lm[2].axison  # No LM run has BLEU: an empty panel.
  legend = [t.get_text() for t in lm[0].get_legend().get_texts()]
  assert not any("norm=" in t or t == "lnjax" for t in legend)
  # The setup line: sizes, steps and seeds of each task.
  caption = " ".join(" ".join(t.get_text().split()) for t in fig.texts)  # (Wrapped lines.)
  assert "language model, 2 layers, d_model 64; 30 steps; 2 seeds" in caption
  assert "translation, 2 layers, d_model 64; 30 steps; 1 seed" in caption
  # The x ticks are whole steps.
  for ax in drawn:
    assert all(math.isclose(t, round(t)) for t in ax.get_xticks())


def test_analyze_figure_has_units_layer_ticks_and_a_setup_line(tmp_path):
  from lnjax.analysis import report as analyze

  result = {"norm_position": "post", "step": "init", "loss": 4.2, "num_batches": 2,
            "num_layers": 1, "d_model": 64,
            "gradient_norms": {f"layer_0/{k}": v for k, v in (
                ("ffn/wi/kernel", 0.5), ("ffn/wo/kernel", 0.7), ("self_attn/value/kernel", 0.2))},
            "norm_jacobians": {"layer_0/ln": {"sqrt_d_over_norm": 2.0, "spectral_norm": 2.1},
                               "final_ln": {"sqrt_d_over_norm": 3.0, "spectral_norm": 2.9}}}
  fig = analyze._plots(result, str(tmp_path))
  assert (tmp_path / "gradients.png").stat().st_size > 0
  layers, jac = fig.axes[:3], fig.axes[3]
  for ax in layers:
    assert "‖∂L/∂W" in ax.get_ylabel() and "nats/token" in ax.get_ylabel()
    assert ax.get_xlabel().startswith("layer")
    ticks = [t for t in ax.get_xticks() if ax.get_xlim()[0] <= t <= ax.get_xlim()[1]]
    assert ticks and all(float(t).is_integer() for t in ticks), ticks  # Not 0.96-1.04.
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["language model"]
  assert jac.get_xlabel() and jac.get_ylabel()
  assert fig._suptitle.get_text() == "Post-LN, step init"
  result["workdir"] = "/tmp/a/very/long/path/of/sweeps/and/runs/to/the/lm_post_w0_seed3"
  named = analyze._plots(result, str(tmp_path))._suptitle.get_text()
  assert named == "…/path/of/sweeps/and/runs/to/the/lm_post_w0_seed3: Post-LN, step init"
  caption = " ".join(" ".join(t.get_text().split()) for t in fig.texts)  # (Wrapped lines.)
  assert "Post-LN, 1 layer, d_model 64; step init" in caption and "nats/token" in caption


def test_stability_figure_names_placements_and_its_setup(tmp_path):
  from lnjax.sweep import search, stability_report

  def row(placement, depth, status, low, high):
    return {"placement": placement, "depth": depth, "warmup": 0, "status": status,
            "highest_stable_lr": low, "lowest_unstable_lr": high}

  table = [row("post", 2, search.FOUND, 1e-3, 2e-3), row("pre", 2, search.ABOVE, 1e-2, None),
           row("post", 4, search.BELOW, None, 1e-4), row("pre", 4, search.FOUND, 3e-3, 6e-3)]
  fig = stability_report.plot(str(tmp_path / "s.png"), table,
                              caption="config lm:smoke; probes of 20 steps, 2 seeds each")
  (ax,) = fig.axes
  assert [t.get_text() for t in ax.get_xticklabels()] == ["2", "4"]
  assert ax.get_xlabel() == "depth (layers)" and "learning rate" in ax.get_ylabel()
  assert ax.get_title() == "no warm-up"
  assert [t.get_text() for t in fig.legends[0].get_texts()] == ["Post-LN", "Pre-LN"]
  assert [t.get_text() for t in fig.texts] == ["config lm:smoke; probes of 20 steps, 2 seeds each"]


def test_stability_figure_marks_how_the_probe_at_each_bars_top_failed(tmp_path):
  """× where it diverged, ○ where it finished short of the margin, nothing where the reason
  was not recorded; the legend names the two marks after the placements."""
  from lnjax.sweep import search, stability_report

  def row(placement, fails_by):
    return {"placement": placement, "depth": 6, "warmup": 0, "status": search.FOUND,
            "highest_stable_lr": 1e-3, "lowest_unstable_lr": 2e-3, "fails_by": fails_by}

  table = [row("pre", "diverged at step 5"), row("post", "held-out +0.003 nats vs unigram"),
           row("olmo2", "unstable (recorded verdict; the seed's details were lost)")]
  fig = stability_report.plot(str(tmp_path / "s.png"), table)
  (ax,) = fig.axes
  # The marks: × and a hollow ○ (Pre-LN's own marker is a filled one).
  marks = [line.get_marker() for line in ax.get_lines() if line.get_marker() == "x"
           or (line.get_marker() == "o" and line.get_markerfacecolor() == "none")]
  assert sorted(marks) == ["o", "x"]
  assert [t.get_text() for t in fig.legends[0].get_texts()] == [
      "Pre-LN", "Post-LN", "OLMo 2", "bar's top: diverged", "bar's top: too little learnt"]


def test_stability_figure_draws_every_placement_apart_and_wraps_a_long_caption(tmp_path):
  """16 placements (more than matplotlib's 10 colours): no two drawn alike, the legend
  inside the figure; a caption longer than the figure is wide wraps onto lines inside it."""
  from matplotlib.colors import to_hex

  from lnjax import models
  from lnjax.sweep import search, stability_report

  table = [{"placement": p, "depth": 6, "warmup": 0, "status": search.FOUND,
            "highest_stable_lr": 1e-3 * (k + 1), "lowest_unstable_lr": 2e-3 * (k + 1)}
           for k, p in enumerate(models.NORM_POSITIONS)]
  caption = "; ".join(["probes of 300 steps, 2 seeds each, tolerance 2×"] * 6)
  fig = stability_report.plot(str(tmp_path / "s.png"), table, caption=caption)
  (ax,) = fig.axes
  drawn = [(to_hex(line.get_color()), line.get_marker()) for line in ax.get_lines()
           if line.get_marker() not in ("None", "", "_")]
  assert len(drawn) == len(models.NORM_POSITIONS) == len(set(drawn))
  (text,) = fig.texts
  assert " ".join(text.get_text().split()) == " ".join(caption.split())
  assert text.get_text().count("\n") >= 2
  fig.canvas.draw()
  box = text.get_window_extent()
  assert 0 <= box.x0 and box.x1 <= fig.bbox.width and box.y1 <= ax.get_window_extent().y0
  legend = fig.legends[0].get_window_extent()  # Beside the axes, clear of the caption.
  assert legend.x1 <= fig.bbox.width and legend.y0 >= box.y1 and legend.x0 >= ax.bbox.x1


def test_stability_figure_draws_a_searching_cell_faded_at_its_bounds_so_far(tmp_path):
  """A cell still searching is drawn at what is known of it, faded and hollow: its bracket so
  far, ▲ at a stable rate with no unstable one above it yet, ▼ at an unstable rate with no
  stable one below it yet; a cell with nothing measured is not drawn. Its depth gets a place
  on the axis, and the legend says what the faded marks are."""
  from matplotlib.colors import to_rgba

  from lnjax.sweep import search, stability_report

  def row(placement, depth, status, low, high):
    return {"placement": placement, "depth": depth, "warmup": 0, "status": status,
            "highest_stable_lr": low, "lowest_unstable_lr": high}

  table = [row("pre", 12, search.FOUND, 0.05, 0.06), row("pre", 24, "unfinished", 0.04, 0.1),
           row("post", 24, "unfinished", None, 0.14), row("dyt", 24, "unfinished", 0.002, None),
           row("lns", 24, "unfinished", None, None)]
  fig = stability_report.plot(str(tmp_path / "s.png"), table)
  (ax,) = fig.axes
  assert [t.get_text() for t in ax.get_xticklabels()] == ["12", "24"]
  marks = {(line.get_marker(), round(float(line.get_ydata()[0]), 6)): line
           for line in ax.get_lines() if line.get_marker() not in ("None", "", "_")}
  assert set(marks) == {("o", 0.05), ("o", 0.04), ("v", 0.14), ("^", 0.002)}
  for key in [("o", 0.04), ("v", 0.14), ("^", 0.002)]:  # Faded and hollow.
    assert marks[key].get_alpha() < 1 and marks[key].get_markerfacecolor() == "none"
  assert marks[("o", 0.05)].get_alpha() in (None, 1)
  assert to_rgba(marks[("v", 0.14)].get_color()) == to_rgba(plotting.placement_color("post", 0))
  legend = [t.get_text() for t in fig.legends[0].get_texts()]
  assert legend == ["Pre-LN", "Post-LN", "DyT", "still searching: bounds so far"]


def test_layer_removal_figure_shows_every_layer_counted_from_1_and_names_the_model(tmp_path):
  from lnjax.hf import analyze as hf_analyze

  result = {"architecture": "GPT2LMHeadModel", "workdir": "/models/gpt2", "step": "pretrained",
            "norm_position": "pre", "placement": "Pre-LN (norm_position=pre, LayerNorm)",
            "loss": 3.21, "text": "a.txt", "layer_removal": {"increase": [0.5, 0.1, 0.02]}}
  fig = hf_analyze._removal_plot(result, str(tmp_path))
  (ax,) = fig.axes
  assert " ".join(ax.get_title().split()) == (
      "GPT2LMHeadModel from /models/gpt2: Pre-LN, pretrained: layer removal")
  assert "nats/token" in ax.get_ylabel() and ax.get_xlabel() == "layer skipped (1 = next to the input)"
  assert list(ax.get_xticks()) == [1, 2, 3]  # Every layer, from 1 as in gradients.png.
  lo, hi = ax.get_xlim()
  for bar in ax.patches:  # Every bar whole inside the axes, the last one too.
    assert lo <= bar.get_x() and bar.get_x() + bar.get_width() <= hi
  assert [round(b.get_x() + b.get_width() / 2) for b in ax.patches] == [1, 2, 3]
  assert [" ".join(t.get_text().split()) for t in fig.texts] == [  # (wrapped)
      "GPT2LMHeadModel as Pre-LN (norm_position=pre, LayerNorm), 3 layers; loss 3.2100 "
      "nats/token on a.txt"]


def test_compare_shows_every_run_on_its_scale_with_a_setup_line_each(tmp_path):
  """A run a hundred times above the others and a run that diverged to NaN: each keeps a
  visible curve (a log axis spanning every finite value), the diverged one marked, and
  each run its own setup line."""
  runs = [_run(tmp_path / "pre", "lm", "pre", 0, [4.0, 3.0, 2.5], 3.34),
          _run(tmp_path / "post", "lm", "post", 0, [400.0, 300.0, 250.0], 3.34),
          _run(tmp_path / "nan", "lm", "peri", 0, [4.5, float("nan"), float("nan")], 3.34)]
  fig = compare.compare(runs, str(tmp_path / "cmp"))["figure"]
  train = fig.axes[0]
  assert train.get_yscale() == "log"
  lo, hi = train.get_ylim()
  for line in train.get_lines():
    if not line.get_label().startswith("unigram"):
      ys = [y for y in line.get_ydata() if y == y]
      assert ys and all(lo <= y <= hi for y in ys), line.get_label()
  labels = [l.get_label() for l in train.get_lines()]
  assert "Peri-LN, no warm-up (non-finite from step 20)" in labels
  caption = " ".join(" ".join(t.get_text().split()) for t in fig.texts)
  for name in ("pre", "post", "nan"):
    assert f"[{name}]: language model, 2 layers, d_model 64; 30 steps; 1 seed" in caption


def test_compare_dashes_a_run_whose_curve_another_hides(tmp_path):
  runs = [_run(tmp_path / "a", "lm", "pre", 0, [4.0, 3.0], 3.34),
          _run(tmp_path / "b", "lm", "post", 0, [4.0, 3.0], 3.34)]
  fig = compare.compare(runs, str(tmp_path / "cmp"))["figure"]
  styles = {l.get_label(): l.get_linestyle() for l in fig.axes[0].get_lines()}
  assert styles["Pre-LN, no warm-up"] == "-" and styles["Post-LN, warm-up 500"] == "--"