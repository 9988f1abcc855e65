"""The end-to-end benchmark's client sends the trace context the real producers send."""

from __future__ import annotations

import re

import pytest

from bench.scheduler_e2e import _trace_headers

TRACEPARENT = re.compile(r"00-([0-9a-f]{32})-([0-9a-f]{16})-(0[01])")


def _parts(headers: dict[str, str]) -> tuple[str, str, str]:
    match = TRACEPARENT.fullmatch(headers["traceparent"])
    assert match is not None, headers
    trace_id, span_id, flags = match.groups()
    return trace_id, span_id, flags


def test_a_submission_starts_a_trace_the_sampler_would_record(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("OTEL_TRACES_SAMPLER", raising=False)
    submissions = [_parts(_trace_headers(None)) for _ in range(50)]
    assert len({trace_id for trace_id, _, _ in submissions}) == 50  # a new trace each
    assert {flags for _, _, flags in submissions} == {"01"}

    monkeypatch.setenv("OTEL_TRACES_SAMPLER", "always_off")
    assert _parts(_trace_headers(None))[2] == "00"

    monkeypatch.setenv("OTEL_TRACES_SAMPLER", "parentbased_traceidratio")
    monkeypatch.setenv("OTEL_TRACES_SAMPLER_ARG", "0.1")
    sampled = sum(_parts(_trace_headers(None))[2] == "01" for _ in range(4000))
    assert 250 < sampled < 550  # one in ten, as the submission service's sampler keeps


def test_a_success_continues_the_grants_trace_and_its_decision() -> None:
    grant = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00"
    trace_id, span_id, flags = _parts(_trace_headers(grant))
    assert (trace_id, flags) == ("0af7651916cd43dd8448eb211c80319c", "00")
    assert span_id != "b7ad6b7169203331"  # the runner's own span
