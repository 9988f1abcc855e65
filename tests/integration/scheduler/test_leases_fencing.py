"""Ending allocations on the real database (``services.scheduler.leases``): what
``apply_endings`` writes (releases, freed GPUs, fair-share usage, requeues with their
back-off, job states, events in plan order), ``charge_usage``'s decay, and the forced end of
a job whose preemption grace is over (the old allocation fenced, a new epoch next time)."""

from __future__ import annotations

import json
import logging
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from tests.fixtures.json_log import json_lines
from trainyard_platform.services.scheduler import allocation_repository as allocation_repo
from trainyard_platform.services.scheduler import repository as repo
from trainyard_platform.services.scheduler.domain import (
    Allocation,
    AllocationStatus,
    Job,
    JobStatus,
)
from trainyard_platform.services.scheduler.handlers import SchedulerHandlers
from trainyard_platform.services.scheduler.leases import (
    apply_endings,
    charge_usage,
    end_gang,
    plan_end,
    release_expired_notices,
)
from trainyard_platform.services.scheduler.node_watch import sweep_silent_nodes
from trainyard_platform.services.scheduler.policy.model import PolicyConfig
from trainyard_platform.services.scheduler.scheduling import Tuning
from trainyard_platform.shared.bus import Delivery
from trainyard_platform.shared.events import Envelope, parse_envelope
from trainyard_platform.shared.events.payloads import (
    AllocationReleased,
    AllocationRevoked,
    JobFailed,
    JobPreempted,
    RunnerHeartbeat,
)

from .conftest import make_spec

T0 = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
HOUR = 3600.0
TUNING = Tuning(
    PolicyConfig(grace_s=60.0, half_life_s=HOUR),
    cancel_grace_s=9.0,
    restart_backoff_s=4.0,
    platform_retries=0,  # a platform_error here is a final failure, as these tests need
)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


async def add_job(
    conn: asyncpg.Connection,
    job_id: str,
    status: JobStatus = JobStatus.RUNNING,
    team: str = "vision",
    reason: str | None = None,
    **spec: Any,
) -> None:
    await repo.insert_job(conn, job_id, make_spec(team=team, **spec), T0, T0)
    await repo.set_job_status(conn, [job_id], status, T0, reason)


async def grant(
    conn: asyncpg.Connection, job_id: str, nodes: dict[str, tuple[int, ...]], granted_s: float = 0
) -> list[Allocation]:
    """Live allocations of ``job_id`` on these nodes (one gang), as a placement writes them."""
    for node in nodes:
        await repo.upsert_node(conn, node, f"{node}.local", "cpu", 8, T0)
    epochs = await allocation_repo.next_epochs(conn, len(nodes))
    gang = str(uuid.uuid4())
    allocations = [
        Allocation(
            allocation_id=str(uuid.uuid4()),
            job_id=job_id,
            node_id=node,
            epoch=epoch,
            attempt=0,
            gpu_indices=gpus,
            status=AllocationStatus.RUNNING,
            granted_at=at(granted_s),
            gang_id=gang,
            gang_size=len(nodes),
        )
        for (node, gpus), epoch in zip(nodes.items(), epochs, strict=True)
    ]
    await allocation_repo.insert_allocations(conn, allocations)
    return await allocation_repo.live_allocations(conn, job_id)


async def job(conn: asyncpg.Connection, job_id: str) -> Job:
    found = await repo.job_for_update(conn, job_id)
    assert found is not None
    return found


async def outbox(conn: asyncpg.Connection) -> list[Any]:
    """The enqueued events in order, as envelopes."""
    rows = await conn.fetch("SELECT body FROM outbox ORDER BY seq")
    return [parse_envelope(bytes(r["body"])) for r in rows]


async def job_row(conn: asyncpg.Connection, job_id: str) -> asyncpg.Record:
    row = await conn.fetchrow(
        "SELECT status, status_reason, attempt, restarts, eligible_at, updated_at "
        "FROM jobs WHERE job_id = $1",
        job_id,
    )
    assert row is not None
    return row


async def usage(conn: asyncpg.Connection, team: str) -> tuple[float, datetime] | None:
    row = await conn.fetchrow("SELECT gpu_seconds, as_of FROM usage WHERE team = $1", team)
    return None if row is None else (row["gpu_seconds"], row["as_of"])


