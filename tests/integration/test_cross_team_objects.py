"""Team ``vision``'s tokens against team ``ml``'s objects, on every route of every app: no
answer reveals an object of ``ml`` or whether it exists, and nothing changes.

``test_endpoint_auth`` decides who may call a route by ROLE; this module decides what a
caller of another team gets when it names another team's OBJECT. Real objects of ``ml`` are
made first (a job, a code bundle, a user and a token, models with versions and an alias,
a dataset, an experiment's run reproducing another, with metrics, a tag and a note,
budgets, costs) through the apps
where a user can make them, through the services' own event handlers where only the bus
can. Then every route of every app (read from the apps, so a route added later is walked
too) is called by a member and an admin of ``vision``: once with ``ml``'s object in each
path or query parameter that names one, once with a made-up object of the same shape. The
rule, for each pair of answers:

- the two answers are the same (status, headers, and body once the names are taken out):
  whether ``ml``'s object exists does not show;
- neither is a success, unless the route is in ``SCOPED`` (it answers the caller's own team
  whatever it is asked, and then no name of ``ml``'s objects is in the body);
- no table of any service changes.

A path or query parameter this module does not know fails the walk until it is declared
(``PATH_OBJECTS`` or ``PLATFORM_PATHS``, ``QUERY_OBJECTS`` or ``NOT_OBJECTS``); a route whose parameters name no
object of a team (``/v1/me``, ``POST /v1/jobs``, the platform's queues and prices) is walked
by ``test_endpoint_auth`` alone. ``BODY_CASES`` add writes into ``vision``'s own namespace
whose body names ``ml``'s run. The exceptions are tables with their reasons: ``EXEMPT`` (a
team's existence), ``SCOPED`` (lists of the caller's own team), ``GRANTED`` (what a grant
of ``ml``'s model and dataset opens to ``vision``, tested with the grant in place). A last
test gives ``vision`` twins of ``ml``'s objects, named alike, and checks that no name
reaches ``ml``'s. The apps are ``world``'s, built as
``serve`` builds them, except the registry's, which is built here with an object store (as
``serve`` gives it one) so that versions can be registered and downloaded.
"""

from __future__ import annotations

import hashlib
import re
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import pytest
from litestar import Litestar
from litestar.routes import HTTPRoute

from tests.integration import test_endpoint_auth as endpoint_auth
from tests.integration.billing.conftest import feed
from tests.integration.billing.test_waste import granted, released, submitted
from tests.integration.registry.modelkit import apply, commit_checkpoint
from tests.integration.registry.test_registry import ENV, succeeded
from tests.integration.submission.conftest import SPEC
from trainyard_platform.services.billing import catalogue_repository as catalogue
from trainyard_platform.services.registry.api import create_app as registry_app
from trainyard_platform.services.submission import identity
from trainyard_platform.shared.access import service_guard
from trainyard_platform.shared.events.payloads import (
    CheckpointRef,
    JobMetrics,
    JobSpec,
    JobStarted,
    MetricPoint,
)
from trainyard_platform.shared.identity import IdentityClient
from trainyard_platform.shared.storage import LocalStore

pytestmark = pytest.mark.integration

world = endpoint_auth.world
World = endpoint_auth.World
call, snapshot = endpoint_auth.call, endpoint_auth.snapshot
T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)

CALLERS = ("vision-member", "vision-admin")
"""Who asks: a member and an admin of team ``vision`` (``ml`` owns every object)."""

