"""Experiment tracking against real PostgreSQL and NATS: metric points arrive through the bus,
NaN and infinities survive the round trip, redelivery stores nothing twice, downsampling in
SQL matches the rule, experiments, sorting and filtering, tags and notes, team isolation."""

from __future__ import annotations

import asyncio
import logging
import math
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
import httpx
import pytest

from tests.fixtures.json_log import json_lines
from tests.fixtures.refusals import refused_before_entering
from tests.integration.registry.test_registry import ENV, client_of, envelopes, grant_of
from trainyard_platform.services.registry import metrics, tracking_api
from trainyard_platform.services.registry.api import create_app
from trainyard_platform.services.registry.domain import RunNotRecorded
from trainyard_platform.services.registry.handlers import RegistryHandlers
from trainyard_platform.services.registry.metric_ingest import MAX_METRIC_KEYS
from trainyard_platform.services.registry.tracking_repository import MAX_RUN_TAGS
from trainyard_platform.shared.access import remember
from trainyard_platform.shared.bus import Bus, Delivery, Reject
from trainyard_platform.shared.events import Envelope, Payload
from trainyard_platform.shared.events.payloads import (
    JobCancelled,
    JobMetrics,
    JobSpec,
    JobStarted,
    JobSucceeded,
    MetricPoint,
)
from trainyard_platform.shared.events.trust import SCHEDULER, owner, routing_key_of
from trainyard_platform.shared.identity import Principal, Role
from trainyard_platform.shared.inbox import idempotent_batches

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("registry")]

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
NAN, INF = float("nan"), float("inf")


def spec(team: str = "vision", experiment: str | None = "sweep", **hyper: Any) -> JobSpec:
    return JobSpec(
        name="digits",
        team=team,
        user="alice",
        entrypoint="examples.digits_cnn",
        gpus=1,
        gpu_flavor="cpu",
        hyperparameters=hyper or {"lr": 0.1, "epochs": 2},
        seed=1,
        max_runtime_seconds=600,
        project="vision-research",
        experiment=experiment,
    )


def started(job_id: str, job_spec: JobSpec) -> JobStarted:
    return JobStarted(
        job_id=job_id,
        allocation_id=f"a-{job_id}",
        node_id="node-a",
        attempt=0,
        epoch=1,
        started_at=T0,
        code_version=f"git:{0:040x} src:sha256:{'a' * 64}",
        environment=ENV,
        spec=job_spec,
    )


def batch(job_id: str, seq: int, key: str, values: list[float], first_step: int = 0) -> JobMetrics:
    return JobMetrics(
        job_id=job_id,
        allocation_id=f"a-{job_id}",
        node_id="node-a",
        seq=seq,
        points=[
            MetricPoint(
                key=key, step=first_step + i, time=T0 + timedelta(seconds=first_step + i), value=v
            )
            for i, v in enumerate(values)
        ],
    )


def app_as(pool: asyncpg.Pool, principal: Principal) -> httpx.AsyncClient:
    """The registry's app with a guard that lets ``principal`` in (``service_guard`` with
    user tokens is the endpoint auth matrix's to test)."""

    async def guard(connection: Any, _: Any) -> None:
        remember(connection, principal)

    return client_of(create_app(pool, guard, []))


VISION = Principal(user="alice", team="vision", role=Role.MEMBER, token_id=1)
ML = Principal(user="bob", team="ml", role=Role.ADMIN, token_id=2)


@pytest.fixture
async def vision(pool: asyncpg.Pool) -> AsyncIterator[httpx.AsyncClient]:
    async with app_as(pool, VISION) as client:
        yield client


async def wait_points(pool: asyncpg.Pool, job_id: str, count: int) -> None:
    """Until the job's summaries count ``count`` points (and not more)."""
    for _ in range(200):
        got = await pool.fetchval(
            "SELECT coalesce(sum(count), 0) FROM metric_series WHERE job_id = $1", job_id
        )
        if got >= count:
            assert got == count
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"job {job_id}: fewer than {count} points arrived")


async def publish(bus: Bus, payload: Payload, _: str | None = None) -> None:
    """As its producer says it: on the routing key it carries (a node's for metrics), a
    ``job.started`` after the grant it answers."""
    for envelope in envelopes(payload):
        await bus.publish(envelope)


def applying(pool: asyncpg.Pool) -> Callable[[Sequence[Delivery]], Awaitable[None]]:
    """The registry's batch handler, each ``job.started`` given after the grant it answers
    (in the same batch, as the stream has them)."""
    apply = idempotent_batches(pool, "registry", RegistryHandlers().dispatch_batch)

    async def handle(deliveries: Sequence[Delivery]) -> None:
        granted = []
        for delivery in deliveries:
            if isinstance(delivery.envelope.data, JobStarted):
                granted.append(wrapped(grant_of(delivery.envelope.data)))
            granted.append(delivery)
        await apply(granted)

    return handle


