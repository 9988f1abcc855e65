"""Authentication of every HTTP endpoint: the operator token and the open probes.

Contract:
- Every service's app is built with one app-level guard, so a route added later is
  authenticated without anyone remembering to: the operator services (scheduler, registry,
  billing, runner) use ``admin_guard`` (``Authorization: Bearer <admin token>``, compared in
  constant time); submission checks its users' tokens the same way (``services.submission.api``).
- The only routes open to anyone are the probes in ``OPEN_PATHS`` (``/healthz``,
  ``/readyz``): they say whether the process is alive and ready, nothing about the cluster.
- The admin token is a required setting of each operator service
  (``TRAINYARD_<SERVICE>_ADMIN_TOKEN``): a service started without it exits with status 2
  naming the variable. There is no configuration in which an endpoint is open.
- Refusals are 401; a missing header, a malformed one and a
  wrong token (a team user's token included) are not told apart.
"""

from __future__ import annotations

import secrets
from typing import Any, Final

from litestar.connection import ASGIConnection
from litestar.exceptions import NotAuthorizedException
from litestar.handlers import BaseRouteHandler
from litestar.types import Guard
from pydantic import SecretStr

from shared.auth import bearer_token

OPEN_PATHS: Final[frozenset[str]] = frozenset({"/healthz", "/readyz"})
"""Request paths answered without a token: the liveness and readiness probes."""


def is_open_probe(connection: ASGIConnection[Any, Any, Any, Any]) -> bool:
    """True when the request is for one of ``OPEN_PATHS`` (exactly: no prefix, no suffix)."""
    return connection.scope["path"] in OPEN_PATHS


def admin_guard(token: SecretStr) -> Guard:
    """An app-level Litestar guard: every route but the probes requires
    ``Authorization: Bearer <token>``. Raises ``ValueError`` for an empty token."""
    expected = token.get_secret_value().encode()
    if not expected.strip():
        raise ValueError("the operator (admin) token must not be empty")

    def guard(connection: ASGIConnection[Any, Any, Any, Any], _: BaseRouteHandler) -> None:
        if is_open_probe(connection):
            return
        presented = bearer_token(connection.headers.get("authorization"))
        if presented is None or not secrets.compare_digest(presented.encode(), expected):
            raise NotAuthorizedException("operator endpoint: Authorization: Bearer <admin token>")

    return guard
