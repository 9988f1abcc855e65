"""The shared HTTP error shape: every failure is ``{"detail", "errors"}``, never a traceback."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator
from typing import Any

import asyncpg
import nats.errors
import pytest
import urllib3.exceptions
from litestar import Litestar, get
from litestar.exceptions import HTTPException, NotAuthorizedException
from litestar.params import FromQuery
from litestar.testing import TestClient
from pydantic import BaseModel, ConfigDict, model_validator

from trainyard_platform.shared.http_errors import (
    Conflicting,
    PreconditionFailed,
    RateLimited,
    RequestInvalid,
    exception_handlers,
    parse_body,
)


class Missing(Exception):
    pass


class Limits(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    nominal: int
    lending: int = 0

    @model_validator(mode="after")
    def _lending_within_nominal(self) -> Limits:
        if self.lending > self.nominal:
            raise ValueError("lending: must not exceed nominal")
        return self


class Body(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    limits: dict[str, Limits]


@get("/invalid")
async def invalid() -> None:
    raise RequestInvalid.one("name", "must be lower case")


@get("/missing")
async def missing() -> None:
    raise Missing("no queue q")


@get("/unauthorized")
async def unauthorized() -> None:
    raise NotAuthorizedException("bad token")


@get("/unavailable")
async def unavailable() -> None:
    raise HTTPException(status_code=503, detail="db.internal:5432 is down")


@get("/crash")
async def crash() -> None:
    raise RuntimeError("password=hunter2")


@get("/database-lost")
async def database_lost() -> None:
    raise asyncpg.ConnectionDoesNotExistError("connection to db.internal:5432 was closed")


@get("/broker-refused")
async def broker_refused() -> None:
    raise ConnectionRefusedError(111, "nats.internal:4222 refused")


@get("/wrapped-lost")
async def wrapped_lost() -> None:
    try:
        raise asyncpg.exceptions.CannotConnectNowError("db.internal is starting up")
    except asyncpg.PostgresError as exc:  # as Litestar wraps a failing dependency
        raise HTTPException(status_code=500, detail="dependency failed") from exc


@get("/connection-closed")
async def connection_closed() -> None:
    raise asyncpg.InterfaceError(
        "cannot call Connection.fetch(): the underlying connection is closed (db.internal)"
    )


@get("/left-mid-operation")
async def left_mid_operation() -> None:
    # A pooled connection an outage left in the middle of an operation (db.DATABASE_FAULTS).
    raise asyncpg.InternalClientError(
        "db.internal: cannot switch to state 15; another operation (2) is in progress"
    )


@get("/database-not-answering")
async def database_not_answering() -> None:
    # A server that takes the connection and never answers: asyncpg's own timeout, a plain
    # TimeoutError raised inside asyncpg (as a statement past its command_timeout is).
    silent = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
    port = silent.sockets[0].getsockname()[1]
    try:
        await asyncpg.connect(f"postgresql://u@127.0.0.1:{port}/db_internal", timeout=0.2)
    finally:
        silent.close()


@get("/nats-away")
async def nats_away() -> None:
    raise nats.errors.NoServersError() from ConnectionRefusedError(111, "nats.internal refused")


@get("/nats-not-answering")
async def nats_not_answering() -> None:
    # A JetStream request or a publish unanswered (a stalled NATS).
    raise nats.errors.TimeoutError() from ConnectionError("nats.internal: no answer")


@get("/store-away")
async def store_away() -> None:
    raise urllib3.exceptions.ProtocolError("db.internal: Connection aborted.")


@get("/count")
async def count(limit: FromQuery[int]) -> int:
    return limit


@pytest.fixture
def client() -> Iterator[TestClient[Any]]:
    app = Litestar(
        [
            invalid,
            missing,
            unauthorized,
            unavailable,
            crash,
            count,
            database_lost,
            broker_refused,
            wrapped_lost,
            connection_closed,
            left_mid_operation,
            database_not_answering,
            nats_away,
            nats_not_answering,
            store_away,
        ],
        exception_handlers=exception_handlers({Missing: 404}),
    )
    with TestClient(app) as test_client:
        yield test_client


def test_invalid_requests_name_their_fields(client: TestClient[Any]) -> None:
    response = client.get("/invalid")
    assert response.status_code == 422
    assert response.json() == {
        "detail": "invalid request",
        "errors": [{"field": "name", "message": "must be lower case"}],
    }
    response = client.get("/count", params={"limit": "many"})
    assert response.status_code == 422
    assert response.json()["detail"] == "invalid request"
    assert [e["field"] for e in response.json()["errors"]] == ["limit"]


def test_a_services_own_exception_answers_its_status(client: TestClient[Any]) -> None:
    response = client.get("/missing")
    assert response.status_code == 404
    assert response.json() == {"detail": "no queue q", "errors": []}
    response = client.get("/unauthorized")
    assert response.status_code == 401
    assert response.json() == {"detail": "bad token", "errors": []}
    assert response.headers["WWW-Authenticate"] == "Bearer"
    assert client.get("/nowhere").json()["detail"]


def test_server_errors_are_generic_and_logged(
    client: TestClient[Any], caplog: pytest.LogCaptureFixture
) -> None:
    for path, status, secret in [
        ("/crash", 500, "hunter2"),
        ("/unavailable", 503, "db.internal"),
    ]:
        response = client.get(path)
        assert response.status_code == status
        assert response.json() == {"detail": "internal error", "errors": []}
        assert secret not in response.text and "Traceback" not in response.text
        assert secret in caplog.text


DATABASE_UNAVAILABLE = "temporarily unavailable (the database is unavailable), try again"


@pytest.mark.parametrize(
    ("path", "detail"),
    [
        ("/database-lost", DATABASE_UNAVAILABLE),
        ("/broker-refused", "temporarily unavailable, try again"),  # an OSError of its own
        ("/wrapped-lost", DATABASE_UNAVAILABLE),
        ("/connection-closed", DATABASE_UNAVAILABLE),
        ("/left-mid-operation", DATABASE_UNAVAILABLE),
        ("/nats-away", "temporarily unavailable (the event bus is unavailable), try again"),
        ("/nats-not-answering", "temporarily unavailable (the event bus is not answering), "
         "try again"),
        ("/store-away", "temporarily unavailable (the object store is unavailable), try again"),
    ],
)  # fmt: skip
def test_a_lost_dependency_is_a_503_to_retry_that_names_it_and_reveals_nothing_else(
    client: TestClient[Any], caplog: pytest.LogCaptureFixture, path: str, detail: str
) -> None:
    response = client.get(path)
    assert response.status_code == 503
    assert response.json() == {"detail": detail, "errors": []}
    assert response.headers["Retry-After"] == "5"
    assert ".internal" not in response.text and "Traceback" not in response.text
    assert ".internal" in caplog.text  # the operator sees which


def test_a_database_that_does_not_answer_is_a_503_that_says_so(
    client: TestClient[Any], caplog: pytest.LogCaptureFixture
) -> None:
    """asyncpg's timeout (a statement, an acquire, a connect: ``shared.db``) is a bare
    ``TimeoutError``; the caller is told the database did not answer, and so is the log."""
    response = client.get("/database-not-answering")
    assert response.status_code == 503
    assert response.json() == {
        "detail": "temporarily unavailable (the database is not answering), try again",
        "errors": [],
    }
    assert response.headers["Retry-After"] == "5"
    assert "Traceback" not in response.text
    assert "PostgreSQL not answering (TimeoutError)" in caplog.text


def test_a_dependency_away_is_logged_once_a_minute_not_per_request(
    client: TestClient[Any], caplog: pytest.LogCaptureFixture
) -> None:
    """While a database does not answer, every request meets it: each logged a warning with
    its traceback. Now one line a minute per fault, and no traceback: an outage is expected,
    and the exception chain, each exception's type and message, says what happened."""
    for _ in range(5):
        assert client.get("/database-lost").status_code == 503
    assert client.get("/nats-away").status_code == 503
    lines = [r for r in caplog.records if "a dependency is unavailable" in r.getMessage()]
    assert [r.getMessage().split(": ")[0] for r in lines] == [
        "GET /database-lost",
        "GET /nats-away",
    ]
    assert all(r.exc_info is None and "\n" not in r.getMessage() for r in lines)
    assert (
        lines[1]
        .getMessage()
        .endswith(
            ": NoServersError: nats: no servers available for connection"
            " <- ConnectionRefusedError: [Errno 111] nats.internal refused"
        )
    )


