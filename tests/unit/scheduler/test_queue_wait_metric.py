"""The issue asks for pending time per queue; there was only the age of each queue's
longest-waiting job right now (``trainyard.scheduler.queue.oldest_wait``), which says
nothing of how long jobs waited once granted (no p95, no SLO). Now each grant records how
long its job waited in its queue, from entering it (its submission, or the end of its last
attempt) to the grant, on the ``trainyard.scheduler.queue.wait`` histogram by queue."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from trainyard_platform.services.scheduler.domain import Job, JobStatus
from trainyard_platform.services.scheduler.scheduling import record_queue_wait
from trainyard_platform.shared.events.payloads import JobSpec
from trainyard_platform.shared.metrics import CATALOGUE, WAIT_BUCKETS, instrument

T0 = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)


def _job(queue: str, changed_at: datetime | None) -> Job:
    spec = JobSpec(
        name="mnist",
        team="vision",
        user="ada",
        entrypoint="train.py",
        gpus=1,
        gpu_flavor="a100",
        seed=1,
        max_runtime_seconds=3600,
    )
    return Job(
        job_id="job-1",
        spec=spec,
        status=JobStatus.QUEUED,
        status_reason=None,
        attempt=0,
        restarts=0,
        submitted_at=T0,
        pending_reason=None,
        pending_position=None,
        queue=queue,
        changed_at=changed_at,
    )


def test_the_queue_wait_is_a_histogram_by_queue() -> None:
    spec = CATALOGUE["trainyard.scheduler.queue.wait"]
    assert (spec.kind, spec.unit, spec.labels, spec.buckets) == (
        "histogram",
        "s",
        ("queue",),
        WAIT_BUCKETS,
    )
    assert spec.prometheus == "trainyard_scheduler_queue_wait_seconds"


def test_each_grant_records_the_wait_since_the_job_entered_its_queue() -> None:
    reader = InMemoryMetricReader()
    histogram = instrument(
        "trainyard.scheduler.queue.wait", MeterProvider(metric_readers=[reader]).get_meter("t")
    )
    # Requeued an hour after its submission, granted 90 s later: it waited 90 s.
    record_queue_wait(
        _job("default:vision", T0 + timedelta(hours=1)),
        T0 + timedelta(hours=1, seconds=90),
        histogram,
    )
    # No status change known: from its submission.
    record_queue_wait(_job("batch", None), T0 + timedelta(seconds=30), histogram)
    data = reader.get_metrics_data()
    assert data is not None
    points = {
        point.attributes["queue"]: (point.count, point.sum)  # type: ignore[index]
        for resource in data.resource_metrics
        for scope in resource.scope_metrics
        for metric in scope.metrics
        if metric.name == "trainyard.scheduler.queue.wait"
        for point in metric.data.data_points  # type: ignore[union-attr]
    }
    assert points == {"default:vision": (1, 90.0), "batch": (1, 30.0)}
