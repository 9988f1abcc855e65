"""How every service builds its Litestar app, so all of them behave the same at the edge.

``service_app`` adds, to the service's routes: the app-level guard (``shared.access``), the
``principal`` dependency, the shared error shapes (``shared.http_errors``), the screen of path
and query parameters (``check_parameters``: no control characters; on a documented route no
query parameter it does not declare, none it reads once given twice), one tracing span per
request, and an OpenAPI document that declares the bearer-token security scheme and the
error body, so clients and fuzzers see what the service really enforces.

The document is complete (``tests/integration/test_openapi_fuzz.py`` holds every service to
it):
- Every route documents the errors any route may answer (``EVERY_ROUTE``: 400, 401, 403, 422,
  429, 503) and those its service adds (``service_app(errors=...)``) with the
  ``ErrorBody`` schema; a route adds its own (404, 409, 413, 415) with
  ``responses=error_responses(...)``, and a second success status (201 created, 200 already
  there) with ``ResponseSpec``. One mechanism: Litestar's ``responses=``.
- A route that reads its JSON body by hand (to bound and screen the raw bytes before any
  model sees them) declares the model it then validates with
  ``operation_class=json_request_body(Model)``: the document shows the model's JSON Schema
  as the request body, while the handler still reads the bytes itself
  (``bytes_request_body`` for a raw upload). A ``PATCH`` that changes only the fields it
  names declares ``merge_patch_request_body(Model)`` (a JSON Merge Patch of the ``PUT``
  body), reads it with ``read_merge_patch`` and judges the document it makes with
  ``patched``, as the ``PUT`` would.
- Conditional requests (RFC 9110, section 13), one mechanism for every write of a resource
  (``PUT``, ``PATCH``, ``DELETE``, and a ``POST`` that changes one resource, such as a
  node's cordon): its ``GET`` (and the write's own answer) carries ``ETag``, the
  ``entity_tag`` of what is stored (``tagged``); the write takes ``If-Match`` and
  ``If-None-Match`` as the app dependency ``conditions: Conditions`` (parameters of types
  ``IfMatch`` and ``IfNoneMatch``, read by ``preconditions``) and, under the resource's
  lock and before changing anything, calls ``check`` with the resource's tag now (None:
  it does not exist). ``If-Match: "<etag>"`` proceeds only when the resource is as it was
  read (a read-modify-write that another change fell into is 412, not a silent
  overwrite); ``If-Match: *`` only when it exists; ``If-None-Match: *`` only when it does
  not (a ``PUT`` that must create, not replace what another admin made since the caller's
  ``PATCH`` found none); a false one raises ``shared.http_errors.PreconditionFailed``
  (412 naming the header and what changed). ``If-Match`` is judged first (section
  13.2.2). A ``PATCH`` or ``DELETE`` of a resource that is not there answers 404 whatever
  its conditions (section 13.2.1: preconditions are ignored where the request would fail
  without them), so ``If-Match`` on a missing resource is 412 only for a ``PUT``. A write
  without either header is unconditional, as before. Tags are strong; a weak one
  (``W/``), or any other value of either header, is 422 naming the header. Each such
  route documents 412 with ``error_responses``.

CORS (``cors_origins``, from ``TRAINYARD_CORS_ORIGINS``): off unless origins are configured;
then pages of exactly those origins (the web dashboard's) may call the API from a browser.
Preflights (``OPTIONS`` with ``Origin``) are answered before the guard, since browsers send
them without credentials; every other request still needs its token and role (401/403 keep
their CORS headers so the page can read them). No cookies are used (``allow_credentials`` is
off): the dashboard sends ``Authorization: Bearer``. ``Link`` (the next page), ``ETag``,
``Retry-After`` and ``Location`` are exposed to scripts.

Every answer, error or not and whatever route (or none) made it, carries ``EDGE_HEADERS``
unless it set that header itself (the dashboard's pages their own policy and caching): a
browser never sniffs a JSON or CSV body that repeats a job name or log line as HTML
(``nosniff``; no script or frame either: ``Content-Security-Policy``), no page of another
site frames an answer (``frame-ancestors``, and ``X-Frame-Options`` for older browsers), a
browser's or proxy's cache keeps nothing of a user's data (``no-store``), and no URL leaks
in a ``Referer``. They are set as the first message of the answer is sent (``before_send``),
so the 404 of a path that matches no route has them too.

Every ``GET`` route answers ``HEAD`` too (RFC 9110, section 9.3.2: load balancers' checks,
``curl -I``): the same guard, parameters, handler, status and headers, and no body. Where a
path has no ``HEAD`` route of its own, ``service_app`` adds one that shares the ``GET``
handler (``head_routes``), outside the OpenAPI document (it says no more than the ``GET``
operation does; ``opt[HEAD_OF_GET]`` marks it, and its query parameters are checked as the
``GET``'s); every answer to a ``HEAD`` leaves its body out, whatever made it (an error, a
401). A ``GET`` whose body costs work (objects read from the store: ``body_is_work``) gets
no copy, which would do that work and discard it: it has a ``HEAD`` of its own
(``head_of_get``, answered with ``head_answer``: the status and the ``GET``'s headers,
its ``ETag`` among them where it has one), and an app where it has none is not built. Its
``Content-Length`` is the ``GET``'s where that is known without the work (a model
version's artifact: its registered size), and absent where it is not (a page of logs, a
new presigned URL): never a guess. The OpenAPI document's own routes (``/schema``, which
Litestar adds as the app is built, after ``head_routes``) get theirs then
(``_head_of_added_gets``), their query left unchecked as their ``GET``'s is.

Conditional reads (RFC 9110, section 13.1.2), at the edge for every route: a ``GET`` or
``HEAD`` answered 200 with an ``ETag`` that the request's ``If-None-Match`` names (weak
comparison, or ``*``: ``none_match``) answers 304 instead, with its headers but no
``Content-Length``, ``Content-Type`` or body (``_not_modified``), so a client polling a
resource with the tag it holds reads nothing more, and ``GET`` and ``HEAD`` answer alike. A
route whose body is work checks ``none_match`` itself before doing it. A write's
``If-None-Match`` is its condition (``preconditions``), never a 304.
A ``GET`` route that answers with an ``ETag`` says so with ``response_headers=[ETAG]``
(Litestar's own mechanism: its 200 documents the header); ``service_app`` then documents
its conditional read on it, one mechanism for every service: the 304 (``NOT_MODIFIED``,
no body) among its responses and the ``If-None-Match`` request header among its parameters
(``IF_NONE_MATCH_READ``, added by its operation class, since the edge reads it, not the
handler). Such a route keeps Litestar's default operation class; building an app where
one does not fails, naming the route.

``OPTIONS`` of a route (204, after the guard) names in ``Allow`` every method the route
serves, ``HEAD`` included, as its 405 does (``_allow_of``).

Building the app leaves the process's logging alone (``logging_config=None``): Litestar's
default set-up replaced the root handler with a queue-listener thread writing to the stderr
of that moment, in its own format, and kept the ``litestar`` logger on it; its records now
go, like every other, to the one handler of ``shared.logs``.

Guards are called with the route's handler itself, not with the copy Litestar makes of it on
every request (``authorize_connection``'s ``copy(self)``, about 3% of a submission's CPU):
a guard reads the handler (its ``opt``), it never changes it.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from copy import copy
from dataclasses import dataclass, field
from types import MethodType
from typing import Annotated, Any, Final, TypeVar, cast

from litestar import HttpMethod, Litestar, Request, Response, Router, head
from litestar.config.cors import CORSConfig
from litestar.connection import ASGIConnection
from litestar.datastructures import MutableScopeHeaders, ResponseHeader
from litestar.di import NamedDependency, Provide
from litestar.enums import ParamType
from litestar.exceptions import ImproperlyConfiguredException
from litestar.handlers import HTTPRouteHandler
from litestar.openapi import OpenAPIConfig, ResponseSpec
from litestar.openapi.spec import (
    Components,
    OpenAPIMediaType,
    OpenAPIType,
    Operation,
    Parameter,
    RequestBody,
    Schema,
    SecurityScheme,
)
from litestar.params import HeaderParameter
from litestar.response import Stream
from litestar.routes import HTTPRoute
from litestar.types import ControllerRouterHandler, Guard, Message, Scope
from litestar.utils import join_paths
from pydantic import BaseModel

from trainyard_platform.shared.access import principal_dependency
from trainyard_platform.shared.http_errors import (
    ErrorBody,
    FieldError,
    PreconditionFailed,
    RequestInvalid,
    check_parameters,
    declare_query_parameters,
    exception_handlers,
    parse_body,
    read_json_body,
)
from trainyard_platform.shared.http_tracing import tracing_middleware
from trainyard_platform.shared.merge_patch import merge_patch

M = TypeVar("M", bound=BaseModel)
T = TypeVar("T")

ERRORS: Final[Mapping[int, str]] = {
    400: "malformed request (a bad Content-Length or Host header), refused before it is read",
    401: "missing, invalid, expired or revoked token (WWW-Authenticate: Bearer)",
    403: "the caller's role, or team, may not do this",
    404: "no such resource (or none the caller's team may see)",
    409: "conflicts with the resource's current state",
    412: "a precondition the request sets failed (If-Match with an ETag the resource no longer"
    " has, If-Match: * of a resource that does not exist, If-None-Match: * of one that does),"
    " nothing changed",
    413: "request body over this endpoint's limit",
    415: "the body must be Content-Type: application/json (UTF-8)",
    422: "invalid input: every bad field named in errors",
    429: "rate limit exceeded: retry after Retry-After seconds",
    503: "temporarily unavailable (the token cannot be checked now, or the database or bus is"
    " unreachable): retry after Retry-After seconds",
}
"""Every error status a Trainyard API answers, as its OpenAPI document describes it."""
EVERY_ROUTE: Final = (400, 401, 403, 422, 429, 503)
"""The errors any guarded route may answer: a request Litestar cannot read, no valid token, a
role or team below the route's, an invalid parameter, the user's rate limit spent (the
service's own, ``shared.ratelimit``, or submission's, which checking a user token spends
on every service), a token that cannot be checked now or a dependency that cannot be
reached."""


IfNoneMatch = Annotated[
    str | None,
    HeaderParameter(
        name="If-None-Match",
        schema_extra={"pattern": r"^\s*\*\s*$"},  # judged by preconditions, naming the header
        description="``*``: only when the resource does not exist (a PUT creates, never "
        "replaces); 412 when it does, nothing changed",
    ),
]
"""The ``If-None-Match`` header of a write (read with ``preconditions``)."""
IfMatch = Annotated[
    str | None,
    HeaderParameter(
        name="If-Match",
        # Judged by preconditions, naming the header; a weak tag (W/) is refused there.
        schema_extra={"pattern": r'^\s*(\*|"[\x21\x23-\x7e]*"(\s*,\s*"[\x21\x23-\x7e]*")*)\s*$'},
        description="the ``ETag`` the resource's ``GET`` (or the last write) answered: only "
        "when the resource is still as it was read; 412 when it changed since, nothing "
        "changed. ``*``: only when the resource exists (a PUT replaces, never creates); 412 "
        "when it does not",
    ),
]
"""The ``If-Match`` header of a write (read with ``preconditions``)."""

_ENTITY_TAG = re.compile(r'"([\x21\x23-\x7e]*)"')
"""A strong entity tag (RFC 9110, section 8.8.3): its opaque part, quoted."""


def entity_tag(state: BaseModel | Mapping[str, Any]) -> str:
    """The strong entity tag (the ``ETag`` header's value, quoted) of a resource whose stored
    state is ``state``: what a write of it sets, never what is computed when it is read (a
    budget's spending, a flavor's nodes), so that it changes exactly when a write changes
    the resource. The same state has the same tag on every replica and after a restart; a
    write that puts back what was read gives back its tag, which is right, since what the
    caller read is what is there."""
    document = state.model_dump(mode="json") if isinstance(state, BaseModel) else state
    text = json.dumps(document, sort_keys=True, separators=(",", ":"), default=str)
    return '"' + hashlib.sha256(text.encode()).hexdigest()[:32] + '"'


def tagged(content: T, tag: str, status_code: int = 200) -> Response[T]:
    """An answer of ``content``, the resource as it is now, with its ``ETag`` (``tag``, from
    ``entity_tag``): what a later write sends back as ``If-Match``."""
    return Response(content, status_code=status_code, headers={"ETag": tag})


@dataclass(frozen=True)
class Preconditions:
    """What a write's ``If-Match`` (``exists``: ``*``; ``tags``: the entity tags given, as
    sent, quotes included) and ``If-None-Match: *`` (``absent``) ask of its resource (module
    docstring, "Conditional requests")."""

    exists: bool = False
    absent: bool = False
    tags: tuple[str, ...] = ()

    def check(self, what: str, current: str | None) -> None:
        """Raise ``PreconditionFailed`` unless the conditions hold for ``what`` (``the
        budget of team ml``), ``current`` being its entity tag now (``entity_tag`` of what
        is stored), None when it does not exist. Call it under the resource's lock, before
        changing anything."""
        if (self.exists or self.tags) and current is None:
            asked = "If-Match: *" if self.exists else "If-Match"
            raise PreconditionFailed(
                "If-Match",
                f"{what} does not exist, and {asked} asks that it does"
                + ("" if self.exists else " as it was read (deleted since?)")
                + ": nothing changed (create it without the header)",
            )
        if self.tags and current not in self.tags:
            raise PreconditionFailed(
                "If-Match",
                f"{what} was changed since it was read (its ETag is now {current}, not "
                f"{', '.join(self.tags)}): nothing changed; read it again and make the "
                "change to what it is now",
            )
        if self.absent and current is not None:
            raise PreconditionFailed(
                "If-None-Match",
                f"{what} exists already, and If-None-Match: * asks that it does not: nothing "
                "changed (change it with PATCH, or send the request without the header)",
            )


def preconditions(if_match: str | None, if_none_match: str | None) -> Preconditions:
    """The conditions of a write's ``If-Match`` (``*``, or strong entity tags separated by
    commas, each as an ``ETag`` header gave it) and ``If-None-Match`` (``*``) headers
    (``IfMatch`` and ``IfNoneMatch`` parameters; absent: none). Anything else is
    ``RequestInvalid`` naming the header: a weak tag (``W/"..."``) too, since a write's
    condition is judged by strong comparison (RFC 9110, section 13.1.1) and Trainyard's
    tags are strong."""
    errors = []
    exists = False
    tags: tuple[str, ...] = ()
    if if_match is not None:
        exists, tags, problem = _if_match(if_match)
        if problem:
            errors.append(FieldError(field="If-Match", message=problem))
    if if_none_match is not None and if_none_match.strip() != "*":
        errors.append(
            FieldError(
                field="If-None-Match",
                message="only * is understood (only when it does not exist)",
            )
        )
    if errors:
        raise RequestInvalid(errors)
    return Preconditions(exists=exists, absent=if_none_match is not None, tags=tags)


def _if_match(value: str) -> tuple[bool, tuple[str, ...], str | None]:
    """(``*``, the tags, what is wrong) of an ``If-Match`` header."""
    text = value.strip()
    if text == "*":
        return True, (), None
    parts = [part.strip() for part in text.split(",")]
    tags = tuple(part for part in parts if _ENTITY_TAG.fullmatch(part))
    if len(tags) == len(parts) and tags:
        return False, tags, None
    weak = any(part.startswith("W/") for part in parts)
    why = (
        "a weak entity tag (W/) cannot condition a write: send the ETag as the answer gave it"
        if weak
        else 'give * (only when it exists) or the ETag as the answer gave it, quotes included ("...")'
    )
    return False, (), why


def _conditions(if_match: IfMatch = None, if_none_match: IfNoneMatch = None) -> Preconditions:
    return preconditions(if_match, if_none_match)


CONDITIONS: Final = {"conditions": Provide(_conditions, sync_to_thread=False)}
Conditions = NamedDependency[Preconditions]
"""The app dependency ``conditions``: a write's handler that takes ``conditions:
Conditions`` is conditional (its ``If-Match`` and ``If-None-Match`` headers, read by
``preconditions``, in its OpenAPI document too); every service's app has it."""


