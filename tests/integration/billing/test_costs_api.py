"""``GET /v1/costs`` and ``GET /v1/jobs/{job_id}/cost`` over a real ledger: grouped, filtered,
bucketed exactly, team-scoped, strict about their parameters, and in CSV.

User tokens are checked by the real guard and identity client; only the submission
service's answer to ``GET /v1/me`` is stood in for (an httpx transport)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import asyncpg
import httpx
import pytest
from pydantic import SecretStr

from tests.integration.billing.conftest import feed, grant_of, release_event
from trainyard_platform.services.billing.api import create_app
from trainyard_platform.shared.access import service_guard
from trainyard_platform.shared.events.payloads import AllocationReleased
from trainyard_platform.shared.identity import IdentityClient

pytestmark = pytest.mark.integration

OPERATOR = {"Authorization": "Bearer s3cret"}
ML = {"Authorization": "Bearer ml-viewer"}
VISION = {"Authorization": "Bearer vision-admin"}
USERS = {
    "ml-viewer": {"user": "ada", "team": "ml", "role": "viewer", "token_id": 1},
    "vision-admin": {"user": "cy", "team": "vision", "role": "admin", "token_id": 2},
}
DEC_1 = datetime(2026, 12, 1, tzinfo=UTC)


def _me(request: httpx.Request) -> httpx.Response:
    token = request.headers.get("authorization", "").removeprefix("Bearer ")
    if token in USERS:
        return httpx.Response(200, json=USERS[token])
    return httpx.Response(401, json={"detail": "unknown token"})


def released(
    allocation_id: str,
    job_id: str,
    team: str,
    user: str,
    flavor: str,
    gpus: int,
    start: datetime,
    length: timedelta,
    outcome: str = "succeeded",
) -> AllocationReleased:
    return AllocationReleased(
        allocation_id=allocation_id,
        job_id=job_id,
        node_id="node-1",
        team=team,
        user=user,
        gpu_flavor=flavor,
        gpus=gpus,
        granted_at=start,
        released_at=start + length,
        outcome=outcome,  # type: ignore[arg-type]
    )


@pytest.fixture
async def client(pool: asyncpg.Pool) -> AsyncIterator[httpx.AsyncClient]:
    """Billing's app over a ledger of three teams' jobs (prices: a100 2.5, cpu 0.1)."""
    bills = [
        # ml/ada: 2 a100 from 23:30 Nov 30 to 00:30 Dec 1 (straddles an hour, a day, a month)
        (released("m1", "ml-1", "ml", "ada", "a100", 2, DEC_1 - timedelta(minutes=30),
                  timedelta(hours=1)), "vision-models", "ml-q"),
        # ml/bob: 4 cpu, 10:00 to 13:00 Dec 2
        (released("m2", "ml-2", "ml", "bob", "cpu", 4, DEC_1 + timedelta(days=1, hours=10),
                  timedelta(hours=3)), "tabular", "ml-q"),
        # vision/cy: 1 a100, 02:00 to 04:00 Dec 1
        (released("v1", "vis-1", "vision", "cy", "a100", 1, DEC_1 + timedelta(hours=2),
                  timedelta(hours=2)), "default", None),
    ]  # fmt: skip
    for release, project, queue in bills:
        await feed(pool, grant_of(release, project=project, queue=queue), release_event(release))
    # ml-2's second attempt: lost at once, then it reported success after all (amended)
    lost = released(
        "m3", "ml-2", "ml", "bob", "cpu", 4, DEC_1 + timedelta(days=2), timedelta(0), "lost"
    )
    await feed(pool, grant_of(lost, project="tabular", attempt=2, epoch=9), release_event(lost))
    done = lost.model_copy(
        update={"outcome": "succeeded", "released_at": lost.granted_at + timedelta(hours=1)}
    )
    await feed(pool, release_event(done))
    identity = IdentityClient(
        "http://submission",
        http=httpx.AsyncClient(transport=httpx.MockTransport(_me), base_url="http://submission"),
    )
    app = create_app(pool, service_guard(SecretStr("s3cret"), identity), [])
    transport = httpx.ASGITransport(app=app)  # type: ignore[arg-type]
    async with httpx.AsyncClient(transport=transport, base_url="http://billing") as c:
        yield c
    await identity.aclose()


async def costs(
    client: httpx.AsyncClient, headers: dict[str, str], **params: Any
) -> dict[str, Any]:
    response = await client.get("/v1/costs", params=params, headers=headers)
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


def table(body: dict[str, Any], *keys: str) -> list[tuple[Any, ...]]:
    return [(*(r[k] for k in keys), Decimal(r["cost"])) for r in body["rows"]]


async def test_costs_grouped_by_team_and_flavor_over_a_range(client: httpx.AsyncClient) -> None:
    body = await costs(
        client,
        OPERATOR,
        group_by="team,flavor",
        **{"from": "2026-11-01T00:00:00Z", "to": "2027-01-01T00:00:00Z"},
    )
    assert table(body, "team", "flavor") == [
        ("ml", "a100", Decimal("5")),  # 2 GPU-h x 2.5
        ("vision", "a100", Decimal("5")),  # 2 GPU-h x 2.5
        ("ml", "cpu", Decimal("1.6")),  # 12 + 4 GPU-h x 0.1 (the amended attempt)
    ]
    assert [(t["currency"], Decimal(t["cost"])) for t in body["totals"]] == [
        ("USD", Decimal("11.6"))
    ]
    assert body["start"] == "2026-11-01T00:00:00Z" and body["group_by"] == ["team", "flavor"]
    assert not body["truncated"]


async def test_an_entry_straddling_boundaries_is_split_exactly_at_them(
    client: httpx.AsyncClient,
) -> None:
    window = {"from": "2026-11-30T23:00:00Z", "to": "2026-12-01T01:00:00Z", "job": "ml-1"}
    hours = await costs(client, OPERATOR, granularity="hour", **window)
    assert [
        (r["bucket"], Decimal(r["gpu_seconds"]), Decimal(r["cost"])) for r in hours["rows"]
    ] == [
        ("2026-11-30T23:00:00Z", Decimal(3600), Decimal("2.5")),
        ("2026-12-01T00:00:00Z", Decimal(3600), Decimal("2.5")),
    ]
    months = await costs(
        client,
        OPERATOR,
        granularity="month",
        team="ml",
        flavor="a100",
        **{"from": "2026-11-01T00:00:00Z", "to": "2027-01-01T00:00:00Z"},
    )
    assert table(months, "bucket") == [
        ("2026-11-01T00:00:00Z", Decimal("2.5")),
        ("2026-12-01T00:00:00Z", Decimal("2.5")),
    ]
    # A range starting mid-month, read from hour and day rollups, cuts at its own start.
    december = await costs(client, OPERATOR, group_by="team", **{"from": "2026-12-01T00:00:00Z"})
    assert december["end"] == "2027-01-01T00:00:00Z"
    assert table(december, "team") == [("vision", Decimal("5")), ("ml", Decimal("4.1"))]


async def test_the_ledger_and_the_rollups_give_the_same_report(client: httpx.AsyncClient) -> None:
    window = {"from": "2026-11-30T20:00:00Z", "to": "2026-12-04T00:00:00Z", "granularity": "day"}
    by_team = await costs(client, OPERATOR, group_by="team", **window)
    by_job = await costs(client, OPERATOR, group_by="team,job", **window)  # from the ledger
    summed: dict[tuple[str, str], Decimal] = {}
    for row in by_job["rows"]:
        key = (row["bucket"], row["team"])
        summed[key] = summed.get(key, Decimal(0)) + Decimal(row["cost"])
    assert summed == {(r["bucket"], r["team"]): Decimal(r["cost"]) for r in by_team["rows"]}
    assert by_job["totals"] == by_team["totals"]


async def test_users_see_only_their_own_team(client: httpx.AsyncClient) -> None:
    december = {"from": "2026-12-01T00:00:00Z"}
    mine = await costs(client, ML, group_by="team,user,project,queue", **december)
    assert {r["team"] for r in mine["rows"]} == {"ml"}
    assert table(mine, "user", "project", "queue") == [
        ("ada", "vision-models", "ml-q", Decimal("2.5")),  # its other half is in November
        ("bob", "tabular", "ml-q", Decimal("1.2")),
        ("bob", "tabular", None, Decimal("0.4")),  # its grant named no queue
    ]
    for other in ({"team": "vision"}, {"team": "nobody"}):
        response = await client.get("/v1/costs", params=other, headers=ML)
        assert response.status_code == 404, response.text
    everyone = await costs(client, OPERATOR, group_by="team", **december)
    assert {r["team"] for r in everyone["rows"]} == {"ml", "vision"}
    vision = await costs(
        client, VISION, job="ml-1", **december
    )  # another team's job: nothing of it
    assert vision["rows"] == [] and vision["totals"] == []


@pytest.mark.parametrize(
    ("params", "field", "message"),
    [
        ({"colour": "red"}, "colour", "unknown query parameter"),
        ({"team": ["ml", "nlp"]}, "team", "given more than once"),
        ({"group_by": "team,colour"}, "group_by", "unknown dimension 'colour'"),
        ({"granularity": "week"}, "granularity", ""),
        ({"from": "yesterday"}, "from", "not an ISO 8601 date and time"),
        ({"from": "2026-12-01T10:30:00Z"}, "from", "must be a whole UTC hour"),
        ({"from": "2026-12-02T00:00:00Z", "to": "2026-12-01T00:00:00Z"}, "to", "after from"),
        ({"limit": "0"}, "limit", ""),
        ({"format": "xml"}, "format", ""),
    ],
)
async def test_bad_parameters_are_refused_naming_the_field(
    client: httpx.AsyncClient, params: dict[str, Any], field: str, message: str
) -> None:
    response = await client.get("/v1/costs", params=params, headers=OPERATOR)
    assert response.status_code == 422, response.text
    errors = response.json()["errors"]
    assert any(e["field"] == field and message in e["message"] for e in errors), errors


async def test_csv_by_accept_header_or_format(client: httpx.AsyncClient) -> None:
    params = {"group_by": "team", "from": "2026-12-01T00:00:00Z"}
    for headers, extra in (({**OPERATOR, "Accept": "text/csv"}, {}), (OPERATOR, {"format": "csv"})):
        response = await client.get("/v1/costs", params={**params, **extra}, headers=headers)
        assert response.status_code == 200, response.text
        assert response.headers["content-type"].startswith("text/csv")
        assert response.text.splitlines() == [
            "team,currency,gpu_seconds,cost,gpu_cost,cpu_seconds,cpu_cost,"
            "unpriced_cpu_seconds,memory_gib_seconds,memory_cost,unpriced_memory_gib_seconds",
            "vision,USD,7200.000000,5.000000,5.000000" + ",0.000000" * 6,
            "ml,USD,61200.000000,4.100000,4.100000" + ",0.000000" * 6,
        ]


async def test_a_csv_says_whether_it_left_rows_out(client: httpx.AsyncClient) -> None:
    """A CSV has no totals and no ``truncated``: its answer says in a header whether rows
    past ``limit`` were left out, so an export cut short is never taken for the whole."""
    params = {"group_by": "team", "from": "2026-12-01T00:00:00Z", "format": "csv"}
    cut = await client.get("/v1/costs", params={**params, "limit": "1"}, headers=OPERATOR)
    assert cut.status_code == 200, cut.text
    assert len(cut.text.splitlines()) == 2  # the header and one row of two
    assert cut.headers["trainyard-truncated"] == "true"
    whole = await client.get("/v1/costs", params=params, headers=OPERATOR)
    assert whole.headers["trainyard-truncated"] == "false"
    document = (await client.get("/schema/openapi.json", headers=OPERATOR)).json()
    ok = document["paths"]["/v1/costs"]["get"]["responses"]["200"]
    assert "Trainyard-Truncated" in ok["headers"]


async def test_a_jobs_cost_per_allocation(client: httpx.AsyncClient) -> None:
    response = await client.get("/v1/jobs/ml-2/cost", headers=ML)
    assert response.status_code == 200, response.text
    body = response.json()
    assert (body["team"], body["project"], body["user"]) == ("ml", "tabular", "bob")
    assert [
        (a["allocation_id"], a["attempt"], a["outcome"], Decimal(a["cost"]), a["entries"])
        for a in body["allocations"]
    ] == [
        ("m2", 1, "succeeded", Decimal("1.2"), 1),
        ("m3", 2, "succeeded", Decimal("0.4"), 3),  # charge, reversal, new charge
    ]
    assert [Decimal(t["cost"]) for t in body["totals"]] == [Decimal("1.6")]
    for path, headers in (("/v1/jobs/ml-2/cost", VISION), ("/v1/jobs/none/cost", OPERATOR)):
        missing = await client.get(path, headers=headers)
        assert missing.status_code == 404
        # A running job's lead asks too early: the answer says when a bill is made.
        assert missing.json()["detail"].endswith(
            "yet: an allocation is billed when it ends, so a job on its first attempt has none"
        )


async def test_the_openapi_document_names_every_parameter(client: httpx.AsyncClient) -> None:
    document = (await client.get("/schema/openapi.json", headers=OPERATOR)).json()
    operation = document["paths"]["/v1/costs"]["get"]
    names = {p["name"] for p in operation["parameters"]}
    assert names == {
        "group_by",
        "granularity",
        "from",
        "to",
        "team",
        "project",
        "user",
        "queue",
        "flavor",
        "job",
        "format",
        "limit",
    }
    assert "CostReport" in str(operation["responses"]["200"])
    assert set(operation["responses"]) >= {"200", "404", "422"}


async def test_the_job_cost_and_the_older_usage_refuse_unknown_parameters(
    client: httpx.AsyncClient,
) -> None:
    for path, params, field, message in (
        ("/v1/jobs/ml-2/cost", {"attempt": "1"}, "attempt", "unknown query parameter"),
        ("/v1/usage", {"tema": "ml"}, "tema", "unknown query parameter (after, limit, team)"),
        ("/v1/usage", {"team": ["ml", "ml"]}, "team", "given more than once"),
    ):
        response = await client.get(path, params=params, headers=OPERATOR)
        assert response.status_code == 422, response.text
        errors = response.json()["errors"]
        assert any(e["field"] == field and message in e["message"] for e in errors), errors
    usage = await client.get("/v1/usage", params={"team": "ml"}, headers=ML)
    assert usage.status_code == 200 and usage.json()["team"] == "ml"
