"""Assembly of the job view and the list lines from stored rows."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
from litestar import Litestar, Response, get
from litestar.testing import TestClient

from tests.unit.submission.factories import at
from trainyard_platform.services.submission.schemas import FailureView, JobSummary, JobView
from trainyard_platform.services.submission.views import (
    job_summary,
    job_view,
    submitted_job_json,
    submitted_job_view,
)

SPEC = {"name": "digits-cnn", "gpus": 2, "gpu_flavor": "h200", "user": "alice", "team": "ml"}


def _job(**changes: Any) -> dict[str, Any]:
    row: dict[str, Any] = {
        "id": "job-1",
        "name": "digits-cnn",
        "spec": SPEC,
        "status": "QUEUED",
        "submitted_at": at(0),
        "updated_at": at(1),
        "cancel_requested_at": None,
        "pending_reason": None,
        "pending_position": None,
        "estimated_start": None,
        "pending_blocking": None,
        "pending_suggestion": None,
        "allocation_id": None,
        "node_id": None,
        "gpu_indices": None,
        "attempt": None,
        "started_at": None,
        "finished_at": None,
        "metrics": {},
        "metrics_step": None,
        "failure": None,
        "user_name": "alice",
        "team_name": "ml",
    }
    return {**row, **changes}


def test_a_new_job_has_an_empty_view() -> None:
    view = job_view(
        _job(), [{"status": "QUEUED", "at": at(0), "reason": "submitted"}], [], None, [], 0
    )
    assert (view.status, view.terminal, view.team, view.user) == ("QUEUED", False, "ml", "alice")
    assert [h.status for h in view.history] == ["QUEUED"]
    assert view.pending is None and view.model is None and view.failure is None
    assert view.gpu_indices == [] and view.checkpoints == []
    assert view.cost.cost == 0 and not view.cost.final
    assert view.spec == SPEC


def test_pending_details_are_shown_only_while_pending() -> None:
    pending = _job(
        status="PENDING", pending_reason="quota", pending_position=4, estimated_start=at(60)
    )
    view = job_view(pending, [], [], None, [], 0)
    assert view.pending is not None
    assert (view.pending.reason, view.pending.position) == ("quota", 4)
    hinted = job_view(
        {**pending, "pending_blocking": "job-7", "pending_suggestion": "ask for 2 GPUs"},
        [],
        [],
        None,
        [],
        0,
    )
    assert hinted.pending is not None
    assert (hinted.pending.blocking, hinted.pending.suggestion) == ("job-7", "ask for 2 GPUs")
    assert job_view({**pending, "status": "QUEUED"}, [], [], None, [], 0).pending is None


def test_a_pending_reason_counts_its_estimate_from_the_time_it_is_read() -> None:
    # Seen on a local stack: the scheduler republishes a note only when more than its
    # durations changed, so a reason written at 17:25 kept "expected start in ~28 min" for
    # as long as the job waited. The view counts it from its estimated start, read now.
    submitted = datetime.now(UTC)
    pending = _job(
        status="PENDING",
        pending_reason="needs 2 cpu GPUs on one node; no cpu GPU is free; expected start in ~28 min",
        estimated_start=submitted + timedelta(minutes=12, seconds=10),
    )
    view = job_view(pending, [], [], None, [], 0).pending
    assert view is not None
    assert view.reason.endswith("; expected start in ~12 min")
    reclaim = "team-b borrows 6 of your 8 a100 quota; reclaim expected in ~30 min"
    late = {
        **pending,
        "pending_reason": reclaim,
        "estimated_start": submitted - timedelta(minutes=1),
    }
    view = job_view(late, [], [], None, [], 0).pending
    assert view is not None
    assert (
        view.reason
        == "team-b borrows 6 of your 8 a100 quota; reclaim expected to start at the next pass"
    )
    line = job_summary({**late, "reason": reclaim, "cost": 0.0, "currency": None})
    assert line.reason == view.reason
    # A reason without an estimate, or a job without one, is shown as written.
    for reason, start in (("no ready node has h100 GPUs", submitted), (reclaim, None)):
        view = job_view(
            {**pending, "pending_reason": reason, "estimated_start": start}, [], [], None, [], 0
        ).pending
        assert view is not None and view.reason == reason


def test_finished_job_view_has_placement_results_and_cost() -> None:
    row = _job(
        status="FAILED",
        allocation_id="alloc-2",
        node_id="node-7",
        gpu_indices=[2, 3],
        attempt=2,
        started_at=at(10),
        finished_at=at(99),
        metrics={"loss": 0.5, "acc": None},
        metrics_step=40,
        cancel_requested_at=at(50),
        failure={"reason": "oom", "exit_code": 137, "log_tail": "killed"},
    )
    checkpoints = [
        {"step": 20, "uri": "s3://c/20", "sha256": "a" * 64, "size_bytes": 10, "saved_at": at(20)},
        {"step": 40, "uri": "s3://c/40", "sha256": "b" * 64, "size_bytes": 11, "saved_at": at(40)},
    ]
    model = {
        "model_name": "digits",
        "version": 3,
        "artifact_uri": "s3://m/3",
        "artifact_sha256": "c" * 64,
        "metrics": {"acc": 0.9},
        "lineage": {"job_id": "job-1", "seed": 7},
    }
    costs = [
        {"gpu_seconds": 100.0, "cost": 1.0, "currency": "EUR", "price_per_gpu_hour": 36.0},
        {"gpu_seconds": 200.0, "cost": 2.0, "currency": "EUR", "price_per_gpu_hour": 36.0},
    ]
    view = job_view(row, [], checkpoints, model, costs, allocations=2)
    assert view.terminal
    assert (view.node, view.gpu_indices, view.attempt) == ("node-7", [2, 3], 2)
    assert view.cancel_requested
    assert view.failure is not None and view.failure.exit_code == 137
    assert (view.step, view.metrics) == (40, {"loss": 0.5, "acc": None})
    assert [c.step for c in view.checkpoints] == [20, 40]
    assert view.model is not None and (view.model.name, view.model.version) == ("digits", 3)
    assert view.model.lineage["seed"] == 7
    assert (view.cost.gpu_seconds, view.cost.cost, view.cost.currency) == (300.0, 3.0, "EUR")
    assert view.cost.final
    assert not job_view(row, [], [], None, costs[:1], allocations=2).cost.final


def test_a_job_waiting_again_after_preemption_is_on_no_node() -> None:
    # Seen on a local stack: a preempted job back in its queue was shown "PENDING (attempt 0
    # on local-node-1, GPUs 0,1)" by `trainyard describe` (and on that node by the
    # dashboard) while another job ran on those GPUs. Waiting, it holds none.
    placed = {"node_id": "node-7", "gpu_indices": [0, 1], "attempt": 0, "started_at": at(10)}
    for status in ("PENDING", "QUEUED"):
        row = _job(status=status, **placed)
        view = job_view(row, [], [], None, [], 1)
        assert (view.node, view.gpu_indices, view.attempt) == (None, [], 0)
        assert job_summary({**row, "cost": 0.0, "currency": None}).node is None
    for status in ("SCHEDULED", "RUNNING", "PREEMPTED", "SUCCEEDED"):
        view = job_view(_job(status=status, **placed), [], [], None, [], 1)
        assert (view.node, view.gpu_indices) == ("node-7", [0, 1])


def test_a_restarted_job_shows_why_its_last_attempt_failed() -> None:
    failure = {
        "reason": "attempt 1 failed: user_error: exited with status 1",
        "exit_code": 1,
        "log_tail": "ValueError",
        "failure_kind": "user_error",
        "attempt": 1,
        "allocation_id": "alloc-1",
        "finished_at": at(40).isoformat(),
        "failed_attempts": 1,
    }
    row = _job(status="RUNNING", allocation_id="alloc-2", attempt=2, failure=failure)
    view = job_view(row, [], [], None, [], 1)
    assert not view.terminal
    assert view.failure is not None
    assert (view.failure.failure_kind, view.failure.attempt, view.failure.exit_code) == (
        "user_error",
        1,
        1,
    )
    assert view.failed_attempts == 1
    # Once it succeeds the failure is history: the view no longer shows it as the job's.
    done = job_view({**row, "status": "SUCCEEDED", "finished_at": at(99)}, [], [], None, [], 2)
    assert done.failure is None and done.failed_attempts == 1
    # A failure stored before the kind and the count were kept still reads.
    old = job_view(_job(status="FAILED", failure={"reason": "oom"}), [], [], None, [], 1)
    assert old.failure is not None and old.failure.failure_kind is None
    assert old.failed_attempts == 1
    assert job_view(_job(), [], [], None, [], 0).failed_attempts == 0


def test_view_serialises_to_json() -> None:
    body = job_view(_job(), [], [], None, [], 0).model_dump(mode="json")
    assert body["submitted_at"].startswith("2024-06-01T12:00:00")
    assert body["cost"] == {
        "gpu_seconds": 0.0,
        "cost": 0.0,
        "currency": None,
        "price_per_gpu_hour": None,
        "final": False,
    }


def test_summary_line() -> None:
    line = job_summary(
        _job(status="RUNNING", node_id="node-1", attempt=1, cost=1.5, currency="USD")
    )
    assert (line.status, line.gpus, line.gpu_flavor, line.cost) == ("RUNNING", 2, "h200", 1.5)
    assert not line.terminal


_FRESH: list[tuple[dict[str, Any], datetime, str | None]] = [
    (SPEC, datetime(2026, 12, 4, 16, 0, tzinfo=UTC), None),
    (
        {
            **SPEC,
            "name": "d\u00e9j\u00e0-vu \u2603",
            "args": ["--lr", "1e-05", "tab\there"],
            "hyperparameters": {"lr": 1e-05, "wd": 0.1, "steps": 2**62, "on": True, "x": None},
            "labels": {"k": "v"},
            "code": {"kind": "bundle", "sha256": "a" * 64},
        },
        datetime(2026, 12, 4, 16, 0, 1, 123456, tzinfo=UTC),
        "0af7651916cd43dd8448eb211c80319c",
    ),
    (SPEC, datetime(2026, 12, 4, 18, 0, 0, 500, tzinfo=timezone(timedelta(hours=2))), "ab" * 16),
]


LOWERED = (
    "submitted; priority lowered from normal to low: the budget of team ml is spent "
    "(12 of 10 USD spent in 2026-12) (policy deprioritize)"
)


@pytest.mark.parametrize("reason", ["submitted", LOWERED])
@pytest.mark.parametrize(("spec", "submitted_at", "trace_id"), _FRESH)
def test_a_submitted_jobs_json_is_the_bytes_litestar_writes_for_its_view(
    spec: dict[str, Any], submitted_at: datetime, trace_id: str | None, reason: str
) -> None:
    args = ("job-1", "ml", "alice", spec, submitted_at, trace_id, reason)

    @get("/view", sync_to_thread=False)
    def as_view() -> Response[Any]:
        return Response(submitted_job_view(*args))

    @get("/json", sync_to_thread=False)
    def as_json() -> Response[Any]:
        return Response(submitted_job_json(*args))

    with TestClient(Litestar([as_view, as_json])) as client:
        view, encoded = client.get("/view"), client.get("/json")
    assert encoded.content == view.content
    assert encoded.headers["content-type"] == view.headers["content-type"]
    assert submitted_job_view(*args).model_dump(mode="json")["trace_id"] == trace_id
    # A job a spent budget lowered says so in its first history entry from its 201 on.
    assert [h["reason"] for h in view.json()["history"]] == [reason]


def test_every_attempt_field_of_the_api_says_it_is_a_0_based_index() -> None:
    # The API's attempt fields carry the scheduler's index (0 for the first attempt) while
    # every text says "attempt 1" for it; the OpenAPI document said nothing of it.
    for model in (JobView, JobSummary, FailureView):
        described = model.model_json_schema()["properties"]["attempt"].get("description", "")
        assert "0-based index" in described and "attempt 1" in described, model.__name__
