"""Dead letters: a message that can never succeed is dead-lettered with its reason; operators
list and inspect it, redrive it once the cause is fixed (its consumer alone gets it again,
with the same event id) or discard it; over the library, the HTTP API and the CLI."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Generator
from typing import Any

import asyncpg
import httpx
import pytest
import uvicorn
from litestar import Litestar
from litestar.connection import ASGIConnection
from litestar.exceptions import NotAuthorizedException
from litestar.handlers import BaseRouteHandler
from nats.js import api

from trainyard.cli_deadletters import add_deadletter_commands
from trainyard.client import TrainyardClient
from trainyard_platform.deploy.local.ports import free_port
from trainyard_platform.shared.access import remember
from trainyard_platform.shared.auth import bearer_token
from trainyard_platform.shared.bus import (
    ORIGINAL_SUBJECT_HEADER,
    REASON_HEADER,
    Bus,
    Reject,
    deadletter_subject,
    redrive_subject,
)
from trainyard_platform.shared.deadletters import CannotRedrive, DeadLetters, deadletter_routes
from trainyard_platform.shared.events import Envelope, Payload, nats_subject
from trainyard_platform.shared.events.payloads import JobCancelRequested
from trainyard_platform.shared.events.trust import SUBMISSION
from trainyard_platform.shared.http_app import service_app
from trainyard_platform.shared.identity import Principal, Role, operator_token_principal
from trainyard_platform.shared.inbox import idempotent

pytestmark = pytest.mark.integration

CONSUMER = "test-consumer"
SUBJECTS = [nats_subject(JobCancelRequested)]
OPERATOR, VIEWER = "operator-token", "viewer-token"


def _event(job_id: str) -> Envelope[JobCancelRequested]:
    return Envelope.wrap(
        JobCancelRequested(job_id=job_id, team="t", user="u"), source=SUBMISSION, subject=job_id
    )


class Consumer:
    """``CONSUMER`` running in the background: rejects the jobs in ``broken``, records the
    rest (subject and event id) in the order it handled them."""

    def __init__(self) -> None:
        self.broken: set[str] = set()
        self.handled: list[tuple[str, str]] = []

    async def handle(self, envelope: Envelope[Payload]) -> None:
        if envelope.subject in self.broken:
            raise Reject(f"{envelope.subject} cannot be applied yet")
        self.handled.append((envelope.subject, envelope.id))


@pytest.fixture
async def consumer(bus: Bus) -> AsyncIterator[Consumer]:
    running = Consumer()
    stop = asyncio.Event()
    task = asyncio.create_task(bus.consume(CONSUMER, SUBJECTS, running.handle, stop))
    yield running
    stop.set()
    await asyncio.wait_for(task, 10)


async def _until(condition: Any, timeout: float = 10) -> None:
    async with asyncio.timeout(timeout):
        while not await condition():
            await asyncio.sleep(0.05)


async def test_a_poison_message_is_dead_lettered_listed_redriven_and_discarded(
    bus: Bus, consumer: Consumer
) -> None:
    letters = DeadLetters(bus, CONSUMER)
    poison, fine = _event("job-poison"), _event("job-fine")
    consumer.broken.add("job-poison")
    await bus.publish(poison)
    await bus.publish(fine)

    async def one_dead_letter() -> bool:
        return await letters.count() == 1 and len(consumer.handled) == 1

    await _until(one_dead_letter)
    assert consumer.handled == [("job-fine", fine.id)]  # the consumer went on
    page = await letters.page()
    assert page.total == 1 and page.next_after is None
    [listed] = page.dead_letters
    assert listed.reason == "rejected: job-poison cannot be applied yet"
    assert listed.event_id == poison.id and listed.event_type == poison.type
    assert listed.event_subject == "job-poison" and listed.consumer == CONSUMER
    assert listed.original_subject == poison.nats_subject
    assert listed.deliveries == 1 and listed.original_sequence == 1
    assert (await letters.page(reason="REJECTED: job-poison")).dead_letters == [listed]
    assert (await letters.page(reason="something else")).dead_letters == []
    detail = await letters.get(listed.sequence)
    assert detail is not None and detail.body_encoding == "utf-8"
    assert json.loads(detail.body)["id"] == poison.id

    # Redriven before the cause is fixed: it comes back, still naming where it came from.
    first = await letters.redrive(listed.sequence)
    assert first is not None and first.subject == redrive_subject(CONSUMER)
    assert await letters.get(listed.sequence) is None
    assert await letters.redrive(listed.sequence) is None  # gone: nothing twice

    async def back_again() -> bool:
        return await letters.count() == 1

    await _until(back_again)
    [again] = (await letters.page()).dead_letters
    assert again.sequence > listed.sequence and again.event_id == poison.id
    assert again.original_subject == poison.nats_subject and "cannot be applied" in again.reason

    # Fixed: redriven, handled once, by the same event id (an inbox would dedupe it).
    consumer.broken.clear()
    assert await letters.redrive(again.sequence) is not None

    async def handled_twice() -> bool:
        return len(consumer.handled) == 2

    await _until(handled_twice)
    assert consumer.handled[1] == ("job-poison", poison.id)
    assert await letters.count() == 0

    # Bytes that are no event: dead-lettered, then discarded for good.
    await bus.publish_raw(poison.nats_subject, b"{not json", "raw-1", {})

    async def unparseable_dead() -> bool:
        return await letters.count() == 1

    await _until(unparseable_dead)
    [raw] = (await letters.page()).dead_letters
    # No event to read an id from: the message's own Nats-Msg-Id (the bus's, ``Bus.msg_id``).
    assert raw.reason.startswith("unparseable event")
    assert raw.event_id == bus.msg_id(poison.nats_subject, "raw-1")
    assert await letters.discard(raw.sequence)
    assert not await letters.discard(raw.sequence)
    assert await letters.count() == 0
    assert len(consumer.handled) == 2


async def test_a_redriven_forgery_is_judged_by_the_subject_it_first_came_on(
    bus: Bus, consumer: Consumer
) -> None:
    """An event dead-lettered as forged for the subject it came on (here: about job-a, on
    job-b's subject; a runner's report claiming the scheduler, on the runner's own subject,
    is the case that matters) is no less forged once an operator redrives it: it is judged
    by the subject it first came on, which its dead letter recorded, not believed because
    the redrive subject is its consumer's own."""
    letters = DeadLetters(bus, CONSUMER)
    forged = _event("job-a")
    elsewhere = _event("job-b").nats_subject
    await bus.publish_raw(elsewhere, forged.to_json(), forged.id, {})

    async def one_dead_letter() -> bool:
        return await letters.count() == 1

    await _until(one_dead_letter)
    [letter] = (await letters.page()).dead_letters
    assert letter.reason.startswith("forged event:") and letter.original_subject == elsewhere
    assert await letters.redrive(letter.sequence) is not None

    async def settled() -> bool:
        return bool(consumer.handled) or (
            await letters.count() == 1 and await letters.get(letter.sequence) is None
        )

    await _until(settled)
    assert consumer.handled == []
    [again] = (await letters.page()).dead_letters
    assert again.reason.startswith("forged event:") and f"not on {elsewhere}" in again.reason
    assert again.original_subject == elsewhere


