"""How a job's allocations end, as ``services.scheduler.leases.plan_end`` decides it (no I/O):
what each allocation is released with, what is billed, who is fenced, and what is said on
the runners' behalf."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest

from trainyard_platform.services.billing.domain import Price, Usage
from trainyard_platform.services.scheduler.domain import (
    Allocation,
    AllocationStatus,
    Job,
    JobStatus,
)
from trainyard_platform.services.scheduler.leases import (
    CANCEL_STOP_REASON,
    Ending,
    fence_revocation,
    plan_end,
)
from trainyard_platform.services.scheduler.policy.model import PolicyConfig
from trainyard_platform.services.scheduler.scheduling import Tuning
from trainyard_platform.shared.events.payloads import (
    AllocationReleased,
    AllocationRevoked,
    JobCancelled,
    JobFailed,
    JobPreempted,
    JobSpec,
)
from trainyard_platform.shared.worst_case import KILL_GRACE_SECONDS, attempt_seconds, reservation

T0 = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
TUNING = Tuning(PolicyConfig(), cancel_grace_s=7.0, restart_backoff_s=4.0)


def job(
    status: JobStatus = JobStatus.RUNNING,
    restarts: int = 0,
    max_restarts: int = 2,
    reason: str | None = None,
    platform_retries: int = 0,
) -> Job:
    spec = JobSpec(
        name="mnist",
        team="vision",
        user="ada",
        entrypoint="train.py",
        gpus=3,
        gpu_flavor="a100",
        max_restarts=max_restarts,
        seed=1,
        max_runtime_seconds=3600,
    )
    return Job(
        job_id="job-1",
        spec=spec,
        status=status,
        status_reason=reason,
        attempt=restarts,
        restarts=restarts,
        submitted_at=T0,
        pending_reason=None,
        pending_position=None,
        platform_retries=platform_retries,
    )


def allocation(
    suffix: str, node: str, gpus: tuple[int, ...], epoch: int, granted_s: int
) -> Allocation:
    return Allocation(
        allocation_id=f"00000000-0000-0000-0000-00000000000{suffix}",
        job_id="job-1",
        node_id=node,
        epoch=epoch,
        attempt=0,
        gpu_indices=gpus,
        status=AllocationStatus.RUNNING,
        granted_at=T0 + timedelta(seconds=granted_s),
        gang_id="00000000-0000-0000-0000-00000000000a",
        gang_size=2,
    )


A = allocation("1", "node-a", (0, 1), epoch=11, granted_s=0)
B = allocation("2", "node-b", (3,), epoch=12, granted_s=10)
GANG = (A, B)


def plan(j: Job, kind: Any, reported_s: float, now_s: float, **kw: Any) -> Ending:
    return plan_end(
        j,
        GANG,
        kind,
        T0 + timedelta(seconds=reported_s),
        T0 + timedelta(seconds=now_s),
        TUNING,
        **kw,
    )


def payloads(ending: Ending) -> list[Any]:
    return [envelope.data for envelope, _ in ending.events]


def failed_report(
    kind: Any = "user_error", finished_s: float = 90, node_fault: bool = False
) -> JobFailed:
    return JobFailed(
        job_id="job-1",
        allocation_id=B.allocation_id,
        node_id="node-b",
        epoch=12,
        finished_at=T0 + timedelta(seconds=finished_s),
        exit_code=3,
        reason="exited with status 3",
        log_tail="Traceback ...",
        failure_kind=kind,
        node_fault=node_fault,
    )


def test_a_success_releases_every_member_bills_each_and_fences_none() -> None:
    ending = plan(job(), "succeeded", reported_s=100, now_s=200, reporter=A.allocation_id)
    assert ending.kind == "succeeded" and ending.job.job_id == "job-1"
    assert list(ending.allocations) == [A, B]
    assert ending.decision.job_status is JobStatus.SUCCEEDED
    when = T0 + timedelta(seconds=100)
    assert ending.releases == [
        (A.allocation_id, when, "succeeded"),
        (B.allocation_id, when, "succeeded"),
    ]
    # 2 GPUs for 100 s and 1 GPU for 90 s.
    assert ending.gpu_seconds == 290.0
    said = payloads(ending)
    assert said == [
        AllocationReleased(
            allocation_id=A.allocation_id,
            job_id="job-1",
            node_id="node-a",
            team="vision",
            user="ada",
            gpu_flavor="a100",
            gpus=2,
            granted_at=A.granted_at,
            released_at=when,
            outcome="succeeded",
        ),
        AllocationReleased(
            allocation_id=B.allocation_id,
            job_id="job-1",
            node_id="node-b",
            team="vision",
            user="ada",
            gpu_flavor="a100",
            gpus=1,
            granted_at=B.granted_at,
            released_at=when,
            outcome="succeeded",
        ),
    ]
    assert [envelope.subject for envelope, _ in ending.events] == ["job-1", "job-1"]


def test_release_times_stay_between_the_grant_and_now() -> None:
    # Reported before B's grant and after now: each release is clamped on its own.
    early = plan(job(), "succeeded", reported_s=5, now_s=200)
    assert [r[1] for r in early.releases] == [T0 + timedelta(seconds=5), B.granted_at]
    assert early.gpu_seconds == 10.0  # A: 2 GPUs x 5 s; B: nothing
    late = plan(job(), "succeeded", reported_s=999, now_s=60)
    assert [r[1] for r in late.releases] == [T0 + timedelta(seconds=60)] * 2
    assert late.gpu_seconds == 2 * 60 + 1 * 50


def test_a_job_at_all_its_limits_is_billed_no_more_than_the_worst_case_a_budget_reserves() -> None:
    """The worst case a budget reserves for a job (``shared.worst_case``: its
    ``max_runtime_seconds`` and the kill grace) bounds what its attempt is billed, although
    its allocations are held longer: from the grant, 10 minutes of preparation (code,
    environment, checkpoint restored) before the runner's limit starts, the limit, the
    grace, and the runner's 15 minutes' wait for its last checkpoint's upload."""
    j = job()
    limits = timedelta(seconds=600 + j.spec.max_runtime_seconds + KILL_GRACE_SECONDS + 900)
    reported = B.granted_at + limits
    ending = plan(j, "failed", reported_s=(reported - T0).total_seconds(), now_s=99_999)
    released = [p for p in payloads(ending) if isinstance(p, AllocationReleased)]
    assert [r.released_at for r in released] == [
        a.granted_at + timedelta(seconds=attempt_seconds(j.spec.max_runtime_seconds)) for a in GANG
    ]
    assert [r[1] for r in ending.releases] == [r.released_at for r in released]
    assert ending.gpu_seconds == 3 * attempt_seconds(j.spec.max_runtime_seconds)
    price = Price("a100", Decimal("2.5"), "USD")
    billed = sum(Usage.from_release(r, price).cost for r in released)
    rates = {"a100": {"gpu_hour": "2.5"}}
    assert billed <= reservation(j.spec.model_dump(), rates)


