"""The operator's commands: define and delete flavors, cohorts, queues with quotas, priority
classes; declare what each node has (the node inventory, ``inventory``); cordon and uncordon
nodes (``cordon``), retire a node taken out for good.

Contract:
- Every ``put_*`` validates the whole request first (unknown cohort or flavor, a team that
  already has another queue, a queue that would change team) and changes nothing when any
  check fails: ``RequestInvalid`` (422, naming each field) or ``Conflict`` (409).
- A queue for a team the scheduler has never seen is stored only after the submission
  service, which owns teams, says the team exists (``shared.access.Teams``, asked with the
  caller's user token): a typo'd team would otherwise get a queue no job ever uses. With the
  service's break-glass operator token there is no user token to ask with, so such a queue
  is refused (422 naming ``team``); queues of teams it knows stay editable with it (quota
  changes while the submission service is down).
- ``cordon_node`` and ``uncordon_node`` raise ``NotFound`` (404) for a node never heard of.
  Both take ``conditions`` as the other writes do, judged against the node's cordon
  (``cordon_tag``, what ``get_node_cordon`` answers; an automatic cordon or its end
  changes it too) with the node's row locked: an operator who read the node uncordoned
  does not replace a cordon another operator, or the scheduler, put in place since.
- ``retire_node`` forgets a node taken out for good without deleting its row (the
  allocations and GPU leases of its past reference it): it sets ``retired_at``, and every
  read of live nodes leaves it out (the snapshot reads READY nodes only, and a retired node
  is always LOST; the node and GPU gauges the lost-node alerts read; a flavor's nodes, so
  the flavor can be deleted; admission's largest node; ``GET /v1/queue`` unless asked).
  ``NotFound`` for a node never heard of; ``Conflict`` (409) for a READY node (its runner
  still heartbeats, or the scheduler has not yet declared it lost) and for one that still
  holds a live allocation or GPU lease (naming the jobs). Retiring a retired node changes
  nothing. Its next heartbeat makes it an ordinary node again (``repo.upsert_node``).
- ``put_node_declaration`` declares what a node has: a known flavor (422 naming
  ``gpu_flavor`` otherwise), a GPU count, optionally a topology. It may name a node never
  heard of (declared before its runner starts). A heartbeat never gets more than its node's
  declaration (``inventory.cap``); the node is judged by a new or changed declaration at its
  next heartbeat. Its view shows the node's latest claim and each field the declaration
  caps. ``delete_node_declaration`` forgets it: the node is then undeclared (no GPU under
  ``TRAINYARD_SCHEDULER_NODE_INVENTORY=required``), again from its next heartbeat.
- Every ``put_*``, ``patch_*`` and ``delete_*`` of a flavor, cohort, queue, priority
  class or node declaration takes the request's ``conditions`` (``shared.http_app.Preconditions``: ``If-Match:
  "<etag>"`` or ``*``, ``If-None-Match: *``), judged under the lock, against the
  resource's tag now (``*_tag``: of what a write sets, the same tag its ``GET`` answers),
  before anything changes: a false one raises ``shared.http_errors.PreconditionFailed``
  (412) and the resource is kept as it is (a ``PUT`` with ``If-None-Match: *`` only
  creates: one another change made since the caller found none is not replaced; a write
  with the ETag the caller read is refused when another change fell between). A
  ``patch_*`` or ``delete_*`` of an absent name is ``NotFound`` whatever its conditions.
- ``patch_queue``, ``patch_priority_class`` and ``patch_node_declaration`` change only the fields a JSON Merge Patch
  names (RFC 7396: ``null`` puts a field back to its default); the result is judged as the
  ``PUT`` of it would be, read and written under the lock. A patch never creates (404).
- Every ``delete_*`` raises ``NotFound`` (404) for an absent name, and ``Conflict`` (409,
  naming what still uses it) rather than orphan anything: a flavor of a node, a node
  declaration, a quota or an unfinished job; a cohort with queues; a queue or a priority class of unfinished jobs.
- Deleting a queue removes its quotas; its team falls back to its implicit queue
  (``default:<team>``). Finished jobs keep their history there: a queue they name becomes
  that implicit queue rather than vanish.
- Writes run under the scheduling lock, so a pass never sees half a change, and notify the
  leader's pass loop, which reschedules with the new configuration at once.
- A team's implicit queue becomes its named queue when an operator defines one for the team:
  the row is renamed, its jobs follow, and nothing waits twice.
- Every write names who makes it (``by``) and is recorded in the audit log in its own
  transaction (``shared.audit``): a change that rolls back leaves no entry.
- Reads need no lock and work on every replica, leader or not.
- The flavor catalogue is published: a ``put_flavor`` says ``flavor.declared`` and a
  ``delete_flavor`` says ``flavor.retired`` through the outbox, in the transaction of the
  change, each with the next revision of the catalogue (``flavor_revisions``). Submission
  and billing keep their replicas from these (docs/events.md).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import Any

import asyncpg
from pydantic import BaseModel

from trainyard_platform.services.scheduler import admin_repository as admin_repo
from trainyard_platform.services.scheduler import cordon
from trainyard_platform.services.scheduler import repository as repo
from trainyard_platform.services.scheduler.admin_schemas import (
    FLAVOR_PATTERN,
    NODE_ID_PATTERN,
    CohortRequest,
    CohortView,
    CordonRequest,
    FlavorRequest,
    FlavorView,
    NodeDeclarationRequest,
    NodeDeclarationView,
    PriorityClassRequest,
    PriorityClassView,
    QueueConfigView,
    QueueRequest,
    check_name,
    cohort_view,
    flavor_view,
    node_declaration_view,
    priority_class_view,
    queue_config_view,
    queue_request_of,
)
from trainyard_platform.services.scheduler.convert import implicit_queue
from trainyard_platform.services.scheduler.scheduling import emit
from trainyard_platform.services.scheduler.schemas import NodeCordonView, cordon_view
from trainyard_platform.shared import audit, paging
from trainyard_platform.shared.access import Teams
from trainyard_platform.shared.events.payloads import FlavorDeclared, FlavorRetired
from trainyard_platform.shared.http_app import Preconditions, entity_tag, patched
from trainyard_platform.shared.http_errors import Conflicting, FieldError, RequestInvalid
from trainyard_platform.shared.identity import Principal

_SHOWN = 5
"""How many of the things that block a delete its ``Conflict`` names (then "and N more")."""

NO_CONDITIONS = Preconditions()
"""A write that sets no condition (``If-Match`` or ``If-None-Match``)."""


def flavor_tag(view: FlavorView) -> str:
    """The ETag of a flavor: of its description (its nodes and GPUs are counted, not set)."""
    return entity_tag({"description": view.description})


def cohort_tag(view: CohortView) -> str:
    """The ETag of a cohort: of its description (its queues are theirs to change)."""
    return entity_tag({"description": view.description})


def queue_tag(view: QueueConfigView) -> str:
    """The ETag of a queue: of its definition (a ``PUT`` body) and whether it is implicit."""
    return entity_tag({**queue_request_of(view), "implicit": view.implicit})


def priority_class_tag(view: PriorityClassView) -> str:
    """The ETag of a priority class: of its definition."""
    return entity_tag(view.model_dump(mode="json", exclude={"name"}))


def declaration_tag(view: NodeDeclarationView) -> str:
    """The ETag of a node's declaration: of its definition (a ``PUT`` body; what the node
    claims is its own)."""
    return entity_tag(_declaration_of(view))


def _declaration_of(view: NodeDeclarationView) -> dict[str, Any]:
    """The ``PUT`` body that makes the declaration ``view`` shows (what a patch applies to)."""
    return view.model_dump(include={"gpu_flavor", "gpu_count", "topology", "description"})


async def _flavor_tag(conn: asyncpg.Connection, name: str) -> str | None:
    row = await admin_repo.flavor(conn, name)
    return None if row is None else flavor_tag(flavor_view(row))


async def _cohort_tag(conn: asyncpg.Connection, name: str) -> str | None:
    row = await admin_repo.cohort(conn, name)
    return None if row is None else cohort_tag(cohort_view(row))


async def _queue_tag(conn: asyncpg.Connection, name: str) -> str | None:
    row = await admin_repo.queue(conn, name)
    if row is None:
        return None
    return queue_tag(queue_config_view(row, await admin_repo.quotas(conn, [name])))


async def _priority_class_tag(conn: asyncpg.Connection, name: str) -> str | None:
    row = await admin_repo.priority_class(conn, name)
    return None if row is None else priority_class_tag(priority_class_view(row))


class NotFound(Exception):
    """No such flavor, cohort, queue, priority class, node or node declaration (404)."""


class Conflict(Conflicting):
    """The change contradicts the configuration in place (409, naming ``field``: the path
    parameter or body field the conflict is about)."""


@asynccontextmanager
async def _writing(
    pool: asyncpg.Pool,
    by: Principal,
    action: str,
    target: str,
    body: BaseModel | Mapping[str, Any] | None = None,
) -> AsyncIterator[asyncpg.Connection]:
    """A transaction under the scheduling lock that wakes the pass loop when it commits and
    records ``action`` on ``target`` by ``by`` in the audit log (with the request's fields:
    a patch as it was sent)."""
    async with pool.acquire() as conn, conn.transaction():
        await repo.lock_scheduler(conn)
        yield conn
        detail = body.model_dump(mode="json") if isinstance(body, BaseModel) else dict(body or {})
        await audit.record(conn, by, action, target, detail)
        await admin_repo.notify_config_changed(conn)


def _refuse_if_used(what: str, users: Mapping[str, Sequence[str]], field: str = "name") -> None:
    """Raise ``Conflict`` naming, by kind, whatever still uses ``what`` (named by the path
    parameter ``field``)."""
    named = [f"{kind} {_few(names)}" for kind, names in users.items() if names]
    if named:
        message = f"{what} is in use by {'; '.join(named)}"
        raise Conflict(message, field=field, message=f"{message}: nothing changed")


def _few(names: Sequence[str]) -> str:
    more = len(names) - _SHOWN
    return ", ".join(names[:_SHOWN]) + (f" and {more} more" if more > 0 else "")


# --- flavors ---------------------------------------------------------------------------


async def put_flavor(
    pool: asyncpg.Pool,
    name: str,
    body: FlavorRequest,
    by: Principal,
    conditions: Preconditions = NO_CONDITIONS,
) -> tuple[FlavorView, bool]:
    check_name(name, FLAVOR_PATTERN)
    async with _writing(pool, by, "put flavor", name, body) as conn:
        conditions.check(f"flavor {name}", await _flavor_tag(conn, name))
        created = await admin_repo.upsert_flavor(conn, name, body.description)
        row = await admin_repo.flavor(conn, name)
        revision = await admin_repo.next_flavor_revision(conn)
        declared = FlavorDeclared(
            name=name,
            description=body.description,
            revision=revision,
            declared_at=await admin_repo.transaction_time(conn),
        )
        await emit(conn, declared, name, f"flavor:{name}:{revision}")
    assert row is not None
    return flavor_view(row), created


async def delete_flavor(
    pool: asyncpg.Pool, name: str, by: Principal, conditions: Preconditions = NO_CONDITIONS
) -> None:
    async with _writing(pool, by, "delete flavor", name) as conn:
        tag = await _flavor_tag(conn, name)
        if tag is None:
            raise NotFound(f"no flavor {name}")
        conditions.check(f"flavor {name}", tag)
        _refuse_if_used(
            f"flavor {name}",
            {
                "nodes": await admin_repo.nodes_of_flavor(conn, name),
                "the declarations of nodes": await admin_repo.declared_nodes_of_flavor(conn, name),
                "the quotas of queues": await admin_repo.queues_with_quota_of(conn, name),
                "unfinished jobs": await admin_repo.unfinished_jobs(conn, flavor=name),
            },
        )
        await admin_repo.delete_flavor(conn, name)
        revision = await admin_repo.next_flavor_revision(conn)
        retired = FlavorRetired(
            name=name, revision=revision, retired_at=await admin_repo.transaction_time(conn)
        )
        await emit(conn, retired, name, f"flavor:{name}:{revision}")


FLAVORS = paging.Cursor("GET /v1/admin/flavors", paging.text)


async def list_flavors(
    pool: asyncpg.Pool, limit: int, after: str | None = None
) -> tuple[list[FlavorView], str | None]:
    """A page of flavors by name and the cursor of the next (None: the last)."""
    key = FLAVORS.read(after)
    async with pool.acquire() as conn:
        fetched = await admin_repo.flavors(conn, limit + 1, key[0] if key else "")
    rows, more = paging.split(fetched, limit)
    return [flavor_view(r) for r in rows], FLAVORS.write(rows[-1]["name"]) if more else None


async def get_flavor(pool: asyncpg.Pool, name: str) -> FlavorView:
    async with pool.acquire() as conn:
        row = await admin_repo.flavor(conn, name)
    if row is None:
        raise NotFound(f"no flavor {name}")
    return flavor_view(row)


# --- nodes -----------------------------------------------------------------------------


def cordon_tag(view: NodeCordonView) -> str:
    """The ETag of a node's cordon (none, or its reason, who, since and until)."""
    return entity_tag({"cordon": None if view.cordon is None else view.cordon.model_dump()})