PATH_OBJECTS: dict[tuple[str, str, str], str] = {
    # (service, path prefix, parameter) -> the kind of ml's object it names
    ("submission", "/v1/jobs/", "job_id"): "submission job",
    ("submission", "/v1/bundles/", "sha256"): "bundle",
    ("submission", "/v1/tokens/", "token_id"): "token",
    ("submission", "/v1/admin/users/", "name"): "user",
    ("submission", "/v1/teams/", "team"): "team",
    ("registry", "/v1/models/", "team"): "team",
    ("registry", "/v1/models/", "name"): "model",
    ("registry", "/v1/models/", "version"): "version",
    ("registry", "/v1/models/", "alias"): "alias",
    ("registry", "/v1/models/", "grantee_team"): "grantee",
    ("registry", "/v1/datasets/", "team"): "team",
    ("registry", "/v1/datasets/", "name"): "dataset",
    ("registry", "/v1/datasets/", "version"): "version",
    ("registry", "/v1/datasets/", "grantee_team"): "grantee",
    ("registry", "/v1/lineage/models/", "team"): "team",
    ("registry", "/v1/lineage/models/", "name"): "model",
    ("registry", "/v1/lineage/models/", "version"): "version",
    ("registry", "/v1/lineage/datasets/", "team"): "team",
    ("registry", "/v1/lineage/datasets/", "name"): "dataset",
    ("registry", "/v1/lineage/datasets/", "version"): "version",
    ("registry", "/v1/jobs/", "job_id"): "registry job",
    ("registry", "/v1/jobs/", "key"): "metric",
    ("registry", "/v1/jobs/", "tag"): "tag",
    ("registry", "/v1/experiments/", "experiment_id"): "experiment",
    ("billing", "/v1/jobs/", "job_id"): "billing job",
    ("billing", "/v1/budgets/", "team"): "team",
    ("billing", "/v1/budgets/", "project"): "project",
}
"""Every path parameter that names an object of a team, by the route it is in."""

QUERY_OBJECTS: dict[str, str] = {
    "team": "team",
    "user": "user",
    "project": "project",
    "job": "billing job",
    "jobs": "registry job",
    "experiment": "experiment name",
    "id_prefix": "job prefix",
}
"""Every query parameter that names an object of a team (each is tried on its own)."""

NOT_OBJECTS: dict[str, str] = {
    **dict.fromkeys(
        ("limit", "after", "before", "since", "until", "format", "sort", "order", "filter"),
        "paging, ordering or output shape",
    ),
    **dict.fromkeys(
        ("keys", "max_points", "from_step", "to_step", "status", "granularity", "start", "end"),
        "a selection within what the other parameters named",
    ),
    **dict.fromkeys(
        ("group_by", "retired", "dry_run", "label", "granted", "all_teams"), "a mode or filter"
    ),
    "queue": "the platform's queues, the same for every team",
    "flavor": "the platform's GPU flavors, the same for every team",
    # the handler's own arguments, never the caller's
    **dict.fromkeys(
        ("request", "principal", "caller", "pool", "settings", "objects", "conditions"),
        "injected",
    ),
    **dict.fromkeys(("teams", "front", "key", "admission", "uploads"), "injected"),
}
"""Query parameters that name no object of a team, and why."""

PLATFORM_PATHS: dict[tuple[str, str, str], str] = {
    ("scheduler", "/v1/admin/", "name"): "a flavor, cohort, queue or priority class",
    ("scheduler", "/v1/queue/", "name"): "a queue (its view is the operators', test_endpoint_auth)",
    ("scheduler", "/v1/admin/", "node_id"): "a node (the operators', test_endpoint_auth)",
    ("billing", "/v1/prices/", "flavor"): "a flavor's price, the same for every team",
}
"""Path parameters that name an object of the platform, no team's, by the route it is in."""

SCOPED: dict[tuple[str, str, str], str] = {
    ("submission", "GET", "/v1/jobs"): (
        "the caller's team's jobs, whatever the filter (another team: 404; every team: 403)"
    ),
    ("submission", "GET", "/v1/tokens"): "the caller's own tokens (an admin: its team's)",
    ("submission", "GET", "/v1/admin/users"): "the caller's team's users",
    ("registry", "GET", "/v1/models"): "the caller's team's models and those granted to it",
    ("registry", "GET", "/v1/experiments"): "the caller's team's experiments",
    ("billing", "GET", "/v1/usage"): "the caller's team's usage",
    ("billing", "GET", "/v1/costs"): "the caller's team's costs",
    ("billing", "GET", "/v1/waste"): "the caller's team's waste",
    ("billing", "GET", "/v1/budgets"): "the caller's team's budgets",
}
"""Routes that may answer 200 to ``vision`` when asked about ``ml``: they answer about the
caller's own team (what they answer must then hold none of ``ml``'s names)."""

