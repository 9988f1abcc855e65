"""The runner against a real NATS server, running stand-in jobs on virtual GPUs."""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import os
import socket
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from tests.fixtures.git_servers import Listener, git_daemon, git_error
from tests.fixtures.json_log import json_lines
from tests.fixtures.wheel_server import Answer, Wheels, wheel_servers
from tests.integration.runner.conftest import (
    EventLog,
    StartRunner,
    grant,
    launched,
    publish,
    upload_bundle,
)
from trainyard_platform.deploy.local.s3 import S3Server
from trainyard_platform.services.runner import checkpoints, domain, git_remote, launch, supervisor
from trainyard_platform.services.runner.config import Settings
from trainyard_platform.services.runner.ledger import Ledger, safe_file_name
from trainyard_platform.shared.bus import Bus
from trainyard_platform.shared.events import parse_envelope
from trainyard_platform.shared.events.payloads import (
    AllocationGranted,
    AllocationRevoked,
    CheckpointRef,
    CheckpointSaved,
    CodeGit,
    JobFailed,
    JobMetrics,
    JobPreempted,
    JobProgress,
    JobStarted,
    JobSucceeded,
    RunnerHeartbeat,
)
from trainyard_platform.shared.storage import open_store

__all__ = ["wheel_servers"]  # the fixture, used by name
pytestmark = pytest.mark.integration


def trace_id(traceparent: str) -> str:
    return traceparent.split("-")[1]


async def test_heartbeats_announce_the_node_and_its_virtual_gpus(
    settings: Settings, start_runner: StartRunner, events: EventLog
) -> None:
    await start_runner(settings)
    beat = await events.first(RunnerHeartbeat, settings.node_id)
    assert beat.node_id == settings.node_id
    assert beat.gpu_flavor == "cpu"
    assert beat.gpu_count == 2
    assert beat.gpu_names == ["virtual-cpu", "virtual-cpu"]
    assert beat.running_allocations == []


async def test_a_job_is_started_reports_progress_and_checkpoint_and_succeeds(
    settings: Settings,
    start_runner: StartRunner,
    bus: Bus,
    events: EventLog,
    code_dir: Path,
    launches: Path,
) -> None:
    await start_runner(settings)
    allocation = grant(settings.node_id, ["succeed", str(launches)])
    await publish(bus, allocation, settings.node_id)

    done = await events.first(JobSucceeded, allocation.job_id)
    started = await events.first(JobStarted, allocation.job_id)
    assert allocation.spec.code is not None
    assert started.allocation_id == allocation.allocation_id
    assert started.epoch == 3 and started.attempt == 1
    assert started.code_version == f"sha256:{allocation.spec.code.sha256}"
    assert started.environment.code_sha256 == allocation.spec.code.sha256
    assert started.environment.node_id == settings.node_id
    assert started.environment.gpu_names == ["virtual-cpu"]
    assert started.environment.cuda is None
    assert started.spec == allocation.spec
    assert started.resumed_from is None

    # Throttled, but the newest report is never lost.
    progress = events.of(JobProgress, allocation.job_id)
    assert progress and progress[-1].step == 5
    assert progress[-1].metrics == {"loss": pytest.approx(0.2)}
    assert [p.step for p in progress] == sorted({p.step for p in progress})
    # Every point, in batches numbered in order.
    batches = [b for b in events.of(JobMetrics, settings.node_id) if b.job_id == allocation.job_id]
    assert [b.seq for b in batches] == list(range(len(batches)))
    assert [(p.key, p.step, p.value) for b in batches for p in b.points] == [
        ("loss", step, pytest.approx(1.0 / step)) for step in range(1, 6)
    ]

    saved = events.of(CheckpointSaved, allocation.job_id)
    assert [s.checkpoint.step for s in saved] == [5]
    assert saved[0].epoch == 3
    assert done.artifact == saved[0].checkpoint
    assert done.metrics == {"loss": pytest.approx(0.2)}
    assert done.node_id == settings.node_id and done.epoch == 3

    # The job saw its context; the runner kept and uploaded its output.
    store = open_store(settings.storage.uri)
    stream = f"logs/{allocation.job_id}/a0001-{settings.node_id}"
    keys = store.list(f"{stream}/")
    assert keys[-1] == f"{stream}/end"
    log_text = b"".join(store.get_bytes(k) for k in keys if k.endswith(".log")).decode()
    assert f"env {allocation.job_id} 1234 ''" in log_text
    assert "step 5" in log_text and "done" in log_text
    # Every metric report is kept, not only the throttled progress events.
    series_prefix = f"metrics/{allocation.job_id}/a0001-{settings.node_id}"
    series = b"".join(
        store.get_bytes(k) for k in store.list(f"{series_prefix}/") if k.endswith(".jsonl")
    )
    assert [json.loads(line)["step"] for line in series.splitlines()] == [1, 2, 3, 4, 5]
    assert launched(launches) == [allocation.allocation_id]
    # It ran as a user of its own, and its checkpoint went to its own prefix.
    assert (launches / allocation.allocation_id).read_text() in {
        str(uid) for uid in settings.job_uids
    } | ({str(os.getuid())} if os.getuid() != 0 else set())
    assert saved[0].checkpoint.uri == store.uri_for(
        f"jobs/{allocation.job_id}/checkpoints/step-00000005-a0001/checkpoint.pt"
    )
    assert (
        store.get_bytes(f"jobs/{allocation.job_id}/checkpoints/step-00000005-a0001/checkpoint.pt")
        == b"weights at step 5"
    )

    # Every event of the job is in one trace: the one the grant was consumed in; but its
    # progress reports, which are in no trace (shared.bus.UNTRACED_TYPES).
    records = events.records(allocation.job_id)
    assert {type(r.envelope.data) for r in records} >= {
        JobStarted,
        JobProgress,
        CheckpointSaved,
        JobSucceeded,
    }
    reports = [r for r in records if isinstance(r.envelope.data, JobProgress)]
    assert not any("traceparent" in (r.headers or {}) for r in reports)
    traced = [r for r in records if not isinstance(r.envelope.data, JobProgress)]
    assert len({trace_id(r.headers["traceparent"]) for r in traced}) == 1
    # Deterministic ids: the terminal event's is derived from the allocation.
    ends = [r for r in records if isinstance(r.envelope.data, JobSucceeded)]
    assert ends[0].envelope.id == domain.event_id(allocation.allocation_id, "end")


async def test_a_failing_job_is_reported_with_its_log_tail(
    settings: Settings, start_runner: StartRunner, bus: Bus, events: EventLog, launches: Path
) -> None:
    await start_runner(settings)
    allocation = grant(settings.node_id, ["fail", str(launches)])
    await publish(bus, allocation, settings.node_id)

    failed = await events.first(JobFailed, allocation.job_id)
    assert failed.exit_code == 3
    assert failed.reason == "exited with status 3"
    assert failed.failure_kind == "user_error"
    lines = failed.log_tail.splitlines()
    assert len(lines) == settings.log_tail_lines
    assert lines[-1] == "Traceback: something broke"
    assert "noise 59" in lines and "noise 0" not in lines
    assert not events.of(JobSucceeded, allocation.job_id)