async def test_a_redriven_event_already_applied_is_not_applied_twice(
    bus: Bus, pool: asyncpg.Pool
) -> None:
    """A dead letter of an event that was applied after all (its consumer died between the
    commit and the ack, each time, until it gave up) is redriven with the same event id, so
    the consumer's inbox drops it."""
    async with pool.acquire() as conn:
        await conn.execute("CREATE TABLE effects (job_id text)")

    async def apply(envelope: Envelope[Payload], conn: asyncpg.Connection) -> None:
        await conn.execute("INSERT INTO effects VALUES ($1)", envelope.subject)

    async def effects() -> int:
        async with pool.acquire() as conn:
            return int(await conn.fetchval("SELECT count(*) FROM effects"))

    stop = asyncio.Event()
    task = asyncio.create_task(
        bus.consume_batches(CONSUMER, SUBJECTS, idempotent(pool, CONSUMER, apply), stop)
    )
    letters = DeadLetters(bus, CONSUMER)
    try:
        event = _event("job-1")
        await bus.publish(event)

        async def applied() -> bool:
            return await effects() == 1

        await _until(applied)
        await bus.publish_raw(
            deadletter_subject(CONSUMER),
            event.to_json(),
            "dl-1",
            {
                REASON_HEADER: "abandoned: delivered 21 times without an outcome",
                # As the bus writes every dead letter: a redrive is judged by it.
                ORIGINAL_SUBJECT_HEADER: event.nats_subject,
            },
        )
        [letter] = (await letters.page()).dead_letters
        assert letter.event_id == event.id
        assert await letters.redrive(letter.sequence) is not None

        async def delivered_again() -> bool:
            info = await bus.jetstream.consumer_info(bus.settings.stream, CONSUMER)
            return info.delivered.stream_seq == 2 and info.num_ack_pending == 0

        await _until(delivered_again)
        assert await effects() == 1 and await letters.count() == 0
    finally:
        stop.set()
        await asyncio.wait_for(task, 10)