async def test_apply_endings_releases_frees_charges_and_moves_each_job(
    pool: asyncpg.Pool, caplog: pytest.LogCaptureFixture
) -> None:
    async with pool.acquire() as conn, conn.transaction():
        await add_job(conn, "ok")
        await add_job(conn, "retry")
        await add_job(conn, "gone", team="speech", max_restarts=0)
        await add_job(conn, "ok2")
        ok = await grant(conn, "ok", {"n1": (0, 1), "n2": (0,)})
        retry = await grant(conn, "retry", {"n3": (2,)}, granted_s=10)
        gone = await grant(conn, "gone", {"n4": (5, 6, 7)}, granted_s=20)
        ok2 = await grant(conn, "ok2", {"n5": (1,)}, granted_s=30)
        failed = JobFailed(
            job_id="retry",
            allocation_id=retry[0].allocation_id,
            node_id="n3",
            epoch=retry[0].epoch,
            finished_at=at(100),
            exit_code=1,
            reason="exited with status 1",
        )
        # Each reported by its runner on its first node (a lost node's as the sweep does).
        ok_done = ok[0].allocation_id
        endings = [
            plan_end(
                await job(conn, "ok"), ok, "succeeded", at(100), at(200), TUNING, reporter=ok_done
            ),
            plan_end(
                await job(conn, "retry"),
                retry,
                "failed",
                at(100),
                at(200),
                TUNING,
                reporter=retry[0].allocation_id,
                failed=failed,
            ),
            plan_end(
                await job(conn, "gone"),
                gone,
                "lost",
                at(120),
                at(200),
                TUNING,
                reporter=gone[0].allocation_id,
            ),
            plan_end(
                await job(conn, "ok2"),
                ok2,
                "succeeded",
                at(130),
                at(200),
                TUNING,
                reporter=ok2[0].allocation_id,
            ),
        ]
        with caplog.at_level(logging.INFO, logger="trainyard_platform.services.scheduler.leases"):
            await apply_endings(conn, endings, at(200), TUNING)

        released = await conn.fetch(
            "SELECT allocation_id, status, released_at, outcome FROM allocations "
            "ORDER BY granted_at, node_id"
        )
        assert [
            (str(r["allocation_id"]), r["status"], r["released_at"], r["outcome"]) for r in released
        ] == [
            (ok[0].allocation_id, "RELEASED", at(100), "succeeded"),
            (ok[1].allocation_id, "RELEASED", at(100), "succeeded"),
            (retry[0].allocation_id, "RELEASED", at(100), "failed"),
            (gone[0].allocation_id, "RELEASED", at(120), "lost"),
            (ok2[0].allocation_id, "RELEASED", at(130), "succeeded"),
        ]
        leases = await conn.fetch(
            "SELECT node_id, released_at, stopping_since FROM gpu_leases "
            "ORDER BY node_id, gpu_index"
        )
        # Only the reporters' GPUs are free: ok's member on n2 did not say it stopped, so its
        # GPU stays leased, stopping since the ending.
        assert [(r["node_id"], r["released_at"], r["stopping_since"]) for r in leases] == [
            ("n1", at(100), None),
            ("n1", at(100), None),
            ("n2", None, at(200)),
            ("n3", at(100), None),
            ("n4", at(120), None),
            ("n4", at(120), None),
            ("n4", at(120), None),
            ("n5", at(130), None),
        ]
        assert endings[0].stopping == {ok[1].allocation_id}
        assert [e.stopping for e in endings[1:]] == [frozenset()] * 3
        # vision: ok 3 GPUs x 100 s, retry 1 x 90 s, ok2 1 x 100 s; speech: 3 x 100 s.
        assert await usage(conn, "vision") == (490.0, at(200))
        assert await usage(conn, "speech") == (300.0, at(200))

        assert dict(await job_row(conn, "ok")) == {
            "status": "SUCCEEDED",
            "status_reason": None,
            "attempt": 0,
            "restarts": 0,
            "eligible_at": None,
            "updated_at": at(200),
        }
        assert (await job_row(conn, "ok2"))["status"] == "SUCCEEDED"
        retried = await job_row(conn, "retry")
        assert (retried["status"], retried["attempt"], retried["restarts"]) == ("QUEUED", 1, 1)
        assert retried["eligible_at"] == at(204)  # the 4 s back-off
        assert retried["status_reason"] == endings[1].decision.reason
        assert "restarting in 4 s" in retried["status_reason"]
        lost = await job_row(conn, "gone")
        assert (lost["status"], lost["attempt"], lost["restarts"]) == ("FAILED", 0, 0)
        assert lost["status_reason"] == endings[2].decision.reason
        assert lost["status_reason"].startswith("node_lost: node lost; max restarts (0)")

        said = await outbox(conn)
        planned = [envelope for e in endings for envelope, _ in e.events]
        assert [e.id for e in said] == [e.id for e in planned]
        assert [type(e.data) for e in said][:3] == [
            AllocationReleased,
            AllocationReleased,
            AllocationReleased,
        ]
    messages = [
        r.getMessage()
        for r in caplog.records
        if r.name == "trainyard_platform.services.scheduler.leases"
    ]
    assert messages == [
        f"allocation(s) {ok[0].allocation_id}, {ok[1].allocation_id} of job ok ended "
        "(succeeded): job SUCCEEDED",
        f"allocation(s) {retry[0].allocation_id} of job retry ended (failed): job QUEUED",
        f"allocation(s) {gone[0].allocation_id} of job gone ended (lost): job FAILED",
        f"allocation(s) {ok2[0].allocation_id} of job ok2 ended (succeeded): job SUCCEEDED",
    ]