def error_responses(*statuses: int) -> dict[int, ResponseSpec]:
    """``responses=`` documenting ``statuses`` (keys of ``ERRORS``) with the ``ErrorBody``
    schema."""
    return {
        status: ResponseSpec(ErrorBody, description=ERRORS[status], generate_examples=False)
        for status in statuses
    }


@dataclass
class _JSONSchema(Schema):
    """A schema written as JSON Schema (Pydantic's), put in the document as it is."""

    document: dict[str, Any] = field(default_factory=dict)

    def to_schema(self) -> dict[str, Any]:
        return self.document


def json_request_body(
    model: type[BaseModel], example: dict[str, Any] | None = None
) -> type[Operation]:
    """The ``operation_class`` of a route that reads its JSON body by hand and validates it
    with ``model``: its document shows ``model``'s JSON Schema (validation mode, ``$defs``
    inlined) as the required ``application/json`` request body, with ``example`` (a valid
    body; fuzzers send it) when given."""
    if example is not None:
        model.model_validate(example)  # a wrong example fails here, when the app is built
    schema = _JSONSchema(document=_inlined(model))
    return _with_body(
        model.__name__,
        RequestBody(
            content={"application/json": OpenAPIMediaType(schema=schema, example=example)},
            required=True,
        ),
    )


