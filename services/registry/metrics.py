"""The pure rules of experiment tracking: which way a metric is better, how a batch of points
updates a metric's summary, how a long series is cut into buckets for downsampling, and how
non-finite floats travel in JSON.

Contract:
- ``metric_goal``: a metric is minimized or maximized. The job's labels decide first:
  ``trainyard.dev/minimize`` and ``trainyard.dev/maximize`` each list metric keys, comma
  separated. Otherwise a key with a word (split at anything but letters and digits) that is,
  or ends in, ``loss`` or ``error``, or is one of ``err``, ``nll``, ``perplexity``, ``ppl``,
  ``mse``, ``mae``, ``rmse``, ``wer``, ``cer``, ``latency``, ``regret``, is minimized; every
  other key is maximized (accuracy, reward, f1, ...).
- ``summarize``: count, first and last step (in report order), the last point (NaN
  included), min and max over the values that are not NaN (None if all were NaN), and the
  best value (min or max by the goal, not NaN) with its first step. ``merge`` of two
  summaries is the summary of both batches in order.
- Downsampling: a range of steps ``lo..hi`` is cut into about ``bucket_count(max_points)``
  buckets of equal width from an origin (``plan``); each bucket keeps its ``Extremes``: its
  first and last point (by step, then time), its min and its max (NaN aside; ties: the
  lowest, resp. highest step, then time) and its first NaN, duplicates removed (``pick``),
  so a curve of any length keeps every extreme, about ``max_points`` points. Where a bucket
  spans at least ``MIN_BLOCKS_PER_BUCKET`` blocks of ``BLOCK_STEPS`` steps, its width is a
  whole number of blocks and the origin a block's start, so that the extremes kept per block
  at ingest (``extremes``, ``merge_extremes``) answer it without reading its points.
  ``downsample`` is the rule over points in memory (the reference of the SQL, for tests).
- ``json_float``: NaN, +inf and -inf become the strings ``"NaN"``, ``"Infinity"``,
  ``"-Infinity"``; every other float stays a number.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Literal, NamedTuple

Goal = Literal["min", "max"]
JsonFloat = float | Literal["NaN", "Infinity", "-Infinity"]

MINIMIZE_LABEL = "trainyard.dev/minimize"
MAXIMIZE_LABEL = "trainyard.dev/maximize"
_LOWER_IS_BETTER = frozenset(
    {"err", "nll", "perplexity", "ppl", "mse", "mae", "rmse", "wer", "cer", "latency", "regret"}
)
_WORD = re.compile(r"[A-Za-z0-9]+")
POINTS_PER_BUCKET = 4
"""First, last, min and max (a bucket's first NaN is one more, where there is one)."""


def _listed(labels: Mapping[str, str], label: str) -> set[str]:
    return {k.strip() for k in labels.get(label, "").split(",") if k.strip()}


def metric_goal(key: str, labels: Mapping[str, str] | None = None) -> Goal:
    """Whether lower (``min``) or higher (``max``) values of ``key`` are better."""
    labels = labels or {}
    if key in _listed(labels, MINIMIZE_LABEL):
        return "min"
    if key in _listed(labels, MAXIMIZE_LABEL):
        return "max"
    for word in _WORD.findall(key.lower()):
        if word.endswith(("loss", "error")) or word in _LOWER_IS_BETTER:
            return "min"
    return "max"


class Point(NamedTuple):
    """One point of a series (a named tuple: ingest makes hundreds of thousands a second)."""

    step: int
    at: datetime
    value: float


@dataclass(frozen=True)
class Summary:
    """What a metric's points so far come to (see the module docstring)."""

    goal: Goal
    count: int
    first_step: int
    last_step: int
    last_time: datetime
    last_value: float
    min_value: float | None
    max_value: float | None
    best_value: float | None
    best_step: int | None


def _better(goal: Goal, new: float, old: float | None) -> bool:
    return old is None or (new < old if goal == "min" else new > old)


def summarize(points: Sequence[Point], goal: Goal) -> Summary:
    """The summary of ``points`` (in report order; at least one)."""
    if not points:
        raise ValueError("a summary needs at least one point")
    low: float | None = None
    high: float | None = None
    best: float | None = None
    best_step: int | None = None
    for p in points:
        v = p.value
        if v != v:  # NaN: kept in the series, never an extreme
            continue
        if low is None or v < low:
            low = v
        if high is None or v > high:
            high = v
        if _better(goal, v, best):
            best, best_step = v, p.step
    last = points[-1]
    return Summary(
        goal, len(points), points[0].step, last.step, last.at, last.value, low, high, best,
        best_step,
    )  # fmt: skip


def merge(old: Summary, new: Summary) -> Summary:
    """``old`` followed by ``new`` (the goal is ``old``'s)."""

    take_new = new.best_value is not None and _better(old.goal, new.best_value, old.best_value)
    return Summary(
        goal=old.goal,
        count=old.count + new.count,
        first_step=old.first_step,
        last_step=new.last_step,
        last_time=new.last_time,
        last_value=new.last_value,
        min_value=_either(min, old.min_value, new.min_value),
        max_value=_either(max, old.max_value, new.max_value),
        best_value=new.best_value if take_new else old.best_value,
        best_step=new.best_step if take_new else old.best_step,
    )


def _either(
    choose: Callable[[float, float], float], a: float | None, b: float | None
) -> float | None:
    return b if a is None else a if b is None else choose(a, b)


# --- downsampling ----------------------------------------------------------------------

BLOCK_STEPS = 64
"""Steps per block of precomputed extremes (``metric_blocks``)."""
MIN_BLOCKS_PER_BUCKET = 4


def bucket_count(max_points: int) -> int:
    """How many buckets give about ``max_points`` points (4 per bucket)."""
    if max_points < 1:
        raise ValueError("max_points must be at least 1")
    return max(1, max_points // POINTS_PER_BUCKET)


def bucket_width(lo: int, hi: int, buckets: int) -> int:
    """The width in steps of each of ``buckets`` buckets covering ``lo..hi`` (inclusive)."""
    if hi < lo:
        raise ValueError(f"an empty step range {lo}..{hi}")
    span = hi - lo + 1
    return max(1, -(-span // buckets))


def plan(lo: int, hi: int, max_points: int) -> tuple[int, int, bool]:
    """``(origin, width, by_blocks)``: bucket ``k`` holds the steps ``origin + k * width``
    up to the next; ``by_blocks`` when the buckets are whole blocks (module docstring)."""
    width = bucket_width(lo, hi, bucket_count(max_points))
    if width < MIN_BLOCKS_PER_BUCKET * BLOCK_STEPS:
        return lo, width, False
    width = -(-width // BLOCK_STEPS) * BLOCK_STEPS
    return lo - lo % BLOCK_STEPS, width, True


def block_of(step: int) -> int:
    return step // BLOCK_STEPS


def _order(p: Point) -> tuple[int, datetime]:
    return (p.step, p.at)


def _by_value(p: Point) -> tuple[float, int, datetime]:
    return (p.value, p.step, p.at)


@dataclass(frozen=True)
class Extremes:
    """The points a bucket (or block) keeps, and how many it holds."""

    first: Point
    last: Point
    low: Point | None
    high: Point | None
    nan: Point | None
    count: int

    def points(self) -> list[Point | None]:
        return [self.first, self.last, self.low, self.high, self.nan]


def extremes(points: Sequence[Point]) -> Extremes:
    """The extremes of ``points`` (at least one; any order). One pass: this runs for every
    block of every batch at ingest (the same as ``min``/``max`` by ``(step, at)`` and by
    ``(value, step, at)``, the first of exact ties kept)."""
    if not points:
        raise ValueError("extremes of no points")
    first = last = points[0]
    low: Point | None = None
    high: Point | None = None
    nan: Point | None = None
    for p in points:
        step, at, value = p
        if step < first.step or (step == first.step and at < first.at):
            first = p
        if step > last.step or (step == last.step and at > last.at):
            last = p
        if value != value:
            if nan is None or step < nan.step or (step == nan.step and at < nan.at):
                nan = p
            continue
        if (
            low is None
            or value < low.value
            or (value == low.value and (step < low.step or (step == low.step and at < low.at)))
        ):
            low = p
        if (
            high is None
            or value > high.value
            or (value == high.value and (step > high.step or (step == high.step and at > high.at)))
        ):
            high = p
    return Extremes(first, last, low, high, nan, len(points))


def merge_extremes(a: Extremes, b: Extremes) -> Extremes:
    """The extremes of both sets of points."""
    both = extremes([p for p in (*a.points(), *b.points()) if p is not None])
    return Extremes(both.first, both.last, both.low, both.high, both.nan, a.count + b.count)


def pick(candidates: Iterable[Point | None]) -> list[Point]:
    """The candidates of every bucket, without repeats, in step order."""
    seen: set[tuple[int, datetime, float | str]] = set()
    kept: list[Point] = []
    for p in candidates:
        if p is None:
            continue
        identity = (p.step, p.at, "NaN" if p.value != p.value else p.value)
        if identity not in seen:
            seen.add(identity)
            kept.append(p)
    kept.sort(key=_order)
    return kept


def downsample(points: Sequence[Point], max_points: int) -> list[Point]:
    """The rule of the module docstring over ``points`` in memory (the reference of
    ``metric_curves.curve``)."""
    if len(points) <= max_points:
        return sorted(points, key=_order)
    origin, width, _ = plan(min(p.step for p in points), max(p.step for p in points), max_points)
    buckets: dict[int, list[Point]] = {}
    for p in points:
        buckets.setdefault((p.step - origin) // width, []).append(p)
    return pick(q for members in buckets.values() for q in extremes(members).points())


# --- JSON ------------------------------------------------------------------------------


def json_float(value: float) -> JsonFloat:
    """``value`` as JSON can carry it (module docstring)."""
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "Infinity" if value > 0 else "-Infinity"
    return value


def json_float_or_none(value: float | None) -> JsonFloat | None:
    return None if value is None else json_float(value)