def wrapped(payload: Payload) -> Delivery:
    return Delivery(Envelope.wrap(payload, source=owner(payload), subject=routing_key_of(payload)))


def job() -> str:
    return f"job-{uuid.uuid4().hex[:10]}"


async def test_points_arrive_with_nan_and_infinities(
    bus: Bus, pool: asyncpg.Pool, vision: httpx.AsyncClient
) -> None:
    j = job()
    await publish(bus, started(j, spec()), j)
    await publish(bus, batch(j, 0, "loss", [2.0, NAN, 1.0, -INF]), j)
    await publish(bus, batch(j, 1, "accuracy", [0.1, INF, 0.5], first_step=1), j)
    await publish(bus, batch(j, 2, "loss", [0.5, NAN], first_step=4), j)
    await wait_points(pool, j, 9)

    summary = (await vision.get(f"/v1/jobs/{j}/metrics")).json()
    by_key = {m["key"]: m for m in summary["metrics"]}
    loss = by_key["loss"]
    assert (loss["goal"], loss["count"], loss["first_step"], loss["last_step"]) == ("min", 6, 0, 5)
    assert (loss["last"], loss["min"], loss["max"], loss["best"], loss["best_step"]) == (
        "NaN",
        "-Infinity",
        2.0,
        "-Infinity",
        3,
    )
    acc = by_key["accuracy"]
    assert (acc["goal"], acc["best"], acc["last"]) == ("max", "Infinity", 0.5)

    curve = (await vision.get(f"/v1/jobs/{j}/metrics/loss")).json()
    assert curve["total"] == 6 and curve["downsampled"] is False
    assert [p["value"] for p in curve["points"]] == [2.0, "NaN", 1.0, "-Infinity", 0.5, "NaN"]
    part = (await vision.get(f"/v1/jobs/{j}/metrics/loss?from_step=1&to_step=3")).json()
    assert [p["step"] for p in part["points"]] == [1, 2, 3] and part["total"] == 3


async def test_keys_with_slashes(bus: Bus, pool: asyncpg.Pool, vision: httpx.AsyncClient) -> None:
    j = job()
    await publish(bus, started(j, spec()), j)
    await publish(bus, batch(j, 0, "train/loss", [1.0, 0.5]), j)
    await wait_points(pool, j, 2)
    curve = (await vision.get(f"/v1/jobs/{j}/metrics/train/loss")).json()
    assert curve["key"] == "train/loss" and len(curve["points"]) == 2


async def test_redelivery_stores_nothing_twice(pool: asyncpg.Pool) -> None:
    j = job()
    apply = applying(pool)
    start = wrapped(started(j, spec()))
    points = [wrapped(batch(j, s, "loss", [1.0, 2.0])) for s in range(3)]
    await apply([start, *points])
    await apply(points[1:])  # a redelivery, partly of the same events
    await apply([points[2], points[0]])
    assert (
        await pool.fetchval(
            "SELECT count(*) FROM metric_points p JOIN metric_series s ON s.id = p.series_id "
            "WHERE s.job_id = $1",
            j,
        )
        == 6
    )
    assert await pool.fetchval("SELECT count FROM metric_series WHERE job_id = $1", j) == 6


async def test_downsampling_in_sql_matches_the_rule_and_keeps_extremes(
    pool: asyncpg.Pool, vision: httpx.AsyncClient
) -> None:
    j = job()
    apply = applying(pool)
    values = [math.sin(i / 300) for i in range(20_000)]
    values[7_777] = 40.0
    values[15_001] = -40.0
    values[19_000] = NAN
    values[3_000:3_500] = [0.25] * 500  # ties
    deliveries = [wrapped(started(j, spec()))]
    # Batches out of step order, and step 100 reported twice (a restart from a checkpoint).
    chunks = list(range(0, len(values), 2000))[::-1]
    for seq, first in enumerate(chunks):
        deliveries.append(wrapped(batch(j, seq, "loss", values[first : first + 2000], first)))
    again = batch(j, len(chunks), "loss", [-99.0], first_step=100)
    deliveries.append(wrapped(again))
    await apply(deliveries[:4])
    await apply(deliveries[4:])  # blocks are merged across transactions too
    points = [metrics.Point(i, T0 + timedelta(seconds=i), v) for i, v in enumerate(values)]
    points.append(metrics.Point(100, T0 + timedelta(seconds=100), -99.0))
    for max_points, lo, hi in [
        (400, None, None),  # buckets of 200 steps: from the points
        (100, None, None),  # buckets of whole blocks
        (40, None, None),
        (100, 1_001, 18_999),  # blocks, and the points of the two blocks cut through
        (12, 130, 900),
        (4, 0, 19_999),
    ]:
        query = f"max_points={max_points}"
        query += f"&from_step={lo}&to_step={hi}" if lo is not None else ""
        curve = (await vision.get(f"/v1/jobs/{j}/metrics/loss?{query}")).json()
        inside = [p for p in points if (lo or 0) <= p.step <= (hi if hi is not None else 10**9)]
        assert curve["total"] == len(inside) and curve["downsampled"] is True, query
        got = [(p["step"], p["value"]) for p in curve["points"]]
        expected = metrics.downsample(inside, max_points)
        assert got == [(p.step, metrics.json_float(p.value)) for p in expected], query
        assert len(got) <= max_points + max_points // 4, query
    whole = [
        (p["step"], p["value"])
        for p in (await vision.get(f"/v1/jobs/{j}/metrics/loss?max_points=400")).json()["points"]
    ]
    assert {(7_777, 40.0), (15_001, -40.0), (19_000, "NaN"), (100, -99.0)} <= set(whole)


