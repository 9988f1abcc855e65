"""One job's trace as an OTLP collector receives it: every service a real process exporting
over OTLP/HTTP (protobuf) to a receiver on loopback (``tests.fixtures.otlp``), configured
only by the standard ``OTEL_*`` variables. The tree is rebuilt from what arrived: one trace
for the job, all five services in it, no orphan span, parents as the flow says, database
spans inside it, and none of the stack's secrets anywhere."""

from __future__ import annotations

import json
import shutil
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from opentelemetry import context as otel_context

from tests.fixtures.otlp import OtlpReceiver, ReceivedSpan
from trainyard.bundle import DEFAULT_MAX_BYTES
from trainyard.cli import upload_code
from trainyard.client import TrainyardClient
from trainyard_platform.deploy.local.stack import LocalStack

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).parents[2]
SERVICES = {"submission", "scheduler", "runner", "registry", "billing"}
WITH_DATABASE = {"submission", "scheduler", "registry", "billing"}
DB_SCOPE = "opentelemetry.instrumentation.asyncpg"
SERVER, CLIENT = 2, 3  # opentelemetry.proto.trace.v1.Span.SpanKind


@dataclass
class Traced:
    spans: list[ReceivedSpan]
    job: dict[str, Any]
    secrets: dict[str, str]


@pytest.fixture(scope="module")
def traced() -> Iterator[Traced]:
    data = Path(tempfile.mkdtemp(prefix="trainyard-e2e-"))
    try:
        with OtlpReceiver() as receiver:
            otel = {
                "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": receiver.endpoint,
                "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
                "OTEL_BSP_SCHEDULE_DELAY": "200",  # ms: batches leave soon after the spans end
            }
            with LocalStack(data, storage="s3", extra_env=otel) as stack:
                token = stack.bootstrap_admin("ops", "tracy")
                client = TrainyardClient(stack.submission_url, token)
                spec = json.loads((ROOT / "examples" / "digits.job.json").read_text())
                spec["hyperparameters"]["epochs"] = 1
                spec["code"] = upload_code(client, ROOT / "examples", DEFAULT_MAX_BYTES)
                # The client sends the test process's current trace context, if any: none
                # here, so the job's trace starts at the submission service.
                detached = otel_context.attach(otel_context.Context())
                try:
                    job = client.wait(client.submit(spec)["id"], timeout_s=300)
                finally:
                    otel_context.detach(detached)
                assert job["status"] == "SUCCEEDED", job.get("failure")
                assert job["trace_id"], "the job view carries no trace id"
                # Billing and the registry finish after the job does: wait for their work.
                _wait_for(receiver, job["trace_id"], "trainyard.cost.recorded.v1 process")
                _wait_for(receiver, job["trace_id"], "trainyard.model.registered.v1 process")
                secrets = _secrets(stack, token)
            # Leaving the stack stopped every service, which flushed its last batch.
            yield Traced(receiver.spans(), job, secrets)
    finally:
        shutil.rmtree(data, ignore_errors=True)


def _wait_for(receiver: OtlpReceiver, trace_id: str, name: str) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if any(s.trace_id == trace_id and s.name == name for s in receiver.spans()):
            return
        time.sleep(0.5)


def _secrets(stack: LocalStack, user_token: str) -> dict[str, str]:
    """The real credentials this stack runs with, by what they are."""
    found = {"operator token": stack.admin_token, "user token": user_token}
    assert stack.s3 is not None
    # The S3 access key is not secret (moto's is the word "trainyard", like the bucket).
    found["S3 secret key"] = stack.s3.secret_key
    for name in stack.process_names:
        env = stack.process(name).env
        found[f"NATS password of {name}"] = env["TRAINYARD_NATS_PASSWORD"]
        for key, value in env.items():
            if key.endswith(("_SECRET_KEY", "_PASSWORD", "_TOKEN")) and value:
                found[f"{key} of {name}"] = value
    password = urlsplit(stack.database_url).password
    if password:
        found["PostgreSQL password"] = password
    assert all(len(v) >= 8 for v in found.values()), "a secret too short to look for"
    return found


def _tree(spans: list[ReceivedSpan]) -> str:
    """The trace drawn as a tree (for failure messages)."""
    children: dict[str | None, list[ReceivedSpan]] = {}
    for span in spans:
        children.setdefault(span.parent_id, []).append(span)
    ids = {s.span_id for s in spans}
    lines: list[str] = []

    def draw(span: ReceivedSpan, depth: int) -> None:
        lines.append(f"{'  ' * depth}{span.name} [{span.service}]")
        for child in children.get(span.span_id, []):
            draw(child, depth + 1)

    for span in spans:
        if span.parent_id is None or span.parent_id not in ids:
            draw(span, 0)
    return "\n".join(lines)


def _job_trace(traced: Traced) -> list[ReceivedSpan]:
    return [s for s in traced.spans if s.trace_id == traced.job["trace_id"]]


