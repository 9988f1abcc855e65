"""Forged events, of every type in the catalogue, against the real services and their users.

The services' consumers run in-process as ``serve`` wires them (scheduler, submission,
registry, billing with their handlers, inbox and outbox on one PostgreSQL database, each in
its own schema; the runner of one node with its node agent), each connected to NATS with the
user the local stack gives it (``deploy.local.nats.service_user``). Every event type of
``shared.events.EVENT_TYPES`` is then

* published by every service user that may not send it (``shared.events.trust``): the
  server refuses it (a permissions violation; nothing reaches the stream);
* published by the test's admin (a connection that may publish any subject) with a source
  that may not send it, with no source at all, on another subject than its type, source
  and routing key give, and routed to another node or job than its payload is about:
  every consumer of that subject dead-letters it with the reason;

and an anonymous client is refused. Then the cases only a consumer can judge: a grant for
another node, grants whose epoch the runner cannot verify, a ``cost.recorded`` not from
billing, releases of allocations the scheduler never announced or announced otherwise.
Throughout, every table of every service schema (inbox and outbox included) is compared
before and after, and the runner's ledger: nothing changes.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import asyncpg
import nats
import pytest
from nats.errors import Error as NatsError
from nats.js import api
from pydantic import SecretStr

from tests.fixtures.uids import job_uid_base
from tests.integration.test_nats_permissions import session
from trainyard_platform.deploy.local.nats import NatsServer, NatsUser, can_authenticate
from trainyard_platform.services.billing import handlers as billing_handlers
from trainyard_platform.services.billing import service as billing_service
from trainyard_platform.services.billing.config import Settings as BillingSettings
from trainyard_platform.services.billing.handlers import BillingHandlers
from trainyard_platform.services.registry import service as registry_service
from trainyard_platform.services.registry.handlers import RegistryHandlers
from trainyard_platform.services.runner import handlers as runner_handlers
from trainyard_platform.services.runner.agent import NodeAgent
from trainyard_platform.services.runner.config import Settings as RunnerSettings
from trainyard_platform.services.runner.domain import JobIdentity
from trainyard_platform.services.runner.gpus import virtual_inventory
from trainyard_platform.services.runner.service import agent_loops
from trainyard_platform.services.scheduler import service as scheduler_service
from trainyard_platform.services.scheduler.loops import LeaderWork
from trainyard_platform.services.scheduler.policy.model import PolicyConfig
from trainyard_platform.services.scheduler.scheduling import Tuning
from trainyard_platform.services.submission import service as submission_service
from trainyard_platform.shared.bus import REASON_HEADER, Bus
from trainyard_platform.shared.db import migrate, open_pool
from trainyard_platform.shared.events import EVENT_TYPES, Envelope, Payload
from trainyard_platform.shared.events.payloads import (
    AllocationGranted,
    AllocationReleased,
    AllocationRevoked,
    BudgetThresholdCrossed,
    BudgetUpdated,
    CheckpointRef,
    CheckpointSaved,
    CostRecorded,
    Environment,
    FlavorDeclared,
    FlavorRetired,
    JobCancelled,
    JobCancelRequested,
    JobFailed,
    JobMetrics,
    JobPending,
    JobPreempted,
    JobProgress,
    JobSpec,
    JobStarted,
    JobSubmitted,
    JobSucceeded,
    Lineage,
    MetricPoint,
    ModelRegistered,
    NodeSupplied,
    RunnerHeartbeat,
)
from trainyard_platform.shared.events.trust import (
    ALLOWED_SOURCES,
    BILLING,
    REGISTRY,
    RUNNER,
    RUNNER_NODE_ONLY,
    SCHEDULER,
    SUBMISSION,
    delegate_key,
    owner,
    routing_key_of,
)
from trainyard_platform.shared.inbox import idempotent, idempotent_batches
from trainyard_platform.shared.outbox import OutboxRelay
from trainyard_platform.shared.settings import DatabaseSettings, NatsSettings, StorageSettings
from trainyard_platform.shared.storage import open_store

pytestmark = pytest.mark.integration

NODE_A = f"forge-a-{uuid.uuid4().hex[:6]}"  # the runner under test
NODE_B = f"forge-b-{uuid.uuid4().hex[:6]}"  # another node: its runner's user only
NODE_X = f"forge-x-{uuid.uuid4().hex[:6]}"  # nobody's
SOURCES = (SUBMISSION, SCHEDULER, RUNNER, REGISTRY, BILLING, "trainyard/mallory")
T0 = datetime(2025, 6, 1, 12, 0, tzinfo=UTC)
WAIT_S = 30.0


# --- a valid payload of every type ------------------------------------------------------


def _spec(gpus: int = 1) -> JobSpec:
    return JobSpec(
        name="forged",
        team="vision",
        user="ada",
        entrypoint="train",
        gpus=gpus,
        gpu_flavor="cpu",
        seed=1,
        max_runtime_seconds=600,
    )


def _checkpoint(job_id: str) -> CheckpointRef:
    uri = f"file:///nowhere/jobs/{job_id}/checkpoints/step-00000001-a0001"
    return CheckpointRef(
        uri=f"{uri}/checkpoint.pt",
        manifest_uri=f"{uri}/manifest.json",
        step=1,
        size_bytes=1,
        sha256="0" * 64,
    )


def _environment() -> Environment:
    return Environment(
        python="3.11",
        torch="2",
        platform="linux",
        hostname="h",
        node_id=NODE_A,
        gpu_flavor="cpu",
    )


SAMPLES: dict[type[Payload], Callable[[str, str, str], Payload]] = {
    # (job id, node id, allocation id) -> a payload a consumer would act on
    JobSubmitted: lambda j, n, a: JobSubmitted(job_id=j, spec=_spec(), submitted_at=T0),
    JobCancelRequested: lambda j, n, a: JobCancelRequested(job_id=j, team="vision", user="ada"),
    AllocationGranted: lambda j, n, a: AllocationGranted(
        allocation_id=a,
        job_id=j,
        node_id=n,
        gpu_indices=[0],
        epoch=10**6,
        attempt=1,
        granted_at=T0,
        spec=_spec(),
    ),
    AllocationRevoked: lambda j, n, a: AllocationRevoked(
        allocation_id=a, job_id=j, node_id=n, epoch=10**6, reason="preempted", grace_seconds=1
    ),
    AllocationReleased: lambda j, n, a: AllocationReleased(
        allocation_id=a,
        job_id=j,
        node_id=n,
        team="vision",
        user="ada",
        gpu_flavor="cpu",
        gpus=1,
        granted_at=T0,
        released_at=T0 + timedelta(hours=1000),
        outcome="succeeded",
    ),
    JobPending: lambda j, n, a: JobPending(job_id=j, reason="forged", position=1),
    JobCancelled: lambda j, n, a: JobCancelled(job_id=j, reason="forged"),
    RunnerHeartbeat: lambda j, n, a: RunnerHeartbeat(
        node_id=n, hostname="h", gpu_flavor="cpu", gpu_count=64, sent_at=datetime.now(UTC)
    ),
    JobStarted: lambda j, n, a: JobStarted(
        job_id=j,
        allocation_id=a,
        node_id=n,
        attempt=1,
        epoch=10**6,
        started_at=T0,
        code_version="forged",
        environment=_environment(),
        spec=_spec(),
    ),
    JobProgress: lambda j, n, a: JobProgress(
        job_id=j, allocation_id=a, step=1, metrics={"loss": 0.0}
    ),
    JobMetrics: lambda j, n, a: JobMetrics(
        job_id=j,
        allocation_id=a,
        node_id=n,
        seq=0,
        points=[MetricPoint(key="loss", step=1, time=T0, value=0.0)],
    ),
    CheckpointSaved: lambda j, n, a: CheckpointSaved(
        job_id=j, allocation_id=a, epoch=10**6, checkpoint=_checkpoint(j), saved_at=T0
    ),
    JobSucceeded: lambda j, n, a: JobSucceeded(
        job_id=j,
        allocation_id=a,
        node_id=n,
        epoch=10**6,
        finished_at=T0,
        metrics={"accuracy": 1.0},
        artifact=_checkpoint(j),
    ),
    JobFailed: lambda j, n, a: JobFailed(
        job_id=j,
        allocation_id=a,
        node_id=n,
        epoch=10**6,
        finished_at=T0,
        exit_code=1,
        reason="forged",
    ),
    JobPreempted: lambda j, n, a: JobPreempted(
        job_id=j, allocation_id=a, node_id=n, epoch=10**6, finished_at=T0, reason="forged"
    ),
    ModelRegistered: lambda j, n, a: ModelRegistered(
        model_version_id=str(uuid.uuid4()),
        model_name="forged",
        version=1,
        team="vision",
        job_id=j,
        artifact_uri="file:///nowhere",
        artifact_sha256="0" * 64,
        metrics={"accuracy": 1.0},
        lineage=Lineage(
            job_id=j,
            spec=_spec(),
            code_version="forged",
            dataset=None,
            seed=1,
            environment=_environment(),
            attempts=1,
        ),
    ),
    CostRecorded: lambda j, n, a: CostRecorded(
        allocation_id=a,
        job_id=j,
        team="vision",
        user="ada",
        gpu_flavor="cpu",
        gpus=1,
        started_at=T0,
        ended_at=T0 + timedelta(hours=1),
        gpu_seconds=3600.0,
        price_per_gpu_hour=10**6,
        cost=10**6,
        currency="USD",
    ),
    # Routed by a flavor's name or a team (``trust.routing_key_of``): the job id stands in.
    FlavorDeclared: lambda j, n, a: FlavorDeclared(name=j, revision=10**9, declared_at=T0),
    FlavorRetired: lambda j, n, a: FlavorRetired(name=j, revision=10**9, retired_at=T0),
    NodeSupplied: lambda j, n, a: NodeSupplied(
        node_id=n, gpu_flavor="cpu", gpu_count=10**2, judged_at=T0
    ),
    BudgetUpdated: lambda j, n, a: BudgetUpdated(
        team=j,
        month="2026-12",
        amount="1",
        spent="2",
        currency="USD",
        policy="refuse",
        exhausted=True,
        revision=10**9,
    ),
    BudgetThresholdCrossed: lambda j, n, a: BudgetThresholdCrossed(
        team=j,
        month="2026-12",
        threshold_percent=100,
        amount="1",
        spent="2",
        currency="USD",
        policy="refuse",
        crossed_at=T0,
    ),
}


def sample(kind: type[Payload], job_id: str, node_id: str = NODE_A) -> Payload:
    return SAMPLES[kind](job_id, node_id, str(uuid.uuid4()))


def test_every_type_in_the_catalogue_has_a_sample() -> None:
    """A new event type fails here until it has a sample, and so is forged below too."""
    assert set(SAMPLES) == set(EVENT_TYPES.values())
    for kind in EVENT_TYPES.values():
        assert sample(kind, "job").TYPE == kind.TYPE


# --- subjects and who reads them ----------------------------------------------------------


def matches(pattern: str, subject: str) -> bool:
    """NATS wildcard matching: ``*`` one token, ``>`` the rest."""
    want, got = pattern.split("."), subject.split(".")
    for i, token in enumerate(want):
        if token == ">":
            return len(got) > i
        if i >= len(got) or token not in ("*", got[i]):
            return False
    return len(got) == len(want)


CONSUMERS: dict[str, list[str]] = {
    "scheduler": scheduler_service.SUBJECTS,
    "submission": submission_service.SUBJECTS,
    "registry": registry_service.SUBJECTS,
    "billing": billing_handlers.SUBJECTS,
    f"runner-{NODE_A}": runner_handlers.subjects(NODE_A),
}
"""Each running consumer and its filter: what reaches whom."""


def readers(subject: str) -> set[str]:
    return {c for c, filters in CONSUMERS.items() if any(matches(f, subject) for f in filters)}


# --- the running platform ---------------------------------------------------------------


@dataclass
class DeadLetters:
    """Everything dead-lettered, by the forged body it carries."""

    by_body: dict[bytes, dict[str, str]] = field(default_factory=dict)

    def record(self, consumer: str, body: bytes, reason: str) -> None:
        self.by_body.setdefault(body, {})[consumer] = reason

    async def wait_for(self, expected: dict[bytes, set[str]], what: str) -> None:
        try:
            async with asyncio.timeout(WAIT_S):
                while any(not want <= set(self.by_body.get(b, {})) for b, want in expected.items()):
                    await asyncio.sleep(0.05)
        except TimeoutError:
            missing = {
                json.loads(b).get("type", b[:80]) if b.startswith(b"{") else b[:80]: sorted(
                    want - set(self.by_body.get(b, {}))
                )
                for b, want in expected.items()
                if not want <= set(self.by_body.get(b, {}))
            }
            raise AssertionError(f"{what}: not dead-lettered by {missing}") from None


def _as(settings: NatsSettings, server: NatsServer, user: NatsUser) -> NatsSettings:
    return settings.model_copy(
        update={"url": server.address, "user": user.name, "password": SecretStr(user.password)}
    )


def _source_of(user: str) -> str:
    return RUNNER if user.startswith("runner-") else f"trainyard/{user}"


@dataclass
class Platform:
    server: NatsServer
    settings: NatsSettings
    admin: Bus
    pools: dict[str, asyncpg.Pool]
    users: dict[str, NatsUser]
    """Every service's NATS user by name; ``runner-<NODE_A>`` runs here, ``runner-<NODE_B>``
    only has a user."""
    agent: NodeAgent
    dead: DeadLetters
    stored: list[bytes]
    """Every message that reached the event stream, in order."""

    @contextlib.asynccontextmanager
    async def bus_of(self, user: str) -> AsyncIterator[Bus]:
        async with Bus.connect(_as(self.settings, self.server, self.users[user]), user) as bus:
            yield bus

    async def snapshot(self) -> dict[str, list[str]]:
        """Every row of every table of every service schema, and the runner's ledger."""
        state: dict[str, list[str]] = {}
        for schema, pool in self.pools.items():
            tables = await pool.fetch(
                "SELECT table_name FROM information_schema.tables "
                "WHERE table_schema = $1 AND table_type = 'BASE TABLE' ORDER BY 1",
                schema,
            )
            for row in tables:
                name = row["table_name"]
                rows = await pool.fetch(f'SELECT * FROM "{schema}"."{name}"')
                state[f"{schema}.{name}"] = sorted(repr(tuple(r.values())) for r in rows)
        ledger = await asyncio.to_thread(self.agent.ledger.entries)
        state["runner.ledger"] = sorted(e.model_dump_json() for e in ledger)
        return state

    async def quiet(self) -> dict[str, list[str]]:
        """A snapshot once nothing changes any more (what came before is all handled)."""
        before = await self.snapshot()
        for _ in range(60):
            await asyncio.sleep(0.5)
            now = await self.snapshot()
            if now == before:
                return now
            before = now
        raise AssertionError("the services never came to rest")

    async def forge(self, subject: str, body: bytes) -> bytes:
        """Publish ``body`` on ``subject`` as the admin (JetStream stores it)."""
        await self.admin.publish_raw(subject, body, f"forged-{uuid.uuid4()}", {})
        return body


