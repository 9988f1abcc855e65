"""A dry run (``?dry_run=true`` on a route declared ``only_reads("dry_run")``) stores
nothing, so its token check spends one of the user's reads (``GET /v1/me``), never one of
the writes the real request needs (``POST /v1/me``). Only a request the route surely reads
as a dry run counts so: any other (no flag, ``false``, a flag given twice with another
value, a spelling the check does not know) spends a write, so no real write is let in on a
read. Before, every dry run spent a write: ``trainyard submit`` checks a spec with one
before it submits, and so spent two writes on one submission."""

from __future__ import annotations

from typing import Annotated

import httpx
import pytest
from litestar import post
from litestar.params import QueryParameter
from litestar.testing import TestClient
from pydantic import SecretStr

from trainyard_platform.shared.access import only_reads, service_guard
from trainyard_platform.shared.http_app import service_app
from trainyard_platform.shared.identity import IdentityClient

DryRun = Annotated[bool, QueryParameter()]


@post("/v1/things", status_code=200, sync_to_thread=False, opt=only_reads(when="dry_run"))
def make_thing(dry_run: DryRun = False) -> dict[str, bool]:
    return {"dry_run": dry_run}


@post("/v1/other", status_code=200, sync_to_thread=False)
def make_other(dry_run: DryRun = False) -> dict[str, bool]:
    return {"dry_run": dry_run}


def _asked(path: str) -> tuple[str, bool | int]:
    """How the token of ``POST path`` was checked, and whether the route read a dry run
    (or its status when it refused the request)."""
    asked: list[str] = []

    def answer(request: httpx.Request) -> httpx.Response:
        asked.append(request.method)
        return httpx.Response(
            200, json={"user": "a", "team": "ml", "role": "member", "token_id": 1}
        )

    http = httpx.AsyncClient(base_url="http://identity", transport=httpx.MockTransport(answer))
    guard = service_guard(SecretStr("operator"), IdentityClient("http://identity", http=http))
    with TestClient(service_app("test", [make_thing, make_other], guard)) as client:
        response = client.post(path, headers={"Authorization": "Bearer ty_a"})
    assert len(asked) == 1, asked
    if response.status_code != 200:
        return asked[0], response.status_code
    return asked[0], bool(response.json()["dry_run"])


@pytest.mark.parametrize("query", ["dry_run=true", "dry_run=1"])
def test_a_dry_run_spends_a_read(query: str) -> None:
    assert _asked(f"/v1/things?{query}") == ("GET", True)


@pytest.mark.parametrize(
    ("query", "answer"),
    [
        ("", False),
        ("dry_run=false", False),
        ("dry_run=0", False),
        ("dry_run=TRUE", True),  # a dry run, yet a spelling the check does not know
        # Refused by the route (a parameter given twice, an unknown one), and written as
        # nothing, but not surely dry runs when the guard counts them.
        ("dry_run=true&dry_run=false", 422),
        ("Dry_Run=true", 422),
    ],
)
def test_anything_else_spends_a_write(query: str, answer: bool | int) -> None:
    assert _asked(f"/v1/things?{query}") == ("POST", answer)


def test_the_flag_counts_only_on_a_route_that_declares_it() -> None:
    assert _asked("/v1/other?dry_run=true") == ("POST", True)