async def test_a_requeue_without_back_off_is_placeable_at_once_with_a_default_reason(
    pool: asyncpg.Pool,
) -> None:
    async with pool.acquire() as conn, conn.transaction():
        await add_job(conn, "p")
        allocations = await grant(conn, "p", {"n1": (0,)})
        ending = plan_end(await job(conn, "p"), allocations, "preempted", at(50), at(60), TUNING)
        assert ending.decision.reason is None
        await apply_endings(conn, [ending], at(60), TUNING)
        row = await job_row(conn, "p")
        assert (row["status"], row["attempt"], row["restarts"]) == ("QUEUED", 1, 0)
        assert row["eligible_at"] is None
        assert row["status_reason"] == "preempted; requeued"


async def test_jobs_moving_to_one_state_for_different_reasons_each_keep_theirs(
    pool: asyncpg.Pool,
) -> None:
    async with pool.acquire() as conn, conn.transaction():
        endings = []
        for job_id, reason in (("c1", "by ada"), ("c2", "by bob")):
            await add_job(conn, job_id, JobStatus.CANCELLING, reason=reason)
            allocations = await grant(conn, job_id, {f"n-{job_id}": (0,)})
            endings.append(
                plan_end(await job(conn, job_id), allocations, "lost", at(5), at(6), TUNING)
            )
        await apply_endings(conn, endings, at(6), TUNING)
        for job_id, reason in (("c1", "node lost"), ("c2", "node lost")):
            row = await job_row(conn, job_id)
            assert (row["status"], row["status_reason"]) == ("CANCELLED", reason)
        await add_job(conn, "f1", max_restarts=0)
        await add_job(conn, "f2", max_restarts=0)
        endings = []
        for job_id, detail in (("f1", "one"), ("f2", "two")):
            allocations = await grant(conn, job_id, {f"n-{job_id}": (1,)})
            failed = JobFailed(
                job_id=job_id,
                allocation_id=allocations[0].allocation_id,
                node_id=f"n-{job_id}",
                epoch=allocations[0].epoch,
                finished_at=at(5),
                exit_code=1,
                reason=detail,
                failure_kind="platform_error",
            )
            endings.append(
                plan_end(
                    await job(conn, job_id),
                    allocations,
                    "failed",
                    at(5),
                    at(6),
                    TUNING,
                    reporter=allocations[0].allocation_id,
                    failed=failed,
                )
            )
        await apply_endings(conn, endings, at(6), TUNING)
        for job_id, detail in (("f1", "one"), ("f2", "two")):
            row = await job_row(conn, job_id)
            assert row["status"] == "FAILED"
            assert row["status_reason"].startswith(f"platform_error: {detail};")


@pytest.mark.parametrize(
    ("kind", "failure_kind", "charged"),
    [
        ("failed", "platform_error", None),  # the platform's: the team's usage untouched
        ("failed", "user_error", 3 * 100.0),
        ("succeeded", None, 3 * 100.0),
        ("lost", None, 3 * 100.0),  # billed to the team too
    ],
)
async def test_only_the_team_s_own_ends_count_in_its_fair_share_usage(
    pool: asyncpg.Pool, kind: Any, failure_kind: Any, charged: float | None
) -> None:
    """A gang of 2 + 1 GPUs released after 100 s: its team's usage gains its 300 GPU-seconds
    unless a member's runner reported a platform failure (billing's rule,
    ``JobFailed.through_platform``), which the other team's charge in the same batch does
    not change."""
    async with pool.acquire() as conn, conn.transaction():
        await add_job(conn, "j", max_restarts=1)
        await add_job(conn, "other", team="speech")
        allocations = await grant(conn, "j", {"n1": (0, 1), "n2": (0,)})
        others = await grant(conn, "other", {"n3": (0,)})
        failed = None
        if failure_kind is not None:
            failed = JobFailed(
                job_id="j",
                allocation_id=allocations[1].allocation_id,
                node_id=allocations[1].node_id,
                epoch=allocations[1].epoch,
                finished_at=at(100),
                exit_code=None if failure_kind == "platform_error" else 1,
                reason="No space left on device",
                failure_kind=failure_kind,
            )
        endings = [
            plan_end(
                await job(conn, "j"),
                allocations,
                kind,
                at(100),
                at(100),
                TUNING,
                reporter=allocations[1].allocation_id,
                failed=failed,
            ),
            plan_end(await job(conn, "other"), others, "succeeded", at(50), at(100), TUNING),
        ]
        await apply_endings(conn, endings, at(100), TUNING)
        assert await usage(conn, "vision") == (None if charged is None else (charged, at(100)))
        assert await usage(conn, "speech") == (50.0, at(100))


async def test_usage_decays_to_now_before_the_charge(pool: asyncpg.Pool) -> None:
    async with pool.acquire() as conn, conn.transaction():
        await charge_usage(conn, "vision", 100.0, at(0), HOUR)
        assert await usage(conn, "vision") == (100.0, at(0))
        # One half-life later: 100 decays to 50, then 10 is added.
        await charge_usage(conn, "vision", 10.0, at(HOUR), HOUR)
        assert await usage(conn, "vision") == (60.0, at(HOUR))
        # Two half-lives more.
        await charge_usage(conn, "vision", 1.0, at(3 * HOUR), HOUR)
        assert await usage(conn, "vision") == (16.0, at(3 * HOUR))
        assert await usage(conn, "speech") is None