@pytest.fixture
async def platform(
    nats_server: NatsServer,
    nats_service_user: Callable[..., NatsUser],
    nats_settings: NatsSettings,
    database_url: str,
    tmp_path: Path,
) -> AsyncIterator[Platform]:
    """The services' consumers and outbox relays, each with its own NATS user, as ``serve``
    wires them; the runner of ``NODE_A`` without heartbeats (they would change the
    scheduler's state while the test compares it)."""
    users = {
        name: nats_service_user(kind, node)
        for name, kind, node in (
            ("submission", "submission", None),
            ("scheduler", "scheduler", None),
            ("registry", "registry", None),
            ("billing", "billing", None),
            (f"runner-{NODE_A}", "runner", NODE_A),
            (f"runner-{NODE_B}", "runner", NODE_B),
        )
    }
    stop = asyncio.Event()
    tasks: list[asyncio.Task[None]] = []
    async with contextlib.AsyncExitStack() as stack:
        admin = await stack.enter_async_context(Bus.connect(nats_settings, "forger"))
        dead, stored = DeadLetters(), []

        async def on_dead(msg: Any) -> None:
            consumer = msg.subject.split(".", 1)[1]
            dead.record(consumer, msg.data, (msg.headers or {}).get(REASON_HEADER, ""))

        async def on_event(msg: Any) -> None:
            stored.append(msg.data)

        for subject, callback in (("deadletter.>", on_dead), ("trainyard.>", on_event)):
            sub = await admin.jetstream.subscribe(
                subject, cb=callback, ordered_consumer=True, deliver_policy=api.DeliverPolicy.ALL
            )
            stack.push_async_callback(sub.unsubscribe)

        pools: dict[str, asyncpg.Pool] = {}
        for schema, migrations in (
            ("submission", submission_service.MIGRATIONS),
            ("scheduler", scheduler_service.MIGRATIONS),
            ("registry", registry_service.MIGRATIONS),
            ("billing", billing_service.MIGRATIONS),
        ):
            database = DatabaseSettings(url=database_url)
            pools[schema] = await stack.enter_async_context(open_pool(database, schema))
            await migrate(pools[schema], schema, migrations)
        await billing_service.seed_prices(
            pools["billing"],
            BillingSettings(prices={"cpu": 1.0}, currency="USD", admin_token=SecretStr("t")),
        )

        async def bus_of(user: str) -> Bus:
            settings = _as(nats_settings, nats_server, users[user])
            return await stack.enter_async_context(Bus.connect(settings, user))

        scheduler = await bus_of("scheduler")
        work = LeaderWork(
            "scheduler",
            pools["scheduler"],
            scheduler,
            CONSUMERS["scheduler"],
            Tuning(PolicyConfig()),
            pass_interval_s=3600,
            node_check_interval_s=3600,
            node_timeout_s=3600,
        )
        tasks.append(asyncio.create_task(work.run(stop)))
        handlers = {
            "submission": submission_service.event_handler(pools["submission"]),
            "registry": idempotent_batches(
                pools["registry"], "registry", RegistryHandlers().dispatch_batch
            ),
            "billing": idempotent(pools["billing"], "billing", BillingHandlers().dispatch),
        }
        for name, handler in handlers.items():
            bus = await bus_of(name)
            consume = bus.consume_batches(name, CONSUMERS[name], handler, stop)
            tasks.append(asyncio.create_task(consume))
            relay = OutboxRelay(pools[name], bus, idle_poll_s=0.1)
            tasks.append(asyncio.create_task(relay.run(stop)))
        relay = OutboxRelay(pools["scheduler"], scheduler, idle_poll_s=0.1)
        tasks.append(asyncio.create_task(relay.run(stop)))

        runner = await bus_of(f"runner-{NODE_A}")
        settings = RunnerSettings(
            node_id=NODE_A,
            job_uid_base=job_uid_base(),
            virtual_gpus=2,
            work_dir=tmp_path / "runner",
            nats=_as(nats_settings, nats_server, users[f"runner-{NODE_A}"]),
            storage=StorageSettings(uri=(tmp_path / "objects").as_uri()),
            admin_token=SecretStr("op-token"),
        )
        store = open_store(settings.storage.uri)
        agent = NodeAgent(settings, runner, store, virtual_inventory(2), stop)
        await agent.recover()
        loops = agent_loops(agent, runner, stop)
        tasks.append(asyncio.create_task(loops.pop("allocations")))
        # The drain too: it removes the node's cgroups when ``stop`` is set.
        tasks.append(asyncio.create_task(loops.pop("drain")))
        for unused in loops.values():
            unused.close()
        try:
            yield Platform(nats_server, nats_settings, admin, pools, users, agent, dead, stored)
        finally:
            stop.set()
            async with asyncio.timeout(30):
                await asyncio.gather(*tasks)


