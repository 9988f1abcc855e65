"""A line logged while a request about one job is handled (``/v1/jobs/{job_id}/...``)
carried its trace and span ids but no ``job_id``: the request's span names no job (so that
``trainyard trace`` does not gather every poll of a job's view into its trace), and
nothing else said it. The request now runs in the job's log scope (``logs.job_scope``),
so the line says which job it is about, and the span stays as it was."""

from __future__ import annotations

import logging
from typing import Any

from litestar import get
from litestar.params import FromPath
from litestar.testing import TestClient
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from trainyard_platform.shared.http_app import service_app
from trainyard_platform.shared.logs import trace_fields

log = logging.getLogger("test.request.job")
JOB = "5b0c1f7e-2a3d-4e5f-8a9b-0c1d2e3f4a5b"


class Fields(logging.Handler):
    """Keeps the log fields of each record as the JSON format writes them, computed when
    the line is logged (the job scope is a context variable)."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[dict[str, str]] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.seen.append(trace_fields(record))


@get("/v1/jobs/{job_id:str}/things", sync_to_thread=False)
def job_things(job_id: FromPath[str]) -> dict[str, str]:
    log.warning("looking at things")
    return {"job": job_id}


@get("/v1/other", sync_to_thread=False)
def other() -> dict[str, str]:
    log.warning("not about a job")
    return {}


async def _open(*_: Any) -> None:
    return None


def test_a_line_logged_for_a_job_s_request_names_the_job(spans: InMemorySpanExporter) -> None:
    fields = Fields()
    log.addHandler(fields)
    try:
        with TestClient(service_app("things", [job_things, other], _open)) as client:
            assert client.get(f"/v1/jobs/{JOB}/things").status_code == 200
            assert client.get("/v1/other").status_code == 200
    finally:
        log.removeHandler(fields)
    about_job, not_about_job = fields.seen
    assert about_job["job_id"] == JOB
    assert "trace_id" in about_job
    assert "job_id" not in not_about_job
    (server,) = [s for s in spans.get_finished_spans() if s.name == "GET /v1/jobs/{job_id}/things"]
    assert "trainyard.job_id" not in (server.attributes or {})


def test_a_job_id_from_the_path_cannot_start_a_text_log_line() -> None:
    # The path's job id is whatever the client sent (a str path parameter, percent-decoded:
    # %0A is a line break); the text format escaped the message but wrote the ids raw.
    from trainyard_platform.shared.logs import TextFormatter, job_scope

    record = log.makeRecord(log.name, logging.WARNING, __file__, 0, "looking", (), None)
    with job_scope("x\n2026-01-01 00:00:00,000 billing CRITICAL forged: line\x1b[31m"):
        text = TextFormatter("things").format(record)
    assert "\n" not in text and "\x1b" not in text
    assert "job=x\\n2026-01-01" in text
