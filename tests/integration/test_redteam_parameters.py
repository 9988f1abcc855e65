"""Red team, second pass: parameters and credentials no earlier test named, against the
apps as ``serve`` builds them (``test_endpoint_auth.world``: real PostgreSQL, user tokens
checked with the submission app) and the dead-letter routes over a real JetStream.

Each case was a 500 (a traceback in the service's log) before its fix: an integer beyond 64
bits in a path or query parameter reached NATS (dead letters, every service); a cost range
beyond the calendar reached date arithmetic (billing); a bearer token with a byte beyond
ASCII reached the header sent to the identity service (every operator service). Two
``Authorization`` headers were answered as the first one's caller.
"""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from pydantic import SecretStr

from tests.integration import test_endpoint_auth as endpoint_auth
from trainyard_platform.shared.access import service_guard
from trainyard_platform.shared.bus import Bus
from trainyard_platform.shared.deadletters import deadletter_routes
from trainyard_platform.shared.http_app import service_app
from trainyard_platform.shared.settings import GuardedServiceSettings

pytestmark = pytest.mark.integration

world = endpoint_auth.world
World = endpoint_auth.World
OPERATOR = endpoint_auth.ADMIN_TOKEN.get_secret_value()
BEYOND_64_BITS = ("99999999999999999999999", str(2**63), str(-(2**63) - 1), "0" * 30 + "1" * 20)


async def _send(app: Any, method: str, url: str, headers: list[tuple[bytes, bytes]]) -> Any:
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as http:
        return await http.request(method, url, headers=headers)


def _bearer(token: str | bytes) -> list[tuple[bytes, bytes]]:
    raw = token if isinstance(token, bytes) else token.encode()
    return [(b"authorization", b"Bearer " + raw)]


async def test_dead_letter_sequences_beyond_64_bits_are_refused_with_422(bus: Bus) -> None:
    app = service_app("test", deadletter_routes(bus, "redteam"), service_guard(SecretStr(OPERATOR)))
    for number in BEYOND_64_BITS:
        for method, url in (
            ("GET", f"/v1/deadletters?after={number}"),
            ("GET", f"/v1/deadletters/{number}"),
            ("DELETE", f"/v1/deadletters/{number}"),
            ("POST", f"/v1/deadletters/{number}/redrive"),
        ):
            answer = await _send(app, method, url, _bearer(OPERATOR))
            assert answer.status_code in (404, 422), (method, url, answer.text)
            if answer.status_code == 422:
                [error] = answer.json()["errors"]
                assert error["message"] == "number too large (at most 64-bit integers)"
    # The largest sequence there can be is an ordinary "no such dead letter".
    found = await _send(app, "GET", f"/v1/deadletters/{2**63 - 1}", _bearer(OPERATOR))
    assert found.status_code == 404, found.text
    page = await _send(app, "GET", f"/v1/deadletters?after={2**63 - 1}", _bearer(OPERATOR))
    assert page.status_code == 200 and page.json()["dead_letters"] == []


async def test_integer_query_parameters_beyond_64_bits_are_422_on_every_service(
    world: World,
) -> None:
    """Whatever bound a route declares (or forgot), an integer query parameter beyond 64 bits
    is a 422 naming it, before the handler: registry, billing, submission, scheduler."""
    for service, url in (
        ("submission", "/v1/jobs?limit={n}"),
        ("registry", "/v1/models?limit={n}"),
        ("registry", "/v1/experiments/1?limit={n}"),
        ("billing", "/v1/costs?limit={n}"),
        ("scheduler", "/v1/audit?before={n}"),
    ):
        for number in BEYOND_64_BITS:
            answer = await _send(
                world.apps[service],
                "GET",
                url.format(n=number),
                _bearer(world.tokens["operator"]),
            )
            assert answer.status_code == 422, (service, url, number, answer.text)