EXEMPT: dict[tuple[str, str, str], str] = {
    ("submission", "GET", "/v1/teams/{team:str}"): (
        "whether a team exists: team names are no secret, a grant names its grantee by it"
        " (docs/security.md)"
    ),
}
"""Routes whose answer about ``ml``'s object may differ from a made-up one's, and why."""

GRANTED: dict[tuple[str, str, str], str] = {
    ("registry", "GET", f"/v1/models/{{team:str}}/{{name:str}}{suffix}"): "a granted model"
    for suffix in (
        "",
        "/versions",
        "/versions/{version:int}",
        "/versions/by-alias/{alias:str}",
        "/versions/{version:int}/download",
        "/versions/{version:int}/content",
        "/aliases",
        "/aliases/{alias:str}",
        "/aliases/{alias:str}/moves",
    )
} | {
    (
        "registry",
        "GET",
        "/v1/lineage/models/{team:str}/{name:str}/versions/{version:int}/upstream",
    ): ("a granted model's lineage (ml's jobs and checkpoints hidden)"),
    ("registry", "GET", "/v1/models"): "lists the models granted to the caller's team",
    ("registry", "GET", "/v1/datasets/{team:str}/{name:str}"): "a granted dataset",
    ("registry", "GET", "/v1/datasets/{team:str}/{name:str}/versions/{version:int}"): (
        "a granted dataset"
    ),
    (
        "registry",
        "GET",
        "/v1/lineage/datasets/{team:str}/{name:str}/versions/{version:int}/downstream",
    ): ("a granted dataset's lineage (ml's jobs hidden)"),
}
"""The reads a grant of ``ml``'s model and dataset to ``vision`` opens to ``vision``."""

BODIES: dict[tuple[str, str], Any] = {
    ("PUT", "/v1/models/{team:str}/{name:str}/aliases/{alias:str}"): {"version": 1},
    ("PUT", "/v1/jobs/{job_id:str}/note"): {"note": "mine now"},
    ("PATCH", "/v1/admin/users/{name:str}"): {"role": "viewer"},
    ("PUT", "/v1/budgets/{team:str}"): {"amount": "1"},
    ("PUT", "/v1/budgets/{team:str}/{project:str}"): {"amount": "1"},
    ("PATCH", "/v1/budgets/{team:str}"): {"amount": "1"},
    ("PATCH", "/v1/budgets/{team:str}/{project:str}"): {"amount": "1"},
    ("POST", "/v1/jobs/{job_id:str}/reproduce"): {},
}
"""A body that would be taken, for the writes whose handler reads one (else ``{}``)."""


@dataclass(frozen=True)
class Objects:
    """ml's objects (``real``) and made-up ones of the same shape (``ghost``), by kind."""

    real: dict[str, str]
    ghost: dict[str, str]


def _ghost(value: str) -> str:
    return value[:-4] + ("0000" if not value.endswith("0000") else "1111")


async def _vision_member(world: World) -> str:
    async with world.pools["submission"].acquire() as conn:
        team = await conn.fetchval("SELECT id FROM teams WHERE name = 'vision'")
        user = await conn.fetchval(
            "INSERT INTO users (team_id, name, role) VALUES ($1, 'carol', 'member') RETURNING id",
            team,
        )
        return await endpoint_auth._token(conn, user, None)


def _registry_with_store(world: World, store: LocalStore) -> Litestar:
    ask = httpx.AsyncClient(
        transport=httpx.ASGITransport(app=world.apps["submission"]), base_url="http://submission"
    )
    guard = service_guard(endpoint_auth.ADMIN_TOKEN, IdentityClient("http://submission", http=ask))
    return registry_app(world.pools["registry"], guard, [], store=store)


