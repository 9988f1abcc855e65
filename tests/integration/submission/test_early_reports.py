"""A runner's report that reaches the stream before the grant it answers (as after NATS
lost its store: the scheduler replays its grants while runners report) is applied after the
grant, not lost; saying it again then is a duplicate the stream drops, so nothing else would
bring it back."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from typing import Any

import pytest

from tests.integration.submission.conftest import Submission, eventually
from tests.unit.submission import factories as ev
from trainyard_platform.services.submission import repository as repo
from trainyard_platform.services.submission.domain import SCHEDULER_SOURCE
from trainyard_platform.services.submission.early_reports import MAX_KEPT_PER_NODE
from trainyard_platform.shared.events import Envelope, Payload
from trainyard_platform.shared.events.trust import owner

pytestmark = pytest.mark.integration


def _statuses(view: dict[str, Any]) -> list[str]:
    return [h["status"] for h in view["history"]]


async def _stored(submission: Submission) -> int:
    info = await submission.bus.jetstream.stream_info(submission.bus.settings.stream)
    return int(info.state.messages)


async def _outbox_drained(submission: Submission) -> bool:
    async with submission.pool.acquire() as conn:
        waiting: int = await conn.fetchval("SELECT count(*) FROM outbox WHERE published_at IS NULL")
        return waiting == 0


async def _kept(submission: Submission, job_id: str) -> int:
    async with submission.pool.acquire() as conn:
        count: int = await conn.fetchval(
            "SELECT count(*) FROM early_reports WHERE job_id = $1", job_id
        )
        return count


async def test_reports_before_their_grant_are_applied_after_it_and_the_job_converges(
    submission: Submission,
) -> None:
    job = (await submission.submit())["id"]
    runner: list[Envelope[Payload]] = [
        Envelope.wrap(payload, source=owner(payload), subject=job)
        for payload in (ev.started(job), ev.progress(job, 3, loss=0.5), ev.succeeded(job))
    ]
    for envelope in runner:  # into the new stream before the scheduler's replayed grant
        await submission.bus.publish(envelope)
    await submission.publish(ev.granted(job))
    # The submission's own job.submitted leaves through its outbox relay, which may publish it
    # after this point: counted in one reading and not the other, it would look like a report
    # the stream let in twice.
    await eventually(lambda: _outbox_drained(submission))
    before = await _stored(submission)
    for envelope in runner:  # the runner says them again after the grant: same ids
        await submission.bus.publish(envelope)
    assert await _stored(submission) == before  # dropped as duplicates: no second chance

    view = await submission.wait_for(job, lambda v: v["status"] == "SUCCEEDED")
    assert _statuses(view) == ["QUEUED", "SCHEDULED", "RUNNING", "SUCCEEDED"]
    assert view["started_at"] is not None and view["finished_at"] is not None
    assert view["step"] == 3
    assert await _kept(submission, job) == 0


async def test_a_success_before_its_start_is_applied_after_the_start(
    submission: Submission,
) -> None:
    job = (await submission.submit())["id"]
    await submission.publish(ev.granted(job))  # heard of before the loss
    started, succeeded = (
        Envelope.wrap(payload, source=owner(payload), subject=job)
        for payload in (ev.started(job), ev.succeeded(job))
    )
    # A runner retrying its job.succeeded across the loss puts it into the new stream before
    # it says the allocation's events again after the replayed grant.
    await submission.bus.publish(succeeded)
    await submission.bus.publish(started)
    await submission.bus.publish(succeeded)  # a duplicate the stream drops

    view = await submission.wait_for(job, lambda v: v["status"] == "SUCCEEDED")
    assert _statuses(view) == ["QUEUED", "SCHEDULED", "RUNNING", "SUCCEEDED"]
    assert await _kept(submission, job) == 0


async def test_a_report_whose_grant_never_comes_moves_nothing_and_goes_when_the_job_ends(
    submission: Submission,
) -> None:
    job = (await submission.submit())["id"]
    await submission.publish(ev.started(job, "alloc-never"))
    await submission.publish(ev.granted(job, "alloc-1"))
    await submission.publish(ev.checkpoint(job, 5))  # a marker: all of the above was seen
    view = await submission.wait_for(job, lambda v: len(v["checkpoints"]) == 1)
    assert view["status"] == "SCHEDULED"
    assert await _kept(submission, job) == 1

    await submission.publish(ev.started(job, "alloc-1"))
    await submission.publish(ev.succeeded(job, "alloc-1"))
    view = await submission.wait_for(job, lambda v: v["status"] == "SUCCEEDED")
    assert _statuses(view) == ["QUEUED", "SCHEDULED", "RUNNING", "SUCCEEDED"]
    assert await _kept(submission, job) == 0


async def test_the_schedulers_own_word_never_waits_for_a_grant(submission: Submission) -> None:
    job = (await submission.submit())["id"]
    await submission.publish(ev.granted(job, "alloc-2", attempt=2))
    # A late success the scheduler kept, of an attempt whose grant this view never saw.
    await submission.publish(ev.succeeded(job, "alloc-1"), source=SCHEDULER_SOURCE)
    view = await submission.wait_for(job, lambda v: v["status"] == "SUCCEEDED")
    assert _statuses(view) == ["QUEUED", "SCHEDULED", "SUCCEEDED"]
    assert await _kept(submission, job) == 0


async def test_reports_of_allocations_never_granted_are_kept_up_to_a_bound(
    submission: Submission,
) -> None:
    """A runner reporting allocations that are never granted (a bug, or a compromised runner)
    cannot grow the table without bound: beyond the bound a report is refused, not kept, and
    the job's view goes on."""
    job = (await submission.submit())["id"]
    for n in range(MAX_KEPT_PER_NODE + 3):
        await submission.bus.publish(
            Envelope.wrap(
                ev.started(job, f"alloc-forged-{n}"), source=owner(ev.started(job)), subject=job
            )
        )
    await submission.publish(ev.granted(job, "alloc-1"))
    await submission.publish(ev.checkpoint(job, 5))  # a marker: all of the above was seen
    view = await submission.wait_for(job, lambda v: len(v["checkpoints"]) == 1)
    assert view["status"] == "SCHEDULED"
    assert await _kept(submission, job) == MAX_KEPT_PER_NODE

    await submission.publish(ev.started(job, "alloc-1"))
    await submission.publish(ev.succeeded(job, "alloc-1"))
    view = await submission.wait_for(job, lambda v: v["status"] == "SUCCEEDED")
    assert await _kept(submission, job) == 0


