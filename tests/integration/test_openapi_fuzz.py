"""Every HTTP API, fuzzed from its own OpenAPI document: no 5xx, and no answer the document
does not describe (status, content type, body schema).

Each service's app is built in-process as ``service.serve`` builds it, over its own migrated
schema on a real PostgreSQL (as ``test_endpoint_auth.py`` does); the document is the one the
app serves at ``/schema/openapi.json``. Schemathesis turns each operation into a Hypothesis
strategy, positive (valid per the document) and negative (invalid), and judges every answer
with ``not_a_server_error``, ``status_code_conformance``, ``content_type_conformance``,
``response_schema_conformance`` and ``plain_words`` (no error in pydantic's words).

Schemathesis' own ASGI transport runs the app on an event loop of its own in another thread,
where the asyncpg pools (bound to the test's loop) cannot go; so Hypothesis runs in a worker
thread and each request is sent on the test's loop (httpx over ASGI) and handed back to
Schemathesis to judge.

Bounded and reproducible: ``EXAMPLES`` cases per operation and mode, derandomized (no example
database), each case under ``DEADLINE`` and each request under ``REQUEST_TIMEOUT_S``. The caller is a valid one of the least
role every route allows (the operator token for the operator services, an admin of team ``ml``
for submission, an operator for its ``/v1/audit``), with a fresh token per request since
``POST /v1/tokens/rotate`` and ``DELETE /v1/tokens/{id}`` revoke tokens; submission's rate
limits are set far above what the fuzz spends. Nothing is excluded: every documented
operation works in-process (the runner's node agent is a stand-in, as in
``test_endpoint_auth.py``).

Beside the fuzz: what the documents must declare (so the fuzz has something to hold the
services to), and one fixed case for each 500 the fuzz found.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import asyncpg
import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from litestar import Litestar
from pydantic import BaseModel, SecretStr
from schemathesis.checks import (
    content_type_conformance,
    not_a_server_error,
    response_schema_conformance,
    status_code_conformance,
)

from trainyard_platform.services.billing.api import create_app as billing_app
from trainyard_platform.services.billing.budgets import BudgetRequest
from trainyard_platform.services.billing.governance_schemas import EstimateRequest, PriceRequest
from trainyard_platform.services.registry.api import create_app as registry_app
from trainyard_platform.services.registry.dataset_schemas import DatasetVersionRequest
from trainyard_platform.services.registry.schemas import AliasRequest, RegisterRequest
from trainyard_platform.services.registry.tracking_schemas import NoteBody
from trainyard_platform.services.runner.agent import NodeAgent
from trainyard_platform.services.runner.app import create_app as runner_app
from trainyard_platform.services.scheduler.admin_schemas import (
    CohortRequest,
    CordonRequest,
    FlavorRequest,
    NodeDeclarationRequest,
    PriorityClassRequest,
    QueueRequest,
)
from trainyard_platform.services.scheduler.api import create_app as scheduler_app
from trainyard_platform.services.submission import identity
from trainyard_platform.services.submission.api import AppDeps
from trainyard_platform.services.submission.api import create_app as submission_app
from trainyard_platform.services.submission.config import Settings as SubmissionSettings
from trainyard_platform.services.submission.identity_schemas import TokenRequest
from trainyard_platform.services.submission.reproduce import ReproduceRequest
from trainyard_platform.services.submission.schemas import CreateUserRequest, JobRequest, RoleChange
from trainyard_platform.shared.access import service_guard
from trainyard_platform.shared.auth import new_token
from trainyard_platform.shared.db import migrate, open_pool
from trainyard_platform.shared.identity import IdentityClient, Role
from trainyard_platform.shared.runtime import ServiceRuntime
from trainyard_platform.shared.settings import DatabaseSettings, ServiceSettings
from trainyard_platform.shared.storage import LocalStore

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

SERVICES = ("submission", "scheduler", "registry", "billing", "runner")
ADMIN_TOKEN = "the-operator-token"
EXAMPLES = {schemathesis.GenerationMode.POSITIVE: 25, schemathesis.GenerationMode.NEGATIVE: 15}
"""Cases per operation and mode."""
REQUEST_TIMEOUT_S = 10.0
DEADLINE = timedelta(seconds=5)
"""Per case (token, request, checks): far above what one takes, so only a hang or a
pathological slowness (a regular expression backtracking on a crafted input) fails it."""
NOT_PLAIN = (
    "Input should",
    "Value error",
    "Assertion failed",
    "Extra inputs",
    "Field required",
    "String should",
    "List should",
    "Dictionary should",
    "Tuple should",
    "should have at",
    "Decimal(",
    "Expected `",
    "Invalid enum value",
    "[key]",
    "function-",
    "tagged-union",
    "validation error",
    "errors.pydantic.dev",
)
"""Pydantic's and msgspec's phrasing and paths, which no error an API answers may hold: each
says what is wrong in plain words (``shared.http_errors.plain_message``)."""


@schemathesis.check
def plain_words(ctx: Any, response: Any, case: schemathesis.Case) -> bool | None:
    """A 4xx answer's errors say what is wrong in plain words (``NOT_PLAIN``)."""
    if not 400 <= response.status_code < 500 or not response.content:
        return None
    try:
        errors = json.loads(response.content).get("errors", [])
    except (ValueError, AttributeError):
        return None  # not the error shape: the schema conformance check says so
    said = [f"{e.get('field')}: {e.get('message')}" for e in errors if isinstance(e, dict)]
    unplain = [text for text in said if any(phrase in text for phrase in NOT_PLAIN)]
    assert not unplain, f"not in plain words: {unplain}"
    return None


CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
    plain_words,
]


@dataclass
class Fuzzed:
    """The apps, and how to get a token for a request to one of them."""

    apps: dict[str, Litestar]
    submission_pool: asyncpg.Pool

    async def token(self, service: str, path: str) -> str:
        if service != "submission":
            return ADMIN_TOKEN
        user = "root" if path == "/v1/audit" else "alice"
        token, token_hash = new_token()
        async with self.submission_pool.acquire() as conn:
            await conn.execute(
                "INSERT INTO tokens (token_hash, user_id) SELECT $1, id FROM users WHERE name = $2",
                token_hash,
                user,
            )
        return token


@pytest.fixture
async def fuzzed(database_url: str, tmp_path: Path) -> AsyncIterator[Fuzzed]:
    from trainyard_platform.services.billing.service import MIGRATIONS as BILLING
    from trainyard_platform.services.registry.service import MIGRATIONS as REGISTRY
    from trainyard_platform.services.scheduler.service import MIGRATIONS as SCHEDULER
    from trainyard_platform.services.submission.service import MIGRATIONS as SUBMISSION

    migrations = {
        "submission": SUBMISSION,
        "scheduler": SCHEDULER,
        "registry": REGISTRY,
        "billing": BILLING,
    }
    pools: dict[str, asyncpg.Pool] = {}
    opened = []
    try:
        for name, folder in migrations.items():
            context = open_pool(DatabaseSettings(url=database_url), name)
            opened.append(context)
            pools[name] = await context.__aenter__()
            await migrate(pools[name], name, folder)
        await identity.bootstrap_user(pools["submission"], "ml", "alice")
        await identity.bootstrap_user(pools["submission"], "platform", "root", Role.OPERATOR)
        health = ServiceRuntime("test", ServiceSettings()).health_handlers()
        settings_ = SubmissionSettings(
            database=DatabaseSettings(),
            read_rate_per_s=1e6,
            read_burst=1_000_000,
            write_rate_per_s=1e6,
            write_burst=1_000_000,
        )
        deps = AppDeps(pools["submission"], LocalStore(tmp_path / "objects"), health)
        submission = submission_app(settings_, deps)
        ask = httpx.AsyncClient(
            transport=httpx.ASGITransport(app=submission), base_url="http://submission"
        )
        guard = service_guard(SecretStr(ADMIN_TOKEN), IdentityClient("http://submission", http=ask))
        agent = SimpleNamespace(
            node_id="n1",
            settings=SimpleNamespace(gpu_flavor="cpu"),
            gpus=SimpleNamespace(source="virtual", names=[]),
            job_uids=range(300_000, 300_064),
            job_network="loopback",
            running=list,
        )
        apps = {
            "submission": submission,
            "scheduler": scheduler_app(pools["scheduler"], guard, health),
            "registry": registry_app(pools["registry"], guard, health),
            "billing": billing_app(pools["billing"], guard, health),
            "runner": runner_app(
                ServiceRuntime("runner", ServiceSettings()), cast(NodeAgent, agent), guard
            ),
        }
        yield Fuzzed(apps=apps, submission_pool=pools["submission"])
        await ask.aclose()
    finally:
        for context in reversed(opened):
            await context.__aexit__(None, None, None)