async def test_no_redrive_to_a_consumer_that_does_not_read_redrives(bus: Bus) -> None:
    """A redrive nobody would read is refused, and the dead letter stays."""
    await bus.jetstream.add_consumer(
        bus.settings.stream,
        api.ConsumerConfig(
            durable_name="no-redrives", filter_subject=SUBJECTS[0], ack_policy="explicit"
        ),
    )
    event = _event("job-1")
    await bus.publish_raw(deadletter_subject("no-redrives"), event.to_json(), "dl-1", {})
    letters = DeadLetters(bus, "no-redrives")
    [letter] = (await letters.page()).dead_letters
    assert not await letters.reads_redrives()
    with pytest.raises(CannotRedrive):
        await letters.redrive(letter.sequence)
    assert await letters.count() == 1
    transport = httpx.ASGITransport(  # type: ignore[arg-type]
        app=service_app("t", deadletter_routes(bus, "no-redrives"), _test_guard())
    )
    async with httpx.AsyncClient(transport=transport, base_url="http://svc") as http:
        refused = await http.post(
            f"/v1/deadletters/{letter.sequence}/redrive",
            headers={"Authorization": f"Bearer {OPERATOR}"},
        )
    assert refused.status_code == 409 and "does not read" in refused.json()["detail"]
    assert await letters.count() == 1


def _test_guard() -> Any:
    """The operator token is an operator; the viewer token a team's viewer."""

    def guard(connection: ASGIConnection[Any, Any, Any, Any], _: BaseRouteHandler) -> None:
        token = bearer_token(connection.headers.get("authorization"))
        if token == OPERATOR:
            remember(connection, operator_token_principal())
        elif token == VIEWER:
            remember(connection, Principal(user="v", team="t", role=Role.VIEWER, token_id=7))
        else:
            raise NotAuthorizedException("token")

    return guard


def _app(bus: Bus, pool: asyncpg.Pool | None = None) -> Litestar:
    return service_app("test", deadletter_routes(bus, CONSUMER, pool), _test_guard())


async def _dead_letter_two(bus: Bus, consumer: Consumer) -> list[int]:
    consumer.broken |= {"job-a", "job-b"}
    await bus.publish(_event("job-a"))
    await bus.publish(_event("job-b"))
    letters = DeadLetters(bus, CONSUMER)

    async def two() -> bool:
        return await letters.count() == 2

    await _until(two)
    return [d.sequence for d in (await letters.page()).dead_letters]


async def test_the_http_api_is_for_operators_and_audited(
    bus: Bus, pool: asyncpg.Pool, consumer: Consumer
) -> None:
    first, second = await _dead_letter_two(bus, consumer)
    transport = httpx.ASGITransport(app=_app(bus, pool))  # type: ignore[arg-type]
    async with httpx.AsyncClient(transport=transport, base_url="http://svc") as http:
        assert (await http.get("/v1/deadletters")).status_code == 401
        viewer = {"Authorization": f"Bearer {VIEWER}"}
        assert (await http.get("/v1/deadletters", headers=viewer)).status_code == 403
        denied = await http.post(f"/v1/deadletters/{first}/redrive", headers=viewer)
        assert denied.status_code == 403

        op = {"Authorization": f"Bearer {OPERATOR}"}
        page = (await http.get("/v1/deadletters", headers=op)).json()
        assert page["total"] == 2 and [d["sequence"] for d in page["dead_letters"]] == [
            first,
            second,
        ]
        one = (await http.get("/v1/deadletters?limit=1", headers=op)).json()
        assert len(one["dead_letters"]) == 1 and one["next_after"] == first
        shown = (await http.get(f"/v1/deadletters/{first}", headers=op)).json()
        assert shown["event_subject"] == "job-a" and "job-a" in shown["body"]
        assert (await http.get("/v1/deadletters/999", headers=op)).status_code == 404

        consumer.broken.clear()
        redriven = await http.post(f"/v1/deadletters/{first}/redrive", headers=op)
        assert redriven.status_code == 200 and redriven.json()["subject"] == redrive_subject(
            CONSUMER
        )
        again = await http.post(f"/v1/deadletters/{first}/redrive", headers=op)
        assert again.status_code == 404
        discarded = await http.delete(f"/v1/deadletters/{second}", headers=op)
        assert discarded.status_code == 200
        assert (await http.delete(f"/v1/deadletters/{second}", headers=op)).status_code == 404

    async def job_a_handled() -> bool:
        return [s for s, _ in consumer.handled] == ["job-a"]

    await _until(job_a_handled)
    assert await DeadLetters(bus, CONSUMER).count() == 0
    async with pool.acquire() as conn:
        rows = await conn.fetch("SELECT actor, action, target FROM audit_log ORDER BY id")
    assert [(r["actor"], r["action"], r["target"]) for r in rows] == [
        ("operator-token", "deadletter.redrive", f"deadletter/{CONSUMER}/{first}"),
        ("operator-token", "deadletter.discard", f"deadletter/{CONSUMER}/{second}"),
    ]


