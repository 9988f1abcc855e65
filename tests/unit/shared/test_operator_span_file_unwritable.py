"""A span file that cannot be written (``TRAINYARD_TELEMETRY_SPAN_FILE`` in a folder that is
not there, or not the service's to write) made every span a logged traceback ("Exception
while exporting Span"), for as long as the service ran. Now the service refuses to start,
naming the setting; and a file that stops being writable later (a full disk, a folder
removed) costs one warning a minute, each span dropped, never a traceback."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor

from trainyard_platform.shared.telemetry import JsonLinesSpanExporter

ROOT = Path(__file__).resolve().parents[3]


def test_a_service_with_an_unwritable_span_file_refuses_to_start(tmp_path: Path) -> None:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "TRAINYARD_"))}
    env = {
        **clean,
        "TRAINYARD_TELEMETRY_SPAN_FILE": str(tmp_path / "missing" / "spans.jsonl"),
        "TRAINYARD_BILLING_ADMIN_TOKEN": "a" * 32,
        # Nothing listens here: the span file is checked before any dependency is tried.
        "TRAINYARD_DATABASE_URL": "postgresql://u@127.0.0.1:1/db",
        "TRAINYARD_DATABASE_CONNECT_TIMEOUT_SECONDS": "1",
    }
    done = subprocess.run(
        [sys.executable, "-m", "trainyard_platform.services.billing", "--port", "0"],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr
    assert "cannot start: the span file (TRAINYARD_TELEMETRY_SPAN_FILE)" in done.stderr
    assert "PostgreSQL" not in done.stderr


def test_a_span_file_that_goes_away_costs_one_warning_not_a_traceback_per_span(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    folder = tmp_path / "spans"
    folder.mkdir()
    exporter = JsonLinesSpanExporter(folder / "spans.jsonl")
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("t")
    tracer.start_span("kept").end()
    (folder / "spans.jsonl").unlink()
    folder.rmdir()
    with caplog.at_level(logging.WARNING):
        for _ in range(5):
            tracer.start_span("dropped").end()
    assert not [r for r in caplog.records if r.exc_info]
    said = [r.getMessage() for r in caplog.records if "span file" in r.getMessage()]
    assert len(said) == 1, said
    assert str(folder / "spans.jsonl") in said[0]