async def send(app: Litestar, request: dict[str, Any]) -> httpx.Response:
    """``request`` (Schemathesis' transport arguments) sent to ``app`` in-process."""
    request = dict(request)
    body: dict[str, Any] = {}
    if "json" in request:
        body["content"] = json.dumps(request.pop("json")).encode()
    if "data" in request:
        body["content"] = request.pop("data")
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, cookies=request.pop("cookies", None)) as http:
        return await asyncio.wait_for(
            http.request(
                request.pop("method"),
                request.pop("url"),
                headers=request.pop("headers", None),
                params=request.pop("params", None),
                **body,
                **request,  # anything else: httpx refuses what it does not know
            ),
            REQUEST_TIMEOUT_S,
        )


def _bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


async def document_of(fuzzed: Fuzzed, service: str) -> dict[str, Any]:
    """The OpenAPI document ``service`` serves."""
    request = {
        "method": "GET",
        "url": "http://test/schema/openapi.json",
        "headers": _bearer(await fuzzed.token(service, "/schema")),
    }
    response = await send(fuzzed.apps[service], request)
    assert response.status_code == 200, response.text
    document: dict[str, Any] = response.json()
    return document


@pytest.mark.parametrize("service", SERVICES)
async def test_every_operation_answers_as_its_document_says(service: str, fuzzed: Fuzzed) -> None:
    app = fuzzed.apps[service]
    loop = asyncio.get_running_loop()
    schema = schemathesis.openapi.from_dict(await document_of(fuzzed, service))
    operations = [result.ok() for result in schema.get_all_operations()]
    assert operations, f"{service}: no operation in the document"

    def exchange(case: schemathesis.Case) -> None:
        """Send ``case`` on the test's loop (from Hypothesis' thread) and judge the answer."""
        token = asyncio.run_coroutine_threadsafe(
            fuzzed.token(service, case.operation.path), loop
        ).result()
        request = case.as_transport_kwargs(base_url="http://test")
        # Always the caller's token: negative cases drop or garble it otherwise, and
        # test_endpoint_auth.py already holds every route to 401 without a valid one.
        request["headers"].update(_bearer(token))
        response = asyncio.run_coroutine_threadsafe(send(app, request), loop).result()
        case.validate_response(response, checks=CHECKS, headers=request["headers"])

    def fuzz() -> list[str]:
        found: list[str] = []
        for operation in operations:
            for mode, examples in EXAMPLES.items():

                @settings(
                    max_examples=examples,
                    derandomize=True,
                    database=None,
                    deadline=DEADLINE,
                    phases=[Phase.explicit, Phase.generate, Phase.shrink],
                    suppress_health_check=list(HealthCheck),
                )
                @given(case=operation.as_strategy(generation_mode=mode))
                def run(case: schemathesis.Case) -> None:
                    exchange(case)

                try:
                    run()
                except (Exception, BaseExceptionGroup) as exc:  # Schemathesis' FailureGroup
                    found.append(f"{mode.value} {operation.label}: {_described(exc)}")
        return found

    found = await asyncio.to_thread(fuzz)
    assert not found, f"{service}: {len(found)} contradictions\n\n" + "\n\n".join(found)


def _described(exc: BaseException) -> str:
    """The failure (Schemathesis' message names each check that failed) and its notes."""
    return "\n".join([f"{type(exc).__name__}: {exc}", *getattr(exc, "__notes__", ())])


