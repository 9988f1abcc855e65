"""The admin API's bodies: every bad field named with its path, sensible defaults."""

from __future__ import annotations

import json
from typing import Any

import pytest

from trainyard_platform.services.scheduler.admin_schemas import (
    FLAVOR_PATTERN,
    PriorityClassRequest,
    QueueRequest,
    check_name,
)
from trainyard_platform.shared.http_errors import RequestInvalid, parse_body


def errors(model: type[Any], body: dict[str, Any] | bytes) -> dict[str, str]:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    with pytest.raises(RequestInvalid) as caught:
        parse_body(model, raw)
    return {e.field: e.message for e in caught.value.errors}


def test_a_queue_with_quotas_per_flavor() -> None:
    body = {
        "team": "vision",
        "cohort": "research",
        "weight": 2,
        "quotas": {"a100": {"nominal": 8, "borrowing_limit": 4, "lending_limit": 2}},
    }
    queue = parse_body(QueueRequest, json.dumps(body).encode())
    assert (queue.team, queue.cohort, queue.weight) == ("vision", "research", 2.0)
    quota = queue.quotas["a100"]
    assert (quota.nominal, quota.borrowing_limit, quota.lending_limit) == (8, 4, 2)
    bare = parse_body(QueueRequest, b'{"team": "nlp"}')
    assert (bare.cohort, bare.weight, bare.quotas) == (None, 1.0, {})


def test_bad_queue_fields_are_named_with_their_path() -> None:
    found = errors(
        QueueRequest,
        {
            "team": "has space",
            "weight": 0,
            "quotas": {"a100": {"nominal": -1}, "H100": {"nominal": 1}},
            "colour": "red",
        },
    )
    assert set(found) == {"team", "weight", "quotas.a100.nominal", "quotas", "colour"}
    assert found["quotas"].startswith("key 'H100': ")  # a bad key, named on its mapping
    assert found["colour"] == "unknown field"
    assert errors(QueueRequest, {"quotas": {}}) == {"team": "field required"}
    assert errors(QueueRequest, b"[]") == {"body": "must be a JSON object"}


def test_lending_more_than_the_nominal_is_refused() -> None:
    found = errors(
        QueueRequest,
        {"team": "t", "cohort": "c", "quotas": {"a100": {"nominal": 2, "lending_limit": 3}}},
    )
    assert found == {"quotas.a100.lending_limit": "must not exceed nominal"}


def test_limits_need_a_cohort() -> None:
    found = errors(
        QueueRequest, {"team": "t", "quotas": {"a100": {"nominal": 2, "borrowing_limit": 1}}}
    )
    assert found == {"quotas.a100": "borrowing and lending limits need a cohort"}


def test_priority_class_fields() -> None:
    cls = parse_body(PriorityClassRequest, b'{"value": 50, "preemptible": true}')
    assert (cls.value, cls.preemptible, cls.min_runtime_seconds, cls.description) == (
        50,
        True,
        0.0,
        "",
    )
    found = errors(PriorityClassRequest, {"value": "high", "min_runtime_seconds": -1})
    assert set(found) == {"value", "preemptible", "min_runtime_seconds"}


def test_names_in_paths_are_checked() -> None:
    assert check_name("research-1") == "research-1"
    for bad in ("Research", "1st", "a" * 41, "default:x", ""):
        with pytest.raises(RequestInvalid) as caught:
            check_name(bad)
        assert [e.field for e in caught.value.errors] == ["name"]
    assert check_name("h200", FLAVOR_PATTERN) == "h200"