@pytest.mark.parametrize("status", ["SUCCEEDED", "FAILED", "CANCELLED"])
async def test_any_write_of_a_terminal_status_forgets_the_jobs_kept_reports(
    submission: Submission, status: str
) -> None:
    """The reports go with the write of the terminal status itself, not with the events that
    end a job today: a path that ends a job some other way forgets them too."""
    job = (await submission.submit())["id"]
    await submission.publish(ev.started(job, "alloc-never"))
    await submission.publish(ev.succeeded(job, "alloc-never"))
    # A marker: all of the above was seen (a scheduler's note, applied to a queued job).
    await submission.publish(ev.pending(job, reason="marker"))
    await submission.wait_for(job, lambda v: (v["pending"] or {}).get("reason") == "marker")
    assert await _kept(submission, job) == 2

    async with submission.pool.acquire() as conn, conn.transaction():
        await repo.lock_job(conn, job)
        await repo.set_finished(conn, job, status, datetime.now(UTC), None)
    assert (await submission.job(job))["status"] == status
    assert await _kept(submission, job) == 0


async def test_only_a_terminal_status_is_written_as_an_end(submission: Submission) -> None:
    job = (await submission.submit())["id"]
    async with submission.pool.acquire() as conn:
        with pytest.raises(ValueError, match="RUNNING"):
            await repo.set_finished(conn, job, "RUNNING", datetime.now(UTC), None)


async def test_progress_while_the_grant_waits_never_takes_the_room_of_the_jobs_end(
    submission: Submission,
) -> None:
    """A grant held by a replica of this service that died comes back only after ack_wait;
    meanwhile the job's runner reports progress every second. The progress reports filled
    the job's ``MAX_KEPT_PER_NODE`` kept reports, and every report after them was refused and
    dead-lettered, the job's checkpoint and success among them: its view never ended. The
    progress reports are now counted apart: those beyond the bound are refused (a later one
    says more), the job's other reports are kept and the job converges."""
    job = (await submission.submit())["id"]
    beyond = 8
    await submission.publish(ev.started(job))
    for step in range(1, MAX_KEPT_PER_NODE + beyond + 1):
        await submission.publish(ev.progress(job, step, loss=1 / step))
    await submission.publish(ev.checkpoint(job, 50))
    await submission.publish(ev.succeeded(job))
    async with asyncio.timeout(15):
        while await _kept(submission, job) < MAX_KEPT_PER_NODE + 3:
            await asyncio.sleep(0.05)

    await submission.publish(ev.granted(job))
    view = await submission.wait_for(job, lambda v: v["status"] == "SUCCEEDED")
    assert _statuses(view) == ["QUEUED", "SCHEDULED", "RUNNING", "SUCCEEDED"]
    assert [c["step"] for c in view["checkpoints"]] == [50]
    assert view["step"] == MAX_KEPT_PER_NODE
    dead = await submission.bus.jetstream.stream_info(
        submission.bus.settings.deadletter_stream, subjects_filter="deadletter.submission"
    )
    assert (dead.state.subjects or {}).get("deadletter.submission") == beyond