# --- no identity --------------------------------------------------------------------------


async def test_no_identity_no_bus(nats_server: NatsServer) -> None:
    assert not can_authenticate(nats_server.port, None, None)
    assert not can_authenticate(nats_server.port, "scheduler", "guessed")
    with pytest.raises((NatsError, OSError, asyncio.TimeoutError)):
        nc = await nats.connect(nats_server.address, allow_reconnect=False, connect_timeout=2)
        await nc.close()


# --- identities that may not send a type ------------------------------------------------


def refused_subjects(kind: type[Payload], source: str, node: str, job: str) -> list[str]:
    """The subjects of ``kind`` that a user speaking for ``source`` (a runner: of ``node``)
    must be refused, derived from ``shared.events.trust`` alone."""
    by_node = kind in (AllocationGranted, AllocationRevoked, RunnerHeartbeat, JobMetrics)
    own_key = node if by_node else job
    allowed = ALLOWED_SOURCES[kind.TYPE]
    delegates = sorted(allowed - {owner(kind)})
    if source not in allowed:
        return [f"{kind.TYPE}.{own_key}", *(f"{kind.TYPE}.{delegate_key(d)}" for d in delegates)]
    if source != owner(kind):  # a delegate: only its own subject, not the owner's
        return [f"{kind.TYPE}.{job}"]
    refused = [f"{kind.TYPE}.{delegate_key(d)}" for d in delegates]
    if kind in RUNNER_NODE_ONLY:
        refused.append(f"{kind.TYPE}.{NODE_X}")  # another node's
    return refused