def _tracked_spec(team: str = "ml") -> JobSpec:
    return JobSpec(
        name="digits",
        team=team,
        user="alice",
        entrypoint="examples.digits_cnn",
        gpus=1,
        gpu_flavor="cpu",
        seed=1,
        max_runtime_seconds=600,
        project=f"{team}-research",
        experiment=f"{team}-sweep",
    )


async def _run(
    pool: asyncpg.Pool, store: LocalStore, team: str, spec: JobSpec | None = None
) -> tuple[str, CheckpointRef]:
    """A run of ``team``'s experiment, as its runner would report it: started, a checkpoint,
    a metric, succeeded."""
    run = f"job-{uuid.uuid4().hex[:8]}"
    allocation = f"alloc-{run}"  # as commit_checkpoint names it
    started = JobStarted(
        job_id=run,
        allocation_id=allocation,
        node_id="node-a",
        attempt=0,
        epoch=1,
        started_at=T0,
        code_version=f"git:{0:040x} src:sha256:{'a' * 64}",
        environment=ENV,
        spec=spec or _tracked_spec(team),
    )
    await apply(pool, store, run, started)
    checkpoint = await commit_checkpoint(pool, store, run, 1)
    point = MetricPoint(key=f"{team}-loss", step=0, time=T0, value=0.5)
    metrics = JobMetrics(
        job_id=run, allocation_id=allocation, node_id="node-a", seq=0, points=[point]
    )
    await apply(pool, store, run, metrics)
    await apply(pool, store, run, succeeded(run, allocation, checkpoint))
    return run, checkpoint


async def _bill(world: World, team: str, spec: JobSpec) -> str:
    """A job of ``spec`` billed for an hour this month, as the scheduler's events say it."""
    job = f"job-{team}-{uuid.uuid4().hex[:8]}"
    day = datetime.now(UTC).replace(minute=0, second=0, microsecond=0) - timedelta(hours=3)
    allocation = f"{job}-1"
    pool = world.pools["billing"]
    await feed(
        pool, submitted(job, spec, day), granted(allocation, job, spec, "n-1", day, f"{team}-q")
    )
    end = day + timedelta(hours=1)
    await feed(pool, released(allocation, job, spec, "n-1", day, end, "succeeded"))
    return job


