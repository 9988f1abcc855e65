"""The operator's view of a running system, every component a real process: each service's
``/metrics`` (no token) after a job ran, JSON log lines with trace ids, and the job's trace
read back from the span file with ``trainyard trace``."""

from __future__ import annotations

import json
import re
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from trainyard.bundle import DEFAULT_MAX_BYTES
from trainyard.cli import main, upload_code
from trainyard.client import TrainyardClient
from trainyard_platform.deploy.local.stack import LocalStack
from trainyard_platform.shared.metrics import CATALOGUE

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).parents[2]
TEXT_LOG_LINE = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+ \S+ (DEBUG|INFO|WARNING|ERROR) ")
EVERY_SERVICE = {
    "trainyard.http.server.duration",
    "trainyard.events.handled",
    "trainyard.events.handling.duration",
    "trainyard.consumer.lag",
    "trainyard.deadletters.waiting",
}
WITH_OUTBOX = {"trainyard.outbox.backlog", "trainyard.outbox.lag", "trainyard.outbox.parked"}
OWN: dict[str, set[str]] = {
    "submission": WITH_OUTBOX,
    "registry": WITH_OUTBOX,
    "billing": WITH_OUTBOX,
    "scheduler": WITH_OUTBOX
    | {
        "trainyard.scheduler.queue.depth",
        "trainyard.scheduler.queue.oldest_wait",
        "trainyard.scheduler.allocations",
        "trainyard.scheduler.preemptions",
        "trainyard.scheduler.gpus",
        "trainyard.scheduler.nodes",
        "trainyard.scheduler.nodes.cordoned",
        "trainyard.scheduler.nodes.capped",
        "trainyard.scheduler.jobs.finished",
    },
    "runner": {
        "trainyard.runner.checkpoint.upload.duration",
        "trainyard.runner.checkpoint.upload.bytes",
    },
}


@pytest.fixture(scope="module")
def stack() -> Iterator[LocalStack]:
    data = Path(tempfile.mkdtemp(prefix="trainyard-e2e-"))
    try:
        with LocalStack(
            data,
            storage="s3",
            span_file=data / "spans.jsonl",
            extra_env={"TRAINYARD_LOG_FORMAT": "json"},
        ) as running:
            yield running
    finally:
        shutil.rmtree(data, ignore_errors=True)


@pytest.fixture(scope="module")
def finished_job(stack: LocalStack) -> dict[str, Any]:
    client = TrainyardClient(stack.submission_url, stack.bootstrap_admin("ops", "olga"))
    spec = json.loads((ROOT / "examples" / "digits.job.json").read_text())
    spec["hyperparameters"]["epochs"] = 1
    spec["code"] = upload_code(client, ROOT / "examples", DEFAULT_MAX_BYTES)
    job = client.submit(spec)
    final = client.wait(job["id"], timeout_s=300)
    assert final["status"] == "SUCCEEDED", final.get("failure")
    return final


def _service(process: str) -> str:
    return "runner" if process.startswith("runner") else process


def _families(url: str) -> dict[str, Any]:
    answer = httpx.get(f"{url}/metrics", timeout=10)
    assert answer.status_code == 200, answer.text
    return {f.name: f for f in text_string_to_metric_families(answer.text)}


def _expected(process: str) -> set[str]:
    names = EVERY_SERVICE | OWN[_service(process)]
    # The parser names a family without its _total suffix.
    return {CATALOGUE[n].prometheus.removesuffix("_total") for n in names}


def test_every_service_serves_its_metrics_without_a_token(
    stack: LocalStack, finished_job: dict[str, Any]
) -> None:
    for url in stack.service_urls.values():
        # A request on a route (refused: no token) puts a point on the HTTP latency.
        assert httpx.get(f"{url}/schema/openapi.json", timeout=10).status_code == 401
    missing: dict[str, set[str]] = {}
    deadline = time.monotonic() + 60  # the gauges are read every 15 s
    while time.monotonic() < deadline:
        missing = {
            process: _expected(process) - set(_families(url))
            for process, url in stack.service_urls.items()
        }
        if not any(missing.values()):
            break
        time.sleep(2)
    assert not any(missing.values()), missing

    # A gauge read every 15 s, from the scheduler's own table: the job's end may reach the
    # scheduler, and then its next reading, after the fixture saw it end at submission.
    deadline = time.monotonic() + 60
    while True:
        scheduler = _families(stack.service_urls["scheduler"])
        finished = {
            s.labels["state"]: s.value
            for s in scheduler["trainyard_scheduler_jobs_finished"].samples
            if s.name.endswith("_total")
        }
        if finished.get("SUCCEEDED", 0) >= 1 or time.monotonic() > deadline:
            break
        time.sleep(2)
    assert finished.get("SUCCEEDED", 0) >= 1
    routes = {
        s.labels.get("route") for s in scheduler["trainyard_http_server_duration_seconds"].samples
    }
    assert "/schema/openapi.json" in routes and "/readyz" not in routes


def test_metrics_name_no_job_team_or_user(stack: LocalStack, finished_job: dict[str, Any]) -> None:
    for url in stack.service_urls.values():
        text = httpx.get(f"{url}/metrics", timeout=10).text
        assert finished_job["id"] not in text
        assert "olga" not in text


def test_service_logs_are_json_lines_with_trace_ids(
    stack: LocalStack, finished_job: dict[str, Any]
) -> None:
    records: list[dict[str, Any]] = []
    for process in stack.service_urls:
        for line in stack.log_path(process).read_text().splitlines():
            assert not TEXT_LOG_LINE.match(line), f"{process} wrote a text log line: {line}"
            if line.startswith("{"):
                record = json.loads(line)
                assert {"time", "level", "service", "logger", "message"} <= set(record), line
                records.append(record)
    assert records, "no service wrote a JSON log line"
    traced = [r for r in records if "trace_id" in r]
    assert traced, [r["message"] for r in records]
    assert all(len(r["trace_id"]) == 32 and len(r["span_id"]) == 16 for r in traced)


def test_trainyard_trace_prints_the_job_s_tree(
    stack: LocalStack, finished_job: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    assert stack.span_file is not None
    code = main(["trace", finished_job["id"], "--file", str(stack.span_file)])
    out = capsys.readouterr().out
    assert code == 0
    assert out.startswith(f"trace {finished_job['trace_id']}:")
    assert "POST /v1/jobs  [submission]" in out
    for service in ("scheduler", "runner", "registry", "billing"):
        assert f"[{service}]" in out