async def get_node_cordon(pool: asyncpg.Pool, node_id: str) -> NodeCordonView:
    """The cordon of ``node_id`` (None: it takes new work); ``NotFound`` for a node never
    heard of."""
    async with pool.acquire() as conn:
        view = await _node_cordon(conn, node_id)
    if view is None:
        raise NotFound(f"no node {node_id}")
    return view


async def _cordon_to_change(
    conn: asyncpg.Connection, node_id: str, conditions: Preconditions
) -> None:
    """Lock the row of ``node_id`` and judge ``conditions`` against its cordon now."""
    view = await _node_cordon(conn, node_id, lock=True)
    if view is None:
        raise NotFound(f"no node {node_id}")
    conditions.check(f"the cordon of node {node_id}", cordon_tag(view))


async def cordon_node(
    pool: asyncpg.Pool,
    node_id: str,
    body: CordonRequest,
    by: Principal,
    conditions: Preconditions = NO_CONDITIONS,
) -> NodeCordonView:
    """Cordon ``node_id`` until uncordoned (``cordon.cordon``)."""
    async with _writing(pool, by, "cordon node", node_id, body) as conn:
        await _cordon_to_change(conn, node_id, conditions)
        now = await admin_repo.transaction_time(conn)
        if not await cordon.cordon(conn, node_id, body.reason, by.actor, now):
            raise NotFound(f"no node {node_id}")
        view = await _node_cordon(conn, node_id)
    assert view is not None
    return view


