"""What one span costs in this process, in CPU microseconds, and what encoding it costs.

Run: ``.venv/bin/python -m bench.span_cost [--spans 20000]``; prints a line per case and
writes ``bench/results/span_cost.json``. No services: the SDK's tracer provider with one
processor that keeps the ended spans, spans shaped like the scheduler's, timed with
``time.process_time`` (CPU, so other load on the machine disturbs it less than wall time).

* **make**: start and end the span with its attributes (and events), as the scheduler does,
  with the SDK's tracer (**make**) and with the tracer the services get from
  ``shared.telemetry`` (**make, ours**: one context manager for ``start_as_current_span``
  where the SDK stacks two generator ones), alternately three times, the least of each kept;
* **encode (SDK)**: the OTLP exporter's own encoder, ``encode_spans(...)`` serialized, per
  span in batches of 512 (the batch processor's default);
* **encode (ours)**: ``shared.otlp_encoding.encode_request``, what the OTLP/HTTP exporter of
  ``shared.otlp_http`` sends (the same request);

for: a consumer span like ``<event> process`` (six messaging attributes), a pass's
``scheduler grant`` (one attribute), and the queue-wait span this benchmark prices before
anyone builds it (``scheduler queue wait``: made at the grant with the job's arrival as its
start, one attribute, and 0, 1 or 3 ``job.pending`` events of three attributes each).

And a **database span**, the submission service's job ``INSERT`` statement as a ``fetchval``
on a TCP connection: the whole per-query method of the asyncpg instrumentation (describing
the statement and connection, making and ending the span; the query itself an empty
coroutine, no database), **make** the library's ``AsyncPGInstrumentor`` as shipped (with the
SDK's tracer), **make, ours** ``shared.db_spans.WithinTraceAsyncPG`` as the services install
it, both inside a recording span.

The encoding figures repeat within a few per cent; the making ones move more (the garbage
collector runs over every span kept so far -- each timed run starts after a full collection --
and other load shares the cores), by up to half between runs on a busy 2-core machine:
compare making costs within one run.
"""

from __future__ import annotations

import argparse
import datetime as dt
import functools
import gc
import os
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NamedTuple

from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.instrumentation._semconv import _StabilityMode
from opentelemetry.instrumentation.asyncpg import AsyncPGInstrumentor
from opentelemetry.instrumentation.asyncpg.version import __version__ as asyncpg_version
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import NonRecordingSpan, SpanContext, SpanKind, TraceFlags

from bench.tracing_cost import machine, write_result
from trainyard_platform.shared.db_spans import WithinTraceAsyncPG
from trainyard_platform.shared.otlp_encoding import encode_request
from trainyard_platform.shared.telemetry import DirectTracerProvider

RESULTS = Path(__file__).parent / "results" / "span_cost.json"
BATCH = 512
_PARENT = trace.set_span_in_context(
    NonRecordingSpan(
        SpanContext(0x5B8EFFF798038103D269B633813FC60C, 0xEEE19B7EC3C1B174, True, TraceFlags(1))
    )
)
_PENDING = {"reason": "Resources", "position": 3, "blocking": "job-1"}


def _consumer(tracer: trace.Tracer, i: int, _: int) -> None:
    with tracer.start_as_current_span(
        "trainyard.job.submitted.v1 process",
        context=_PARENT,
        kind=SpanKind.CONSUMER,
        attributes={
            "messaging.system": "nats",
            "messaging.destination.name": "trainyard.job.submitted.v1.team-a",
            "messaging.message.id": f"0b5b9d6e-4f7e-4c39-9d1b-{i:012d}",
            "cloudevents.event_type": "trainyard.job.submitted.v1",
            "cloudevents.event_subject": f"job-{i}",
            "messaging.consumer.group.name": "scheduler",
        },
    ):
        pass


def _grant(tracer: trace.Tracer, i: int, _: int) -> None:
    with tracer.start_as_current_span(
        "scheduler grant", context=_PARENT, attributes={"trainyard.job_id": f"job-{i}"}
    ):
        pass


def _queue_wait(tracer: trace.Tracer, i: int, events: int) -> None:
    now = time.time_ns()
    span = tracer.start_span(
        "scheduler queue wait",
        context=_PARENT,
        start_time=now - 2_000_000_000,
        attributes={"trainyard.job_id": f"job-{i}"},
    )
    for e in range(events):
        span.add_event("job.pending", _PENDING, timestamp=now - 1_000_000_000 + e)
    span.end(end_time=now)


_STATEMENT = """WITH job AS (
               INSERT INTO jobs (id, team_id, user_id, name, spec, status, idempotency_key,
                                 submitted_at, updated_at, trace_id)
               VALUES ($1, $2, $3, $4, $5, 'QUEUED', $6, $7, $7, $8)
               ON CONFLICT (user_id, idempotency_key) DO NOTHING RETURNING id)
           INSERT INTO job_history (job_id, status, at, reason)
           SELECT id, 'QUEUED', $7, 'submitted' FROM job RETURNING true"""


class _Params(NamedTuple):
    user: str
    password: str
    database: str


