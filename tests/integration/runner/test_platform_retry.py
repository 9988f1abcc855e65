"""A platform failure is retried: the scheduler and a runner on the real bus, database and
object store. The first attempt fails through the platform (the runner's disk full when it
records the job's process: ``platform_error``); the scheduler requeues the job without
using up its ``max_restarts`` (0 here), and the second attempt succeeds."""

from __future__ import annotations

import errno
from pathlib import Path
from typing import Any

import pytest

from tests.integration.runner.conftest import CODE_FOR_NODE, EventLog, StartRunner, launched
from tests.integration.scheduler import conftest as scheduler_fixtures
from tests.integration.scheduler.conftest import Tuned, until
from trainyard_platform.services.runner import launch
from trainyard_platform.services.runner.config import Settings
from trainyard_platform.services.runner.ledger import Ledger
from trainyard_platform.shared.events.payloads import (
    AllocationGranted,
    JobFailed,
    JobPreempted,
    JobSucceeded,
)

pytestmark = pytest.mark.integration

# The scheduler's fixtures (its own conftest is not this folder's): a fresh, migrated
# database and the scheduler's leader work with its outbox relay.
pool = scheduler_fixtures.pool
scheduler_with = scheduler_fixtures.scheduler_with


async def test_a_job_whose_first_attempt_fails_through_the_platform_succeeds_on_retry(
    scheduler_with: Tuned,
    settings: Settings,
    start_runner: StartRunner,
    events: EventLog,
    launches: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Before: the scheduler failed the job at its first platform_error ("platform_error:
    # the runner could not record the job's process: ...; platform_error is not restarted
    # (attempt 1)"), although nothing was wrong with the job.
    real_spawned = Ledger.spawned
    full = [True]

    def disk_full_once(self: Ledger, *args: Any, **kwargs: Any) -> Any:
        if full.pop() if full else False:
            raise OSError(errno.ENOSPC, "No space left on device (injected)")
        return real_spawned(self, *args, **kwargs)

    monkeypatch.setattr(Ledger, "spawned", disk_full_once)
    scheduler = await scheduler_with(restart_backoff_s=0.2, platform_retries=3)
    await start_runner(settings)
    await scheduler.submit(
        "job-retry",
        gpus=1,
        flavor=settings.gpu_flavor,
        team="team-a",
        entrypoint="fakejob",
        args=["succeed", str(launches)],
        code=CODE_FOR_NODE[settings.node_id],
        max_restarts=0,
    )

    done = await events.first(JobSucceeded, "job-retry", timeout=60)
    grants = scheduler.events(AllocationGranted, lambda g: g.job_id == "job-retry")
    assert [g.attempt for g in grants] == [0, 1]
    assert done.allocation_id == grants[1].allocation_id
    # The first attempt: the runner's platform_error, then the scheduler's requeue.
    (failed,) = events.of(JobFailed, "job-retry")
    assert failed.allocation_id == grants[0].allocation_id
    assert failed.failure_kind == "platform_error" and "No space left" in failed.reason
    assert failed.node_fault  # the node's own disk: it counts towards its cordon
    (said,) = scheduler.events(JobPreempted, lambda p: p.job_id == "job-retry")
    assert said.reason.startswith("attempt 1 failed (platform_error: ")
    assert "(platform retry 1 of 3; max_restarts not used)" in said.reason
    query = "SELECT status, restarts, platform_retries FROM jobs WHERE job_id = 'job-retry'"

    async def succeeded() -> bool:
        return (await scheduler.pool.fetchval(query)) == "SUCCEEDED"

    await until(succeeded)  # the scheduler applies the runner's report
    row = await scheduler.pool.fetchrow(query)
    assert (row["status"], row["restarts"], row["platform_retries"]) == ("SUCCEEDED", 0, 1)
    assert grants[1].allocation_id in launched(launches)


async def test_a_full_disk_while_a_grant_is_prepared_ends_it_and_the_job_is_retried(
    scheduler_with: Tuned,
    settings: Settings,
    start_runner: StartRunner,
    events: EventLog,
    launches: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Before: the disk full when the sandbox was made (before the ledger knew the
    # allocation) counted as an outage: the node's grant consumer waited, the job stayed
    # ALLOCATED there, and neither the platform retry nor the cordon followed.
    real_create = launch.create_sandbox
    full = [True]

    def disk_full_once(*args: Any, **kwargs: Any) -> Any:
        if full.pop() if full else False:
            raise OSError(errno.ENOSPC, "No space left on device (injected)")
        return real_create(*args, **kwargs)

    monkeypatch.setattr(launch, "create_sandbox", disk_full_once)
    scheduler = await scheduler_with(restart_backoff_s=0.2, platform_retries=3)
    await start_runner(settings)
    await scheduler.submit(
        "job-full-disk",
        gpus=1,
        flavor=settings.gpu_flavor,
        team="team-a",
        entrypoint="fakejob",
        args=["succeed", str(launches)],
        code=CODE_FOR_NODE[settings.node_id],
        max_restarts=0,
    )

    done = await events.first(JobSucceeded, "job-full-disk", timeout=60)
    grants = scheduler.events(AllocationGranted, lambda g: g.job_id == "job-full-disk")
    assert [g.attempt for g in grants] == [0, 1]
    assert done.allocation_id == grants[1].allocation_id
    (failed,) = events.of(JobFailed, "job-full-disk")
    assert failed.allocation_id == grants[0].allocation_id
    assert failed.failure_kind == "platform_error"
    assert failed.reason.startswith("could not be prepared on this node: ")
    assert "No space left" in failed.reason
    assert failed.node_fault
    assert grants[0].allocation_id not in launched(launches)


async def test_a_command_no_node_has_is_retried_but_never_cordons_the_node(
    scheduler_with: Tuned,
    settings: Settings,
    start_runner: StartRunner,
    events: EventLog,
    launches: Path,
) -> None:
    # Before: a spec.command naming a program not on PATH ended "could not start: [Errno 2]
    # ..." as the node's own platform_error, so a tenant's few such jobs cordoned every
    # node they were placed on (here: after 2). Now it is retried (the node may lack what
    # another has) and fails for good, and the node stays in service.
    scheduler = await scheduler_with(
        restart_backoff_s=0.1, platform_retries=2, cordon_after_platform_failures=2
    )
    await start_runner(settings)
    await scheduler.submit(
        "job-no-program",
        gpus=1,
        flavor=settings.gpu_flavor,
        team="team-a",
        entrypoint="",
        command=["trainyard-no-such-program"],
        code=CODE_FOR_NODE[settings.node_id],
        max_restarts=0,
    )
    query = "SELECT status FROM jobs WHERE job_id = 'job-no-program'"

    async def failed_for_good() -> bool:
        return bool((await scheduler.pool.fetchval(query)) == "FAILED")

    await until(failed_for_good)

    def runner_reports() -> list[JobFailed]:
        return [
            r.envelope.data
            for r in events.records("job-no-program")
            if isinstance(r.envelope.data, JobFailed) and r.envelope.source == "trainyard/runner"
        ]

    # The first attempt and its 2 platform retries.
    await events.wait_for(lambda: len(runner_reports()) == 3, what="3 runner reports")
    reports = runner_reports()
    for failed in reports:
        assert failed.failure_kind == "platform_error" and not failed.node_fault
        assert failed.reason.startswith("spec.command: 'trainyard-no-such-program' cannot be run")
    row = await scheduler.pool.fetchrow(
        "SELECT cordoned_at, platform_failures FROM nodes WHERE node_id = $1", settings.node_id
    )
    assert (row["cordoned_at"], row["platform_failures"]) == (None, 0)

    # The node still takes work.
    await scheduler.submit(
        "job-after",
        gpus=1,
        flavor=settings.gpu_flavor,
        team="team-a",
        entrypoint="fakejob",
        args=["succeed", str(launches)],
        code=CODE_FOR_NODE[settings.node_id],
    )
    await events.first(JobSucceeded, "job-after", timeout=60)