async def test_bad_parameters_name_the_field(
    bus: Bus, pool: asyncpg.Pool, vision: httpx.AsyncClient
) -> None:
    j = job()
    await publish(bus, started(j, spec()), j)
    await publish(bus, batch(j, 0, "loss", [1.0]), j)
    await wait_points(pool, j, 1)
    experiment_id = (await vision.get("/v1/experiments")).json()["experiments"][0]["id"]
    for path, field in [
        (f"/v1/jobs/{j}/metrics/loss?max_points=1", "max_points"),
        (f"/v1/jobs/{j}/metrics/loss?max_points=many", "max_points"),
        (f"/v1/jobs/{j}/metrics/loss?from_step=-1", "from_step"),
        (f"/v1/jobs/{j}/metrics/loss?from_step=5&to_step=2", "to_step"),
        (f"/v1/experiments/{experiment_id}?sort=worst:loss", "sort"),
        (f"/v1/experiments/{experiment_id}?order=up", "order"),
        (f"/v1/experiments/{experiment_id}?filter=best:loss~1", "filter"),
        (f"/v1/experiments/{experiment_id}/compare?keys=,", "keys"),
    ]:
        response = await vision.get(path)
        assert response.status_code == 422, (path, response.text)
        fields = [e["field"] for e in response.json()["errors"]]
        assert any(field in f for f in fields), (path, response.json())
    response = await vision.put(f"/v1/jobs/{j}/tags/-bad", json=None)
    assert response.status_code == 422 and response.json()["errors"][0]["field"] == "tag"


async def test_experiments_runs_sorting_filtering_and_compare(
    bus: Bus, pool: asyncpg.Pool, vision: httpx.AsyncClient
) -> None:
    experiment = f"sweep-{uuid.uuid4().hex[:6]}"
    jobs = [job() for _ in range(3)]
    finals = [0.3, 0.1, 0.2]
    for i, j in enumerate(jobs):
        await publish(bus, started(j, spec(experiment=experiment, lr=0.1 * (i + 1), epochs=2)), j)
        await publish(bus, batch(j, 0, "loss", [1.0, finals[i] / 2, finals[i]]), j)
        await publish(bus, batch(j, 1, "accuracy", [0.5 + i / 10]), j)
    await publish(
        bus,
        JobSucceeded(
            job_id=jobs[0],
            allocation_id=f"a-{jobs[0]}",
            node_id="node-a",
            epoch=1,
            finished_at=T0 + timedelta(minutes=10),
            metrics={},
        ),
        jobs[0],
    )
    await bus.publish(
        Envelope.wrap(JobCancelled(job_id=jobs[1], reason="x"), source=SCHEDULER, subject=jobs[1])
    )
    for j in jobs:
        await wait_points(pool, j, 4)

    listed = (await vision.get("/v1/experiments?project=vision-research")).json()["experiments"]
    mine = next(e for e in listed if e["name"] == experiment)
    assert (mine["team"], mine["project"], mine["runs"]) == ("vision", "vision-research", 3)
    eid = mine["id"]

    for _ in range(100):
        runs = (await vision.get(f"/v1/experiments/{eid}?sort=final:loss")).json()["runs"]
        if {r["status"] for r in runs} == {"succeeded", "cancelled", "running"}:
            break
        await asyncio.sleep(0.05)
    assert [r["job_id"] for r in runs] == [jobs[1], jobs[2], jobs[0]]
    first = runs[2]
    assert first["status"] == "succeeded" and first["duration_seconds"] == 600.0
    assert first["hyperparameters"] == {"lr": 0.1, "epochs": 2}
    assert first["metrics"]["loss"] == {"final": 0.3, "best": 0.15, "goal": "min"}
    best_acc = (await vision.get(f"/v1/experiments/{eid}?sort=best:accuracy")).json()["runs"]
    assert [r["job_id"] for r in best_acc] == [jobs[2], jobs[1], jobs[0]]
    ascending = (await vision.get(f"/v1/experiments/{eid}?sort=best:accuracy&order=asc")).json()
    assert [r["job_id"] for r in ascending["runs"]] == [jobs[0], jobs[1], jobs[2]]
    low = (await vision.get(f"/v1/experiments/{eid}?filter=final:loss<=0.2")).json()["runs"]
    assert {r["job_id"] for r in low} == {jobs[1], jobs[2]}

    compared = (await vision.get(f"/v1/experiments/{eid}/compare?keys=loss,accuracy")).json()
    assert set(compared["differing_parameters"]) == {"lr"}
    assert compared["final"]["loss"] == {jobs[0]: 0.3, jobs[1]: 0.1, jobs[2]: 0.2}
    assert len(compared["curves"]["loss"][jobs[0]]["points"]) == 3
    assert set(compared["curves"]["accuracy"]) == set(jobs)


