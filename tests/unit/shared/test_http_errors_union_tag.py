"""A body's tagged union (``code: {kind: git | bundle, ...}``) of no known tag names the tag's
field and the tags there are, not pydantic's "Unable to extract tag using discriminator"."""

from __future__ import annotations

import json
from typing import Annotated, Literal

import pytest
from pydantic import BaseModel, ConfigDict, Field

from trainyard_platform.shared.http_errors import RequestInvalid, parse_body


class Git(BaseModel):
    model_config = ConfigDict(extra="forbid")
    kind: Literal["git"]
    repository: str


class Bundle(BaseModel):
    model_config = ConfigDict(extra="forbid")
    kind: Literal["bundle"]
    sha256: str


class Body(BaseModel):
    code: Annotated[Git | Bundle, Field(discriminator="kind")] | None = None


@pytest.mark.parametrize(
    ("code", "field", "message"),
    [
        ({"repository": "https://h/r"}, "code.kind", "field required"),
        ({"kind": "gitt"}, "code.kind", "must be one of 'git', 'bundle'"),
    ],
)
def test_a_tag_that_names_no_form_is_named(code: object, field: str, message: str) -> None:
    with pytest.raises(RequestInvalid) as caught:
        parse_body(Body, json.dumps({"code": code}).encode())
    assert [(e.field, e.message) for e in caught.value.errors] == [(field, message)]
