"""Which failures are infrastructure faults (waited out) and which are the event's (retried a
few times, then dead-lettered): ``shared.bus.infrastructure_fault``."""

from __future__ import annotations

import logging
from pathlib import Path

import asyncpg
import nats.errors
import nats.js.errors
import pytest
import urllib3.exceptions
from minio.error import InvalidResponseError, S3Error, ServerError
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from pydantic import BaseModel, ValidationError
from urllib3 import HTTPResponse

from trainyard_platform.deploy.local.ports import free_port
from trainyard_platform.shared import db
from trainyard_platform.shared.bus import Reject, infrastructure_fault
from trainyard_platform.shared.db import DATABASE_FAULTS, log_failed_round
from trainyard_platform.shared.http_errors import unavailable_detail
from trainyard_platform.shared.metrics import instrument


def _s3_error(code: str) -> S3Error:
    return S3Error(HTTPResponse(status=503), code, "msg", "/b/k", "req", "host")


def _validation_error() -> ValidationError:
    class Model(BaseModel):
        n: int

    try:
        Model.model_validate({"n": "x"})
    except ValidationError as exc:
        return exc
    raise AssertionError("unreachable")


@pytest.mark.parametrize(
    "error",
    [
        # PostgreSQL down, restarting, gone mid-query, out of resources
        FileNotFoundError(2, "No such file or directory"),  # its Unix socket is not there
        ConnectionRefusedError(111, "Connect call failed"),
        ConnectionResetError(104, "reset by peer"),
        OSError("Multiple exceptions: [Errno 111] Connect call failed"),
        asyncpg.CannotConnectNowError("the database system is starting up"),
        asyncpg.AdminShutdownError("terminating connection due to administrator command"),
        asyncpg.ConnectionDoesNotExistError("connection was closed in the middle of operation"),
        asyncpg.TooManyConnectionsError("sorry, too many clients already"),
        asyncpg.DiskFullError("could not extend file"),
        asyncpg.InterfaceError("cannot call Connection.fetch(): connection is closed"),
        # a pooled connection an outage left mid-operation (seen: PostgreSQL killed in a pass)
        asyncpg.InternalClientError(
            "cannot switch to state 15; another operation (2) is in progress"
        ),
        TimeoutError(),  # e.g. pool.acquire(timeout=...)
        # NATS
        nats.errors.TimeoutError(),
        nats.errors.NoRespondersError(),
        nats.errors.ConnectionClosedError(),
        nats.errors.ConnectionReconnectingError(),
        nats.js.errors.ServiceUnavailableError(),
        # the object store
        urllib3.exceptions.MaxRetryError(None, "/b/k", "connection refused"),  # type: ignore[arg-type]
        urllib3.exceptions.ProtocolError("Connection aborted."),
        ServerError("server failed with HTTP status code 502", 502),
        _s3_error("SlowDown"),
        _s3_error("ServiceUnavailable"),
    ],
    ids=lambda e: type(e).__name__,
)
def test_infrastructure_faults(error: Exception) -> None:
    assert infrastructure_fault(error) is not None


@pytest.mark.parametrize(
    "error",
    [
        Reject("the job is unknown"),
        ValueError("bad value"),
        KeyError("job_id"),
        LookupError("job.started is not recorded yet"),
        _validation_error(),
        asyncpg.UniqueViolationError("duplicate key"),
        asyncpg.UndefinedTableError("relation does not exist"),
        asyncpg.QueryCanceledError("canceling statement due to statement timeout"),
        asyncpg.InterfaceError("cannot perform operation: another operation is in progress"),
        _s3_error("AccessDenied"),
        _s3_error("NoSuchKey"),
        # a local object store's path that will stay what it is: retried for ever otherwise
        PermissionError(13, "Permission denied"),
        IsADirectoryError(21, "Is a directory"),
        NotADirectoryError(20, "Not a directory"),
        FileExistsError(17, "File exists"),
        nats.js.errors.BadRequestError(),
    ],
    ids=lambda e: type(e).__name__,
)
def test_everything_else_is_the_events_problem(error: Exception) -> None:
    assert infrastructure_fault(error) is None


