"""Which new metric series a batch may add: a job has at most ``MAX_METRIC_KEYS``."""

from __future__ import annotations

from trainyard_platform.services.registry.metric_ingest import over_the_limit


def test_new_series_past_the_limit_are_left_out_per_job() -> None:
    new = [("a", "k1"), ("a", "k2"), ("a", "k3"), ("b", "k1"), ("c", "k1")]
    assert over_the_limit(new, {"a": 1, "c": 3}, limit=3) == {("a", "k3"), ("c", "k1")}


def test_below_the_limit_nothing_is_left_out() -> None:
    assert over_the_limit([("a", "k1"), ("a", "k2")], {}, limit=2) == set()
