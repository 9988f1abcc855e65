"""Each checkpoint upload is a span in the job's trace (issue 15: "checkpoint uploads as
spans"): none was, so a slow or failing upload was invisible in a job's trace."""

from __future__ import annotations

from pathlib import Path

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from tests.unit.runner.test_checkpoints import stage
from trainyard_platform.services.runner.checkpoints import commit_staged
from trainyard_platform.shared.storage import LocalStore
from trainyard_platform.shared.telemetry import tracer

_tracer = tracer(__name__)
JOB = "1ab12276-8c03-4adc-b1c9-fd50448a013c"


def test_an_upload_is_a_client_span_of_the_job_s_trace(
    tmp_path: Path, spans: InMemorySpanExporter
) -> None:
    staging, store = tmp_path / "staging", LocalStore(tmp_path / "store")
    stage(staging, 10, b"abcd")
    with _tracer.start_as_current_span("grant") as grant:
        parent = trace.set_span_in_context(grant)
    commit_staged(staging, 10, store, attempt=2, job_id=JOB, parent=parent)
    (upload,) = [s for s in spans.get_finished_spans() if s.name == "checkpoint upload"]
    assert upload.kind == SpanKind.CLIENT
    assert upload.parent is not None
    assert upload.parent.span_id == grant.get_span_context().span_id
    assert dict(upload.attributes or {}) == {
        "trainyard.job_id": JOB,
        "trainyard.checkpoint.step": 10,
        "trainyard.checkpoint.attempt": 2,
        "trainyard.checkpoint.key": f"jobs/{JOB}/checkpoints/step-00000010-a0002/checkpoint.pt",
        "trainyard.checkpoint.size_bytes": 4,
    }
    assert upload.status.status_code == StatusCode.UNSET


class BrokenStore(LocalStore):
    def put_file(self, key: str, path: Path) -> None:
        raise ConnectionError("the store is down")


def test_a_failed_upload_is_an_error_span(tmp_path: Path, spans: InMemorySpanExporter) -> None:
    staging, store = tmp_path / "staging", BrokenStore(tmp_path / "store")
    stage(staging, 3)
    with pytest.raises(ConnectionError):
        commit_staged(staging, 3, store, attempt=1, job_id=JOB)
    (upload,) = [s for s in spans.get_finished_spans() if s.name == "checkpoint upload"]
    assert upload.status.status_code == StatusCode.ERROR
    assert "the store is down" in (upload.status.description or "")
    assert "trainyard.checkpoint.size_bytes" not in (upload.attributes or {})
