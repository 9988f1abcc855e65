"""The guard for operator endpoints (queue state, usage, the model registry's read API).

Operator endpoints answer to one static admin token given in the service's settings. With no
token configured the guard lets every request through, which is only for a laptop: deployment
must set it (docs/operations.md).
"""

from __future__ import annotations

import secrets
from typing import Any

from litestar.connection import ASGIConnection
from litestar.exceptions import NotAuthorizedException
from litestar.handlers import BaseRouteHandler
from litestar.types import Guard
from pydantic import SecretStr

from shared.auth import bearer_token


def admin_guard(token: SecretStr | None) -> Guard:
    """A Litestar guard that checks ``Authorization: Bearer <admin token>`` (constant time)."""

    def guard(connection: ASGIConnection[Any, Any, Any, Any], _: BaseRouteHandler) -> None:
        if token is None:
            return
        presented = bearer_token(connection.headers.get("authorization"))
        if presented is None or not secrets.compare_digest(
            presented.encode(), token.get_secret_value().encode()
        ):
            raise NotAuthorizedException("operator endpoint: Authorization: Bearer <admin token>")

    return guard
