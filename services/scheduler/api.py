"""The scheduler's HTTP app: health, readiness with the election role, the operator's queue
view and the admin API.

Contract:
- Every route but the probes needs the operator token or a user token (401 otherwise;
  ``shared.access``). ``GET /v1/queue`` (the whole cluster, each queue's first
  ``PENDING_SHOWN`` waiting jobs and how many wait), ``GET /v1/queue/{name}/pending`` (all of
  a queue's waiting jobs, a page at a time: ``shared.paging``) and every admin write are for
  operators (403 for users); the admin reads (flavors, cohorts, queues, priority classes)
  are open to every authenticated user, who needs them to write a job spec; the node
  inventory's are operators' (as the node list). Every admin write is recorded in the audit
  log (``GET /v1/audit``, operators).
- They read and write PostgreSQL directly, so they work on every replica, leader or not.
- Admin routes: ``GET /v1/admin/flavors``, ``GET|PUT|DELETE /v1/admin/flavors/{name}``, and
  the same for ``cohorts``, ``queues``, ``priority-classes`` and ``node-inventory`` (by node
  id: what each node has, which its heartbeats cannot exceed; ``admin.put_node_declaration``);
  ``PATCH`` of a queue, a priority class or a node's declaration changes only the fields its
  JSON Merge Patch names (404 when there is none).
  Every ``PUT``, ``PATCH`` and ``DELETE`` of them is conditional
  (``shared.http_app.Preconditions``): the ``GET`` of one, and the answer of its ``PUT`` or
  ``PATCH``, carries ``ETag``; with ``If-Match: <that ETag>`` a write proceeds only while
  the resource is as it was read (412 naming what changed when another change fell
  between), with ``If-None-Match: *`` only when the resource does not exist (a ``PUT``
  only creates; 412 when it exists), with ``If-Match: *`` only when it does (412 for a
  ``PUT`` of none; a ``PATCH`` or ``DELETE`` of none is 404 as ever). The four lists come a page at
  a time (``shared.paging``: ``limit`` 1 to ``ADMIN_PAGE_MAX``, default 100, the next page in
  ``Link: <...>; rel="next"``). ``PUT`` creates (201) or
  replaces (200) and returns the resource; ``DELETE`` answers 204, or 409 naming what still
  uses the resource (see ``admin``). ``POST /v1/admin/nodes/{node_id}/cordon`` (body
  ``{"reason": ...}``) and ``POST /v1/admin/nodes/{node_id}/uncordon`` (operators; 200 with
  the node's cordon, 404 for an unknown node) take a node out of placement and back;
  ``GET /v1/admin/nodes/{node_id}/cordon`` (operators) is that cordon with its ``ETag``,
  and both writes are conditional on it as the others (``If-Match``, 412).
  ``DELETE /v1/admin/nodes/{node_id}`` (operators; 204) retires a node taken out for good:
  409 naming why for a ready node or one that still holds a live allocation, 404 for an
  unknown node (``admin.retire_node``). ``GET /v1/queue`` leaves retired nodes out unless
  asked with ``?retired=true``.
- Errors are JSON ``{"detail": ..., "errors": [{"field": ..., "message": ...}]}``
  (``shared.http_errors``): 422 for invalid input (every bad field named, nothing stored),
  401/404/409 as usual, 500 with a generic message (the traceback goes to the log).
- Admin bodies are read up to ``ADMIN_BODY_MAX_BYTES`` (413 past it, checked against
  ``Content-Length`` and while the body streams in), then screened by
  ``shared.http_errors.check_json`` (invalid UTF-8, duplicate keys, deep nesting, numbers
  beyond 64 bits or a double, control characters: 422 naming the field; tab, newline and
  carriage return are allowed only in ``description``) before the model sees them.
- ``GET /readyz`` adds ``role`` (``leader`` or ``follower``); a follower is ready (it serves
  reads and stands by).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Annotated, Any
from urllib.parse import quote

import asyncpg
from litestar import Litestar, Request, Response, Router, delete, get, patch, post, put
from litestar.di import NamedDependency
from litestar.handlers import HTTPRouteHandler
from litestar.openapi import ResponseSpec
from litestar.params import FromPath, PathParameter, QueryParameter
from litestar.types import Guard

from trainyard_platform.services.scheduler import admin
from trainyard_platform.services.scheduler import admin_repository as admin_repo
from trainyard_platform.services.scheduler import repository as repo
from trainyard_platform.services.scheduler.admin import Conflict, NotFound
from trainyard_platform.services.scheduler.admin_schemas import (
    FLAVOR_PATTERN,
    NAME_PATTERN,
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
)
from trainyard_platform.services.scheduler.schemas import (
    PENDING_SHOWN,
    NodeCordonView,
    PendingJobView,
    QueueView,
    pending_view,
    queue_view,
)
from trainyard_platform.shared import paging
from trainyard_platform.shared.access import Teams, needs
from trainyard_platform.shared.audit import audit_route
from trainyard_platform.shared.http_app import (
    ETAG,
    Conditions,
    error_responses,
    json_request_body,
    merge_patch_request_body,
    read_merge_patch,
    service_app,
    tagged,
)
from trainyard_platform.shared.http_errors import parse_body, read_json_body
from trainyard_platform.shared.identity import Principal, Role

AnyRequest = Request[Any, Any, Any]
Caller = NamedDependency[Principal]
TeamCheck = NamedDependency[Teams]
ADMIN_BODY_MAX_BYTES = 64 * 1024
"""The largest admin body accepted (a queue with 100 quotas is a few KB)."""
ADMIN_PAGE_MAX = 500
"""The most rows of a page of ``GET /v1/admin/{flavors,cohorts,queues,priority-classes,
node-inventory}``."""
PENDING_PAGE_MAX = 1000
PENDING = paging.Cursor(
    "GET /v1/queue/{name}/pending", paging.int32, paging.instant, paging.integer
)
"""A page's position in one queue's waiting jobs (``of`` the queue's name)."""
"""The most rows of a page of ``GET /v1/queue/{name}/pending``."""
Readiness = Callable[[], Awaitable[tuple[bool, dict[str, Any]]]]
"""(ready, body) of ``GET /readyz``."""


def _created(view: Any, created: bool, tag: Callable[[Any], str]) -> Response[Any]:
    return tagged(view, tag(view), status_code=201 if created else 200)


def _put_responses(view: type[Any], *more: int) -> dict[int, ResponseSpec]:
    """A ``PUT``: 201 created besides 200 replaced; 409 when the change contradicts the
    configuration in place, 412 for a precondition (``If-Match``, ``If-None-Match``) that
    fails, 413 for a body over ``ADMIN_BODY_MAX_BYTES``; ``more``: its own."""
    created = ResponseSpec(view, description="created", generate_examples=False)
    return {201: created, **error_responses(409, 412, 413, 415, *more)}


DELETE_RESPONSES = error_responses(404, 409, 412)
"""A ``DELETE``: 404 for none, 409 naming what still uses it, 412 for a precondition."""


def admin_router(pool: asyncpg.Pool) -> Router:
    @get("/flavors")
    async def list_flavors(
        limit: Annotated[int, QueryParameter(ge=1, le=ADMIN_PAGE_MAX)] = 100,
        after: Annotated[str | None, QueryParameter(description="from the Link header")] = None,
    ) -> Response[list[FlavorView]]:
        """A page of flavors by name; the next in ``Link`` (``shared.paging``)."""
        flavors, cursor = await admin.list_flavors(pool, limit, after)
        return paging.listed(flavors, "/v1/admin/flavors", {"limit": str(limit)}, cursor)

    @get("/flavors/{name:str}", response_headers=[ETAG], responses=error_responses(404))
    async def get_flavor(name: FromPath[str]) -> Response[FlavorView]:
        """The flavor, with its ``ETag`` (for ``If-Match``)."""
        view = await admin.get_flavor(pool, name)
        return tagged(view, admin.flavor_tag(view))

    @put(
        "/flavors/{name:str}",
        opt=needs(Role.OPERATOR),
        operation_class=json_request_body(FlavorRequest),
        responses=_put_responses(FlavorView),
    )
    async def put_flavor(
        name: Annotated[str, PathParameter(schema_extra={"pattern": FLAVOR_PATTERN})],
        request: AnyRequest,
        principal: Caller,
        conditions: Conditions,
    ) -> Response[FlavorView]:
        body = await _body(FlavorRequest, request)
        return _created(
            *await admin.put_flavor(pool, name, body, principal, conditions), admin.flavor_tag
        )

    @delete("/flavors/{name:str}", opt=needs(Role.OPERATOR), responses=DELETE_RESPONSES)
    async def delete_flavor(
        name: FromPath[str],
        principal: Caller,
        conditions: Conditions,
    ) -> None:
        await admin.delete_flavor(pool, name, principal, conditions)

    @get("/cohorts")
    async def list_cohorts(
        limit: Annotated[int, QueryParameter(ge=1, le=ADMIN_PAGE_MAX)] = 100,
        after: Annotated[str | None, QueryParameter(description="from the Link header")] = None,
    ) -> Response[list[CohortView]]:
        """A page of cohorts by name; the next in ``Link`` (``shared.paging``)."""
        cohorts, cursor = await admin.list_cohorts(pool, limit, after)
        return paging.listed(cohorts, "/v1/admin/cohorts", {"limit": str(limit)}, cursor)

    @get("/cohorts/{name:str}", response_headers=[ETAG], responses=error_responses(404))
    async def get_cohort(name: FromPath[str]) -> Response[CohortView]:
        """The cohort, with its ``ETag`` (for ``If-Match``)."""
        view = await admin.get_cohort(pool, name)
        return tagged(view, admin.cohort_tag(view))

    @put(
        "/cohorts/{name:str}",
        opt=needs(Role.OPERATOR),
        operation_class=json_request_body(CohortRequest),
        responses=_put_responses(CohortView),
    )
    async def put_cohort(
        name: Annotated[str, PathParameter(schema_extra={"pattern": NAME_PATTERN})],
        request: AnyRequest,
        principal: Caller,
        conditions: Conditions,
    ) -> Response[CohortView]:
        body = await _body(CohortRequest, request)
        return _created(
            *await admin.put_cohort(pool, name, body, principal, conditions), admin.cohort_tag
        )

    @delete("/cohorts/{name:str}", opt=needs(Role.OPERATOR), responses=DELETE_RESPONSES)
    async def delete_cohort(
        name: FromPath[str],
        principal: Caller,
        conditions: Conditions,
    ) -> None:
        await admin.delete_cohort(pool, name, principal, conditions)

    @get("/queues")
    async def list_queues(
        limit: Annotated[int, QueryParameter(ge=1, le=ADMIN_PAGE_MAX)] = 100,
        after: Annotated[str | None, QueryParameter(description="from the Link header")] = None,
    ) -> Response[list[QueueConfigView]]:
        """A page of queues by name; the next in ``Link: <...>; rel="next"`` (``shared.paging``,
        as ``GET /v1/jobs``): every team has at least its implicit queue."""
        queues, cursor = await admin.list_queues(pool, limit, after)
        return paging.listed(queues, "/v1/admin/queues", {"limit": str(limit)}, cursor)

    @get("/queues/{name:str}", response_headers=[ETAG], responses=error_responses(404))
    async def get_queue(name: FromPath[str]) -> Response[QueueConfigView]:
        """The queue and its quotas, with its ``ETag`` (for ``If-Match``)."""
        view = await admin.get_queue(pool, name)
        return tagged(view, admin.queue_tag(view))

    @put(
        "/queues/{name:str}",
        opt=needs(Role.OPERATOR),
        operation_class=json_request_body(QueueRequest),
        responses=_put_responses(QueueConfigView),
    )
    async def put_queue(
        name: Annotated[str, PathParameter(schema_extra={"pattern": NAME_PATTERN})],
        request: AnyRequest,
        principal: Caller,
        teams: TeamCheck,
        conditions: Conditions,
    ) -> Response[QueueConfigView]:
        """Create the queue (201) or replace it whole (200); with ``If-Match: <ETag>`` only
        replace it as it was read, with ``If-None-Match: *`` only create it (412 when it
        exists), with ``If-Match: *`` only replace it (412 when there is none); nothing
        changed on a 412."""
        body = await _body(QueueRequest, request)
        view, created = await admin.put_queue(pool, name, body, principal, teams, conditions)
        return _created(view, created, admin.queue_tag)

    @patch(
        "/queues/{name:str}",
        opt=needs(Role.OPERATOR),
        operation_class=merge_patch_request_body(QueueRequest),
        responses=error_responses(404, 409, 412, 413, 415),
    )
    async def patch_queue(
        name: Annotated[str, PathParameter(schema_extra={"pattern": NAME_PATTERN})],
        request: AnyRequest,
        principal: Caller,
        conditions: Conditions,
    ) -> Response[QueueConfigView]:
        """Change only the fields the body names (a JSON Merge Patch, RFC 7396, of the
        ``PUT`` body: ``{"weight": 2}``, ``{"quotas": {"a100": {"nominal": 16}}}``, ``null``
        to remove a quota or put a field back to its default); the rest stays. 412 with
        ``If-Match: <ETag>`` when it changed since, or ``If-None-Match: *`` (the queue
        exists), nothing changed."""
        changes = await _patch_body(request)
        view = await admin.patch_queue(pool, name, changes, principal, conditions)
        return tagged(view, admin.queue_tag(view))

    @delete("/queues/{name:str}", opt=needs(Role.OPERATOR), responses=DELETE_RESPONSES)
    async def delete_queue(
        name: FromPath[str],
        principal: Caller,
        conditions: Conditions,
    ) -> None:
        await admin.delete_queue(pool, name, principal, conditions)

    @get("/priority-classes")
    async def list_classes(
        limit: Annotated[int, QueryParameter(ge=1, le=ADMIN_PAGE_MAX)] = 100,
        after: Annotated[str | None, QueryParameter(description="from the Link header")] = None,
    ) -> Response[list[PriorityClassView]]:
        """A page of classes, highest value first; the next in ``Link`` (``shared.paging``)."""
        classes, cursor = await admin.list_priority_classes(pool, limit, after)
        return paging.listed(classes, "/v1/admin/priority-classes", {"limit": str(limit)}, cursor)

    @get("/priority-classes/{name:str}", response_headers=[ETAG], responses=error_responses(404))
    async def get_class(name: FromPath[str]) -> Response[PriorityClassView]:
        """The priority class, with its ``ETag`` (for ``If-Match``)."""
        view = await admin.get_priority_class(pool, name)
        return tagged(view, admin.priority_class_tag(view))

    @put(
        "/priority-classes/{name:str}",
        opt=needs(Role.OPERATOR),
        operation_class=json_request_body(PriorityClassRequest),
        responses=_put_responses(PriorityClassView),
    )
    async def put_class(
        name: Annotated[str, PathParameter(schema_extra={"pattern": NAME_PATTERN})],
        request: AnyRequest,
        principal: Caller,
        conditions: Conditions,
    ) -> Response[PriorityClassView]:
        """As ``PUT /v1/admin/queues/{name}``, of a priority class."""
        body = await _body(PriorityClassRequest, request)
        made = await admin.put_priority_class(pool, name, body, principal, conditions)
        return _created(*made, admin.priority_class_tag)

    @patch(
        "/priority-classes/{name:str}",
        opt=needs(Role.OPERATOR),
        operation_class=merge_patch_request_body(PriorityClassRequest),
        responses=error_responses(404, 412, 413, 415),
    )
    async def patch_class(
        name: Annotated[str, PathParameter(schema_extra={"pattern": NAME_PATTERN})],
        request: AnyRequest,
        principal: Caller,
        conditions: Conditions,
    ) -> Response[PriorityClassView]:
        """Change only the fields the body names (a JSON Merge Patch of the ``PUT`` body);
        conditional as ``PATCH /v1/admin/queues/{name}``."""
        changes = await _patch_body(request)
        view = await admin.patch_priority_class(pool, name, changes, principal, conditions)
        return tagged(view, admin.priority_class_tag(view))

    @delete("/priority-classes/{name:str}", opt=needs(Role.OPERATOR), responses=DELETE_RESPONSES)
    async def delete_class(
        name: FromPath[str],
        principal: Caller,
        conditions: Conditions,
    ) -> None:
        await admin.delete_priority_class(pool, name, principal, conditions)

    @get("/node-inventory", opt=needs(Role.OPERATOR))
    async def list_node_inventory(
        limit: Annotated[int, QueryParameter(ge=1, le=ADMIN_PAGE_MAX)] = 100,
        after: Annotated[str | None, QueryParameter(description="from the Link header")] = None,
    ) -> Response[list[NodeDeclarationView]]:
        """A page of node declarations by node id, each with what its node claims and what
        the declaration caps of it; the next in ``Link`` (``shared.paging``)."""
        views, cursor = await admin.list_node_declarations(pool, limit, after)
        return paging.listed(views, "/v1/admin/node-inventory", {"limit": str(limit)}, cursor)

    @get(
        "/node-inventory/{node_id:str}",
        response_headers=[ETAG],
        opt=needs(Role.OPERATOR),
        responses=error_responses(404),
    )
    async def get_node_declaration(node_id: FromPath[str]) -> Response[NodeDeclarationView]:
        """The node's declaration, what it claims and what is capped, with its ``ETag``
        (for ``If-Match``)."""
        view = await admin.get_node_declaration(pool, node_id)
        return tagged(view, admin.declaration_tag(view))

    @put(
        "/node-inventory/{node_id:str}",
        opt=needs(Role.OPERATOR),
        operation_class=json_request_body(NodeDeclarationRequest),
        responses=_put_responses(NodeDeclarationView),
    )
    async def put_node_declaration(
        node_id: Annotated[str, PathParameter(schema_extra={"pattern": NODE_ID_PATTERN})],
        request: AnyRequest,
        principal: Caller,
        conditions: Conditions,
    ) -> Response[NodeDeclarationView]:
        """Declare what the node has: its heartbeats never get more (a node claiming more
        GPUs gets the declared count, one claiming another flavor none), from its next
        heartbeat. Conditional as ``PUT /v1/admin/queues/{name}``."""
        body = await _body(NodeDeclarationRequest, request)
        made = await admin.put_node_declaration(pool, node_id, body, principal, conditions)
        return _created(*made, admin.declaration_tag)

    @patch(
        "/node-inventory/{node_id:str}",
        opt=needs(Role.OPERATOR),
        operation_class=merge_patch_request_body(NodeDeclarationRequest),
        responses=error_responses(404, 412, 413, 415),
    )
    async def patch_node_declaration(
        node_id: Annotated[str, PathParameter(schema_extra={"pattern": NODE_ID_PATTERN})],
        request: AnyRequest,
        principal: Caller,
        conditions: Conditions,
    ) -> Response[NodeDeclarationView]:
        """Change only the fields the body names (a JSON Merge Patch of the ``PUT`` body);
        conditional as ``PATCH /v1/admin/queues/{name}``."""
        changes = await _patch_body(request)
        view = await admin.patch_node_declaration(pool, node_id, changes, principal, conditions)
        return tagged(view, admin.declaration_tag(view))

    @delete("/node-inventory/{node_id:str}", opt=needs(Role.OPERATOR), responses=DELETE_RESPONSES)
    async def delete_node_declaration(
        node_id: FromPath[str],
        principal: Caller,
        conditions: Conditions,
    ) -> None:
        """Forget the node's declaration: from its next heartbeat it is undeclared (no GPU
        under ``TRAINYARD_SCHEDULER_NODE_INVENTORY=required``)."""
        await admin.delete_node_declaration(pool, node_id, principal, conditions)

    @get(
        "/nodes/{node_id:str}/cordon",
        response_headers=[ETAG],
        opt=needs(Role.OPERATOR),
        responses=error_responses(404),
    )
    async def get_node_cordon(node_id: FromPath[str]) -> Response[NodeCordonView]:
        """The node's cordon (null: it takes new work), with its ``ETag`` (for ``If-Match``
        on ``cordon`` and ``uncordon``)."""
        view = await admin.get_node_cordon(pool, node_id)
        return tagged(view, admin.cordon_tag(view))

    @post(
        "/nodes/{node_id:str}/cordon",
        opt=needs(Role.OPERATOR),
        operation_class=json_request_body(CordonRequest),
        responses=error_responses(404, 412, 413, 415),
        status_code=200,
    )
    async def cordon_node(
        node_id: FromPath[str], request: AnyRequest, principal: Caller, conditions: Conditions
    ) -> Response[NodeCordonView]:
        """No new allocation on the node until uncordoned; its running jobs go on. With
        ``If-Match: <ETag>`` (of ``GET .../cordon``) only while its cordon is as it was
        read; 412 when it changed since, nothing changed."""
        body = await _body(CordonRequest, request)
        view = await admin.cordon_node(pool, node_id, body, principal, conditions)
        return tagged(view, admin.cordon_tag(view))

    @post(
        "/nodes/{node_id:str}/uncordon",
        opt=needs(Role.OPERATOR),
        responses=error_responses(404, 412),
        status_code=200,
    )
    async def uncordon_node(
        node_id: FromPath[str], principal: Caller, conditions: Conditions
    ) -> Response[NodeCordonView]:
        """The node takes new work again (an automatic cordon too is lifted); conditional
        as ``cordon``."""
        view = await admin.uncordon_node(pool, node_id, principal, conditions)
        return tagged(view, admin.cordon_tag(view))

    @delete("/nodes/{node_id:str}", opt=needs(Role.OPERATOR), responses=error_responses(404, 409))
    async def retire_node(node_id: FromPath[str], principal: Caller) -> None:
        """Retire a node taken out for good: it is left out of placement, the node and GPU
        gauges (the lost-node alerts), its flavor's nodes and the node list; its history
        stays. Refused (409) while it is ready or holds a live allocation; its next heartbeat
        makes it an ordinary node again."""
        await admin.retire_node(pool, node_id, principal)

    return Router(
        "/v1/admin",
        route_handlers=[
            get_node_cordon,
            cordon_node,
            uncordon_node,
            retire_node,
            list_node_inventory,
            get_node_declaration,
            put_node_declaration,
            patch_node_declaration,
            delete_node_declaration,
            list_flavors,
            get_flavor,
            put_flavor,
            delete_flavor,
            list_cohorts,
            get_cohort,
            put_cohort,
            delete_cohort,
            list_queues,
            get_queue,
            put_queue,
            patch_queue,
            delete_queue,
            list_classes,
            get_class,
            put_class,
            patch_class,
            delete_class,
        ],
    )


async def _body(model: type[Any], request: AnyRequest) -> Any:
    body = await read_json_body(
        request, ADMIN_BODY_MAX_BYTES, free_text=lambda path: path == "description"
    )
    return parse_body(model, body)


async def _patch_body(request: AnyRequest) -> dict[str, Any]:
    """A JSON Merge Patch body, read and screened as ``_body``'s; it must be an object."""
    return await read_merge_patch(
        request, ADMIN_BODY_MAX_BYTES, free_text=lambda path: path == "description"
    )


def readiness_handler(readiness: Readiness) -> HTTPRouteHandler:
    @get("/readyz", include_in_schema=False)
    async def readyz() -> Response[dict[str, Any]]:
        ready, body = await readiness()
        return Response(body, status_code=200 if ready else 503)

    return readyz


def create_app(
    pool: asyncpg.Pool,
    guard: Guard,
    health_handlers: Sequence[HTTPRouteHandler] = (),
    cors_origins: Sequence[str] = (),
) -> Litestar:
    """The scheduler's app over ``pool`` with the given health routes (see the module)."""

    @get("/v1/queue", opt=needs(Role.OPERATOR))
    async def queue(
        retired: Annotated[
            bool, QueryParameter(description="true: list retired nodes too (retired_at set)")
        ] = False,
    ) -> QueueView:
        async with (
            pool.acquire() as conn,
            conn.transaction(isolation="repeatable_read", readonly=True),
        ):
            return queue_view(
                await repo.all_nodes(conn, retired),
                await repo.running_allocations(conn),
                await repo.pending_heads(conn, PENDING_SHOWN),
                await admin_repo.queues(conn),
                await admin_repo.quotas(conn),
                await repo.stopping_leases(conn),
            )

    @get(
        "/v1/queue/{name:str}/pending",
        opt=needs(Role.OPERATOR),
        responses=error_responses(404, 422),
    )
    async def waiting(
        name: FromPath[str],
        limit: Annotated[int, QueryParameter(ge=1, le=PENDING_PAGE_MAX)] = 100,
        after: Annotated[str | None, QueryParameter(description="from the Link header")] = None,
    ) -> Response[list[PendingJobView]]:
        """A page of the queue's waiting jobs in queue order; the next in ``Link: <...>;
        rel="next"`` (``shared.paging``): its line has no bound."""
        key = PENDING.read(after, of=name)
        async with pool.acquire() as conn:
            if await admin_repo.queue(conn, name) is None:
                raise NotFound(f"no queue {name}")
            fetched = await repo.pending_page(conn, name, limit + 1, key)
        rows, more = paging.split(fetched, limit)
        cursor = PENDING.write(*repo.pending_key(rows[-1]), of=name) if more else None
        path = f"/v1/queue/{quote(name, safe='')}/pending"
        return paging.listed([pending_view(r) for r in rows], path, {"limit": str(limit)}, cursor)

    return service_app(
        "scheduler",
        [*health_handlers, queue, waiting, admin_router(pool), audit_route(pool, "scheduler")],
        guard,
        statuses={NotFound: 404, Conflict: 409},
        cors_origins=cors_origins,
    )
