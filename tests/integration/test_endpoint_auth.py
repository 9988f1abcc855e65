"""Every endpoint of every service, called by every kind of caller: who gets in, who does not,
and that a refused call changes nothing.

The routes are read from each app itself, and each must have an entry in ``POLICY`` (the
least role it needs): an endpoint added later fails here until someone decides who may call
it. Every service's app is built in-process as its ``service.serve`` builds it, each over its
own migrated schema; the operator services check user tokens with the submission app, as
they do in production (``shared.identity.IdentityClient`` over an in-process transport).

Credentials: none, garbage, malformed headers, a revoked token, an expired token, a disabled
user's token, and a live token of each role (viewer, member, admin of team ``ml``; an admin
of team ``vision``; a platform operator) plus each operator service's operator token.
"""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import asyncpg
import httpx
import pytest
from litestar import Litestar
from litestar.routes import HTTPRoute
from pydantic import SecretStr
from pydantic_settings import BaseSettings

from trainyard_platform.services.billing.api import create_app as billing_app
from trainyard_platform.services.billing.config import Settings as BillingSettings
from trainyard_platform.services.registry.api import create_app as registry_app
from trainyard_platform.services.registry.config import Settings as RegistrySettings
from trainyard_platform.services.runner.agent import NodeAgent
from trainyard_platform.services.runner.app import create_app as runner_app
from trainyard_platform.services.runner.config import Settings as RunnerSettings
from trainyard_platform.services.scheduler.api import create_app as scheduler_app
from trainyard_platform.services.scheduler.config import Settings as SchedulerSettings
from trainyard_platform.services.submission import identity
from trainyard_platform.services.submission.api import AppDeps
from trainyard_platform.services.submission.api import create_app as submission_app
from trainyard_platform.services.submission.config import Settings as SubmissionSettings
from trainyard_platform.shared.access import OPEN_PATHS, service_guard
from trainyard_platform.shared.auth import hash_token, new_token
from trainyard_platform.shared.db import migrate, open_pool
from trainyard_platform.shared.identity import IdentityClient, Role
from trainyard_platform.shared.runtime import ServiceRuntime, settings_or_exit
from trainyard_platform.shared.settings import DatabaseSettings, ServiceSettings
from trainyard_platform.shared.storage import LocalStore

pytestmark = pytest.mark.integration

ADMIN_TOKEN = SecretStr("the-operator-token")
OPERATOR_SERVICES = ("scheduler", "registry", "billing", "runner")
SERVICES = (*OPERATOR_SERVICES, "submission")
SETTINGS: dict[str, type[BaseSettings]] = {
    "scheduler": SchedulerSettings,
    "registry": RegistrySettings,
    "billing": BillingSettings,
    "runner": RunnerSettings,
}
_PARAM = re.compile(r"\{(\w+)(?::(\w+))?\}")
_SAMPLE = {"int": "1", "float": "1.5", "uuid": "00000000-0000-0000-0000-000000000001"}

