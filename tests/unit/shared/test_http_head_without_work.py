"""A ``HEAD`` answers the headers without doing the work of the ``GET``'s body: the copy
``head_routes`` made of every ``GET`` ran the whole handler and threw the body away, so a
``HEAD`` of a job's logs listed and read every chunk of the page from the object store.

A ``GET`` whose body is work says so (``http_app.body_is_work``) and has a ``HEAD`` of its
own (``head_of_get``) that answers its status (the guard, 404, a bad cursor's 422) and
headers from what it knows without that work; building an app where such a ``GET`` has none
fails, naming it."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from litestar import Litestar, Response, get
from litestar.exceptions import ImproperlyConfiguredException
from litestar.params import FromPath
from litestar.routes import HTTPRoute
from litestar.testing import TestClient

from tests.unit.shared.test_api_docs import apps
from trainyard_platform.shared.http_app import (
    BODY_IS_WORK,
    HEAD_OF_GET,
    body_is_work,
    head_answer,
    head_of_get,
    head_routes,
)


def test_a_get_whose_body_is_work_needs_a_head_of_its_own() -> None:
    @get("/things/{name:str}/content", opt=body_is_work(), sync_to_thread=False)
    def content(name: FromPath[str]) -> bytes:
        raise AssertionError("the work a HEAD must not do")

    with pytest.raises(
        ImproperlyConfiguredException, match=re.escape("/things/{name:str}/content")
    ):
        head_routes([content])

    @head_of_get("/things/{name:str}/content", sync_to_thread=False)
    def content_head(name: FromPath[str]) -> Response[None]:
        return head_answer("application/octet-stream", {"X-Size": "3"})

    with TestClient(Litestar(route_handlers=head_routes([content, content_head]))) as client:
        answer = client.head("/things/a/content")
    assert answer.status_code == 200 and answer.content == b""
    assert answer.headers["x-size"] == "3"
    assert answer.headers["content-type"] == "application/octet-stream"
    assert "content-length" not in answer.headers  # the GET's is not known without the work


def test_every_service_get_whose_body_is_work_has_a_head_of_its_own(tmp_path: Path) -> None:
    marked = []
    for service, app in apps(tmp_path).items():
        for route in app.routes:
            if not isinstance(route, HTTPRoute) or "GET" not in route.methods:
                continue
            get_handler = route.route_handler_map["GET"][0]
            if get_handler.opt.get(BODY_IS_WORK):
                head_handler = route.route_handler_map["HEAD"][0]
                assert head_handler.fn is not get_handler.fn, route.path
                assert head_handler.opt.get(HEAD_OF_GET), route.path
                marked.append(f"{service} {route.path}")
    assert "submission /v1/jobs/{job_id:str}/logs" in marked
    for artifact in ("download", "content"):  # each fetched and verified whole by the GET
        path = "/v1/models/{team:str}/{name:str}/versions/{version:int}/" + artifact
        assert f"registry {path}" in marked


def test_every_head_of_a_get_is_its_copy_or_one_of_the_known_own_ones(tmp_path: Path) -> None:
    """A ``HEAD`` that shares its ``GET``'s handler answers its headers (the ``ETag``
    among them) by construction; one of its own must be made to (``head_answer``): the
    registry's ``content`` and ``download`` (``test_models.py`` compares each ``HEAD``
    with its ``GET``: the same headers, ``content``'s ``ETag`` and ``Content-Length``
    included) and submission's logs (a JSON page the ``GET`` answers with no header of its
    own, so its ``HEAD`` answers the type alone). A new one needs such a test first."""
    own = set()
    for service, app in apps(tmp_path).items():
        for route in app.routes:
            if not isinstance(route, HTTPRoute) or "GET" not in route.methods:
                continue
            get_handler = route.route_handler_map["GET"][0]
            head_handler = route.route_handler_map["HEAD"][0]
            if head_handler.fn is not get_handler.fn:
                own.add(f"{service} {route.path}")
    versions = "registry /v1/models/{team:str}/{name:str}/versions/{version:int}"
    assert own == {
        "submission /v1/jobs/{job_id:str}/logs",
        f"{versions}/download",
        f"{versions}/content",
        # Litestar's static files (the dashboard's), whose HEAD answers its file's headers:
        # test_http_head.py's test_an_open_route_answers_head_with_its_get_headers.
        "submission /ui/{file_path:path}",
    }


async def test_head_of_a_jobs_logs_reads_no_log(monkeypatch: pytest.MonkeyPatch) -> None:
    """The job is looked up (404 for one the caller may not address, as the ``GET``), its
    cursor read (422 for another job's); its logs are neither listed nor read."""
    from trainyard_platform.services.submission import commands
    from trainyard_platform.shared.http_errors import RequestInvalid

    looked_up: list[str] = []

    async def job_for_team(conn: Any, team: int, job_id: str) -> dict[str, Any] | None:
        looked_up.append(job_id)
        return {"id": job_id} if job_id == "j1" else None

    class Pool:
        def acquire(self) -> Any:
            class Held:
                async def __aenter__(self) -> object:
                    return object()

                async def __aexit__(self, *exc: object) -> None:
                    return None

            return Held()

    caller: Any = type("C", (), {"team_id": 7, "principal": type("P", (), {"is_operator": False})})
    monkeypatch.setattr(commands.repo, "job_for_team", job_for_team)
    await commands.job_logs_head(Pool(), caller, "j1", None)  # type: ignore[arg-type]
    with pytest.raises(commands.NotFound):
        await commands.job_logs_head(Pool(), caller, "j2", None)  # type: ignore[arg-type]
    with pytest.raises(RequestInvalid):
        await commands.job_logs_head(Pool(), caller, "j1", "not-a-cursor")  # type: ignore[arg-type]
    assert looked_up == ["j1", "j2"]