def test_a_restartable_failure_fences_the_other_members_and_says_each_preempted() -> None:
    ending = plan(
        job(restarts=0),
        "failed",
        reported_s=90,
        now_s=100,
        reporter=B.allocation_id,
        failed=failed_report(),
    )
    decision = ending.decision
    assert decision.requeued and decision.restart and decision.backoff_s == 4.0
    assert [r[2] for r in ending.releases] == ["failed", "failed"]
    said = payloads(ending)
    assert [type(p) for p in said] == [
        AllocationReleased,
        AllocationRevoked,  # A: not the reporter
        AllocationReleased,  # B reported: it stopped by itself
        JobPreempted,
        JobPreempted,
    ]
    revoke = said[1]
    assert revoke == AllocationRevoked(
        allocation_id=A.allocation_id,
        job_id="job-1",
        node_id="node-a",
        epoch=11,
        reason="fenced",
        grace_seconds=7.0,
    )
    ids = [envelope.id for envelope, _ in ending.events]
    assert ids[1] == f"fence:{A.allocation_id}:node-a"
    assert ending.events[1][0].subject == "node-a"
    assert ids[3:] == [f"said-preempted:{A.allocation_id}", f"said-preempted:{B.allocation_id}"]
    reported = T0 + timedelta(seconds=90)
    assert said[3] == JobPreempted(
        job_id="job-1",
        allocation_id=A.allocation_id,
        node_id="node-a",
        epoch=11,
        finished_at=reported,
        reason=decision.reason,
    )
    assert said[4].node_id == "node-b" and said[4].epoch == 12
    assert said[4].finished_at == reported
    assert decision.reason is not None and "restarting in 4 s" in decision.reason