async def uncordon_node(
    pool: asyncpg.Pool, node_id: str, by: Principal, conditions: Preconditions = NO_CONDITIONS
) -> NodeCordonView:
    """Lift any cordon of ``node_id``, an automatic one too (``cordon.uncordon``)."""
    async with _writing(pool, by, "uncordon node", node_id) as conn:
        await _cordon_to_change(conn, node_id, conditions)
        if not await cordon.uncordon(conn, node_id):
            raise NotFound(f"no node {node_id}")
        view = await _node_cordon(conn, node_id)
    assert view is not None
    return view


async def retire_node(pool: asyncpg.Pool, node_id: str, by: Principal) -> None:
    """Retire ``node_id``, a lost node that holds nothing live (see the module docstring)."""
    async with _writing(pool, by, "retire node", node_id) as conn:
        row = await admin_repo.node_to_retire(conn, node_id)
        if row is None:
            raise NotFound(f"no node {node_id}")
        if row["status"] != "LOST":
            raise Conflict(
                f"node {node_id} is ready (last heartbeat {row['last_heartbeat'].isoformat()}): "
                "stop its runner, and retire it once the scheduler has declared it lost",
                field="node_id",
                message="only a node the scheduler has declared lost can be retired",
            )
        holding = await admin_repo.jobs_holding(conn, node_id)
        _refuse_if_used(
            f"node {node_id}", {"the live allocations or GPU leases of jobs": holding}, "node_id"
        )
        await admin_repo.retire_node(conn, node_id, await admin_repo.transaction_time(conn))


