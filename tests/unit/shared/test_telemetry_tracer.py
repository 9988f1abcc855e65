"""``shared.telemetry.tracer``'s spans are the API's: the same spans, parents, events and
statuses as ``Tracer.start_as_current_span`` with ``use_span`` makes, from whichever provider
the process has when the span is made; and ``ServiceRuntime.run`` freezes the start-up heap."""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Iterator
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import trainyard_platform.shared.runtime as runtime_module
import trainyard_platform.shared.telemetry as telemetry
from trainyard_platform.deploy.local.ports import free_port
from trainyard_platform.shared.runtime import YOUNG_COLLECTION_THRESHOLD, ServiceRuntime
from trainyard_platform.shared.settings import ServiceSettings


def _provider() -> tuple[TracerProvider, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider, exporter


def _shape(span: ReadableSpan) -> dict[str, Any]:
    """What the two tracers must agree on (ids and times differ)."""
    parent = span.parent
    return {
        "name": span.name,
        "kind": span.kind,
        "has_parent": parent is not None,
        "attributes": dict(span.attributes or {}),
        "status": (span.status.status_code, span.status.description),
        "events": [(e.name, sorted((e.attributes or {}).keys())) for e in span.events],
        "ended": span.end_time is not None,
    }


def _run(tracer: trace.Tracer, failure: BaseException | None, **options: Any) -> list[str]:
    """Open an outer and an inner span; the inner block raises ``failure`` (if any), caught
    outside the outer one. Returns what was seen inside, to compare."""
    seen = []
    try:
        with tracer.start_as_current_span("outer", attributes={"a": "1"}) as outer:
            seen.append(f"outer current {trace.get_current_span() is outer}")
            with tracer.start_as_current_span(
                "inner", kind=trace.SpanKind.CLIENT, **options
            ) as inner:
                seen.append(f"inner current {trace.get_current_span() is inner}")
                parent = inner.parent  # type: ignore[attr-defined]
                seen.append(f"inner's parent is outer {parent == outer.get_span_context()}")
                if failure is not None:
                    raise failure
            seen.append(f"outer current again {trace.get_current_span() is outer}")
    except BaseException as caught:
        seen.append(f"raised {type(caught).__name__}")
    seen.append(f"nothing current after {not trace.get_current_span().is_recording()}")
    return seen


CASES = [
    pytest.param(None, {}, id="no-error"),
    pytest.param(ValueError("bad value"), {}, id="exception"),
    pytest.param(asyncio.CancelledError(), {}, id="base-exception-is-no-error"),
    pytest.param(KeyError("k"), {"record_exception": False}, id="not-recorded"),
    pytest.param(KeyError("k"), {"set_status_on_exception": False}, id="no-status"),
]


@pytest.mark.parametrize(("failure", "options"), CASES)
def test_spans_match_the_sdk_tracers(failure: BaseException | None, options: Any) -> None:
    sdk_provider, sdk_spans = _provider()
    ours_provider, our_spans = _provider()
    ours = telemetry.DirectTracerProvider(ours_provider).get_tracer("test")

    seen_sdk = _run(sdk_provider.get_tracer("test"), failure, **options)
    seen_ours = _run(ours, failure, **options)

    assert seen_ours == seen_sdk
    assert "inner's parent is outer True" in seen_ours
    assert [_shape(s) for s in our_spans.get_finished_spans()] == [
        _shape(s) for s in sdk_spans.get_finished_spans()
    ]
    assert len(our_spans.get_finished_spans()) == 2


def test_end_on_exit_false_leaves_the_span_open() -> None:
    provider, spans = _provider()
    tracer = telemetry.DirectTracerProvider(provider).get_tracer("test")
    with tracer.start_as_current_span("kept open", end_on_exit=False) as span:
        pass
    assert spans.get_finished_spans() == ()
    span.end()
    assert [s.name for s in spans.get_finished_spans()] == ["kept open"]


def test_the_span_starts_when_the_block_is_entered() -> None:
    provider, spans = _provider()
    tracer = telemetry.DirectTracerProvider(provider).get_tracer("test")
    block = tracer.start_as_current_span("later")
    assert not trace.get_current_span().is_recording()
    with block as span:
        assert span.is_recording()
    assert [s.name for s in spans.get_finished_spans()] == ["later"]


@pytest.fixture
def global_provider(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[trace.TracerProvider]]:
    """The provider ``trace.get_tracer_provider()`` answers with: the last of the list."""
    providers: list[trace.TracerProvider] = [trace.NoOpTracerProvider()]
    monkeypatch.setattr(trace, "get_tracer_provider", lambda: providers[-1])
    yield providers


def test_a_tracer_made_before_set_up_uses_the_provider_set_up_later(
    global_provider: list[trace.TracerProvider],
) -> None:
    tracer = telemetry.tracer("early module")
    with tracer.start_as_current_span("before set-up") as span:
        assert not span.is_recording()

    provider, spans = _provider()
    global_provider.append(provider)
    with tracer.start_as_current_span("after set-up") as span:
        assert span.is_recording()
    tracer.start_span("plain").end()

    finished = spans.get_finished_spans()
    assert [s.name for s in finished] == ["after set-up", "plain"]
    scope = finished[0].instrumentation_scope
    assert scope is not None and scope.name == "early module"


def test_the_database_instrumentation_gets_such_tracers() -> None:
    provider, _ = _provider()
    wrapped = telemetry.DirectTracerProvider(provider)
    tracer = trace.get_tracer("opentelemetry.instrumentation.asyncpg", "1.0", wrapped)
    assert isinstance(tracer, telemetry._DirectTracer)
    with tracer.start_as_current_span("SELECT") as span:
        assert span.is_recording()


def test_serving_freezes_the_start_up_heap() -> None:
    """``run`` moves the start-up heap out of the collector's reach before it serves, and
    collects the youngest generation every ``YOUNG_COLLECTION_THRESHOLD`` allocations; both
    are put back when it has stopped."""
    gc.unfreeze()
    thresholds = gc.get_threshold()
    gc.set_threshold(700, 10, 10)
    settings = ServiceSettings(port=free_port())
    frozen_while_serving: list[int] = []
    thresholds_while_serving: list[tuple[int, int, int]] = []

    async def serve_and_stop() -> int:
        # Not entered: entering installs the process's tracer and meter providers.
        runtime = ServiceRuntime("frozen", settings)

        async def look_and_stop() -> None:
            frozen_while_serving.append(gc.get_freeze_count())
            thresholds_while_serving.append(gc.get_threshold())
            runtime.stopping.set()

        runtime.spawn(look_and_stop(), "look")
        return await runtime.run()

    try:
        assert asyncio.run(serve_and_stop()) == 0
        assert frozen_while_serving[0] > 0
        assert thresholds_while_serving == [(YOUNG_COLLECTION_THRESHOLD, 10, 10)]
        assert gc.get_freeze_count() == 0
        assert gc.get_threshold() == (700, 10, 10)
    finally:
        gc.unfreeze()
        gc.set_threshold(*thresholds)


def test_a_cancelled_run_unfreezes_the_heap() -> None:
    """``run`` cancelled while it serves (a test or a caller that gives up on it) still hands
    the frozen heap back to the collector."""
    gc.unfreeze()
    settings = ServiceSettings(port=free_port())
    frozen_while_serving: list[int] = []

    async def serve_and_cancel() -> None:
        # Not entered: entering installs the process's tracer and meter providers.
        runtime = ServiceRuntime("frozen", settings)
        serving = asyncio.create_task(runtime.run())
        while not gc.get_freeze_count():
            await asyncio.sleep(0)
        frozen_while_serving.append(gc.get_freeze_count())
        serving.cancel()
        with pytest.raises(asyncio.CancelledError):
            await serving

    try:
        asyncio.run(serve_and_cancel())
        assert frozen_while_serving[0] > 0
        assert gc.get_freeze_count() == 0
    finally:
        gc.unfreeze()


def test_services_serving_at_overlapping_times_keep_the_heap_frozen_until_the_last_stops() -> None:
    """Two services of one process (tests start several): the first to stop leaves the heap
    frozen and the thresholds raised for the one still serving; the last puts both back."""
    gc.unfreeze()
    thresholds = gc.get_threshold()
    gc.set_threshold(700, 10, 10)
    seen_after_first_stopped: list[tuple[int, tuple[int, int, int]]] = []

    async def two_services() -> None:
        # Not entered: entering installs the process's tracer and meter providers.
        first = ServiceRuntime("first", ServiceSettings(port=free_port()))
        second = ServiceRuntime("second", ServiceSettings(port=free_port()))
        serving_first = asyncio.create_task(first.run())
        while not gc.get_freeze_count():
            await asyncio.sleep(0)
        serving_second = asyncio.create_task(second.run())
        while runtime_module._serving < 2:  # the second serves too
            await asyncio.sleep(0.01)
        first.stopping.set()
        assert await serving_first == 0
        seen_after_first_stopped.append((gc.get_freeze_count(), gc.get_threshold()))
        second.stopping.set()
        assert await serving_second == 0

    try:
        asyncio.run(two_services())
        frozen, raised = seen_after_first_stopped[0]
        assert frozen > 0
        assert raised == (YOUNG_COLLECTION_THRESHOLD, 10, 10)
        assert gc.get_freeze_count() == 0
        assert gc.get_threshold() == (700, 10, 10)
    finally:
        gc.unfreeze()
        gc.set_threshold(*thresholds)