async def _make_objects(world: World, tmp_path: Path) -> Objects:
    """Every kind of object of team ``ml`` the routes name, made as a user or the bus would."""
    ml = world.tokens["admin"]
    submission, billing = world.apps["submission"], world.apps["billing"]
    tracked = {**SPEC, "project": "ml-research", "experiment": "ml-sweep"}
    job = await call(submission, "POST", "/v1/jobs", ml, content_json=tracked)
    assert job.status_code == 201, job.text
    job_id = job.json()["id"]
    bundle = b"ml's code"
    sha = hashlib.sha256(bundle).hexdigest()
    LocalStore(tmp_path / "objects").put_bytes(f"bundles/ml/{sha}.tar.gz", bundle)
    await identity.bootstrap_user(world.pools["submission"], "audio", "dan")
    tokens = await call(submission, "GET", "/v1/tokens?user=alice", ml)
    token_id = str(tokens.json()[0]["id"])

    # The registry: a run of an experiment reproducing an earlier one, with a checkpoint,
    # metrics, a tag and a note; a version of a model from it with an alias; a dataset
    # version it produced.
    store = LocalStore(tmp_path / "registry-objects")
    world.apps["registry"] = registry = _registry_with_store(world, store)
    pool = world.pools["registry"]
    original, _ = await _run(pool, store, "ml")
    reproducing = _tracked_spec().model_copy(update={"reproduces": original})
    run, _ = await _run(pool, store, "ml", reproducing)  # a reproduction, so it has one
    await _run(pool, store, "vision")  # vision's own experiment, to compare ml's run in
    for method, path, body in (
        ("POST", "/v1/models/ml/digits/versions", {"job_id": run}),
        ("PUT", "/v1/models/ml/digits/aliases/champion", {"version": 1}),
        ("PUT", f"/v1/jobs/{run}/tags/ml-best", None),
        ("PUT", f"/v1/jobs/{run}/note", {"note": "ml's note"}),
        (
            "POST",
            "/v1/datasets/ml/ml-data/versions",
            {"uri": "s3://data/ml", "sha256": "b" * 64, "size_bytes": 1, "producing_job_id": run},
        ),
    ):
        made = await call(registry, method, path, ml, content_json=body)
        assert made.status_code in (200, 201, 204), f"{method} {path}: {made.text}"
    experiments = await call(registry, "GET", "/v1/experiments", ml)
    [experiment] = experiments.json()["experiments"]
    theirs = await call(registry, "GET", "/v1/experiments", world.tokens["other-team"])
    [vision_experiment] = theirs.json()["experiments"]

    # Billing: budgets of the team and a project, and a job's costs (at a price).
    async with world.pools["billing"].acquire() as conn:  # as the scheduler's catalogue says
        await catalogue.apply_flavor(conn, "cpu", "CPU only", 1, False, T0)
    operator = endpoint_auth.ADMIN_TOKEN.get_secret_value()
    price = {"price_per_gpu_hour": "2.00"}
    priced = await call(billing, "PUT", "/v1/prices/cpu", operator, content_json=price)
    assert priced.status_code in (200, 201), priced.text
    for path in ("/v1/budgets/ml", "/v1/budgets/ml/ml-research"):
        made = await call(billing, "PUT", path, ml, content_json={"amount": "100"})
        assert made.status_code in (200, 201), f"{path}: {made.text}"
    costly = await _bill(world, "ml", _tracked_spec())

    real = {
        "submission job": job_id,
        "job prefix": job_id[:8],
        "bundle": sha,
        "token": token_id,
        "user": "alice",
        "team": "ml",
        "grantee": "vision",
        "model": "digits",
        "version": "1",
        "alias": "champion",
        "dataset": "ml-data",
        "registry job": run,
        "metric": "ml-loss",
        "tag": "ml-best",
        "experiment": str(experiment["id"]),
        "experiment name": "ml-sweep",
        "billing job": costly,
        "project": "ml-research",
        "vision experiment": str(vision_experiment["id"]),
    }
    ghost = {
        **{kind: _ghost(value) for kind, value in real.items()},
        "token": "987654321",
        "user": "nobody",
        "team": "audio",  # a team that exists and owns nothing: team names are no secret
        "model": "no-model",
        "version": "99",
        "alias": "no-alias",
        "dataset": "no-data",
        "metric": "no-metric",
        "tag": "no-tag",
        "experiment": "987654321",
        "experiment name": "no-sweep",
        "project": "no-project",
        "vision experiment": str(vision_experiment["id"]),
    }
    return Objects(real, ghost)


def _lookup(
    table: dict[tuple[str, str, str], str], service: str, path: str, parameter: str
) -> str | None:
    for (owner, prefix, name), entry in table.items():
        if owner == service and path.startswith(prefix) and name == parameter:
            return entry
    return None


@dataclass(frozen=True)
class Case:
    service: str
    method: str
    template: str
    path_kinds: dict[str, str]
    query: str | None
    """The one query parameter naming an object in this case (None: only the path's)."""
    body: dict[str, Any] | None = None
    """A body naming objects: each value ``"<kind>"`` is replaced by that kind's object
    (None: the route's ``BODIES`` entry)."""
    own: bool = False
    """The path names an object of the caller's own team (only the rest is ``ml``'s): a
    success is no leak, when it names nothing of ``ml``'s."""

    def url(self, values: dict[str, str]) -> str:
        path = endpoint_auth._PARAM.sub(
            lambda m: (
                values[self.path_kinds[m.group(1)]]
                if m.group(1) in self.path_kinds
                else endpoint_auth._SAMPLE.get(m.group(2) or "str", "x")
            ),
            self.template,
        )
        if self.query is None:
            return path
        return f"{path}?{self.query}={values[QUERY_OBJECTS[self.query]]}"

    def body_for(self, values: dict[str, str]) -> Any:
        if self.body is None:
            return BODIES.get((self.method, self.template))
        return {k: values[v[1:-1]] if v in self._body_kinds() else v for k, v in self.body.items()}

    def _body_kinds(self) -> set[str]:
        return {v for v in (self.body or {}).values() if isinstance(v, str) and v[:1] == "<"}

    def kinds(self) -> set[str]:
        named = set(self.path_kinds.values()) | {v[1:-1] for v in self._body_kinds()}
        return named | {QUERY_OBJECTS[self.query]} if self.query else named

    def __str__(self) -> str:
        query = f" ?{self.query}=" if self.query else ""
        body = f" {self.body}" if self.body else ""
        return f"{self.service} {self.method} {self.template}{query}{body}"