@pytest.mark.parametrize("report", ["costs", "waste"])
@pytest.mark.parametrize(
    "bounds",
    [
        {"from": "9999-12-31T23:00:00Z"},
        {"from": "9999-12-31T23:59:59Z"},
        {"from": "0001-01-01T00:00:00Z"},
        {"to": "9999-12-31T23:00:00Z"},
        {"from": "9999-12-31T23:00:00+14:00"},
    ],
)
async def test_report_ranges_beyond_the_calendar_are_422(
    world: World, report: str, bounds: dict[str, str]
) -> None:
    query = "&".join(f"{k}={v.replace('+', '%2B')}" for k, v in bounds.items())
    answer = await _send(
        world.apps["billing"], "GET", f"/v1/{report}?{query}", _bearer(world.tokens["admin"])
    )
    assert answer.status_code == 422, answer.text
    assert {e["field"] for e in answer.json()["errors"]} <= {"from", "to"}


MALFORMED_TOKENS: list[bytes] = [
    b"ty_\xc3\xa9t\xc3\xa9",  # UTF-8 beyond ASCII
    b"ty_abc\xff",  # not even UTF-8
    b"ty_" + b"a" * 5000,  # far longer than any token
    b"ty_a b",  # a space inside
    b"ty_a,Bearer ty_b",  # two credentials in one
]


@pytest.mark.parametrize("service", endpoint_auth.SERVICES)
async def test_malformed_bearer_tokens_are_401_on_every_service(world: World, service: str) -> None:
    before = await endpoint_auth.snapshot(world.pools)
    path = "/v1/me" if service == "submission" else "/v1/audit"
    if service == "runner":
        path = "/v1/node"
    for token in MALFORMED_TOKENS:
        answer = await _send(world.apps[service], "GET", path, _bearer(token))
        assert answer.status_code == 401, (service, token[:20], answer.text)
        assert answer.json()["detail"].startswith("missing, invalid")
    assert await endpoint_auth.snapshot(world.pools) == before


@pytest.mark.parametrize("service", endpoint_auth.OPERATOR_SERVICES)
async def test_two_authorization_headers_are_401_whichever_comes_first(
    world: World, service: str
) -> None:
    """A proxy in front may read the other header than the service: a request that carries
    two is nobody's, even when both are valid (operator and a viewer of another team)."""
    path = "/v1/node" if service == "runner" else "/v1/audit"
    operator = _bearer(OPERATOR)
    viewer = _bearer(world.tokens["viewer"])
    for headers in (operator + viewer, viewer + operator, operator + operator):
        answer = await _send(world.apps[service], "GET", path, headers)
        assert answer.status_code == 401, (service, answer.text)
    alone = await _send(world.apps[service], "GET", path, operator)
    assert alone.status_code == 200, alone.text


@pytest.mark.parametrize(
    ("method", "path"), [("GET", "/v1/me"), ("GET", "/v1/jobs"), ("POST", "/v1/jobs")]
)
async def test_two_authorization_headers_are_401_on_the_submission_service(
    world: World, method: str, path: str
) -> None:
    """The submission service used the first of two ``Authorization`` headers (alice's
    then bob's of another team: alice), where a proxy in front may have read bob's. As on
    the other services, a request that carries two is nobody's; nothing is stored."""
    before = await endpoint_auth.snapshot(world.pools)
    admin = _bearer(world.tokens["admin"])
    other = _bearer(world.tokens["other-team"])
    for headers in (admin + other, other + admin, admin + admin):
        answer = await _send(world.apps["submission"], method, path, headers)
        assert answer.status_code == 401, (method, path, answer.text)
    assert await endpoint_auth.snapshot(world.pools) == before
    alone = await _send(world.apps["submission"], "GET", "/v1/me", admin)
    assert alone.status_code == 200, alone.text


@pytest.mark.parametrize("service", endpoint_auth.SERVICES)
async def test_options_on_every_route_with_any_parameters_is_no_500(
    world: World, service: str
) -> None:
    """Litestar's own ``OPTIONS`` handlers cannot be weakly referenced, and the parameter
    screen looked them up in weak tables: ``OPTIONS /v1/jobs?limit=<beyond 64 bits>`` was a
    500 on every service (and any query or path parameter, briefly)."""
    app = world.apps[service]
    failed = []
    for method, path in endpoint_auth.routes(app):
        if method != "OPTIONS":
            continue
        for query in ("", "?x=1", f"?limit={BEYOND_64_BITS[0]}", "?a=1&a=2"):
            url = endpoint_auth.concrete(path) + query
            answer = await _send(app, "OPTIONS", url, _bearer(world.tokens["operator"]))
            if answer.status_code >= 500:
                failed.append(f"OPTIONS {url}: {answer.status_code}")
    assert not failed, "\n".join(failed)


