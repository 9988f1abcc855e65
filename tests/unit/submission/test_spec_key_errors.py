"""A bad key of a mapping (``labels``, ``hyperparameters``) is reported on the mapping, the
message naming the key, as ``trainyard submit`` reports it.

The API named pydantic's location as it was: ``labels.-bad.[key]``, and for an empty key
``hyperparameters..[key]``, paths no spec has (the CLI could not place them on a line)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from trainyard_platform.services.submission.schemas import parse_job_request
from trainyard_platform.shared.http_errors import RequestInvalid

BASE = {"name": "a", "gpus": 1, "gpu_flavor": "cpu", "entrypoint": "m"}


@pytest.mark.parametrize(
    ("extra", "field", "says"),
    [
        ({"labels": {"-bad": "x"}}, "labels", "label key '-bad' must be a Kubernetes-style key"),
        ({"hyperparameters": {"": 1}}, "hyperparameters", "key '': "),
        ({"labels": {"": "x"}}, "labels", "key '': "),
    ],
)
def test_a_bad_key_is_named_on_its_mapping(extra: dict[str, Any], field: str, says: str) -> None:
    with pytest.raises(RequestInvalid) as caught:
        parse_job_request(json.dumps({**BASE, **extra}).encode(), ["cpu"])
    [error] = caught.value.errors
    assert error.field == field and error.message.startswith(says)
    assert "[key]" not in error.field + error.message