async def test_a_revoked_job_checkpoints_and_is_reported_preempted(
    settings: Settings, start_runner: StartRunner, bus: Bus, events: EventLog, launches: Path
) -> None:
    await start_runner(settings)
    allocation = grant(settings.node_id, ["wait", str(launches)])
    await publish(bus, allocation, settings.node_id)
    await events.first(JobProgress, allocation.job_id)
    await events.wait_for(
        lambda: [
            b
            for b in events.of(RunnerHeartbeat, settings.node_id)
            if allocation.allocation_id in b.running_allocations
        ],
        what="heartbeat listing the allocation",
    )

    await publish(
        bus,
        AllocationRevoked(
            allocation_id=allocation.allocation_id,
            job_id=allocation.job_id,
            node_id=settings.node_id,
            epoch=allocation.epoch,
            reason="preempted",
            grace_seconds=20,
            detail="preempted for job j-high: priority high outranks low in queue q",
        ),
        settings.node_id,
    )
    preempted = await events.first(JobPreempted, allocation.job_id)
    # The owner's history says why, not only that it was preempted.
    assert preempted.reason == "preempted for job j-high: priority high outranks low in queue q"
    assert preempted.checkpoint is not None and preempted.checkpoint.step == 7
    assert [s.checkpoint.step for s in events.of(CheckpointSaved, allocation.job_id)] == [7]
    assert not events.of(JobFailed, allocation.job_id)


async def test_a_final_checkpoint_the_runner_refuses_is_never_passed_over(
    settings: Settings, start_runner: StartRunner, bus: Bus, events: EventLog, launches: Path
) -> None:
    """A job whose final checkpoint the runner refused (here: its manifest's sha256 is not
    its object's) succeeded with its previous checkpoint as its artifact, which the
    registry registered as the model; only a warning said so. It now fails as the job's
    own error, naming the refused step, why, and the latest valid one."""
    await start_runner(settings)
    job = grant(settings.node_id, ["refused-final-checkpoint", str(launches)])
    await publish(bus, job, settings.node_id)
    first = await events.first(CheckpointSaved, job.job_id)
    assert first.checkpoint.step == 1

    (launches / "go").touch()  # the job stages a step 2 that does not match its manifest
    failed = await events.first(JobFailed, job.job_id)
    assert failed.failure_kind == "user_error"
    assert failed.exit_code == 0
    assert "its final checkpoint, of step 2, was refused by the runner" in failed.reason
    assert "does not match its manifest" in failed.reason
    assert "the latest valid checkpoint is step 1" in failed.reason
    assert not failed.node_fault
    assert events.of(JobSucceeded, job.job_id) == []
    assert [s.checkpoint.step for s in events.of(CheckpointSaved, job.job_id)] == [1]


async def test_a_job_ignoring_sigterm_is_killed_after_the_grace_and_cancelled(
    settings: Settings, start_runner: StartRunner, bus: Bus, events: EventLog, launches: Path
) -> None:
    await start_runner(settings)
    allocation = grant(settings.node_id, ["ignore-term", str(launches)])
    await publish(bus, allocation, settings.node_id)
    await events.first(JobProgress, allocation.job_id)
    stale = AllocationRevoked(
        allocation_id=allocation.allocation_id,
        job_id=allocation.job_id,
        node_id=settings.node_id,
        epoch=allocation.epoch - 1,
        reason="fenced",
        grace_seconds=0,
    )
    await publish(bus, stale, settings.node_id)  # an older epoch: ignored
    await publish(
        bus,
        stale.model_copy(
            update={"epoch": allocation.epoch, "reason": "cancelled", "grace_seconds": 0.5}
        ),
        settings.node_id,
    )
    preempted = await events.first(JobPreempted, allocation.job_id)
    assert preempted.reason == "cancelled"
    assert preempted.checkpoint is None


async def test_a_job_over_its_max_runtime_fails(
    settings: Settings, start_runner: StartRunner, bus: Bus, events: EventLog, launches: Path
) -> None:
    runner = await start_runner(settings)
    # Its preparation takes none of its second (its deadline's clock stands still): what
    # is checked here is the process's own timer (test_preparation_deadline.py: the
    # preparation counts too).
    runner.agent.clock = lambda: 0.0
    allocation = grant(settings.node_id, ["wait", str(launches)], max_runtime_seconds=1)
    await publish(bus, allocation, settings.node_id)
    failed = await events.first(JobFailed, allocation.job_id)
    assert (
        failed.reason
        == "max runtime exceeded (1 s, counted from its grant, its preparation included)"
    )
    assert failed.exit_code == 75  # it checkpointed on SIGTERM, but too late to matter
    assert "checkpointed on SIGTERM" in failed.log_tail


async def test_a_redelivered_grant_does_not_launch_twice_even_after_a_restart(
    settings: Settings, start_runner: StartRunner, bus: Bus, events: EventLog, launches: Path
) -> None:
    first = await start_runner(settings)
    allocation = grant(settings.node_id, ["succeed", str(launches)])
    await publish(bus, allocation, settings.node_id)
    await publish(bus, allocation, settings.node_id)  # a new event id: not deduplicated
    await events.first(JobSucceeded, allocation.job_id)
    await first.shutdown()
    # What the next runner says again after a broker loss: the start, then the end.
    entry = Ledger(settings.work_dir / "ledger" / safe_file_name(settings.node_id)).get(
        allocation.allocation_id
    )
    assert entry is not None
    assert [parse_envelope(said.encode()).type for said in entry.said()] == [
        JobStarted.TYPE,
        JobSucceeded.TYPE,
    ]

    await start_runner(settings)
    await publish(bus, allocation, settings.node_id)
    # Grants are handled in order: once this one has started, the duplicate was handled.
    barrier = grant(settings.node_id, ["succeed", str(launches)])
    await publish(bus, barrier, settings.node_id)
    await events.first(JobSucceeded, barrier.job_id)

    assert launched(launches) == [allocation.allocation_id, barrier.allocation_id]
    assert len(events.of(JobStarted, allocation.job_id)) == 1
    assert len(events.of(JobSucceeded, allocation.job_id)) == 1


async def test_a_grant_naming_missing_gpus_fails_without_running(
    settings: Settings, start_runner: StartRunner, bus: Bus, events: EventLog, launches: Path
) -> None:
    await start_runner(settings)
    allocation = grant(settings.node_id, ["succeed", str(launches)], gpu_indices=[5])
    await publish(bus, allocation, settings.node_id)
    failed = await events.first(JobFailed, allocation.job_id)
    assert failed.exit_code is None
    assert "do not exist on this node" in failed.reason
    assert failed.node_fault  # the node's own GPUs: it counts towards its cordon
    assert launched(launches) == []
    assert not events.of(JobStarted, allocation.job_id)


