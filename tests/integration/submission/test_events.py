"""Lifecycle events published on NATS keep the job view up to date, once each."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import asyncpg
import pytest

from tests.integration.submission.conftest import Submission, eventually, running_submission
from tests.unit.submission import factories as ev
from trainyard_platform.services.submission import handlers
from trainyard_platform.services.submission.config import Settings
from trainyard_platform.services.submission.domain import SCHEDULER_SOURCE
from trainyard_platform.shared.bus import BatchHandler, Bus, Delivery
from trainyard_platform.shared.events import Envelope, Payload
from trainyard_platform.shared.events.payloads import JobCancelRequested, JobPending
from trainyard_platform.shared.events.trust import REGISTRY, owner

pytestmark = pytest.mark.integration


def _statuses(view: dict[str, Any]) -> list[str]:
    return [h["status"] for h in view["history"]]


async def test_a_successful_run_fills_in_the_whole_view(submission: Submission) -> None:
    job = (await submission.submit())["id"]
    await submission.publish(ev.pending(job, reason="team ml is at its cpu quota", position=3))
    view = await submission.wait_for(job, lambda v: v["status"] == "PENDING")
    assert view["pending"]["reason"] == "team ml is at its cpu quota"
    assert view["pending"]["position"] == 3
    assert view["pending"]["estimated_start"] is not None

    for payload in (
        ev.granted(job),
        ev.started(job),
        ev.progress(job, 10, loss=1.5),
        ev.checkpoint(job, 50),
        ev.progress(job, 100, loss=0.25, accuracy=0.9),
        ev.checkpoint(job, 100),
        ev.succeeded(job, accuracy=0.97),
        ev.model_registered(job),
    ):
        await submission.publish(payload)
    await submission.publish(ev.cost(job))
    view = await submission.wait_for(job, lambda v: v["cost"]["final"] and v["model"])

    assert _statuses(view) == ["QUEUED", "PENDING", "SCHEDULED", "RUNNING", "SUCCEEDED"]
    assert view["terminal"] is True
    assert view["pending"] is None
    assert (view["node"], view["gpu_indices"], view["attempt"]) == ("node-1", [0, 1], 1)
    assert view["started_at"] is not None and view["finished_at"] is not None
    assert view["step"] == 100
    assert view["metrics"] == {"loss": 0.25, "accuracy": 0.97}
    assert [c["step"] for c in view["checkpoints"]] == [50, 100]
    assert view["checkpoints"][1]["sha256"] == f"{100:064x}"
    assert view["model"]["name"] == "digits-cnn"
    assert view["model"]["version"] == 1
    assert view["model"]["lineage"]["code_version"] == "git:abc123"
    assert view["cost"] == {
        "gpu_seconds": 7200.0,
        "cost": 4.0,
        "currency": "USD",
        "price_per_gpu_hour": 2.0,
        "final": True,
    }


async def test_pending_view_shows_who_blocks_and_what_would_help(submission: Submission) -> None:
    job = (await submission.submit())["id"]
    await submission.publish(
        JobPending(
            job_id=job,
            reason="needs 8 h200 GPUs on one node; the largest free block is 4",
            position=2,
            blocking="job-7, job-9",
            suggestion="asking for 4 GPUs would let it start now",
        )
    )
    view = await submission.wait_for(job, lambda v: v["status"] == "PENDING")
    assert view["pending"]["blocking"] == "job-7, job-9"
    assert view["pending"]["suggestion"] == "asking for 4 GPUs would let it start now"
    await submission.publish(ev.granted(job))
    view = await submission.wait_for(job, lambda v: v["status"] == "SCHEDULED")
    assert view["pending"] is None


async def test_preempted_job_resumes_and_cost_is_final_when_every_lease_is_billed(
    submission: Submission,
) -> None:
    job = (await submission.submit())["id"]
    for payload in (
        ev.granted(job, "alloc-1", attempt=1),
        ev.started(job, "alloc-1", attempt=1),
        ev.preempted(job, "alloc-1"),
        ev.pending(job, reason="preempted; waiting for capacity"),
        ev.granted(job, "alloc-2", attempt=2),
        ev.started(job, "alloc-2", attempt=2),
        ev.failed(job, "alloc-2", exit_code=3, failure_kind="out_of_memory"),
    ):
        await submission.publish(payload)
    # The runner reported attempt 2; the scheduler (no restarts left) ends the job.
    said = ev.failed(
        job,
        "alloc-2",
        exit_code=None,
        reason="out_of_memory: ...; max restarts (0) reached after 1 attempts",
        failure_kind="out_of_memory",
        log_tail="",
    )
    await submission.publish(said, source=SCHEDULER_SOURCE)
    await submission.publish(ev.cost(job, "alloc-1", gpu_seconds=3600.0))
    view = await submission.wait_for(job, lambda v: v["cost"]["gpu_seconds"] > 0)
    assert _statuses(view) == [
        "QUEUED",
        "SCHEDULED",
        "RUNNING",
        "PREEMPTED",
        "PENDING",
        "SCHEDULED",
        "RUNNING",
        "FAILED",
        "FAILED",
    ]
    assert view["attempt"] == 2
    assert view["failure"]["exit_code"] == 3  # the runner's, kept
    assert "ValueError" in view["failure"]["log_tail"]
    assert view["failure"]["failure_kind"] == "out_of_memory"
    assert view["cost"]["final"] is False  # alloc-2 is not billed yet

    await submission.publish(ev.cost(job, "alloc-2", gpu_seconds=1800.0))
    view = await submission.wait_for(job, lambda v: v["cost"]["final"])
    assert view["cost"]["gpu_seconds"] == 5400.0
    assert view["cost"]["cost"] == pytest.approx(3.0)


async def test_billing_s_correction_of_a_cost_is_kept_against_a_late_first_bill(
    submission: Submission,
) -> None:
    """Billing said alloc-1's bill (4.0), then its correction (0: the attempt failed through
    the platform; revision 1, the same end), then the first bill reached the consumer again
    under a new id. Before, the last to arrive won: the view said 4.0 for alloc-1 again."""
    job = (await submission.submit())["id"]
    first = ev.cost(job, "alloc-1")
    correction = first.model_copy(update={"cost": 0.0, "gpu_seconds": 0.0, "revision": 1})
    for payload in (first, correction, first, ev.cost(job, "alloc-2", gpu_seconds=1800.0)):
        await submission.publish(payload)
    view = await submission.wait_for(job, lambda v: v["cost"]["gpu_seconds"] in (1800, 9000))
    assert (view["cost"]["gpu_seconds"], view["cost"]["cost"]) == (1800.0, 1.0)


async def test_late_and_out_of_order_events_do_not_move_the_status(submission: Submission) -> None:
    job = (await submission.submit())["id"]
    await submission.publish(ev.succeeded(job))  # before it was even scheduled
    await submission.publish(ev.granted(job, "alloc-1"))
    await submission.publish(ev.started(job, "alloc-old"))  # not the allocation it holds
    await submission.publish(ev.pending(job))  # stale: it is already placed
    await submission.publish(ev.checkpoint(job, 5))  # a marker that all of the above was seen
    view = await submission.wait_for(job, lambda v: len(v["checkpoints"]) == 1)
    assert view["status"] == "SCHEDULED"
    assert _statuses(view) == ["QUEUED", "SCHEDULED"]

    await submission.publish(ev.cancelled(job))
    await submission.publish(ev.started(job, "alloc-1"))  # too late: cancelled is final
    await submission.publish(ev.progress(job, 7, loss=0.5))  # data is still recorded
    view = await submission.wait_for(job, lambda v: v["step"] == 7)
    assert view["status"] == "CANCELLED"
    assert _statuses(view) == ["QUEUED", "SCHEDULED", "CANCELLED"]
    assert view["finished_at"] is not None
    cancel = await submission.client.post(f"/v1/jobs/{job}/cancel", headers=submission.auth())
    assert cancel.status_code == 409


async def test_cancelled_job_whose_process_failed_ends_cancelled(submission: Submission) -> None:
    job = (await submission.submit())["id"]
    await submission.publish(ev.granted(job))
    await submission.publish(ev.started(job))
    cancel = await submission.client.post(f"/v1/jobs/{job}/cancel", headers=submission.auth())
    assert cancel.status_code == 202
    await submission.publish(ev.failed(job, exit_code=-15))  # SIGTERM, no checkpoint
    await submission.publish(ev.cancelled(job))  # the scheduler's verdict
    view = await submission.wait_for(job, lambda v: v["status"] == "CANCELLED")
    assert _statuses(view) == ["QUEUED", "SCHEDULED", "RUNNING", "FAILED", "CANCELLED"]
    assert view["finished_at"].startswith("2024-06-01T12:06:40")  # when the process ended
    assert view["failure"]["exit_code"] == -15


async def test_a_cancel_with_a_stale_etag_is_412_and_the_fresh_one_proceeds(
    submission: Submission,
) -> None:
    """``GET /v1/jobs/{id}`` answers the job's ``ETag`` (where it is in its life, not what
    it reports); a cancel with ``If-Match: <it>`` goes ahead while the job is where it was
    read and is 412, naming ``If-Match`` and that it changed, once it moved on (a script
    that decided to cancel a queued job does not cancel it once it runs). Without a
    condition, as before. (Before, there was no ``ETag`` and the cancel ignored it.)"""
    job = (await submission.submit())["id"]
    path = f"/v1/jobs/{job}"
    read = await submission.client.get(path, headers=submission.auth())
    queued = read.headers["ETag"]
    await submission.publish(ev.granted(job))
    await submission.publish(ev.progress(job, 3, loss=0.5))
    view = await submission.wait_for(job, lambda v: v["step"] == 3)
    assert view["status"] == "SCHEDULED"
    scheduled = (await submission.client.get(path, headers=submission.auth())).headers["ETag"]
    assert scheduled != queued
    await submission.publish(ev.progress(job, 4, loss=0.4))  # what it reports: same tag
    await submission.wait_for(job, lambda v: v["step"] == 4)
    assert (await submission.client.get(path, headers=submission.auth())).headers[
        "ETag"
    ] == scheduled
    stale = await submission.client.post(
        f"{path}/cancel", headers={**submission.auth(), "If-Match": queued}
    )
    assert stale.status_code == 412, stale.text
    (error,) = stale.json()["errors"]
    assert error["field"] == "If-Match"
    assert f"job {job} was changed since it was read" in error["message"]
    assert (await submission.client.get(path, headers=submission.auth())).json()[
        "cancel_requested"
    ] is False
    fresh = await submission.client.post(
        f"{path}/cancel", headers={**submission.auth(), "If-Match": scheduled}
    )
    assert fresh.status_code == 202 and fresh.json()["cancel_requested"] is True, fresh.text
    assert fresh.headers["ETag"] not in (scheduled, None)
    # Without a condition, as before (asking again changes nothing).
    again = await submission.client.post(f"{path}/cancel", headers=submission.auth())
    assert again.status_code == 202, again.text


async def test_a_cancelled_running_job_is_not_said_preempted(submission: Submission) -> None:
    # Seen on a local stack: the history of a running job its user cancelled read RUNNING,
    # "PREEMPTED cancelled", "CANCELLED cancelled by user": the runner reports the stop the
    # scheduler asked for as job.preempted. The job was cancelled, never preempted.
    job = (await submission.submit())["id"]
    await submission.publish(ev.granted(job))
    await submission.publish(ev.started(job))
    await submission.wait_for(job, lambda v: v["status"] == "RUNNING")
    cancel = await submission.client.post(f"/v1/jobs/{job}/cancel", headers=submission.auth())
    assert cancel.status_code == 202
    stopped = ev.preempted(job).model_copy(update={"reason": "cancelled", "checkpoint": None})
    await submission.publish(stopped)
    await submission.publish(ev.cancelled(job))  # the scheduler's verdict
    view = await submission.wait_for(job, lambda v: v["status"] == "CANCELLED")
    assert _statuses(view) == ["QUEUED", "SCHEDULED", "RUNNING", "CANCELLED"]
    assert view["history"][-1]["reason"] == "cancelled by user"


async def test_a_running_job_the_registry_cancelled_is_never_shown_preempted(
    submission: Submission,
) -> None:
    """The registry asks, on this service's behalf, to cancel a job whose parent model
    version was deleted before it heard of the job (``registry.job_inputs``). Submission
    never heard of that request: the runner's report of the stop was applied, and the job
    showed PREEMPTED, its history "preempted", until the scheduler's ``job.cancelled``."""
    job = (await submission.submit())["id"]
    await submission.publish(ev.granted(job))
    await submission.publish(ev.started(job))
    request = JobCancelRequested(
        job_id=job, team="ml", user="registry", reason="its parent model version was deleted"
    )
    await submission.publish(request, source=REGISTRY)  # on <type>.by-registry
    stopped = ev.preempted(job).model_copy(update={"reason": "cancelled", "checkpoint": None})
    await submission.publish(stopped)  # the runner: the scheduler's revocation stopped it
    await submission.publish(ev.checkpoint(job, 5))  # a marker: all of the above was seen
    view = await submission.wait_for(job, lambda v: len(v["checkpoints"]) == 1)
    assert view["status"] == "RUNNING"
    assert view["cancel_requested"] is True

    await submission.publish(ev.cancelled(job))  # the scheduler's verdict
    view = await submission.wait_for(job, lambda v: v["status"] == "CANCELLED")
    assert _statuses(view) == ["QUEUED", "SCHEDULED", "RUNNING", "CANCELLED"]


