"""The operator's commands: define flavors, cohorts, queues with quotas, priority classes.

Contract:
- Every ``put_*`` validates the whole request first (unknown cohort or flavor, a team that
  already has another queue, a queue that would change team) and changes nothing when any
  check fails: ``RequestInvalid`` (422, naming each field) or ``Conflict`` (409).
- Writes run under the scheduling lock, so a pass never sees half a change, and notify the
  leader's pass loop, which reschedules with the new configuration at once.
- A team's implicit queue (``default:<team>``) becomes its named queue when an operator
  defines one for the team: the row is renamed, its jobs follow, and nothing waits twice.
- Reads need no lock and work on every replica, leader or not.
"""

from __future__ import annotations

import asyncpg

from services.scheduler import admin_repository as admin_repo
from services.scheduler import repository as repo
from services.scheduler.admin_schemas import (
    FLAVOR_PATTERN,
    CohortRequest,
    CohortView,
    FieldError,
    FlavorRequest,
    FlavorView,
    PriorityClassRequest,
    PriorityClassView,
    QueueConfigView,
    QueueRequest,
    RequestInvalid,
    check_name,
    cohort_view,
    flavor_view,
    priority_class_view,
    queue_config_view,
)


class NotFound(Exception):
    """No such flavor, cohort, queue or priority class (404)."""


class Conflict(Exception):
    """The change contradicts the configuration in place (409)."""


# --- flavors ---------------------------------------------------------------------------


async def put_flavor(pool: asyncpg.Pool, name: str, body: FlavorRequest) -> tuple[FlavorView, bool]:
    check_name(name, FLAVOR_PATTERN)
    async with pool.acquire() as conn, conn.transaction():
        created = await admin_repo.upsert_flavor(conn, name, body.description)
        row = await admin_repo.flavor(conn, name)
    assert row is not None
    return flavor_view(row), created


async def list_flavors(pool: asyncpg.Pool) -> list[FlavorView]:
    async with pool.acquire() as conn:
        return [flavor_view(r) for r in await admin_repo.flavors(conn)]


async def get_flavor(pool: asyncpg.Pool, name: str) -> FlavorView:
    async with pool.acquire() as conn:
        row = await admin_repo.flavor(conn, name)
    if row is None:
        raise NotFound(f"no flavor {name}")
    return flavor_view(row)


# --- cohorts ---------------------------------------------------------------------------


async def put_cohort(pool: asyncpg.Pool, name: str, body: CohortRequest) -> tuple[CohortView, bool]:
    check_name(name)
    async with pool.acquire() as conn, conn.transaction():
        created = await admin_repo.upsert_cohort(conn, name, body.description)
        row = await admin_repo.cohort(conn, name)
    assert row is not None
    return cohort_view(row), created


async def list_cohorts(pool: asyncpg.Pool) -> list[CohortView]:
    async with pool.acquire() as conn:
        return [cohort_view(r) for r in await admin_repo.cohorts(conn)]


async def get_cohort(pool: asyncpg.Pool, name: str) -> CohortView:
    async with pool.acquire() as conn:
        row = await admin_repo.cohort(conn, name)
    if row is None:
        raise NotFound(f"no cohort {name}")
    return cohort_view(row)


# --- queues ----------------------------------------------------------------------------


async def put_queue(
    pool: asyncpg.Pool, name: str, body: QueueRequest
) -> tuple[QueueConfigView, bool]:
    check_name(name)
    async with pool.acquire() as conn, conn.transaction():
        await repo.lock_scheduler(conn)
        await _check_references(conn, body)
        existing = await admin_repo.queue(conn, name)
        current = await admin_repo.queue_of_team(conn, body.team)
        created = existing is None
        if existing is not None and existing["team"] != body.team:
            raise RequestInvalid.one(
                "team", f"queue {name} belongs to team {existing['team']}; a queue keeps its team"
            )
        if existing is None and current is not None and not current["implicit"]:
            raise Conflict(f"team {body.team} already has queue {current['name']}")
        if existing is None and current is not None:
            await admin_repo.adopt_implicit_queue(
                conn, current["name"], name, body.cohort, body.weight
            )
        else:
            await admin_repo.upsert_queue(conn, name, body.team, body.cohort, body.weight)
        await admin_repo.replace_quotas(
            conn,
            name,
            [
                (flavor, q.nominal, q.borrowing_limit, q.lending_limit)
                for flavor, q in sorted(body.quotas.items())
            ],
        )
        await admin_repo.notify_config_changed(conn)
        row = await admin_repo.queue(conn, name)
        quotas = await admin_repo.quotas(conn, [name])
    assert row is not None
    return queue_config_view(row, quotas), created


async def _check_references(conn: asyncpg.Connection, body: QueueRequest) -> None:
    errors: list[FieldError] = []
    if body.cohort is not None and await admin_repo.cohort(conn, body.cohort) is None:
        errors.append(
            FieldError(
                field="cohort",
                message=f"unknown cohort {body.cohort}; "
                f"create it first with PUT /v1/admin/cohorts/{body.cohort}",
            )
        )
    known = await admin_repo.flavor_names(conn, list(body.quotas))
    for flavor in sorted(set(body.quotas) - known):
        errors.append(
            FieldError(
                field=f"quotas.{flavor}",
                message=f"unknown flavor {flavor}; start a node of it or declare it with "
                f"PUT /v1/admin/flavors/{flavor}",
            )
        )
    if errors:
        raise RequestInvalid(errors)


async def list_queues(pool: asyncpg.Pool) -> list[QueueConfigView]:
    async with pool.acquire() as conn, conn.transaction(isolation="repeatable_read", readonly=True):
        rows = await admin_repo.queues(conn)
        quotas = await admin_repo.quotas(conn)
    return [queue_config_view(r, quotas) for r in rows]


async def get_queue(pool: asyncpg.Pool, name: str) -> QueueConfigView:
    async with pool.acquire() as conn, conn.transaction(isolation="repeatable_read", readonly=True):
        row = await admin_repo.queue(conn, name)
        quotas = await admin_repo.quotas(conn, [name])
    if row is None:
        raise NotFound(f"no queue {name}")
    return queue_config_view(row, quotas)


# --- priority classes ------------------------------------------------------------------


async def put_priority_class(
    pool: asyncpg.Pool, name: str, body: PriorityClassRequest
) -> tuple[PriorityClassView, bool]:
    check_name(name)
    async with pool.acquire() as conn, conn.transaction():
        await repo.lock_scheduler(conn)
        created = await admin_repo.upsert_priority_class(
            conn, name, body.value, body.preemptible, body.min_runtime_seconds, body.description
        )
        await admin_repo.notify_config_changed(conn)
        row = await admin_repo.priority_class(conn, name)
    assert row is not None
    return priority_class_view(row), created


async def list_priority_classes(pool: asyncpg.Pool) -> list[PriorityClassView]:
    async with pool.acquire() as conn:
        return [priority_class_view(r) for r in await admin_repo.priority_classes(conn)]


async def get_priority_class(pool: asyncpg.Pool, name: str) -> PriorityClassView:
    async with pool.acquire() as conn:
        row = await admin_repo.priority_class(conn, name)
    if row is None:
        raise NotFound(f"no priority class {name}")
    return priority_class_view(row)