MERGE_PATCH = "application/merge-patch+json"
"""The media type of a JSON Merge Patch (RFC 7396)."""
JSON = "application/json"


def merge_patch_request_body(model: type[BaseModel]) -> type[Operation]:
    """The ``operation_class`` of a route that reads a JSON Merge Patch of ``model`` (RFC
    7396, ``shared.merge_patch``): its document shows ``model``'s schema with every field
    optional and nullable (``null`` puts a field back to its default), as
    ``application/merge-patch+json`` and ``application/json``, both of which it reads."""
    media = OpenAPIMediaType(schema=_JSONSchema(document=_patchable(_inlined(model))))
    return _with_body(
        f"{model.__name__}Patch",
        RequestBody(content={MERGE_PATCH: media, "application/json": media}, required=True),
    )


async def read_merge_patch(
    request: Request[Any, Any, Any], limit: int, free_text: Callable[[str], bool]
) -> dict[str, Any]:
    """The JSON Merge Patch a request's body holds, read and screened as every hand-read
    JSON body is (``read_json_body``: 413, 415, 422), as ``application/merge-patch+json`` or
    ``application/json``; 422 naming ``body`` unless it is an object (a patch that is no
    object would replace the whole document, which is a ``PUT``'s to do)."""
    patch = json.loads(await read_json_body(request, limit, free_text, (MERGE_PATCH, JSON)))
    if not isinstance(patch, dict):
        raise RequestInvalid.one("body", "must be a JSON object (a JSON Merge Patch)")
    return patch


