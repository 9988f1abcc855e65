"""Every 422 a request body or parameter can earn says what is wrong in plain words, naming
the field as the job spec and the API documents spell it: ``must be an integer``, ``must
be at most 64``, ``unknown field``; never pydantic's or msgspec's phrasing (``Input should
be a valid integer``, ``Value error, ...``, ``Expected `int`, got `str```) nor their paths
(``[key]``, ``function-after[...]``).

Each route's body model (``JSON_BODIES``, which the OpenAPI fuzz holds to cover every route
that reads a JSON body) is fed bad values at every field, at the top and nested one level,
through the parser its route uses; and a Hypothesis search sends arbitrary JSON."""

from __future__ import annotations

import json
from datetime import datetime
from enum import Enum
from typing import Annotated, Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from litestar import Litestar, get
from litestar.params import FromQuery, HeaderParameter, Parameter
from litestar.testing import TestClient
from pydantic import BaseModel

from tests.integration.test_openapi_fuzz import JSON_BODIES, NOT_PLAIN
from trainyard_platform.services.submission.schemas import JobRequest, parse_job_request
from trainyard_platform.shared.http_errors import (
    FieldError,
    RequestInvalid,
    exception_handlers,
    parse_body,
)

MODELS = sorted({model for model in JSON_BODIES.values()}, key=lambda m: m.__name__)

BAD: list[Any] = [
    None,
    True,
    0,
    -1,
    1.5,
    -1e300,
    2**62,
    "",
    "x",
    "42",
    "1.5",
    "a" * 5000,
    "-bad key",
    "2026-13-01",
    [],
    [None],
    [1],
    ["x"],
    {},
    {"": "x"},
    {"k": None},
    {"k": [1]},
]
"""Values of every JSON type, out of every bound a field here has."""


def _errors(model: type[BaseModel], body: bytes) -> list[FieldError]:
    """The errors the route of ``model`` answers ``body`` with."""
    try:
        if model is JobRequest:
            parse_job_request(body, None)
        else:
            parse_body(model, body)
    except RequestInvalid as refused:
        return refused.errors
    return []


def _unplain(errors: list[FieldError]) -> list[str]:
    return [
        f"{e.field}: {e.message}"
        for e in errors
        if any(phrase in f"{e.field}: {e.message}" for phrase in NOT_PLAIN)
    ]


@pytest.mark.parametrize("model", MODELS, ids=lambda m: m.__name__)
def test_every_bad_value_of_every_field_is_said_in_plain_words(model: type[BaseModel]) -> None:
    fields = model.model_json_schema(by_alias=True).get("properties", {})
    found: list[str] = []
    for name in fields:
        for bad in BAD:
            for value in (bad, {"k": bad}, [bad], [{"k": bad}]):
                found += _unplain(_errors(model, json.dumps({name: value}).encode()))
    assert not found, "\n".join(sorted(set(found)))


@pytest.mark.parametrize("model", MODELS, ids=lambda m: m.__name__)
def test_arbitrary_json_bodies_are_refused_in_plain_words(model: type[BaseModel]) -> None:
    scalars = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text()
    values = st.recursive(
        scalars, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(), inner)
    )
    fields = st.sampled_from(sorted(model.model_json_schema(by_alias=True)["properties"]))

    @settings(max_examples=60, derandomize=True, database=None, deadline=None)
    @given(body=st.dictionaries(fields | st.text(), values, max_size=6) | values)
    def refused(body: Any) -> None:
        assert not _unplain(_errors(model, json.dumps(body).encode()))

    refused()


def test_the_words_for_the_commonest_mistakes() -> None:
    from trainyard_platform.services.billing.budgets import BudgetRequest
    from trainyard_platform.services.scheduler.admin_schemas import QueueRequest

    said = {
        (e.field, e.message)
        for body in (
            {"gpus": "2", "seed": 4.5, "gpu_flavor": 3, "max_runtime_seconds": 10**9},
            {"args": [1], "priority": "urgent", "register_model": "yes", "command": []},
        )
        for e in _errors(JobRequest, json.dumps(body).encode())
    }
    assert {
        ("gpus", "must be an integer (remove the quotes: 2)"),
        ("seed", "must be an integer"),
        ("gpu_flavor", 'must be a string (quote it: "3")'),
        ("max_runtime_seconds", "must be at most 604800"),
        ("args[0]", 'must be a string (quote it: "1")'),
        ("register_model", "must be true or false"),
        ("command", "must have at least 1 item"),
    } <= said
    budget = {(e.field, e.message) for e in _errors(BudgetRequest, b'{"amount": 1e16}')}
    assert ("amount", "must be at most 1000000000000000") in budget
    queue = {(e.field, e.message) for e in _errors(QueueRequest, b'{"weight": -1}')}
    assert ("weight", "must be greater than 0") in queue


class Phase(Enum):
    QUEUED = "QUEUED"
    RUNNING = "RUNNING"


@get("/items")
async def items(
    limit: Annotated[int, Parameter(ge=1, le=100)] = 10,
    verbose: FromQuery[bool] = False,
    status: FromQuery[Phase | None] = None,
    prefix: Annotated[str | None, Parameter(max_length=5)] = None,
    since: FromQuery[datetime | None] = None,
    sort: Annotated[str | None, Parameter(pattern=r"^[a-z]+$")] = None,
) -> None:
    """A route of every kind of parameter the services read."""


@pytest.mark.parametrize(
    ("query", "field", "message"),
    [
        ("limit=many", "limit", "must be an integer"),
        ("limit=1.5", "limit", "must be an integer"),
        ("limit=0", "limit", "must be at least 1"),
        ("limit=101", "limit", "must be at most 100"),
        ("verbose=maybe", "verbose", "must be true or false"),
        ("status=DONE", "status", "must be one of 'QUEUED', 'RUNNING'"),
        ("prefix=abcdefg", "prefix", "must be at most 5 characters"),
        (
            "since=yesterday",
            "since",
            "must be a date and time in ISO 8601, such as 2026-01-31T09:30:00Z",
        ),
        ("sort=ABC", "sort", "must match the pattern ^[a-z]+$"),
    ],
)
def test_a_bad_parameter_is_said_in_the_same_words(query: str, field: str, message: str) -> None:
    app = Litestar([items], exception_handlers=exception_handlers())
    with TestClient(app) as client:
        answer = client.get(f"/items?{query}")
    assert answer.status_code == 422
    assert answer.json()["errors"] == [{"field": field, "message": message}]


@get("/needs")
async def needs(team: FromQuery[str], key: Annotated[str, HeaderParameter(name="X-Key")]) -> None:
    """A route whose parameters are required."""


def test_a_missing_required_parameter_is_named() -> None:
    # Was 422 with no error at all: Litestar said it in a detail the handler dropped.
    app = Litestar([needs], exception_handlers=exception_handlers())
    with TestClient(app) as client:
        answer = client.get("/needs", headers={"X-Key": "k"})
        assert answer.status_code == 422
        assert answer.json()["errors"] == [
            {"field": "team", "message": "required (a query parameter of this route)"}
        ]
        answer = client.get("/needs?team=a")
        assert answer.json()["errors"] == [
            {"field": "X-Key", "message": "required (a header parameter of this route)"}
        ]