def test_a_fault_behind_another_error_counts() -> None:
    try:
        try:
            raise ConnectionRefusedError(111, "refused")
        except OSError as inner:
            raise RuntimeError("could not load the job") from inner
    except RuntimeError as outer:
        reason = infrastructure_fault(outer)
    assert reason is not None and "ConnectionRefusedError" in reason

    group = ExceptionGroup("tasks failed", [ValueError("x"), asyncpg.CannotConnectNowError("up")])
    assert infrastructure_fault(group) is not None
    assert infrastructure_fault(ExceptionGroup("tasks failed", [ValueError("x")])) is None


@pytest.mark.parametrize(
    ("error", "level", "traceback"),
    [
        (ConnectionRefusedError(111, "Connect call failed"), logging.WARNING, False),
        (
            asyncpg.InterfaceError("cannot call Connection.fetch(): connection is closed"),
            logging.WARNING,
            False,
        ),
        # a bug a loop survives is still said loudly, with where it came from
        (
            asyncpg.InterfaceError("cannot perform operation: another operation is in progress"),
            logging.ERROR,
            True,
        ),
        (asyncpg.UndefinedColumnError('column "x" does not exist'), logging.ERROR, True),
    ],
    ids=["refused", "connection-closed", "in-progress", "undefined-column"],
)
def test_a_loops_failed_round_is_one_line_for_an_outage_and_a_traceback_otherwise(
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
    error: Exception,
    level: int,
    traceback: bool,
) -> None:
    reader = InMemoryMetricReader()
    meter = MeterProvider(metric_readers=[reader]).get_meter("test")
    monkeypatch.setattr(db, "_failed_rounds", instrument("trainyard.loop.failed_rounds", meter))
    logger = logging.getLogger("test.loop")
    try:
        raise error
    except DATABASE_FAULTS as exc:
        log_failed_round(logger, "sweep", "round failed: %s; retrying", exc)
    (record,) = caplog.records
    assert record.levelno == level
    assert record.getMessage() == f"round failed: {error}; retrying"
    assert (record.exc_info is not None) is traceback
    data = reader.get_metrics_data()
    assert data is not None
    (point,) = [
        point
        for resource in data.resource_metrics
        for scope in resource.scope_metrics
        for metric in scope.metrics
        if metric.name == "trainyard.loop.failed_rounds"
        for point in metric.data.data_points
    ]
    cause = "error" if traceback else "outage"
    assert (dict(point.attributes or {}), point.value) == ({"loop": "sweep", "cause": cause}, 1)


@pytest.mark.parametrize(
    "url",
    ["postgresql://u@127.0.0.1:{port}/db", "postgresql://u@/db?host={folder}"],
    ids=["refused", "no-socket"],
)
async def test_postgresql_that_is_not_there_is_named(url: str, tmp_path: Path) -> None:
    """asyncpg raises the socket's own error when nothing listens (a refused port, a Unix
    socket that is not there): the fault said ``unreachable or timed out`` and named no
    dependency, so a consumer's ``paused`` line and a 503's detail did not say the database."""
    with pytest.raises(OSError) as failed:
        await asyncpg.connect(url.format(port=free_port(), folder=tmp_path), timeout=5)
    fault = infrastructure_fault(failed.value)
    assert fault is not None and fault.startswith("PostgreSQL unavailable"), fault
    assert unavailable_detail(fault) == (
        "temporarily unavailable (the database is unavailable), try again"
    )


def test_a_loops_round_lost_to_a_timeout_names_it(caplog: pytest.LogCaptureFixture) -> None:
    """A timeout's text is empty: the line read 'round failed: ; retrying'."""
    try:
        raise TimeoutError()
    except DATABASE_FAULTS as exc:
        log_failed_round(logging.getLogger("test.loop"), "sweep", "round failed: %s; retrying", exc)
    assert caplog.messages == ["round failed: TimeoutError; retrying"]


def _s3_answer(code: str, status: int) -> S3Error:
    return S3Error(HTTPResponse(status=status), code, "msg", "/b/k", "req", "host")


