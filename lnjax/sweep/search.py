r"""The search for the highest stable learning rate (python -m lnjax.cli.stability), as pure
functions of what the runs reported: what "stable" means, the bracket a learning-rate
range test gives, and the bisection in log-space. No JAX, no processes.

A cell (placement, depth, warm-up) is searched in three steps:
  1. A range test (Smith, arXiv:1506.01186; fastai's and Lightning's lr_find): one run whose
     rate grows geometrically every step, from `lr_min` to `lr_max`. Its smoothed training
     loss falls, stops improving, then blows up; the rate where it stops improving is the
     bracket's low end, the rate where it blows up its high end. One range test serves
     every warm-up of a (placement, depth): the ramp is its own warm-up.
  2. Bisection in log-space: a probe is `seeds` short runs at one peak rate (the cell's
     warm-up, then constant); the next probe is the geometric mean of the bracket's ends,
     until they are within a factor `tolerance`.
  3. The ends the bisection never tested are probed last: a low end found unstable is said
     so and widened (÷ `widen`, then bisected again), down to the range test's first rate
     `lr_min` (the `floor`), where a low end still unstable ends the cell with no stable
     rate; a high end found stable is widened once (× `widen`).

The state of a cell is its bracket and the results of its probes: `replay` derives the
next probe from them, so a search killed at any point continues where it was and never
runs a probe whose result is recorded.
"""

import dataclasses
import math
import re
from typing import NamedTuple

from lnjax.analysis import plotting

FOUND, BELOW, ABOVE = "found", "below", "above"  # How a cell's search ended.
# Legend labels of the placements (models.NORM_POSITIONS): lnjax.analysis.plotting's, one table.
LABELS = plotting.PLACEMENT_LABELS
SIGNIFICANT_DIGITS = 3  # Probe rates are rounded to these: stable run names and state keys.


class Verdict(NamedTuple):
  """One run judged by `Stable.judge`."""
  stable: bool | None  # None: the run has not finished.
  why: str  # In a sentence, printed with the probe.
  fails_by: str | None = None  # An unstable run's failure in a few words: "diverged at step
  # 5", "held-out +0.009 nats vs unigram" (above the baseline: a stall).


@dataclasses.dataclass(frozen=True)
class Stable:
  """The one definition of a stable run, printed with every result."""
  steps: int  # The run finishes its warm-up and this many steps at its peak rate ...
  divergence_factor: float  # ... never diverges (lnjax's rule: NaN/Inf, or loss > this × ln V) ...
  margin_nats: float  # ... and its final held-out loss is this far below the unigram baseline.
  recovery: str = "none"  # The probes' train.on_instability (stability.Search sets it from the
  # config): "none" measures the model alone; with skip or rollback, what a run recovered from
  # counts as stable, and the text says so.

  def describe(self, seeds: int) -> str:
    text = (f"stable: in each of {seeds} seed(s), the run finishes its warm-up and "
            f"{self.steps} steps after it, never diverges (lnjax's rule, exit 3: a NaN/Inf "
            f"training loss or one above {self.divergence_factor:g} × ln V), and ends with a "
            f"held-out loss at least {self.margin_nats:g} nats below the unigram baseline")
    if self.recovery != "none":
      text += (f"; the probes recover (train.on_instability={self.recovery}): a run that "
               "recovered and then met these counts as stable (the range tests do not recover)")
    return text

  def judge(self, summary: dict, warmup: int = 0) -> Verdict:
    """The summary.json of a run with `warmup` warm-up steps, judged (stable None while it
    has not finished)."""
    status = summary.get("status")
    if status == "diverged":
      why = f"diverged at step {summary.get('step')}"
      return Verdict(False, why, why)
    if status != "completed" or summary.get("num_steps") != warmup + self.steps:
      return Verdict(None, f"not finished ({status or 'no summary'})")
    loss, baseline = summary.get("eval_loss"), summary.get("unigram_baseline")
    if loss is None or baseline is None or not math.isfinite(loss):
      return Verdict(False, f"no finite held-out loss against a unigram baseline ({loss}, "
                     f"{baseline})", "no finite held-out loss")
    below = baseline - loss
    if below < self.margin_nats:
      where = (f"{below:.3f} nats below" if below >= 0 else f"{-below:.3f} nats above")
      return Verdict(False, f"held-out loss {loss:.3f} is {where} the unigram baseline "
                     f"{baseline:.3f}, not {self.margin_nats:g} below",
                     f"held-out {-below:+.3f} nats vs unigram")  # +: above it, a stall.
    actions = len(summary.get("instability_actions") or [])
    return Verdict(True, f"held-out loss {loss:.3f}, {below:.3f} nats below the unigram "
                   f"baseline" + (f", after {actions} recovery action(s)" if actions else ""))


def fails_by(verdicts: list[Verdict]) -> str | None:
  """An unstable probe's failure from its seeds' verdicts: the first divergence, else the
  first seed's that failed otherwise."""
  failed = [v.fails_by for v in verdicts if v.stable is False]
  return next((f for f in failed if f.startswith("diverged")), failed[0] if failed else None)


def how_it_failed(reasons: list[str]) -> str | None:
  """`fails_by` read back from the seeds' reasons (`Verdict.why`), for probes recorded before
  probes stored it."""
  diverged = [r for r in reasons if r.startswith("diverged")]
  if diverged:
    return diverged[0]
  for r in reasons:
    if m := re.match(r"held-out loss \S+ is (\S+) nats (below|above)", r):
      return f"held-out {'-' if m[2] == 'below' else '+'}{m[1]} nats vs unigram"
  return next((r for r in reasons if not r.startswith(("not run", "not finished"))), None)