def test_a_final_failure_says_job_failed_about_the_reporter_with_its_report() -> None:
    ending = plan(
        job(platform_retries=TUNING.platform_retries),  # the platform's retries used up
        "failed",
        reported_s=90,
        now_s=100,
        reporter=B.allocation_id,
        failed=failed_report("platform_error", finished_s=95),
    )
    assert ending.decision.job_status is JobStatus.FAILED
    said = payloads(ending)
    assert [type(p) for p in said] == [
        AllocationReleased,
        AllocationRevoked,
        AllocationReleased,
        JobFailed,
    ]
    envelope = ending.events[-1][0]
    assert envelope.id == f"said-failed:{B.allocation_id}"
    assert envelope.subject == "job-1"
    assert said[-1] == JobFailed(
        job_id="job-1",
        allocation_id=B.allocation_id,
        node_id="node-b",
        epoch=12,
        finished_at=T0 + timedelta(seconds=95),
        exit_code=3,
        reason=ending.decision.reason,
        log_tail="Traceback ...",
        failure_kind="platform_error",
    )
    assert "failed through the platform 4 times" in said[-1].reason


def test_the_failure_said_for_a_report_from_the_future_ends_at_now() -> None:
    ending = plan(
        job(),
        "failed",
        reported_s=90,
        now_s=100,
        reporter=B.allocation_id,
        failed=failed_report("max_runtime", finished_s=500),
    )
    assert payloads(ending)[-1].finished_at == T0 + timedelta(seconds=100)


def test_a_lost_gang_out_of_restarts_fails_about_its_first_member_at_now() -> None:
    ending = plan(job(restarts=2, max_restarts=2), "lost", reported_s=50, now_s=80)
    assert ending.decision.job_status is JobStatus.FAILED
    said = payloads(ending)
    # No reporter: every member is fenced.
    assert [type(p) for p in said] == [
        AllocationReleased,
        AllocationRevoked,
        AllocationReleased,
        AllocationRevoked,
        JobFailed,
    ]
    assert [p.node_id for p in said[:4]] == ["node-a", "node-a", "node-b", "node-b"]
    assert [r[2] for r in ending.releases] == ["lost", "lost"]
    assert said[-1] == JobFailed(
        job_id="job-1",
        allocation_id=A.allocation_id,
        node_id="node-a",
        epoch=11,
        finished_at=T0 + timedelta(seconds=80),
        exit_code=None,
        reason=ending.decision.reason,
        log_tail="",
        failure_kind="node_lost",
    )
    assert ending.events[-1][0].id == f"said-failed:{A.allocation_id}"


def test_a_lost_gang_with_restarts_left_is_said_preempted_with_the_reason() -> None:
    ending = plan(job(restarts=0), "lost", reported_s=50, now_s=80)
    said = payloads(ending)
    assert [type(p) for p in said][-2:] == [JobPreempted, JobPreempted]
    assert said[-1].reason == "node lost; requeued for attempt 2 (restart 1 of 2)"
    assert ending.decision.backoff_s == 0


def test_a_preemption_requeues_without_saying_anything_for_the_runner() -> None:
    ending = plan(job(), "preempted", reported_s=50, now_s=80, reporter=A.allocation_id)
    assert ending.decision.requeued and not ending.decision.restart
    said = payloads(ending)
    assert [type(p) for p in said] == [AllocationReleased, AllocationReleased, AllocationRevoked]
    assert [r[2] for r in ending.releases] == ["preempted", "preempted"]


