"""The scheduler, registry and billing limit each user's requests themselves, as submission
does (``shared.ratelimit``): past its burst at a service a user gets 429 with
``Retry-After`` in the shared error shape, naming the limit and the service, while another
user, the operator token and the probes go on. The operator token has buckets of its own,
``operator_rate_factor`` (10) times a user's: past them it is 429 too.

Each service is built in-process over its own migrated schema, with its guard made as its
``service.serve`` makes it (``shared.access.guard_for`` of its settings), checking user
tokens with the submission app as in production. Submission keeps its default limits,
so what refuses here is the service's own bucket: before, each service's guard spent only
submission's buckets, which a user's requests to every service share.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from litestar import Litestar
from pydantic import SecretStr

from trainyard_platform.services.billing.api import create_app as billing_app
from trainyard_platform.services.billing.config import Settings as BillingSettings
from trainyard_platform.services.registry.api import create_app as registry_app
from trainyard_platform.services.registry.config import Settings as RegistrySettings
from trainyard_platform.services.scheduler.api import create_app as scheduler_app
from trainyard_platform.services.scheduler.config import Settings as SchedulerSettings
from trainyard_platform.services.submission import identity
from trainyard_platform.services.submission.api import AppDeps
from trainyard_platform.services.submission.api import create_app as submission_app
from trainyard_platform.services.submission.config import Settings as SubmissionSettings
from trainyard_platform.shared.access import guard_for
from trainyard_platform.shared.db import migrate, open_pool
from trainyard_platform.shared.runtime import ServiceRuntime
from trainyard_platform.shared.settings import (
    DatabaseSettings,
    GuardedServiceSettings,
    ServiceSettings,
)
from trainyard_platform.shared.storage import LocalStore

pytestmark = pytest.mark.integration

ADMIN_TOKEN = "the-operator-token"
BURST = 3
TIGHT = {"read_rate_per_s": 0.001, "read_burst": BURST, "write_rate_per_s": 0.001, "write_burst": 1}
"""A service's own limits here: a burst of 3 reads, then one read in 1000 s."""

SERVICES = {
    "scheduler": (SchedulerSettings, scheduler_app, "/v1/admin/flavors"),
    "registry": (RegistrySettings, registry_app, "/v1/models"),
    "billing": (BillingSettings, billing_app, "/v1/prices"),
}
"""Each service: its settings, its app, and a read any user of a team may make."""


@dataclass
class Limited:
    service: str
    client: httpx.AsyncClient
    read: str
    tokens: dict[str, str]

    async def get(self, who: str) -> httpx.Response:
        """The service's read, with ``who``'s token (``operator``: the operator token)."""
        token = ADMIN_TOKEN if who == "operator" else self.tokens[who]
        return await self.client.get(self.read, headers={"Authorization": f"Bearer {token}"})


@pytest.fixture(params=sorted(SERVICES))
async def limited(
    request: pytest.FixtureRequest, database_url: str, tmp_path: Path
) -> AsyncIterator[Limited]:
    from trainyard_platform.services.billing.service import MIGRATIONS as BILLING
    from trainyard_platform.services.registry.service import MIGRATIONS as REGISTRY
    from trainyard_platform.services.scheduler.service import MIGRATIONS as SCHEDULER
    from trainyard_platform.services.submission.service import MIGRATIONS as SUBMISSION

    service: str = request.param
    kind, create_app, read = SERVICES[service]
    own = {"scheduler": SCHEDULER, "registry": REGISTRY, "billing": BILLING}[service]
    async with (
        open_pool(DatabaseSettings(url=database_url), "submission") as identity_pool,
        open_pool(DatabaseSettings(url=database_url), service) as pool,
    ):
        await migrate(identity_pool, "submission", SUBMISSION)
        await migrate(pool, service, own)
        tokens = {
            "alice": await identity.bootstrap_user(identity_pool, "ml", "alice"),
            "bob": await identity.bootstrap_user(identity_pool, "vision", "bob"),
        }
        health = ServiceRuntime(service, ServiceSettings()).health_handlers()
        deps = AppDeps(identity_pool, LocalStore(tmp_path / "objects"), health)
        submission = submission_app(SubmissionSettings(database=DatabaseSettings()), deps)
        ask = httpx.AsyncClient(
            transport=httpx.ASGITransport(app=submission), base_url="http://submission"
        )
        settings: GuardedServiceSettings = kind(
            admin_token=SecretStr(ADMIN_TOKEN), identity_url="http://submission", **TIGHT
        )
        async with guard_for(settings, http=ask) as guard:
            app: Litestar = create_app(pool, guard, health)
            transport = httpx.ASGITransport(app=app)  # type: ignore[arg-type]
            async with httpx.AsyncClient(transport=transport, base_url="http://s") as client:
                yield Limited(service, client, read, tokens)


async def test_past_the_burst_a_user_gets_429_and_another_user_does_not(
    limited: Limited,
) -> None:
    for _ in range(BURST):
        answer = await limited.get("alice")
        assert answer.status_code == 200, answer.text
    refused = await limited.get("alice")
    assert refused.status_code == 429, refused.text
    assert refused.headers["Retry-After"].isdigit() and int(refused.headers["Retry-After"]) >= 1
    body = refused.json()
    assert set(body) == {"detail", "errors"}
    assert body["detail"].startswith(
        f"rate limit exceeded: at most 0.001 read requests to the {limited.service} service "
        f"per second per user (bursts of {BURST}); retry after "
    ), body
    assert [e["field"] for e in body["errors"]] == ["Authorization"]

    for _ in range(BURST):  # another user (of another team) has a bucket of its own
        answer = await limited.get("bob")
        assert answer.status_code == 200, answer.text


async def test_the_operator_token_has_its_own_limit_and_the_probes_none(
    limited: Limited,
) -> None:
    """Before, the operator token was not limited at all: a stolen one, or a runaway
    script, could make requests to a service without bound."""
    for _ in range(BURST + 1):
        await limited.get("alice")
    assert (await limited.get("alice")).status_code == 429
    operator_burst = 10 * BURST  # the default operator_rate_factor times a user's burst
    for _ in range(operator_burst):
        assert (await limited.get("operator")).status_code == 200  # not the user's bucket
        assert (await limited.client.get("/healthz")).status_code == 200
    refused = await limited.get("operator")
    assert refused.status_code == 429, refused.text
    assert refused.headers["Retry-After"].isdigit() and int(refused.headers["Retry-After"]) >= 1
    assert refused.json()["detail"].startswith(
        f"rate limit exceeded: at most 0.01 read requests to the {limited.service} service "
        f"per second with the operator token (bursts of {operator_burst}); retry after "
    ), refused.text
    assert (await limited.client.get("/healthz")).status_code == 200
    assert (await limited.get("bob")).status_code == 200  # users keep their own buckets