async def _node_cordon(
    conn: asyncpg.Connection, node_id: str, lock: bool = False
) -> NodeCordonView | None:
    """The cordon of ``node_id`` (None: no such node), its row locked with ``lock``."""
    row = await conn.fetchrow(
        "SELECT cordoned_at, cordon_reason, cordoned_by, cordoned_until FROM nodes "
        "WHERE node_id = $1" + (" FOR UPDATE" if lock else ""),
        node_id,
    )
    return None if row is None else NodeCordonView(node_id=node_id, cordon=cordon_view(row))


# --- the node inventory ------------------------------------------------------------------


async def put_node_declaration(
    pool: asyncpg.Pool,
    node_id: str,
    body: NodeDeclarationRequest,
    by: Principal,
    conditions: Preconditions = NO_CONDITIONS,
) -> tuple[NodeDeclarationView, bool]:
    """Declare what ``node_id`` has, or replace its declaration (module contract)."""
    check_name(node_id, NODE_ID_PATTERN, "node_id")
    async with _writing(pool, by, "put node-inventory", node_id, body) as conn:
        row = await admin_repo.declaration(conn, node_id, lock=True)
        tag = None if row is None else declaration_tag(node_declaration_view(row))
        conditions.check(f"the declaration of node {node_id}", tag)
        return await _write_declaration(conn, node_id, body)


