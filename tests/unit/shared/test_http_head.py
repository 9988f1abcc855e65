"""Every ``GET`` route of every service answers ``HEAD`` (RFC 9110, section 9.3.2) with the
status and headers of the ``GET`` and no body, behind the same guard: it answered 405, which
load balancers' checks and ``curl -I`` read as down. The routes ``HEAD`` adds stay out of the
OpenAPI document.

The five apps are built as ``service.serve`` builds them, over no database
(``test_api_docs.apps``): every guarded route is called without a token (401 for ``GET`` and
``HEAD`` alike), and the open ones (the probes, the dashboard's files, the job spec's schema)
with and without one."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
from litestar import HttpMethod, Litestar
from litestar.routes import HTTPRoute
from litestar.testing import TestClient

from tests.unit.shared.test_api_docs import apps
from trainyard_platform.shared.runtime import ServiceRuntime
from trainyard_platform.shared.settings import ServiceSettings

SERVICES = ("submission", "scheduler", "registry", "billing", "runner")
_SAMPLE = {"int": "1", "float": "1.5", "uuid": "00000000-0000-0000-0000-000000000001"}


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Litestar]:
    return apps(tmp_path_factory.mktemp("objects"))


def _gets(app: Litestar) -> Iterator[str]:
    """A concrete path of every ``GET`` route of the service (Litestar's ``/schema`` pages
    aside), its parameters filled with made-up values."""
    import re

    for route in app.routes:
        if (
            isinstance(route, HTTPRoute)
            and "GET" in route.methods
            and not route.path.startswith("/schema")
        ):
            yield re.sub(
                r"\{(\w+)(?::(\w+))?\}",
                lambda m: _SAMPLE.get(m.group(2) or "str", "x"),
                route.path,
            )


def _same(get: httpx.Response, head: httpx.Response) -> str | None:
    if head.status_code != get.status_code:
        return f"HEAD {head.status_code}, GET {get.status_code}"
    if dict(head.headers) != dict(get.headers):
        return f"headers differ: HEAD {dict(head.headers)}, GET {dict(get.headers)}"
    if head.content:
        return f"a body: {head.content[:80]!r}"
    return None


@pytest.mark.parametrize("service", SERVICES)
def test_every_get_route_answers_head_as_it_answers_get(
    service: str, built: dict[str, Litestar]
) -> None:
    app = built[service]
    wrong = []
    paths = list(_gets(app))
    assert len(paths) > 5
    with TestClient(app) as client:
        for path in paths:
            for token in (None, "not-a-token"):
                headers = {} if token is None else {"Authorization": f"Bearer {token}"}
                get, head = client.get(path, headers=headers), client.head(path, headers=headers)
                if head.status_code == 405 or (problem := _same(get, head)):
                    wrong.append(f"{path} ({token}): {head.status_code} {problem}")
                elif get.status_code == 401:
                    assert head.headers["www-authenticate"] == "Bearer"
    assert not wrong, "\n".join(wrong)


@pytest.mark.parametrize("service", SERVICES)
def test_the_probes_answer_head(service: str, built: dict[str, Litestar]) -> None:
    with TestClient(built[service]) as client:
        for path in ("/healthz", "/metrics"):
            head = client.head(path)
            assert head.status_code == 200, path
            assert head.content == b""
            assert _same(client.get(path), head) is None or path == "/metrics"  # counts move
        assert client.head("/readyz").status_code == client.get("/readyz").status_code


def test_a_service_without_an_app_answers_head_at_its_probes() -> None:
    """``ServiceRuntime.run`` without an app serves the probes alone."""
    from trainyard_platform.shared.http_app import head_routes

    health = ServiceRuntime("x", ServiceSettings()).health_handlers()
    with TestClient(Litestar(route_handlers=head_routes(health))) as client:
        head = client.head("/healthz")
        assert head.status_code == 200 and head.content == b""


@pytest.mark.parametrize("service", SERVICES)
def test_head_adds_nothing_to_the_openapi_document(
    service: str, built: dict[str, Litestar]
) -> None:
    document = built[service].openapi_schema.to_schema()
    heads = [path for path, item in document["paths"].items() if "head" in item]
    # The one HEAD route of its own: whether a team has a code bundle.
    assert heads == (["/v1/bundles/{sha256}"] if service == "submission" else [])


def test_an_open_route_answers_head_with_its_get_headers(built: dict[str, Litestar]) -> None:
    with TestClient(built["submission"]) as client:
        for path in ("/v1/schemas/job.v1.json", "/ui/", "/ui/config.json"):
            get, head = client.get(path), client.head(path)
            assert get.status_code == 200 and get.content, path
            assert _same(get, head) is None, (path, _same(get, head))
            assert head.headers["content-length"] == str(len(get.content))


def test_a_head_route_checks_its_query_as_the_get_does(built: dict[str, Litestar]) -> None:
    """An undeclared query parameter is refused for ``HEAD`` as for ``GET`` (422), after the
    guard (so without a token it is 401 for both)."""
    app = built["scheduler"]
    with TestClient(app) as client:
        auth = {"Authorization": "Bearer operator"}
        get = client.get("/v1/queue?stauts=x", headers=auth)
        head = client.head("/v1/queue?stauts=x", headers=auth)
        assert get.status_code == 422
        assert head.status_code == 422 and head.content == b""


@pytest.mark.parametrize("service", SERVICES)
def test_the_openapi_documents_routes_answer_head_as_every_other_get(
    service: str, built: dict[str, Litestar]
) -> None:
    """Litestar's ``/schema`` routes (added by its OpenAPI plugin after ``head_routes`` ran)
    answered ``HEAD`` with 405 while every other ``GET`` route answers it; they answer it
    as their ``GET`` (401 without a token, 200 with the operator's), without a body, and
    stay out of the document."""
    app = built[service]
    paths = [
        route.path.replace("{path:str}", "nothing-here")
        for route in app.routes
        if isinstance(route, HTTPRoute) and route.path.startswith("/schema")
    ]
    assert "/schema/openapi.json" in paths
    wrong = []
    with TestClient(app) as client:
        for path in paths:
            for headers in ({}, {"Authorization": "Bearer operator"}):
                get, head = client.get(path, headers=headers), client.head(path, headers=headers)
                if head.status_code == 405 or (problem := _same(get, head)):
                    wrong.append(f"{path} ({bool(headers)}): {head.status_code} {problem}")
    assert not wrong, "\n".join(wrong)
    document = app.openapi_schema.to_schema()
    assert not any(path.startswith("/schema") for path in document["paths"])


def _concrete(path: str) -> str:
    import re

    return re.sub(r"\{(\w+)(?::(\w+))?\}", lambda m: _SAMPLE.get(m.group(2) or "str", "x"), path)


@pytest.mark.parametrize("service", SERVICES)
def test_options_allows_what_a_405_of_the_same_path_allows(
    service: str, built: dict[str, Litestar]
) -> None:
    """``OPTIONS`` (204) named in ``Allow`` only the methods of the path's first handler
    (Litestar's ``OPTIONS`` handler reads its route as it was then; an app registers its
    handlers one at a time, ``HEAD`` last): ``GET, OPTIONS`` for a path that serves ``PUT``
    and ``HEAD`` too, which its 405 listed. Every route's ``OPTIONS`` names them all.
    Submission checks every token in its database (none here): its open routes are asked
    without one."""
    app = built[service]
    auth = {} if service == "submission" else {"Authorization": "Bearer operator"}
    wrong, answered = [], 0
    with TestClient(app) as client:
        for route in app.routes:
            if not isinstance(route, HTTPRoute):
                continue
            answer = client.options(_concrete(route.path), headers=auth)
            if answer.status_code != 204:
                continue
            answered += 1
            allowed = {m.strip() for m in answer.headers["allow"].split(",")}
            if allowed != {HttpMethod(m).value for m in route.methods}:
                wrong.append(f"{route.path}: Allow {sorted(allowed)}, not {sorted(route.methods)}")
    assert answered >= 3  # the probes at least
    assert not wrong, "\n".join(wrong)


def test_options_and_405_of_a_path_name_the_same_methods(built: dict[str, Litestar]) -> None:
    with TestClient(built["billing"]) as client:
        auth = {"Authorization": "Bearer operator"}
        refused = client.delete("/v1/prices/h200", headers=auth)
        options = client.options("/v1/prices/h200", headers=auth)
    assert refused.status_code == 405 and options.status_code == 204
    assert refused.headers["allow"] == "GET, OPTIONS, PUT, HEAD"  # Litestar's order
    assert options.headers["allow"] == "GET, HEAD, OPTIONS, PUT"
