"""``OTEL_SPAN_ATTRIBUTE_COUNT_LIMIT`` is read by the OpenTelemetry SDK when it is imported:
a value that is not a whole number from 0 made ``python -m trainyard_platform.services.X``
die with the SDK's ``ValueError`` traceback before any setting was checked. Each service's
entry point now checks it first: one line naming it, exit status 2."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
SERVICES = ("billing", "registry", "runner", "scheduler", "submission")


def _run(service: str, **env: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "TRAINYARD_"))}
    return subprocess.run(
        [sys.executable, "-m", f"trainyard_platform.services.{service}"],
        env={**clean, **env},
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.mark.parametrize("service", SERVICES)
def test_a_bad_span_attribute_count_limit_is_named_not_a_traceback(service: str) -> None:
    done = _run(service, OTEL_SPAN_ATTRIBUTE_COUNT_LIMIT="lots")
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    assert "invalid setting OTEL_SPAN_ATTRIBUTE_COUNT_LIMIT: " in done.stderr
    assert "'lots'" in done.stderr


def test_under_the_json_format_the_refusal_is_one_json_line() -> None:
    done = _run("billing", OTEL_SPAN_ATTRIBUTE_COUNT_LIMIT="-1", TRAINYARD_LOG_FORMAT="json")
    assert done.returncode == 2, done.stderr
    (line,) = done.stderr.splitlines()
    record = json.loads(line)
    assert record["level"] == "CRITICAL" and record["service"] == "billing"
    assert "invalid setting OTEL_SPAN_ATTRIBUTE_COUNT_LIMIT" in record["message"]