async def test_a_registry_cancel_handled_after_the_stop_it_caused_ends_the_same(
    submission: Submission,
) -> None:
    """The registry's request is in the stream before the runner's report of the stop (the
    scheduler revokes only once it has it), but may be handled after it: redelivered after
    a failure, or said again by the registry's outbox after NATS lost its store. The job
    then showed PREEMPTED, and its history kept "preempted" after the scheduler's
    ``job.cancelled``."""
    job = (await submission.submit())["id"]
    await submission.publish(ev.granted(job))
    await submission.publish(ev.started(job))
    stopped = ev.preempted(job).model_copy(update={"reason": "cancelled", "checkpoint": None})
    await submission.publish(stopped)  # the runner: the scheduler's revocation stopped it
    request = JobCancelRequested(
        job_id=job, team="ml", user="registry", reason="its parent model version was deleted"
    )
    await submission.publish(request, source=REGISTRY)  # handled late
    await submission.publish(ev.checkpoint(job, 5))  # a marker: all of the above was seen
    view = await submission.wait_for(job, lambda v: len(v["checkpoints"]) == 1)
    assert view["status"] == "RUNNING"
    assert view["cancel_requested"] is True

    await submission.publish(ev.cancelled(job))  # the scheduler's verdict
    view = await submission.wait_for(job, lambda v: v["status"] == "CANCELLED")
    assert _statuses(view) == ["QUEUED", "SCHEDULED", "RUNNING", "CANCELLED"]


