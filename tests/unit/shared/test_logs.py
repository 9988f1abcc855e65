"""Log records carry the ids of the span they were made in, as JSON or as text."""

from __future__ import annotations

import json
import logging

import pytest
from opentelemetry.sdk.trace import TracerProvider

from trainyard_platform.shared.logs import JsonFormatter, TextFormatter
from trainyard_platform.shared.settings import ServiceSettings

_tracer = TracerProvider().get_tracer("test")


def _record(message: str, **extra: object) -> logging.LogRecord:
    record = logging.LogRecord("svc.mod", logging.INFO, __file__, 1, message, (), None)
    for key, value in extra.items():
        setattr(record, key, value)
    return record


def test_a_json_line_inside_a_span_carries_its_trace_and_span_ids() -> None:
    with _tracer.start_as_current_span("handle", attributes={"trainyard.job_id": "j-1"}) as s:
        line = json.loads(
            JsonFormatter("scheduler").format(
                _record(
                    "placed %s",
                )
            )
        )
        ctx = s.get_span_context()
    assert line["trace_id"] == format(ctx.trace_id, "032x")
    assert line["span_id"] == format(ctx.span_id, "016x")
    assert line["job_id"] == "j-1"
    assert line["service"] == "scheduler" and line["level"] == "INFO"
    assert line["logger"] == "svc.mod"


def test_an_explicit_job_id_wins_and_no_span_means_no_trace_ids() -> None:
    line = json.loads(JsonFormatter("runner").format(_record("started", job_id="j-2")))
    assert line["job_id"] == "j-2"
    assert "trace_id" not in line and "span_id" not in line


def test_an_exception_is_one_json_field() -> None:
    try:
        raise RuntimeError("boom")
    except RuntimeError:
        record = logging.LogRecord(
            "m", logging.ERROR, __file__, 1, "failed", (), exc_info=__import__("sys").exc_info()
        )
    line = json.loads(JsonFormatter("billing").format(record))
    assert "RuntimeError: boom" in line["exception"]


def test_text_lines_end_with_the_ids() -> None:
    with _tracer.start_as_current_span("handle") as s:
        text = TextFormatter("registry").format(_record("hello", job_id="j-3"))
        trace_id = format(s.get_span_context().trace_id, "032x")
    assert text.endswith(
        f"[trace={trace_id} span={format(s.get_span_context().span_id, '016x')} job=j-3]"
    )
    assert " registry INFO svc.mod: hello" in text


def test_the_format_is_chosen_by_trainyard_log_format(monkeypatch: pytest.MonkeyPatch) -> None:
    assert ServiceSettings().log_format == "text"
    monkeypatch.setenv("TRAINYARD_LOG_FORMAT", "json")
    assert ServiceSettings().log_format == "json"
    monkeypatch.setenv("TRAINYARD_LOG_FORMAT", "xml")
    with pytest.raises(ValueError, match="TRAINYARD_LOG_FORMAT"):
        ServiceSettings()


def test_a_text_line_is_one_line_whatever_its_arguments_hold() -> None:
    """A job names its metrics: the runner's warning about a non-finite one must not let a
    newline in the name start a line that looks like the platform's own."""
    forged = "loss\n2026-12-05 18:00:00,000 runner ERROR trainyard: node drained\r\x1b[2K"
    record = logging.LogRecord(
        "svc.mod", logging.WARNING, __file__, 1, "job %s reported %s", ("j-4", forged), None
    )
    text = TextFormatter("runner").format(record)
    assert "\n" not in text and "\r" not in text and "\x1b" not in text
    assert "loss\\n2026-12-05 18:00:00,000 runner ERROR" in text
    assert "\\r\\x1b[2K" in text
    for separator in ("\u2028", "\u2029", "\x85"):
        assert separator not in TextFormatter("runner").format(_record(f"a{separator}b"))


def test_a_traceback_still_follows_its_text_line() -> None:
    try:
        raise RuntimeError("boom")
    except RuntimeError:
        record = logging.LogRecord(
            "m", logging.ERROR, __file__, 1, "failed", (), exc_info=__import__("sys").exc_info()
        )
    first, _, rest = TextFormatter("billing").format(record).partition("\n")
    assert first.endswith("failed") and rest.startswith("Traceback") and "boom" in rest