async def test_every_type_is_refused_to_every_user_that_may_not_send_it(
    platform: Platform,
) -> None:
    before = await platform.quiet()
    stored = len(platform.stored)
    tried = {kind: 0 for kind in EVENT_TYPES.values()}
    for name, user in platform.users.items():
        source = _source_of(name)
        node = name.removeprefix("runner-") if name.startswith("runner-") else NODE_X
        async with session(platform.server, user) as s:
            for kind in EVENT_TYPES.values():
                job = str(uuid.uuid4())
                payload = sample(kind, job, node)
                envelope = Envelope.wrap(payload, source=source, subject=routing_key_of(payload))
                for subject in refused_subjects(kind, source, node, job):
                    tried[kind] += 1

                    async def send(
                        subject: str = subject, body: bytes = envelope.to_json()
                    ) -> None:
                        await s.nc.publish(subject, body)

                    assert await s._reported(subject, send, 3.0), (name, subject, s.violations)
            # A JetStream publish of a refused subject is never acknowledged.
            kind = CostRecorded if source != BILLING else AllocationGranted
            subject = refused_subjects(kind, source, node, "job")[0]
            with pytest.raises((NatsError, asyncio.TimeoutError)):
                await s.nc.jetstream(timeout=0.5).publish(subject, b"{}")
    assert all(tried.values()), tried  # every type was refused to someone
    await asyncio.sleep(0.5)
    assert len(platform.stored) == stored  # nothing of it reached the stream
    assert await platform.snapshot() == before


