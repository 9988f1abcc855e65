"""The tracking API's query parameters, parsed without a server (``tracking_query``)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from trainyard_platform.services.registry.tracking_query import differing, parse_filter, parse_sort
from trainyard_platform.services.registry.tracking_repository import RunFilter, RunOrder
from trainyard_platform.services.registry.tracking_schemas import Run
from trainyard_platform.shared.http_errors import RequestInvalid


def test_sort_defaults_to_the_better_end_first() -> None:
    assert parse_sort(None, None) is None
    assert parse_sort("best:loss", None) == RunOrder("best", "loss", descending=False)
    assert parse_sort("final:accuracy", None) == RunOrder("final", "accuracy", descending=True)
    assert parse_sort("final:accuracy", "asc") == RunOrder("final", "accuracy", False)
    assert parse_sort("best:train/loss", "desc") == RunOrder("best", "train/loss", True)


@pytest.mark.parametrize("bad", ["loss", "worst:loss", "best:", "best"])
def test_a_bad_sort_names_the_field(bad: str) -> None:
    with pytest.raises(RequestInvalid) as caught:
        parse_sort(bad, None)
    assert [e.field for e in caught.value.errors] == ["sort"]


def test_filters() -> None:
    assert parse_filter("final:accuracy>=0.9") == RunFilter("final", "accuracy", ">=", 0.9)
    assert parse_filter("best:val/loss<1e-3") == RunFilter("best", "val/loss", "<", 0.001)
    assert parse_filter("best:a>-2") == RunFilter("best", "a", ">", -2.0)
    assert parse_filter(None) is None


@pytest.mark.parametrize("bad", ["final:acc=1", "final:acc>", "acc>1", "final:acc>one", "x"])
def test_a_bad_filter_names_the_field(bad: str) -> None:
    with pytest.raises(RequestInvalid) as caught:
        parse_filter(bad)
    assert [e.field for e in caught.value.errors] == ["filter"]


def run(job_id: str, **hyper: object) -> Run:
    t = datetime(2026, 1, 1, tzinfo=UTC)
    return Run(
        job_id=job_id, name="n", user="u", status="running", started_at=t, ended_at=None,
        duration_seconds=0.0, hyperparameters=hyper, labels={}, tags=[], note="", metrics={},
    )  # fmt: skip


def test_only_parameters_that_differ_are_compared() -> None:
    runs = [run("a", lr=0.1, bs=64, opt="adam"), run("b", lr=0.2, bs=64), run("c", lr=0.1, bs=64)]
    assert differing(runs) == {
        "lr": {"a": 0.1, "b": 0.2, "c": 0.1},
        "opt": {"a": "adam", "b": None, "c": None},
    }
    assert differing([run("a", lr=1)]) == {}
    assert differing([run("a", x=1), run("b", x=True)]) == {"x": {"a": 1, "b": True}}
