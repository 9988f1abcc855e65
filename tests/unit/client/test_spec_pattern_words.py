"""A value that does not match its field's pattern is told what it must be, in words, by
``trainyard submit`` and by ``POST /v1/jobs`` alike, never as a regular expression.

``name: my job`` gave ``must match ^[A-Za-z0-9._-]{1,100}$`` (CLI) and ``String should
match pattern '^[A-Za-z0-9._-]{1,100}$'`` (API); ``datasets: [digits]`` a regex of 90
characters."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from trainyard.patterns import PATTERN_WORDS
from trainyard.spec import SpecError, parse, schema
from trainyard_platform.services.submission.schemas import parse_job_request
from trainyard_platform.shared.http_errors import RequestInvalid

BASE = {"name": "a", "gpus": 1, "gpu_flavor": "cpu", "entrypoint": "m"}


def _patterns(node: Any) -> Iterator[str]:
    if isinstance(node, dict):
        if isinstance(node.get("pattern"), str):
            yield node["pattern"]
        for value in node.values():
            yield from _patterns(value)
    elif isinstance(node, list):
        for value in node:
            yield from _patterns(value)


def test_every_pattern_of_the_job_spec_has_words() -> None:
    patterns = set(_patterns(schema()))
    assert len(patterns) >= 6
    assert patterns <= set(PATTERN_WORDS), patterns - set(PATTERN_WORDS)


@pytest.mark.parametrize(
    ("field", "value", "says"),
    [
        ("name", "my job", "must be 1 to 100 letters, digits, '.', '_' or '-'"),
        ("project", "a/b", "must be 1 to 100 letters, digits, '.', '_' or '-'"),
        ("experiment", "ü", "must be 1 to 100 letters, digits, '.', '_' or '-'"),
        ("priority", "Urgent", "must be a lower-case letter, then at most 39 lower-case"),
        ("datasets", ["digits"], "must be TEAM/NAME or TEAM/NAME:VERSION (names of 1 to 100"),
        ("parent_model", "vision/cnn", "must be TEAM/NAME:VERSION or TEAM/NAME@ALIAS"),
        (
            "code",
            {"kind": "git", "repository": "https://h/r", "commit": "abc"},
            "must be a whole commit id: 40 lower-case hexadecimal digits",
        ),
        (
            "code",
            {"kind": "bundle", "sha256": "ABC", "size_bytes": 1},
            "must be a sha256: 64 lower-case hexadecimal digits",
        ),
    ],
)
def test_the_cli_and_the_api_say_it_in_words(field: str, value: Any, says: str) -> None:
    spec = {**BASE, field: value}
    with pytest.raises(SpecError) as in_file:
        parse(json.dumps(spec), "job.json")
    assert says in str(in_file.value) and "match" not in str(in_file.value)
    with pytest.raises(RequestInvalid) as in_api:
        parse_job_request(json.dumps(spec).encode(), ["cpu"])
    messages = [e.message for e in in_api.value.errors]
    assert any(says in m for m in messages) and not any("pattern" in m for m in messages)