async def patch_node_declaration(
    pool: asyncpg.Pool,
    node_id: str,
    patch: Mapping[str, Any],
    by: Principal,
    conditions: Preconditions = NO_CONDITIONS,
) -> NodeDeclarationView:
    """Change the fields of the declaration of ``node_id`` that ``patch`` names, keep the
    rest (as ``patch_queue``)."""
    check_name(node_id, NODE_ID_PATTERN, "node_id")
    async with _writing(pool, by, "patch node-inventory", node_id, patch) as conn:
        row = await admin_repo.declaration(conn, node_id, lock=True)
        if row is None:
            raise NotFound(
                f"node {node_id} is not declared; declare it with "
                f"PUT /v1/admin/node-inventory/{node_id}"
            )
        current = node_declaration_view(row)
        conditions.check(f"the declaration of node {node_id}", declaration_tag(current))
        body = patched(NodeDeclarationRequest, _declaration_of(current), patch)
        view, _ = await _write_declaration(conn, node_id, body)
    return view


async def _write_declaration(
    conn: asyncpg.Connection, node_id: str, body: NodeDeclarationRequest
) -> tuple[NodeDeclarationView, bool]:
    if not await admin_repo.flavor_names(conn, [body.gpu_flavor]):
        raise RequestInvalid.one(
            "gpu_flavor",
            f"unknown flavor {body.gpu_flavor}; declare it first with "
            f"PUT /v1/admin/flavors/{body.gpu_flavor}",
        )
    created = await admin_repo.upsert_declaration(
        conn, node_id, body.gpu_flavor, body.gpu_count, body.topology, body.description
    )
    row = await admin_repo.declaration(conn, node_id)
    assert row is not None
    return node_declaration_view(row), created


async def delete_node_declaration(
    pool: asyncpg.Pool, node_id: str, by: Principal, conditions: Preconditions = NO_CONDITIONS
) -> None:
    async with _writing(pool, by, "delete node-inventory", node_id) as conn:
        row = await admin_repo.declaration(conn, node_id, lock=True)
        if row is None:
            raise NotFound(f"node {node_id} is not declared")
        conditions.check(
            f"the declaration of node {node_id}", declaration_tag(node_declaration_view(row))
        )
        await admin_repo.delete_declaration(conn, node_id)


NODE_INVENTORY = paging.Cursor("GET /v1/admin/node-inventory", paging.text)