async def test_a_charge_dated_before_the_usage_neither_decays_nor_moves_it_back(
    pool: asyncpg.Pool,
) -> None:
    async with pool.acquire() as conn, conn.transaction():
        await charge_usage(conn, "vision", 100.0, at(HOUR), HOUR)
        await charge_usage(conn, "vision", 5.0, at(0), HOUR)
        assert await usage(conn, "vision") == (105.0, at(HOUR))


@pytest.mark.parametrize("gpu_seconds", [0.0, -5.0])
async def test_nothing_to_charge_writes_nothing(pool: asyncpg.Pool, gpu_seconds: float) -> None:
    async with pool.acquire() as conn, conn.transaction():
        await charge_usage(conn, "vision", 100.0, at(0), HOUR)
        await charge_usage(conn, "vision", gpu_seconds, at(HOUR), HOUR)
        assert await usage(conn, "vision") == (100.0, at(0))
        await charge_usage(conn, "speech", gpu_seconds, at(HOUR), HOUR)
        assert await usage(conn, "speech") is None


async def test_end_gang_writes_what_it_planned_and_returns_the_decision(
    pool: asyncpg.Pool,
) -> None:
    async with pool.acquire() as conn, conn.transaction():
        await add_job(conn, "g")
        allocations = await grant(conn, "g", {"n1": (0,), "n2": (0,)})
        decision = await end_gang(
            conn,
            await job(conn, "g"),
            allocations,
            "lost",
            at(30),
            at(40),
            TUNING,
            reporter=None,
        )
        assert decision.job_status is JobStatus.QUEUED and decision.outcome == "lost"
        assert await allocation_repo.live_allocations(conn, "g") == []
        said = await outbox(conn)
        assert [type(e.data) for e in said] == [
            AllocationReleased,
            AllocationRevoked,
            AllocationReleased,
            AllocationRevoked,
            JobPreempted,
            JobPreempted,
        ]
        assert await usage(conn, "vision") == (60.0, at(40))


async def test_an_expired_notice_ends_the_job_by_force_and_fences_its_allocations(
    pool: asyncpg.Pool, caplog: pytest.LogCaptureFixture
) -> None:
    async with pool.acquire() as conn, conn.transaction():
        await add_job(conn, "late")
        await add_job(conn, "in-grace")
        await add_job(conn, "no-notice")
        late = await grant(conn, "late", {"n1": (0,), "n2": (1,)})
        in_grace = await grant(conn, "in-grace", {"n3": (0,)})
        await grant(conn, "no-notice", {"n4": (0,)})
        await allocation_repo.set_notice(conn, [a.allocation_id for a in late], at(0), "reclaim")
        await allocation_repo.set_notice(conn, [in_grace[0].allocation_id], at(50), "reclaim")
        with caplog.at_level(
            logging.WARNING, logger="trainyard_platform.services.scheduler.leases"
        ):
            ended = await release_expired_notices(conn, at(100), TUNING)
        assert ended == ["late"]
        assert "job late did not stop within the preemption grace: revoking" in [
            r.getMessage() for r in caplog.records
        ]
        assert await allocation_repo.live_allocations(conn, "late") == []
        assert len(await allocation_repo.live_allocations(conn, "in-grace")) == 1
        assert len(await allocation_repo.live_allocations(conn, "no-notice")) == 1
        outcomes = await conn.fetch(
            "SELECT outcome, released_at FROM allocations WHERE job_id = 'late'"
        )
        assert {(r["outcome"], r["released_at"]) for r in outcomes} == {("preempted", at(100))}
        row = await job_row(conn, "late")
        assert (row["status"], row["attempt"], row["restarts"]) == ("QUEUED", 1, 0)

        said = await outbox(conn)
        revoked = [e.data for e in said if isinstance(e.data, AllocationRevoked)]
        assert sorted((r.node_id, r.epoch, r.reason, r.grace_seconds) for r in revoked) == [
            ("n1", late[0].epoch, "fenced", 9.0),
            ("n2", late[1].epoch, "fenced", 9.0),
        ]
        preempted = [e for e in said if isinstance(e.data, JobPreempted)]
        assert [e.id for e in preempted] == [f"said-preempted:{a.allocation_id}" for a in late]
        assert {e.data.reason for e in preempted} == {
            "preempted; the runner did not stop within the grace period, so its GPUs were revoked"
        }
        assert {e.data.finished_at for e in preempted} == {at(100)}
        assert [e.data.epoch for e in preempted] == [a.epoch for a in late]
        assert {e.subject for e in preempted} == {"late"}

        # The silent runners may still be stopping the job: its GPUs stay leased.
        held = await conn.fetch(
            "SELECT node_id, gpu_index, stopping_since FROM gpu_leases "
            "WHERE released_at IS NULL AND allocation_id = ANY($1::uuid[]) ORDER BY node_id",
            [uuid.UUID(a.allocation_id) for a in late],
        )
        assert [tuple(r) for r in held] == [("n1", 0, at(100)), ("n2", 1, at(100))]
        with pytest.raises(asyncpg.UniqueViolationError):
            async with conn.transaction():
                await grant(conn, "late", {"n1": (0,)})
        # Until n1's runner says it stopped: then its GPU is free, n2's still held.
        freed = await allocation_repo.free_stopped(
            conn, late[0].allocation_id, "n1", late[0].epoch, at(110)
        )
        assert freed == 1
        # The next attempt takes a newer epoch than any the fenced runner holds.
        again = await grant(conn, "late", {"n1": (0,)})
        assert again[0].epoch > max(a.epoch for a in late)