class _Connection:
    """What the instrumentation reads of an asyncpg connection."""

    def __init__(self) -> None:
        self._params = _Params("trainyard", "not-read", "trainyard")
        self._addr = ("127.0.0.1", 5432)


async def _no_query(*args: Any, **kwargs: Any) -> bool:
    return True


def _instrumentor(cls: type[AsyncPGInstrumentor], tracers: trace.TracerProvider) -> Any:
    """``cls`` as ``instrument()`` leaves it, without wrapping asyncpg (the class is a
    process-wide singleton; this one is not)."""
    made = object.__new__(cls)
    made.__init__()
    made._semconv_opt_in_mode = _StabilityMode.DEFAULT
    made._tracer = trace.get_tracer(
        "opentelemetry.instrumentation.asyncpg", asyncpg_version, tracers
    )
    return made


def _database_statements(instrumentor: Any, count: int) -> None:
    connection = _Connection()
    for i in range(count):
        args = (_STATEMENT, f"job-{i}", "team-a", "ann", "train", "{}", f"key-{i}", i, None)
        query = instrumentor._do_execute(_no_query, connection, args, {})
        try:  # noqa: SIM105  (a context manager per query would be timed too)
            query.send(None)
        except StopIteration:
            pass


def _measure_database(count: int) -> dict[str, float]:
    kept = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource.create({"service.name": "submission"}))
    provider.add_span_processor(SimpleSpanProcessor(kept))
    instrumentors = {
        "sdk": _instrumentor(AsyncPGInstrumentor, provider),
        "ours": _instrumentor(WithinTraceAsyncPG, DirectTracerProvider(provider)),
    }
    made: dict[str, list[float]] = {"sdk": [], "ours": []}
    with provider.get_tracer("bench").start_as_current_span("request", context=_PARENT):
        for _ in range(3):
            for which, instrumentor in instrumentors.items():
                kept.clear()
                gc.collect()  # each run starts from the same heap
                made[which].append(
                    _per_span_us(
                        count, functools.partial(_database_statements, instrumentor, count)
                    )
                )
    return _figures(made, list(kept.get_finished_spans()))


def _figures(made: dict[str, list[float]], spans: list[ReadableSpan]) -> dict[str, float]:
    """A case's figures: the least of its making runs per tracer, and both encoders on the
    spans it made."""
    return {
        "make_us": min(made["sdk"]),
        "make_ours_us": min(made["ours"]),
        "encode_sdk_us": _per_span_us(len(spans), lambda: _encode(_sdk_encoder, spans)),
        "encode_ours_us": _per_span_us(len(spans), lambda: _encode(encode_request, spans)),
    }


def _per_span_us(spans: int, work: Callable[[], Any]) -> float:
    started = time.process_time()
    work()
    return round((time.process_time() - started) / spans * 1e6, 2)


def _encode(encoder: Callable[[Sequence[ReadableSpan]], Any], spans: list[ReadableSpan]) -> None:
    for start in range(0, len(spans), BATCH):
        encoder(spans[start : start + BATCH])


def _sdk_encoder(batch: Sequence[ReadableSpan]) -> bytes:
    return encode_spans(batch).SerializePartialToString()


def _measure_case(
    make: Callable[[trace.Tracer, int, int], None], events: int, count: int
) -> dict[str, float]:
    kept = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource.create({"service.name": "scheduler"}))
    provider.add_span_processor(SimpleSpanProcessor(kept))
    name = "trainyard_platform.services.scheduler.scheduling"
    tracers = {
        "sdk": provider.get_tracer(name),
        "ours": DirectTracerProvider(provider).get_tracer(name),
    }
    made: dict[str, list[float]] = {"sdk": [], "ours": []}
    for _ in range(3):
        for which, tracer in tracers.items():
            kept.clear()
            gc.collect()  # each run starts from the same heap
            made[which].append(
                _per_span_us(count, lambda t=tracer: [make(t, i, events) for i in range(count)])
            )
    return _figures(made, list(kept.get_finished_spans()))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.span_cost")
    parser.add_argument("--spans", type=int, default=20_000)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    cases: list[tuple[str, Callable[[trace.Tracer, int, int], None] | None, int]] = [
        ("consumer process span", _consumer, 0),
        ("scheduler grant", _grant, 0),
        ("queue wait, no event", _queue_wait, 0),
        ("queue wait, 1 pending event", _queue_wait, 1),
        ("queue wait, 3 pending events", _queue_wait, 3),
        ("database statement (fetchval)", None, 0),
    ]
    load_before = os.getloadavg()
    results = []
    for name, make, events in cases:
        if make is None:
            measured = _measure_database(args.spans)
        else:
            measured = _measure_case(make, events, args.spans)
        results.append({"span": name, **measured})
        print(
            f"{name:>30}: make {measured['make_us']:6.1f} us "
            f"(ours {measured['make_ours_us']:6.1f}), encode: "
            f"SDK {measured['encode_sdk_us']:5.1f} us, ours {measured['encode_ours_us']:5.1f} us "
            "(per span, CPU)",
            flush=True,
        )
    result = {
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "machine": machine(load_before),
        "spans_per_case": args.spans,
        "batch": BATCH,
        "cases": results,
    }
    write_result(args.out, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