V, M, A, OP = Role.VIEWER, Role.MEMBER, Role.ADMIN, Role.OPERATOR
POLICY: dict[str, dict[tuple[str, str], Role]] = {
    "submission": {
        ("GET", "/v1/me"): V,
        ("POST", "/v1/me"): V,
        ("GET", "/v1/teams/{team:str}"): V,
        ("GET", "/v1/jobs"): V,
        ("GET", "/v1/jobs/{job_id:str}"): V,
        ("GET", "/v1/jobs/{job_id:str}/logs"): V,
        ("POST", "/v1/jobs"): M,
        ("POST", "/v1/jobs/{job_id:str}/cancel"): M,
        ("POST", "/v1/jobs/{job_id:str}/reproduce"): M,
        ("HEAD", "/v1/bundles/{sha256:str}"): V,
        ("PUT", "/v1/bundles/{sha256:str}"): M,
        ("GET", "/v1/tokens"): V,
        ("POST", "/v1/tokens"): V,
        ("POST", "/v1/tokens/rotate"): V,
        ("DELETE", "/v1/tokens/{token_id:int}"): V,
        ("GET", "/v1/admin/users"): A,
        ("POST", "/v1/admin/users"): A,
        ("GET", "/v1/admin/users/{name:str}"): A,
        ("PATCH", "/v1/admin/users/{name:str}"): A,
        ("DELETE", "/v1/admin/users/{name:str}"): A,
        ("GET", "/v1/audit"): OP,
    },
    "scheduler": {
        ("GET", "/v1/queue"): OP,
        ("GET", "/v1/queue/{name:str}/pending"): OP,
        ("GET", "/v1/audit"): OP,
        ("GET", "/v1/admin/nodes/{node_id:str}/cordon"): OP,
        ("POST", "/v1/admin/nodes/{node_id:str}/cordon"): OP,
        ("POST", "/v1/admin/nodes/{node_id:str}/uncordon"): OP,
        ("DELETE", "/v1/admin/nodes/{node_id:str}"): OP,
        **{
            (method, f"/v1/admin/{kind}{suffix}"): role
            for kind in ("flavors", "cohorts", "queues", "priority-classes")
            for method, suffix, role in (
                ("GET", "", V),
                ("GET", "/{name:str}", V),
                ("PUT", "/{name:str}", OP),
                ("DELETE", "/{name:str}", OP),
            )
        },
        ("PATCH", "/v1/admin/queues/{name:str}"): OP,
        ("PATCH", "/v1/admin/priority-classes/{name:str}"): OP,
        # What nodes are declared to have is the operators' alone, reads too (as the nodes).
        ("GET", "/v1/admin/node-inventory"): OP,
        ("GET", "/v1/admin/node-inventory/{node_id:str}"): OP,
        ("PUT", "/v1/admin/node-inventory/{node_id:str}"): OP,
        ("PATCH", "/v1/admin/node-inventory/{node_id:str}"): OP,
        ("DELETE", "/v1/admin/node-inventory/{node_id:str}"): OP,
    },
    "registry": {
        ("GET", "/v1/models/{team:str}/{name:str}/versions"): V,
        ("GET", "/v1/models/{team:str}/{name:str}/versions/{version:int}"): V,
        ("GET", "/v1/models"): V,
        ("GET", "/v1/models/{team:str}/{name:str}"): V,
        ("DELETE", "/v1/models/{team:str}/{name:str}"): M,
        ("GET", "/v1/models/{team:str}/{name:str}/versions/by-alias/{alias:str}"): V,
        ("GET", "/v1/models/{team:str}/{name:str}/versions/{version:int}/download"): V,
        ("GET", "/v1/models/{team:str}/{name:str}/versions/{version:int}/content"): V,
        ("GET", "/v1/models/{team:str}/{name:str}/aliases"): V,
        ("GET", "/v1/models/{team:str}/{name:str}/aliases/{alias:str}/moves"): V,
        ("POST", "/v1/models/{team:str}/{name:str}/versions"): M,
        ("DELETE", "/v1/models/{team:str}/{name:str}/versions/{version:int}"): M,
        ("GET", "/v1/models/{team:str}/{name:str}/aliases/{alias:str}"): V,
        ("PUT", "/v1/models/{team:str}/{name:str}/aliases/{alias:str}"): M,
        ("DELETE", "/v1/models/{team:str}/{name:str}/aliases/{alias:str}"): M,
        ("PUT", "/v1/models/{team:str}/{name:str}/grants/{grantee_team:str}"): A,
        ("DELETE", "/v1/models/{team:str}/{name:str}/grants/{grantee_team:str}"): A,
        ("POST", "/v1/datasets/{team:str}/{name:str}/versions"): M,
        ("GET", "/v1/datasets"): V,
        ("GET", "/v1/datasets/{team:str}/{name:str}"): V,
        ("GET", "/v1/datasets/{team:str}/{name:str}/versions/{version:int}"): V,
        ("PUT", "/v1/datasets/{team:str}/{name:str}/grants/{grantee_team:str}"): A,
        ("DELETE", "/v1/datasets/{team:str}/{name:str}/grants/{grantee_team:str}"): A,
        ("GET", "/v1/lineage/models/{team:str}/{name:str}/versions/{version:int}/upstream"): V,
        (
            "GET",
            "/v1/lineage/datasets/{team:str}/{name:str}/versions/{version:int}/downstream",
        ): V,
        ("GET", "/v1/jobs/{job_id:str}/record"): V,
        ("GET", "/v1/jobs/{job_id:str}/reproduction"): V,
        ("GET", "/v1/jobs/{job_id:str}/metrics"): V,
        ("GET", "/v1/jobs/{job_id:str}/metrics/{key:path}"): V,
        ("GET", "/v1/experiments"): V,
        ("GET", "/v1/experiments/{experiment_id:int}"): V,
        ("GET", "/v1/experiments/{experiment_id:int}/compare"): V,
        ("PUT", "/v1/jobs/{job_id:str}/tags/{tag:str}"): M,
        ("DELETE", "/v1/jobs/{job_id:str}/tags/{tag:str}"): M,
        ("GET", "/v1/jobs/{job_id:str}/note"): V,
        ("PUT", "/v1/jobs/{job_id:str}/note"): M,
        ("GET", "/v1/audit"): OP,
    },
    "billing": {
        ("GET", "/v1/usage"): V,
        ("GET", "/v1/costs"): V,
        ("GET", "/v1/waste"): V,
        ("GET", "/v1/jobs/{job_id:str}/cost"): V,
        ("GET", "/v1/audit"): OP,
        ("GET", "/v1/prices"): V,
        ("GET", "/v1/prices/{flavor:str}"): V,
        ("PUT", "/v1/prices/{flavor:str}"): OP,
        ("POST", "/v1/costs/estimate"): V,
        ("GET", "/v1/budgets"): V,
        ("GET", "/v1/budgets/{team:str}"): V,
        ("GET", "/v1/budgets/{team:str}/{project:str}"): V,
        ("PUT", "/v1/budgets/{team:str}"): A,
        ("PUT", "/v1/budgets/{team:str}/{project:str}"): A,
        ("PATCH", "/v1/budgets/{team:str}"): A,
        ("PATCH", "/v1/budgets/{team:str}/{project:str}"): A,
        ("DELETE", "/v1/budgets/{team:str}"): A,
        ("DELETE", "/v1/budgets/{team:str}/{project:str}"): A,
    },
    "runner": {("GET", "/v1/node"): OP},
}
"""The least role each route needs (OPTIONS, which Litestar adds, and the OpenAPI document
under ``/schema`` need a valid token)."""
PUBLIC: dict[str, set[str]] = {
    "submission": {
        "/",
        "/ui",
        "/ui/config.json",
        "/ui/{file_path:path}",
        "/v1/schemas/job.v1.json",  # the job spec's JSON Schema, for editors
    },
}
"""Routes declared ``public_asset()`` (the web dashboard's files and its config, the job
spec's JSON Schema): open to anyone, every method Litestar gives them (``test_public_assets_hold_no_data``)."""


