"""The runner running ``examples/ddp_digits.py`` under ``torchrun`` for real, on CPU (gloo):
two processes on one node, and a gang of two nodes (two runners on this machine) with one
process each."""

from __future__ import annotations

import json
import re
import uuid
from datetime import UTC, datetime
from pathlib import Path

import pytest

from tests.fixtures.uids import job_uid_base
from tests.integration.runner.conftest import (
    EventLog,
    StartRunner,
    grant,
    publish,
    upload_bundle,
)
from trainyard_platform.services.runner.config import Settings
from trainyard_platform.shared.bus import Bus
from trainyard_platform.shared.events.payloads import (
    AllocationGranted,
    AllocationRevoked,
    CheckpointSaved,
    CodeBundle,
    GangMember,
    JobFailed,
    JobPreempted,
    JobSpec,
    JobSucceeded,
)
from trainyard_platform.shared.storage import ObjectStore, open_store

pytestmark = pytest.mark.integration

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"
JOB_SPEC = json.loads((EXAMPLES / "ddp_digits.job.json").read_text())
FINAL_WEIGHTS = re.compile(
    r"^\[rank (\d+)\] FINAL_WEIGHTS rank=(\d+) sha256=([0-9a-f]{64})$", re.MULTILINE
)


def ddp_grant(
    node_id: str,
    job_id: str,
    code: CodeBundle,
    gpu_indices: list[int],
    *,
    allocation_id: str | None = None,
    gang: list[GangMember] | None = None,
) -> AllocationGranted:
    """A grant of ``gpu_indices`` of ``node_id`` to the example's job spec."""
    return AllocationGranted(
        allocation_id=allocation_id or str(uuid.uuid4()),
        job_id=job_id,
        node_id=node_id,
        gpu_indices=gpu_indices,
        epoch=1,
        attempt=1,
        granted_at=datetime.now(UTC),
        spec=JobSpec.model_validate(
            {**JOB_SPEC, "team": "team-a", "user": "alice", "max_runtime_seconds": 180}
        ).model_copy(update={"code": code}),
        gang=gang or [],
    )


def log_text(store: ObjectStore, job_id: str, node_id: str) -> str:
    """The job's whole output on ``node_id`` (its stream is complete: it ends in ``end``)."""
    stream = f"logs/{job_id}/a0001-{node_id}"
    keys = store.list(f"{stream}/")
    assert keys and keys[-1] == f"{stream}/end", keys
    return b"".join(store.get_bytes(k) for k in keys if k.endswith(".log")).decode()


def final_weights(store: ObjectStore, job_id: str, node_id: str) -> dict[int, str]:
    """``rank -> sha256`` from the FINAL_WEIGHTS lines of the job's log on ``node_id``,
    each a line of its own prefixed with the rank that printed it."""
    text = log_text(store, job_id, node_id)
    found = FINAL_WEIGHTS.findall(text)
    assert all(prefix == rank for prefix, rank, _ in found), found
    assert len(found) == len({rank for _, rank, _ in found}), text[-3000:]
    return {int(rank): digest for _, rank, digest in found}


def assert_one_checkpoint_per_step(saved: list[CheckpointSaved], last_step: int) -> None:
    """Checkpoints at ``checkpoint_every`` steps and the final step, each at most once
    (rank 0 only; the runner may skip one that a newer one overtook while uploading)."""
    every = int(JOB_SPEC["hyperparameters"]["checkpoint_every"])
    steps = [s.checkpoint.step for s in saved]
    assert steps == sorted(set(steps)), "one checkpoint per step, in order"
    assert steps[-1] == last_step
    assert set(steps) <= {*range(every, last_step, every), last_step}


async def wait_for_ends(events: EventLog, job_id: str, allocations: set[str]) -> None:
    def ended() -> bool:
        failed = events.of(JobFailed, job_id)
        assert not failed, [(f.reason, f.log_tail) for f in failed]
        return {e.allocation_id for e in events.of(JobSucceeded, job_id)} == allocations

    await events.wait_for(ended, timeout=150, what=f"JobSucceeded of {sorted(allocations)}")


@pytest.mark.timeout(240)
async def test_two_processes_on_one_node_train_identical_replicas(
    settings: Settings, start_runner: StartRunner, bus: Bus, events: EventLog
) -> None:
    await start_runner(settings)
    store = open_store(settings.storage.uri)
    code = upload_bundle(store, "team-a", EXAMPLES)
    job_id = f"job-{uuid.uuid4().hex[:8]}"
    allocation = ddp_grant(settings.node_id, job_id, code, [0, 1])
    await publish(bus, allocation, settings.node_id)

    await wait_for_ends(events, job_id, {allocation.allocation_id})
    done = events.of(JobSucceeded, job_id)[0]
    digests = final_weights(store, job_id, settings.node_id)
    assert sorted(digests) == [0, 1]
    assert digests[0] == digests[1]

    saved = events.of(CheckpointSaved, job_id)
    assert done.artifact is not None and done.artifact == saved[-1].checkpoint
    assert_one_checkpoint_per_step(saved, done.artifact.step)
    assert done.metrics["val_accuracy"] > 0.5