BODY_CASES = [
    Case(
        "registry",
        "POST",
        "/v1/models/vision/stolen/versions",
        {},
        None,
        {"job_id": "<registry job>"},
    ),
    Case(
        "registry",
        "POST",
        "/v1/datasets/vision/stolen/versions",
        {},
        None,
        {
            "uri": "s3://v/d",
            "sha256": "c" * 64,
            "size_bytes": 1,
            "producing_job_id": "<registry job>",
        },
    ),
    Case(
        "registry",
        "GET",
        "/v1/experiments/{experiment_id:int}/compare",
        {"experiment_id": "vision experiment"},
        "jobs",
        own=True,
    ),
]
"""``vision``'s own objects asked with ``ml``'s in the body or query: ``ml``'s checkpoints
registered as ``vision``'s model, ``ml``'s run as a dataset's producer, ``ml``'s run
compared in ``vision``'s experiment."""


def cases(apps: dict[str, Litestar]) -> tuple[list[Case], list[str]]:
    """Every (route, object parameter) to try, and the parameters nobody declared."""
    found, undeclared = [], []
    for service, app in apps.items():
        for route in app.routes:
            assert isinstance(route, HTTPRoute)
            if endpoint_auth.is_open(service, route.path) or route.path.startswith("/schema"):
                continue
            for verb, handlers in sorted(route.route_handler_map.items()):
                # The HEAD Litestar adds is keyed by the enum, whose str() is not the verb.
                method = str(getattr(verb, "value", verb))
                if method == "OPTIONS":
                    continue  # CORS preflight: no handler of the route's runs
                in_path = {m.group(1) for m in endpoint_auth._PARAM.finditer(route.path)}
                kinds = {}
                for parameter in in_path:
                    kind = _lookup(PATH_OBJECTS, service, route.path, parameter)
                    if kind is not None:
                        kinds[parameter] = kind
                    elif _lookup(PLATFORM_PATHS, service, route.path, parameter) is None:
                        undeclared.append(f"{service} {method} {route.path}: {parameter}")
                queries = []
                for parameter in handlers[0].parsed_fn_signature.parameters:
                    if parameter in in_path:
                        continue
                    if parameter in QUERY_OBJECTS:
                        queries.append(parameter)
                    elif parameter not in NOT_OBJECTS:
                        undeclared.append(f"{service} {method} {route.path}: ?{parameter}")
                if kinds:
                    found.append(Case(service, method, route.path, kinds, None))
                found += [Case(service, method, route.path, kinds, q) for q in queries]
    return found, undeclared


def _normal(text: str, values: dict[str, str]) -> str:
    """``text`` with each object's name (longest first) replaced by its kind."""
    for kind, value in sorted(values.items(), key=lambda kv: -len(kv[1])):
        text = re.sub(rf"(?<![\w-]){re.escape(value)}(?![\w-])", f"<{kind}>", text)
    return text