# --- forged sources and subjects, from a user that may publish anything ------------------


@dataclass
class Forgery:
    what: str
    subject: str
    body: bytes
    reason: str
    """What every reader's dead-letter reason must contain."""


def forgeries(kind: type[Payload], job: str) -> Iterator[Forgery]:
    """Every way to forge ``kind`` that only a consumer can see through: a source that may not
    send it, no source, another subject than type, source and routing key give, a payload
    about another node or job than it is routed to."""
    payload = sample(kind, job, NODE_A)
    key = routing_key_of(payload)
    for source in SOURCES:
        if source in ALLOWED_SOURCES[kind.TYPE]:
            continue
        envelope = Envelope.wrap(payload, source=source, subject=key)
        yield Forgery(f"from {source}", envelope.nats_subject, envelope.to_json(), source)
    genuine = Envelope.wrap(payload, source=owner(kind), subject=key)
    anonymous = {k: v for k, v in json.loads(genuine.to_json()).items() if k != "source"}
    yield Forgery(
        "without a source", genuine.nats_subject, json.dumps(anonymous).encode(), "source"
    )
    for source in sorted(ALLOWED_SOURCES[kind.TYPE] - {owner(kind)}):
        # The delegate's word on the owner's subject (a runner claiming the scheduler's).
        claim = Envelope.wrap(payload, source=source, subject=key)
        yield Forgery(
            f"{source} on the owner's subject", genuine.nats_subject, claim.to_json(), "travels on"
        )
    by_node = key == NODE_A and kind in (
        AllocationGranted,
        AllocationRevoked,
        RunnerHeartbeat,
        JobMetrics,
    )
    elsewhere = sample(kind, job if by_node else str(uuid.uuid4()), NODE_B)
    other = Envelope.wrap(elsewhere, source=owner(kind), subject=routing_key_of(elsewhere))
    # About node B (or another job), on node A's (this job's) subject ...
    yield Forgery("on another subject", genuine.nats_subject, other.to_json(), "travels on")
    # ... and routed to node A (this job) throughout, but about another.
    misrouted = Envelope.wrap(elsewhere, source=owner(kind), subject=key)
    yield Forgery("routed elsewhere", misrouted.nats_subject, misrouted.to_json(), "routed to")