@pytest.mark.parametrize(
    "path", ["/v1/jobs", "/v1/jobs/00000000-0000-4000-8000-000000000001/reproduce"]
)
async def test_two_idempotency_keys_are_422_and_nothing_is_stored(world: World, path: str) -> None:
    """Litestar read two ``Idempotency-Key`` headers as one key, "k1, k2": a retry that
    sent k1 alone was a second job."""
    before = await endpoint_auth.snapshot(world.pools)
    headers = [
        *_bearer(world.tokens["admin"]),
        (b"content-type", b"application/json"),
        (b"idempotency-key", b"k1"),
        (b"idempotency-key", b"k2"),
    ]
    answer = await _send(world.apps["submission"], "POST", path, headers)
    assert answer.status_code == 422, answer.text
    assert answer.json()["errors"] == [
        {"field": "Idempotency-Key", "message": "given more than once"}
    ]
    assert await endpoint_auth.snapshot(world.pools) == before


def test_an_operator_token_no_request_could_present_is_refused_at_start() -> None:
    for bad in ("with space", "tab\there", "é" * 10, "a" * 1025, "x,y"):
        with pytest.raises(ValueError, match="bearer token"):
            GuardedServiceSettings(admin_token=SecretStr(bad))
    assert GuardedServiceSettings(admin_token=SecretStr("aryo_vsfhu-D6iU+/==")).admin_token


async def test_dashboard_paths_the_file_system_refuses_are_404_not_500(world: World) -> None:
    """The dashboard's files are open to anyone; a path the file system cannot even look up
    (a name over its limit, a file taken for a folder) was a 500 with a traceback."""
    for path in ("/ui/index.html/x", "/ui/" + "a" * 5000, "/ui/" + "a/" * 3000):
        answer = await _send(world.apps["submission"], "GET", path, [])
        assert answer.status_code == 404, (path[:40], answer.status_code, answer.text[:200])
        assert answer.json()["detail"] == "no such file under /ui/"
    assert (await _send(world.apps["submission"], "GET", "/ui/index.html", [])).status_code == 200


async def test_a_team_admin_cannot_see_or_revoke_an_operators_tokens(world: World) -> None:
    """Only operators disable operators or change their role, but team ``ml``'s admin could
    list and revoke every token of an operator user of team ``ml`` (``GET /v1/tokens?user=``,
    ``DELETE /v1/tokens/{id}``): 200 and 204, and the operator was locked out. Now 403 naming
    the rule, and nothing changes; an operator still manages them."""
    submission = world.apps["submission"]
    created = await endpoint_auth.call(
        submission,
        "POST",
        "/v1/admin/users",
        world.tokens["operator"],
        content_json={"team": "ml", "name": "op2", "role": "operator"},
    )
    assert created.status_code == 201, created.text
    op2 = created.json()["token"]
    token_id = (await endpoint_auth.call(submission, "GET", "/v1/me", op2)).json()["token_id"]
    before = await endpoint_auth.snapshot(world.pools)
    admin = world.tokens["admin"]
    for method, path in (
        ("GET", "/v1/tokens?user=op2"),
        ("GET", "/v1/tokens?user=op2&team=ml"),
        ("DELETE", f"/v1/tokens/{token_id}"),
    ):
        answer = await endpoint_auth.call(submission, method, path, admin)
        assert answer.status_code == 403, (method, path, answer.text)
        assert answer.json()["detail"] == "only operators manage operators' tokens"
    assert await endpoint_auth.snapshot(world.pools) == before
    assert (await endpoint_auth.call(submission, "GET", "/v1/me", op2)).status_code == 200
    listed = await endpoint_auth.call(
        submission, "GET", "/v1/tokens?user=op2&team=ml", world.tokens["operator"]
    )
    assert listed.status_code == 200 and [t["id"] for t in listed.json()] == [token_id]
    revoked = await endpoint_auth.call(
        submission, "DELETE", f"/v1/tokens/{token_id}", world.tokens["operator"]
    )
    assert revoked.status_code == 204, revoked.text
    assert (await endpoint_auth.call(submission, "GET", "/v1/me", op2)).status_code == 401


