"""The span file the services write keeps what an operator needs from a span: whether it
ended in error and its events (a queue wait's ``job.pending`` reasons). They were left out,
so ``trainyard trace`` could show neither why a job waited nor which step failed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.trace import Status, StatusCode

from trainyard.cli import main
from trainyard_platform.shared.telemetry import JsonLinesSpanExporter

JOB = "5d0c1e2f-3a4b-4c5d-8e6f-708192a3b4c5"


def test_status_and_events_reach_the_file_and_the_tree(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TRAINYARD_CONFIG", str(tmp_path / "config.json"))
    for name in ("URL", "TOKEN", "CONTEXT"):
        monkeypatch.delenv(f"TRAINYARD_{name}", raising=False)
    path = tmp_path / "spans.jsonl"
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(JsonLinesSpanExporter(path)))
    tracer = provider.get_tracer("test")
    attributes = {"cloudevents.event_subject": JOB}
    with tracer.start_as_current_span("trainyard.job.submitted.v1 process", attributes=attributes):
        with tracer.start_as_current_span("scheduler queue wait") as wait:
            wait.add_event(
                "job.pending",
                {"trainyard.pending.reason": "needs 2 cpu GPUs", "trainyard.pending.position": 1},
            )
        with tracer.start_as_current_span("scheduler grant") as grant:
            grant.set_status(Status(StatusCode.ERROR, "node lost"))
    provider.shutdown()

    records = {r["name"]: r for r in map(json.loads, path.read_text().splitlines())}
    wait_record = records["scheduler queue wait"]
    assert [e["name"] for e in wait_record["events"]] == ["job.pending"]
    assert wait_record["events"][0]["attributes"]["trainyard.pending.position"] == 1
    assert "status" not in wait_record  # only an error is said
    assert records["scheduler grant"]["status"] == "ERROR"
    assert records["scheduler grant"]["status_description"] == "node lost"
    assert "events" not in records["scheduler grant"]

    assert main(["trace", JOB[:8], "--file", str(path)]) == 0
    out = capsys.readouterr().out
    assert "· job.pending  @+" in out
    assert "trainyard.pending.reason=needs 2 cpu GPUs trainyard.pending.position=1" in out
    assert out.rstrip().endswith("ERROR: node lost")
    assert "└─ scheduler grant  [" in out.splitlines()[-1]
