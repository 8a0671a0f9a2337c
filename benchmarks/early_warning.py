"""Does lnjax's early warning (lnjax/core/health.py: EarlyWarning) see a divergence coming, and
earlier than the field's 6σ loss/grad-norm rule (OLMo-core's SkipStepOptimizer, levanter's
SkipStepConfig: a value > mean + 6σ of its trailing 128 steps)?

  python benchmarks/early_warning.py --out /tmp/ew            # the grid below (hours on 2 cores)
  python benchmarks/early_warning.py --quick --out /tmp/ew_q  # 3 short runs: a self-check
  python benchmarks/early_warning.py --out /tmp/ew --report_only  # score the finished runs
  python benchmarks/early_warning.py --out /tmp/ew --report_only --plot ew.png  # and draw them

Runs (each `lnjax.core.train.train_and_evaluate` in this process, every step logged, health=warn,
no recovery): the CPU-size LM (lnjax/configs/common.py's lm_config: D 128, 4 heads, F 512,
character-level tiny_shakespeare, sequences of 128), batch 16, --steps steps (400: the
failures below come within the first 100), as Post-LN without warm-up at 12 and
24 layers, at learning rates 3-10× the stable one, DeepNorm, Admin and Pre-LN at 3e-2 and
Pre-LN at 1e-1 (4 layers; Pre-LN at 3e-2 turned out to train), three seeds (expected to
diverge or collapse), and Pre-LN and Post-LN with warm-up (a quarter of the run) at their
stable rates (expected to train). Each run's result is kept in its folder (result.json):
a second launch with the same --out skips the runs already done and resumes the
interrupted one from its checkpoint. After the LM's seeds 0 and 1 come 4 runs of the
Multi30k model (configs/multi30k_de_en.py, 200 steps of 2048 target tokens): Post-LN
without warm-up at 1e-3 and 3e-3, Pre-LN at 1e-3, Post-LN warmed up (seed 0), then the
LM's seed 2, then the same 4 Multi30k runs with seed 1.

Definitions, made once here:
  failed    the run ended diverged (NaN/Inf, lnjax's exit 3), or its train loss went above
            the unigram baseline + 1 nat after having been below the baseline, or its final
            held-out loss is within 0.1 nat of the unigram baseline (collapsed);
  event     the step the run diverged by the definition above: its first non-finite loss,
            lnjax's exit-3 step, or its first loss above the baseline + 1 nat after having
            been below it (a blow-up); a failed run without such a step collapsed, and its
            event is the step its train loss settled at the baseline: the first step where
            the mean loss of the last 10 steps is within 0.1 nat of it and from which that
            mean never again falls more than 0.1 nat below it (its last step if none).
            (Until 2026-12-02 a blow-up was any loss 1 nat above the lowest so far, which
            made Adam's first-step transients, e.g. 4.9 -> 6.9 -> 4.7 nats at steps 1-3, the
            event of runs that then collapsed: see BENCHMARKS.md);
  warned    a rule fired at some step before the event (on a failed run) or at all;
  lead      event step − first firing step, on failed warned runs;
  precision warned failed runs / warned runs; recall: warned failed runs / failed runs;
  false warnings per 1000 steps: firings on runs that trained, per 1000 of their steps.
Rules, each replayed on the runs' logged statistics (every step is logged): lnjax's two
(health.EarlyWarning: a layer's update RMS per unit of learning rate or attention/output
logit ≥ 6× its 100-step median, after 100 steps; health.VanishingGradient: layer 0's
gradient RMS below 1e-3 × the largest layer's for 3 steps), either of them (what
train.health=warn prints), and the 6σ rule on the loss and gradient norm.
Prints and writes (`--out`) a Markdown table per rule and results.json.
"""

import os
import sys

import bench_env  # noqa: F401  (first: lnjax on the path, malloc tuned before JAX)

import argparse  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import time  # noqa: E402

import jax  # noqa: E402

import numpy as np  # noqa: E402

from lnjax.configs import common as config_lib  # noqa: E402
from lnjax.configs import multi30k_de_en  # noqa: E402
from lnjax import tasks  # noqa: E402
from lnjax.core import health, metrics, preemption, train  # noqa: E402


MT_STEPS = 200  # The Multi30k runs' length (the suite's 4096-token step takes 2.4 s on 2 cores).