@pytest.mark.parametrize("name", ["..", ".", ".hidden"])
async def test_a_job_that_asks_for_a_model_is_named_as_a_model_can_be(
    world: World, name: str
) -> None:
    """``register_model: true`` registers the job's final checkpoint as a version of the
    model named like the job; the registry refuses a model name starting with ``.`` (an
    object-key segment ``..`` among them), so such a job (``"name": ".."``) was accepted,
    ran, succeeded, and nothing was registered (a warning in the registry's log only). Now
    a 422 naming ``name`` at submission, nothing stored; without ``register_model`` the
    name is still a job's name."""
    from tests.integration.submission.conftest import SPEC

    submission = world.apps["submission"]
    before = await endpoint_auth.snapshot(world.pools)
    spec = {**SPEC, "name": name, "register_model": True}
    answer = await endpoint_auth.call(
        submission, "POST", "/v1/jobs", world.tokens["admin"], content_json=spec
    )
    assert answer.status_code == 422, answer.text
    assert [e["field"] for e in answer.json()["errors"]] == ["name"], answer.text
    assert "register_model" in answer.json()["errors"][0]["message"]
    assert await endpoint_auth.snapshot(world.pools) == before
    plain = {**SPEC, "name": name}
    kept = await endpoint_auth.call(
        submission, "POST", "/v1/jobs", world.tokens["admin"], content_json=plain
    )
    assert kept.status_code == 201, kept.text


@pytest.mark.parametrize(
    "effective_from", ["0001-01-01T00:00:00+14:00", "9999-12-31T23:59:59-14:00"]
)
async def test_a_price_date_beyond_the_calendar_in_utc_is_422(
    world: World, effective_from: str
) -> None:
    """``PUT /v1/prices/{flavor}`` took any date with an offset and turned it into UTC, where
    these fall before year 1 or after 9999: a 500 (``OverflowError``) with a traceback in
    the log. Now 422 naming ``effective_from``, and no price is stored."""
    async with world.pools["billing"].acquire() as conn:
        await conn.execute(
            "INSERT INTO flavors (name, revision, changed_at) VALUES ('a100', 1, now())"
        )
    before = await endpoint_auth.snapshot(world.pools)
    answer = await endpoint_auth.call(
        world.apps["billing"],
        "PUT",
        "/v1/prices/a100",
        world.tokens["operator"],
        content_json={"price_per_gpu_hour": "2.5", "effective_from": effective_from},
    )
    assert answer.status_code == 422, answer.text
    assert [e["field"] for e in answer.json()["errors"]] == ["effective_from"], answer.text
    assert await endpoint_auth.snapshot(world.pools) == before


@pytest.mark.parametrize("team", ["..", ".", ".hidden"])
async def test_a_new_team_is_named_so_it_can_be_a_folder(world: World, team: str) -> None:
    """A team's name is a segment of its object keys (``bundles/<team>/...``, the
    registry's ``registry/<team>/...``). An operator could create team ``..``
    (``POST /v1/admin/users``: 201), whose every bundle upload and look-up was then a 500
    (the store refuses a ``..`` key), and whose models and datasets the registry refuses by
    name. Now 422 naming ``team``, and nothing is stored; the bootstrap command refuses
    such a team too."""
    before = await endpoint_auth.snapshot(world.pools)
    answer = await endpoint_auth.call(
        world.apps["submission"],
        "POST",
        "/v1/admin/users",
        world.tokens["operator"],
        content_json={"team": team, "name": "dot", "role": "admin"},
    )
    assert answer.status_code == 422, answer.text
    [error] = answer.json()["errors"]
    assert error["field"] == "team" and "'.'" in error["message"], answer.text
    assert await endpoint_auth.snapshot(world.pools) == before
    from trainyard_platform.services.submission.__main__ import _parser

    with pytest.raises(SystemExit):
        _parser().parse_args(["bootstrap-admin", "--team", team, "--user", "dot"])
    parsed = _parser().parse_args(["bootstrap-admin", "--team", "a-b_c", "--user", ".dot"])
    assert (parsed.team, parsed.user) == ("a-b_c", ".dot")