async def _answer(app: Litestar, case: Case, values: dict[str, str], token: str) -> tuple[int, str]:
    """``case`` asked with ``values`` as the objects: the status, the headers but those that
    differ with every answer or with the names' lengths, and the body with each object's
    name replaced by its kind."""
    response = await call(
        app, case.method, case.url(values), token, content_json=case.body_for(values)
    )
    headers = sorted(
        (k, v) for k, v in response.headers.items() if k not in ("date", "content-length")
    )
    names = {k: values[k] for k in case.kinds()}
    return (response.status_code, _normal(f"{response.text}\n{headers}", names)), response


async def _walk(world: World, objects: Objects, granted: dict[tuple[str, str, str], str]) -> None:
    """Every case, by each of ``CALLERS``, with ``ml``'s objects and made-up ones: the rule
    of the module docstring, except that the routes in ``granted`` answer ``ml``'s object
    (200) and name none of ``ml``'s jobs."""
    tokens = {
        "vision-member": await _vision_member(world),
        "vision-admin": world.tokens["other-team"],
    }
    walk, undeclared = cases(world.apps)
    assert not undeclared, "declare what these parameters name:\n" + "\n".join(undeclared)
    walk += BODY_CASES
    # Names to look for in an answer: numbers (ids, versions) are compared with made-up
    # ones above, but a bare number is in too many answers to be looked for.
    names = [v for k, v in objects.real.items() if not v.isdigit() and k not in ("grantee", "team")]
    jobs = [objects.real[k] for k in ("submission job", "registry job", "billing job")]
    before = await snapshot(world.pools)
    wrong: list[str] = []
    for case in walk:
        # HEAD answers as its GET (http_app.head_routes): the GET's entry in each table
        method = "GET" if case.method == "HEAD" else case.method
        key = (case.service, method, case.template)
        app = world.apps[case.service]
        for caller in CALLERS:
            where = f"{case} as {caller}"
            (status, text), response = await _answer(app, case, objects.real, tokens[caller])
            ghost, _ = await _answer(app, case, objects.ghost, tokens[caller])
            raw = response.text
            if key in EXEMPT:
                continue
            if key in granted:
                # A JSON answer names none of ml's jobs (the model's bytes are the model's).
                json_answer = "json" in response.headers.get("content-type", "")
                if status != 200 or (json_answer and any(job in raw for job in jobs)):
                    wrong.append(f"{where}, granted: {status} {raw[:300]}")
            elif (status, text) != ghost:
                wrong.append(
                    f"{where}: {status} {text[:300]} | made-up: {ghost[0]} {ghost[1][:300]}"
                )
            elif 200 <= status < 300 and key not in SCOPED and not case.own:
                wrong.append(f"{where}: {status} {text[:300]}")
            # The names asked for are taken out of ``text``: an answer may repeat what it
            # was asked (a row of ml's object itself would differ from the made-up one's).
            elif any(re.search(rf"(?<![\w-]){re.escape(n)}(?![\w-])", text) for n in names):
                wrong.append(f"{where}: names ml's objects: {raw[:300]}")
        if case.method != "GET" and await snapshot(world.pools) != before:
            wrong.append(f"{case}: something changed")
            before = await snapshot(world.pools)
    assert not wrong, "\n".join(wrong)


async def test_another_teams_objects_neither_show_nor_change(world: World, tmp_path: Path) -> None:
    objects = await _make_objects(world, tmp_path)
    await _walk(world, objects, granted={})


async def test_the_objects_are_real_to_their_own_team(world: World, tmp_path: Path) -> None:
    """The walk's objects exist: ``ml``'s admin reads each (so a 404 to ``vision`` above is
    no typo of the test's)."""
    objects = await _make_objects(world, tmp_path)
    walk, _ = cases(world.apps)
    missing = []
    for case in walk:
        if case.method == "GET":
            own = await call(
                world.apps[case.service], "GET", case.url(objects.real), world.tokens["admin"]
            )
            if own.status_code != 200:
                missing.append(f"{case}: {own.status_code} {own.text[:200]}")
    assert not missing, "\n".join(missing)
    assert len(walk) * len(CALLERS) >= 150  # the matrix's size, for the record: routes x callers