async def test_a_comparison_of_jobs_that_are_not_its_runs_names_them(
    bus: Bus, pool: asyncpg.Pool, vision: httpx.AsyncClient
) -> None:
    """``compare?jobs=`` left out every job that is not a run of the experiment and answered
    the rest: a mistyped id (or another experiment's run) compared nothing, silently."""
    experiment, elsewhere = (f"cmp-{uuid.uuid4().hex[:6]}" for _ in range(2))
    run, other = job(), job()
    await publish(bus, started(run, spec(experiment=experiment)), run)
    await publish(bus, started(other, spec(experiment=elsewhere)), other)
    await publish(bus, batch(run, 0, "loss", [1.0]), run)
    await publish(bus, batch(other, 0, "loss", [1.0]), other)
    await wait_points(pool, run, 1)
    await wait_points(pool, other, 1)
    listed = (await vision.get("/v1/experiments?project=vision-research")).json()["experiments"]
    eid = next(e["id"] for e in listed if e["name"] == experiment)

    answer = await vision.get(f"/v1/experiments/{eid}/compare?jobs={run},{other},nope")
    assert answer.status_code == 422, answer.text
    (error,) = answer.json()["errors"]
    assert error["field"] == "jobs"
    assert f"{other}, nope" in error["message"] and run not in error["message"]
    alone = await vision.get(f"/v1/experiments/{eid}/compare?jobs={run}")
    assert alone.status_code == 200 and [r["job_id"] for r in alone.json()["runs"]] == [run]