@pytest.mark.parametrize("written", ["\u0665", "\uff15", " 5", "5 ", "1_000", "5\u00a0"])
async def test_an_amount_is_written_with_ascii_digits(world: World, written: str) -> None:
    """Billing read a money string as Python's ``Decimal`` does: Arabic-Indic U+0665 and
    full-width U+FF15 as 5, ``1_000`` as 1000, spaces around ignored; a budget or a price
    that reads as another number than it shows was stored (200/201). Now 422 naming the
    field, nothing stored; ``"5"``, ``"1e3"`` and JSON numbers are as before."""
    async with world.pools["billing"].acquire() as conn:
        await conn.execute(
            "INSERT INTO flavors (name, revision, changed_at) VALUES ('a100', 1, now())"
        )
    billing = world.apps["billing"]
    before = await endpoint_auth.snapshot(world.pools)
    for path, token, field in (
        ("/v1/budgets/ml", world.tokens["admin"], "amount"),
        ("/v1/prices/a100", world.tokens["operator"], "price_per_gpu_hour"),
    ):
        answer = await endpoint_auth.call(
            billing, "PUT", path, token, content_json={field: written}
        )
        assert answer.status_code == 422, (path, answer.text)
        assert [e["field"] for e in answer.json()["errors"]] == [field], answer.text
        assert "ASCII" in answer.json()["errors"][0]["message"], answer.text
    assert await endpoint_auth.snapshot(world.pools) == before
    for amount in ("5", "1e3", 5, 2.75):
        answer = await endpoint_auth.call(
            billing, "PUT", "/v1/budgets/ml", world.tokens["admin"], content_json={"amount": amount}
        )
        assert answer.status_code in (200, 201), answer.text


@pytest.mark.parametrize("team", ["ml.research", "a..b", "end."])
async def test_a_new_team_is_named_so_it_can_be_a_subject_token(world: World, team: str) -> None:
    """A team's name is the routing key of its budget events, one token of the NATS subject
    (``trainyard.budget.updated.v1.<team>``), and submission reads them with the filter
    ``trainyard.budget.updated.v1.*``. Team ``ml.research`` (created with 201) had its
    budgets said on ``...v1.ml.research``, which that filter never matches: submission's
    replica never learnt them, and admission could not apply a spent budget's policy;
    ``a..b`` is not a valid NATS subject at all. Now 422 naming ``team``; nothing is stored; the
    bootstrap command refuses it too."""
    before = await endpoint_auth.snapshot(world.pools)
    answer = await endpoint_auth.call(
        world.apps["submission"],
        "POST",
        "/v1/admin/users",
        world.tokens["operator"],
        content_json={"team": team, "name": "dot", "role": "admin"},
    )
    assert answer.status_code == 422, answer.text
    [error] = answer.json()["errors"]
    assert error["field"] == "team" and "'.'" in error["message"], answer.text
    assert await endpoint_auth.snapshot(world.pools) == before
    from trainyard_platform.services.submission.__main__ import _parser

    with pytest.raises(SystemExit):
        _parser().parse_args(["bootstrap-admin", "--team", team, "--user", "dot"])


async def test_a_team_made_before_the_name_rule_still_gets_users(world: World) -> None:
    """The '.' rule is for teams a request makes: ``POST /v1/admin/users`` for a team that
    exists already (made before the rule, e.g. ``legacy.team``) refused it with 422, so such
    a team could get no new user at all. It is created as asked; a new dotted team is still
    refused (above)."""
    await world.pools["submission"].execute("INSERT INTO teams (name) VALUES ('legacy.team')")
    answer = await endpoint_auth.call(
        world.apps["submission"],
        "POST",
        "/v1/admin/users",
        world.tokens["operator"],
        content_json={"team": "legacy.team", "name": "newcomer", "role": "member"},
    )
    assert answer.status_code == 201, answer.text
    assert answer.json()["team"] == "legacy.team"