def is_open(service: str, path: str) -> bool:
    return path in OPEN_PATHS or path in PUBLIC.get(service, set())


@dataclass
class World:
    """Every credential of the test, and the apps."""

    tokens: dict[str, str]
    apps: dict[str, Litestar]
    pools: dict[str, asyncpg.Pool]


async def _token(conn: asyncpg.Connection, user_id: int, expires: datetime | None) -> str:
    token, token_hash = new_token()
    await conn.execute(
        "INSERT INTO tokens (token_hash, user_id, expires_at) VALUES ($1, $2, $3)",
        token_hash,
        user_id,
        expires,
    )
    return token


async def _credentials(pool: asyncpg.Pool) -> dict[str, str]:
    """Live tokens per role, and tokens that must never work."""
    tokens = {
        "admin": await identity.bootstrap_user(pool, "ml", "alice"),
        "other-team": await identity.bootstrap_user(pool, "vision", "bob"),
        "operator": await identity.bootstrap_user(pool, "platform", "root", Role.OPERATOR),
    }
    async with pool.acquire() as conn, conn.transaction():
        team = await conn.fetchval("SELECT id FROM teams WHERE name = 'ml'")
        for name in ("viewer", "member", "gone"):
            user = await conn.fetchval(
                "INSERT INTO users (team_id, name, role) VALUES ($1, $2, $3) RETURNING id",
                team,
                name,
                "viewer" if name == "viewer" else "member",
            )
            tokens[name] = await _token(conn, user, None)
            if name == "member":
                tokens["revoked"] = await _token(conn, user, None)
                await conn.execute(
                    "UPDATE tokens SET revoked_at = now() WHERE token_hash = $1",
                    hash_token(tokens["revoked"]),
                )
                tokens["expired"] = await _token(conn, user, datetime.now(UTC) - timedelta(1))
        await conn.execute("UPDATE users SET disabled_at = now() WHERE name = 'gone'")
        tokens["disabled-user"] = tokens.pop("gone")
    return tokens