async def list_node_declarations(
    pool: asyncpg.Pool, limit: int, after: str | None = None
) -> tuple[list[NodeDeclarationView], str | None]:
    """A page of declarations by node id and the cursor of the next (None: the last)."""
    key = NODE_INVENTORY.read(after)
    async with pool.acquire() as conn:
        fetched = await admin_repo.declarations(conn, limit + 1, key[0] if key else "")
    rows, more = paging.split(fetched, limit)
    cursor = NODE_INVENTORY.write(rows[-1]["node_id"]) if more else None
    return [node_declaration_view(r) for r in rows], cursor


async def get_node_declaration(pool: asyncpg.Pool, node_id: str) -> NodeDeclarationView:
    async with pool.acquire() as conn:
        row = await admin_repo.declaration(conn, node_id)
    if row is None:
        raise NotFound(f"node {node_id} is not declared")
    return node_declaration_view(row)


# --- cohorts ---------------------------------------------------------------------------


async def put_cohort(
    pool: asyncpg.Pool,
    name: str,
    body: CohortRequest,
    by: Principal,
    conditions: Preconditions = NO_CONDITIONS,
) -> tuple[CohortView, bool]:
    check_name(name)
    async with _writing(pool, by, "put cohort", name, body) as conn:
        conditions.check(f"cohort {name}", await _cohort_tag(conn, name))
        created = await admin_repo.upsert_cohort(conn, name, body.description)
        row = await admin_repo.cohort(conn, name)
    assert row is not None
    return cohort_view(row), created


async def delete_cohort(
    pool: asyncpg.Pool, name: str, by: Principal, conditions: Preconditions = NO_CONDITIONS
) -> None:
    async with _writing(pool, by, "delete cohort", name) as conn:
        row = await admin_repo.cohort(conn, name)
        if row is None:
            raise NotFound(f"no cohort {name}")
        conditions.check(f"cohort {name}", cohort_tag(cohort_view(row)))
        _refuse_if_used(f"cohort {name}", {"queues": list(row["queues"])})
        await admin_repo.delete_cohort(conn, name)


COHORTS = paging.Cursor("GET /v1/admin/cohorts", paging.text)


async def list_cohorts(
    pool: asyncpg.Pool, limit: int, after: str | None = None
) -> tuple[list[CohortView], str | None]:
    """A page of cohorts by name and the cursor of the next (None: the last)."""
    key = COHORTS.read(after)
    async with pool.acquire() as conn:
        fetched = await admin_repo.cohorts(conn, limit + 1, key[0] if key else "")
    rows, more = paging.split(fetched, limit)
    return [cohort_view(r) for r in rows], COHORTS.write(rows[-1]["name"]) if more else None


async def get_cohort(pool: asyncpg.Pool, name: str) -> CohortView:
    async with pool.acquire() as conn:
        row = await admin_repo.cohort(conn, name)
    if row is None:
        raise NotFound(f"no cohort {name}")
    return cohort_view(row)


# --- queues ----------------------------------------------------------------------------


async def put_queue(
    pool: asyncpg.Pool,
    name: str,
    body: QueueRequest,
    by: Principal,
    teams: Teams | None = None,
    conditions: Preconditions = NO_CONDITIONS,
) -> tuple[QueueConfigView, bool]:
    """Create or replace queue ``name`` (``conditions``: module contract). A
    queue for a team the scheduler has never seen (no queue of it, not even the implicit one
    its first job makes, which came through submission) is checked with ``teams`` once the
    rest of the request is valid (None: the caller vouches for the team, as the scheduler's
    own tests do); a queue keeps its team, so replacing one asks nothing."""
    check_name(name)
    if teams is not None:
        async with pool.acquire() as conn:
            await _check_references(conn, body)
            seen = await admin_repo.queue_of_team(conn, body.team) is not None
            tag = await _queue_tag(conn, name)
        replaced = tag is not None
        conditions.check(f"queue {name}", tag)  # before asking another service
        # Asked outside the scheduling lock: it is a request to another service.
        if not seen and not replaced:
            await teams.require(body.team, "team")
    async with _writing(pool, by, "put queue", name, body) as conn:
        conditions.check(f"queue {name}", await _queue_tag(conn, name))
        await _check_references(conn, body)
        return await _write_queue(conn, name, body)