def probe_result(judgements: list[bool | None]) -> bool | None:
  """A probe is stable when every seed is; unstable when one is not; None while a seed has
  not finished (and no other already failed)."""
  if any(j is False for j in judgements):
    return False
  if any(j is None for j in judgements):
    return None
  return True


def rounded(lr: float) -> float:
  return float(f"{lr:.{SIGNIFICANT_DIGITS}g}")


# ---------------------------------------------------------------------------------------
# The range test's bracket.


@dataclasses.dataclass(frozen=True)
class Bracket:
  lo: float  # Where the range test's loss stopped improving (assumed stable until probed).
  hi: float  # Where it blew up (assumed unstable until probed).
  note: str = ""


def range_test_growth(lr_min: float, lr_max: float, steps: int) -> float:
  """γ with lr_min · γ^(steps - 1) = lr_max (optim's `exponential` schedule)."""
  return (lr_max / lr_min) ** (1 / max(steps - 1, 1))


SMOOTHING = 0.9  # The range test's loss: an exponential moving average (fastai's, debiased).
MIN_SPAN = 2.0  # The bracket spans at least this factor.


def bracket(records: list[dict], lr_max: float, diverged: bool) -> Bracket:
  """The bracket of a range test from its metrics (one record per step: train_loss,
  learning_rate). Low end: the rate at the smoothed loss's minimum, where it stops
  improving; high end: the first rate after it where the smoothed loss has climbed back
  half-way to its initial value, or the loss is not finite, or the run diverged."""
  points = [(r["learning_rate"], r["train_loss"]) for r in records
            if r.get("train_loss") is not None and r.get("learning_rate") is not None]
  if not points:
    raise ValueError("the range test logged no training loss")
  smoothed, average = [], 0.0
  for i, (lr, loss) in enumerate(points):
    if not math.isfinite(loss):
      break
    average = SMOOTHING * average + (1 - SMOOTHING) * loss
    smoothed.append((lr, average / (1 - SMOOTHING ** (i + 1))))
  if not smoothed:
    return Bracket(points[0][0] / MIN_SPAN, points[0][0], "the first step was not finite")
  best = min(range(len(smoothed)), key=lambda i: smoothed[i][1])
  lo, floor = smoothed[best]
  ceiling = floor + 0.5 * (smoothed[0][1] - floor)
  hi, note = None, ""
  for lr, loss in smoothed[best + 1:]:
    if loss > ceiling:
      hi, note = lr, "the loss climbed half-way back to its initial value"
      break
  if hi is None and (diverged or len(smoothed) < len(points)):
    hi, note = points[min(len(smoothed), len(points) - 1)][0], "the run diverged"
  if hi is None:
    hi, note = lr_max, f"the loss never blew up up to lr_max={lr_max:g}"
  lo = min(lo, hi / MIN_SPAN)
  return Bracket(rounded(lo), rounded(hi), note)


# ---------------------------------------------------------------------------------------
# The bisection, replayed from the recorded probes.


@dataclasses.dataclass(frozen=True)
class Outcome:
  next_lr: float | None  # The probe to run next; None once the cell is done.
  lower: float | None  # The highest rate found stable (the answer); None: none found.
  upper: float | None  # The lowest rate found unstable above it; None: none found.
  status: str | None  # None while searching; FOUND, BELOW (low end unstable after
  # widening: no stable rate found) or ABOVE (stable at the widened high end).
  probes: tuple[float, ...]  # The rates asked for, in order (the last maybe unrecorded).
  events: tuple[str, ...]  # What the search said on the way (widenings).


def predicted_probes(lo: float, hi: float, tolerance: float) -> int:
  """Bisection steps from [lo, hi] until the ends are within `tolerance` (each halves the
  bracket's log-width): ⌈log₂(ln(hi/lo) / ln tolerance)⌉."""
  ratio = math.log(hi / lo) / math.log(tolerance)
  return max(0, math.ceil(math.log2(ratio) - 1e-9)) if ratio > 1 else 0


def replay(start: Bracket, results: dict[float, bool], tolerance: float, widen: float, *,
           floor: float) -> Outcome:
  """The search of one cell from its bracket and its recorded probe results (rate ->
  stable): the next probe to run, or the answer. An unstable low end is widened down to
  `floor` and no further."""
  probes, events = [], []
  lo, hi = rounded(start.lo), rounded(start.hi)
  lo_tested = hi_tested = widened_hi = False

  def outcome(next_lr=None, status=None, lower=None, upper=None):
    return Outcome(next_lr, lower, upper, status, tuple(probes), tuple(events))

  while True:
    mid = rounded(math.sqrt(lo * hi))
    if hi / lo > tolerance and lo < mid < hi:
      probes.append(mid)
      if mid not in results:
        return outcome(next_lr=mid)
      if results[mid]:
        lo, lo_tested = mid, True
      else:
        hi, hi_tested = mid, True
    elif not lo_tested:
      probes.append(lo)
      if lo not in results:
        return outcome(next_lr=lo)
      if results[lo]:
        lo_tested = True
      elif (widened := rounded(max(lo / widen, floor))) >= lo:  # At the floor already.
        return outcome(status=BELOW, upper=lo)
      else:
        events.append(f"the bracket's low end {lo:g} is unstable: widened to {widened:g}")
        lo, hi, hi_tested = widened, lo, True
    elif not hi_tested:
      probes.append(hi)
      if hi not in results:
        return outcome(next_lr=hi)
      if not results[hi]:
        hi_tested = True
      elif widened_hi:
        return outcome(status=ABOVE, lower=hi)
      else:
        events.append(f"the bracket's high end {hi:g} is stable: widened once, to "
                      f"{rounded(hi * widen):g}")
        lo, hi, lo_tested, widened_hi = hi, rounded(hi * widen), True, True
    else:
      return outcome(status=FOUND, lower=lo, upper=hi)