@pytest.fixture
async def world(database_url: str, tmp_path: Path) -> AsyncIterator[World]:
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
        tokens = await _credentials(pools["submission"])
        health = ServiceRuntime("test", ServiceSettings()).health_handlers()
        # Thousands of refused credentials come from one address here, each of which must
        # be its 401: the bound on them per address (a 429 past it) is failed_auth's, tested
        # in tests/integration/submission/test_failed_auth.py.
        settings = SubmissionSettings(database=DatabaseSettings(), failed_auth_burst=1_000_000)
        deps = AppDeps(pools["submission"], LocalStore(tmp_path / "objects"), health)
        submission = submission_app(settings, deps)
        ask = httpx.AsyncClient(
            transport=httpx.ASGITransport(app=submission), base_url="http://submission"
        )
        guard = service_guard(ADMIN_TOKEN, IdentityClient("http://submission", http=ask))
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
        yield World(tokens=tokens, apps=apps, pools=pools)
        await ask.aclose()
    finally:
        for context in reversed(opened):
            await context.__aexit__(None, None, None)


def concrete(path: str) -> str:
    """``/v1/models/{team:str}/{version:int}`` -> ``/v1/models/x/1``."""
    return _PARAM.sub(lambda m: _SAMPLE.get(m.group(2) or "str", "x"), path)


def routes(app: Litestar) -> Iterator[tuple[str, str]]:
    """(method, path template) of every route of ``app``, the automatic OPTIONS included."""
    for route in app.routes:
        assert isinstance(route, HTTPRoute), f"{route.path}: not HTTP; decide how it is guarded"
        for method in sorted(route.methods):
            yield method, route.path


async def call(
    app: Litestar,
    method: str,
    path: str,
    token: str | None,
    headers: dict[str, str] | None = None,
    content_json: Any = None,
) -> httpx.Response:
    sent = dict(headers or {})
    if token is not None:
        sent["Authorization"] = f"Bearer {token}"
    body = b"{}" if content_json is None else json.dumps(content_json).encode()
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as http:
        return await http.request(
            method, path, headers={"Content-Type": "application/json", **sent}, content=body
        )


async def snapshot(pools: dict[str, asyncpg.Pool]) -> dict[str, str]:
    """A digest of every table of every service's schema."""
    digests: dict[str, str] = {}
    for schema, pool in pools.items():
        async with pool.acquire() as conn:
            tables = await conn.fetch(
                "SELECT table_name FROM information_schema.tables "
                "WHERE table_schema = $1 AND table_type = 'BASE TABLE'",
                schema,
            )
            for row in tables:
                name = f'"{schema}"."{row["table_name"]}"'
                digests[name] = await conn.fetchval(
                    f"SELECT count(*) || ':' || coalesce(md5(string_agg(t::text, '|' "
                    f"ORDER BY t::text)), '') FROM {name} t"
                )
    return digests


async def fresh_token(pool: asyncpg.Pool, user: str) -> str:
    async with pool.acquire() as conn:
        user_id = await conn.fetchval("SELECT id FROM users WHERE name = $1", user)
        return await _token(conn, user_id, None)


def _policy(service: str, method: str, path: str) -> Role | None:
    if method == "OPTIONS" or path.startswith("/schema"):
        return V  # CORS preflight and the OpenAPI document: any valid token
    if path.startswith("/v1/deadletters"):
        return OP  # shared.deadletters, on every service whose app is given its routes
    if method == "HEAD" and (method, path) not in POLICY[service]:
        # The HEAD every GET route answers (http_app.head_routes): the GET's least role.
        method = "GET"
    return POLICY[service].get((method, path))


async def test_every_route_has_a_declared_least_role(world: World) -> None:
    missing = [
        f"{service}: {method} {path}"
        for service, app in world.apps.items()
        for method, path in routes(app)
        if not is_open(service, path) and _policy(service, method, path) is None
    ]
    assert not missing, "declare who may call these in POLICY:\n" + "\n".join(missing)