@pytest.mark.parametrize(
    "error",
    [
        # MinIO without write or read quorum (drives or nodes away) says so with these
        # codes, as a 503; minio's client retries no POST (a multipart upload's start and
        # completion, a bulk delete), so they reach the caller as they are.
        _s3_answer("SlowDownWrite", 503),
        _s3_answer("SlowDownRead", 503),
        _s3_answer("XMinioWriteQuorum", 503),
        _s3_answer("XMinioReadQuorum", 503),
        # throttling and timeouts of other S3 servers
        _s3_answer("Throttling", 400),
        _s3_answer("RequestThrottled", 503),
        _s3_answer("TooManyRequests", 429),
        _s3_answer("RequestLimitExceeded", 503),
        # a proxy or load balancer before the store answers an HTML page: no code, only a
        # status, which says the store is away or busy
        InvalidResponseError(502, "text/html", "<html>502 Bad Gateway</html>"),
        InvalidResponseError(503, "text/html", "<html>Service Unavailable</html>"),
        InvalidResponseError(504, "text/plain", "upstream request timeout"),
        InvalidResponseError(429, "text/plain", "Too Many Requests"),
    ],
    ids=lambda e: f"{type(e).__name__}-{getattr(e, 'code', None) or e.__reduce__()[1][0]}",
)
def test_the_object_store_busy_or_away_by_code_or_status_is_an_outage(error: Exception) -> None:
    """An upload or registration that met these was retried five times and dead-lettered."""
    fault = infrastructure_fault(error)
    assert fault is not None and fault.startswith("object store"), fault
    assert unavailable_detail(fault) == (
        "temporarily unavailable (the object store is unavailable), try again"
    )


@pytest.mark.parametrize(
    "error",
    [
        InvalidResponseError(400, "text/html", "<html>Bad Request</html>"),
        InvalidResponseError(403, "text/html", "<html>Forbidden</html>"),
        InvalidResponseError(501, "text/plain", "Not Implemented"),
        _s3_answer("AccessDenied", 403),
        _s3_answer("NotImplemented", 501),
        _s3_answer("EntityTooLarge", 400),
    ],
    ids=lambda e: f"{type(e).__name__}-{getattr(e, 'code', None) or e.__reduce__()[1][0]}",
)
def test_an_answer_that_refuses_the_request_is_no_outage(error: Exception) -> None:
    assert infrastructure_fault(error) is None


@pytest.mark.parametrize(
    "error",
    [
        # the server ended the session (a timeout of the server's own, the database dropped
        # and made again by a restore): the next statement meets a closed connection
        asyncpg.IdleInTransactionSessionTimeoutError(
            "terminating connection due to idle-in-transaction timeout"
        ),
        asyncpg.TransactionTimeoutError("terminating connection due to transaction timeout"),
        asyncpg.DatabaseDroppedError("terminating connection because the database was dropped"),
        # a failover: the connection reached a standby, or the old primary, now read-only
        asyncpg.ReadOnlySQLTransactionError("cannot execute INSERT in a read-only transaction"),
        # the server's disk or file system failing
        asyncpg.PostgresIOError('could not read block 0 in file "base/16384/16385"'),
        # a login the server refuses now (credentials rotated), a database not there (yet)
        asyncpg.InvalidPasswordError('password authentication failed for user "registry"'),
        asyncpg.InvalidAuthorizationSpecificationError('no pg_hba.conf entry for host "10.0.0.7"'),
        asyncpg.InvalidCatalogNameError('database "trainyard" does not exist'),
    ],
    ids=lambda e: type(e).__name__,
)
def test_postgresql_that_ended_the_session_or_cannot_serve_it_is_an_outage(
    error: Exception,
) -> None:
    """Each said nothing of the event, yet its handler was retried five times and the event
    dead-lettered (a result lost), and an HTTP request answered 500."""
    fault = infrastructure_fault(error)
    assert fault is not None and fault.startswith("PostgreSQL"), fault
    assert unavailable_detail(fault) == (
        "temporarily unavailable (the database is unavailable), try again"
    )