async def patch_queue(
    pool: asyncpg.Pool,
    name: str,
    patch: Mapping[str, Any],
    by: Principal,
    conditions: Preconditions = NO_CONDITIONS,
) -> QueueConfigView:
    """Change the fields of queue ``name`` that ``patch`` names (JSON Merge Patch of its
    ``PUT`` body, ``shared.merge_patch``) and keep the rest, read and written under the
    scheduling lock so no other change falls between. The result is judged as a ``PUT`` of
    it would be; ``NotFound`` when there is no such queue (a patch never creates one)."""
    check_name(name)
    async with _writing(pool, by, "patch queue", name, patch) as conn:
        row = await admin_repo.queue(conn, name)
        if row is None:
            raise NotFound(f"no queue {name}; create it with PUT /v1/admin/queues/{name}")
        current = queue_config_view(row, await admin_repo.quotas(conn, [name]))
        conditions.check(f"queue {name}", queue_tag(current))
        body = patched(QueueRequest, queue_request_of(current), patch)
        await _check_references(conn, body)
        view, _ = await _write_queue(conn, name, body)
    return view


async def _write_queue(
    conn: asyncpg.Connection, name: str, body: QueueRequest
) -> tuple[QueueConfigView, bool]:
    """Store ``body`` as queue ``name`` (under the lock, references checked): its view, and
    whether it was created."""
    existing = await admin_repo.queue(conn, name)
    current = await admin_repo.queue_of_team(conn, body.team)
    created = existing is None
    if existing is not None and existing["team"] != body.team:
        raise RequestInvalid.one(
            "team", f"queue {name} belongs to team {existing['team']}; a queue keeps its team"
        )
    if existing is None and current is not None and not current["implicit"]:
        raise Conflict(
            f"team {body.team} already has queue {current['name']}",
            field="team",
            message=f"a team has one queue, and {body.team}'s is {current['name']}",
        )
    if existing is None and current is not None:
        await admin_repo.adopt_implicit_queue(conn, current["name"], name, body.cohort, body.weight)
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
    row = await admin_repo.queue(conn, name)
    assert row is not None
    return queue_config_view(row, await admin_repo.quotas(conn, [name])), created


async def delete_queue(
    pool: asyncpg.Pool, name: str, by: Principal, conditions: Preconditions = NO_CONDITIONS
) -> None:
    async with _writing(pool, by, "delete queue", name) as conn:
        row = await admin_repo.queue(conn, name)
        if row is None:
            raise NotFound(f"no queue {name}")
        conditions.check(f"queue {name}", await _queue_tag(conn, name))
        _refuse_if_used(
            f"queue {name}", {"unfinished jobs": await admin_repo.unfinished_jobs(conn, queue=name)}
        )
        if await admin_repo.queue_has_jobs(conn, name):
            # Finished jobs still name it (a foreign key): they keep it as their team's
            # implicit queue, which a submission would make anyway.
            await admin_repo.replace_quotas(conn, name, [])
            await admin_repo.make_queue_implicit(conn, name, implicit_queue(row["team"]))
        else:
            await admin_repo.delete_queue(conn, name)


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


QUEUES = paging.Cursor("GET /v1/admin/queues", paging.text)


async def list_queues(
    pool: asyncpg.Pool, limit: int, after: str | None = None
) -> tuple[list[QueueConfigView], str | None]:
    """A page of queues by name (at most ``limit``, after the cursor ``after``) with their
    quotas, and the cursor of the next page (None: this is the last)."""
    key = QUEUES.read(after)
    async with pool.acquire() as conn, conn.transaction(isolation="repeatable_read", readonly=True):
        fetched = await admin_repo.queues(conn, limit + 1, key[0] if key else "")
        rows, more = paging.split(fetched, limit)
        quotas = await admin_repo.quotas(conn, [r["name"] for r in rows])
    cursor = QUEUES.write(rows[-1]["name"]) if more else None
    return [queue_config_view(r, quotas) for r in rows], cursor