async def test_a_stop_said_cancelled_of_a_job_nobody_cancelled_ends_preempted(
    submission: Submission,
) -> None:
    """A runner's stop with the reason ``cancelled`` is left alone (the cancel request may
    come later); of a job nobody cancelled, the scheduler requeues it and says the
    preemption itself (``services.scheduler.leases``), which the job shows."""
    job = (await submission.submit())["id"]
    await submission.publish(ev.granted(job))
    await submission.publish(ev.started(job))
    stopped = ev.preempted(job).model_copy(update={"reason": "cancelled", "checkpoint": None})
    await submission.publish(stopped)  # the runner's word, wrong
    said = ev.preempted(job).model_copy(update={"reason": "preempted", "checkpoint": None})
    await submission.publish(said, source=SCHEDULER_SOURCE)
    view = await submission.wait_for(job, lambda v: v["status"] == "PREEMPTED")
    assert _statuses(view) == ["QUEUED", "SCHEDULED", "RUNNING", "PREEMPTED"]
    assert view["cancel_requested"] is False


async def test_events_for_unknown_jobs_are_ignored_and_consumption_goes_on(
    submission: Submission,
) -> None:
    for payload in (
        ev.pending("no-such-job"),
        ev.progress("no-such-job", 1, loss=1.0),
        ev.checkpoint("no-such-job", 1),
        ev.model_registered("no-such-job"),
        ev.cost("no-such-job"),
    ):
        await submission.publish(payload)
    job = (await submission.submit())["id"]
    await submission.publish(ev.pending(job))
    await submission.wait_for(job, lambda v: v["status"] == "PENDING")
    info = await submission.bus.jetstream.stream_info("TRAINYARD_DEADLETTER")
    assert info.state.messages == 0


