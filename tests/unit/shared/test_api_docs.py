"""Every operation of the five services' OpenAPI documents is in the documentation.

Each service's app is built as its ``service`` module builds it (no database: documents are
made from the routes alone), and each (method, path) of its document must be written in
README.md, deploy/README.md or docs/*.md as ``METHOD /path``, the path as in the document
but with any name for its parameters (``{id}`` for ``{job_id}``), the method alone or among
others (``HEAD|PUT /v1/bundles/{sha256}``).

The scheduler's ``GET /v1/admin/{flavors,queues,priority-classes}/{name}``, its cohort,
queue and class routes (shown only as ``curl`` examples with names filled in), billing's
project budgets (``/v1/budgets/{team}[/{project}]``), submission's ``GET
/v1/admin/users`` and ``POST /v1/tokens`` were in no document."""

from __future__ import annotations

import re
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import httpx
import pytest
from litestar import Litestar
from pydantic import SecretStr

from trainyard_platform.services.billing.api import create_app as billing_app
from trainyard_platform.services.registry.api import create_app as registry_app
from trainyard_platform.services.runner.app import create_app as runner_app
from trainyard_platform.services.scheduler.api import create_app as scheduler_app
from trainyard_platform.services.submission.api import AppDeps
from trainyard_platform.services.submission.api import create_app as submission_app
from trainyard_platform.services.submission.config import Settings as SubmissionSettings
from trainyard_platform.shared.access import service_guard
from trainyard_platform.shared.deadletters import deadletter_routes
from trainyard_platform.shared.runtime import ServiceRuntime
from trainyard_platform.shared.settings import NatsSettings, ServiceSettings
from trainyard_platform.shared.storage import LocalStore

ROOT = Path(__file__).resolve().parents[3]
DOCS = "\n".join(
    path.read_text()
    for path in [ROOT / "README.md", ROOT / "deploy" / "README.md", *(ROOT / "docs").glob("*.md")]
)


def apps(objects: Path) -> dict[str, Litestar]:
    """The five apps as ``service.serve`` builds them, over no database and no bus (no
    request here reaches a handler that needs one)."""
    no_pool = cast(Any, None)
    no_bus = cast(Any, SimpleNamespace(jetstream=None, settings=NatsSettings()))
    guard = service_guard(SecretStr("operator"), None)
    agent = SimpleNamespace(node_id="n1", settings=SimpleNamespace(gpu_flavor="cpu"))

    def routes(service: str) -> list[Any]:
        """What ``service.serve`` adds to the app: the probes and the dead-letter routes."""
        health = ServiceRuntime(service, ServiceSettings()).health_handlers()
        return [*health, *deadletter_routes(no_bus, service, no_pool)]

    return {
        "submission": submission_app(
            SubmissionSettings(), AppDeps(no_pool, LocalStore(objects), routes("submission"))
        ),
        "scheduler": scheduler_app(no_pool, guard, routes("scheduler")),
        "registry": registry_app(no_pool, guard, routes("registry")),
        "billing": billing_app(no_pool, guard, routes("billing")),
        "runner": runner_app(
            ServiceRuntime("runner", ServiceSettings()),
            cast(Any, agent),
            guard,
            deadletter_routes(no_bus, "runner-n1"),
        ),
    }


def operations(objects: Path) -> list[tuple[str, str, str]]:
    """(service, method, path) of every operation of every document."""
    found = []
    for service, app in apps(objects).items():
        for path, item in app.openapi_schema.to_schema()["paths"].items():
            found.extend((service, method.upper(), path) for method in item)
    return found


def written(method: str, path: str) -> bool:
    """Whether ``method path`` is in the documentation (see the module)."""
    template = re.sub(r"\\\{[^}]*\\\}", r"\\{[^}/]+\\}", re.escape(path))
    methods = r"(?<![A-Za-z|])(?:[A-Z]+\|)*" + method + r"(?:\|[A-Z]+)*"
    return re.search(methods + r" " + template + r"(?![\w/{])", DOCS) is not None


def test_every_operation_is_documented(tmp_path: Path) -> None:
    found = operations(tmp_path)
    assert len(found) >= 80
    missing = [f"{service}: {m} {p}" for service, m, p in found if not written(m, p)]
    assert missing == []