async def test_a_notice_exactly_at_the_grace_ends_and_a_job_holding_nothing_is_skipped(
    pool: asyncpg.Pool,
) -> None:
    async with pool.acquire() as conn, conn.transaction():
        await add_job(conn, "edge")
        await add_job(conn, "done")
        edge = await grant(conn, "edge", {"n1": (0,)})
        done = await grant(conn, "done", {"n2": (0,)})
        await allocation_repo.set_notice(conn, [edge[0].allocation_id], at(40), "reclaim")
        await allocation_repo.set_notice(conn, [done[0].allocation_id], at(0), "reclaim")
        # A job that no longer holds GPUs (its end is being written) is left alone.
        await repo.set_job_status(conn, ["done"], JobStatus.SUCCEEDED, at(1))
        assert await release_expired_notices(conn, at(100), TUNING) == ["edge"]
        assert len(await allocation_repo.live_allocations(conn, "done")) == 1
        assert await outbox(conn) != []
        assert all(e.data.job_id == "edge" for e in await outbox(conn))


async def test_a_notice_inside_the_grace_is_left_alone(pool: asyncpg.Pool) -> None:
    async with pool.acquire() as conn, conn.transaction():
        await add_job(conn, "j")
        allocations = await grant(conn, "j", {"n1": (0,)})
        await allocation_repo.set_notice(conn, [allocations[0].allocation_id], at(41), "reclaim")
        assert await release_expired_notices(conn, at(100), TUNING) == []
        assert await outbox(conn) == []


async def test_usage_already_held_decays_before_an_ending_adds_to_it(pool: asyncpg.Pool) -> None:
    async with pool.acquire() as conn, conn.transaction():
        await charge_usage(conn, "vision", 1000.0, at(0), HOUR)
        await add_job(conn, "j")
        allocations = await grant(conn, "j", {"n1": (0, 1)}, granted_s=HOUR - 50)
        ending = plan_end(
            await job(conn, "j"), allocations, "succeeded", at(HOUR), at(HOUR), TUNING
        )
        await apply_endings(conn, [ending], at(HOUR), TUNING)
        # 1000 halved over the hour, plus 2 GPUs x 50 s.
        assert await usage(conn, "vision") == (600.0, at(HOUR))


async def test_a_back_off_under_a_second_still_delays_the_job(pool: asyncpg.Pool) -> None:
    quick = Tuning(PolicyConfig(), restart_backoff_s=0.25)
    async with pool.acquire() as conn, conn.transaction():
        await add_job(conn, "j")
        allocations = await grant(conn, "j", {"n1": (0,)})
        ending = plan_end(await job(conn, "j"), allocations, "failed", at(5), at(6), quick)
        assert ending.decision.backoff_s == 0.25
        await apply_endings(conn, [ending], at(6), quick)
        assert (await job_row(conn, "j"))["eligible_at"] == at(6.25)


async def test_end_gang_passes_on_the_reporter_and_its_failure_report(pool: asyncpg.Pool) -> None:
    async with pool.acquire() as conn, conn.transaction():
        await add_job(conn, "g", max_restarts=0)
        allocations = await grant(conn, "g", {"n1": (0,), "n2": (0,)})
        reporter = allocations[1]
        failed = JobFailed(
            job_id="g",
            allocation_id=reporter.allocation_id,
            node_id="n2",
            epoch=reporter.epoch,
            finished_at=at(25),
            exit_code=7,
            reason="exited with status 7",
            log_tail="boom",
            failure_kind="platform_error",
        )
        decision = await end_gang(
            conn,
            await job(conn, "g"),
            allocations,
            "failed",
            at(30),
            at(40),
            TUNING,
            reporter=reporter.allocation_id,
            failed=failed,
        )
        assert decision.job_status is JobStatus.FAILED
        assert decision.failure_kind == "platform_error"
        said = [e.data for e in await outbox(conn)]
        # Only the member that did not report is told to stop.
        assert [r.node_id for r in said if isinstance(r, AllocationRevoked)] == ["n1"]
        final = said[-1]
        assert isinstance(final, JobFailed)
        assert (final.allocation_id, final.exit_code, final.log_tail) == (
            reporter.allocation_id,
            7,
            "boom",
        )