def patched(model: type[M], current: Mapping[str, Any], patch: Mapping[str, Any]) -> M:
    """``current`` (a ``PUT`` body of ``model``, as JSON values) with the JSON Merge Patch
    ``patch`` applied (``shared.merge_patch``), judged as that ``PUT`` would be
    (``RequestInvalid`` naming each bad field; the paths of a patch and of the document it
    makes are the same)."""
    return parse_body(model, json.dumps(merge_patch(current, patch)).encode())


def _patchable(node: Any) -> Any:
    """A JSON Schema of a document -> that of a merge patch of it: no member required, each
    one also ``null``, objects within alike."""
    if not isinstance(node, dict):
        return node
    node = {key: value for key, value in node.items() if key != "required"}
    for members in ("properties", "patternProperties"):
        if isinstance(node.get(members), dict):
            node[members] = {k: _nullable(_patchable(v)) for k, v in node[members].items()}
    if isinstance(node.get("additionalProperties"), dict):
        node["additionalProperties"] = _nullable(_patchable(node["additionalProperties"]))
    for key in ("anyOf", "oneOf", "allOf"):
        if isinstance(node.get(key), list):
            node[key] = [_patchable(branch) for branch in node[key]]
    return node


def _nullable(schema: dict[str, Any]) -> dict[str, Any]:
    return {"anyOf": [schema, {"type": "null"}]}