def grid(quick: bool, steps: int = 400) -> list[dict]:
  """The runs: {name, overrides, preset}."""
  if quick:
    base = {"train.num_steps": 80}
    return [
        {"name": "post_sgd_lr3", "preset": "smoke", "set": {**base, "model.norm_position": "post",
                                                            "opt.name": "sgd", "opt.learning_rate": 3.0}},
        {"name": "pre_1e-3", "preset": "smoke", "set": {**base, "opt.learning_rate": 1e-3}},
        {"name": "post_warm", "preset": "smoke", "set": {**base, "model.norm_position": "post",
                                                         "opt.warmup_steps": 40}},
    ]
  lm = []
  base = {"train.num_steps": steps, "data.batch_size": 16}
  warm = steps // 4
  for seed in (0, 1, 2):
    for depth in (12, 24):
      for lr in (3e-3, 1e-2):
        lm.append({"name": f"post_L{depth}_lr{lr}_s{seed}", "preset": "", "set": {
            **base, "model.norm_position": "post", "model.num_layers": depth, "opt.learning_rate": lr,
            "opt.warmup_steps": 0, "seed": seed}})
    for pos, lr in (("deepnorm", "3e-2"), ("admin", "3e-2"), ("pre", "3e-2"), ("pre", "1e-1")):
      lm.append({"name": f"{pos}_lr{lr}_s{seed}", "preset": "", "set": {
          **base, "model.norm_position": pos, "opt.learning_rate": float(lr), "seed": seed}})
    for pos, w in (("pre", 0), ("post", warm)):
      for lr in (5e-4, 1e-3):
        lm.append({"name": f"{pos}_warm{w}_lr{lr}_s{seed}", "preset": "", "set": {
            **base, "model.norm_position": pos, "opt.learning_rate": lr, "opt.warmup_steps": w,
            "seed": seed}})
  # The Multi30k model (configs/multi30k_de_en.py: 3+3 layers, D 256), batches of 2048
  # target tokens, a constant rate, held-out loss at the end (no BLEU while training):
  # Post-LN without warm-up at 3e-3 (expected to fail) and 1e-3, Pre-LN at 1e-3 and
  # Post-LN warmed up for a quarter of the run (expected to train), two seeds each.
  mt_runs = []
  mt = {"train.num_steps": MT_STEPS, "train.eval_every_steps": MT_STEPS,
        "train.checkpoint_every_steps": MT_STEPS // 4, "data.max_tokens": 2048,
        "opt.schedule": "constant", "decode.bleu_in_training": False}
  for seed in (0, 1):
    for norm, lr, w in (("post", 3e-3, 0), ("post", 1e-3, 0), ("pre", 1e-3, 0),
                        ("post", 1e-3, MT_STEPS // 4)):
      mt_runs.append({"name": f"mt_{norm}_warm{w}_lr{lr}_s{seed}", "preset": "", "config": "mt",
                   "set": {**mt, "model.norm_position": norm, "opt.learning_rate": lr,
                           "opt.warmup_steps": w, "seed": seed}})
  # 36 LM runs (24 pushed past their limits, 12 stable) and 8 Multi30k runs: seeds 0 and 1
  # of the LM, Multi30k's seed 0, the LM's seed 2, then Multi30k's seed 1 (both models
  # covered early, and the LM's short runs before the long Multi30k ones).
  return lm[:24] + mt_runs[:4] + lm[24:] + mt_runs[4:]


def make_config(spec: dict):
  """The run's config: the LM's (or Multi30k's) with the spec's settings, every step logged."""
  if spec.get("config") == "mt":
    c = multi30k_de_en.get_config(f"norm={spec['set']['model.norm_position']}").unlock()
  else:
    c = config_lib.lm_config()
  if spec["preset"] == "smoke":
    config_lib.apply_smoke(c)
  c.mesh.data = 1
  settings = {"train.log_every_steps": 1, "train.health": "warn", "train.tensorboard": False,
              **spec["set"]}
  for key, value in settings.items():
    if key == "seed":
      c.seed = value
    else:
      section, name = key.split(".")
      c[section][name] = value
  return c


def run_one(spec: dict, out: str) -> dict:
  """Trains the run (or resumes it) and returns its curves; kept in its folder's result.json."""
  wd = os.path.join(out, spec["name"])
  done = os.path.join(wd, "result.json")
  if os.path.exists(done):
    with open(done) as f:
      result = json.load(f)
    return {**result, **replay_rules(metrics.read_metrics(wd), SENSITIVITY)}
  summary = train.train_and_evaluate(make_config(spec), wd, tasks=tasks.get)
  jax.clear_caches()  # (44 models in one process: keep one's executables at a time.)
  records = metrics.read_metrics(wd)
  per_step = {r["step"]: r for r in records if "train_loss" in r}
  steps = sorted(per_step)
  loss = [per_step[s]["train_loss"] for s in steps]
  grad = [per_step[s]["grad_norm"] for s in steps]
  warnings = sorted({r["step"] for r in records if any(k.startswith("warning/") for k in r)})
  result = {"name": spec["name"], "status": summary["status"], "steps": steps,
          "loss": [x if x is not None else math.nan for x in loss],
          "grad_norm": [x if x is not None else math.nan for x in grad],
          "unigram": summary.get("unigram_baseline"), "eval_loss": summary.get("eval_loss"),
          "diverged_at": summary["step"] if summary["status"] == "diverged" else None,
          "warnings": warnings}
  if summary["status"] in ("completed", "diverged"):  # (Not a preempted run's.)
    with open(done, "w") as f:
      json.dump(result, f)
  return {**result, **replay_rules(records, SENSITIVITY)}


def replay_rules(records: list[dict], spike_settings=()) -> dict:
  """The steps at which each of lnjax's rules fires, replayed on the run's logged health
  statistics (every step is logged): the same decisions the Health hook takes during a
  run, for the rules of the current code, whatever code the run was trained with.
  `records`: the run's metrics.jsonl. Also "first_layer_ratio": [(step, layer 0's gradient
  RMS / the largest layer's)], the vanishing-gradient rule's input (the smallest over the
  stacks). With `spike_settings` ((factor, min_history) pairs),
  also "sensitivity": {setting: steps where the spike rule so set or the vanishing-gradient
  rule fires}, in the same pass."""
  lr = {r["step"]: r["learning_rate"] for r in records if "learning_rate" in r}
  stats = {r["step"]: r for r in records if any(k.startswith("health/") for k in r)}
  spike, depth = health.EarlyWarning(), health.VanishingGradient()
  variants = {setting: health.EarlyWarning(factor=setting[0], min_history=setting[1])
              for setting in spike_settings}
  fired = {"spike_warnings": [], "depth_warnings": [], "first_layer_ratio": []}
  by_setting = {setting: [] for setting in variants}
  for step in sorted(stats):
    values = {k: v for k, v in stats[step].items() if k.startswith("health/") and v is not None}
    ratios = [ratio for ratio, _ in depth.first_layer_ratios(values).values()]
    if ratios:
      fired["first_layer_ratio"].append((step, min(ratios)))
    if spike(step, values, lr.get(step, 0.0)):
      fired["spike_warnings"].append(step)
    vanishing = bool(depth(step, values))
    if vanishing:
      fired["depth_warnings"].append(step)
    for setting, rule in variants.items():
      if rule(step, values, lr.get(step, 0.0)) or vanishing:
        by_setting[setting].append(step)
  return {**fired, "sensitivity": by_setting} if spike_settings else fired


def outcome(r: dict) -> tuple[bool, int, bool]:
  """(failed, event step, blew up) by the module's definitions; a failed run that did not
  blow up collapsed."""
  u, steps, loss = r["unigram"], r["steps"], r["loss"]
  below = False
  event = None
  for s, x in zip(steps, loss):
    if not math.isfinite(x) or (below and x > u + 1.0):
      event = s
      break
    below = below or (u is not None and x < u)
  if r["diverged_at"] is not None:
    event = min(event or r["diverged_at"], r["diverged_at"])
  collapsed = u is not None and r["eval_loss"] is not None and r["eval_loss"] >= u - 0.1
  blew_up = event is not None or r["status"] == "diverged"
  failed = blew_up or collapsed or r["eval_loss"] is None
  if failed and not blew_up and u is not None:
    event = settled_at_baseline(steps, loss, u)
  return failed, event or (steps[-1] if steps else 0), blew_up


def settled_at_baseline(steps: list[int], loss: list[float], unigram: float,
                        window: int = 10) -> int | None:
  """The first step where the mean loss of the last `window` steps is within 0.1 nat of the
  unigram baseline and from which that mean never again falls more than 0.1 nat below it:
  where a collapsed run stopped learning (the mean: one batch's loss is ±0.05 nat noise)."""
  onset = None
  for i, s in enumerate(steps):
    x = float(np.mean(loss[max(0, i + 1 - window):i + 1]))
    if not x >= unigram - 0.1:
      onset = None
    elif onset is None and x <= unigram + 0.1:
      onset = s
  return onset


def sigma_firings(r: dict) -> list[int]:
  rule = health.SigmaRule()
  return [s for s, x, g in zip(r["steps"], r["loss"], r["grad_norm"]) if rule(loss=x, grad_norm=g)]


def score(results: list[dict], firings_of) -> dict:
  warned_failed = warned = failed_n = false = train_steps = 0
  leads = {True: [], False: []}  # Blow-ups, collapses.
  kinds = {True: [0, 0], False: [0, 0]}  # Kind -> [warned, failed runs].
  for r in results:
    failed, event, blew_up = outcome(r)
    firings = firings_of(r)
    failed_n += failed
    if failed:
      kinds[blew_up][1] += 1
      before = [s for s in firings if s < event]
      if before:
        warned_failed += 1
        warned += 1
        kinds[blew_up][0] += 1
        leads[blew_up].append(event - before[0])
    else:
      warned += bool(firings)
      false += len(firings)
      train_steps += len(r["steps"])
  median = lambda xs: float(np.median(xs)) if xs else None
  return {"precision": warned_failed / warned if warned else None,
          "recall": warned_failed / failed_n if failed_n else None,
          "median_lead_steps": median(leads[True] + leads[False]),
          "blow_ups_warned": kinds[True], "collapses_warned": kinds[False],
          "median_lead_blow_ups": median(leads[True]),
          "false_per_1000_steps": 1000 * false / train_steps if train_steps else None,
          "failed_runs": failed_n, "trained_runs": len(results) - failed_n}


def _fmt(v, spec: str) -> str:
  return "n/a" if v is None else format(v, spec)


RULES = {"lnjax, spikes (health.EarlyWarning)": lambda r: r["spike_warnings"],
         "lnjax, vanishing gradient (health.VanishingGradient)": lambda r: r["depth_warnings"],
         "lnjax, either (train.health=warn)": lambda r: sorted(set(r["spike_warnings"])
                                                               | set(r["depth_warnings"])),
         "6σ loss/grad-norm rule": sigma_firings}


# The spike rule's factor and minimum history swept on the same runs, with the vanishing-
# gradient rule beside it (train.health=warn's pair). Scored twice: on the runs that came first
# (the LM's seeds 0 and 1, Multi30k's seed 0), which the settings were first read from, and
# on the runs after them (the LM's seed 2, Multi30k's seed 1), which did not exist then.
SENSITIVITY = [(factor, history) for factor in (3.0, 4.0, 6.0) for history in (20, 100)]


def held_out(name: str) -> bool:
  """A run of the held-out part of the grid: the LM's seed 2 or Multi30k's seed 1."""
  return name.endswith("_s2") or (name.startswith("mt_") and name.endswith("_s1"))


def sensitivity(results: list[dict]) -> str:
  """A Markdown table: the either-rule's scores for each SENSITIVITY setting (replayed by
  run_one), on the first runs and on the held-out ones."""
  parts = [[r for r in results if not held_out(r["name"])],
           [r for r in results if held_out(r["name"])]]
  lines = [f"| spike rule: factor × median | after steps of history | first {len(parts[0])} runs: "
           "precision / recall / median lead / false per 1000 steps | "
           f"held-out {len(parts[1])} runs: the same |", "|---:|---:|---|---|"]
  for factor, history in SENSITIVITY:
    cells = []
    for part in parts:
      s = score(part, lambda r: r["sensitivity"][(factor, history)])
      cells.append(f"{_fmt(s['precision'], '.2f')} / {_fmt(s['recall'], '.2f')} / "
                   f"{_fmt(s['median_lead_steps'], '.0f')} / {_fmt(s['false_per_1000_steps'], '.2f')}")
    lines.append(f"| {factor:g} | {history} | {cells[0]} | {cells[1]} |")
  return "\n".join(lines)


def lead_comparison(results: list[dict]) -> str:
  """train.health=warn's lead against the 6σ rule's two fairer ways than their medians over
  different runs: on the failures both warned of, and over every failure with a missed
  one counted as 0 steps of lead."""
  either, paired, all_leads = RULES["lnjax, either (train.health=warn)"], [], ([], [])
  for r in results:
    failed, event, _ = outcome(r)
    if not failed:
      continue
    leads = [event - before[0] if before else 0 for before in (
        [s for s in firings if s < event] for firings in (either(r), sigma_firings(r)))]
    for i, lead in enumerate(leads):
      all_leads[i].append(lead)
    if all(leads):
      paired.append(leads)
  median = lambda xs: _fmt(float(np.median(xs)) if xs else None, ".0f")
  both = (f"on the {len(paired)} failure(s) both warned of, median lead "
          f"{median([a for a, _ in paired])} against {median([b for _, b in paired])} steps"
          if paired else "no failure that both warned of")
  return (f"train.health=warn against the 6σ rule: {both}; over all "
          f"{len(all_leads[0])} failures, a missed one counted as 0, median lead "
          f"{median(all_leads[0])} against {median(all_leads[1])} steps.")


def report(results: list[dict], planned: int) -> tuple[str, dict]:
  """The Markdown report (a table per rule, then one row per run) and the scores."""
  scores = {name: score(results, f) for name, f in RULES.items()}
  lines = [f"{len(results)} of the grid's {planned} runs.", "",
           "| rule | precision | recall | warned blow-ups | warned collapses | median lead "
           "(steps) | on blow-ups | false warnings / 1000 steps | failed / trained runs |",
           "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
  for name, s in scores.items():
    lines.append(f"| {name} | {_fmt(s['precision'], '.2f')} | {_fmt(s['recall'], '.2f')} | "
                 f"{'/'.join(map(str, s['blow_ups_warned']))} | "
                 f"{'/'.join(map(str, s['collapses_warned']))} | "
                 f"{_fmt(s['median_lead_steps'], '.0f')} | {_fmt(s['median_lead_blow_ups'], '.0f')} | "
                 f"{_fmt(s['false_per_1000_steps'], '.2f')} | {s['failed_runs']} / {s['trained_runs']} |")
  lines += ["", lead_comparison(results), ""]
  lines += ["| run | outcome | event step | held-out loss − unigram (nats) | first firing: "
            "spikes | vanishing gradient | 6σ |", "|---|---|---:|---:|---:|---:|---:|"]
  for r in results:
    failed, event, blew_up = outcome(r)
    kind = ("blew up" if blew_up else "collapsed") if failed else "trained"
    gap = (_fmt(r["eval_loss"] - r["unigram"], "+.3f")
           if r["eval_loss"] is not None and r["unigram"] is not None else "n/a")
    first = [str(f[0]) if f else "–" for f in (r["spike_warnings"], r["depth_warnings"],
                                                sigma_firings(r))]
    lines.append(f"| {r['name']} | {kind} | {event if failed else '–'} | {gap} | "
                 f"{' | '.join(first)} |")
  return "\n".join(lines), scores


def plot(results: list[dict], path: str) -> None:
  """The LM runs over their first 60 steps: above, the vanishing-gradient rule's input
  (layer 0's gradient RMS / the largest layer's) with its threshold; below, the train loss
  against the unigram baseline (10-step mean), each failed run's event marked."""
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  from matplotlib.lines import Line2D

  from lnjax.analysis import plotting

  fig, (top, bottom) = plt.subplots(2, 1, figsize=(8, 6.5), sharex=True)
  colors = {"collapsed": "tab:red", "blew up": "tab:orange", "trained": "tab:blue"}
  shown = {kind: 0 for kind in colors}
  for r in results:
    if r["name"].startswith("mt_") or r["unigram"] is None:
      continue
    failed, event, blew_up = outcome(r)
    kind = ("blew up" if blew_up else "collapsed") if failed else "trained"
    shown[kind] += 1
    ratio = [(s, x) for s, x in r["first_layer_ratio"] if s <= 60 and x > 0]
    if ratio:
      top.plot(*zip(*ratio), color=colors[kind], lw=0.9, alpha=0.6)
    steps = [s for s in r["steps"] if s <= 60]
    mean = [float(np.mean(r["loss"][max(0, i - 9):i + 1])) - r["unigram"]
            for i in range(len(steps))]
    bottom.plot(steps, mean, color=colors[kind], lw=0.9, alpha=0.6)
    if failed and event <= 60:
      bottom.plot([event], [mean[steps.index(event)] if event in steps else 0.0], "o",
                  color=colors[kind], ms=4)
  top.axhline(health.VanishingGradient().ratio, color="black", ls="--", lw=0.8)
  top.set_yscale("log")
  plotting.plain_log_ticks(top)
  top.set_ylabel("layer 0's gradient RMS /\nthe largest layer's (log scale)")
  bottom.legend(handles=[Line2D([], [], color=c, label=f"{k} ({shown[k]} runs)")
                      for k, c in colors.items() if shown[k]]
             + [Line2D([], [], color="black", ls="--", lw=0.8,
                       label="vanishing-gradient threshold (3 steps below: a warning)")],
             fontsize=8, loc="upper right")
  bottom.axhline(0.0, color="black", lw=0.8)
  bottom.set_ylabel("train loss − unigram baseline\n(nats, mean of 10 steps)")
  bottom.set_xlabel("training step (dots: where a failed run's loss settled at the baseline)")
  for ax in (top, bottom):
    ax.grid(alpha=0.3)
  top.set_title("The CPU-size LM runs of benchmarks/early_warning.py, first 60 steps",
                fontsize=10)
  fig.tight_layout()
  plotting.add_caption(fig, "tiny_shakespeare characters, batch 16×128, Adam, constant lr, "
                       "every run of the grid's LM part")
  plotting.save(fig, path, dpi=120)


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--out", required=True)
  p.add_argument("--quick", action="store_true")
  p.add_argument("--steps", type=int, default=400, help="steps per run of the full grid")
  p.add_argument("--plot", default="", help="also draw the LM runs' figure to this PNG")
  p.add_argument("--report_only", action="store_true",
                 help="score the runs already finished in --out, train nothing")
  args = p.parse_args(argv)
  os.makedirs(args.out, exist_ok=True)
  specs = grid(args.quick, args.steps)
  results = []
  for i, spec in enumerate(specs):
    if args.report_only and not os.path.exists(os.path.join(args.out, spec["name"], "result.json")):
      continue
    t0 = time.perf_counter()
    try:
      results.append(run_one(spec, args.out))
    except preemption.Preempted:  # Stopped before its loop began (compiling, initializing).
      print(f"early_warning: run {i + 1}/{len(specs)} {spec['name']}: stopped before its first "
            "step; the same command resumes the grid", flush=True)
      return 128 + 15
    print(f"early_warning: run {i + 1}/{len(specs)} {spec['name']}: {results[-1]['status']}, "
          f"{len(results[-1]['warnings'])} warning steps ({time.perf_counter() - t0:.0f} s)",
          flush=True)
    if results[-1]["status"] == "preempted":  # Stopped (SIGTERM): the same command resumes.
      return 128 + 15
  table, scores = report(results, len(specs))
  if not args.quick:
    table += ("\n\nlnjax's two rules together (train.health=warn) with other settings of the "
              "spike rule, replayed on the same runs: the first runs (read when choosing) and the "
              "held-out ones (the LM's seed 2, Multi30k's seed 1):\n\n" + sensitivity(results))
  print(table)
  if args.plot:
    plot(results, args.plot)
  with open(os.path.join(args.out, "early_warning.md"), "w") as f:
    f.write(table + "\n")
  with open(os.path.join(args.out, "results.json"), "w") as f:
    json.dump({"scores": scores, "runs": [{k: r[k] for k in ("name", "status", "warnings", "spike_warnings", "depth_warnings",
                                                              "eval_loss", "unigram")}
                                          for r in results]}, f, indent=1)
  if args.quick:  # The self-check: every run scored, the numbers defined.
    ok = len(results) == 3 and all(s["failed_runs"] + s["trained_runs"] == 3
                                   for s in scores.values())
    return 0 if ok else 1
  return 0


if __name__ == "__main__":
  sys.exit(main())