async def test_a_discard_on_a_service_without_an_audit_log_is_logged(
    bus: Bus, consumer: Consumer, caplog: pytest.LogCaptureFixture
) -> None:
    """A service without a database (the runner) has no audit log: an operator's discard
    of one of its dead letters was recorded nowhere, though its routes said "the service
    log only". The log now names the action, the dead letter, the operator and the event."""
    _, second = await _dead_letter_two(bus, consumer)
    [event_id] = [d.event_id for d in (await DeadLetters(bus, CONSUMER).page()).dead_letters][1:]
    assert event_id is not None
    transport = httpx.ASGITransport(app=_app(bus))  # type: ignore[arg-type]
    op = {"Authorization": f"Bearer {OPERATOR}"}
    caplog.set_level("INFO", logger="trainyard_platform.shared.deadletters")
    async with httpx.AsyncClient(transport=transport, base_url="http://svc") as http:
        assert (await http.delete(f"/v1/deadletters/{second}", headers=op)).status_code == 200
    [line] = [r.getMessage() for r in caplog.records if "deadletter.discard" in r.getMessage()]
    assert f"deadletter/{CONSUMER}/{second}" in line
    assert "operator-token" in line and event_id in line


class _Server(uvicorn.Server):
    """uvicorn in the test's loop, leaving the signals alone."""

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        yield


def _cli(url: str, *argv: str) -> int:
    """``trainyard --url URL --token OPERATOR deadletters ...`` (the CLI's own parser shape)."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--json", action="store_true", default=argparse.SUPPRESS)
    parser = argparse.ArgumentParser(prog="trainyard", parents=[common])
    commands = parser.add_subparsers(dest="command", required=True)
    add_deadletter_commands(commands, common)
    args = parser.parse_args(["deadletters", *argv])
    with TrainyardClient(url, OPERATOR) as client:
        return int(args.run(client, args))


async def test_the_cli_lists_shows_redrives_and_discards(
    bus: Bus, consumer: Consumer, capsys: pytest.CaptureFixture[str]
) -> None:
    first, second = await _dead_letter_two(bus, consumer)
    port = free_port()
    server = _Server(
        uvicorn.Config(_app(bus), host="127.0.0.1", port=port, log_level="warning", lifespan="off")
    )
    serving = asyncio.create_task(server.serve())
    url = f"http://127.0.0.1:{port}"
    try:
        async with asyncio.timeout(10):
            while not server.started:
                await asyncio.sleep(0.05)
        capsys.readouterr()

        assert await asyncio.to_thread(_cli, url, "list") == 0
        out = capsys.readouterr().out
        assert "job-a cannot be applied yet" in out and "job-b" in out
        assert "2 shown of 2 dead letters of test-consumer" in out

        assert await asyncio.to_thread(_cli, url, "show", str(first)) == 0
        out = capsys.readouterr().out
        assert "rejected: job-a cannot be applied yet" in out and '"subject": "job-a"' in out

        assert await asyncio.to_thread(_cli, url, "--json", "list", "--reason", "job-b") == 0
        listed = json.loads(capsys.readouterr().out)
        assert [d["sequence"] for d in listed["dead_letters"]] == [second]

        consumer.broken.clear()
        assert await asyncio.to_thread(_cli, url, "redrive", "--all", "--reason", "job-a") == 0
        assert f"redriven {first}" in capsys.readouterr().out
        assert await asyncio.to_thread(_cli, url, "discard", str(second)) == 0
        assert f"discarded {second}" in capsys.readouterr().out
        assert await asyncio.to_thread(_cli, url, "discard", str(second)) == 1  # gone
        assert "404" in capsys.readouterr().err
        assert await asyncio.to_thread(_cli, url, "list") == 0
        assert "no dead letters of test-consumer (0 in all)" in capsys.readouterr().out
    finally:
        server.should_exit = True
        await asyncio.wait_for(serving, 10)

    async def job_a_handled() -> bool:
        return [s for s, _ in consumer.handled] == ["job-a"]

    await _until(job_a_handled)