async def test_the_job_resumes_only_from_the_checkpoint_its_grant_names(
    settings: Settings,
    start_runner: StartRunner,
    bus: Bus,
    events: EventLog,
    launches: Path,
    code_dir: Path,
) -> None:
    """Every runner node can write any key of the store. A hostile one planted, under the
    job's prefix, a newer checkpoint with a manifest to match it (and a newer one still,
    torn): the next attempt restored the newest folder whose object matched its manifest,
    the attacker's, for the job to load. Now it restores the checkpoint its grant names
    (what the job's own allocation reported committed), verified against the grant, on a
    real S3 endpoint; the forged one is neither staged nor read."""
    with S3Server() as s3:
        storage = s3.storage_settings(f"s3://runner-{uuid.uuid4().hex[:12]}")
        settings = settings.model_copy(update={"storage": storage})
        store = open_store(storage.uri, storage)
        code = upload_bundle(store, "team-a", code_dir)
        allocation = grant(settings.node_id, ["restored", str(launches)], code=code)
        folder = f"jobs/{allocation.job_id}/checkpoints"

        def put(step: int, data: bytes, attempt: int, manifest: bool = True) -> CheckpointRef:
            key = f"step-{step:08d}-a{attempt:04d}"
            store.put_bytes(f"{folder}/{key}/checkpoint.pt", data)
            if manifest:
                said = {
                    "step": step,
                    "object": f"{key}/checkpoint.pt",
                    "size_bytes": len(data),
                    "sha256": hashlib.sha256(data).hexdigest(),
                }
                store.put_bytes(f"{folder}/{key}/manifest.json", json.dumps(said).encode())
            return CheckpointRef(
                uri=store.uri_for(f"{folder}/{key}/checkpoint.pt"),
                manifest_uri=store.uri_for(f"{folder}/{key}/manifest.json"),
                step=step,
                size_bytes=len(data),
                sha256=hashlib.sha256(data).hexdigest(),
            )

        put(10, b"weights 10", attempt=1)
        committed = put(20, b"weights 20", attempt=1)
        put(30, b"cos\nsystem\n(S'touch /tmp/pwned'\ntR.", attempt=9)  # forged, matching
        put(40, b"torn", attempt=9, manifest=False)
        allocation = allocation.model_copy(update={"resume": committed})
        await start_runner(settings)
        await publish(bus, allocation, settings.node_id)
        started = await events.first(JobStarted, allocation.job_id)
        assert started.resumed_from == committed.uri
        await events.first(JobSucceeded, allocation.job_id)
        restored = json.loads((launches / "restored").read_text())
        assert restored == {"step-00000020": "weights 20"}
        # Retention never deletes the checkpoint resumed from or the one just committed.
        kept = {k.split("/")[0] for k in open_store(store.uri_for(folder), storage).list("step-")}
        assert {"step-00000005-a0001", "step-00000020-a0001"} <= kept


async def test_an_attempt_prunes_what_earlier_attempts_left_on_a_real_s3_endpoint(
    settings: Settings,
    start_runner: StartRunner,
    bus: Bus,
    events: EventLog,
    launches: Path,
    code_dir: Path,
) -> None:
    """Retention ran only at an attempt's end, over that attempt's own checkpoints: attempt
    1, whose node died, never pruned, and attempt 2 left its older ones, so every restart
    left a set in the store for good. Attempt 3 resumes from attempt 2's step 9 and, on a
    real S3 endpoint, deletes its predecessors' checkpoints older than that one beyond the
    job's ``checkpoints_keep`` (here 2); the lost attempt's newer one, its own, and another
    job's checkpoints stay."""
    with S3Server() as s3:
        storage = s3.storage_settings(f"s3://runner-{uuid.uuid4().hex[:12]}")
        settings = settings.model_copy(update={"storage": storage, "checkpoints_keep": 2})
        store = open_store(storage.uri, storage)
        code = upload_bundle(store, "team-a", code_dir)
        allocation = grant(settings.node_id, ["restored", str(launches)], code=code)
        folder = f"jobs/{allocation.job_id}/checkpoints"

        def put(job_folder: str, step: int, attempt: int, manifest: bool = True) -> CheckpointRef:
            key = f"step-{step:08d}-a{attempt:04d}"
            data = f"weights {step}".encode()
            store.put_bytes(f"{job_folder}/{key}/checkpoint.pt", data)
            if manifest:
                said = {"step": step, "object": f"{key}/checkpoint.pt", "size_bytes": len(data)}
                store.put_bytes(f"{job_folder}/{key}/manifest.json", json.dumps(said).encode())
            return CheckpointRef(
                uri=store.uri_for(f"{job_folder}/{key}/checkpoint.pt"),
                manifest_uri=store.uri_for(f"{job_folder}/{key}/manifest.json"),
                step=step,
                size_bytes=len(data),
                sha256=hashlib.sha256(data).hexdigest(),
            )

        for step in (1, 2, 3):
            put(folder, step, attempt=1)
        put(folder, 4, attempt=1, manifest=False)  # its node died mid-upload
        put(folder, 12, attempt=1)  # the lost attempt went on past the failover
        for step in (6, 7, 8):
            put(folder, step, attempt=2)
        resumed = put(folder, 9, attempt=2)
        other = f"jobs/job-{uuid.uuid4().hex[:8]}/checkpoints"
        put(other, 1, attempt=1)
        allocation = allocation.model_copy(update={"attempt": 3, "resume": resumed})
        await start_runner(settings)
        await publish(bus, allocation, settings.node_id)
        await events.first(JobSucceeded, allocation.job_id)
        assert json.loads((launches / "restored").read_text()) == {"step-00000009": "weights 9"}
        kept = {k.split("/")[0] for k in open_store(store.uri_for(folder), storage).list("step-")}
        assert kept == {
            "step-00000008-a0002",  # the newest older one: keep 2 with the resumed one
            "step-00000009-a0002",  # resumed from
            "step-00000012-a0001",  # newer than the resumed one: the lost attempt's
            "step-00000005-a0003",  # this attempt's own
        }
        # Marked as resumed by attempt 3: attempt 2, should it still run, keeps it; and
        # the artifact attempt 3 succeeded with, which no later attempt's prune deletes.
        assert store.exists(f"{folder}/step-00000009-a0002/resumed-a0003")
        assert store.exists(f"{folder}/step-00000005-a0003/succeeded-a0003")
        assert store.list(other) == [
            f"{other}/step-00000001-a0001/checkpoint.pt",
            f"{other}/step-00000001-a0001/manifest.json",
        ]


async def test_a_checkpoint_overwritten_since_its_commit_fails_the_job_saying_why(
    settings: Settings, start_runner: StartRunner, bus: Bus, events: EventLog, launches: Path
) -> None:
    """The grant's checkpoint overwritten in the store, its manifest rewritten to match:
    the job is neither started on those bytes nor on an older checkpoint, and its
    ``job.failed`` says which checkpoint was refused and why."""
    allocation = grant(settings.node_id, ["restored", str(launches)])
    store = open_store(settings.storage.uri)
    key = f"jobs/{allocation.job_id}/checkpoints/step-00000020-a0001"
    data = b"weights 20"
    committed = CheckpointRef(
        uri=store.uri_for(f"{key}/checkpoint.pt"),
        manifest_uri=store.uri_for(f"{key}/manifest.json"),
        step=20,
        size_bytes=len(data),
        sha256=hashlib.sha256(data).hexdigest(),
    )
    evil = b"weights 66"
    store.put_bytes(f"{key}/checkpoint.pt", evil)
    said = {
        "step": 20,
        "object": "step-00000020-a0001/checkpoint.pt",
        "size_bytes": len(evil),
        "sha256": hashlib.sha256(evil).hexdigest(),
    }
    store.put_bytes(f"{key}/manifest.json", json.dumps(said).encode())
    await start_runner(settings)
    await publish(bus, allocation.model_copy(update={"resume": committed}), settings.node_id)
    failed = await events.first(JobFailed, allocation.job_id)
    assert failed.failure_kind == "user_error" and not failed.node_fault
    assert "step 20" in failed.reason and "refused" in failed.reason
    assert committed.sha256 in failed.reason
    assert launched(launches) == []
    assert not events.of(JobStarted, allocation.job_id)