async def test_a_comparison_shares_a_bounded_number_of_points_among_its_curves(
    pool: asyncpg.Pool, vision: httpx.AsyncClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """20 keys of 50 runs at max_points=10,000 asked for 1,000 curves of up to 10,000 points
    each in one request: a reader could make the registry build millions of points. The
    curves now share COMPARE_POINTS_MAX (here 1,000: two curves of 3,000 points get 500
    each); max_points still caps a curve when its share is larger."""
    monkeypatch.setattr(tracking_api, "COMPARE_POINTS_MAX", 1_000, raising=False)
    j = job()
    experiment = f"big-{uuid.uuid4().hex[:6]}"
    apply = applying(pool)
    deliveries = [wrapped(started(j, spec(experiment=experiment)))]
    values = [math.cos(i / 100) for i in range(3_000)]
    for seq, (key, first) in enumerate((k, f) for k in ("loss", "accuracy") for f in (0, 1_500)):
        deliveries.append(wrapped(batch(j, seq, key, values[first : first + 1_500], first)))
    await apply(deliveries)
    listed = (await vision.get("/v1/experiments?project=vision-research")).json()["experiments"]
    eid = next(e["id"] for e in listed if e["name"] == experiment)

    wide = await vision.get(f"/v1/experiments/{eid}/compare?keys=loss,accuracy&max_points=10000")
    assert wide.status_code == 200, wide.text
    for key in ("loss", "accuracy"):
        curve = wide.json()["curves"][key][j]
        assert curve["total"] == 3_000 and curve["downsampled"] is True, key
        assert len(curve["points"]) <= 500 + 500 // 4, key
    narrow = (await vision.get(f"/v1/experiments/{eid}/compare?keys=loss&max_points=100")).json()
    assert len(narrow["curves"]["loss"][j]["points"]) <= 100 + 100 // 4


async def test_a_job_without_an_experiment_is_in_one_named_after_it(
    bus: Bus, pool: asyncpg.Pool, vision: httpx.AsyncClient
) -> None:
    j = job()
    await publish(bus, started(j, spec(experiment=None)), j)
    await publish(bus, batch(j, 0, "loss", [1.0]), j)
    await wait_points(pool, j, 1)
    names = {e["name"] for e in (await vision.get("/v1/experiments")).json()["experiments"]}
    assert "digits" in names


async def test_tags_and_notes(bus: Bus, pool: asyncpg.Pool, vision: httpx.AsyncClient) -> None:
    j = job()
    await publish(bus, started(j, spec()), j)
    await publish(bus, batch(j, 0, "loss", [1.0]), j)
    await wait_points(pool, j, 1)
    assert (await vision.put(f"/v1/jobs/{j}/tags/baseline")).json()["tags"] == ["baseline"]
    assert (await vision.put(f"/v1/jobs/{j}/tags/best-lr")).json()["tags"] == [
        "baseline",
        "best-lr",
    ]
    assert (await vision.put(f"/v1/jobs/{j}/tags/baseline")).status_code == 200
    assert (await vision.delete(f"/v1/jobs/{j}/tags/baseline")).json()["tags"] == ["best-lr"]
    noted = await vision.put(f"/v1/jobs/{j}/note", json={"note": "lr too high\nretry 0.01"})
    assert noted.status_code == 200 and noted.json()["note"] == "lr too high\nretry 0.01"
    bad = await vision.put(f"/v1/jobs/{j}/note", json={"note": "a\u0000b"})
    assert bad.status_code == 422 and bad.json()["errors"][0]["field"] == "note"
    long = await vision.put(f"/v1/jobs/{j}/note", json={"note": "x" * 10_001})
    assert long.status_code == 422 and long.json()["errors"][0]["field"] == "note"
    extra = await vision.put(f"/v1/jobs/{j}/note", json={"note": "kept?", "tags": ["a"]})
    assert extra.status_code == 422  # an unknown field is refused, as in every body
    assert extra.json()["errors"] == [{"field": "tags", "message": "unknown field"}]
    note = await pool.fetchval("SELECT note FROM tracked_jobs WHERE job_id = $1", j)
    assert note == "lr too high\nretry 0.01"  # unchanged
    async with app_as(
        pool, Principal(user="op", team=None, role=Role.OPERATOR, token_id=None)
    ) as operator:
        assert (await operator.put(f"/v1/jobs/{j}/tags/checked")).status_code == 200
    audit = await pool.fetch("SELECT action, target, detail FROM audit_log WHERE target = $1", j)
    assert [(r["action"], r["detail"]) for r in audit] == [("tag run", {"tag": "checked"})]


async def test_a_note_change_with_a_stale_etag_is_412_and_the_fresh_one_proceeds(
    bus: Bus, pool: asyncpg.Pool, vision: httpx.AsyncClient
) -> None:
    """``GET /v1/jobs/{id}/note`` answers the run's note with its ``ETag``; ``PUT`` with
    ``If-Match: <it>`` replaces the note while it is as it was read and is 412, naming
    ``If-Match`` and that it changed, once another member edited it since: an edit made
    from what was read no longer erases another's. Without a condition, as before.
    (Before, there was no such ``GET`` nor tag, and ``PUT`` ignored the headers.)"""
    j = job()
    await publish(bus, started(j, spec()), j)
    await publish(bus, batch(j, 0, "loss", [1.0]), j)
    await wait_points(pool, j, 1)
    read = await vision.get(f"/v1/jobs/{j}/note")
    assert read.status_code == 200 and read.json() == {"job_id": j, "tags": [], "note": ""}
    tag = read.headers["ETag"]
    other = await vision.put(
        f"/v1/jobs/{j}/note", json={"note": "theirs"}, headers={"If-Match": tag}
    )
    assert other.status_code == 200, other.text
    assert other.headers["ETag"] not in (tag, None)
    stale = await vision.put(f"/v1/jobs/{j}/note", json={"note": "mine"}, headers={"If-Match": tag})
    assert stale.status_code == 412, stale.text
    (error,) = stale.json()["errors"]
    assert error["field"] == "If-Match"
    assert f"the note of run {j} was changed since it was read" in error["message"]
    assert (await vision.get(f"/v1/jobs/{j}/note")).json()["note"] == "theirs"
    fresh = await vision.put(
        f"/v1/jobs/{j}/note",
        json={"note": "theirs\nmine"},
        headers={"If-Match": other.headers["ETag"]},
    )
    assert fresh.status_code == 200 and fresh.json()["note"] == "theirs\nmine", fresh.text
    # Without a condition, as before.
    plain = await vision.put(f"/v1/jobs/{j}/note", json={"note": "plain"})
    assert plain.status_code == 200 and plain.json()["note"] == "plain"
    assert (await vision.get("/v1/jobs/no-such-job/note")).status_code == 404


async def test_another_teams_job_and_experiment_answer_404(
    bus: Bus, pool: asyncpg.Pool, vision: httpx.AsyncClient
) -> None:
    j = job()
    await publish(bus, started(j, spec(team="vision")), j)
    await publish(bus, batch(j, 0, "loss", [1.0]), j)
    await wait_points(pool, j, 1)
    eid = (await vision.get("/v1/experiments")).json()["experiments"][0]["id"]
    async with app_as(pool, ML) as ml:
        for method, path in [
            ("GET", f"/v1/jobs/{j}/metrics"),
            ("GET", f"/v1/jobs/{j}/metrics/loss"),
            ("GET", f"/v1/experiments/{eid}"),
            ("GET", f"/v1/experiments/{eid}/compare"),
            ("PUT", f"/v1/jobs/{j}/tags/x"),
            ("DELETE", f"/v1/jobs/{j}/tags/x"),
        ]:
            response = await ml.request(method, path)
            assert response.status_code == 404, (method, path, response.text)
        assert (await ml.put(f"/v1/jobs/{j}/note", json={"note": "x"})).status_code == 404
        mine = (await ml.get("/v1/experiments")).json()["experiments"]
        assert all(e["team"] == "ml" for e in mine)
        # Another team's experiments answer 404 naming the team, as billing's costs do and
        # exactly as a team that does not exist (it answered 200 with an empty list).
        for team in ("vision", "no-such-team"):
            refused = await ml.get("/v1/experiments", params={"team": team})
            assert refused.status_code == 404, refused.text
            assert refused.json()["detail"] == f"no experiments of team {team!r} for you to read"
        assert (await ml.get("/v1/experiments?team=ml")).json()["experiments"] == mine
    missing = await vision.get("/v1/jobs/no-such-job/metrics")
    assert missing.status_code == 404
    assert (await vision.get(f"/v1/jobs/{j}/metrics/nope")).status_code == 404


async def test_points_are_believed_only_from_the_node_the_run_started_on(
    pool: asyncpg.Pool,
) -> None:
    j, other = job(), job()
    apply = applying(pool)
    early = batch(j, 0, "loss", [1.0])
    with pytest.raises(RunNotRecorded):  # retried until its job.started is recorded
        await apply([wrapped(early)])
    await apply([wrapped(started(j, spec())), wrapped(started(other, spec()))])
    elsewhere = early.model_copy(update={"node_id": "node-b"})
    with pytest.raises(Reject, match="node-b"):
        await apply([wrapped(elsewhere)])
    borrowed = early.model_copy(update={"allocation_id": f"a-{other}"})
    with pytest.raises(Reject, match=other):
        await apply([wrapped(borrowed)])
    await apply([wrapped(early)])
    assert await pool.fetchval("SELECT count FROM metric_series WHERE job_id = $1", j) == 1
    assert await pool.fetchval("SELECT count(*) FROM metric_series WHERE job_id = $1", other) == 0


async def test_experiments_and_runs_come_a_page_at_a_time(pool: asyncpg.Pool) -> None:
    # GET /v1/experiments had no limit, and an experiment's runs stopped at 1,000 with no
    # cursor. Now both page with the platform's cursor; following it gives exactly the rows
    # of one big page, in its order, through ties, NaN, infinities and missing metrics.
    team = f"pg{uuid.uuid4().hex[:8]}"
    apply = applying(pool)
    events: list[Delivery] = []
    for n in range(5):
        j = job()
        events.append(wrapped(started(j, spec(team=team, experiment=f"alone-{n}"))))
    losses: list[float | None] = [0.5, NAN, 0.5, None, 0.2, INF, 0.5]
    for n, loss in enumerate(losses):
        j = job()
        begun = started(j, spec(team=team, experiment="sweep"))
        begun = begun.model_copy(update={"started_at": T0 + timedelta(minutes=n % 3)})
        events.append(wrapped(begun))
        if loss is not None:
            events.append(wrapped(batch(j, 0, "loss", [loss])))
    await apply(events)
    who = Principal(user="alice", team=team, role=Role.MEMBER, token_id=9)
    async with app_as(pool, who) as client:

        async def every(path: str, field: str, params: dict[str, Any], size: int) -> list[Any]:
            rows: list[Any] = []
            query = {**params, "limit": size}
            for _ in range(20):
                answer = await client.get(path, params=query)
                assert answer.status_code == 200, answer.text
                body = answer.json()
                assert len(body[field]) <= size
                rows += body[field]
                if body["next"] is None:
                    return rows
                query = {**params, "limit": size, "after": body["next"]}
            raise AssertionError("the cursor never ended")

        whole = await every("/v1/experiments", "experiments", {}, 500)
        assert len(whole) == 6
        assert await every("/v1/experiments", "experiments", {}, 2) == whole
        eid = next(e["id"] for e in whole if e["name"] == "sweep")
        path = f"/v1/experiments/{eid}"
        for params in ({}, {"sort": "final:loss"}, {"sort": "final:loss", "order": "desc"}):
            one = await every(path, "runs", params, 1000)
            assert len(one) == len(losses)
            paged = await every(path, "runs", params, 2)
            assert [r["job_id"] for r in paged] == [r["job_id"] for r in one], params

        first = (await client.get(path, params={"limit": 2})).json()
        for bad_path, bad in (
            ("/v1/experiments", {"after": "bm90IGEgY3Vyc29y"}),
            ("/v1/experiments", {"limit": 501}),
            (path, {"after": first["next"], "sort": "final:loss"}),  # another sort's cursor
            (path, {"after": "x" * 600}),
        ):
            refused = await client.get(bad_path, params=bad)
            assert refused.status_code == 422, (bad, refused.text)
            assert refused.json()["errors"][0]["field"] == next(iter(bad)), refused.text


async def test_a_job_has_at_most_max_metric_keys(
    pool: asyncpg.Pool, vision: httpx.AsyncClient
) -> None:
    # A job's code chooses its metric keys: one reporting a new key at every step grew its
    # series without bound, and GET /v1/jobs/{id}/metrics and every run row of its
    # experiment carried all of them. Now the series past MAX_METRIC_KEYS are left out.
    j = job()
    apply = applying(pool)
    keys = [f"k{n:05}" for n in range(MAX_METRIC_KEYS + 5)]
    events = [
        JobMetrics(
            job_id=j,
            allocation_id=f"a-{j}",
            node_id="node-a",
            seq=seq,
            points=[MetricPoint(key=k, step=0, time=T0, value=1.0) for k in keys[at : at + 100]],
        )
        for seq, at in enumerate(range(0, len(keys), 100))
    ]
    await apply([wrapped(started(j, spec())), *map(wrapped, events)])
    summary = (await vision.get(f"/v1/jobs/{j}/metrics")).json()["metrics"]
    assert [m["key"] for m in summary] == keys[:MAX_METRIC_KEYS]
    # A key it has goes on; a new one stays out.
    more = JobMetrics(
        job_id=j,
        allocation_id=f"a-{j}",
        node_id="node-a",
        seq=len(events),
        points=[
            MetricPoint(key=keys[0], step=1, time=T0, value=2.0),
            MetricPoint(key="fresh", step=1, time=T0, value=2.0),
        ],
    )
    await apply([wrapped(more)])
    summary = (await vision.get(f"/v1/jobs/{j}/metrics")).json()["metrics"]
    assert len(summary) == MAX_METRIC_KEYS
    assert next(m for m in summary if m["key"] == keys[0])["count"] == 2
    assert (await vision.get(f"/v1/jobs/{j}/metrics/fresh")).status_code == 404


async def test_a_job_past_its_metric_key_limit_is_warned_about_once(
    pool: asyncpg.Pool, caplog: pytest.LogCaptureFixture
) -> None:
    # Every batch of a job past MAX_METRIC_KEYS logged "reported more than 1000 metric keys"
    # again: a job that kept reporting new keys wrote one warning a batch for as long as it
    # ran. Now the first is the only one (another job past its limit has its own).
    j, other = job(), job()
    apply = applying(pool)

    def batch(job_id: str, seq: int, keys: list[str]) -> JobMetrics:
        return JobMetrics(
            job_id=job_id,
            allocation_id=f"a-{job_id}",
            node_id="node-a",
            seq=seq,
            points=[MetricPoint(key=k, step=seq, time=T0, value=1.0) for k in keys],
        )

    full = [f"k{n:05}" for n in range(MAX_METRIC_KEYS)]
    await apply([wrapped(started(j, spec())), wrapped(started(other, spec()))])
    await apply([wrapped(batch(j, 0, full)), wrapped(batch(other, 0, full))])
    with caplog.at_level(logging.WARNING, "trainyard_platform.services.registry.metric_ingest"):
        for seq in range(1, 4):  # three batches, each with a key past the limit
            await apply([wrapped(batch(j, seq, [f"new{seq}"]))])
        await apply([wrapped(batch(other, 1, ["new"]))])
    said = [r.getMessage() for r in caplog.records if "metric keys" in r.getMessage()]
    assert [m.split()[1] for m in said] == [j, other], said


async def test_the_metric_key_limit_warning_names_the_job_in_its_record(
    pool: asyncpg.Pool,
) -> None:
    # The warning is logged after a batch's events were handled, outside any event's scope:
    # its JSON record had no job_id (the batch mixes jobs, routed by node).
    j = job()
    apply = applying(pool)
    full = [f"k{n:05}" for n in range(MAX_METRIC_KEYS)]
    points = [MetricPoint(key=k, step=0, time=T0, value=1.0) for k in [*full, "one-more"]]
    metrics_of_j = JobMetrics(
        job_id=j, allocation_id=f"a-{j}", node_id="node-a", seq=0, points=points[:MAX_METRIC_KEYS]
    )
    more = JobMetrics(
        job_id=j, allocation_id=f"a-{j}", node_id="node-a", seq=1, points=points[MAX_METRIC_KEYS:]
    )
    await apply([wrapped(started(j, spec())), wrapped(metrics_of_j)])
    with json_lines("trainyard_platform.services.registry", "registry", logging.WARNING) as log:
        await apply([wrapped(more)])
    [line] = [line for line in log.lines if "metric keys" in line["message"]]
    assert line["job_id"] == j


async def test_a_run_has_at_most_max_run_tags(
    pool: asyncpg.Pool, vision: httpx.AsyncClient
) -> None:
    # PUT .../tags/{tag} added any number of tags to a run, and every row of its experiment's
    # runs carries all of them. Now a new tag past MAX_RUN_TAGS is a 422 naming tag.
    j = job()
    apply = applying(pool)
    await apply([wrapped(started(j, spec()))])
    for n in range(MAX_RUN_TAGS):
        assert (await vision.put(f"/v1/jobs/{j}/tags/t{n:02}")).status_code == 200
    refused = await vision.put(f"/v1/jobs/{j}/tags/one-more")
    assert refused.status_code == 422, refused.text
    (error,) = refused.json()["errors"]
    assert error["field"] == "tag" and f"{MAX_RUN_TAGS} tags" in error["message"]
    assert (await vision.put(f"/v1/jobs/{j}/tags/t00")).status_code == 200  # has it: no-op
    assert (await vision.delete(f"/v1/jobs/{j}/tags/t00")).status_code == 200
    assert "one-more" in (await vision.put(f"/v1/jobs/{j}/tags/one-more")).json()["tags"]


def _comparisons_held(
    monkeypatch: pytest.MonkeyPatch,
) -> tuple[asyncio.Event, asyncio.Queue[int]]:
    """Comparisons held once under way, before they read the runs, until the event is set;
    the queue gets an item as each one gets there."""
    release = asyncio.Event()
    under_way: asyncio.Queue[int] = asyncio.Queue()
    slow = tracking_api.repo.runs

    async def held_runs(*args: Any, **kwargs: Any) -> Any:
        under_way.put_nowait(1)
        await release.wait()
        return await slow(*args, **kwargs)

    monkeypatch.setattr(tracking_api.repo, "runs", held_runs)
    return release, under_way


async def test_a_team_runs_at_most_its_share_of_comparisons_at_once(
    pool: asyncpg.Pool, vision: httpx.AsyncClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A comparison of 20 keys of 50 runs (400 points each) took about 2 s of the
    registry and 7 MB of answer, against 8 ms for the experiment's runs: one reader asking
    for it many times at once kept the registry's one event loop and its database busy
    for every team. Now a team has at most ``COMPARISONS_PER_TEAM`` under way (one more:
    429 with ``Retry-After``, nothing read), and another team's go on."""
    j = job()
    experiment = f"cmp-{uuid.uuid4().hex[:6]}"
    await applying(pool)([wrapped(started(j, spec(experiment=experiment)))])
    listed = (await vision.get("/v1/experiments?project=vision-research")).json()["experiments"]
    eid = next(e["id"] for e in listed if e["name"] == experiment)
    ml_job = job()
    await applying(pool)([wrapped(started(ml_job, spec(team="ml", experiment=experiment)))])

    release, under_way = _comparisons_held(monkeypatch)
    share = tracking_api.COMPARISONS_PER_TEAM
    first = [
        asyncio.create_task(vision.get(f"/v1/experiments/{eid}/compare")) for _ in range(share)
    ]
    for _ in range(share):
        await asyncio.wait_for(under_way.get(), 30)
    refused = await refused_before_entering(
        vision.get(f"/v1/experiments/{eid}/compare"),
        under_way,
        lambda: f"comparison {share + 1} of one team was let in",
    )
    assert int(refused.headers["retry-after"]) >= 1
    assert "team 'vision'" in refused.json()["detail"], refused.text
    async with app_as(pool, ML) as ml:
        ml_listed = (await ml.get("/v1/experiments")).json()["experiments"]
        ml_eid = next(e["id"] for e in ml_listed if e["name"] == experiment)
        other = asyncio.create_task(ml.get(f"/v1/experiments/{ml_eid}/compare"))
        await asyncio.wait_for(under_way.get(), 30)
        release.set()
        assert (await other).status_code == 200
    for task in first:
        assert (await task).status_code == 200
    again = await vision.get(f"/v1/experiments/{eid}/compare")
    assert again.status_code == 200, again.text


async def test_a_teams_share_of_comparisons_holds_across_replicas(
    pool: asyncpg.Pool, vision: httpx.AsyncClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before, each replica counted a team's comparisons in its own memory: two replicas
    let a team twice its share. Now the places are held in the registry's database
    (``shared.slots``): one more is refused whichever replica it reaches."""
    j = job()
    experiment = f"cmp-{uuid.uuid4().hex[:6]}"
    await applying(pool)([wrapped(started(j, spec(experiment=experiment)))])
    listed = (await vision.get("/v1/experiments?project=vision-research")).json()["experiments"]
    eid = next(e["id"] for e in listed if e["name"] == experiment)
    release, under_way = _comparisons_held(monkeypatch)
    share = tracking_api.COMPARISONS_PER_TEAM
    async with app_as(pool, VISION) as other:
        replicas = [vision, other]
        first = [
            asyncio.create_task(replicas[i % 2].get(f"/v1/experiments/{eid}/compare"))
            for i in range(share)
        ]
        for _ in range(share):
            await asyncio.wait_for(under_way.get(), 30)
        for replica in replicas:
            refused = await refused_before_entering(
                replica.get(f"/v1/experiments/{eid}/compare"),
                under_way,
                lambda: f"comparison {share + 1} of one team was let in",
            )
            assert "team 'vision'" in refused.json()["detail"], refused.text
        release.set()
        for task in first:
            assert (await task).status_code == 200
        for replica in replicas:
            again = await replica.get(f"/v1/experiments/{eid}/compare")
            assert again.status_code == 200, again.text
