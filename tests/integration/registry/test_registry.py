"""The registry against real PostgreSQL and NATS: versions, lineage, idempotency, outbox."""

from __future__ import annotations

import asyncio
import hashlib
import uuid
from datetime import UTC, datetime, timedelta

import asyncpg
import httpx
import pytest
from litestar import Litestar
from pydantic import SecretStr

from tests.integration.registry.conftest import EventLog
from trainyard_platform.services.registry.api import create_app
from trainyard_platform.services.registry.handlers import RegistryHandlers
from trainyard_platform.shared.access import service_guard
from trainyard_platform.shared.bus import Bus, Delivery
from trainyard_platform.shared.events import Envelope, Payload
from trainyard_platform.shared.events.payloads import (
    AllocationGranted,
    CheckpointRef,
    CheckpointSaved,
    Environment,
    JobSpec,
    JobStarted,
    JobSucceeded,
    ModelRegistered,
)
from trainyard_platform.shared.events.trust import RUNNER, owner, routing_key_of
from trainyard_platform.shared.storage import ObjectStore

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("registry")]

T0 = datetime(2025, 3, 1, 12, 0, tzinfo=UTC)
ENV = Environment(
    python="CPython 3.11.9",
    torch="2.13.0",
    platform="Linux-6.1",
    hostname="gpu-host",
    node_id="node-a",
    gpu_flavor="cpu",
    gpu_names=["virtual-cpu-0"],
)


def spec(name: str = "digits", team: str = "vision", *, register_model: bool = True) -> JobSpec:
    return JobSpec(
        name=name,
        team=team,
        user="alice",
        entrypoint="examples.digits_cnn",
        gpus=1,
        gpu_flavor="cpu",
        hyperparameters={"lr": 0.003, "epochs": 2},
        seed=42,
        max_runtime_seconds=600,
        dataset="digits@sklearn-1.5",
        register_model=register_model,
    )


def ref(store: ObjectStore, job_id: str, step: int) -> CheckpointRef:
    """A checkpoint of ``job_id`` at ``step`` committed to ``store`` (the same bytes each
    time, so calling it again names the same checkpoint)."""
    folder = f"jobs/{job_id}/checkpoints/step-{step:08d}"
    data = f"weights of {job_id} at step {step}\n".encode() * (10 + step)
    store.put_bytes(f"{folder}/checkpoint.pt", data)
    return CheckpointRef(
        uri=store.uri_for(f"{folder}/checkpoint.pt"),
        manifest_uri=store.uri_for(f"{folder}/manifest.json"),
        step=step,
        size_bytes=len(data),
        sha256=hashlib.sha256(data).hexdigest(),
    )


def started(
    job_id: str,
    allocation_id: str,
    attempt: int,
    job_spec: JobSpec,
    resumed_from: str | None = None,
) -> JobStarted:
    return JobStarted(
        job_id=job_id,
        allocation_id=allocation_id,
        node_id="node-a",
        attempt=attempt,
        epoch=attempt + 1,
        started_at=T0 + timedelta(minutes=attempt),
        code_version=f"git:{attempt:040x} src:sha256:{'a' * 64}",
        environment=ENV,
        spec=job_spec,
        resumed_from=resumed_from,
    )


def grant_of(start: JobStarted) -> AllocationGranted:
    """The scheduler's grant a genuine ``start`` answers."""
    return AllocationGranted(
        allocation_id=start.allocation_id,
        job_id=start.job_id,
        node_id=start.node_id,
        gpu_indices=[0],
        epoch=start.epoch,
        attempt=start.attempt,
        granted_at=start.started_at,
        spec=start.spec,
    )


def answering(payload: Payload) -> list[Payload]:
    """``payload``, after the scheduler's grant it answers when it is a ``job.started``: the
    registry believes a start only as it was granted."""
    return [grant_of(payload), payload] if isinstance(payload, JobStarted) else [payload]


def envelopes(payload: Payload, subject: str | None = None) -> list[Envelope[Payload]]:
    """``answering(payload)`` as their owners say them (``subject``: ``payload``'s routing
    key when not its own)."""
    return [
        Envelope.wrap(
            said,
            source=owner(said),
            subject=subject if said is payload and subject else routing_key_of(said),
        )
        for said in answering(payload)
    ]


def succeeded(
    job_id: str, allocation_id: str, artifact: CheckpointRef | None, epoch: int = 1
) -> JobSucceeded:
    return JobSucceeded(
        job_id=job_id,
        allocation_id=allocation_id,
        node_id="node-a",
        epoch=epoch,
        finished_at=T0 + timedelta(hours=1),
        metrics={"val_accuracy": 0.97, "loss": 0.08},
        artifact=artifact,
    )


def client_of(app: Litestar) -> httpx.AsyncClient:
    """An HTTP client calling the app in this event loop (where the pool lives)."""
    transport = httpx.ASGITransport(app=app)  # type: ignore[arg-type]
    return httpx.AsyncClient(transport=transport, base_url="http://registry")