def _ancestors(span: ReceivedSpan, by_id: dict[str, ReceivedSpan]) -> list[ReceivedSpan]:
    out: list[ReceivedSpan] = []
    while span.parent_id is not None and span.parent_id in by_id:
        span = by_id[span.parent_id]
        out.append(span)
    return out


def test_the_job_is_one_trace_across_all_five_services(traced: Traced) -> None:
    job_id = traced.job["id"]
    about_the_job = [
        s
        for s in traced.spans
        if s.attributes.get("messaging.system") == "nats"
        and s.attributes.get("cloudevents.event_subject") == job_id
    ]
    assert about_the_job, "no messaging span names the job"
    assert {s.trace_id for s in about_the_job} == {traced.job["trace_id"]}
    services = {s.service for s in _job_trace(traced)}
    assert services == SERVICES, _tree(_job_trace(traced))


def test_the_tree_has_one_root_and_no_orphans(traced: Traced) -> None:
    spans = _job_trace(traced)
    ids = Counter(s.span_id for s in spans)
    assert max(ids.values()) == 1, "a span id used twice"
    roots = [s for s in spans if s.parent_id is None]
    orphans = [s for s in spans if s.parent_id is not None and s.parent_id not in ids]
    assert not orphans, f"parents missing for {[s.name for s in orphans]}\n{_tree(spans)}"
    assert [(r.name, r.service, r.kind) for r in roots] == [
        ("POST /v1/jobs", "submission", SERVER)
    ], _tree(spans)


def test_parents_follow_the_flow(traced: Traced) -> None:
    spans = _job_trace(traced)
    by_id = {s.span_id: s for s in spans}
    (grant,) = [s for s in spans if s.name == "scheduler grant"]
    assert grant.service == "scheduler"
    grant_line = [(a.name, a.service) for a in _ancestors(grant, by_id)]
    assert grant_line[0] == ("trainyard.job.submitted.v1 process", "scheduler"), grant_line
    assert grant_line[-1] == ("POST /v1/jobs", "submission"), grant_line

    runner = [s for s in spans if s.service == "runner"]
    assert runner
    for span in runner:
        assert grant in _ancestors(span, by_id), f"{span.name} not under the grant\n{_tree(spans)}"
    (launch,) = [s for s in runner if s.name == "trainyard.allocation.granted.v1 process"]
    assert launch.parent_id == grant.span_id

    # An event is handled under the span that published it (the runner's publish span) or,
    # when the outbox relayed it, under the span whose transaction wrote it: another
    # service's, never the handler's own, never a root. (One job here, so each of its events
    # is alone in the scheduler's batch; in a run of several jobs' events the scheduler's
    # handling is a batch span of its own trace, and what an ending says is handled under
    # the runner's publish span: tests/integration/scheduler/test_scheduler.py.)
    for span in spans:
        if not span.name.endswith(" process"):
            continue
        parent = by_id[str(span.parent_id)]
        assert parent.service != span.service, f"{span.name} [{span.service}]"
        if parent.name.endswith(" publish"):
            assert parent.name.removesuffix(" publish") == span.name.removesuffix(" process")

    # The bill follows the scheduler's release, the model follows the registry's own handling
    # of the job's success; both come down from the grant.
    chains = {
        ("billing", "trainyard.allocation.released.v1 process"): (
            "trainyard.job.succeeded.v1 process",
            "scheduler",
        ),
        ("submission", "trainyard.model.registered.v1 process"): (
            "trainyard.job.succeeded.v1 process",
            "registry",
        ),
        ("submission", "trainyard.cost.recorded.v1 process"): (
            "trainyard.allocation.released.v1 process",
            "billing",
        ),
    }
    for (service, name), (parent_name, parent_service) in chains.items():
        handled = [s for s in spans if s.service == service and s.name == name]
        assert handled, f"{service} handled no {name}\n{_tree(spans)}"
        for span in handled:
            parent = by_id[str(span.parent_id)]
            assert (parent.name, parent.service) == (parent_name, parent_service), span.name
            assert grant in _ancestors(span, by_id), f"{service}: {span.name}"


def test_database_spans_are_in_the_trace_and_nowhere_alone(traced: Traced) -> None:
    spans = _job_trace(traced)
    by_id = {s.span_id: s for s in spans}
    queries = [s for s in spans if s.scope == DB_SCOPE]
    assert {s.service for s in queries} == WITH_DATABASE, _tree(spans)
    for query in queries:
        assert query.kind == CLIENT
        assert query.attributes["db.system"] == "postgresql"
        assert "db.statement.parameters" not in query.attributes
        assert query.parent_id in by_id, query.name
    # Queries made outside any trace (polling loops, heartbeats, sweepers) make no spans.
    alone = Counter(
        (s.service, s.name) for s in traced.spans if s.scope == DB_SCOPE and s.parent_id is None
    )
    assert not alone, alone


def test_no_secret_in_any_span(traced: Traced) -> None:
    assert traced.spans
    leaks = {
        (what, span.service, span.name)
        for span in traced.spans
        for text in span.strings()
        for what, secret in traced.secrets.items()
        if secret in text
    }
    assert not leaks, leaks