@pytest.mark.parametrize("service", SERVICES)
async def test_no_valid_token_no_access_and_nothing_changes(service: str, world: World) -> None:
    app = world.apps[service]
    bad = [world.tokens[k] for k in ("revoked", "expired", "disabled-user")]
    refusals: list[tuple[str | None, dict[str, str]]] = [
        (None, {}),
        ("garbage", {}),
        (None, {"Authorization": "Bearer "}),
        (None, {"Authorization": f"Basic {ADMIN_TOKEN.get_secret_value()}"}),
        (None, {"Authorization": ADMIN_TOKEN.get_secret_value()}),
        *((token, {}) for token in bad),
    ]
    before = await snapshot(world.pools)
    guarded = [(m, p) for m, p in routes(app) if not is_open(service, p)]
    assert any(p.startswith("/v1/") for _, p in guarded)
    wrong: list[str] = []
    for method, path in guarded:
        for token, headers in refusals:
            response = await call(app, method, concrete(path), token, headers)
            if response.status_code != 401:
                wrong.append(f"{method} {path} {token} {headers}: {response.status_code}")
            elif method != "HEAD":
                assert response.json()["detail"], response.text
    assert not wrong, "\n".join(wrong)
    assert await snapshot(world.pools) == before


@pytest.mark.parametrize("service", SERVICES)
async def test_each_role_reaches_exactly_the_routes_its_role_allows(
    service: str, world: World
) -> None:
    """Below a route's least role: 403 and nothing changes. At or above: never 401/403 (the
    sample ids are made up, so 404 or 422 are fine: the call was let in)."""
    app = world.apps[service]
    callers = {"viewer": V, "member": M, "alice": A, "root": OP}
    wrong: list[str] = []
    for name, role in callers.items():
        for method, path in routes(app):
            needed = _policy(service, method, path)
            if is_open(service, path) or needed is None:
                continue
            # A fresh token per call: an allowed call may rotate or revoke the one it used.
            token = await fresh_token(world.pools["submission"], name)
            before = await snapshot(world.pools)
            response = await call(app, method, concrete(path), token)
            allowed = role.rank >= needed.rank
            if allowed and response.status_code in (401, 403):
                wrong.append(f"{name} {method} {path}: {response.status_code} {response.text}")
            if not allowed:
                if response.status_code != 403:
                    wrong.append(f"{name} {method} {path}: {response.status_code}, not 403")
                elif await snapshot(world.pools) != before:
                    wrong.append(f"{name} {method} {path}: refused, yet something changed")
    assert not wrong, "\n".join(wrong)


@pytest.mark.parametrize("service", OPERATOR_SERVICES)
async def test_the_operator_token_reaches_every_route(service: str, world: World) -> None:
    app = world.apps[service]
    for method, path in routes(app):
        if is_open(service, path):
            continue
        response = await call(app, method, concrete(path), ADMIN_TOKEN.get_secret_value())
        assert response.status_code not in (401, 403), f"{method} {path}: {response.text}"


ONLY_READS: dict[tuple[str, str, str], object] = {
    ("billing", "POST", "/v1/costs/estimate"): True,
    ("submission", "POST", "/v1/jobs"): "dry_run",
}
"""Routes that are no ``GET`` but store nothing, so that their calls spend the user's reads
(``shared.access.only_reads``; a query parameter's name: only their dry runs, such as
``?dry_run=true``): each is reviewed here, since one that did write would take its user's
write limit away."""


async def test_only_routes_that_store_nothing_count_as_reads(world: World) -> None:
    declared = {
        (service, method, route.path): handlers[0].opt["only_reads"]
        for service, app in world.apps.items()
        for route in app.routes
        if isinstance(route, HTTPRoute)
        for method, handlers in route.route_handler_map.items()
        if handlers[0].opt.get("only_reads") is not None
    }
    assert declared == ONLY_READS


REPLAYS_AS_READ = {
    ("submission", "POST", "/v1/jobs"),
    ("submission", "POST", "/v1/jobs/{job_id:str}/reproduce"),
    ("submission", "POST", "/v1/tokens"),
}
"""Routes whose retries under an ``Idempotency-Key``, answered from what the key made (a
job, a token), spend a read until they turn out to be anything else
(``ratelimit.replays_as_read``): each is reviewed here, since one that stored something
before spending its write would carry new ones past the write limit."""