async def test_a_grant_opens_its_reads_to_the_grantee_and_nothing_else(
    world: World, tmp_path: Path
) -> None:
    """``ml`` grants ``vision`` its model and its dataset: ``vision`` reads them (the
    ``GRANTED`` routes, where the job that made them stays hidden), and every other answer
    is as without the grant: ``ml``'s runs, metrics, aliases' writes, grants and deletes."""
    objects = await _make_objects(world, tmp_path)
    registry, ml = world.apps["registry"], world.tokens["admin"]
    for path in ("/v1/models/ml/digits/grants/vision", "/v1/datasets/ml/ml-data/grants/vision"):
        made = await call(registry, "PUT", path, ml)
        assert made.status_code == 200, f"{path}: {made.text}"
    await _walk(world, objects, granted=GRANTED)


async def test_the_same_names_in_another_team_are_other_objects(
    world: World, tmp_path: Path
) -> None:
    """``vision`` owns twins of ``ml``'s objects, named alike (a user ``alice``, a job and
    a run of project ``ml-research`` and experiment ``ml-sweep``, a model ``digits``, a
    dataset ``ml-data``, a budget of project ``ml-research``, a billed job): every GET route
    asked by ``vision``'s ``alice`` about those names answers ``vision``'s twins, never one
    of ``ml``'s jobs or runs."""
    objects = await _make_objects(world, tmp_path)
    submission, registry, billing = (world.apps[s] for s in ("submission", "registry", "billing"))
    async with world.pools["submission"].acquire() as conn:
        team = await conn.fetchval("SELECT id FROM teams WHERE name = 'vision'")
        alice = await conn.fetchval(
            "INSERT INTO users (team_id, name, role) VALUES ($1, 'alice', 'admin') RETURNING id",
            team,
        )
        token = await endpoint_auth._token(conn, alice, None)
    tracked = {**SPEC, "project": "ml-research", "experiment": "ml-sweep"}
    job = await call(submission, "POST", "/v1/jobs", token, content_json=tracked)
    assert job.status_code == 201, job.text
    store = LocalStore(tmp_path / "registry-objects")
    twin = _tracked_spec("vision").model_copy(
        update={"project": "ml-research", "experiment": "ml-sweep"}
    )
    run, _ = await _run(world.pools["registry"], store, "vision", twin)
    for method, path, body in (
        ("POST", "/v1/models/vision/digits/versions", {"job_id": run}),
        ("PUT", "/v1/models/vision/digits/aliases/champion", {"version": 1}),
        ("PUT", f"/v1/jobs/{run}/tags/ml-best", None),
        (
            "POST",
            "/v1/datasets/vision/ml-data/versions",
            {"uri": "s3://data/v", "sha256": "d" * 64, "size_bytes": 1, "producing_job_id": run},
        ),
    ):
        made = await call(registry, method, path, token, content_json=body)
        assert made.status_code in (200, 201, 204), f"{method} {path}: {made.text}"
    made = await call(
        billing, "PUT", "/v1/budgets/vision/ml-research", token, content_json={"amount": "9"}
    )
    assert made.status_code in (200, 201), made.text
    billed = await _bill(world, "vision", twin)
    experiments = (await call(registry, "GET", "/v1/experiments", token)).json()["experiments"]
    [experiment] = [e for e in experiments if e["name"] == "ml-sweep"]
    mine = {
        **objects.real,
        "team": "vision",
        "submission job": job.json()["id"],
        "job prefix": job.json()["id"][:8],
        "registry job": run,
        "billing job": billed,
        "experiment": str(experiment["id"]),
        "vision experiment": str(experiment["id"]),
    }
    theirs = [objects.real[k] for k in ("submission job", "registry job", "billing job")]
    walk, _ = cases(world.apps)
    wrong = []
    for case in walk:
        if case.method == "GET":
            answer = await call(world.apps[case.service], "GET", case.url(mine), token)
            if any(name in answer.text for name in theirs):
                wrong.append(f"{case}: {answer.status_code} {answer.text[:300]}")
    assert not wrong, "\n".join(wrong)