async def test_forged_sources_and_subjects_are_dead_lettered_and_change_nothing(
    platform: Platform,
) -> None:
    job = str(uuid.uuid4())
    async with platform.bus_of("submission") as submission:  # a job the scheduler knows
        submitted = JobSubmitted(job_id=job, spec=_spec(), submitted_at=datetime.now(UTC))
        await submission.publish(Envelope.wrap(submitted, source=SUBMISSION, subject=job))
    await _until(lambda: _has_job(platform, job))
    before = await platform.quiet()
    stored = len(platform.stored)

    expected: dict[bytes, set[str]] = {}
    reasons: dict[bytes, Forgery] = {}
    for kind in EVENT_TYPES.values():
        for forgery in forgeries(kind, job):
            read_by = readers(forgery.subject)
            assert read_by, (kind.TYPE, forgery.what, forgery.subject)  # someone must judge it
            body = await platform.forge(forgery.subject, forgery.body)
            expected[body], reasons[body] = read_by, forgery
    await platform.dead.wait_for(expected, "forged events")
    for body, forgery in reasons.items():
        for consumer, reason in platform.dead.by_body[body].items():
            assert reason.startswith(("forged event:", "unparseable event:")), (forgery, reason)
            assert forgery.reason in reason, (forgery.what, consumer, reason)
    await asyncio.sleep(0.5)  # anything a forged event set off would have been said by now
    assert await platform.snapshot() == before
    assert set(platform.stored[stored:]) <= set(expected)  # no service said anything