def bytes_request_body(description: str) -> type[Operation]:
    """The ``operation_class`` of a route that reads raw bytes (``description``) as its body."""
    binary = Schema(type=OpenAPIType.STRING, content_media_type="application/octet-stream")
    return _with_body(
        "Bytes",
        RequestBody(
            content={"application/octet-stream": OpenAPIMediaType(schema=binary)},
            description=description,
            required=True,
        ),
    )


def _with_body(name: str, body: RequestBody) -> type[Operation]:
    @dataclass
    class BodyOperation(Operation):
        def __post_init__(self) -> None:
            self.request_body = body

    BodyOperation.__name__ = BodyOperation.__qualname__ = f"{name}BodyOperation"
    return BodyOperation


def _inlined(model: type[BaseModel]) -> dict[str, Any]:
    schema = model.model_json_schema()
    defs: dict[str, Any] = schema.pop("$defs", {})

    def resolve(node: Any, depth: int = 0) -> Any:
        if depth > 32:
            raise ValueError(f"{model.__name__}: a recursive schema cannot be inlined")
        if isinstance(node, list):
            return [resolve(item, depth + 1) for item in node]
        if not isinstance(node, dict):
            return node
        node = dict(node)
        ref = node.pop("$ref", None)
        if isinstance(ref, str) and ref.startswith("#/$defs/"):
            node = {**defs[ref.removeprefix("#/$defs/")], **node}
        discriminator = node.get("discriminator")
        if isinstance(discriminator, dict):  # its mapping points into the $defs inlined here
            node["discriminator"] = {k: v for k, v in discriminator.items() if k != "mapping"}
        return {key: resolve(value, depth + 1) for key, value in node.items()}

    inlined: dict[str, Any] = resolve(schema)
    return inlined


def _http_handlers(route_handlers: Iterable[ControllerRouterHandler]) -> Iterator[HTTPRouteHandler]:
    for item in route_handlers:
        if isinstance(item, HTTPRouteHandler):
            yield item
        elif isinstance(item, Router):
            for route in item.routes:
                if isinstance(route, HTTPRoute):
                    yield from route.route_handlers
        else:
            raise TypeError(f"{item!r}: give service_app route handlers and Routers")


CORS_ALLOW_HEADERS: Final = ("Authorization", "Content-Type", "Idempotency-Key")
CORS_EXPOSE_HEADERS: Final = ("Link", "Retry-After", "Location", "ETag")


def cors_config(origins: Sequence[str]) -> CORSConfig | None:
    """CORS for exactly ``origins`` (None when there are none; see the module)."""
    if not origins:
        return None
    if "*" in origins:
        raise ValueError("CORS: name the origins; '*' is not allowed")
    return CORSConfig(
        allow_origins=list(origins),
        allow_methods=["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE"],
        allow_headers=list(CORS_ALLOW_HEADERS),
        expose_headers=list(CORS_EXPOSE_HEADERS),
        allow_credentials=False,
        max_age=600,
    )


EDGE_HEADERS: Final[Mapping[str, str]] = {
    "X-Content-Type-Options": "nosniff",
    "Cache-Control": "no-store",
    "Content-Security-Policy": "default-src 'none'; frame-ancestors 'none'",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
}
"""The headers every answer carries unless its route set them (see the module)."""


async def _edge_headers(message: Message, scope: Scope) -> None:
    """``EDGE_HEADERS`` added to the start of an HTTP answer, each one its route left unset."""
    if message["type"] != "http.response.start":
        return
    headers = MutableScopeHeaders.from_message(message)
    for name, value in EDGE_HEADERS.items():
        if name not in headers:
            headers[name] = value


ETAG: Final = ResponseHeader(
    name="ETag",
    documentation_only=True,  # the route sets it (``tagged``): its value is the resource's
    description="the resource's strong entity tag: If-Match of a write proceeds only while "
    "it is still this; If-None-Match of a GET or HEAD naming it answers 304",
)
"""``response_headers=[ETAG]`` of a ``GET`` route that answers with an ``ETag`` (see the
module, "Conditional reads")."""
NOT_MODIFIED: Final = ResponseSpec(
    None,
    description="not modified: If-None-Match names the ETag the resource still has (or is "
    "*); its headers, ETag among them, and no body",
    generate_examples=False,
)
"""The 304 of a route that answers with an ``ETag``, as its OpenAPI document says it."""
IF_NONE_MATCH_READ: Final = Parameter(
    name="If-None-Match",
    param_in=ParamType.HEADER,
    required=False,
    # What the edge understands (``none_match``): *, or a list of entity tags, weak or not.
    schema=Schema(
        type=OpenAPIType.STRING,
        pattern=r'^\s*(\*|(W/)?"[\x21\x23-\x7e]*"(\s*,\s*(W/)?"[\x21\x23-\x7e]*")*)\s*$',
    ),
    description="ETags the caller holds (weak comparison), or *: 304 with no body when one "
    "is the resource's; any other value, or no match, answers the resource",
)
"""The ``If-None-Match`` header of a conditional read, as its OpenAPI document says it: read
at the edge (``_not_modified``), no parameter of the handler."""


