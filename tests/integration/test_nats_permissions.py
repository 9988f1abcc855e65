"""NATS lets in only its users, and each service only to its own subjects.

The server is started the way the local stack starts it (``deploy.local.stack``): one user
per service and per runner node from ``deploy.local.nats.service_user``, no admin. A denied
publish or subscription does not raise in nats-py: the server answers ``-ERR 'Permissions
Violation ...'``, which reaches the connection's error callback, and the message is dropped.
A PING after it returns only once the server has read the operation, so after ``flush()``
the verdict on everything sent before it is in.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import stat
import subprocess
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import nats
import pytest
from nats.aio.client import Client as NatsClient
from nats.errors import Error as NatsError
from nats.errors import TimeoutError as NatsTimeoutError
from nats.js import JetStreamContext
from pydantic import SecretStr

from trainyard_platform.deploy.local.nats import (
    COMPOSE_USERS,
    NatsServer,
    NatsUser,
    can_authenticate,
    compose_config,
    find_nats_binary,
    password_variable,
    render_config,
    service_user,
    service_user_name,
)
from trainyard_platform.deploy.local.stack import RUNNER_NODE_ID, SERVICES
from trainyard_platform.services.runner import domain as runner_domain
from trainyard_platform.services.runner.publishing import publish_until_sent
from trainyard_platform.shared.bus import (
    NATS_NOT_ANSWERING,
    Bus,
    Reject,
    attempts_subject,
    dedup_key,
    infrastructure_fault,
    keyed_msg_id,
)
from trainyard_platform.shared.events import Envelope, Payload, nats_subject
from trainyard_platform.shared.events.payloads import (
    AllocationGranted,
    AllocationReleased,
    AllocationRevoked,
    CheckpointRef,
    CheckpointSaved,
    CostRecorded,
    JobCancelRequested,
    JobFailed,
    JobPreempted,
    JobProgress,
    JobSpec,
    JobStarted,
    JobSubmitted,
    JobSucceeded,
    RunnerHeartbeat,
)
from trainyard_platform.shared.events.trust import RUNNER, SCHEDULER, node_subjects
from trainyard_platform.shared.settings import NatsSettings

NODE_A = RUNNER_NODE_ID
NODE_B = "local-node-2"
NODE_X = "node-x"  # nobody's: what is published there is consumed by no test


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NatsServer]:
    users = [service_user(kind, NODE_A if kind == "runner" else None) for kind in SERVICES]
    users.append(service_user("runner", NODE_B))
    folder = tmp_path_factory.mktemp("nats-permissions")
    with NatsServer(folder / "nats", log_path=folder / "nats.log", users=users) as running:
        yield running


def _user(server: NatsServer, kind: str, node_id: str | None = None) -> NatsUser:
    name = service_user_name(kind, node_id)
    return next(user for user in server.users if user.name == name)


@dataclass
class Session:
    """A connection as one service, recording the permission violations the server reports."""

    nc: NatsClient
    violations: list[str] = field(default_factory=list)

    async def _reported(
        self, subject: str, action: Callable[[], Awaitable[object]], wait_s: float
    ) -> bool:
        """Whether the server reports a violation naming ``subject`` after ``action``. The
        verdict usually comes before the PONG of a flush, but not always right after
        connecting, so this waits ``wait_s`` for it."""
        await action()
        await self.nc.flush(timeout=5)
        deadline = asyncio.get_running_loop().time() + wait_s
        # nats-py lower-cases the server's error text.
        while not any(f'"{subject.lower()}"' in v.lower() for v in self.violations):
            if asyncio.get_running_loop().time() > deadline:
                return False
            await asyncio.sleep(0.02)
        return True

    async def may_publish(self, subject: str) -> bool:
        return not await self._reported(subject, lambda: self.nc.publish(subject, b"{}"), 0.3)

    async def publish_denied(self, subject: str) -> bool:
        return await self._reported(subject, lambda: self.nc.publish(subject, b"{}"), 3.0)

    async def may_subscribe(self, subject: str) -> bool:
        return not await self._reported(subject, lambda: self.nc.subscribe(subject), 0.3)

    async def subscribe_denied(self, subject: str) -> bool:
        return await self._reported(subject, lambda: self.nc.subscribe(subject), 3.0)

    async def api_denied(self, subject: str, call: Callable[[], Awaitable[object]]) -> bool:
        """A JetStream API request that is denied gets no answer (a timeout) and a report."""

        async def expect_no_answer() -> None:
            with pytest.raises((NatsError, asyncio.TimeoutError)):
                await call()

        return await self._reported(subject, expect_no_answer, 3.0)


@contextlib.asynccontextmanager
async def session(server: NatsServer, user: NatsUser) -> AsyncIterator[Session]:
    violations: list[str] = []

    async def on_error(exc: Exception) -> None:
        if "permissions violation" in str(exc).lower():
            violations.append(str(exc))

    nc = await nats.connect(
        server.address,
        user=user.name,
        password=user.password,
        inbox_prefix=f"_INBOX.{user.name}",
        error_cb=on_error,
        allow_reconnect=False,
    )
    try:
        yield Session(nc, violations)
    finally:
        await nc.close()


def _settings(server: NatsServer, user: NatsUser) -> NatsSettings:
    return NatsSettings(
        url=server.address,
        user=user.name,
        password=user.password,
        publish_timeout_seconds=3,
        retry_delay_seconds=0.05,
    )


def _subject(payload: type[Payload], key: str | None = None) -> str:
    return nats_subject(payload, key or str(uuid.uuid4()))


# --- who gets in ---------------------------------------------------------------------


def test_the_config_file_is_private_and_anonymous_clients_are_refused(
    server: NatsServer,
) -> None:
    assert server.authenticated
    assert stat.S_IMODE(server.config_path.stat().st_mode) == 0o600
    assert server.url == server.address  # no admin: nothing with every permission
    assert not can_authenticate(server.port, None, None)
    scheduler = _user(server, "scheduler")
    assert not can_authenticate(server.port, scheduler.name, "wrong")
    assert can_authenticate(server.port, scheduler.name, scheduler.password)


async def test_nats_py_cannot_connect_anonymously(server: NatsServer) -> None:
    with pytest.raises((NatsError, OSError, asyncio.TimeoutError)):
        nc = await nats.connect(server.address, allow_reconnect=False, connect_timeout=2)
        await nc.close()


def test_a_server_started_without_users_is_not_anonymous(tmp_path: Path) -> None:
    """A bare ``NatsServer`` (benchmarks, the server's own tests) gets a fresh admin; there is
    no configuration without an ``authorization`` block."""
    with pytest.raises(ValueError, match="anonymous"):
        render_config([], port=4222, server_name="x", store_dir=tmp_path)
    with NatsServer(tmp_path / "nats", log_path=tmp_path / "nats.log") as bare:
        assert bare.admin is not None and bare.authenticated
        assert bare.url != bare.address and bare.admin.password in bare.url
        assert not can_authenticate(bare.port, None, None)
        assert can_authenticate(bare.port, bare.admin.name, bare.admin.password)


def test_passwords_stay_out_of_reprs_and_settings_dumps(server: NatsServer) -> None:
    user = _user(server, "billing")
    assert user.password not in repr(user)
    settings = _settings(server, user)
    assert user.password not in repr(settings)
    assert user.password not in str(settings.model_dump())


# --- what each service may publish and subscribe ---------------------------------------


async def test_the_scheduler_makes_the_streams_and_the_others_wait_for_them(
    tmp_path: Path,
) -> None:
    users = [service_user(kind, NODE_A if kind == "runner" else None) for kind in SERVICES]
    with NatsServer(tmp_path / "nats", log_path=tmp_path / "nats.log", users=users) as fresh:

        async def connect(user: NatsUser) -> None:
            async with Bus.connect(_settings(fresh, user), user.name) as bus:
                assert await bus.ping()

        others = [user for user in users if user.name != "scheduler"]
        waiting = [asyncio.create_task(connect(user)) for user in others]
        await asyncio.sleep(1.5)
        done = [task.exception() for task in waiting if task.done()]
        assert not done, done  # none of them may make the streams: they wait
        await connect(_user(fresh, "scheduler"))
        await asyncio.wait_for(asyncio.gather(*waiting), 10)


async def test_only_the_scheduler_may_create_or_change_the_streams(server: NatsServer) -> None:
    """A service that could change a stream could shorten its retention or drop its subjects;
    every service but the scheduler may only read a stream's info."""
    async with Bus.connect(_settings(server, _user(server, "scheduler")), "setup"):
        pass  # the streams exist
    shorter = json.dumps({"name": "TRAINYARD", "subjects": ["trainyard.>"], "max_age": 10**9})
    for user in server.users:
        if user.name == "scheduler":
            continue
        async with session(server, user) as s:
            for op in ("UPDATE", "CREATE"):
                for stream in ("TRAINYARD", "TRAINYARD_DEADLETTER", "TRAINYARD_ATTEMPTS"):
                    subject = f"$JS.API.STREAM.{op}.{stream}"

                    async def change(subject: str = subject, nc: NatsClient = s.nc) -> None:
                        await nc.request(subject, shorter.encode(), timeout=0.25)

                    assert await s.api_denied(subject, change), (user.name, subject)
            info = await s.nc.jetstream(timeout=2).stream_info("TRAINYARD")
            assert info.config.max_age != 1.0  # unchanged
    async with session(server, _user(server, "scheduler")) as s:
        for op in ("UPDATE", "CREATE"):
            assert await s.may_publish(f"$JS.API.STREAM.{op}.TRAINYARD")


@pytest.mark.parametrize(
    ("kind", "node_id", "allowed", "denied"),
    [
        (
            "scheduler",
            None,
            [
                _subject(AllocationGranted, NODE_X),
                _subject(AllocationReleased),
                _subject(JobFailed, "by-scheduler"),
                _subject(JobPreempted, "by-scheduler"),
            ],
            [
                _subject(JobSubmitted),
                _subject(CostRecorded),
                "deadletter.billing",
                _subject(JobFailed),  # a runner's subject: the scheduler says its own
                _subject(JobPreempted),
            ],
        ),
        (
            "runner",
            NODE_A,
            [
                f"trainyard.runner.heartbeat.v1.{NODE_A}",
                f"{_subject(JobStarted)}.{NODE_A}",
                f"{_subject(JobSucceeded)}.{NODE_A}",
                f"deadletter.runner-{NODE_A}",
            ],
            [
                _subject(AllocationGranted, NODE_A),
                _subject(AllocationRevoked, NODE_B),
                f"trainyard.runner.heartbeat.v1.{NODE_B}",
                f"deadletter.runner-{NODE_B}",
                "something.else",
                _subject(JobFailed, "by-scheduler"),  # the scheduler's decision, not a report
                _subject(JobPreempted, "by-scheduler"),
                _subject(JobFailed, "by-scheduler") + ".x",
                # A report names its node in its subject: only its own (not a gang peer's).
                _subject(JobStarted),
                f"{_subject(JobSucceeded)}.{NODE_B}",
                f"{_subject(JobProgress)}.{NODE_B}",
                f"{_subject(CheckpointSaved)}.{NODE_B}",
            ],
        ),
        (
            "billing",
            None,
            [_subject(CostRecorded)],
            [_subject(AllocationReleased), _subject(AllocationGranted, NODE_A)],
        ),
        (
            "submission",
            None,
            [_subject(JobSubmitted), _subject(JobCancelRequested)],
            [
                _subject(CostRecorded),
                _subject(AllocationGranted, NODE_A),
                _subject(JobCancelRequested, "by-registry"),  # the registry's, for a lost parent
            ],
        ),
        (
            "registry",
            None,
            ["trainyard.model.registered.v1.job-1", _subject(JobCancelRequested, "by-registry")],
            [
                _subject(AllocationGranted, NODE_A),
                _subject(CostRecorded),
                _subject(JobCancelRequested),  # submission's subject: only its delegate's
            ],
        ),
    ],
)
async def test_publishes(
    server: NatsServer,
    kind: str,
    node_id: str | None,
    allowed: list[str],
    denied: list[str],
) -> None:
    async with session(server, _user(server, kind, node_id)) as s:
        for subject in allowed:
            assert await s.may_publish(subject), (subject, s.violations)
        for subject in denied:
            assert await s.publish_denied(subject), (subject, s.violations)


async def test_only_the_scheduler_may_publish_allocations(server: NatsServer) -> None:
    for user in server.users:
        async with session(server, user) as s:
            for payload in (AllocationGranted, AllocationRevoked, AllocationReleased):
                subject = _subject(payload, NODE_X)
                if user.name == "scheduler":
                    assert await s.may_publish(subject)
                else:
                    assert await s.publish_denied(subject), (user.name, subject)


async def test_subscriptions(server: NatsServer) -> None:
    async with session(server, _user(server, "runner", NODE_A)) as runner_a:
        assert await runner_a.may_subscribe(nats_subject(AllocationGranted, NODE_A))
        assert await runner_a.may_subscribe(f"_INBOX.runner-{NODE_A}.x")
        for subject in (
            nats_subject(AllocationGranted, NODE_B),
            nats_subject(AllocationRevoked, NODE_B),
            nats_subject(AllocationGranted),
            "trainyard.>",
            "_INBOX.>",  # others' replies and pull deliveries
            "_INBOX.scheduler.>",
            "deadletter.>",
        ):
            assert await runner_a.subscribe_denied(subject), subject
    async with session(server, _user(server, "billing")) as billing:
        assert await billing.may_subscribe(nats_subject(AllocationReleased))
        assert await billing.may_subscribe(nats_subject(AllocationGranted))  # what it meters
        assert await billing.may_subscribe(nats_subject(JobSubmitted))  # waste: waits
        assert await billing.subscribe_denied(nats_subject(AllocationRevoked))


# --- the JetStream API ---------------------------------------------------------------


async def test_services_may_not_delete_streams_or_use_others_consumers(
    server: NatsServer,
) -> None:
    async with Bus.connect(_settings(server, _user(server, "scheduler")), "setup"):
        pass  # the streams exist
    api = "$JS.API.STREAM"
    forbidden: list[tuple[str, Callable[[JetStreamContext], Awaitable[object]]]] = [
        (f"{api}.DELETE.TRAINYARD", lambda js: js.delete_stream("TRAINYARD")),
        (f"{api}.PURGE.TRAINYARD", lambda js: js.purge_stream("TRAINYARD")),
        (f"{api}.DELETE.TRAINYARD_DEADLETTER", lambda js: js.delete_stream("TRAINYARD_DEADLETTER")),
        (f"{api}.MSG.GET.TRAINYARD", lambda js: js.get_msg("TRAINYARD", 1)),
        (f"{api}.MSG.DELETE.TRAINYARD", lambda js: js.delete_msg("TRAINYARD", 1)),
    ]

    async def allowed_of(user: NatsUser) -> list[str]:
        """The forbidden requests ``user`` was not refused (each waits for its verdict, so
        the users are asked side by side)."""
        async with session(server, user) as s:
            js = s.nc.jetstream(timeout=0.25)
            return [
                f"{user.name}: {subject}"
                for subject, call in forbidden
                if not await s.api_denied(subject, lambda call=call: call(js))  # type: ignore[misc]
            ]

    allowed = await asyncio.gather(*(allowed_of(user) for user in server.users))
    assert [entry for entries in allowed for entry in entries] == []
    async with session(server, _user(server, "runner", NODE_A)) as runner_a:
        next_b = f"$JS.API.CONSUMER.MSG.NEXT.TRAINYARD.runner-{NODE_B}"
        assert await runner_a.publish_denied(next_b)
        assert await runner_a.publish_denied(
            f"$JS.API.CONSUMER.DURABLE.CREATE.TRAINYARD.runner-{NODE_B}"
        )
        assert await runner_a.publish_denied("$JS.API.CONSUMER.CREATE.TRAINYARD")  # ephemeral
        assert await runner_a.publish_denied("$JS.ACK.TRAINYARD.scheduler.1.1.1.1.1.1")


async def test_a_runner_may_create_its_consumer_only_on_its_own_nodes_subjects(
    server: NatsServer,
) -> None:
    """The filter of a consumer is in the create request's body, which permissions do not
    see; a runner's user may create its consumer only with the filter in the subject (which
    they see), and NATS refuses a body whose filter differs from the subject's."""
    async with Bus.connect(_settings(server, _user(server, "scheduler")), "setup"):
        pass  # the streams exist
    own = f"runner-{NODE_A}"
    create = f"$JS.API.CONSUMER.CREATE.TRAINYARD.{own}"

    def body(**config: object) -> bytes:
        return json.dumps(
            {"stream_name": "TRAINYARD", "config": {"name": own, "durable_name": own, **config}}
        ).encode()

    async with session(server, _user(server, "runner", NODE_A)) as runner_a:
        for subject, request in (
            (create, body(filter_subjects=[nats_subject(AllocationGranted, NODE_B)])),
            (f"{create}.{node_subjects(NODE_B)}", body(filter_subject=node_subjects(NODE_B))),
            (f"{create}.trainyard.>", body(filter_subject="trainyard.>")),
            (f"{create}.{nats_subject(AllocationGranted)}", body(filter_subject="x")),
            (f"$JS.API.CONSUMER.DURABLE.CREATE.TRAINYARD.{own}", body()),
        ):

            async def send(subject: str = subject, request: bytes = request) -> None:
                await runner_a.nc.request(subject, request, timeout=0.25)

            assert await runner_a.api_denied(subject, send), subject
        # Its own filter is allowed; another filter in the body under it is refused by NATS.
        allowed = f"{create}.{node_subjects(NODE_A)}"
        answer = await runner_a.nc.request(allowed, body(filter_subject="trainyard.>"), timeout=5)
        error = json.loads(answer.data).get("error", {})
        assert error.get("err_code") == 10131, answer.data  # filter does not match the subject
        answer = await runner_a.nc.request(
            allowed, body(filter_subject=node_subjects(NODE_A), ack_policy="explicit"), timeout=5
        )
        assert "error" not in json.loads(answer.data), answer.data


async def test_a_grant_goes_from_the_scheduler_to_its_runner_and_to_no_other(
    server: NatsServer,
) -> None:
    """The whole pull-consumer path with the services' own users: publish, consumer create,
    fetch into the runner's inbox, ack, and a dead letter."""
    scheduler = _settings(server, _user(server, "scheduler"))
    runner_a = _settings(server, _user(server, "runner", NODE_A))
    seen: list[str] = []
    stop = asyncio.Event()

    async def handle(envelope: Envelope[Payload]) -> None:
        seen.append(envelope.id)
        if len(seen) == 2:
            stop.set()
            raise Reject("the second one is refused")

    async with Bus.connect(scheduler, "scheduler") as bus:
        before = (await bus.jetstream.stream_info("TRAINYARD_DEADLETTER")).state.messages
        grants = [_grant(NODE_A), _grant(NODE_B), _grant(NODE_A)]
        for grant in grants:
            await bus.publish(grant)
        async with Bus.connect(runner_a, "runner") as runner:
            consumer = f"runner-{NODE_A}"
            await asyncio.wait_for(
                runner.consume(consumer, [node_subjects(NODE_A)], handle, stop, redrive=False), 30
            )
            # Acknowledgements are applied by the server after they arrive: give it a moment.
            for _ in range(100):
                info = await runner.jetstream.consumer_info("TRAINYARD", consumer)
                if info.num_pending == 0 and info.num_ack_pending == 0:
                    break
                await asyncio.sleep(0.05)
            assert info.num_pending == 0 and info.num_ack_pending == 0
        assert seen == [grants[0].id, grants[2].id]
        after = (await bus.jetstream.stream_info("TRAINYARD_DEADLETTER")).state.messages
        assert after == before + 1


async def test_a_service_tallies_its_own_redelivered_events_and_no_others(
    server: NatsServer,
) -> None:
    """A failure is recorded before the event goes back (``bus.Tally``) and read on its
    redelivery, with the service's own user; another service's tallies it may neither
    write (it could make that service dead-letter events sooner) nor read."""
    scheduler = _settings(server, _user(server, "scheduler"))
    runner_b = _settings(server, _user(server, "runner", NODE_B))
    consumer = f"runner-{NODE_B}"
    tries: list[str] = []
    stop = asyncio.Event()

    grant = _grant(NODE_B)

    async def handle(envelope: Envelope[Payload]) -> None:
        if envelope.id != grant.id:
            return  # another test's grant to this node
        tries.append(envelope.id)
        if len(tries) == 1:
            raise ValueError("the first try fails")
        stop.set()

    async with Bus.connect(scheduler, "scheduler") as bus:
        stored = await bus.publish_raw(grant.nats_subject, grant.to_json(), grant.id, {})
        async with Bus.connect(runner_b, "runner") as runner:
            await asyncio.wait_for(
                runner.consume(consumer, [node_subjects(NODE_B)], handle, stop, redrive=False),
                30,
            )
            # Read as the runner reads it on a redelivery: its own subject, directly.
            tally = await runner.jetstream.get_msg(
                "TRAINYARD_ATTEMPTS", subject=attempts_subject(consumer, stored.seq), direct=True
            )
        assert tries == [grant.id, grant.id]
        assert tally.data is not None and json.loads(tally.data)["failures"] == 1
    async with session(server, _user(server, "runner", NODE_A)) as s:
        theirs = attempts_subject(consumer, stored.seq)
        assert await s.publish_denied(theirs)
        direct = f"$JS.API.DIRECT.GET.TRAINYARD_ATTEMPTS.{theirs}"

        async def read(nc: NatsClient = s.nc) -> None:
            await nc.request(direct, b"", timeout=0.25)

        assert await s.api_denied(direct, read)


async def test_a_runner_cannot_pass_its_report_off_as_the_schedulers_decision(
    server: NatsServer, caplog: pytest.LogCaptureFixture
) -> None:
    """``job.failed`` is said by a runner (an attempt failed) and by the scheduler (the job
    failed). The scheduler's travels on ``job.failed.v1.by-scheduler``, which only it may
    publish; a consumer believes a scheduler's ``job.failed`` only on that subject."""
    job = str(uuid.uuid4())

    def failed(source: str) -> Envelope[Payload]:
        payload = JobFailed(
            job_id=job,
            allocation_id="a-1",
            node_id=NODE_A,
            epoch=1,
            finished_at=datetime.now(UTC),
            exit_code=1,
            reason="exited with status 1",
        )
        return Envelope.wrap(payload, source=source, subject=job)

    claim, report, decision = failed(SCHEDULER), failed(RUNNER), failed(SCHEDULER)
    assert claim.nats_subject == f"{JobFailed.TYPE}.by-scheduler"
    assert report.nats_subject == f"{JobFailed.TYPE}.{job}.{NODE_A}"
    seen: list[str] = []
    stop = asyncio.Event()

    async def handle(envelope: Envelope[Payload]) -> None:
        if envelope.subject == job:
            seen.append(envelope.id)
        if len(seen) == 2:
            stop.set()

    scheduler = _settings(server, _user(server, "scheduler"))
    async with Bus.connect(scheduler, "scheduler") as bus:
        async with session(server, _user(server, "runner", NODE_A)) as s:
            assert await s.publish_denied(claim.nats_subject)
        async with Bus.connect(_settings(server, _user(server, "runner", NODE_A)), "r") as runner:
            # The claim on the runner's own subject is stored (NATS cannot read the body)...
            await runner.publish_raw(report.nats_subject, claim.to_json(), claim.id, {})
            await runner.publish(report)
        await bus.publish(decision)
        with caplog.at_level(logging.ERROR, logger="trainyard_platform.shared.bus"):
            await asyncio.wait_for(
                bus.consume("scheduler", [nats_subject(JobFailed)], handle, stop), 30
            )
    # ... but only the runner's report and the scheduler's decision are believed.
    assert seen == [report.id, decision.id]
    forged = [r.getMessage() for r in caplog.records if "forged event" in r.getMessage()]
    assert any(
        f"travels on {JobFailed.TYPE}.by-scheduler, not on {report.nats_subject}" in m
        for m in forged
    ), forged


async def test_no_publisher_can_have_anothers_event_dropped_as_a_duplicate(
    server: NatsServer,
) -> None:
    """JetStream's duplicate window is the stream's, not a subject's: a runner that sends, on
    its own heartbeat subject, messages under the ids the scheduler's fence and preemption of
    its allocation and a gang peer's end report will carry must not have those dropped as
    duplicates (``Bus.msg_id``). A re-publish by the same service, from another connection
    too (a replica, a restart), still is."""
    allocation, peer_allocation, job = str(uuid.uuid4()), str(uuid.uuid4()), str(uuid.uuid4())
    fence = Envelope.wrap(
        AllocationRevoked(
            allocation_id=allocation, job_id=job, node_id=NODE_A, epoch=1, reason="fenced"
        ),
        source=SCHEDULER,
        subject=NODE_A,
        event_id=f"fence:{allocation}:{NODE_A}",
    )
    preempt = Envelope.wrap(
        AllocationRevoked(
            allocation_id=allocation, job_id=job, node_id=NODE_A, epoch=1, reason="preempted"
        ),
        source=SCHEDULER,
        subject=NODE_A,
        event_id=f"preempt:{allocation}",
    )
    peer_end = Envelope.wrap(
        JobSucceeded(
            job_id=job,
            allocation_id=peer_allocation,
            node_id=NODE_B,
            epoch=1,
            finished_at=datetime.now(UTC),
        ),
        source=RUNNER,
        subject=job,
        event_id=runner_domain.event_id(peer_allocation, "end"),
    )
    real = [fence, preempt, peer_end]
    scheduler = _settings(server, _user(server, "scheduler"))
    async with Bus.connect(scheduler, "scheduler"):
        pass  # the streams are there
    async with session(server, _user(server, "runner", NODE_A)) as attacker:
        squat = f"{RunnerHeartbeat.TYPE}.{NODE_A}"
        own_key = dedup_key(_settings(server, _user(server, "runner", NODE_A)))
        for event in real:
            # The event's id, and what the runner's own key makes of it.
            for msg_id in (event.id, keyed_msg_id(own_key, event.nats_subject, event.id)):
                ack = await attacker.nc.jetstream().publish(
                    squat, b"{}", headers={"Nats-Msg-Id": msg_id}, timeout=5
                )
                assert not ack.duplicate
        assert not attacker.violations

    runner_b = _settings(server, _user(server, "runner", NODE_B))
    async with Bus.connect(scheduler, "scheduler") as bus, Bus.connect(runner_b, "r") as peer:
        for publisher, event in ((bus, fence), (bus, preempt), (peer, peer_end)):
            stored = await publisher.publish_raw(event.nats_subject, event.to_json(), event.id, {})
            assert not stored.duplicate, f"{event.id} was dropped as the squatter's duplicate"
            # A re-publish after a lost acknowledgement is still dropped once.
            again = await publisher.publish_raw(event.nats_subject, event.to_json(), event.id, {})
            assert again.duplicate and again.seq == stored.seq
    async with Bus.connect(scheduler, "scheduler") as replica:
        again = await replica.publish_raw(fence.nats_subject, fence.to_json(), fence.id, {})
        assert again.duplicate


async def test_a_republish_across_the_upgrade_or_a_password_rotation_is_stored_again(
    server: NatsServer,
) -> None:
    """docs/operations.md, "Upgrade" (the keyed ``Nats-Msg-Id``): the version before keyed
    ids published an event under its bare id, and the key comes from the service's NATS
    password. A re-publish inside the duplicate window under another key (the new version
    after the old one, a process started with a rotated password) is not JetStream's
    duplicate: the stream holds the event twice. The same key's re-publish still is."""
    grant = _grant(NODE_A)
    subject, body = grant.nats_subject, grant.to_json()
    settings = _settings(server, _user(server, "scheduler"))
    async with Bus.connect(settings, "scheduler") as bus:
        old = await bus.jetstream.publish(
            subject, body, headers={"Nats-Msg-Id": grant.id}, timeout=5
        )
        new = await bus.publish_raw(subject, body, grant.id, {})
        assert not new.duplicate and new.seq != old.seq
        rotated = Bus(bus.nats, settings.model_copy(update={"password": SecretStr("rotated")}))
        after_rotation = await rotated.publish_raw(subject, body, grant.id, {})
        assert not after_rotation.duplicate and after_rotation.seq != new.seq
        again = await bus.publish_raw(subject, body, grant.id, {})
        assert again.duplicate and again.seq == new.seq


def _grant(node_id: str) -> Envelope[Payload]:
    job_id = f"job-{uuid.uuid4().hex[:8]}"
    grant = AllocationGranted(
        allocation_id=str(uuid.uuid4()),
        job_id=job_id,
        node_id=node_id,
        gpu_indices=[0],
        epoch=1,
        attempt=1,
        granted_at=datetime.now(UTC),
        spec=JobSpec(
            name="j", team="t", user="u", gpus=1, gpu_flavor="cpu", seed=1, max_runtime_seconds=60
        ),
    )
    return Envelope.wrap(grant, source="trainyard/scheduler", subject=node_id)  # type: ignore[return-value]


# --- the compose deployment ----------------------------------------------------------


def test_the_compose_config_is_the_local_rules(tmp_path: Path) -> None:
    """deploy/nats/nats.conf is what ``compose_config`` renders, compose requires each of its
    password variables, and nats-server accepts it."""
    deploy = Path(__file__).resolve().parents[2] / "deploy"
    conf = deploy / "nats" / "nats.conf"
    assert conf.read_text() == compose_config(), "regenerate deploy/nats/nats.conf"
    compose = (deploy / "compose.yaml").read_text()
    env = {}
    for kind, node_id in COMPOSE_USERS:
        variable = password_variable(service_user_name(kind, node_id))
        assert f"${{{variable}:?" in compose, variable
        env[variable] = f"p{uuid.uuid4().hex}"
    result = subprocess.run(
        [str(find_nats_binary()), "--config", str(conf), "-t"],
        env={**os.environ, **env},
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr


async def test_a_report_on_its_jobs_subject_is_refused_and_the_runner_keeps_retrying_it(
    server: NatsServer, caplog: pytest.LogCaptureFixture
) -> None:
    """docs/operations.md, "Upgrade" (runner reports on node subjects): a runner from before
    them publishes its reports on ``<type>.<job>``, as this ``checkpoint.saved`` without
    ``node_id`` still is. Under the new permissions NATS refuses it: the publish gets no
    acknowledgement (a timeout, which the bus takes for NATS not answering), nothing is
    stored, and the runner's publisher keeps the report and tries it again, holding the
    job's later events behind it, for as long as it runs."""
    job = str(uuid.uuid4())
    saved = CheckpointSaved(
        job_id=job,
        allocation_id="a-1",
        epoch=1,
        checkpoint=CheckpointRef(
            uri=f"s3://b/jobs/{job}/checkpoints/step-00000001/checkpoint.pt",
            manifest_uri=f"s3://b/jobs/{job}/checkpoints/step-00000001/manifest.json",
            step=1,
            size_bytes=1,
            sha256="0" * 64,
        ),
        saved_at=datetime.now(UTC),
    )
    report = Envelope.wrap(saved, source=RUNNER, subject=job)
    assert report.nats_subject == f"{CheckpointSaved.TYPE}.{job}"
    runner_user = _user(server, "runner", NODE_A)
    quick = _settings(server, runner_user).model_copy(update={"publish_timeout_seconds": 0.5})
    async with (
        Bus.connect(_settings(server, _user(server, "scheduler")), "scheduler"),
        Bus.connect(quick, runner_user.name) as runner,
    ):
        with (
            caplog.at_level(logging.WARNING, logger="trainyard_platform.shared.bus"),
            pytest.raises(NatsTimeoutError) as refused,
        ):
            await runner.publish_raw(report.nats_subject, report.to_json(), report.id, {})
        assert (infrastructure_fault(refused.value) or "").startswith(NATS_NOT_ANSWERING)
        said = [r.getMessage().lower() for r in caplog.records]
        assert any(
            "permissions violation" in m and report.nats_subject.lower() in m for m in said
        ), said
        retrying = asyncio.create_task(
            publish_until_sent(runner, report, None, record=False, after_grant=False)
        )
        try:
            # Several refused tries (0.5 s each, then a pause): it is still trying.
            done, _ = await asyncio.wait({retrying}, timeout=3)
            assert not done
        finally:
            retrying.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await retrying
        async with session(server, runner_user) as s:
            info = await s.nc.jetstream().stream_info("TRAINYARD", subjects_filter=">")
        assert report.nats_subject not in (info.state.subjects or {})