async def test_endings_decided_outside_an_event_continue_the_jobs_trace(
    pool: asyncpg.Pool, spans: InMemorySpanExporter
) -> None:
    async with pool.acquire() as conn, conn.transaction():
        with trace.get_tracer("test").start_as_current_span("submit") as root:
            await add_job(conn, "lost")
            await add_job(conn, "late")
        trace_id = root.get_span_context().trace_id
        lost = await grant(conn, "lost", {"n1": (0,)})
        late = await grant(conn, "late", {"n2": (0,)})
        await allocation_repo.set_notice(conn, [late[0].allocation_id], at(0), "reclaim")
        await end_gang(conn, await job(conn, "lost"), lost, "lost", at(5), at(6), TUNING)
        assert await release_expired_notices(conn, at(100), TUNING) == ["late"]
        rows = await conn.fetch("SELECT body, headers FROM outbox ORDER BY seq")

    finished = {s.name: s for s in spans.get_finished_spans() if s.name.startswith("scheduler ")}
    assert set(finished) == {"scheduler release", "scheduler preempted"}
    for span in finished.values():
        assert span.context.trace_id == trace_id
    jobs = [
        str(s.attributes.get("trainyard.job_id"))
        for s in spans.get_finished_spans()
        if s.name.startswith("scheduler ") and s.attributes
    ]
    assert sorted(jobs) == ["late", "late", "lost"]
    preempted = finished["scheduler preempted"]
    for row in rows:
        headers = json.loads(row["headers"]) if isinstance(row["headers"], str) else row["headers"]
        parent = headers.get("traceparent", "")
        assert int(parent.split("-")[1], 16) == trace_id, parse_envelope(bytes(row["body"])).id
    said_late = [
        (parse_envelope(bytes(r["body"])), r["headers"])
        for r in rows
        if parse_envelope(bytes(r["body"])).id == f"said-preempted:{late[0].allocation_id}"
    ]
    assert len(said_late) == 1
    headers = said_late[0][1]
    headers = json.loads(headers) if isinstance(headers, str) else headers
    assert headers["traceparent"].split("-")[2] == format(preempted.context.span_id, "016x")


async def test_a_forced_ends_lines_carry_the_jobs_id(pool: asyncpg.Pool) -> None:
    # The sweep ends jobs outside any event's span: its warning and the end's line named the
    # job in their text only, and their JSON records had no job_id.
    async with pool.acquire() as conn, conn.transaction():
        await add_job(conn, "late")
        late = await grant(conn, "late", {"n1": (0,)})
        await allocation_repo.set_notice(conn, [a.allocation_id for a in late], at(0), "reclaim")
        with json_lines("trainyard_platform.services.scheduler", "scheduler") as log:
            assert await release_expired_notices(conn, at(100), TUNING) == ["late"]
    about = [line for line in log.lines if "job late" in line["message"]]
    assert [line["message"].split(":")[0] for line in about] == [
        "job late did not stop within the preemption grace",
        f"allocation(s) {late[0].allocation_id} of job late ended (preempted)",
    ]
    assert [line.get("job_id") for line in about] == ["late", "late"]


async def lease_of(conn: asyncpg.Connection, allocation: Allocation) -> tuple[Any, Any]:
    """(released_at, stopping_since) of the allocation's one GPU lease."""
    row = await conn.fetchrow(
        "SELECT released_at, stopping_since FROM gpu_leases WHERE allocation_id = $1::uuid",
        allocation.allocation_id,
    )
    assert row is not None
    return row["released_at"], row["stopping_since"]


async def test_a_lease_held_past_the_end_of_its_bill_ends_when_its_gpus_were_given_up(
    pool: asyncpg.Pool,
) -> None:
    """An allocation held past its grant plus its ``max_runtime_seconds`` and the kill
    grace (a long preparation, the wait for its last checkpoint's upload) is billed up to
    there (the allocation's ``released_at``), but its GPUs were held until its runner said
    it ended: its GPU lease ends then. Before, the lease ended with the bill, so the books
    said the GPU free for the 69 s its runner still held it."""
    async with pool.acquire() as conn, conn.transaction():
        await add_job(conn, "held", max_runtime_seconds=1)
        (allocation,) = await grant(conn, "held", {"n1": (0,)})
        ending = plan_end(
            await job(conn, "held"),
            [allocation],
            "preempted",
            at(100),
            at(120),
            TUNING,
            reporter=allocation.allocation_id,
        )
        await apply_endings(conn, [ending], at(120), TUNING)
        released = await conn.fetchval(
            "SELECT released_at FROM allocations WHERE allocation_id = $1::uuid",
            allocation.allocation_id,
        )
        assert released == at(31)  # its bill: 1 s and the 30 s kill grace
        assert await lease_of(conn, allocation) == (at(100), None)