@dataclass
class _ConditionalReadOperation(Operation):
    """The operation of a ``GET`` route that answers with an ``ETag``: its parameters and
    ``If-None-Match`` (``IF_NONE_MATCH_READ``)."""

    def __post_init__(self) -> None:
        self.parameters = [*(self.parameters or []), IF_NONE_MATCH_READ]


def _document_conditional_read(handler: HTTPRouteHandler) -> None:
    """Document the 304 and ``If-None-Match`` of ``handler`` when it is a ``GET`` that
    answers with an ``ETag`` (``response_headers=[ETAG]``); ``ImproperlyConfiguredException``
    when it has an operation class of its own, which would lose the header."""
    etagged = any(h.name.lower() == "etag" for h in handler.response_headers or ())
    if HttpMethod.GET not in handler.http_methods or not etagged:
        return
    if handler.operation_class not in (Operation, _ConditionalReadOperation):  # built again
        raise ImproperlyConfiguredException(
            f"GET {', '.join(sorted(handler.paths))}: it answers with an ETag, and its "
            "operation class would leave If-None-Match out of its document"
        )
    handler.responses = {**(handler.responses or {}), 304: NOT_MODIFIED}
    handler.operation_class = _ConditionalReadOperation


_ANY_TAG = re.compile(r'(?:W/)?"([\x21\x23-\x7e]*)"')
"""An entity tag of ``If-None-Match``, weak or strong: its opaque part."""
_TAG_LIST = re.compile(rf"\s*{_ANY_TAG.pattern}(?:\s*,\s*{_ANY_TAG.pattern})*\s*")
"""A value of ``If-None-Match`` that lists entity tags."""
_NOT_MODIFIED: Final = "trainyard_not_modified"
"""The key of a request's ASGI scope whose answer ``_not_modified`` made a 304."""


def none_match(if_none_match: Iterable[str], tag: str) -> bool:
    """Whether a ``GET`` or ``HEAD``'s ``If-None-Match`` header values (none: False) name
    ``tag``, the ``ETag`` its answer carries, or are ``*``: weak comparison (RFC 9110,
    section 13.1.2), so ``W/"x"`` names ``"x"``. A value that is no list of entity tags
    names nothing (the answer is the whole one, never an error)."""
    opaque = _ANY_TAG.fullmatch(tag.strip().removeprefix("W/"))
    for value in if_none_match:
        if value.strip() == "*":
            return True
        if opaque and _TAG_LIST.fullmatch(value) and opaque.group(1) in _ANY_TAG.findall(value):
            return True
    return False


async def _not_modified(message: Message, scope: Scope) -> None:
    """A ``GET`` or ``HEAD`` answered 200 with an ``ETag`` that the request's
    ``If-None-Match`` names (``none_match``) answers 304 instead (RFC 9110, section 13.1.2):
    its headers without ``Content-Length`` and ``Content-Type`` (section 15.4.5), and no
    body (``_no_body``). One place for every route, so ``GET`` and ``HEAD`` of a resource
    answer alike; a route whose body is work checks the header itself before the work
    (``none_match``), answering its headers with no body, which this makes the 304."""
    if (
        message["type"] != "http.response.start"
        or message["status"] != 200
        or scope.get("method") not in ("GET", "HEAD")
    ):
        return
    headers = MutableScopeHeaders.from_message(message)
    tag = headers.get("etag")
    asked = [
        value.decode("latin-1") for name, value in scope["headers"] if name == b"if-none-match"
    ]
    if tag is None or not asked or not none_match(asked, tag):
        return
    message["status"] = 304
    for name in ("content-length", "content-type"):
        if name in headers:
            del headers[name]
    cast(dict[str, Any], scope)[_NOT_MODIFIED] = True


async def _no_body(message: Message, scope: Scope) -> None:
    """A ``HEAD`` request's answer without its body (its headers, ``Content-Length`` among
    them, as the ``GET``'s): whoever made it, a route, an error handler or the guard; and
    a 304's (``_not_modified``)."""
    if message["type"] == "http.response.body" and (
        scope.get("method") == "HEAD" or scope.get(_NOT_MODIFIED)
    ):
        message["body"] = b""


def _allow_of(allowed: Mapping[int, str]) -> Callable[[Message, Scope], Any]:
    """The ``before_send`` setting the ``Allow`` of an ``OPTIONS`` answer (204) to every
    method its route serves: ``allowed``, by the ``id`` of the route's ``OPTIONS`` handler
    (``service_app`` fills it once the app is built). Litestar's own handler names the
    methods of the route as it was when the path's first handler was registered: an app
    registers its handlers one at a time (and ``HEAD`` ones last), so it left out all but
    the first's, while the 405 of the same path lists them all."""

    async def allow(message: Message, scope: Scope) -> None:
        if (
            message["type"] == "http.response.start"
            and message["status"] == 204
            and scope.get("method") == "OPTIONS"
            and (methods := allowed.get(id(scope.get("route_handler")))) is not None
        ):
            MutableScopeHeaders.from_message(message)["Allow"] = methods

    return allow


