"""Assembly of the job view from stored rows (rows in, HTTP schema out; the clock is read only
to count a pending reason's estimate from the time it is read, ``shared.waits``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from functools import cache
from typing import Any

from litestar.serialization import encode_json
from pydantic import TypeAdapter

from trainyard_platform.services.submission.domain import (
    CostLine,
    JobStatus,
    failed_attempts,
    summarize_cost,
)
from trainyard_platform.services.submission.schemas import (
    CheckpointView,
    CostView,
    FailureView,
    HistoryEntry,
    JobSummary,
    JobView,
    ModelView,
    PendingView,
)
from trainyard_platform.shared.waits import estimate_from

Row = Mapping[str, Any]


def job_view(
    job: Row,
    history: Sequence[Row],
    checkpoints: Sequence[Row],
    model: Row | None,
    costs: Sequence[Row],
    allocations: int,
) -> JobView:
    """The view of one job from its row and the rows of its parts."""
    status = JobStatus(job["status"])
    cost = summarize_cost(
        [
            CostLine(
                gpu_seconds=c["gpu_seconds"],
                cost=c["cost"],
                currency=c["currency"],
                price_per_gpu_hour=c["price_per_gpu_hour"],
            )
            for c in costs
        ],
        allocations,
        status,
    )
    return JobView(
        id=job["id"],
        name=job["name"],
        team=job["team_name"],
        user=job["user_name"],
        spec=job["spec"],
        status=status,
        terminal=status.is_terminal,
        history=[HistoryEntry(status=h["status"], at=h["at"], reason=h["reason"]) for h in history],
        pending=_pending(job, status),
        node=_node(job, status),
        gpu_indices=list(job["gpu_indices"] or []) if _node(job, status) else [],
        attempt=job["attempt"],
        submitted_at=job["submitted_at"],
        started_at=job["started_at"],
        finished_at=job["finished_at"],
        updated_at=job["updated_at"],
        cancel_requested=job["cancel_requested_at"] is not None,
        failure=_failure(job["failure"], status),
        failed_attempts=failed_attempts(job["failure"]),
        step=job["metrics_step"],
        metrics=job["metrics"] or {},
        checkpoints=[CheckpointView(**dict(c)) for c in checkpoints],
        model=_model(model),
        trace_id=job.get("trace_id"),
        cost=CostView(
            gpu_seconds=cost.gpu_seconds,
            cost=cost.cost,
            currency=cost.currency,
            price_per_gpu_hour=cost.price_per_gpu_hour,
            final=cost.final,
        ),
    )


def submitted_job_view(
    job_id: str,
    team: str,
    user: str,
    spec: dict[str, Any],
    submitted_at: datetime,
    trace_id: str | None = None,
    reason: str = "submitted",
) -> JobView:
    """The view of a job just stored by ``repository.insert_job``: what reading it back
    would give (QUEUED, one history entry with ``reason``, nothing placed, run, saved or
    billed yet)."""
    row: dict[str, Any] = dict.fromkeys(_NULLABLE_JOB_COLUMNS)
    row.update(
        id=job_id,
        name=spec["name"],
        team_name=team,
        user_name=user,
        spec=spec,
        status=JobStatus.QUEUED,
        submitted_at=submitted_at,
        updated_at=submitted_at,
        metrics={},
        trace_id=trace_id,
    )
    history = [{"status": JobStatus.QUEUED, "at": submitted_at, "reason": reason}]
    return job_view(row, history, checkpoints=[], model=None, costs=[], allocations=0)


def submitted_job_json(
    job_id: str,
    team: str,
    user: str,
    spec: dict[str, Any],
    submitted_at: datetime,
    trace_id: str | None = None,
    reason: str = "submitted",
) -> bytes:
    """``submitted_job_view`` as the API answers it, without building the view: the same
    bytes Litestar writes for that ``JobView`` (its JSON-mode dump, encoded by Litestar's
    ``encode_json``). Only the fields a fresh job does not share with every other fresh job are
    filled in, into the dump of one such view made once; ``spec`` must be JSON-compatible
    (``payloads.dump``), as the stored spec is. About a fifth of the time of building and
    encoding the view (``tests/unit/submission/test_views.py`` holds the two equal)."""
    at = _DATETIME.dump_python(submitted_at, mode="json")
    view = _submitted_template().copy()
    view.update(
        id=job_id,
        name=spec["name"],
        team=team,
        user=user,
        spec=spec,
        history=[{**view["history"][0], "at": at, "reason": reason}],
        submitted_at=at,
        updated_at=at,
        trace_id=trace_id,
    )
    return encode_json(view)


_DATETIME: TypeAdapter[datetime] = TypeAdapter(datetime)


@cache
def _submitted_template() -> dict[str, Any]:
    # Any values will do for the fields submitted_job_json fills in.
    epoch = datetime(1970, 1, 1, tzinfo=UTC)
    view = submitted_job_view("", "", "", {"name": ""}, epoch).model_dump(mode="json")
    if len(view["history"]) != 1:
        raise AssertionError("a submitted job's view has one history entry")
    return view


_NULLABLE_JOB_COLUMNS = (
    "cancel_requested_at",
    "pending_reason",
    "pending_position",
    "estimated_start",
    "pending_blocking",
    "pending_suggestion",
    "allocation_id",
    "node_id",
    "gpu_indices",
    "attempt",
    "started_at",
    "finished_at",
    "metrics_step",
    "failure",
)


def _pending(job: Row, status: JobStatus) -> PendingView | None:
    if status is not JobStatus.PENDING:
        return None
    return PendingView(
        reason=estimate_from(job["pending_reason"], job["estimated_start"], datetime.now(UTC)),
        position=job["pending_position"],
        estimated_start=job["estimated_start"],
        blocking=job["pending_blocking"],
        suggestion=job["pending_suggestion"],
    )


def _failure(failure: Row | None, status: JobStatus) -> FailureView | None:
    if not failure or status is JobStatus.SUCCEEDED:
        return None
    return FailureView(
        reason=failure["reason"],
        exit_code=failure.get("exit_code"),
        log_tail=failure.get("log_tail") or "",
        failure_kind=failure.get("failure_kind"),
        attempt=failure.get("attempt"),
    )


def _model(model: Row | None) -> ModelView | None:
    if model is None:
        return None
    return ModelView(
        name=model["model_name"],
        version=model["version"],
        artifact_uri=model["artifact_uri"],
        artifact_sha256=model["artifact_sha256"],
        metrics=model["metrics"],
        lineage=model["lineage"],
    )


_WAITING = frozenset({JobStatus.QUEUED, JobStatus.PENDING})


def _node(job: Row, status: JobStatus) -> str | None:
    """The node of the job's allocation: the one it holds, or for a job that ended (or was
    just preempted) the one it last held. None while it waits: the row keeps the last
    allocation's node after a preemption, and a re-queued job holds no GPU there."""
    return None if status in _WAITING else job["node_id"]


def job_summary(job: Row) -> JobSummary:
    """One line of the job list from a row of ``repository.jobs_for_team``."""
    status = JobStatus(job["status"])
    return JobSummary(
        id=job["id"],
        name=job["name"],
        team=job["team_name"],
        user=job["user_name"],
        status=status,
        terminal=status.is_terminal,
        gpu_flavor=job["spec"]["gpu_flavor"],
        gpus=job["spec"]["gpus"],
        submitted_at=job["submitted_at"],
        started_at=job["started_at"],
        finished_at=job["finished_at"],
        node=_node(job, status),
        attempt=job["attempt"],
        step=job["metrics_step"],
        cost=job["cost"],
        currency=job["currency"],
        project=job["spec"].get("project") or "default",
        experiment=job["spec"].get("experiment"),
        reason=_reason(job, status),
    )


def _reason(job: Row, status: JobStatus) -> str | None:
    """A list line's reason; a pending one's estimate counted from now (``waits``)."""
    reason: str | None = job.get("reason")
    if reason is None or status is not JobStatus.PENDING:
        return reason
    return estimate_from(reason, job.get("estimated_start"), datetime.now(UTC))