async def publish(bus: Bus, payload: Payload, subject: str) -> None:
    for envelope in envelopes(payload, subject):
        await bus.publish(envelope)


def registered(events: EventLog, job_id: str) -> list[ModelRegistered]:
    return [
        e.data for e in events.events if isinstance(e.data, ModelRegistered) and e.subject == job_id
    ]


async def wait_registered(events: EventLog, job_id: str) -> ModelRegistered:
    found: list[ModelRegistered] = await events.wait_for(
        lambda: registered(events, job_id), what=f"model.registered for {job_id}"
    )
    return found[0]


async def version_rows(pool: asyncpg.Pool, job_id: str) -> list[asyncpg.Record]:
    async with pool.acquire() as conn:
        rows: list[asyncpg.Record] = await conn.fetch(
            "SELECT * FROM model_versions WHERE job_id = $1", job_id
        )
        return rows


async def test_a_preempted_then_succeeded_job_is_one_version_with_its_full_lineage(
    bus: Bus, events: EventLog, pool: asyncpg.Pool, store: ObjectStore
) -> None:
    job = f"job-{uuid.uuid4().hex[:8]}"
    job_spec = spec()
    await publish(bus, started(job, "alloc-1", 0, job_spec), job)
    await publish(
        bus,
        CheckpointSaved(
            job_id=job,
            allocation_id="alloc-1",
            epoch=1,
            checkpoint=ref(store, job, 50),
            saved_at=T0,
        ),
        job,
    )
    await publish(
        bus, started(job, "alloc-2", 1, job_spec, resumed_from=ref(store, job, 50).uri), job
    )
    await publish(bus, succeeded(job, "alloc-2", ref(store, job, 120), epoch=2), job)

    event = await wait_registered(events, job)
    assert (event.team, event.model_name, event.version) == ("vision", "digits", 1)
    # The registry's own copy, under its prefix, of the checkpoint the run reported.
    assert event.artifact_uri.startswith(f"{store.root_uri}/registry/vision/digits/")
    assert event.artifact_sha256 == ref(store, job, 120).sha256
    assert event.metrics == {"val_accuracy": 0.97, "loss": 0.08}
    lineage = event.lineage
    assert lineage.job_id == job and lineage.spec == job_spec
    assert lineage.code_version == f"git:{1:040x} src:sha256:{'a' * 64}"
    assert lineage.environment == ENV
    assert (lineage.dataset, lineage.seed) == ("digits@sklearn-1.5", 42)
    assert lineage.attempts == 2
    assert lineage.parent_checkpoints == [ref(store, job, 50).uri]
    assert len(await version_rows(pool, job)) == 1

    # The same through the read API.
    app = create_app(pool, service_guard(SecretStr("s3cret")), [], store=store)
    async with client_of(app) as client:
        client.headers["Authorization"] = "Bearer s3cret"
        listing = await client.get("/v1/models/vision/digits/versions")
        assert listing.status_code == 200
        assert [v["version"] for v in listing.json()["versions"]] == [1]
        detail = await client.get("/v1/models/vision/digits/versions/1")
        assert detail.status_code == 200
        body = detail.json()
        assert body["job_id"] == job and body["allocation_id"] == "alloc-2"
        assert body["artifact"]["uri"] == event.artifact_uri
        assert body["source_uri"] == ref(store, job, 120).uri
        assert body["origin"] == "job_success" and body["owned"] is True
        assert body["lineage"]["parent_checkpoints"] == [ref(store, job, 50).uri]
        assert body["lineage"]["environment"]["hostname"] == "gpu-host"
        assert (await client.get("/v1/models/vision/digits/versions/2")).status_code == 404
        assert (await client.get("/v1/models/vision/nope/versions")).status_code == 404
        assert (await client.get("/v1/models/other/digits/versions")).status_code == 404


async def test_a_redelivered_success_registers_once(
    bus: Bus, events: EventLog, pool: asyncpg.Pool, store: ObjectStore
) -> None:
    job = f"job-{uuid.uuid4().hex[:8]}"
    await publish(bus, started(job, "alloc-1", 0, spec()), job)
    success: Envelope[Payload] = Envelope.wrap(
        succeeded(job, "alloc-1", ref(store, job, 10)), source=RUNNER, subject=job
    )
    await bus.publish(success)
    await wait_registered(events, job)
    # Again under a new event id (the inbox can't tell), and a fenced runner's late success.
    await publish(bus, succeeded(job, "alloc-1", ref(store, job, 10)), job)
    await publish(bus, started(job, "alloc-0", 0, spec()), job)
    await publish(bus, succeeded(job, "alloc-0", ref(store, job, 9)), job)
    barrier = f"job-{uuid.uuid4().hex[:8]}"
    await publish(bus, started(barrier, "alloc-b", 0, spec()), barrier)
    await publish(bus, succeeded(barrier, "alloc-b", ref(store, barrier, 1)), barrier)
    await wait_registered(events, barrier)  # in order: the duplicates were handled before

    assert len(registered(events, job)) == 1
    rows = await version_rows(pool, job)
    assert len(rows) == 1 and rows[0]["allocation_id"] == "alloc-1"
    assert (await version_rows(pool, barrier))[0]["version"] == 2