@pytest.mark.timeout(240)
async def test_a_gang_of_two_nodes_trains_identical_replicas_and_rank_0_checkpoints(
    settings: Settings,
    start_runner: StartRunner,
    bus: Bus,
    events: EventLog,
    reachable_tmp: Path,
) -> None:
    first = settings
    second = settings.model_copy(
        update={
            "node_id": f"node-{uuid.uuid4().hex[:8]}",
            "job_uid_base": job_uid_base(),
            "work_dir": reachable_tmp / "work-2",
        }
    )
    await start_runner(first)
    await start_runner(second)
    store = open_store(settings.storage.uri)
    code = upload_bundle(store, "team-a", EXAMPLES)
    job_id = f"job-{uuid.uuid4().hex[:8]}"
    a1, a2 = str(uuid.uuid4()), str(uuid.uuid4())
    gang = [
        GangMember(
            node_id=first.node_id, allocation_id=a1, address="127.0.0.1", gpus=1, first_rank=0
        ),
        GangMember(
            node_id=second.node_id, allocation_id=a2, address="127.0.0.1", gpus=1, first_rank=1
        ),
    ]
    grants = [
        ddp_grant(first.node_id, job_id, code, [0], allocation_id=a1, gang=gang),
        ddp_grant(second.node_id, job_id, code, [0], allocation_id=a2, gang=gang),
    ]
    for allocation in grants:
        await publish(bus, allocation, allocation.node_id)

    await wait_for_ends(events, job_id, {a1, a2})
    rank0 = final_weights(store, job_id, first.node_id)
    rank1 = final_weights(store, job_id, second.node_id)
    assert sorted(rank0) == [0] and sorted(rank1) == [1]
    assert rank0[0] == rank1[1]

    saved = events.of(CheckpointSaved, job_id)
    assert {s.allocation_id for s in saved} == {a1}  # none from the second node
    done = {e.allocation_id: e for e in events.of(JobSucceeded, job_id)}
    artifact = done[a1].artifact
    assert artifact is not None and artifact == saved[-1].checkpoint
    assert_one_checkpoint_per_step(saved, artifact.step)
    assert done[a2].artifact is None


@pytest.mark.timeout(240)
async def test_a_revoked_two_process_job_stops_every_rank_at_one_step_and_checkpoints_once(
    settings: Settings, start_runner: StartRunner, bus: Bus, events: EventLog
) -> None:
    await start_runner(settings)
    store = open_store(settings.storage.uri)
    code = upload_bundle(store, "team-a", EXAMPLES)
    job_id = f"job-{uuid.uuid4().hex[:8]}"
    allocation = ddp_grant(settings.node_id, job_id, code, [0, 1])
    long_run = {**JOB_SPEC["hyperparameters"], "epochs": 1000}
    allocation = allocation.model_copy(
        update={"spec": allocation.spec.model_copy(update={"hyperparameters": long_run})}
    )
    await publish(bus, allocation, settings.node_id)
    await events.wait_for(lambda: events.of(CheckpointSaved, job_id), timeout=60)

    # SIGTERM goes to torchrun, which passes it on to both workers; should_stop() is a
    # collective, so they stop at the same step and rank 0 checkpoints it.
    revoked = AllocationRevoked(
        allocation_id=allocation.allocation_id,
        job_id=job_id,
        node_id=settings.node_id,
        epoch=allocation.epoch,
        reason="preempted",
        grace_seconds=20,
    )
    await publish(bus, revoked, settings.node_id)
    preempted = await events.first(JobPreempted, job_id, timeout=60)
    assert preempted.reason == "preempted"
    saved = events.of(CheckpointSaved, job_id)
    steps = [s.checkpoint.step for s in saved]
    assert steps == sorted(set(steps))
    assert preempted.checkpoint is not None and preempted.checkpoint == saved[-1].checkpoint
    text = log_text(store, job_id, settings.node_id)
    stops = dict(re.findall(r"STOPPING rank=(\d+) step=(\d+)", text))
    assert stops == {"0": str(preempted.checkpoint.step), "1": str(preempted.checkpoint.step)}
    assert not events.of(JobFailed, job_id)


@pytest.mark.timeout(240)
async def test_a_failed_worker_under_torchrun_is_reported_with_its_own_exit_code(
    settings: Settings, start_runner: StartRunner, bus: Bus, events: EventLog, tmp_path: Path
) -> None:
    # torchrun exits 1 whatever its worker did: the job's failure said "exited with status
    # 1", hiding the worker's sys.exit(3).
    await start_runner(settings)
    store = open_store(settings.storage.uri)
    folder = tmp_path / "exits"
    folder.mkdir()
    (folder / "exits.py").write_text(
        "import os, sys\nsys.exit(3 if os.environ['RANK'] == '1' else 0)\n"
    )
    code = upload_bundle(store, "team-a", folder)
    allocation = grant(settings.node_id, [], entrypoint="exits.py", code=code, gpu_indices=[0, 1])
    await publish(bus, allocation, settings.node_id)
    failed = await events.first(JobFailed, allocation.job_id, timeout=150)
    assert failed.exit_code == 3, (failed.reason, failed.log_tail)
    assert failed.reason == "rank 1: exited with status 3 (torchrun exited with status 1)"
    assert failed.failure_kind == "user_error"