JSON_BODIES: dict[tuple[str, str, str], type[BaseModel]] = {
    ("submission", "post", "/v1/jobs"): JobRequest,
    ("submission", "post", "/v1/jobs/{job_id}/reproduce"): ReproduceRequest,
    ("submission", "post", "/v1/admin/users"): CreateUserRequest,
    ("submission", "patch", "/v1/admin/users/{name}"): RoleChange,
    ("submission", "post", "/v1/tokens"): TokenRequest,
    ("submission", "post", "/v1/tokens/rotate"): TokenRequest,
    ("scheduler", "put", "/v1/admin/flavors/{name}"): FlavorRequest,
    ("scheduler", "put", "/v1/admin/cohorts/{name}"): CohortRequest,
    ("scheduler", "put", "/v1/admin/queues/{name}"): QueueRequest,
    ("scheduler", "put", "/v1/admin/priority-classes/{name}"): PriorityClassRequest,
    ("scheduler", "patch", "/v1/admin/queues/{name}"): QueueRequest,
    ("scheduler", "patch", "/v1/admin/priority-classes/{name}"): PriorityClassRequest,
    ("scheduler", "put", "/v1/admin/node-inventory/{node_id}"): NodeDeclarationRequest,
    ("scheduler", "patch", "/v1/admin/node-inventory/{node_id}"): NodeDeclarationRequest,
    ("scheduler", "post", "/v1/admin/nodes/{node_id}/cordon"): CordonRequest,
    ("registry", "put", "/v1/jobs/{job_id}/note"): NoteBody,
    ("registry", "post", "/v1/models/{team}/{name}/versions"): RegisterRequest,
    ("registry", "put", "/v1/models/{team}/{name}/aliases/{alias}"): AliasRequest,
    ("registry", "post", "/v1/datasets/{team}/{name}/versions"): DatasetVersionRequest,
    ("billing", "put", "/v1/prices/{flavor}"): PriceRequest,
    ("billing", "post", "/v1/costs/estimate"): EstimateRequest,
    ("billing", "put", "/v1/budgets/{team}"): BudgetRequest,
    ("billing", "put", "/v1/budgets/{team}/{project}"): BudgetRequest,
    ("billing", "patch", "/v1/budgets/{team}"): BudgetRequest,
    ("billing", "patch", "/v1/budgets/{team}/{project}"): BudgetRequest,
}
"""The routes that read their JSON body by hand, and the model each validates it with."""
MERGE_PATCHES = {("scheduler", "patch"), ("billing", "patch")}
"""The services whose ``PATCH`` reads a JSON Merge Patch of its ``PUT`` body."""


@pytest.mark.parametrize("service", SERVICES)
async def test_the_documents_declare_the_errors_the_security_and_the_bodies(
    service: str, fuzzed: Fuzzed
) -> None:
    document = await document_of(fuzzed, service)
    assert document["security"] == [{"bearer": []}]
    assert document["components"]["securitySchemes"]["bearer"]["scheme"] == "bearer"
    errors = {"$ref": "#/components/schemas/ErrorBody"}
    everywhere = {400, 401, 403, 422, 429, 503}  # 429: a user token check spends its limit
    for path, item in document["paths"].items():
        for method, operation in item.items():
            responses = operation["responses"]
            for status in everywhere:
                assert responses[str(status)]["content"]["application/json"]["schema"] == errors, (
                    f"{method} {path}: {status}"
                )
            body = operation.get("requestBody")
            model = JSON_BODIES.get((service, method, path))
            if model is not None:
                schema = body["content"]["application/json"]["schema"]
                assert body["required"] and schema["title"] == model.__name__
                fields = {info.alias or name for name, info in model.model_fields.items()}
                assert set(schema["properties"]) == fields
                if model is not EstimateRequest:  # a whole job spec, of which it reads a few
                    assert schema["additionalProperties"] is False, f"{method} {path}"
                assert "$ref" not in json.dumps(schema)  # its $defs are inlined
                if (service, method) in MERGE_PATCHES:  # a merge patch of the PUT body
                    assert body["content"]["application/merge-patch+json"]["schema"] == schema
                    assert '"required"' not in json.dumps(schema), f"{method} {path}"
            elif (method, path) == ("put", "/v1/bundles/{sha256}"):
                assert set(body["content"]) == {"application/octet-stream"}
            else:
                assert body is None, f"{method} {path}: a body nobody reads"
    assert "ErrorBody" in document["components"]["schemas"]


