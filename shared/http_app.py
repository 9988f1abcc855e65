"""How every service builds its Litestar app, so all of them behave the same at the edge.

``service_app`` adds, to the service's routes: the app-level guard (``shared.access``), the
``principal`` dependency, the shared error shapes (``shared.http_errors``), one tracing span
per request, and an OpenAPI document that declares the bearer-token security scheme and the
error body, so clients and fuzzers see what the service really enforces.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from litestar import Litestar
from litestar.di import Provide
from litestar.openapi import OpenAPIConfig
from litestar.openapi.spec import Components, SecurityScheme
from litestar.types import ControllerRouterHandler, Guard

from shared.access import principal_dependency
from shared.http_errors import exception_handlers
from shared.http_tracing import tracing_middleware


def service_app(
    title: str,
    route_handlers: Sequence[ControllerRouterHandler],
    guard: Guard,
    statuses: Mapping[type[Exception], int] | None = None,
    dependencies: Mapping[str, Provide] | None = None,
    **litestar_options: Any,
) -> Litestar:
    """The app of service ``title``: ``route_handlers`` behind ``guard`` (see the module)."""
    return Litestar(
        route_handlers=list(route_handlers),
        guards=[guard],
        dependencies={**principal_dependency(), **(dependencies or {})},
        middleware=[tracing_middleware],
        exception_handlers=exception_handlers(statuses),
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
        **litestar_options,
    )
