"""Every endpoint of every service is authenticated: the routes are read from each app itself,
so an endpoint added later is covered without anyone listing it here.

Each service's Litestar app is built in-process (as its ``service.serve`` builds it), then every
route and method is called with no token, a garbage token and a malformed header, and for the
operator services with a team user's token: all must answer 401. Only the probes in
``OPEN_PATHS`` answer without a token. A service started without its operator token refuses to
start, naming the variable.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Iterator
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

from services.billing.api import create_app as billing_app
from services.billing.config import Settings as BillingSettings
from services.registry.api import create_app as registry_app
from services.registry.config import Settings as RegistrySettings
from services.runner.agent import NodeAgent
from services.runner.app import create_app as runner_app
from services.runner.config import Settings as RunnerSettings
from services.scheduler.api import create_app as scheduler_app
from services.scheduler.config import Settings as SchedulerSettings
from services.submission import commands
from services.submission.api import AppDeps
from services.submission.api import create_app as submission_app
from services.submission.config import Settings as SubmissionSettings
from services.submission.service import MIGRATIONS, NAME
from shared.db import migrate, open_pool
from shared.operator_auth import OPEN_PATHS, admin_guard
from shared.runtime import ServiceRuntime, settings_or_exit
from shared.settings import DatabaseSettings, ServiceSettings
from shared.storage import LocalStore

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


@pytest.fixture
async def pool(database_url: str) -> AsyncIterator[asyncpg.Pool]:
    """One migrated pool (submission's schema): it authenticates user tokens; the operator
    services never reach it without the operator token."""
    async with open_pool(DatabaseSettings(url=database_url), NAME) as p:
        await migrate(p, NAME, MIGRATIONS)
        yield p


@pytest.fixture
async def user_token(pool: asyncpg.Pool) -> str:
    """A team user's real token (a team admin of ``ml``)."""
    return await commands.bootstrap_admin(pool, "ml", "alice")


def build_app(service: str, pool: asyncpg.Pool, tmp_path: Path) -> Litestar:
    runtime = ServiceRuntime(service, ServiceSettings())
    health = runtime.health_handlers()
    if service == "scheduler":
        return scheduler_app(pool, ADMIN_TOKEN, health)
    if service == "registry":
        return registry_app(pool, ADMIN_TOKEN, health)
    if service == "billing":
        return billing_app(pool, ADMIN_TOKEN, health)
    if service == "runner":
        # The guard runs before the handler, so the agent is never asked anything.
        agent = SimpleNamespace(settings=SimpleNamespace(admin_token=ADMIN_TOKEN))
        return runner_app(runtime, cast(NodeAgent, agent))
    settings = SubmissionSettings(database=DatabaseSettings())
    return submission_app(settings, AppDeps(pool, LocalStore(tmp_path / "objects"), health))


def concrete(path: str) -> str:
    """``/v1/models/{team:str}/{version:int}`` -> ``/v1/models/x/1``."""
    return _PARAM.sub(lambda m: _SAMPLE.get(m.group(2) or "str", "x"), path)


def endpoints(app: Litestar) -> Iterator[tuple[str, str]]:
    """(method, concrete path) of every route of ``app``, the automatic OPTIONS included."""
    for route in app.routes:
        assert isinstance(route, HTTPRoute), f"{route.path}: not HTTP; decide how it is guarded"
        for method in sorted(route.methods):
            yield method, concrete(route.path)


async def call(app: Litestar, method: str, path: str, headers: dict[str, str]) -> httpx.Response:
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as http:
        return await http.request(method, path, headers=headers, content=b"{}")


@pytest.mark.parametrize("service", SERVICES)
async def test_every_route_refuses_a_request_without_a_valid_token(
    service: str, pool: asyncpg.Pool, user_token: str, tmp_path: Path
) -> None:
    app = build_app(service, pool, tmp_path)
    refusals: list[dict[str, str]] = [
        {},
        {"Authorization": "Bearer garbage"},
        {"Authorization": "Bearer "},
        {"Authorization": f"Basic {ADMIN_TOKEN.get_secret_value()}"},
        {"Authorization": ADMIN_TOKEN.get_secret_value()},
    ]
    if service in OPERATOR_SERVICES:
        refusals.append({"Authorization": f"Bearer {user_token}"})  # a team user's token
    found = list(endpoints(app))
    guarded = [(m, p) for m, p in found if p not in OPEN_PATHS]
    assert any(p.startswith("/v1/") for _, p in guarded), found  # the enumeration works
    wrong: list[str] = []
    for method, path in guarded:
        for headers in refusals:
            response = await call(app, method, path, headers)
            if response.status_code != 401:
                wrong.append(f"{method} {path} {headers}: {response.status_code}")
    assert not wrong, "\n".join(wrong)


@pytest.mark.parametrize("service", SERVICES)
async def test_the_probes_answer_without_a_token_and_tell_only_the_status(
    service: str, pool: asyncpg.Pool, tmp_path: Path
) -> None:
    app = build_app(service, pool, tmp_path)
    assert {p for _, p in endpoints(app)} >= OPEN_PATHS
    for path in sorted(OPEN_PATHS):
        response = await call(app, "GET", path, {})
        assert response.status_code == 200, response.text
        body: dict[str, Any] = response.json()
        assert set(body) <= {"status", "ready", "service", "checks"}, body


@pytest.mark.parametrize("service", OPERATOR_SERVICES)
def test_a_service_without_its_operator_token_refuses_to_start(
    service: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    variable = f"TRAINYARD_{service.upper()}_ADMIN_TOKEN"
    monkeypatch.delenv(variable, raising=False)
    with pytest.raises(SystemExit) as exited:
        settings_or_exit(f"python -m services.{service}", SETTINGS[service])
    assert exited.value.code == 2
    assert variable in capsys.readouterr().err
    monkeypatch.setenv(variable, "")
    with pytest.raises(SystemExit):
        settings_or_exit(f"python -m services.{service}", SETTINGS[service])
    assert variable in capsys.readouterr().err


def test_an_empty_operator_token_is_refused() -> None:
    with pytest.raises(ValueError, match="must not be empty"):
        admin_guard(SecretStr(" "))