def preempted_report(reason: str) -> JobPreempted:
    return JobPreempted(
        job_id="job-1",
        allocation_id=A.allocation_id,
        node_id="node-a",
        epoch=11,
        finished_at=T0 + timedelta(seconds=50),
        reason=reason,
    )


def test_a_preemption_its_runner_reports_as_a_cancels_stop_is_said_preempted() -> None:
    """The submission service leaves a job whose stop's reason is ``cancelled`` as it was,
    waiting for the scheduler's ``job.cancelled`` (the registry's cancel request may be
    handled after the stop it caused). A runner saying so of a job nobody cancelled would
    keep it RUNNING in the job's view while it waits in its queue: the scheduler, which
    knows, says the preemption itself. A cancelled job's stop, or a preemption reported
    with its own reason, is said as before."""
    report = preempted_report(CANCEL_STOP_REASON)
    ending = plan(job(), "preempted", 50, 80, reporter=A.allocation_id, preempted=report)
    assert ending.decision.requeued and not ending.decision.restart
    said = [p for p in payloads(ending) if isinstance(p, JobPreempted)]
    assert [(p.allocation_id, p.reason) for p in said] == [
        (A.allocation_id, "preempted"),
        (B.allocation_id, "preempted"),
    ]
    assert [e.id for e, _ in ending.events][-2:] == [
        f"said-preempted:{A.allocation_id}",
        f"said-preempted:{B.allocation_id}",
    ]

    own = preempted_report("preempted by job-2 (fair share)")
    ending = plan(job(), "preempted", 50, 80, reporter=A.allocation_id, preempted=own)
    assert JobPreempted not in [type(p) for p in payloads(ending)]

    cancelling = job(JobStatus.CANCELLING)
    ending = plan(cancelling, "preempted", 50, 80, reporter=A.allocation_id, preempted=report)
    assert ending.decision.job_status is JobStatus.CANCELLED
    assert JobPreempted not in [type(p) for p in payloads(ending)]


@pytest.mark.parametrize(("reason", "said"), [("by ada", "by ada"), (None, "cancelled")])
def test_a_cancelled_job_is_said_cancelled_with_its_reason(reason: str | None, said: str) -> None:
    ending = plan(job(JobStatus.CANCELLING, reason=reason), "failed", reported_s=50, now_s=80)
    assert ending.decision.job_status is JobStatus.CANCELLED
    last = ending.events[-1][0]
    assert last.data == JobCancelled(job_id="job-1", reason=said)
    assert last.subject == "job-1"
    assert [type(p) for p in payloads(ending)].count(JobCancelled) == 1


def test_an_ending_without_allocations_bills_and_says_nothing() -> None:
    ending = plan_end(job(), [], "failed", T0, T0, TUNING, failed=failed_report("max_runtime"))
    assert ending.decision.job_status is JobStatus.FAILED
    assert ending.events == [] and ending.releases == [] and ending.gpu_seconds == 0.0


def test_a_platform_failure_requeues_saying_so_without_using_a_restart() -> None:
    ending = plan(
        job(max_restarts=0),
        "failed",
        reported_s=90,
        now_s=100,
        reporter=B.allocation_id,
        failed=failed_report("platform_error", finished_s=95),
    )
    decision = ending.decision
    assert (decision.job_status, decision.restart, decision.platform_retry) == (
        JobStatus.QUEUED,
        False,
        True,
    )
    said = [p for p in payloads(ending) if isinstance(p, JobPreempted)]
    assert [p.allocation_id for p in said] == [A.allocation_id, B.allocation_id]
    assert said[0].reason == decision.reason
    assert decision.reason is not None and "(platform retry 1 of 3;" in decision.reason


