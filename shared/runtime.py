"""The life of one service process: tracing, signals, background tasks, health, drain.

Contract:
- While the service starts (until its first ``spawn``, ``run`` or ``work_begins``), SIGTERM
  or SIGINT cancels the start-up, which may be waiting for NATS for ever, and
  ``run_service`` returns 0. From then on it sets ``runtime.stopping``. Background tasks
  started with ``spawn`` are expected to return when it is set, after finishing the work in
  hand; ``run`` waits for them
  up to ``shutdown_grace_seconds`` and cancels what is left, then stops the HTTP server, and
  only then do the resources entered on ``runtime.resources`` close (in reverse order).
- A background task that crashes stops the whole process with exit status 1: a service never
  limps on with half its consumers dead.
- Tracing (``shared.telemetry``), metrics (``shared.metrics``) and logging (``shared.logs``)
  are set up when the runtime is entered, the same way in every service. Every logger's
  records go to that one handler, uvicorn's and Litestar's too: neither the HTTP server
  (``log_config=None``) nor an app (``logging_config=None``) installs handlers of its own. When it exits,
  the last spans and metrics get at most ``TELEMETRY_STOP_SECONDS`` to leave (the tracer
  provider stops and the meter provider flushes, side by side; the meter provider stays
  installed for the rest of the process); what has not left by then is dropped, with a
  warning, so an unreachable collector never holds a stop for its exporters' retries.
- ``run`` freezes the heap built during start-up (``gc.freeze()``, after one full
  collection): the modules, settings, pools and app a service keeps for its whole life are
  never traversed again by the garbage collector, whose full collections then cost a
  fraction of what they did (BENCHMARKS.md, "Tracing cost"). While it serves, the
  collector's youngest generation is collected every ``YOUNG_COLLECTION_THRESHOLD``
  allocations (20,000; Python's default is 700): what a request or an event makes mostly
  dies before the next collection, and spans waiting for their batch to be exported are
  walked once instead of being promoted through every generation. It unfreezes the heap
  and puts the thresholds back when it has stopped serving, also when it is cancelled or
  fails.
- Every service serves ``GET /healthz`` (the process is alive), ``GET /readyz`` (200 only
  when every registered readiness check passes, each within ``READINESS_TIMEOUT_SECONDS``;
  503 with the failing check names otherwise: ``database``, ``nats``, ``storage``)
  and ``GET /metrics`` (Prometheus text, no token).
  The bus's check (``Bus.ping``) fails while one of its consumers is paused, waiting out an
  infrastructure outage with a message in hand (``shared.bus``), so a service that cannot
  make progress is not ready even when its own connections look fine.
- ``run_service`` does not wait for threads still blocked on a dependency that does not
  answer (a call to a hung object store, which waits up to its read timeout and a retry,
  made in ``asyncio.to_thread``; the readiness check makes one per probe): once the service
  has stopped, it logs one line naming how many were left and ends the process with the
  service's status. asyncio's end and Python's exit both waited for every such thread: a
  SIGTERM during the outage outlasted the stop's grace and the process was killed.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import logging
import os
import signal
import socket
import sys
import threading
import time
import weakref
from collections.abc import Awaitable, Callable, Coroutine, Generator
from concurrent.futures import ThreadPoolExecutor
from contextlib import AsyncExitStack
from typing import Any, Final, TypeVar

import asyncpg
import uvicorn
from litestar import Litestar, Response, get
from litestar.handlers import HTTPRouteHandler
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.trace import TracerProvider
from pydantic import ValidationError
from pydantic_settings import BaseSettings, SettingsError

from trainyard_platform.shared import outages
from trainyard_platform.shared.bus import Bus, UnkeyedMsgIds, infrastructure_fault
from trainyard_platform.shared.db import open_pool
from trainyard_platform.shared.events.envelope import EventSchemaSettings
from trainyard_platform.shared.http_app import head_routes
from trainyard_platform.shared.http_deadline import SlowClientDeadlines
from trainyard_platform.shared.logs import configure_logging, error_text, formatter
from trainyard_platform.shared.metrics import metrics_route, setup_metrics
from trainyard_platform.shared.metrics_sampler import Sampler, common_readings
from trainyard_platform.shared.settings import (
    DatabaseSettings,
    LogFormatSettings,
    ServiceSettings,
    StorageSettings,
    invalid_settings,
)
from trainyard_platform.shared.storage import LocalStore, ObjectStore, open_store
from trainyard_platform.shared.telemetry import OtelExportSettings, check_span_file, setup_tracing

log = logging.getLogger(__name__)

TELEMETRY_STOP_SECONDS = 5.0
"""Longest a stop waits for the last spans and metrics to be exported. Each OTLP exporter
retries a failed export for ``OTEL_EXPORTER_OTLP_TIMEOUT`` (10 s): against a collector that
refused connections a stop took about 20 s longer, after a drain of up to the shutdown
grace (20 s), past the 30 s that the manifests and compose allow before a kill."""

ReadinessCheck = Callable[[], Awaitable[bool]]
READINESS_TIMEOUT_SECONDS: Final = 1.5
"""Longest a readiness check may take before it counts as failed: the checks run side by
side, so ``/readyz`` answers within the shortest probe timeout of deploy/ (compose's 2 s).
A dependency that holds a request (NATS stopped: its client waits 5 s for an answer) would
otherwise make the probe time out rather than read 503."""
ServiceSettingsT = TypeVar("ServiceSettingsT", bound=ServiceSettings)


class ServiceRuntime:
    """Composition root helper: owns the stop event, tasks, checks and resources."""

    def __init__(self, name: str, settings: ServiceSettings) -> None:
        self.name = name
        self.settings = settings
        self.stopping = asyncio.Event()
        self.resources = AsyncExitStack()
        self._tasks: list[asyncio.Task[None]] = []
        self._checks: dict[str, ReadinessCheck] = {}
        self._abandoned_checks: set[asyncio.Future[bool]] = set()
        """Checks given up on, still cleaning up (held so they are not collected)."""
        self._crashed = False
        self._starting: asyncio.Task[Any] | None = None
        """The task entering the runtime, cancelled by SIGTERM/SIGINT until it serves."""
        self._provider: TracerProvider | None = None
        self._meter_provider: MeterProvider | None = None

    async def __aenter__(self) -> ServiceRuntime:
        configure_logging(self.name, self.settings.log_level, self.settings.log_format)
        # Before anything starts: a span file that cannot be written would otherwise be a
        # logged traceback for every span.
        with needed("the span file", "TRAINYARD_TELEMETRY_SPAN_FILE"):
            check_span_file(self.settings.telemetry)
        self._provider = setup_tracing(self.name, self.settings.telemetry)
        self._meter_provider = setup_metrics(self.name)
        loop = asyncio.get_running_loop()
        self._starting = asyncio.current_task()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._on_signal, sig)
        await self.resources.__aenter__()
        return self

    async def __aexit__(self, *exc: object) -> None:
        try:
            await self.resources.__aexit__(*exc)  # type: ignore[arg-type]
        finally:
            self._stop_telemetry()

    def _stop_telemetry(self) -> None:
        """Stop the tracer provider and flush the meter provider, within
        ``TELEMETRY_STOP_SECONDS`` (see the module docstring). The meter provider is flushed,
        never shut down: OpenTelemetry installs one per process, once, and a shut-down one
        hands out no-op meters, so every later runtime of the process (tests run several)
        had no metrics. (A shut-down tracer provider still takes a later runtime's
        exporters.) A service's process ends right after its stop."""
        stops = [
            stop
            for stop in (
                self._provider.shutdown if self._provider else None,
                self._meter_provider.force_flush if self._meter_provider else None,
            )
            if stop is not None
        ]
        threads = [
            threading.Thread(target=stop, name=f"{self.name} telemetry stop", daemon=True)
            for stop in stops
        ]
        for thread in threads:
            thread.start()
        deadline = time.monotonic() + TELEMETRY_STOP_SECONDS
        for thread in threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        if any(thread.is_alive() for thread in threads):
            log.warning(
                "%s: telemetry not exported within %g s of the stop (collector unreachable?); "
                "the spans and metrics not yet sent are dropped",
                self.name,
                TELEMETRY_STOP_SECONDS,
            )

    def _on_signal(self, sig: signal.Signals) -> None:
        self.stopping.set()
        if self._starting is not None:
            # Still starting (waiting for NATS, PostgreSQL, the object store): nothing to
            # drain, and the wait may last for ever. ``run_service`` ends with status 0.
            log.info("%s received %s while starting: stopping", self.name, sig.name)
            self._starting.cancel()
            self._starting = None
            return
        log.info("%s received %s: draining", self.name, sig.name)

    async def open_pool(self, settings: DatabaseSettings, schema: str) -> asyncpg.Pool:
        """The service's pool (``shared.db.open_pool``), closed with the runtime; PostgreSQL
        unreachable or the URL unusable at start is ``StartupFailed``."""
        with needed("PostgreSQL", "TRAINYARD_DATABASE_URL", server=True):
            pool: asyncpg.Pool = await self.resources.enter_async_context(
                open_pool(settings, schema)
            )
        return pool

    def work_begins(self) -> None:
        """From here on SIGTERM and SIGINT drain (set ``stopping``, which the work heeds)
        instead of cancelling the start-up: the first ``spawn``, ``run``, or a service's own
        call before work that must be drained (the runner's recovery of its jobs)."""
        self._starting = None

    def add_readiness_check(self, name: str, check: ReadinessCheck) -> None:
        self._checks[name] = check

    def sample_metrics(self, bus: Bus, consumer: str, pool: asyncpg.Pool | None = None) -> Sampler:
        """Start reading the gauges every service has (``shared.metrics_sampler``: outbox
        when ``pool`` is given, ``consumer``'s lag and dead letters); return the sampler, to
        which the service may add its own readings before the next await."""
        sampler = Sampler()
        common_readings(sampler, pool, bus, consumer)
        self.spawn(sampler.run(self.stopping), "metrics")
        return sampler

    def spawn(self, coro: Coroutine[Any, Any, None], name: str) -> None:
        """Run ``coro`` in the background for the life of the service."""
        self.work_begins()
        task = asyncio.create_task(coro, name=name)
        task.add_done_callback(self._on_task_done)
        self._tasks.append(task)

    def _on_task_done(self, task: asyncio.Task[None]) -> None:
        if task.cancelled() or task.exception() is None:
            return
        log.error("%s: task %s crashed", self.name, task.get_name(), exc_info=task.exception())
        self._crashed = True
        self.stopping.set()

    async def run(self, app: Litestar | None = None) -> int:
        """Serve HTTP (``app``, or the health endpoints alone) until stopped; return the exit
        status."""
        self.work_begins()
        app = app or Litestar(
            route_handlers=head_routes(self.health_handlers()), logging_config=None
        )
        host, port = self.settings.host, self.settings.port
        try:
            listener = _listening_socket(host, port)
        except OSError as exc:
            prefix = f"TRAINYARD_{self.name.upper()}_"
            log.critical(
                "cannot start: the HTTP listener (%sHOST, %sPORT): %s:%d: %s",
                prefix,
                prefix,
                host,
                port,
                exc.strerror or exc,
            )
            self.stopping.set()
            await self._drain()
            return 1
        # The app's own start and stop (``on_startup``, ``on_shutdown``: the places of
        # ``shared.slots`` it keeps, closed) around serving, here rather than by uvicorn's
        # lifespan: its stop runs once the server has stopped, before the pool it closes
        # over does (the caller's).
        async with app.lifespan():
            return await self._serve(app, listener)

    async def _serve(self, app: Litestar, listener: socket.socket) -> int:
        with startup_heap_frozen():
            server = _EmbeddedServer(
                uvicorn.Config(
                    app,
                    host=self.settings.host,
                    port=self.settings.port,
                    log_level="warning",
                    log_config=None,  # uvicorn's loggers go to the one set-up (shared.logs)
                    lifespan="off",
                    http=SlowClientDeadlines,
                    server_header=False,  # "server: uvicorn" tells a prober what to try
                )
            )
            serving = asyncio.create_task(server.serve(sockets=[listener]), name="http")
            await self.stopping.wait()
            await self._drain()
            server.should_exit = True
            await serving
        return 1 if self._crashed else 0

    async def _drain(self) -> None:
        pending = [t for t in self._tasks if not t.done()]
        if not pending:
            return
        _, still_running = await asyncio.wait(pending, timeout=self.settings.shutdown_grace_seconds)
        for task in still_running:
            log.warning("%s: %s did not finish within the grace period", self.name, task.get_name())
            task.cancel()
        if still_running:
            await asyncio.wait(still_running)

    async def is_ready(self) -> dict[str, bool]:
        """Every readiness check, side by side, each given ``READINESS_TIMEOUT_SECONDS``: one
        that raises or has not answered by then is False, and the answer does not wait for
        its clean-up. A check cancelled inside a pooled connection's ``async with`` finishes
        only once asyncpg has handed the connection back, which against a PostgreSQL that
        does not answer took the ping's whole acquire timeout: ``/readyz`` answered after
        3.5 s, past compose's 2 s probe. Such a check is cancelled and left to finish on
        its own."""

        async def one(check: ReadinessCheck) -> bool:
            task = asyncio.ensure_future(check())
            try:
                done, _ = await asyncio.wait({task}, timeout=READINESS_TIMEOUT_SECONDS)
            finally:
                if not task.done():
                    task.cancel()
                    self._abandoned_checks.add(task)
                    task.add_done_callback(self._abandoned_checks.discard)
                    # Retrieved, so that one ending in an error logs no warning.
                    task.add_done_callback(lambda t: t.cancelled() or t.exception())
            if not done:
                return False
            try:
                return bool(task.result())
            except Exception:  # a failing check means "not ready", never a crash
                return False

        names = list(self._checks)
        answers = await asyncio.gather(*(one(self._checks[name]) for name in names))
        return dict(zip(names, answers, strict=True))

    def health_handlers(self) -> list[HTTPRouteHandler]:
        """``/healthz``, ``/readyz`` and ``/metrics`` (``shared.metrics``) route handlers, for
        inclusion in a service's own app."""
        runtime = self

        @get("/healthz", sync_to_thread=False, include_in_schema=False)
        def healthz() -> dict[str, str]:
            return {"status": "ok", "service": runtime.name}

        @get("/readyz", include_in_schema=False)
        async def readyz() -> Response[dict[str, Any]]:
            checks = await runtime.is_ready()
            ready = all(checks.values()) and not runtime.stopping.is_set()
            return Response(
                {"ready": ready, "service": runtime.name, "checks": checks},
                status_code=200 if ready else 503,
            )

        return [healthz, readyz, metrics_route()]


YOUNG_COLLECTION_THRESHOLD: Final = 20_000
"""Allocations between two collections of the youngest generation while a service serves
(``gc.set_threshold``'s first value; the older generations' stay as they were)."""


@contextlib.contextmanager
def startup_heap_frozen() -> Generator[None, None, None]:
    """While the first of the services of this process serves until the last stops: every
    object alive at the start in the collector's permanent generation, and the youngest
    generation collected every ``YOUNG_COLLECTION_THRESHOLD`` allocations (never more often
    than before). At the end, however serving ended, all is collectable again and the
    thresholds are as they were: a process that serves several times (tests start many
    services in one process, some at overlapping times) would otherwise keep each one's
    frozen cycles for good, or restore the thresholds under a service still serving.

    Start-up leaves a large heap that lives as long as the process (imported modules,
    pydantic schemas, the app, pools); each full collection walked all of it again, so the
    garbage that every span, event and query makes paid for the start-up heap too. The one
    collection first drops start-up's own garbage, so none of it is frozen. With Python's
    700, the scheduler collected its youngest generation about 500 times in a run of 2,400
    decisions and promoted what was alive (spans queued for export among it) to the older
    generations, whose collections walk it again: 0.09-0.14 s of collections a run traced
    (0.07-0.10 untraced) against 0.03-0.05 (0.02) at 20,000, each collection of the
    youngest generation then taking about 4 ms (BENCHMARKS.md, "Tracing cost")."""
    global _serving, _thresholds_before
    with _serving_lock:
        if _serving == 0:
            gc.collect()
            gc.freeze()
            _thresholds_before = gc.get_threshold()
            young, *older = _thresholds_before
            gc.set_threshold(max(YOUNG_COLLECTION_THRESHOLD, young), *older)
        _serving += 1
    try:
        yield
    finally:
        with _serving_lock:
            _serving -= 1
            if _serving == 0 and _thresholds_before is not None:
                gc.unfreeze()
                gc.set_threshold(*_thresholds_before)


_serving_lock = threading.Lock()
_serving = 0
"""Services of this process serving now (``startup_heap_frozen``)."""
_thresholds_before: tuple[int, int, int] | None = None


def _listening_socket(host: str, port: int) -> socket.socket:
    """The HTTP server's socket, bound here (as uvicorn would) so that a port in use is the
    runtime's to report, with the settings that name it."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    sock.set_inheritable(True)
    return sock


class _EmbeddedServer(uvicorn.Server):
    """uvicorn inside our own loop: the runtime owns the signals, not uvicorn."""

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        yield


DEPENDENCY_UNAVAILABLE_STATUS: Final = os.EX_TEMPFAIL
"""The exit status (75, EX_TEMPFAIL of sysexits.h) of a start that failed only because a
dependency is unavailable now (``StartupFailed.transient``): the same start may succeed
later, so a supervisor starts it again for as long as it takes (``deploy.local``'s
watchdog never gives up on it); any other failed start is 1, a refused configuration 2."""


class StartupFailed(Exception):
    """A dependency a service needs to start could not be reached or used; the message
    names it and its setting, never the setting's value (a URL may hold a password).
    ``transient``: it was an outage (``bus.infrastructure_fault``: unreachable, timed out,
    refusing connections now), not a use that can never work (a malformed URL)."""

    def __init__(self, message: str, *, transient: bool = False) -> None:
        super().__init__(message)
        self.transient = transient


class StartupRefused(Exception):
    """The operator's configuration stops the start in a way no one setting's check can see
    (the runner's job uids held by another runner on the host): exit status 2, as for a
    bad setting, with one log line in the service's log format; the message says what to
    change."""


@contextlib.contextmanager
def needed(dependency: str, settings: str, *, server: bool = False) -> Generator[None, None, None]:
    """A step of the start-up that needs ``dependency``, configured by ``settings``: any
    error in it is ``StartupFailed`` naming both, with the error's own text on one line.
    ``server``: the dependency is a server that may be away for a while (PostgreSQL, the
    object store), so an infrastructure fault reaching it is ``transient``; a local file or
    folder is not waited for."""
    try:
        yield
    except Exception as exc:
        raise StartupFailed(
            f"{dependency} ({settings}): {error_text(exc)}",
            transient=server and infrastructure_fault(exc) is not None,
        ) from exc


async def open_service_store(settings: StorageSettings) -> ObjectStore:
    """The service's object store (``open_store``; S3 makes its bucket if missing, a local
    store its folder, blocking calls kept off the loop); unreachable or unusable at start is
    ``StartupFailed``."""
    with needed("the object store", "TRAINYARD_STORAGE_URI, TRAINYARD_STORAGE_S3_*", server=True):
        store = await asyncio.to_thread(open_store, settings.uri, settings)
        if isinstance(store, LocalStore):
            # Its folder is made at the first write otherwise, and readiness
            # (``store_answers``) asks that it exist: a fresh store would never be ready.
            await asyncio.to_thread(store.root.mkdir, 0o700, True, True)
    outages.OBJECT_STORE.watched()
    return store


READINESS_KEY: Final = ".trainyard-readiness"
"""The key whose metadata the object store's readiness check asks for (it need not exist)."""


async def store_answers(store: ObjectStore) -> bool:
    """Readiness of the object store: a local folder exists; an S3 endpoint answers a request
    for an object's metadata (present or not), in a thread (the client blocks).

    At most one such check is in flight per store: a probe that comes while one has not
    answered yet waits for that one (``asyncio.shield``: a probe given up cancels only its
    own wait). Each probe started a thread of its own, and against an endpoint that never
    answers each thread lived for the client's timeouts (a local folder on a hung network
    mount: for ever) while ``/readyz`` gave up after ``READINESS_TIMEOUT_SECONDS``: the
    probes filled the default thread pool, which every ``asyncio.to_thread`` of the service
    shares."""
    check = _store_checks.get(store)
    if check is None or check.done() or check.get_loop() is not asyncio.get_running_loop():
        check = asyncio.ensure_future(asyncio.to_thread(_store_answers_now, store))
        check.add_done_callback(_told_to_outages)
        _store_checks[store] = check
    return await asyncio.shield(check)


def _told_to_outages(check: asyncio.Future[bool]) -> None:
    """Tell ``outages.OBJECT_STORE`` what a finished store check found: it is the one call
    to the store that every service makes while the store is away, however idle, so the
    outage is logged (one line, and one when it is back) even where nothing else calls it.
    The error is retrieved here, so a check nobody waits for any more logs no warning."""
    if check.cancelled():
        return
    failure = check.exception()
    if failure is None:
        outages.OBJECT_STORE.answered()
    else:
        outages.report(failure)


def _store_answers_now(store: ObjectStore) -> bool:
    """``store_answers``' check itself, blocking."""
    if isinstance(store, LocalStore):
        return store.root.is_dir()
    store.exists(READINESS_KEY)
    return True


_store_checks: weakref.WeakKeyDictionary[ObjectStore, asyncio.Future[bool]] = (
    weakref.WeakKeyDictionary()
)
"""The readiness check in flight of each store (``store_answers``)."""


def run_service(serving: Coroutine[Any, Any, int]) -> int:
    """Run a service's ``serve`` to its end and return its exit status: with one log line
    (``cannot start: ...``) when a dependency failed its start-up (``StartupFailed``),
    ``DEPENDENCY_UNAVAILABLE_STATUS`` (75) when it was an outage and 1 otherwise; 2 with
    one when the configuration refuses it (``StartupRefused``; a bus whose message ids
    cannot be keyed, ``bus.UnkeyedMsgIds``), 0 when SIGTERM or SIGINT
    stopped it while it was starting."""
    executor = ThreadPoolExecutor(thread_name_prefix=_THREADS)
    try:
        status = asyncio.run(_with_executor(executor, serving))
    except StartupFailed as exc:
        log.critical("cannot start: %s", exc)
        status = DEPENDENCY_UNAVAILABLE_STATUS if exc.transient else 1
    except (StartupRefused, UnkeyedMsgIds) as exc:
        log.critical("cannot start: %s", exc)
        status = 2
    except asyncio.CancelledError:  # SIGTERM or SIGINT while starting (ServiceRuntime)
        log.info("stopped before it had started")
        status = 0
    _leave_blocked_threads(status)
    return status


IDLE_THREADS_END_S: Final = 1.0
"""How long the threads of the executor, told to end, get to do so before they count as
blocked."""
_THREADS: Final = "service-thread"
"""The name (and prefix) of the threads of a service's default executor."""


async def _with_executor(executor: ThreadPoolExecutor, serving: Coroutine[Any, Any, int]) -> int:
    """``serving`` with ``executor`` as the loop's default (``asyncio.to_thread``'s); at its
    end the loop gets a fresh one, so asyncio's own end waits for no thread of ``executor``."""
    loop = asyncio.get_running_loop()
    loop.set_default_executor(executor)
    try:
        return await serving
    finally:
        loop.set_default_executor(ThreadPoolExecutor(thread_name_prefix="service-end"))
        executor.shutdown(wait=False, cancel_futures=True)


def _leave_blocked_threads(status: int) -> None:
    """End the process now with ``status`` when threads of the service's executor are still
    blocked (see the module): Python's exit would join them first."""
    deadline = time.monotonic() + IDLE_THREADS_END_S
    for thread in threading.enumerate():
        if thread.name.startswith(f"{_THREADS}_"):  # an idle one ends at once
            thread.join(timeout=max(0.0, deadline - time.monotonic()))
    blocked = [t for t in threading.enumerate() if t.name.startswith(f"{_THREADS}_")]
    if not blocked:
        return
    log.warning(
        "%d threads still wait on a dependency that does not answer; the process ends without them",
        len(blocked),
    )
    logging.shutdown()  # flushes the log; os._exit runs no exit handler
    os._exit(status)


def serve_from_command_line(
    name: str,
    summary: str,
    settings_type: type[ServiceSettingsT],
    serve: Callable[[ServiceSettingsT], Coroutine[Any, Any, int]],
    argv: list[str] | None = None,
) -> int:
    """``python -m trainyard_platform.services.<name> [--host H] [--port P]``: build the settings (the flags
    override ``TRAINYARD_<NAME>_HOST/PORT``), serve until SIGTERM, return the exit status.
    Bad settings are named, one line each (one JSON log line naming them all under
    ``TRAINYARD_LOG_FORMAT=json``), with exit status 2 and nothing started."""
    prefix = f"TRAINYARD_{name.upper()}_"
    parser = argparse.ArgumentParser(
        prog=f"python -m trainyard_platform.services.{name}",
        description=f"Trainyard {name}: {summary} (settings come from {prefix}* and the "
        "shared TRAINYARD_* variables).",
    )
    parser.add_argument("--host", help=f"listen address (overrides {prefix}HOST)")
    parser.add_argument("--port", type=int, help=f"listen port (overrides {prefix}PORT)")
    args = parser.parse_args(argv)
    overrides = {k: v for k, v in (("host", args.host), ("port", args.port)) if v is not None}
    settings = service_settings_or_exit(parser.prog, settings_type, **overrides)
    return run_service(serve(settings))


SettingsT = TypeVar("SettingsT", bound=BaseSettings)


def settings_or_exit(prog: str, settings_type: type[SettingsT], **overrides: Any) -> SettingsT:
    """The settings from the environment and ``overrides``; if any is bad, print one line
    per bad setting (its variable, the reason, the value) and exit with status 2."""
    settings, bad = _settings_and_errors(settings_type, **overrides)
    _exit_if_bad(prog, bad)
    assert settings is not None
    return settings


def service_settings_or_exit(
    prog: str, settings_type: type[SettingsT], **overrides: Any
) -> SettingsT:
    """``settings_or_exit`` for a service: its settings, the ``OTEL_*`` variables the
    services read themselves (``OtelExportSettings``) and the events' schema base
    (``EventSchemaSettings``, read when the first event is made), every bad one named
    before the service starts anything (a bad ``OTEL_*`` would otherwise fail inside the
    start-up, with a traceback; a bad schema base every publish). Every service's command
    line goes through here. Under ``TRAINYARD_LOG_FORMAT=json`` (when that setting itself
    is good) the refusal is one log line of that format, as a log pipeline reads the
    service's other lines."""
    settings, bad = _settings_and_errors(settings_type, **overrides)
    bad_otel = [
        *_settings_and_errors(OtelExportSettings)[1],
        *_settings_and_errors(EventSchemaSettings)[1],
    ]
    if bad or bad_otel:
        chosen, _ = _settings_and_errors(LogFormatSettings)
        if chosen is not None and chosen.log_format == "json":
            _exit_logging_json(_service_name(settings_type, prog), bad + bad_otel)
    _exit_if_bad(prog, bad + bad_otel)
    assert settings is not None
    return settings


def _service_name(settings_type: type[BaseSettings], prog: str) -> str:
    """``billing`` of ``TRAINYARD_BILLING_``, the service's settings prefix."""
    prefix = str(settings_type.model_config.get("env_prefix", ""))
    return prefix.removeprefix("TRAINYARD_").strip("_").lower() or prog


def _exit_logging_json(service: str, bad: list[str]) -> None:
    """Under ``TRAINYARD_LOG_FORMAT=json``: the refusal as one log line of the service's
    JSON format (``logs.JsonFormatter``: a log pipeline reads nothing else), every bad
    setting in its message; exit status 2."""
    message = "cannot start: " + "; ".join(f"invalid setting {line}" for line in bad)
    record = log.makeRecord(log.name, logging.CRITICAL, __file__, 0, message, (), None)
    print(formatter(service, "json").format(record), file=sys.stderr)
    raise SystemExit(2)


def _settings_and_errors(
    settings_type: type[SettingsT], **overrides: Any
) -> tuple[SettingsT | None, list[str]]:
    try:
        return settings_type(**overrides), []
    except (ValidationError, SettingsError) as error:
        return None, invalid_settings(settings_type, error)


def _exit_if_bad(prog: str, bad: list[str]) -> None:
    for line in bad:
        print(f"{prog}: invalid setting {line}", file=sys.stderr)
    if bad:
        raise SystemExit(2)