async def test_a_restarted_runner_reports_what_its_predecessor_left_unsaid(
    settings: Settings, start_runner: StartRunner, events: EventLog
) -> None:
    ledger = Ledger(settings.work_dir / "ledger" / safe_file_name(settings.node_id))
    lost = domain.JobIdentity("job-lost", "alloc-lost", settings.node_id, 2, 1)
    ledger.launched(lost, {})
    await start_runner(settings)
    preempted = await events.first(JobPreempted, "job-lost")
    assert preempted.allocation_id == "alloc-lost" and preempted.epoch == 2
    assert preempted.reason.startswith("lost")
    entry = ledger.get("alloc-lost")
    assert entry is not None and entry.state is domain.AllocationState.FINISHED


async def test_a_job_that_cannot_be_spawned_fails_with_the_reason(
    settings: Settings, start_runner: StartRunner, bus: Bus, events: EventLog, launches: Path
) -> None:
    broken = settings.model_copy(update={"python": str(settings.work_dir / "no-python")})
    await start_runner(broken)
    allocation = grant(settings.node_id, ["succeed", str(launches)])
    await publish(bus, allocation, settings.node_id)
    failed = await events.first(JobFailed, allocation.job_id)
    assert failed.exit_code is None and failed.failure_kind == "platform_error"
    assert "no-python" in failed.reason
    assert failed.node_fault  # the node's interpreter, not the job's command
    assert not events.of(JobStarted, allocation.job_id)
    assert launched(launches) == []


async def test_a_grant_whose_spec_holds_a_nul_fails_as_the_jobs_own_error(
    settings: Settings, start_runner: StartRunner, bus: Bus, events: EventLog, launches: Path
) -> None:
    """A grant from a producer other than the submission API, with a NUL in its argv: its
    spawn failed as this node's fault (platform_error, node_fault), a job's own input
    counted against the node. The shared model now refuses it, and the runner fails the
    job as user_error naming the field, without running anything."""
    await start_runner(settings)
    allocation = grant(settings.node_id, ["succeed", str(launches)])
    bad = allocation.spec.model_copy(update={"command": ["python", "fake\x00job"]})
    await publish(bus, allocation.model_copy(update={"spec": bad}), settings.node_id)
    failed = await events.first(JobFailed, allocation.job_id)
    assert failed.allocation_id == allocation.allocation_id
    assert failed.failure_kind == "user_error"
    assert not failed.node_fault
    assert failed.exit_code is None
    assert "spec.command[1]: must not contain control characters (found U+0000" in failed.reason
    assert not events.of(JobStarted, allocation.job_id)
    assert launched(launches) == []


