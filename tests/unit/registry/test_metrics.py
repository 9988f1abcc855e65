"""Tracking's pure rules: which way a metric is better, summaries and their merge,
downsampling that keeps every extreme, and non-finite floats in JSON."""

from __future__ import annotations

import math
import random
from datetime import UTC, datetime, timedelta

import pytest

from trainyard_platform.services.registry import metrics
from trainyard_platform.services.registry.metrics import (
    Point,
    bucket_count,
    bucket_width,
    downsample,
    metric_goal,
)

T0 = datetime(2026, 1, 1, tzinfo=UTC)
NAN, INF = float("nan"), float("inf")


def pts(values: list[float], first_step: int = 0) -> list[Point]:
    return [Point(first_step + i, T0 + timedelta(seconds=i), v) for i, v in enumerate(values)]


@pytest.mark.parametrize(
    ("key", "goal"),
    [
        ("loss", "min"),
        ("train/loss", "min"),
        ("val_loss", "min"),
        ("valloss", "min"),
        ("eval.error", "min"),
        ("top1_error", "min"),
        ("perplexity", "min"),
        ("rmse", "min"),
        ("accuracy", "max"),
        ("val/acc", "max"),
        ("reward", "max"),
        ("f1", "max"),
        ("lossless_ratio", "max"),  # a word that merely starts with loss
        ("power", "max"),  # contains "wer" but is not the word
    ],
)
def test_goal_by_name(key: str, goal: str) -> None:
    assert metric_goal(key) == goal


def test_labels_override_the_name_rule() -> None:
    labels = {"trainyard.dev/maximize": "neg_loss, x", "trainyard.dev/minimize": "score"}
    assert metric_goal("neg_loss", labels) == "max"
    assert metric_goal("score", labels) == "min"
    assert metric_goal("x", labels) == "max"
    assert metric_goal("loss", labels) == "min"


def test_summary_keeps_nan_last_but_never_as_an_extreme() -> None:
    s = metrics.summarize(pts([3.0, NAN, 1.0, -INF, 2.0, NAN]), "min")
    assert s.count == 6
    assert (s.first_step, s.last_step) == (0, 5)
    assert math.isnan(s.last_value)
    assert s.min_value == -INF
    assert s.max_value == 3.0
    assert (s.best_value, s.best_step) == (-INF, 3)


def test_best_follows_the_goal_and_keeps_the_first_step_of_a_tie() -> None:
    s = metrics.summarize(pts([0.5, 0.9, 0.9, 0.1]), "max")
    assert (s.best_value, s.best_step) == (0.9, 1)


def test_all_nan_has_no_extremes() -> None:
    s = metrics.summarize(pts([NAN, NAN]), "min")
    assert (s.min_value, s.max_value, s.best_value, s.best_step) == (None, None, None, None)


def test_a_summary_needs_a_point() -> None:
    with pytest.raises(ValueError, match="at least one"):
        metrics.summarize([], "min")


@pytest.mark.parametrize("goal", ["min", "max"])
def test_merge_equals_the_summary_of_both(goal: metrics.Goal) -> None:
    rng = random.Random(7)
    values = [rng.choice([NAN, INF, -INF, rng.uniform(-5, 5)]) for _ in range(200)]
    points = pts(values)
    for cut in (1, 50, 199):
        merged = metrics.merge(
            metrics.summarize(points[:cut], goal), metrics.summarize(points[cut:], goal)
        )
        whole = metrics.summarize(points, goal)
        assert repr(merged) == repr(whole)


def test_buckets() -> None:
    assert bucket_count(1000) == 250
    assert bucket_count(3) == 1
    assert bucket_width(0, 99_999, 250) == 400
    assert bucket_width(5, 5, 250) == 1
    with pytest.raises(ValueError):
        bucket_width(5, 4, 1)
    with pytest.raises(ValueError):
        bucket_count(0)


def test_a_short_series_is_not_downsampled() -> None:
    points = pts([1.0, 2.0, 3.0])
    assert downsample(points, 10) == points