def test_a_server_error_that_is_no_outage_keeps_its_traceback(
    client: TestClient[Any], caplog: pytest.LogCaptureFixture
) -> None:
    assert client.get("/crash").status_code == 500
    (line,) = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert line.exc_info is not None


def test_body_errors_are_reported_by_path_all_at_once() -> None:
    raw = b'{"limits": {"a100": {"nominal": 1, "lending": 2}, "h200": {"nominal": "x"}}, "x": 1}'
    with pytest.raises(RequestInvalid) as caught:
        parse_body(Body, raw)
    assert {e.field: e.message for e in caught.value.errors} == {
        "limits.a100.lending": "must not exceed nominal",
        "limits.h200.nominal": "must be an integer",
        "x": "unknown field",
    }
    with pytest.raises(RequestInvalid) as caught:
        parse_body(Body, b"[]")
    assert [(e.field, e.message) for e in caught.value.errors] == [
        ("body", "must be a JSON object")
    ]


class Taken(Conflicting):
    """A service's own conflict, mapped to its status as services map theirs."""


@get("/taken")
async def taken() -> None:
    raise Taken("job j1 has already ended", field="job_id", message="the job has ended")


@get("/limited")
async def limited() -> None:
    raise RateLimited("too many", retry_after=3, field="Authorization", message="spent")


@get("/exists")
async def exists() -> None:
    raise PreconditionFailed("If-None-Match", "queue q exists already")


def test_a_refusal_names_its_field_and_why_whatever_its_status() -> None:
    """A 409, 412 or 429 names what in the request it is about, as a 422 does: before, a
    service's conflict answered ``errors: []`` (one mechanism now: ``Refused``, whose field
    is required)."""
    app = Litestar([taken, limited, exists], exception_handlers=exception_handlers({Taken: 409}))
    with TestClient(app) as client:
        conflict = client.get("/taken")
        assert conflict.status_code == 409
        assert conflict.json() == {
            "detail": "job j1 has already ended",
            "errors": [{"field": "job_id", "message": "the job has ended"}],
        }
        refused = client.get("/limited")
        assert refused.status_code == 429
        assert refused.headers["Retry-After"] == "3"
        assert refused.json()["errors"] == [{"field": "Authorization", "message": "spent"}]
        there = client.get("/exists")
        assert there.status_code == 412
        assert [e["field"] for e in there.json()["errors"]] == ["If-None-Match"]
        assert there.json()["detail"] == "If-None-Match: queue q exists already"
