"""A job's trace does not grow with its length: its progress reports and metric batches (and
every node's heartbeats) are published and handled outside any trace, and the job's other
report spans summarise them. A 72 s job had 742 spans, about 2 a second."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from opentelemetry import trace
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from trainyard_platform.services.runner.publishing import JobEvents
from trainyard_platform.shared.bus import Bus, Delivery
from trainyard_platform.shared.events import Envelope, Payload
from trainyard_platform.shared.events.payloads import (
    CheckpointRef,
    CheckpointSaved,
    JobMetrics,
    JobProgress,
    JobSucceeded,
    MetricPoint,
    RunnerHeartbeat,
)
from trainyard_platform.shared.settings import NatsSettings
from trainyard_platform.shared.telemetry import tracer

NOW = datetime(2026, 1, 1, tzinfo=UTC)
_tracer = tracer(__name__)


class RecordingJetStream:
    def __init__(self) -> None:
        self.headers: dict[str, dict[str, str]] = {}

    async def publish(self, subject: str, body: bytes, **kwargs: Any) -> None:
        self.headers[subject] = kwargs["headers"]


class FakeNats:
    is_connected = True
    stats: dict[str, int] = {"reconnects": 0}

    def __init__(self) -> None:
        self.js = RecordingJetStream()

    def jetstream(self) -> RecordingJetStream:
        return self.js


def wrap(payload: Payload, subject: str) -> Envelope[Payload]:
    return Envelope.wrap(payload, source="trainyard/runner", subject=subject)


def progress(step: int) -> Envelope[Payload]:
    return wrap(JobProgress(job_id="j", allocation_id="a", step=step, metrics={"l": 1.0}), "j")


def metrics(seq: int) -> Envelope[Payload]:
    points = [MetricPoint(key="loss", step=seq, time=NOW, value=1.0)] * 3
    return wrap(JobMetrics(job_id="j", allocation_id="a", node_id="n", seq=seq, points=points), "n")


def checkpoint() -> Envelope[Payload]:
    ref = CheckpointRef(uri="s3://b/k", manifest_uri="s3://b/m", step=7, size_bytes=1, sha256="0")
    saved = CheckpointSaved(job_id="j", allocation_id="a", epoch=1, checkpoint=ref, saved_at=NOW)
    return wrap(saved, "j")


def succeeded() -> Envelope[Payload]:
    payload = JobSucceeded(job_id="j", allocation_id="a", node_id="n", epoch=1, finished_at=NOW)
    return wrap(payload, "j")


async def run_job(reports: int, spans: InMemorySpanExporter) -> list[Any]:
    spans.clear()
    bus = Bus(FakeNats(), NatsSettings())  # type: ignore[arg-type]
    with _tracer.start_as_current_span("grant") as grant:
        parent = trace.set_span_in_context(grant)
    events = JobEvents(bus, parent, "j")
    for n in range(reports):
        events.emit(progress(n))
        events.emit(metrics(n))
        if n == reports // 2:
            events.emit(checkpoint())
    events.emit(succeeded())
    await events.close()
    return [s for s in spans.get_finished_spans() if s.name != "grant"]


async def test_a_job_s_span_count_does_not_grow_with_its_reports(
    spans: InMemorySpanExporter,
) -> None:
    short, long = await run_job(4, spans), await run_job(400, spans)
    # The checkpoint and the end: a report span and a publish span each.
    assert len(short) == len(long) == 4
    assert {s.name for s in long} == {
        "runner report",
        "trainyard.checkpoint.saved.v1 publish",
        "trainyard.job.succeeded.v1 publish",
    }


async def test_the_report_spans_summarise_the_reports_before_them(
    spans: InMemorySpanExporter,
) -> None:
    reports = [s for s in await run_job(400, spans) if s.name == "runner report"]
    by_type = {s.attributes["cloudevents.event_type"]: s.attributes for s in reports}  # type: ignore[index]
    saved, ended = by_type[CheckpointSaved.TYPE], by_type[JobSucceeded.TYPE]
    assert saved["trainyard.reports.progress"] == 201
    assert saved["trainyard.reports.step"] == 200
    assert ended["trainyard.reports.progress"] == 400
    assert ended["trainyard.reports.metric_batches"] == 400
    assert ended["trainyard.reports.metric_points"] == 1200
    assert ended["trainyard.reports.step"] == 399


def heartbeat() -> Envelope[Payload]:
    payload = RunnerHeartbeat(node_id="n", hostname="h", gpu_flavor="f", gpu_count=1, sent_at=NOW)
    return wrap(payload, "n")


async def test_heartbeats_and_reports_go_out_without_a_span_or_a_trace_context(
    spans: InMemorySpanExporter,
) -> None:
    nc = FakeNats()
    bus = Bus(nc, NatsSettings())  # type: ignore[arg-type]
    with _tracer.start_as_current_span("around"):
        for envelope in (heartbeat(), progress(1), metrics(1), succeeded()):
            await bus.publish(envelope, {"Nats-TTL": "600s"})
    traced = {s: "traceparent" in h for s, h in nc.js.headers.items()}
    assert traced == {
        heartbeat().nats_subject: False,
        progress(1).nats_subject: False,
        metrics(1).nats_subject: False,
        succeeded().nats_subject: True,
    }
    assert all(h["Nats-TTL"] == "600s" for h in nc.js.headers.values())
    assert [s.name for s in spans.get_finished_spans()] == [
        "trainyard.job.succeeded.v1 publish",
        "around",
    ]


def test_a_heartbeat_is_handled_under_no_span(spans: InMemorySpanExporter) -> None:
    with _tracer.start_as_current_span("around"):
        with Delivery(heartbeat()).span("scheduler") as span:
            assert not span.is_recording()
            assert not trace.get_current_span().get_span_context().is_valid
        with Delivery(succeeded()).span("scheduler") as span:
            assert span.is_recording()
    assert [s.name for s in spans.get_finished_spans()] == [
        "trainyard.job.succeeded.v1 process",
        "around",
    ]