async def test_a_git_server_failing_or_a_host_not_resolving_never_counts_against_the_node(
    settings: Settings,
    start_runner: StartRunner,
    bus: Bus,
    events: EventLog,
    launches: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Before: both ended platform_error counted towards the node's cordon, so a tenant
    # pointing jobs at a server answering 503 (or at a host that does not resolve) took the
    # nodes they were placed on out of service. Never held against the node: retried, but a
    # host the resolver answers does not exist, which is the job's own input.
    # (The failing server answers git://: a node fetches by no http://, ``git_remote``.)
    def resolve(host: str, port: int) -> list[str]:
        code = {"gti.example.invalid": socket.EAI_NONAME, "dns.failing.example": socket.EAI_AGAIN}
        raise socket.gaierror(code[host], "as the resolver says")

    monkeypatch.setattr(git_remote, "resolve", resolve)
    with Listener(git_error("Service Unavailable")) as server:
        await start_runner(settings)
        repositories = {
            "unavailable": (f"git://127.0.0.1:{server.port}/team/repo.git", "platform_error"),
            "no such host": ("https://gti.example.invalid/x.git", "user_error"),
            "the resolver failing": ("https://dns.failing.example/x.git", "platform_error"),
        }
        for what, (repository, kind) in repositories.items():
            allocation = grant(settings.node_id, ["succeed", str(launches)])
            code = CodeGit(repository=repository, commit="0" * 40)
            allocation = allocation.model_copy(
                update={"spec": allocation.spec.model_copy(update={"code": code})}
            )
            await publish(bus, allocation, settings.node_id)
            failed = await events.first(JobFailed, allocation.job_id, timeout=60)
            assert failed.failure_kind == kind, what
            assert not failed.node_fault, what
            assert failed.reason.startswith("spec.code.repository: "), failed.reason
        assert server.accepted >= 1, "the failing server was never asked"
    assert launched(launches) == []


async def test_a_repository_by_ssh_fails_as_the_jobs_input_and_is_never_asked(
    settings: Settings,
    start_runner: StartRunner,
    bus: Bus,
    events: EventLog,
    launches: Path,
) -> None:
    """The API refuses ssh, but a grant may come from another producer. git fetches as the
    job's uid, without keys (never the host's): an ssh fetch could never succeed, and
    failed as the platform's, retried on node after node. It fails as the job's input,
    naming the field, before git runs, even on an address the operator allows."""
    with Listener() as server:
        await start_runner(settings)
        allocation = grant(settings.node_id, ["succeed", str(launches)])
        repository = f"ssh://git@127.0.0.1:{server.port}/team/repo.git"
        code = CodeGit(repository=repository, commit="0" * 40)
        spec = allocation.spec.model_copy(update={"code": code})
        await publish(bus, allocation.model_copy(update={"spec": spec}), settings.node_id)
        failed = await events.first(JobFailed, allocation.job_id, timeout=60)
        assert failed.failure_kind == "user_error" and not failed.node_fault
        assert failed.reason.startswith(
            f"spec.code.repository: {repository!r} is an ssh repository, which is not supported"
        ), failed.reason
        assert server.accepted == 0, "git was run for an ssh repository"
    assert launched(launches) == []


@pytest.mark.parametrize("scheme", ["https", "git"])
async def test_a_repository_on_an_address_that_is_not_public_is_never_asked(
    settings: Settings,
    start_runner: StartRunner,
    bus: Bus,
    events: EventLog,
    launches: Path,
    scheme: str,
) -> None:
    """git fetches a job's code in the host's network: a repository on loopback (NATS, the
    object store, any service of the node) was asked, and what it answered came back in
    the job's failure reason (SSRF). Refused as the job's input before anything is sent,
    unless the operator allows the network (``TRAINYARD_RUNNER_FETCH_ALLOW_PRIVATE``)."""
    with Listener() as server:
        repository = f"{scheme}://127.0.0.1:{server.port}/team/repo.git"
        public_only = settings.model_copy(update={"fetch_allow_private": []})
        runner = await start_runner(public_only)
        allocation = grant(public_only.node_id, ["succeed", str(launches)])
        code = CodeGit(repository=repository, commit="0" * 40)
        spec = allocation.spec.model_copy(update={"code": code})
        await publish(bus, allocation.model_copy(update={"spec": spec}), public_only.node_id)
        failed = await events.first(JobFailed, allocation.job_id, timeout=60)
        assert failed.failure_kind == "user_error" and not failed.node_fault
        assert failed.reason.startswith(
            f"spec.code.repository: {repository!r} names the address 127.0.0.1, a loopback "
            "address; this node fetches code only from public addresses"
        ), failed.reason
        assert server.accepted == 0, "the node asked an address the tenant named"
        await runner.shutdown()

        # Allowed by the operator, the same repository is fetched from (and fails: the
        # server answers nothing).
        await start_runner(settings)
        allocation = grant(settings.node_id, ["succeed", str(launches)])
        spec = allocation.spec.model_copy(update={"code": code})
        await publish(bus, allocation.model_copy(update={"spec": spec}), settings.node_id)
        failed = await events.first(JobFailed, allocation.job_id, timeout=60)
        assert failed.reason.startswith("spec.code.repository: "), failed.reason
        assert server.accepted >= 1, "the allowed repository was never asked"
    assert launched(launches) == []


async def test_a_wheel_url_on_an_address_that_is_not_public_is_never_asked(
    settings: Settings, start_runner: StartRunner, bus: Bus, events: EventLog, launches: Path
) -> None:
    """The runner fetches a job's wheel URL in the host's network, as git its code: a
    wheel on loopback (NATS, the object store, any service of the node) was asked, and the
    installer's error text came back in the job's failure reason (SSRF). Refused as the
    job's input before anything is sent, unless the operator allows the network
    (``TRAINYARD_RUNNER_FETCH_ALLOW_PRIVATE``)."""
    with Listener() as server:
        requirement = f"pkg @ https://127.0.0.1:{server.port}/pkg-1.0-py3-none-any.whl"
        public_only = settings.model_copy(update={"fetch_allow_private": []})
        await start_runner(public_only)
        allocation = grant(public_only.node_id, ["succeed", str(launches)])
        spec = allocation.spec.model_copy(update={"requirements": ["tabulate", requirement]})
        await publish(bus, allocation.model_copy(update={"spec": spec}), public_only.node_id)
        failed = await events.first(JobFailed, allocation.job_id, timeout=60)
        assert failed.failure_kind == "user_error" and not failed.node_fault
        assert failed.reason.startswith(
            f"spec.requirements[1]: requirement {requirement!r}: a URL names the address "
            "127.0.0.1, a loopback address; this node fetches wheels only from public addresses"
        ), failed.reason
        assert server.accepted == 0, "the node asked an address the tenant named"
    assert not events.of(JobStarted, allocation.job_id)
    assert launched(launches) == []


async def test_a_wheel_url_that_redirects_fails_the_job_and_the_redirect_is_not_followed(
    settings: Settings,
    start_runner: StartRunner,
    bus: Bus,
    events: EventLog,
    launches: Path,
    wheel_servers: Wheels,
) -> None:
    """The installer followed a wheel URL's redirects, whose targets nobody judged: a public
    server could send the node to ``169.254.169.254`` or its own services. The runner
    downloads the wheel itself and follows none: the job fails as its own input, naming the
    requirement, and the redirect's target is never asked."""
    with Listener() as elsewhere:
        wheel = "/x-1.0-py3-none-any.whl"
        to = f"http://127.0.0.1:{elsewhere.port}/latest/meta-data{wheel}"
        server = wheel_servers.serve({wheel: Answer(302, headers={"Location": to})})
        requirement = f"x @ https://127.0.0.1:{server.port}{wheel}"
        await start_runner(settings)
        allocation = grant(settings.node_id, ["succeed", str(launches)])
        spec = allocation.spec.model_copy(update={"requirements": ["tabulate", requirement]})
        await publish(bus, allocation.model_copy(update={"spec": spec}), settings.node_id)
        failed = await events.first(JobFailed, allocation.job_id, timeout=60)
        assert failed.failure_kind == "user_error" and not failed.node_fault
        assert failed.reason.startswith(
            "spec.requirements[1]: could not build the job's environment: requirement "
            f"{requirement!r}: the server answered 302 Found, a redirect (to {to!r}), and "
            "redirects are not followed"
        ), failed.reason
        assert server.accepted == 1
        assert elsewhere.accepted == 0, "the redirect was followed"
    assert launched(launches) == []


async def test_a_job_whose_requirements_do_not_exist_fails_as_its_own_error(
    settings: Settings, start_runner: StartRunner, bus: Bus, events: EventLog, launches: Path
) -> None:
    await start_runner(settings)
    allocation = grant(settings.node_id, ["succeed", str(launches)])
    spec = allocation.spec.model_copy(update={"requirements": ["trainyard-no-such-pkg-xyz==1.0"]})
    allocation = allocation.model_copy(update={"spec": spec})
    await publish(bus, allocation, settings.node_id)
    failed = await events.first(JobFailed, allocation.job_id)
    assert failed.exit_code is None and failed.failure_kind == "user_error"
    assert "trainyard-no-such-pkg-xyz" in failed.reason and "not found" in failed.reason
    assert not events.of(JobStarted, allocation.job_id)
    assert launched(launches) == []


@pytest.mark.skipif(os.geteuid() != 0, reason="a job user of its own needs a root runner")
async def test_a_process_that_left_the_jobs_session_dies_with_the_job(
    settings: Settings, start_runner: StartRunner, bus: Bus, events: EventLog, launches: Path
) -> None:
    await start_runner(settings)
    allocation = grant(settings.node_id, ["escape", str(launches)])
    await publish(bus, allocation, settings.node_id)
    await events.first(JobSucceeded, allocation.job_id)
    pid = int((launches / "escaped-pid").read_text())
    assert not await asyncio.to_thread(still_alive, pid, 5.0), "the escaped child survived"


def still_alive(pid: int, within_s: float) -> bool:
    """Whether ``pid`` is still a live process (not a zombie) after ``within_s``."""
    deadline = time.monotonic() + within_s
    status = Path(f"/proc/{pid}/status")
    while time.monotonic() < deadline:
        try:
            if "zombie" in status.read_text():
                return False
        except FileNotFoundError:
            return False
        time.sleep(0.1)
    return True


async def test_a_checkpoint_is_uploaded_once_the_store_comes_back(
    settings: Settings,
    start_runner: StartRunner,
    bus: Bus,
    events: EventLog,
    launches: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    real = checkpoints.commit_staged
    failures = iter([ConnectionError("object store down"), ConnectionError("still down")])

    def flaky(*args: Any, **kwargs: Any) -> Any:
        failure = next(failures, None)
        if failure is not None:
            raise failure
        return real(*args, **kwargs)

    monkeypatch.setattr(checkpoints, "commit_staged", flaky)
    await start_runner(settings)
    allocation = grant(settings.node_id, ["succeed", str(launches)])
    await publish(bus, allocation, settings.node_id)
    done = await events.first(JobSucceeded, allocation.job_id)
    saved = events.of(CheckpointSaved, allocation.job_id)
    assert [s.checkpoint.step for s in saved] == [5]
    assert done.artifact == saved[0].checkpoint


async def test_the_runners_copy_of_a_checkpoint_lies_in_its_work_folder(
    settings: Settings,
    start_runner: StartRunner,
    bus: Bus,
    events: EventLog,
    launches: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The runner copies a staged checkpoint before it uploads it (the job could change
    the staged file meanwhile). The copy went to the host's temporary folder: memory where
    ``/tmp`` is a tmpfs (charged to the runner's own cgroup), a container's writable layer
    (the node's root disk) in the runner's pod, for up to ``max_checkpoint_bytes`` a job.
    It lies in the runner's work folder, on the disk sized for jobs."""
    copies: list[Path] = []
    real = checkpoints._copy_confined

    def recording(root: Path, path: Path, dest: Path, *args: Any) -> Any:
        copies.append(dest)
        return real(root, path, dest, *args)

    monkeypatch.setattr(checkpoints, "_copy_confined", recording)
    await start_runner(settings)
    allocation = grant(settings.node_id, ["succeed", str(launches)])
    await publish(bus, allocation, settings.node_id)
    await events.first(JobSucceeded, allocation.job_id)
    assert copies, "no checkpoint was copied"
    work = settings.work_dir.resolve()
    assert all(copy.resolve().is_relative_to(work) for copy in copies), copies
    assert not any(copy.exists() for copy in copies), "the copy is removed once uploaded"


async def test_a_restarted_runner_removes_the_checkpoint_copies_its_predecessor_left(
    settings: Settings, start_runner: StartRunner
) -> None:
    """A runner that dies while it uploads (SIGKILL, OOM, power) leaves its private copy
    of the checkpoint in ``jobs/<job>/``, on the disk sized for jobs: up to
    ``max_checkpoint_bytes`` each, never removed by anything else. The next runner removes
    it before it accepts work, and keeps the logs beside it."""
    jobs = settings.work_dir / "jobs"
    alone = jobs / "job-crashed" / f"{checkpoints.COPY_PREFIX}abc123"
    beside_a_log = jobs / "job-with-log" / f"{checkpoints.COPY_PREFIX}def456"
    for copy in (alone, beside_a_log):
        copy.mkdir(parents=True)
        (copy / checkpoints.OBJECT_NAME).write_bytes(b"x" * 4096)
    log_file = beside_a_log.parent / "alloc-1.log"
    log_file.write_text("a line\n")
    await start_runner(settings)
    assert not alone.parent.exists(), "the copy (and its emptied folder) is removed"
    assert not beside_a_log.exists(), "the copy is removed"
    assert log_file.read_text() == "a line\n", "what else is there stays"


async def test_output_without_end_is_cut_at_the_nodes_limit(
    settings: Settings, start_runner: StartRunner, bus: Bus, events: EventLog, tmp_path: Path
) -> None:
    """A job that prints without end fills neither the node's disk nor the store: past
    ``max_output_bytes`` its output ends with a notice, and so does its metric series."""
    limit = 64 * 1024
    settings = settings.model_copy(update={"max_output_bytes": limit})
    await start_runner(settings)
    store = open_store(settings.storage.uri)
    code_folder = tmp_path / "loud"
    code_folder.mkdir()
    (code_folder / "loud.py").write_text(
        "import json, os, socket\n"
        "control = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)\n"
        "control.connect(os.environ['TRAINYARD_CONTROL_SOCKET'])\n"
        "for i in range(20000):\n"
        "    print('y' * 99, flush=False)\n"
        "    line = {'kind': 'metrics', 'step': i, 'metrics': {'loss': 1.0}}\n"
        "    control.sendall((json.dumps(line) + '\\n').encode())\n"
    )
    code = upload_bundle(store, "team-a", code_folder)
    job = grant(settings.node_id, [], entrypoint="loud.py", code=code)
    await publish(bus, job, settings.node_id)
    await events.first(JobSucceeded, job.job_id)

    def shipped(kind: str) -> bytes:
        prefix = f"{kind}/{job.job_id}/a0001-{settings.node_id}/"
        return b"".join(store.get_bytes(k) for k in sorted(store.list(prefix)) if "chunk-" in k)

    output = shipped("logs")
    assert len(output) < limit + 200, len(output)  # 2 MB printed
    assert output.rstrip().endswith(b"the rest is not kept]")
    series = shipped("metrics")
    assert 0 < len(series) <= limit, len(series)
    assert all(json.loads(line)["metrics"] == {"loss": 1.0} for line in series.splitlines())
    # The points published (which the registry stores) are the series, cut at the same place.
    published = [
        p.step
        for m in events.of(JobMetrics, settings.node_id)
        if m.job_id == job.job_id
        for p in m.points
    ]
    assert published == [json.loads(line)["step"] for line in series.splitlines()]
    # The node's disk keeps none of it once it is in the store (before: every attempt's
    # output and series stayed under work_dir/jobs for good, up to the limit each, so a
    # stream of loud jobs filled the disk and failed later jobs as the node's own fault).
    assert not (settings.work_dir / "jobs" / safe_file_name(job.job_id)).exists()


async def test_a_job_cannot_flood_the_runners_log(
    settings: Settings,
    start_runner: StartRunner,
    bus: Bus,
    events: EventLog,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """What a job sends is warned about in the runner's log a few times per kind; the rest
    are counted, and their number logged once when the job ends."""
    await start_runner(settings)
    store = open_store(settings.storage.uri)
    code_folder = tmp_path / "noisy"
    code_folder.mkdir()
    (code_folder / "noisy.py").write_text(
        "import os, socket\n"
        "control = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)\n"
        "control.connect(os.environ['TRAINYARD_CONTROL_SOCKET'])\n"
        "control.sendall(b'not json\\n' * 1000)\n"
    )
    code = upload_bundle(store, "team-a", code_folder)
    job = grant(settings.node_id, [], entrypoint="noisy.py", code=code)
    with caplog.at_level(logging.WARNING, logger="trainyard_platform.services.runner"):
        await publish(bus, job, settings.node_id)
        await events.first(JobSucceeded, job.job_id)
    warned = [r.getMessage() for r in caplog.records if job.job_id in r.getMessage()]
    bad = [m for m in warned if "sent a bad control line" in m]
    assert 0 < len(bad) <= 5, len(bad)
    assert any("995 more warnings (bad control line) were not logged" in m for m in warned)


RUNNER_LOG = "trainyard_platform.services.runner"


async def test_warnings_about_a_jobs_control_connection_carry_its_job_id(
    settings: Settings, start_runner: StartRunner, bus: Bus, events: EventLog, tmp_path: Path
) -> None:
    await start_runner(settings)
    store = open_store(settings.storage.uri)
    code_folder = tmp_path / "bad-lines"
    code_folder.mkdir()
    (code_folder / "bad.py").write_text(
        "import os, socket\n"
        "control = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)\n"
        "control.connect(os.environ['TRAINYARD_CONTROL_SOCKET'])\n"
        "control.sendall(b'not json\\n' * 10)\n"
    )
    code = upload_bundle(store, "team-a", code_folder)
    job = grant(settings.node_id, [], entrypoint="bad.py", code=code)
    with json_lines(RUNNER_LOG, "runner", logging.WARNING) as lines:
        await publish(bus, job, settings.node_id)
        await events.first(JobSucceeded, job.job_id)
    about_the_job = [line for line in lines.lines if job.job_id in line["message"]]
    bad = [line for line in about_the_job if "sent a bad control line" in line["message"]]
    assert bad
    assert any("more warnings (bad control line)" in line["message"] for line in about_the_job)
    assert all(line.get("job_id") == job.job_id for line in about_the_job), about_the_job


async def test_a_drains_lines_about_each_job_carry_its_job_id(
    settings: Settings, start_runner: StartRunner, bus: Bus, events: EventLog, launches: Path
) -> None:
    runner = await start_runner(settings)
    allocation = grant(settings.node_id, ["wait", str(launches)])
    await publish(bus, allocation, settings.node_id)
    await events.first(JobStarted, allocation.job_id)
    with json_lines(RUNNER_LOG, "runner") as lines:
        await runner.shutdown()
    about_the_job = [line for line in lines.lines if allocation.job_id in line["message"]]
    assert any("stopping job" in line["message"] for line in about_the_job), lines.lines
    assert all(line.get("job_id") == allocation.job_id for line in about_the_job), about_the_job


async def test_a_slow_environment_holds_up_no_other_jobs_launch(
    settings: Settings,
    start_runner: StartRunner,
    bus: Bus,
    events: EventLog,
    launches: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """One job's environment taking minutes to install (here: held until the other job has
    started) does not delay the launch of another job on the node; a revocation that comes
    while it is launched ends it at once, unrun, without waiting for the install (it
    stopped the job only once the install was done and the job ran)."""
    real = launch.prepare
    entered, release = threading.Event(), threading.Event()
    slow = grant(settings.node_id, ["succeed", str(launches)], gpu_indices=[0])
    quick = grant(settings.node_id, ["succeed", str(launches)], gpu_indices=[1])

    def prepare(*args: Any, **kwargs: Any) -> Any:
        if args[0].allocation_id == slow.allocation_id:
            entered.set()
            release.wait(timeout=120)
        return real(*args, **kwargs)

    monkeypatch.setattr(launch, "prepare", prepare)
    runner = await start_runner(settings)
    try:
        await publish(bus, slow, settings.node_id)
        async with asyncio.timeout(30):
            while not entered.is_set():
                await asyncio.sleep(0.05)
        await publish(bus, quick, settings.node_id)
        await events.first(JobSucceeded, quick.job_id)
        assert events.of(JobStarted, slow.job_id) == []
        await publish(
            bus,
            AllocationRevoked(
                allocation_id=slow.allocation_id,
                job_id=slow.job_id,
                node_id=settings.node_id,
                epoch=slow.epoch,
                reason="preempted",
                grace_seconds=0.5,
            ),
            settings.node_id,
        )
        # Ended while its install is still held: the revocation does not wait for it.
        done = await events.first(JobPreempted, slow.job_id)
        assert done.allocation_id == slow.allocation_id
        assert done.reason == "preempted"
    finally:
        release.set()
    await runner.shutdown()
    assert events.of(JobStarted, slow.job_id) == []
    assert not (launches / slow.allocation_id).exists()


async def test_a_job_reporting_metrics_without_bound_is_bounded_and_told(
    settings: Settings, start_runner: StartRunner, bus: Bus, events: EventLog, tmp_path: Path
) -> None:
    """A job reporting in a tight loop, under ever new keys, floods neither the bus nor the
    registry: its series keeps its pace and its first keys, and its log says what went."""
    settings = settings.model_copy(
        update={"metrics_points_per_second": 1.0, "metrics_max_keys": 50}
    )
    await start_runner(settings)
    store = open_store(settings.storage.uri)
    code_folder = tmp_path / "chatty"
    code_folder.mkdir()
    (code_folder / "chatty.py").write_text(
        "import json, os, socket\n"
        "control = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)\n"
        "control.connect(os.environ['TRAINYARD_CONTROL_SOCKET'])\n"
        "for i in range(2000):\n"
        "    line = {'kind': 'metrics', 'step': i, 'metrics': {'loss': 1.0}}\n"
        "    control.sendall((json.dumps(line) + '\\n').encode())\n"
        "keys = {f'key{k}': float(k) for k in range(3000)}\n"
        "line = {'kind': 'metrics', 'step': 2000, 'metrics': keys}\n"
        "control.sendall((json.dumps(line) + '\\n').encode())\n"
    )
    code = upload_bundle(store, "team-a", code_folder)
    job = grant(settings.node_id, [], entrypoint="chatty.py", code=code)
    await publish(bus, job, settings.node_id)
    done = await events.first(JobSucceeded, job.job_id)

    published = [
        p
        for m in events.of(JobMetrics, settings.node_id)
        if m.job_id == job.job_id
        for p in m.points
    ]
    output = b"".join(
        store.get_bytes(k)
        for k in sorted(store.list(f"logs/{job.job_id}/a0001-{settings.node_id}/"))
        if "chunk-" in k
    ).decode()
    notices = [line for line in output.splitlines() if line.startswith("[trainyard: ")]
    left_out = sum(
        int(n.split(" metric points left out")[0].rsplit(" ", 1)[-1])
        for notice in notices
        for n in notice.split("; ")
        if " metric points left out" in n
    )
    assert notices, output
    # Every report is either in the series or counted in a notice: 2000 of 1 point, then
    # one of 50 (the keys beyond the first 50 dropped everywhere).
    assert len(published) + left_out == 2000 + 49, (len(published), left_out)
    assert len(published) < 2000
    assert any("2951 metric values dropped" in notice for notice in notices), notices
    assert len({p.key for p in published}) <= 50
    assert len(done.metrics) <= 50 + 5, len(done.metrics)  # + what the runner measures


async def test_a_running_jobs_environment_is_never_pruned(
    settings: Settings, start_runner: StartRunner, bus: Bus, events: EventLog, launches: Path
) -> None:
    """The cache keeps ``environments_keep`` environments after every build, and never
    removes one a job runs in: a job's environment is held from its start to its end."""
    settings = settings.model_copy(update={"environments_keep": 1})
    await start_runner(settings)

    def with_requirements(allocation: AllocationGranted, requirement: str) -> AllocationGranted:
        spec = allocation.spec.model_copy(update={"requirements": [requirement]})
        return allocation.model_copy(update={"spec": spec})

    running = with_requirements(
        grant(settings.node_id, ["wait", str(launches)], gpu_indices=[0]), "six==1.16.0"
    )
    await publish(bus, running, settings.node_id)
    await events.first(JobStarted, running.job_id, timeout=120)
    other = with_requirements(
        grant(settings.node_id, ["succeed", str(launches)], gpu_indices=[1]), "tabulate==0.9.0"
    )
    await publish(bus, other, settings.node_id)
    await events.first(JobSucceeded, other.job_id, timeout=120)
    published = [
        p.name
        for p in settings.environments_root.iterdir()
        if len(p.name) == 64 and p.is_symlink() and (p / "bin" / "python").exists()
    ]
    assert len(published) == 2, published  # the running job's, and the newest

    await publish(
        bus,
        AllocationRevoked(
            allocation_id=running.allocation_id,
            job_id=running.job_id,
            node_id=settings.node_id,
            epoch=running.epoch,
            reason="preempted",
            grace_seconds=20,
        ),
        settings.node_id,
    )
    preempted = await events.first(JobPreempted, running.job_id)
    assert preempted.checkpoint is not None and preempted.checkpoint.step == 7


async def test_a_repository_that_does_not_exist_fails_as_the_jobs_own_error(
    settings: Settings, start_runner: StartRunner, bus: Bus, events: EventLog, launches: Path
) -> None:
    # Before: platform_error ("git fetch of ... failed"), a failure the scheduler now
    # retries, though every node would fail it the same way: the repository is the job's.
    await start_runner(settings)
    allocation = grant(settings.node_id, ["succeed", str(launches)])
    served = settings.work_dir / "served"
    served.mkdir(parents=True)
    with git_daemon(served) as port:
        code = CodeGit(repository=f"git://127.0.0.1:{port}/no-such-repo", commit="0" * 40)
        allocation = allocation.model_copy(
            update={"spec": allocation.spec.model_copy(update={"code": code})}
        )
        await publish(bus, allocation, settings.node_id)
        failed = await events.first(JobFailed, allocation.job_id)
    assert failed.exit_code is None and failed.failure_kind == "user_error"
    assert failed.reason.startswith("spec.code.repository: no git repository there;")
    assert not events.of(JobStarted, allocation.job_id)
    assert launched(launches) == []


async def test_a_process_that_fails_to_spawn_is_never_said_started(
    settings: Settings,
    start_runner: StartRunner,
    bus: Bus,
    events: EventLog,
    launches: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The runner said job.started before it spawned the process, so a spawn that failed
    # showed the job RUNNING (with a start time) in its history, then failed, though no
    # process of it ever ran. A spawn failure is injected here (the OS refusing the exec).
    async def refused(*args: Any, **kwargs: Any) -> Any:
        raise OSError(8, "Exec format error (injected)")

    monkeypatch.setattr(supervisor.JobProcess, "start", refused)
    await start_runner(settings)
    allocation = grant(settings.node_id, ["succeed", str(launches)])
    await publish(bus, allocation, settings.node_id)
    failed = await events.first(JobFailed, allocation.job_id)
    assert failed.failure_kind == "platform_error" and failed.exit_code is None
    assert "could not start" in failed.reason and "Exec format error" in failed.reason
    assert failed.node_fault
    assert not events.of(JobStarted, allocation.job_id)
    entry = Ledger(settings.work_dir / "ledger" / safe_file_name(settings.node_id)).get(
        allocation.allocation_id
    )
    assert entry is not None
    # A redelivered grant says again only what was said: the end, no start.
    assert [parse_envelope(s.encode()).type for s in entry.said()] == [JobFailed.TYPE]


def processes_naming(text: str) -> list[int]:
    """Pids of the live processes whose command line contains ``text``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            state = next(
                line for line in (entry / "status").read_text().splitlines() if line[:6] == "State:"
            )
        except (OSError, StopIteration):
            continue
        if text in cmdline and "zombie" not in state:
            found.append(int(entry.name))
    return found


async def test_a_process_whose_spawn_cannot_be_recorded_is_killed_and_fails(
    settings: Settings,
    start_runner: StartRunner,
    bus: Bus,
    events: EventLog,
    launches: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    # The ledger write after the spawn failed (a full disk), its error was lost in the launch
    # task, and the job ran on unsupervised, never reported, until the runner restarted.
    def disk_full(*args: Any, **kwargs: Any) -> None:
        raise OSError(28, "No space left on device (injected)")

    monkeypatch.setattr(Ledger, "spawned", disk_full)
    await start_runner(settings)
    allocation = grant(settings.node_id, ["wait", str(launches)])
    await publish(bus, allocation, settings.node_id)
    failed = await events.first(JobFailed, allocation.job_id, timeout=20)
    assert failed.failure_kind == "platform_error"
    assert "could not record" in failed.reason and "No space left" in failed.reason
    assert failed.node_fault
    assert processes_naming(str(launches)) == []
    logged = [
        r
        for r in caplog.records
        if r.levelno >= logging.ERROR and allocation.job_id in r.getMessage() and r.exc_info
    ]
    assert logged, "the failure is logged with the job's id"


async def test_a_launch_that_fails_unexpectedly_is_logged_with_its_job(
    settings: Settings,
    start_runner: StartRunner,
    bus: Bus,
    events: EventLog,
    launches: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    # A launch task whose own failure report failed (the ledger broken) died with no line
    # naming the job: nobody awaited it.
    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("environment broken (injected)")

    def ledger_broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("the ledger is broken (injected)")

    monkeypatch.setattr(launch, "prepare", broken)
    monkeypatch.setattr(Ledger, "ending", ledger_broken)
    runner = await start_runner(settings)
    allocation = grant(settings.node_id, ["succeed", str(launches)])
    await publish(bus, allocation, settings.node_id)

    def said_failed() -> bool:
        return any(
            r.levelno >= logging.ERROR
            and r.name.startswith("trainyard_platform.services.runner")
            and allocation.job_id in r.getMessage()
            and "the ledger is broken" in r.getMessage()
            for r in caplog.records
        )

    async with asyncio.timeout(20):
        while not said_failed():
            await asyncio.sleep(0.1)
    assert not runner.agent.running_allocations()


async def test_a_launch_the_ledger_cannot_record_ends_platform_error(
    settings: Settings,
    start_runner: StartRunner,
    bus: Bus,
    events: EventLog,
    launches: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # With the disk full when the launch was recorded (and its end could not be stored
    # either), the grant waited in the node's consumer as for an outage: no end was said,
    # and the node's later grants waited behind it.
    def disk_full(*args: Any, **kwargs: Any) -> None:
        raise OSError(28, "No space left on device (injected)")

    monkeypatch.setattr(Ledger, "launched", disk_full)
    monkeypatch.setattr(Ledger, "ending", disk_full)
    runner = await start_runner(settings)
    allocation = grant(settings.node_id, ["succeed", str(launches)])
    await publish(bus, allocation, settings.node_id)
    failed = await events.first(JobFailed, allocation.job_id, timeout=20)
    assert failed.failure_kind == "platform_error"
    assert failed.reason.startswith("could not be prepared on this node: ")
    assert "No space left" in failed.reason
    assert failed.node_fault
    assert allocation.allocation_id not in launched(launches)
    await events.wait_for(lambda: not runner.agent.running_allocations(), what="its end")


async def test_an_end_the_ledger_cannot_store_is_published_all_the_same(
    settings: Settings,
    start_runner: StartRunner,
    bus: Bus,
    events: EventLog,
    launches: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # With the disk full, the end of a job was never said: Ledger.ending raised before the
    # publish, and the scheduler waited for the allocation until the runner restarted.
    def disk_full(*args: Any, **kwargs: Any) -> None:
        raise OSError(28, "No space left on device (injected)")

    monkeypatch.setattr(Ledger, "spawned", disk_full)
    monkeypatch.setattr(Ledger, "ending", disk_full)
    runner = await start_runner(settings)
    allocation = grant(settings.node_id, ["wait", str(launches)])
    await publish(bus, allocation, settings.node_id)
    failed = await events.first(JobFailed, allocation.job_id, timeout=20)
    assert failed.failure_kind == "platform_error" and "No space left" in failed.reason
    assert processes_naming(str(launches)) == []
    await events.wait_for(lambda: not runner.agent.running_allocations(), what="its end")