async def test_only_reviewed_routes_charge_their_replays_as_reads(world: World) -> None:
    declared = {
        (service, method, route.path)
        for service, app in world.apps.items()
        for route in app.routes
        if isinstance(route, HTTPRoute)
        for method, handlers in route.route_handler_map.items()
        if handlers[0].opt.get("trainyard_replays_as_read")
    }
    assert declared == REPLAYS_AS_READ


async def test_public_assets_hold_no_data(world: World) -> None:
    """The dashboard's routes are the only other open ones: its files and the services' URLs,
    the same for anyone; every data route behind them still answers 401 without a token."""
    app = world.apps["submission"]
    assert {p for _, p in routes(app)} >= PUBLIC["submission"]
    page = await call(app, "GET", "/ui/", None)
    assert page.status_code == 200 and "<title>Trainyard</title>" in page.text
    config = await call(app, "GET", "/ui/config.json", None)
    assert config.status_code == 200
    assert set(config.json()) == {"scheduler_url", "registry_url", "billing_url"}
    script = await call(app, "GET", "/ui/app.js", None)
    assert script.status_code == 200 and "javascript" in script.headers["content-type"]
    for outside in ("/ui/%2e%2e/dashboard.py", "/ui/..%2fconfig.py", "/ui/nothing.js"):
        assert (await call(app, "GET", outside, None)).status_code == 404, outside
    assert (await call(app, "GET", "/v1/jobs", None)).status_code == 401


@pytest.mark.parametrize("service", SERVICES)
async def test_the_probes_answer_without_a_token_and_tell_only_the_status(
    service: str, world: World
) -> None:
    app = world.apps[service]
    assert {p for _, p in routes(app)} >= OPEN_PATHS
    for path in sorted(OPEN_PATHS - {"/metrics"}):
        response = await call(app, "GET", path, None)
        assert response.status_code == 200, response.text
        body: dict[str, Any] = response.json()
        assert set(body) <= {"status", "ready", "service", "checks"}, body
    # The Prometheus scrape: text, counts only (tests/e2e/test_operator_surface.py).
    scrape = await call(app, "GET", "/metrics", None)
    assert scrape.status_code == 200 and scrape.headers["content-type"].startswith("text/plain")