HEAD_OF_GET: Final = "trainyard_head_of_get"
"""The ``opt`` key of a ``HEAD`` route answering for a ``GET`` one: the copy ``head_routes``
added, or a route's own (``head_of_get``)."""
BODY_IS_WORK: Final = "trainyard_body_is_work"
"""The ``opt`` key of a ``GET`` route whose body costs work to make (``body_is_work``)."""


def body_is_work() -> dict[str, Any]:
    """The ``opt`` of a ``GET`` route whose body costs work to make (objects read from the
    store, a whole artifact fetched and verified): ``head_routes`` makes no copy of it,
    which would do that work for a ``HEAD`` and throw the body away. The route has a
    ``HEAD`` of its own (``head_of_get``) answering its status and headers without that
    work; building an app where it has none fails, naming the route."""
    return {BODY_IS_WORK: True}


def head_of_get(path: str | Sequence[str], **options: Any) -> head:
    """The decorator of the ``HEAD`` route of a ``GET`` whose body is work
    (``body_is_work``): outside the OpenAPI document (it says no more than the ``GET``
    operation does), its query checked as the ``GET``'s (``opt[HEAD_OF_GET]``); ``options``
    as ``litestar.head``'s, its ``opt`` (the ``GET``'s role) kept. It answers what the
    ``GET`` would (the guard's refusal, 404, a bad parameter's 422) from what it knows
    without the work, and its headers with ``head_answer``."""
    opt = {**options.pop("opt", {}), HEAD_OF_GET: True}
    return head(path, include_in_schema=False, opt=opt, **options)


def head_answer(
    media_type: str,
    headers: Mapping[str, str] | None = None,
    status_code: int = 200,
    content_length: int | None = None,
) -> Response[None]:
    """The answer of a ``HEAD`` route of its own (``head_of_get``, annotated
    ``Response[None]`` as Litestar asks of a ``HEAD``), and of a ``GET`` whose body is work
    when ``If-None-Match`` names its ``ETag`` (``none_match``; the edge makes it the 304):
    ``status_code``, the ``GET``'s
    ``media_type`` and ``headers`` (its ``ETag`` among them, where it has one), no body.
    ``Content-Length`` is ``content_length``, the ``GET``'s exact length where it is known
    without the work (a stored artifact's registered size); without it, none (RFC 9110,
    section 9.3.2 allows leaving it out; a guess would be wrong, which is worse: a JSON
    body made of what the work finds, a log page or a new presigned URL, has no length
    known before)."""
    fields = dict(headers or {})
    if content_length is not None:
        fields["Content-Length"] = str(content_length)
    answer = Stream(iter(()), media_type=media_type, headers=fields)
    answer.status_code = status_code
    return cast(Response[None], answer)


def head_routes(
    route_handlers: Sequence[ControllerRouterHandler],
) -> list[ControllerRouterHandler]:
    """``route_handlers`` with a ``HEAD`` route for each path a ``GET`` handler serves and
    no handler serves ``HEAD``: a copy of the ``GET`` handler for ``HEAD`` alone, left out
    of the OpenAPI document (``opt[HEAD_OF_GET]``), so that it answers as the ``GET`` does
    (its guard, its ``opt``, its parameters) with no body. A ``Router``'s are added to that
    router, in place (under its path, its guards and ``opt``), once however often it is
    given."""
    added: list[ControllerRouterHandler] = []
    top = [h for h in route_handlers if isinstance(h, HTTPRouteHandler)]
    headed = {path for h in top if HttpMethod.HEAD in h.http_methods for path in h.paths}
    for handler in top:
        if HttpMethod.GET in handler.http_methods and handler.paths - headed:
            added.append(_head_of(handler, handler.paths - headed))
    for router in (r for r in route_handlers if isinstance(r, Router)):
        served = router.route_handler_method_map
        headed = {path for path, methods in served.items() if HttpMethod.HEAD in methods}
        gets = {
            id(get): get
            for methods in served.values()
            if isinstance(get := methods.get(HttpMethod.GET), HTTPRouteHandler)
        }
        for get in gets.values():
            paths = {p for p in get.paths if join_paths([router.path, p]) not in headed}
            if paths:
                router.register(_head_of(get, paths))
    return [*route_handlers, *added]


def _head_of(handler: HTTPRouteHandler, paths: set[str]) -> HTTPRouteHandler:
    """A copy of the ``GET`` ``handler`` answering ``HEAD`` at ``paths`` (``head_routes``);
    ``ImproperlyConfiguredException`` for one whose body is work (``body_is_work``)."""
    if handler.opt.get(BODY_IS_WORK):
        raise ImproperlyConfiguredException(
            f"GET {', '.join(sorted(paths))}: its body is work (body_is_work), so a copy of "
            "it would do that work for every HEAD: give it a HEAD route of its own "
            "(head_of_get)"
        )
    head = copy(handler)
    head.paths = paths
    head.http_methods = {HttpMethod.HEAD}
    head.include_in_schema = False
    head.opt = {**handler.opt, HEAD_OF_GET: True}
    head.name = None  # a handler's name names one handler
    return head