async def test_a_job_whose_spec_does_not_ask_registers_no_version(
    bus: Bus, events: EventLog, pool: asyncpg.Pool, store: ObjectStore
) -> None:
    job = f"job-{uuid.uuid4().hex[:8]}"
    await publish(bus, started(job, "alloc-1", 0, spec("quiet", register_model=False)), job)
    await publish(bus, succeeded(job, "alloc-1", ref(store, job, 10)), job)
    barrier = f"job-{uuid.uuid4().hex[:8]}"
    await publish(bus, started(barrier, "alloc-b", 0, spec("quiet")), barrier)
    await publish(bus, succeeded(barrier, "alloc-b", ref(store, barrier, 1)), barrier)
    event = await wait_registered(events, barrier)  # in order: the first was handled before

    assert registered(events, job) == [] and await version_rows(pool, job) == []
    assert (event.model_name, event.version) == ("quiet", 1)  # the first took no number


async def test_jobs_of_one_name_are_successive_versions_per_team(
    bus: Bus, events: EventLog, store: ObjectStore
) -> None:
    jobs = [f"job-{uuid.uuid4().hex[:8]}" for _ in range(3)]
    specs = [spec("resnet", "vision"), spec("resnet", "vision"), spec("resnet", "speech")]
    for job, job_spec in zip(jobs, specs, strict=True):
        await publish(bus, started(job, f"alloc-{job}", 0, job_spec), job)
        await publish(bus, succeeded(job, f"alloc-{job}", ref(store, job, 5)), job)
    found = [await wait_registered(events, job) for job in jobs]
    assert [(e.team, e.model_name, e.version) for e in found] == [
        ("vision", "resnet", 1),
        ("vision", "resnet", 2),
        ("speech", "resnet", 1),
    ]
    assert len({e.model_version_id for e in found}) == 3


async def test_a_success_that_overtakes_its_start_is_retried_until_the_start_arrives(
    bus: Bus, events: EventLog, store: ObjectStore
) -> None:
    job = f"job-{uuid.uuid4().hex[:8]}"
    await publish(bus, succeeded(job, "alloc-1", ref(store, job, 3)), job)
    await publish(bus, started(job, "alloc-1", 0, spec("late")), job)
    event = await wait_registered(events, job)
    assert (event.model_name, event.version) == ("late", 1)


async def test_without_a_reported_artifact_the_newest_checkpoint_is_registered(
    bus: Bus, events: EventLog, store: ObjectStore
) -> None:
    job = f"job-{uuid.uuid4().hex[:8]}"
    await publish(bus, started(job, "alloc-1", 0, spec("fallback")), job)
    for step in (10, 30, 20):
        saved = CheckpointSaved(
            job_id=job,
            allocation_id="alloc-1",
            epoch=1,
            checkpoint=ref(store, job, step),
            saved_at=T0,
        )
        await publish(bus, saved, job)
        await publish(bus, saved, job)  # recorded once
    await publish(bus, succeeded(job, "alloc-1", None), job)
    event = await wait_registered(events, job)
    assert event.artifact_sha256 == ref(store, job, 30).sha256


async def test_the_read_api_can_require_the_admin_token(pool: asyncpg.Pool) -> None:
    app = create_app(pool, service_guard(SecretStr("s3cret")), [])
    async with client_of(app) as client:
        assert (await client.get("/v1/models/vision/digits/versions")).status_code == 401
        ok = await client.get(
            "/v1/models/vision/digits/versions", headers={"Authorization": "Bearer s3cret"}
        )
        assert ok.status_code == 404  # authorised; there is no such model


async def test_concurrent_registrations_of_one_model_take_turns(
    pool: asyncpg.Pool, store: ObjectStore
) -> None:
    """Replicas registering versions of one existing model at once: the model row's lock
    makes them take turns (without it several would read the same latest version, and
    all but one would fail on the unique (model, version) constraint)."""
    apply = RegistryHandlers(store).consumer(pool)

    async def handle(envelope: Envelope[Payload]) -> None:
        await apply([Delivery(envelope)])

    jobs = [f"job-{uuid.uuid4().hex[:8]}" for _ in range(6)]
    for job in jobs:
        for envelope in envelopes(started(job, f"a-{job}", 0, spec("race")), job):
            await handle(envelope)

    def success(job: str) -> Envelope[Payload]:
        return Envelope.wrap(
            succeeded(job, f"a-{job}", ref(store, job, 1)), source=RUNNER, subject=job
        )

    await handle(success(jobs[0]))
    await asyncio.gather(*(handle(success(job)) for job in jobs[1:]))
    versions = sorted([(await version_rows(pool, job))[0]["version"] for job in jobs])
    assert versions == [1, 2, 3, 4, 5, 6]