async def test_a_lost_nodes_gang_peer_keeps_its_gpu_until_a_later_heartbeat_or_its_own_loss(
    pool: asyncpg.Pool,
) -> None:
    async with pool.acquire() as conn, conn.transaction():
        await add_job(conn, "gang", max_restarts=3)
        on_n1, on_n2 = await grant(conn, "gang", {"n1": (0,), "n2": (1,)})
        await conn.execute("UPDATE nodes SET last_heartbeat = $1 WHERE node_id = 'n2'", at(100))
        assert await sweep_silent_nodes(conn, at(50), at(60), TUNING) == ["n1"]
        # n1's GPU is free (n1 is lost); n2's runner was only told to stop its member.
        assert await lease_of(conn, on_n1) == (T0, None)
        assert await lease_of(conn, on_n2) == (None, at(60))

        # A heartbeat still listing it, or handled in the instant the GPU was held (the
        # batch that held it), frees nothing.
        listed = [on_n2.allocation_id, "not-a-uuid"]
        assert await allocation_repo.free_unlisted(conn, "n2", listed, at(70)) == 0
        assert await allocation_repo.free_unlisted(conn, "n2", [], at(60)) == 0
        # Another node's heartbeat, or a report of another epoch, neither.
        assert await allocation_repo.free_unlisted(conn, "n1", [], at(80)) == 0
        assert await allocation_repo.free_stopped(conn, on_n2.allocation_id, "n2", 0, at(80)) == 0
        assert await lease_of(conn, on_n2) == (None, at(60))

        # n2 is lost too: whatever it held is gone with it.
        assert await sweep_silent_nodes(conn, at(150), at(160), TUNING) == ["n2"]
        assert await lease_of(conn, on_n2) == (at(160), at(60))
        live = await conn.fetchval(
            "SELECT count(*) FROM gpu_leases WHERE released_at IS NULL AND node_id IN ('n1', 'n2')"
        )
        assert live == 0


async def test_a_heartbeat_handled_after_the_hold_without_the_allocation_frees_it(
    pool: asyncpg.Pool,
) -> None:
    async with pool.acquire() as conn, conn.transaction():
        await add_job(conn, "gang")
        on_n1, on_n2 = await grant(conn, "gang", {"n1": (0,), "n2": (1, 2)})
        ending = plan_end(
            await job(conn, "gang"),
            [on_n1, on_n2],
            "preempted",
            at(10),
            at(20),
            TUNING,
            reporter=on_n1.allocation_id,
        )
        await apply_endings(conn, [ending], at(20), TUNING)
        assert await allocation_repo.free_unlisted(conn, "n2", ["junk"], at(21)) == 2
        held = await conn.fetchval(
            "SELECT count(*) FROM gpu_leases WHERE released_at IS NULL AND node_id = 'n2'"
        )
        assert held == 0


async def heard(conn: asyncpg.Connection, node_id: str, sent_s: float, heard_s: float) -> None:
    """A heartbeat of ``node_id`` listing nothing, sent at ``sent_s`` by its runner's clock,
    handled at ``heard_s`` by the scheduler's."""
    beat = RunnerHeartbeat(
        node_id=node_id,
        hostname=f"{node_id}.local",
        gpu_flavor="cpu",
        gpu_count=8,
        sent_at=at(sent_s),
    )
    handlers = SchedulerHandlers(clock=lambda: at(heard_s), tuning=TUNING)
    await handlers.apply([Delivery(Envelope.wrap(beat, source="runner", subject=node_id))], conn)


async def test_a_runners_clock_neither_frees_held_gpus_early_nor_keeps_them_late(
    pool: asyncpg.Pool,
) -> None:
    """The hold is ordered against the scheduler's own clock, when it handles a heartbeat:
    a heartbeat's ``sent_at`` was compared with ``stopping_since``, so a runner's clock a
    day ahead freed the GPUs with a heartbeat handled in the batch that held them, and one a
    day behind kept them held for that day."""
    async with pool.acquire() as conn, conn.transaction():
        await add_job(conn, "gang")
        on_n1, on_n2 = await grant(conn, "gang", {"n1": (0,), "n2": (1,)})
        ending = plan_end(
            await job(conn, "gang"),
            [on_n1, on_n2],
            "preempted",
            at(10),
            at(20),
            TUNING,
            reporter=on_n1.allocation_id,
        )
        await apply_endings(conn, [ending], at(20), TUNING)
        assert await lease_of(conn, on_n2) == (None, at(20))

        await heard(conn, "n2", sent_s=20 + 86400, heard_s=20)
        assert await lease_of(conn, on_n2) == (None, at(20))

        await heard(conn, "n2", sent_s=21 - 86400, heard_s=21)
        assert await lease_of(conn, on_n2) == (at(21), at(20))