async def test_a_redelivered_event_is_applied_once(
    settings: Settings, pool: asyncpg.Pool, bus: Bus
) -> None:
    deliveries: dict[str, int] = {}
    applications: dict[str, int] = {}

    def count_deliveries(handler: BatchHandler) -> BatchHandler:
        async def counting(batch: Sequence[Delivery]) -> None:
            for delivery in batch:
                deliveries[delivery.envelope.id] = deliveries.get(delivery.envelope.id, 0) + 1
            await handler(batch)

        return counting

    async def count_applications(envelope: Envelope[Payload], conn: asyncpg.Connection) -> None:
        applications[envelope.id] = applications.get(envelope.id, 0) + 1
        await handlers.dispatch(envelope, conn)

    async with running_submission(
        settings, pool, bus, dispatch=count_applications, wrap=count_deliveries
    ) as submission:
        job = (await submission.submit())["id"]
        envelope: Envelope[Any] = Envelope.wrap(
            ev.granted(job), source=owner(ev.granted(job)), subject="node-1"
        )
        await bus.publish(envelope)
        # The same event again under another Nats-Msg-Id, so JetStream keeps both: this is
        # what a redelivery after a lost ack looks like to the consumer.
        await bus.publish_raw(envelope.nats_subject, envelope.to_json(), "again", {})
        await eventually(lambda: _delivered(deliveries, envelope.id, 2))
        view = await submission.wait_for(job, lambda v: v["status"] == "SCHEDULED")
    assert deliveries[envelope.id] == 2
    assert applications[envelope.id] == 1
    assert _statuses(view) == ["QUEUED", "SCHEDULED"]


async def _delivered(deliveries: dict[str, int], event_id: str, times: int) -> bool:
    return deliveries.get(event_id, 0) >= times