def service_app(
    title: str,
    route_handlers: Sequence[ControllerRouterHandler],
    guard: Guard,
    statuses: Mapping[type[Exception], int] | None = None,
    dependencies: Mapping[str, Provide] | None = None,
    errors: Iterable[int] = (),
    cors_origins: Sequence[str] = (),
    **litestar_options: Any,
) -> Litestar:
    """The app of service ``title``: ``route_handlers`` behind ``guard`` (see the module);
    ``errors``: the error statuses every route of the service may answer besides
    ``EVERY_ROUTE``; ``cors_origins``: the web origins that may call it from a browser."""
    everywhere = error_responses(*EVERY_ROUTE, *errors)
    allowed: dict[int, str] = {}  # filled below, once every route is made
    route_handlers = head_routes(route_handlers)
    for handler in _http_handlers(route_handlers):
        _document_conditional_read(handler)
        handler.responses = dict(sorted({**everywhere, **(handler.responses or {})}.items()))
    app = Litestar(
        route_handlers=list(route_handlers),
        guards=[guard],
        dependencies={**principal_dependency(), **CONDITIONS, **(dependencies or {})},
        middleware=[tracing_middleware],
        exception_handlers=exception_handlers(statuses),
        before_request=check_parameters,
        openapi_config=OpenAPIConfig(
            title=f"Trainyard {title}",
            version="1.0.0",
            components=Components(
                security_schemes={
                    "bearer": SecurityScheme(
                        type="http",
                        scheme="bearer",
                        description="a user token (ty_...) or the service's operator token",
                    )
                }
            ),
            security=[{"bearer": []}],
        ),
        debug=False,
        logging_config=None,  # the process's one set-up is shared.logs (see the module)
        cors_config=cors_config(cors_origins),
        before_send=[_edge_headers, _not_modified, _no_body, _allow_of(allowed)],
        **litestar_options,
    )
    _head_of_added_gets(app)
    for route in app.routes:
        if isinstance(route, HTTPRoute):
            for handler in route.route_handlers:
                _guard_without_copy(handler)
            _declare_query_parameters(route)
            options = route.route_handler_map.get(HttpMethod.OPTIONS)
            if options is not None:
                allowed[id(options[0])] = ", ".join(
                    sorted(HttpMethod(m).value for m in route.methods)
                )
    return app


def _head_of_added_gets(app: Litestar) -> None:
    """A ``HEAD`` route for each ``GET`` route Litestar added itself as the app was built
    (its OpenAPI plugin's ``/schema`` pages, made after ``head_routes`` ran), so that they
    answer ``HEAD`` as every other ``GET`` does instead of 405: the same handler, guard and
    status, no body, outside the document. Their query is not checked, as their ``GET``'s
    is not (no ``opt[HEAD_OF_GET]``)."""
    for route in list(app.routes):
        if not isinstance(route, HTTPRoute) or HttpMethod.HEAD in route.methods:
            continue
        found = route.route_handler_map.get(HttpMethod.GET)
        if found is not None:
            head = _head_of(found[0], {route.path})
            head.opt = {k: v for k, v in head.opt.items() if k != HEAD_OF_GET}
            app.register(head)


def _declare_query_parameters(route: HTTPRoute) -> None:
    """Tell ``check_parameters`` the query parameters each documented handler of ``route``
    declares (its own and its dependencies', as Litestar parses them for it, so as its
    OpenAPI operation lists them): any other is refused; a ``HEAD`` route added for a
    ``GET`` one (``head_routes``) as that ``GET``. Handlers outside the document (the
    probes, the dashboard's files, ``OPTIONS``) are not checked."""
    for handler, kwargs_model in route.route_handler_map.values():
        if handler.resolve_include_in_schema() or handler.opt.get(HEAD_OF_GET):
            query = kwargs_model.expected_query_params
            headers = kwargs_model.expected_header_params
            declare_query_parameters(
                handler,
                {p.field_alias for p in query},
                {p.field_alias for p in query if p.is_sequence},
                {p.field_alias for p in headers if not p.is_sequence},
            )


def _guard_without_copy(handler: HTTPRouteHandler) -> None:
    """Make ``handler`` run its guards with itself as the handler argument (see the module).
    The routes' handlers are instances of Litestar's decorator classes (``get``, ``post``:
    no ``__slots__`` of their own, so an instance attribute shadows the method); the
    ``OPTIONS`` handlers Litestar adds are fully slotted and keep its behaviour."""
    if hasattr(handler, "__dict__"):
        handler.__dict__["authorize_connection"] = MethodType(_authorize_connection, handler)


async def _authorize_connection(
    self: HTTPRouteHandler, connection: ASGIConnection[Any, Any, Any, Any]
) -> None:
    """``authorize_connection`` without the copy: each guard in scope, in Litestar's order."""
    for guard in self.resolve_guards():  # each made awaitable by Litestar
        await guard(connection, self)  # type: ignore[misc]