def test_downsampling_keeps_every_extreme_and_about_max_points() -> None:
    rng = random.Random(1)
    values = [rng.gauss(0, 1) for _ in range(100_000)]
    values[12_345] = 50.0
    values[67_890] = -50.0
    values[99_000] = NAN
    points = pts(values)
    kept = downsample(points, 1000)
    assert 750 <= len(kept) <= 1001
    kept_values = [p.value for p in kept]
    assert 50.0 in kept_values and -50.0 in kept_values
    assert any(math.isnan(v) for v in kept_values)
    assert kept[0] == points[0] and kept[-1] == points[-1]
    assert [p.step for p in kept] == sorted(p.step for p in kept)


def test_downsampling_every_bucket_keeps_its_own_min_and_max() -> None:
    values = [float(i % 7) for i in range(1000)]
    kept = downsample(pts(values), 40)  # 10 buckets of 100 steps
    for bucket in range(10):
        inside = {p.value for p in kept if bucket * 100 <= p.step < (bucket + 1) * 100}
        assert {0.0, 6.0} <= inside


def test_pick_drops_repeats() -> None:
    p = Point(1, T0, NAN)
    q = Point(0, T0, 1.0)
    assert metrics.pick([p, None, Point(1, T0, NAN), q, q]) == [q, p]


def test_json_floats() -> None:
    assert metrics.json_float(NAN) == "NaN"
    assert metrics.json_float(INF) == "Infinity"
    assert metrics.json_float(-INF) == "-Infinity"
    assert metrics.json_float(1.5) == 1.5
    assert metrics.json_float_or_none(None) is None


def test_plan_uses_whole_blocks_only_for_wide_buckets() -> None:
    assert metrics.plan(0, 999, 1000) == (0, 4, False)
    origin, width, by_blocks = metrics.plan(1_000, 100_999, 1000)
    assert by_blocks and width % metrics.BLOCK_STEPS == 0 and width >= 400
    assert origin == 1_000 - 1_000 % metrics.BLOCK_STEPS
    assert (100_999 - origin) // width < 250  # no more buckets than asked for


def test_extremes_of_blocks_merge_to_those_of_all_their_points() -> None:
    rng = random.Random(3)
    values = [rng.choice([NAN, INF, -INF, 0.5, rng.uniform(-1, 1)]) for _ in range(500)]
    points = pts(values)
    rng.shuffle(points)
    merged = metrics.extremes(points[:1])
    for i in range(1, len(points), 37):
        merged = metrics.merge_extremes(merged, metrics.extremes(points[i : i + 37]))
    whole = metrics.extremes(points)
    assert repr(merged) == repr(whole) and merged.count == 500


def test_extremes_break_ties_by_step() -> None:
    e = metrics.extremes(pts([1.0, 0.0, 1.0, 0.0]))
    assert (e.low.step if e.low else None, e.high.step if e.high else None) == (1, 2)
    with pytest.raises(ValueError):
        metrics.extremes([])


def test_extremes_are_min_and_max_by_their_keys() -> None:
    rng = random.Random(11)
    for _ in range(200):
        points = [
            Point(rng.randrange(5), T0 + timedelta(seconds=rng.randrange(3)), v)
            for v in (rng.choice([NAN, INF, -INF, 0.0, 1.0, rng.random()]) for _ in range(20))
        ]
        e = metrics.extremes(points)
        finite = [p for p in points if p.value == p.value]
        nans = [p for p in points if p.value != p.value]
        assert e.first is min(points, key=lambda p: (p.step, p.at))
        assert e.last is max(points, key=lambda p: (p.step, p.at))
        assert e.low is (min(finite, key=lambda p: (p.value, p.step, p.at)) if finite else None)
        assert e.high is (max(finite, key=lambda p: (p.value, p.step, p.at)) if finite else None)
        assert e.nan is (min(nans, key=lambda p: (p.step, p.at)) if nans else None)