# --- what only a consumer can judge -----------------------------------------------------


async def test_what_only_the_consumer_can_judge_is_dead_lettered_with_the_reason(
    platform: Platform,
) -> None:
    """A grant for another node; a ``cost.recorded`` not from billing; releases of an
    allocation the scheduler never announced, or announced otherwise: every reader rejects
    them and nothing changes."""
    job, ran = str(uuid.uuid4()), str(uuid.uuid4())
    async with platform.bus_of("scheduler") as scheduler:  # an allocation billing knows
        announced = sample(AllocationGranted, job, NODE_X)
        assert isinstance(announced, AllocationGranted)
        await scheduler.publish(Envelope.wrap(announced, source=SCHEDULER, subject=NODE_X))
    await _until(lambda: _announced(platform, announced.allocation_id))
    before = await platform.quiet()

    def scheduler_says(payload: Payload, key: str | None = None) -> Envelope[Payload]:
        return Envelope.wrap(payload, source=SCHEDULER, subject=key or routing_key_of(payload))

    never = sample(AllocationReleased, job, NODE_X)
    otherwise = AllocationReleased(
        **{
            **announced.model_dump(include={"allocation_id", "job_id", "node_id", "granted_at"}),
            "team": "vision",
            "user": "ada",
            "gpu_flavor": "cpu",
            "gpus": 64,
            "released_at": T0 + timedelta(hours=1),
            "outcome": "succeeded",
        },
    )
    cases = {
        "grant for another node": (
            scheduler_says(sample(AllocationGranted, ran, NODE_B), NODE_A),
            "routed to node",
        ),
        "cost not from billing": (
            Envelope.wrap(sample(CostRecorded, job), source=SUBMISSION, subject=job),
            "may come only from trainyard/billing",
        ),
        "release never announced": (scheduler_says(never), "was never announced"),
        "release otherwise than announced": (scheduler_says(otherwise), "gpus differ"),
    }
    expected = {}
    for what, (envelope, _) in cases.items():
        body = await platform.forge(envelope.nats_subject, envelope.to_json())
        expected[body] = readers(envelope.nats_subject)
        assert expected[body], what
    await platform.dead.wait_for(expected, "judged events")
    for what, (envelope, reason) in cases.items():
        for consumer, said in platform.dead.by_body[envelope.to_json()].items():
            assert reason in said, (what, consumer, said)
    await asyncio.sleep(0.5)
    assert await platform.snapshot() == before