async def get_queue(pool: asyncpg.Pool, name: str) -> QueueConfigView:
    async with pool.acquire() as conn, conn.transaction(isolation="repeatable_read", readonly=True):
        row = await admin_repo.queue(conn, name)
        quotas = await admin_repo.quotas(conn, [name])
    if row is None:
        raise NotFound(f"no queue {name}")
    return queue_config_view(row, quotas)


# --- priority classes ------------------------------------------------------------------


async def put_priority_class(
    pool: asyncpg.Pool,
    name: str,
    body: PriorityClassRequest,
    by: Principal,
    conditions: Preconditions = NO_CONDITIONS,
) -> tuple[PriorityClassView, bool]:
    """Create or replace priority class ``name`` (``conditions``: module contract)."""
    check_name(name)
    async with _writing(pool, by, "put priority-class", name, body) as conn:
        conditions.check(f"priority class {name}", await _priority_class_tag(conn, name))
        return await _write_priority_class(conn, name, body)


async def patch_priority_class(
    pool: asyncpg.Pool,
    name: str,
    patch: Mapping[str, Any],
    by: Principal,
    conditions: Preconditions = NO_CONDITIONS,
) -> PriorityClassView:
    """Change the fields of priority class ``name`` that ``patch`` names, keep the rest (as
    ``patch_queue``)."""
    check_name(name)
    async with _writing(pool, by, "patch priority-class", name, patch) as conn:
        row = await admin_repo.priority_class(conn, name)
        if row is None:
            raise NotFound(
                f"no priority class {name}; create it with PUT /v1/admin/priority-classes/{name}"
            )
        conditions.check(f"priority class {name}", priority_class_tag(priority_class_view(row)))
        current = priority_class_view(row).model_dump(exclude={"name"})
        body = patched(PriorityClassRequest, current, patch)
        view, _ = await _write_priority_class(conn, name, body)
    return view


async def _write_priority_class(
    conn: asyncpg.Connection, name: str, body: PriorityClassRequest
) -> tuple[PriorityClassView, bool]:
    created = await admin_repo.upsert_priority_class(
        conn, name, body.value, body.preemptible, body.min_runtime_seconds, body.description
    )
    row = await admin_repo.priority_class(conn, name)
    assert row is not None
    return priority_class_view(row), created


async def delete_priority_class(
    pool: asyncpg.Pool, name: str, by: Principal, conditions: Preconditions = NO_CONDITIONS
) -> None:
    async with _writing(pool, by, "delete priority-class", name) as conn:
        tag = await _priority_class_tag(conn, name)
        if tag is None:
            raise NotFound(f"no priority class {name}")
        conditions.check(f"priority class {name}", tag)
        unfinished = await admin_repo.unfinished_jobs(conn, priority_class=name)
        _refuse_if_used(f"priority class {name}", {"unfinished jobs": unfinished})
        await admin_repo.delete_priority_class(conn, name)


PRIORITY_CLASSES = paging.Cursor("GET /v1/admin/priority-classes", paging.int32, paging.text)


async def list_priority_classes(
    pool: asyncpg.Pool, limit: int, after: str | None = None
) -> tuple[list[PriorityClassView], str | None]:
    """A page of priority classes, highest value first, and the cursor of the next (None:
    the last)."""
    key = PRIORITY_CLASSES.read(after)
    async with pool.acquire() as conn:
        fetched = await admin_repo.priority_classes(
            conn, limit + 1, (key[0], key[1]) if key else None
        )
    rows, more = paging.split(fetched, limit)
    cursor = PRIORITY_CLASSES.write(rows[-1]["value"], rows[-1]["name"]) if more else None
    return [priority_class_view(r) for r in rows], cursor


async def get_priority_class(pool: asyncpg.Pool, name: str) -> PriorityClassView:
    async with pool.acquire() as conn:
        row = await admin_repo.priority_class(conn, name)
    if row is None:
        raise NotFound(f"no priority class {name}")
    return priority_class_view(row)
