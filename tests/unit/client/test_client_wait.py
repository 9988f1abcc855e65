"""``wait`` returns once an ended job's results are in, and waits for none it will not get.

A SUCCEEDED job that did not ask for a model (``register_model`` false, the default) never
gets one, yet ``wait`` kept polling it for ``SETTLE_SECONDS`` (10 s) after the job ended: every
``trainyard wait``, ``run`` and sweep trial of such a job paid those 10 s."""

from __future__ import annotations

from typing import Any

import pytest

import trainyard.client as client_module
from trainyard.client import TrainyardClient

FINAL_COST = {"final": True}
MODEL = {"name": "m", "version": 1}


class Clock:
    """``time.monotonic`` and ``time.sleep`` of the client's module, with no real waiting."""

    def __init__(self) -> None:
        self.now = 0.0

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def polls_until_returned(
    monkeypatch: pytest.MonkeyPatch, views: list[dict[str, Any]]
) -> tuple[int, dict[str, Any]]:
    """How many views ``wait`` read before it returned (the last one repeats), and its view."""
    clock = Clock()
    monkeypatch.setattr(client_module.time, "monotonic", clock.monotonic)
    monkeypatch.setattr(client_module.time, "sleep", clock.sleep)
    read: list[dict[str, Any]] = []

    def get_job(job_id: str) -> dict[str, Any]:
        view = views[min(len(read), len(views) - 1)]
        read.append(view)
        return view

    with TrainyardClient("http://127.0.0.1:9", "t") as client:
        monkeypatch.setattr(client, "get_job", get_job)
        view = client.wait("job", timeout_s=600)
    return len(read), view


def ended(status: str, register_model: bool, cost: dict[str, Any], model: Any) -> dict[str, Any]:
    return {
        "status": status,
        "spec": {"register_model": register_model},
        "cost": cost,
        "model": model,
    }


@pytest.mark.parametrize("status", ["SUCCEEDED", "FAILED", "CANCELLED"])
def test_a_job_that_asked_for_no_model_is_done_once_its_cost_is_final(
    monkeypatch: pytest.MonkeyPatch, status: str
) -> None:
    polls, view = polls_until_returned(
        monkeypatch, [ended(status, register_model=False, cost=FINAL_COST, model=None)]
    )
    assert polls == 1
    assert view["status"] == status


def test_a_job_that_asked_for_a_model_is_waited_for_until_it_is_registered(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    views = [
        ended("SUCCEEDED", register_model=True, cost=FINAL_COST, model=None),
        ended("SUCCEEDED", register_model=True, cost=FINAL_COST, model=None),
        ended("SUCCEEDED", register_model=True, cost=FINAL_COST, model=MODEL),
    ]
    polls, view = polls_until_returned(monkeypatch, views)
    assert polls == 3
    assert view["model"] == MODEL


def test_a_cost_not_yet_final_or_a_model_that_never_comes_is_waited_for_a_bounded_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for never in (
        ended("SUCCEEDED", register_model=False, cost={"final": False}, model=None),
        ended("SUCCEEDED", register_model=True, cost=FINAL_COST, model=None),
    ):
        polls, view = polls_until_returned(monkeypatch, [never])
        assert polls > 1
        assert view is never
        # Polled every 0.5 s until SETTLE_SECONDS after it was first seen ended.
        assert polls == int(client_module.SETTLE_SECONDS / 0.5) + 1