async def test_a_runner_runs_no_grant_whose_epoch_it_cannot_verify(platform: Platform) -> None:
    """Epochs come from one ascending sequence: a grant at epoch 0, or one for a job this
    node already had at a later epoch, is stale or forged; the runner dead-letters it and
    runs nothing. Billing, the registry and submission cannot tell such a grant from a real
    one (it comes from the scheduler as far as the bus can see): billing only remembers it
    as announced and as a grant for its waste figures (it meters nothing until a release),
    the registry as granted (it records no run until a start answers it), submission
    records that it saw it."""
    job = str(uuid.uuid4())
    had = JobIdentity(job, str(uuid.uuid4()), NODE_A, 7, 1)  # this node ran it at epoch 7
    await asyncio.to_thread(platform.agent.ledger.ending, had, "{}", {})
    await asyncio.to_thread(platform.agent.ledger.finished, had.allocation_id)
    before = await platform.quiet()
    stored = len(platform.stored)

    zero = sample(AllocationGranted, str(uuid.uuid4()), NODE_A).model_copy(update={"epoch": 0})
    stale = sample(AllocationGranted, job, NODE_A).model_copy(update={"epoch": 5})
    expected, reasons = {}, {}
    for grant, reason in ((zero, "epoch 0 is no fencing epoch"), (stale, "is stale")):
        envelope = Envelope.wrap(grant, source=SCHEDULER, subject=NODE_A)
        body = await platform.forge(envelope.nats_subject, envelope.to_json())
        expected[body], reasons[body] = {f"runner-{NODE_A}"}, reason
    await platform.dead.wait_for(expected, "grants the runner cannot verify")
    for body, reason in reasons.items():
        said = platform.dead.by_body[body][f"runner-{NODE_A}"]
        assert said.startswith("rejected:") and reason in said, said
    await asyncio.sleep(0.5)
    after = await platform.snapshot()
    believed = {
        "billing.announced_allocations",
        "billing.inbox",
        "billing.waste_grants",
        "registry.granted_allocations",
        "registry.inbox",
        "submission.inbox",
    }
    changed = {table for table in before if before[table] != after[table]}
    assert changed <= believed, changed
    assert after["runner.ledger"] == before["runner.ledger"]  # nothing ran
    assert after["billing.usage_ledger"] == before["billing.usage_ledger"]  # nothing metered
    assert set(platform.stored[stored:]) <= set(expected)  # the runner said nothing


async def _until(done: Callable[[], Any], timeout: float = WAIT_S) -> None:
    async with asyncio.timeout(timeout):
        while not await done():
            await asyncio.sleep(0.05)


async def _has_job(platform: Platform, job_id: str) -> bool:
    return bool(
        await platform.pools["scheduler"].fetchval(
            "SELECT true FROM jobs WHERE job_id = $1", job_id
        )
    )


async def _announced(platform: Platform, allocation_id: str) -> bool:
    return bool(
        await platform.pools["billing"].fetchval(
            "SELECT true FROM announced_allocations WHERE allocation_id = $1", allocation_id
        )
    )
