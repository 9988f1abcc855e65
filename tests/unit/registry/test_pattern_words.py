"""Every pattern a registry request body declares is told in words when a value misses it,
never as a regular expression (``trainyard.patterns``, as the job spec's are).

``trainyard dataset register --uri data.parquet`` was refused with ``uri: String should match
pattern '^[A-Za-z][A-Za-z0-9+.-]{0,31}:[^\\s\\x00-\\x1f\\x7f]+$'``, and a ``--feature-version``
with an accent with ``String should match pattern '^[\\x20-\\x7e]*$'``."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from trainyard.patterns import PATTERN_WORDS
from trainyard_platform.services.registry.api import create_app
from trainyard_platform.services.registry.dataset_schemas import DatasetVersionRequest
from trainyard_platform.shared.http_errors import RequestInvalid, parse_body

DATASET = {"uri": "s3://data/digits.parquet", "sha256": "a" * 64, "size_bytes": 1}


def _patterns(node: Any) -> Iterator[str]:
    if isinstance(node, dict):
        if isinstance(node.get("pattern"), str):
            yield node["pattern"]
        for value in node.values():
            yield from _patterns(value)
    elif isinstance(node, list):
        for value in node:
            yield from _patterns(value)


def test_every_pattern_of_a_registry_request_body_has_words() -> None:
    async def guard(connection: Any, handler: Any) -> None:
        return None

    document = create_app(None, guard, []).openapi_schema.to_schema()  # type: ignore[arg-type]
    bodies = [
        operation["requestBody"]
        for item in document["paths"].values()
        for operation in item.values()
        if isinstance(operation, dict) and "requestBody" in operation
    ]
    patterns = set(_patterns(bodies))
    assert len(patterns) >= 3
    assert patterns <= set(PATTERN_WORDS), patterns - set(PATTERN_WORDS)


@pytest.mark.parametrize(
    ("field", "value", "says"),
    [
        ("uri", "data.parquet", "must be a URI on one line"),
        ("uri", "s3://data/my digits.parquet", "must be a URI on one line"),
        ("feature_version", "v1-é", "must be printable ASCII"),
        ("sha256", "ABC", "must be a sha256"),
    ],
)
def test_a_dataset_version_says_what_its_fields_must_be(field: str, value: str, says: str) -> None:
    with pytest.raises(RequestInvalid) as refused:
        parse_body(DatasetVersionRequest, json.dumps({**DATASET, field: value}).encode())
    [error] = refused.value.errors
    assert error.field == field and says in error.message and "pattern" not in error.message