async def test_the_heartbeats_statement_reads_a_few_pages_whatever_the_nodes_past(
    pool: asyncpg.Pool,
) -> None:
    """``free_unlisted`` runs at every heartbeat of every node: the index of live leases
    finds the node's stopping ones without walking the leases its node ever had."""
    history = 5000
    async with pool.acquire() as conn, conn.transaction():
        await add_job(conn, "old")
        await grant(conn, "old", {"n1": (0,)})
        await conn.execute(
            "INSERT INTO allocations (allocation_id, job_id, node_id, epoch, attempt, "
            "gpu_indices, status, granted_at, gang_id, gang_size, borrowed, released_at, outcome) "
            "SELECT id, 'old', 'n1', 100 + i, 0, '{1}', 'RELEASED', $1, id, 1, false, $1, "
            "'succeeded' "
            "FROM (SELECT i, gen_random_uuid() AS id FROM generate_series(1, $2) i) s",
            T0,
            history,
        )
        await conn.execute(
            "INSERT INTO gpu_leases (allocation_id, node_id, gpu_index, released_at) "
            "SELECT allocation_id, 'n1', 1, released_at FROM allocations "
            "WHERE released_at IS NOT NULL"
        )
        await conn.execute("ANALYZE gpu_leases")
        plan = json.loads(
            await conn.fetchval(
                f"EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) {allocation_repo.FREE_UNLISTED}",
                "n1",
                [],
                at(100),
            )
        )[0]
    pages = plan["Plan"]["Shared Hit Blocks"] + plan["Plan"]["Shared Read Blocks"]
    assert pages < 20, f"{pages} pages read for a node with {history} leases in its past"


async def report_failed(
    conn: asyncpg.Connection, allocation: Allocation, failure_kind: Any, heard_s: float
) -> None:
    """``allocation``'s own runner reports, heard at ``heard_s``, that its job failed."""
    failed = JobFailed(
        job_id=allocation.job_id,
        allocation_id=allocation.allocation_id,
        node_id=allocation.node_id,
        epoch=allocation.epoch,
        finished_at=at(100),
        exit_code=None if failure_kind == "platform_error" else 1,
        reason="CUDA error: uncorrectable ECC error",
        failure_kind=failure_kind,
    )
    handlers = SchedulerHandlers(clock=lambda: at(heard_s), tuning=TUNING)
    envelope = Envelope.wrap(failed, source="runner", subject=allocation.job_id)
    await handlers.apply([Delivery(envelope)], conn)


async def lose_n1(conn: asyncpg.Connection) -> Allocation:
    """A job on 2 GPUs of n1, whose last heartbeat came at 100 s, declared lost at 160 s
    on top of 1000 GPU-seconds the team used already: its usage is 1200 then."""
    await add_job(conn, "j", max_restarts=1)
    (allocation,) = await grant(conn, "j", {"n1": (0, 1)})
    await conn.execute("UPDATE nodes SET last_heartbeat = $1 WHERE node_id = 'n1'", at(100))
    await charge_usage(conn, "vision", 1000.0, at(160), HOUR)
    assert await sweep_silent_nodes(conn, at(150), at(160), TUNING) == ["n1"]
    assert await usage(conn, "vision") == (1200.0, at(160))
    return allocation


async def test_a_lost_nodes_late_platform_failure_takes_its_charge_off_the_usage_once(
    pool: asyncpg.Pool,
) -> None:
    """Billing reverses the bill of an allocation whose own runner, back after its node was
    declared lost, reports a platform failure: the scheduler takes the 200 GPU-seconds the
    loss charged off the team's usage, decayed as the usage is (an hour later: 600 - 100),
    and a redelivered report takes nothing more."""
    async with pool.acquire() as conn, conn.transaction():
        allocation = await lose_n1(conn)
        await report_failed(conn, allocation, "platform_error", 160 + HOUR)
        assert await usage(conn, "vision") == (500.0, at(160 + HOUR))
        await report_failed(conn, allocation, "platform_error", 160 + 2 * HOUR)
        assert await usage(conn, "vision") == (500.0, at(160 + HOUR))


async def test_a_lost_nodes_late_user_error_keeps_its_charge_and_settles_it(
    pool: asyncpg.Pool,
) -> None:
    """Its runner's first report is the one billing heeds: a ``user_error`` keeps the charge,
    and a ``platform_error`` after it takes nothing back either."""
    async with pool.acquire() as conn, conn.transaction():
        allocation = await lose_n1(conn)
        await report_failed(conn, allocation, "user_error", 200)
        assert await usage(conn, "vision") == (1200.0, at(160))
        await report_failed(conn, allocation, "platform_error", 300)
        assert await usage(conn, "vision") == (1200.0, at(160))


async def test_a_fenced_members_late_platform_failure_takes_back_its_own_charge_only(
    pool: asyncpg.Pool,
) -> None:
    """n1's runner reports a ``user_error`` after 100 s: both members (100 GPU-seconds each)
    are charged, n2's fenced. n2's runner then reports that it failed through the platform:
    its 100 come off; n1's own later ``platform_error`` takes nothing (its first report
    ended the attempt as the team's)."""
    async with pool.acquire() as conn, conn.transaction():
        await add_job(conn, "j", max_restarts=1)
        on_n1, on_n2 = await grant(conn, "j", {"n1": (0,), "n2": (1,)})
        await report_failed(conn, on_n1, "user_error", 100)
        assert await usage(conn, "vision") == (200.0, at(100))
        await report_failed(conn, on_n1, "platform_error", 100)
        assert await usage(conn, "vision") == (200.0, at(100))
        await report_failed(conn, on_n2, "platform_error", 100)
        assert await usage(conn, "vision") == (100.0, at(100))