ETAGGED: dict[str, set[str]] = {
    "submission": {"/v1/admin/users/{name}", "/v1/jobs/{job_id}"},
    "scheduler": {
        *(f"/v1/admin/{kind}/{{name}}" for kind in ("flavors", "cohorts", "queues")),
        "/v1/admin/priority-classes/{name}",
        "/v1/admin/node-inventory/{node_id}",
        "/v1/admin/nodes/{node_id}/cordon",
    },
    "registry": {
        "/v1/jobs/{job_id}/note",
        "/v1/models/{team}/{name}",
        "/v1/models/{team}/{name}/versions/{version}",
        "/v1/models/{team}/{name}/versions/{version}/content",
        "/v1/models/{team}/{name}/aliases/{alias}",
    },
    "billing": {"/v1/prices/{flavor}", "/v1/budgets/{team}", "/v1/budgets/{team}/{project}"},
    "runner": set(),
}
"""The ``GET`` routes that answer with an ``ETag`` (``tagged``, or the header set by hand),
to each of which the app's edge answers 304 when ``If-None-Match`` names it."""


@pytest.mark.parametrize("service", SERVICES)
async def test_every_get_with_an_etag_documents_its_304_and_if_none_match(
    service: str, fuzzed: Fuzzed
) -> None:
    """Each route that can answer with an ``ETag`` documents the header, the 304 the edge
    answers in its stead and the ``If-None-Match`` that asks for it
    (``shared.http_app.ETAG``); no other ``GET`` documents a 304. Before, no document
    listed either, so the fuzz never sent the header and a client never knew of the 304."""
    document = await document_of(fuzzed, service)
    documented = set()
    for path, item in document["paths"].items():
        operation = item.get("get")
        if operation is None or "304" not in operation["responses"]:
            continue
        documented.add(path)
        assert "content" not in operation["responses"]["304"], path  # no body
        assert "ETag" in operation["responses"]["200"]["headers"], path
        headers = {p["name"] for p in operation.get("parameters", []) if p["in"] == "header"}
        assert "If-None-Match" in headers, path
    assert documented == ETAGGED[service]


INT64_MAX = 2**63 - 1
UNHOLDABLE: dict[str, list[tuple[str, str, str]]] = {
    "submission": [
        ("GET", "/v1/jobs/a%00b", "job_id"),
        ("POST", "/v1/jobs/a%00b/cancel", "job_id"),
        ("GET", "/v1/jobs/a%00b/logs", "job_id"),
        ("DELETE", f"/v1/tokens/{INT64_MAX + 1}", "token_id"),
        ("GET", f"/v1/audit?before={INT64_MAX + 1}", "before"),
    ],
    "scheduler": [
        *(
            (method, f"/v1/admin/{kind}/a%00b", "name")
            for kind in ("flavors", "cohorts", "queues", "priority-classes")
            for method in ("GET", "DELETE")
        ),
        *(("POST", f"/v1/admin/nodes/a%00b/{verb}", "node_id") for verb in ("cordon", "uncordon")),
        ("DELETE", "/v1/admin/nodes/a%00b", "node_id"),
        ("GET", f"/v1/audit?before={INT64_MAX + 1}", "before"),
    ],
    "registry": [
        ("GET", "/v1/models/a%00/b/versions", "team"),
        ("GET", "/v1/models/a/b%00/versions", "name"),
        ("GET", "/v1/models/a/b/versions/2147483648", "version"),
        ("GET", "/v1/datasets/a%00/b", "team"),
        ("GET", "/v1/datasets/a/b%00/versions/1", "name"),
        ("GET", "/v1/datasets/a/b/versions/2147483648", "version"),
        ("PUT", "/v1/datasets/a/b/grants/c%00", "grantee_team"),
        ("GET", "/v1/lineage/models/a/b/versions/2147483648/upstream", "version"),
        ("GET", "/v1/lineage/datasets/a%00/b/versions/1/downstream", "team"),
        ("GET", f"/v1/experiments/{INT64_MAX + 1}", "experiment_id"),
        ("GET", f"/v1/experiments/{INT64_MAX + 1}/compare", "experiment_id"),
        ("GET", "/v1/jobs/a%00b/metrics", "job_id"),
        ("GET", "/v1/jobs/a/metrics/b%00", "key"),
        ("GET", f"/v1/jobs/a/metrics/b?from_step={INT64_MAX + 1}", "from_step"),
        ("PUT", "/v1/jobs/a%00b/tags/x", "job_id"),
        ("GET", f"/v1/audit?before={INT64_MAX + 1}", "before"),
    ],
    "billing": [
        ("GET", "/v1/usage?team=a%00", "team"),
        ("GET", f"/v1/audit?before={INT64_MAX + 1}", "before"),
        ("GET", "/v1/prices?flavor=a%00", "flavor"),
        ("GET", "/v1/budgets?team=a%00", "team"),
        ("GET", "/v1/budgets/a%00", "team"),
        ("GET", "/v1/budgets/a/b%00", "project"),
    ],
}
"""Parameters the database cannot hold (a NUL in text, an integer beyond its column): each
was a 500 (the fuzz found them); each is a 422 naming the parameter."""