@pytest.mark.parametrize("service", OPERATOR_SERVICES)
def test_a_service_without_its_operator_token_refuses_to_start(
    service: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    variable = f"TRAINYARD_{service.upper()}_ADMIN_TOKEN"
    monkeypatch.delenv(variable, raising=False)
    with pytest.raises(SystemExit) as exited:
        settings_or_exit(f"python -m trainyard_platform.services.{service}", SETTINGS[service])
    assert exited.value.code == 2
    assert variable in capsys.readouterr().err
    monkeypatch.setenv(variable, "")
    with pytest.raises(SystemExit):
        settings_or_exit(f"python -m trainyard_platform.services.{service}", SETTINGS[service])
    assert variable in capsys.readouterr().err


def test_an_empty_operator_token_is_refused() -> None:
    with pytest.raises(ValueError, match="must not be empty"):
        service_guard(SecretStr(" "))


async def test_another_teams_token_sees_nothing_and_changes_nothing(world: World) -> None:
    """Team ``vision``'s admin against team ``ml``'s job, users, tokens, models and usage:
    404 everywhere (as if they did not exist), and no table changes."""
    from tests.integration.submission.conftest import SPEC

    ml, vision = world.tokens["admin"], world.tokens["other-team"]
    submission = world.apps["submission"]
    created = await call(submission, "POST", "/v1/jobs", ml, content_json=SPEC)
    assert created.status_code == 201, created.text
    job = created.json()["id"]
    member_token = await call(submission, "GET", "/v1/tokens?user=member", ml)
    token_id = member_token.json()[0]["id"]
    before = await snapshot(world.pools)
    attempts = [
        ("submission", "GET", f"/v1/jobs/{job}"),
        ("submission", "GET", f"/v1/jobs/{job}/logs"),
        ("submission", "POST", f"/v1/jobs/{job}/cancel"),
        ("submission", "POST", f"/v1/jobs/{job}/reproduce"),
        ("submission", "DELETE", f"/v1/tokens/{token_id}"),
        ("submission", "GET", "/v1/tokens?user=member&team=ml"),
        ("submission", "GET", "/v1/admin/users?team=ml"),
        ("submission", "DELETE", "/v1/admin/users/member?team=ml"),
        ("registry", "GET", "/v1/models/ml/digits/versions"),
        ("registry", "GET", "/v1/models/ml/digits/versions/1"),
        ("registry", "DELETE", "/v1/models/ml/digits"),
        ("registry", "PUT", "/v1/models/ml/digits/grants/vision"),
        ("billing", "GET", "/v1/usage?team=ml"),
        ("billing", "GET", "/v1/waste?team=ml"),
    ]
    wrong = []
    for service, method, path in attempts:
        response = await call(world.apps[service], method, path, vision)
        if response.status_code != 404:
            wrong.append(f"{service} {method} {path}: {response.status_code}")
    promote = await call(
        submission,
        "PATCH",
        "/v1/admin/users/member?team=ml",
        vision,
        content_json={"role": "admin"},
    )
    if promote.status_code != 404:
        wrong.append(f"submission PATCH /v1/admin/users/member?team=ml: {promote.status_code}")
    assert not wrong, "\n".join(wrong)
    listed = await call(submission, "GET", "/v1/jobs", vision)
    assert listed.json() == [] or all(j["id"] != job for j in listed.json())
    usage = await call(world.apps["billing"], "GET", "/v1/usage", vision)
    assert usage.status_code == 200 and usage.json()["team"] == "vision", usage.text
    assert await snapshot(world.pools) == before


async def test_members_cancel_their_own_jobs_and_admins_any_of_their_team(world: World) -> None:
    from tests.integration.submission.conftest import SPEC

    app = world.apps["submission"]
    admins = await call(app, "POST", "/v1/jobs", world.tokens["admin"], content_json=SPEC)
    members = await call(app, "POST", "/v1/jobs", world.tokens["member"], content_json=SPEC)
    viewer = await call(app, "POST", "/v1/jobs", world.tokens["viewer"], content_json=SPEC)
    assert viewer.status_code == 403, viewer.text
    refused = await call(
        app, "POST", f"/v1/jobs/{admins.json()['id']}/cancel", world.tokens["member"]
    )
    assert refused.status_code == 403, refused.text
    assert "own jobs" in refused.json()["detail"]
    own = await call(app, "POST", f"/v1/jobs/{members.json()['id']}/cancel", world.tokens["member"])
    assert own.status_code == 202, own.text
    by_admin = await call(
        app, "POST", f"/v1/jobs/{admins.json()['id']}/cancel", world.tokens["admin"]
    )
    assert by_admin.status_code == 202, by_admin.text
    by_operator = await call(
        app, "POST", f"/v1/jobs/{members.json()['id']}/cancel", world.tokens["operator"]
    )
    assert by_operator.status_code == 202, by_operator.text


async def test_rotation_revocation_and_expiry_take_effect_at_once_everywhere(world: World) -> None:
    """A rotated or revoked token is refused by the very next request, by submission and by
    every service that checks tokens with it; the audit log names who did what."""
    submission, registry = world.apps["submission"], world.apps["registry"]
    old = world.tokens["member"]
    assert (await call(registry, "GET", "/v1/models/ml/x/versions", old)).status_code == 404
    rotated = await call(
        submission, "POST", "/v1/tokens/rotate", old, content_json={"expires_in_days": 7}
    )
    assert rotated.status_code == 201, rotated.text
    new = rotated.json()["token"]
    assert rotated.json()["expires_at"] is not None
    for app, path in ((submission, "/v1/me"), (registry, "/v1/models/ml/x/versions")):
        assert (await call(app, "GET", path, old)).status_code == 401
    me = await call(submission, "GET", "/v1/me", new)
    assert me.json()["user"] == "member" and me.json()["role"] == "member"
    revoked = await call(submission, "DELETE", f"/v1/tokens/{me.json()['token_id']}", new)
    assert revoked.status_code == 204, revoked.text
    for app, path in ((submission, "/v1/me"), (registry, "/v1/models/ml/x/versions")):
        assert (await call(app, "GET", path, new)).status_code == 401
    # An admin revokes a team member's token; a disabled user loses every token.
    viewer_id = (await call(submission, "GET", "/v1/me", world.tokens["viewer"])).json()["token_id"]
    assert (
        await call(submission, "DELETE", f"/v1/tokens/{viewer_id}", world.tokens["admin"])
    ).status_code == 204
    assert (await call(submission, "GET", "/v1/me", world.tokens["viewer"])).status_code == 401
    # Expiry: the test's expired token never worked; a token expiring now stops now.
    async with world.pools["submission"].acquire() as conn:
        await conn.execute(
            "UPDATE tokens SET expires_at = now() WHERE token_hash = $1",
            hash_token(world.tokens["other-team"]),
        )
    expired = await call(world.apps["billing"], "GET", "/v1/usage", world.tokens["other-team"])
    assert expired.status_code == 401
    assert (await call(submission, "GET", "/v1/me", world.tokens["other-team"])).status_code == 401
    audit = await call(submission, "GET", "/v1/audit", world.tokens["operator"])
    actions = [(e["actor"], e["action"]) for e in audit.json()]
    assert ("ml/member", "rotate token") in actions
    assert ("ml/alice", "revoke token") in actions
    assert all("ty_" not in str(e) for e in audit.json())  # no token in the log


async def test_every_operator_write_is_audited_and_the_log_is_append_only(world: World) -> None:
    scheduler = world.apps["scheduler"]
    put = await call(
        scheduler,
        "PUT",
        "/v1/admin/priority-classes/urgent",
        world.tokens["operator"],
        content_json={"value": 1000, "preemptible": False},
    )
    assert put.status_code == 201, put.text
    refused = await call(
        scheduler,
        "PUT",
        "/v1/admin/priority-classes/sneaky",
        world.tokens["admin"],
        content_json={"value": 99999, "preemptible": False},
    )
    assert refused.status_code == 403
    by_token = await call(
        scheduler, "DELETE", "/v1/admin/priority-classes/urgent", ADMIN_TOKEN.get_secret_value()
    )
    assert by_token.status_code == 204, by_token.text
    log = (await call(scheduler, "GET", "/v1/audit", world.tokens["operator"])).json()
    assert [(e["actor"], e["action"], e["target"]) for e in reversed(log)] == [
        ("platform/root", "put priority-class", "urgent"),
        ("operator-token", "delete priority-class", "urgent"),
    ]
    assert log[-1]["detail"]["value"] == 1000 and log[-1]["token_id"] is not None
    async with world.pools["scheduler"].acquire() as conn:
        for statement in ("UPDATE audit_log SET actor = 'x'", "DELETE FROM audit_log"):
            with pytest.raises(asyncpg.RaiseError, match="append-only"):
                await conn.execute(statement)


AUDITED = ("submission", "scheduler", "registry", "billing")
"""The services whose app serves ``GET /v1/audit`` (``shared.audit.audit_route``)."""


@pytest.mark.parametrize("service", AUDITED)
async def test_the_audit_ndjson_export_is_refused_below_operators_with_nothing_of_the_log(
    service: str, world: World
) -> None:
    """``Accept: application/x-ndjson`` asks for the whole log as a stream, which only
    operators may read, as its JSON pages: a user below them gets the guard's 403 (JSON, in
    the shared error shape), never a line of the log, whatever the ``Accept``."""
    async with world.pools[service].acquire() as conn:
        await conn.execute(
            "INSERT INTO audit_log (at, actor, role, action, target) "
            "VALUES (now(), 'ops', 'operator', 'put queue', 'not-for-you')"
        )
    app = world.apps[service]
    ndjson = {"Accept": "application/x-ndjson"}
    for name in ("viewer", "member", "admin", "other-team"):
        refused = await call(app, "GET", "/v1/audit", world.tokens[name], ndjson)
        assert refused.status_code == 403, f"{name}: {refused.status_code} {refused.text}"
        assert refused.headers["content-type"].startswith("application/json")
        assert refused.json()["detail"] and "not-for-you" not in refused.text
    exported = await call(app, "GET", "/v1/audit", world.tokens["operator"], ndjson)
    assert exported.status_code == 200, exported.text
    assert exported.headers["content-type"].startswith("application/x-ndjson")
    assert "not-for-you" in [json.loads(line)["target"] for line in exported.text.splitlines()]