@pytest.mark.parametrize(
    ("method", "path", "expected"),
    [
        ("GET", "/v1/jobs/{job_id}", True),
        ("HEAD", "/v1/bundles/{sha256}", True),
        ("GET", "/v1/jobs", True),
        ("DELETE", "/v1/jobs/{job_id}", False),
        ("GET", "/v1/no-such-route", False),
    ],
)
def test_the_matcher(method: str, path: str, expected: bool) -> None:
    assert written(method, path) is expected


def _normal(path: str) -> str:
    """A path as the docs write it: parameters as ``...``, no trailing slash."""
    return re.sub(r"\{[^}]*\}", "...", path).rstrip("/")


async def _open_routes(objects: Path) -> set[str]:
    """The GET routes of the five apps that answer a request without a token with anything
    but 401 (parameters filled with a value of their type)."""
    found = set()
    for app in apps(objects).values():
        transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as http:
            for route in app.routes:
                if "GET" not in getattr(route, "methods", ()):
                    continue
                url = re.sub(r"\{[^}:]*:int\}", "1", route.path)
                url = re.sub(r"\{[^}]*\}", "x", url) or "/"
                if (await http.get(url)).status_code != 401:
                    found.add(route.path)
    return found


async def test_security_md_names_every_route_open_without_a_token(tmp_path: Path) -> None:
    """docs/security.md said only ``/healthz`` and ``/readyz`` answer without a token, and
    the dashboard's files; ``/metrics`` on every service and the job spec's schema on the
    submission service answer too."""
    doc = (ROOT / "docs" / "security.md").read_text()
    section = doc[doc.index("\n## HTTP\n") : doc.index("Details: [dashboard.md]")]
    documented = {_normal(p) for p in re.findall(r"`GET (/[^`\s]*)`", section)}
    opened = {_normal(p) for p in await _open_routes(tmp_path)}
    assert "/healthz" in opened
    assert opened == documented


@pytest.mark.parametrize(
    ("method", "path", "statuses"),
    [
        ("get", "/v1/deadletters/{sequence}", {"404"}),
        ("post", "/v1/deadletters/{sequence}/redrive", {"404", "409"}),
        ("delete", "/v1/deadletters/{sequence}", {"404"}),
    ],
)
def test_the_dead_letter_routes_declare_what_they_answer(
    method: str, path: str, statuses: set[str], tmp_path: Path
) -> None:
    """The dead-letter routes answer 404 for a sequence that is no dead letter of the
    service, and a redrive 409 when the consumer does not read its redrive subject or the
    event cannot be sent again (``shared.deadletters``); their OpenAPI documents declared
    neither, on all five services, so a client generated from them knew only 200."""
    for service, app in apps(tmp_path).items():
        responses = app.openapi_schema.to_schema()["paths"][path][method]["responses"]
        assert statuses <= set(responses), f"{service}: {method.upper()} {path}"


@pytest.mark.parametrize("path", ["/v1/jobs", "/v1/jobs/{job_id}/reproduce"])
def test_a_submission_declares_the_200_of_a_retry(path: str, tmp_path: Path) -> None:
    """README: ``POST /v1/jobs`` and ``POST /v1/jobs/{id}/reproduce`` with an
    ``Idempotency-Key`` answer a retry of the same request 200 with the job the key made
    (``reproduce._replayed``); the reproduction's OpenAPI document declared only its 201, so
    a client generated from it took the retry's 200 for an undeclared answer."""
    responses = apps(tmp_path)["submission"].openapi_schema.to_schema()["paths"][path]["post"]
    assert {"200", "201"} <= set(responses["responses"])