@pytest.mark.parametrize("service", list(UNHOLDABLE))
async def test_parameters_the_database_cannot_hold_are_refused_with_422(
    service: str, fuzzed: Fuzzed
) -> None:
    wrong = []
    for method, path, field in UNHOLDABLE[service]:
        token = await fuzzed.token(service, path.partition("?")[0])
        request = {"method": method, "url": f"http://test{path}", "headers": _bearer(token)}
        response = await send(fuzzed.apps[service], request)
        fields = [e["field"] for e in response.json()["errors"]] if response.content else []
        if response.status_code != 422 or fields != [field]:
            wrong.append(f"{method} {path}: {response.status_code} {response.text}")
    assert not wrong, "\n".join(wrong)


def _concrete(path: str, operation: dict[str, Any]) -> str:
    """``path`` of the document with a sample value of each path parameter's type."""
    for parameter in operation.get("parameters", []):
        if parameter["in"] == "path":
            kind = parameter.get("schema", {}).get("type")
            sample = "1" if kind == "integer" else "x"
            path = path.replace("{" + parameter["name"] + "}", sample)
    return path


@pytest.mark.parametrize("service", SERVICES)
async def test_a_query_parameter_the_document_does_not_declare_is_refused(
    service: str, fuzzed: Fuzzed
) -> None:
    """Every operation answers 422 to a query parameter its document does not list (naming
    it, and listing those it takes), and to one it takes once given twice, before anything
    runs: a misspelt filter is never read as no filter."""
    document = await document_of(fuzzed, service)
    wrong = []
    for template, item in document["paths"].items():
        for method, operation in item.items():
            path = _concrete(template, operation)
            query = [p for p in operation.get("parameters", []) if p["in"] == "query"]
            declared = ", ".join(sorted(p["name"] for p in query)) or "this route takes none"
            once = [p["name"] for p in query if p.get("schema", {}).get("type") != "array"]
            cases = [("zz_undeclared=1", "zz_undeclared", f"unknown query parameter ({declared})")]
            cases += [(f"{name}=1&{name}=2", name, "given more than once") for name in once]
            for sent, field, message in cases:
                token = await fuzzed.token(service, path)
                request = {
                    "method": method.upper(),
                    "url": f"http://test{path}?{sent}",
                    "headers": _bearer(token),
                }
                response = await send(fuzzed.apps[service], request)
                expected = [{"field": field, "message": message}]
                errors = response.json()["errors"] if response.content else expected  # HEAD
                if response.status_code != 422 or errors != expected:
                    wrong.append(f"{method} {path}?{sent}: {response.status_code} {response.text}")
    assert not wrong, "\n".join(wrong)