@pytest.mark.parametrize("platform_retries", [0, TUNING.platform_retries])
def test_a_platform_failure_is_said_on_every_member_s_release(platform_retries: int) -> None:
    """One runner's ``platform_error`` ends the whole attempt, retried or final: the fenced
    member's release says it too, so billing charges neither to the team."""
    ending = plan(
        job(platform_retries=platform_retries),
        "failed",
        reported_s=90,
        now_s=100,
        reporter=B.allocation_id,
        failed=failed_report("platform_error", finished_s=95),
    )
    released = [p for p in payloads(ending) if isinstance(p, AllocationReleased)]
    assert [(r.allocation_id, r.platform_failure) for r in released] == [
        (A.allocation_id, True),
        (B.allocation_id, True),
    ]


@pytest.mark.parametrize(
    ("kind", "report"),
    [
        ("failed", failed_report("user_error")),
        ("failed", failed_report("out_of_memory")),
        ("failed", None),
        ("lost", None),
        ("preempted", None),
        ("succeeded", None),
    ],
)
def test_no_other_ending_says_a_platform_failure(kind: Any, report: JobFailed | None) -> None:
    ending = plan(job(), kind, reported_s=90, now_s=100, reporter=B.allocation_id, failed=report)
    released = [p for p in payloads(ending) if isinstance(p, AllocationReleased)]
    assert len(released) == 2 and not any(r.platform_failure for r in released)


@pytest.mark.parametrize("platform_retries", [0, TUNING.platform_retries])
def test_an_attempt_failed_through_the_platform_adds_nothing_to_the_team_s_usage(
    platform_retries: int,
) -> None:
    """Billing charges such an attempt, every member of it, to the platform; the team's fair
    share must not count it either (before, its 2x90 + 1x80 GPU-seconds were charged)."""
    ending = plan(
        job(platform_retries=platform_retries),
        "failed",
        reported_s=90,
        now_s=100,
        reporter=B.allocation_id,
        failed=failed_report("platform_error", finished_s=95),
    )
    assert len(ending.releases) == 2
    assert ending.gpu_seconds == 0.0


@pytest.mark.parametrize(
    ("kind", "report"),
    [
        ("failed", failed_report("user_error")),
        ("failed", failed_report("out_of_memory")),
        ("failed", None),
        ("lost", None),
        ("preempted", None),
        ("succeeded", None),
    ],
)
def test_every_other_ending_charges_the_members_time_to_the_team(
    kind: Any, report: JobFailed | None
) -> None:
    """The job's own failure, a lost node, a preemption and a success are the team's, as in
    billing: 2 GPUs from 0 s and 1 GPU from 10 s, released at 90 s."""
    ending = plan(job(), kind, reported_s=90, now_s=100, reporter=B.allocation_id, failed=report)
    assert ending.gpu_seconds == 2 * 90 + 1 * 80


def test_a_fence_revocation_is_one_event_per_allocation_and_node() -> None:
    envelope, _ = fence_revocation(A, "node-z", 2.5)
    assert envelope.id == f"fence:{A.allocation_id}:node-z"
    assert envelope.subject == "node-z"
    assert envelope.data == AllocationRevoked(
        allocation_id=A.allocation_id,
        job_id="job-1",
        node_id="node-z",
        epoch=11,
        reason="fenced",
        grace_seconds=2.5,
    )


def test_the_restart_back_off_is_capped_by_the_tuning() -> None:
    capped = Tuning(PolicyConfig(), restart_backoff_s=40.0, restart_backoff_max_s=25.0)
    ending = plan_end(job(), GANG, "failed", T0, T0, capped, failed=failed_report())
    assert ending.decision.backoff_s == 25.0
    assert ending.decision.reason is not None and "restarting in 25 s" in ending.decision.reason


def test_a_report_without_an_exit_code_says_the_job_never_ran() -> None:
    # The runner's job.failed of a job whose requirements cannot be met (user_error, exit
    # code null) requeued it with a back-off, to fail the same way again.
    report = failed_report().model_copy(update={"exit_code": None})
    ending = plan_end(job(), GANG, "failed", T0, T0, TUNING, failed=report)
    assert ending.decision.job_status is JobStatus.FAILED and not ending.decision.restart
    assert "never ran is not restarted" in (ending.decision.reason or "")