async def test_billing_md_s_422_examples_are_what_billing_answers(tmp_path: Path) -> None:
    """docs/billing.md shows the 422 of a `GET /v1/costs` with an unknown parameter, then of
    the same request without it. Its list of known parameters had `group_by` before
    `granularity`; billing lists them sorted (`granularity` first)."""
    import json

    doc = (ROOT / "docs" / "billing.md").read_text()
    first = re.search(r'\{"field": "colour", "message": "([^"]+)"\}', doc)
    then = re.findall(
        r'\{"field": "(group_by|from)", "message": "([^"]+)"\}', " ".join(doc.split())
    )
    assert first is not None and len(then) == 2
    transport = httpx.ASGITransport(app=apps(tmp_path)["billing"])
    headers = {"Authorization": "Bearer operator"}
    async with httpx.AsyncClient(transport=transport, base_url="http://t", headers=headers) as http:
        query = "/v1/costs?group_by=team,colour&from=2026-12-01T10:30:00Z"
        with_colour = (await http.get(query + "&colour=red")).json()["errors"]
        without = (await http.get(query)).json()["errors"]
    assert with_colour == [{"field": "colour", "message": first.group(1)}], json.dumps(with_colour)
    assert [(e["field"], e["message"]) for e in without] == then


USER_DOCS = ["README.md", *(f"docs/{n}.md" for n in ("cli", "job-spec", "models", "billing"))]
USER_DOCS.append("docs/architecture.md")
"""The documents whose every ``METHOD /path`` must name an operation there is."""
_WRITTEN = re.compile(
    r"(?<![A-Za-z|])((?:(?:GET|HEAD|POST|PUT|PATCH|DELETE)\|)*(?:GET|HEAD|POST|PUT|PATCH|DELETE))"
    r" (?:https?://[^/\s`]+)?(/v1/[^\s`]*)"
)


def _variants(path: str) -> list[str]:
    """A path as written with its ``[optional]`` parts and ``{a,b}`` choices spelt out."""
    optional = re.search(r"\[([^\[\]]*)\]", path)
    if optional:
        left, right = path[: optional.start()], path[optional.end() :]
        return [*_variants(left + right), *_variants(left + optional.group(1) + right)]
    choice = re.search(r"\{([^{},]*,[^{}]*)\}", path)
    if choice:
        left, right = path[: choice.start()], path[choice.end() :]
        return [v for c in choice.group(1).split(",") for v in _variants(left + c + right)]
    return [path]


def _placeholder(segment: str) -> bool:
    """``{id}``, ``<cursor>``, ``TEAM``, ``P``: a segment that stands for any value."""
    return bool(re.fullmatch(r"\{[^{}]*\}|<[^<>]*>|[A-Z][A-Z_]*|\.\.\.|…", segment))


def _names(written: str, route: str) -> bool:
    """Whether the written path (no query) is the route's, a value in place of a parameter."""
    ours, theirs = written.split("/"), route.rstrip("/").split("/")
    return len(ours) == len(theirs) and all(
        a == b or _placeholder(a) or b.startswith("{") for a, b in zip(ours, theirs, strict=True)
    )


def test_every_operation_the_user_documents_name_is_one(tmp_path: Path) -> None:
    """The other way round from ``test_every_operation_is_documented``: each ``METHOD /path``
    of the user documents (``USER_DOCS``) is an operation of a service, with the query
    parameters it writes (``?granted=true``, ``?team&project``) among the operation's."""
    documented: dict[tuple[str, str], set[str]] = {}
    for app in apps(tmp_path).values():
        for route, item in app.openapi_schema.to_schema()["paths"].items():
            for method, operation in item.items():
                query = {p["name"] for p in operation.get("parameters", []) if p["in"] == "query"}
                documented[(method.upper(), route)] = query
    wrong = []
    for doc in USER_DOCS:
        text = (ROOT / doc).read_text()
        for written in _WRITTEN.finditer(text):
            if text[written.end() :].lstrip().startswith("422"):
                continue  # a request shown with its refusal
            methods, raw = written.groups()
            raw = raw if raw.endswith(("...", "…")) else raw.rstrip(".,:;)")
            for variant in _variants(raw):
                path, _, query = variant.partition("?")
                asked = {q.split("=")[0] for q in query.split("&") if q}
                for method in methods.split("|"):
                    fits = [
                        params
                        for (m, route), params in documented.items()
                        if m == method and _names(path, route)
                    ]
                    if not fits or not any(asked <= params for params in fits):
                        wrong.append(f"{doc}: {method} {variant}")
    assert wrong == []
