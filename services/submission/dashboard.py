"""The web dashboard: static pages under ``/ui/`` and the URLs they call, served to anyone.

Contract:
- ``GET /ui/`` and every file under it are the HTML, ES modules, styles and vendored chart
  library in ``web/`` (shipped with the package; no build step). ``GET /ui/config.json``
  gives the public URLs of the other services' APIs (``*_public_url`` settings; null when
  unset) and nothing else. ``GET /`` redirects to ``/ui/``.
- Every file and ``config.json`` carries a Content-Security-Policy that lets the page run
  only its own scripts and style sheets (no inline style) and talk only to this origin and the configured APIs (``connect-src``,
  each API's path and everything under it), refuses framing, and ``X-Content-Type-Options:
  nosniff``: a job name or log line that looks like markup stays text (the pages insert
  text only), and if it ever did not, the policy would keep it from running or sending the
  token anywhere else. An error answer under ``/ui/`` (a 404 that repeats the path) carries
  the policy of every other answer of the service, which allows nothing
  (``shared.http_app.EDGE_HEADERS``).
- These routes are ``public_asset`` routes (``shared.access``): no token is asked for, and
  they hold no data of any team. Every piece of data the pages show comes from the platform's
  APIs, called from the browser with the token the user typed in (kept in the tab's
  ``sessionStorage``); those APIs' own checks decide what a user sees, so the dashboard can
  show nothing the user's token could not read with the CLI.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from litestar import Request, Response, Router, get
from litestar.datastructures import CacheControlHeader
from litestar.exceptions import InternalServerException
from litestar.response import Redirect
from litestar.static_files import create_static_files_router
from pydantic import BaseModel

from trainyard_platform.services.submission.config import Settings
from trainyard_platform.shared.access import public_asset
from trainyard_platform.shared.http_errors import ErrorBody, exception_handlers, status_handler

WEB = Path(__file__).parent / "web"
"""The dashboard's files."""
PREFIX = "/ui"


class DashboardConfig(BaseModel):
    """``GET /ui/config.json``: where the browser finds each API (the submission API is the
    page's own origin)."""

    scheduler_url: str | None
    registry_url: str | None
    billing_url: str | None


def page_config(settings: Settings) -> DashboardConfig:
    """What ``GET /ui/config.json`` answers for ``settings``."""
    return DashboardConfig(
        scheduler_url=settings.scheduler_public_url,
        registry_url=settings.registry_public_url,
        billing_url=settings.billing_public_url,
    )


def dashboard_routes(settings: Settings) -> list[Router]:
    """The dashboard's routes (see the module), to add to the submission app."""
    config = page_config(settings)
    policy = content_security_policy(config)

    def secure(response: Response[Any]) -> Response[Any]:
        response.headers.update({**_HEADERS, "Content-Security-Policy": policy})
        return response

    @get("/config.json", include_in_schema=False, sync_to_thread=False, cache_control=_NO_STORE)
    def dashboard_config() -> DashboardConfig:
        return config

    @get("/", include_in_schema=False, sync_to_thread=False)
    def dashboard_root() -> Redirect:
        return Redirect(f"{PREFIX}/")

    files = create_static_files_router(
        path=PREFIX,
        directories=[WEB],
        html_mode=True,
        name="dashboard",
        opt=public_asset(),
        cache_control=_NO_CACHE,
        resolve_symlinks=False,
        after_request=secure,
        exception_handlers={InternalServerException: _no_such_file},
    )
    api = Router(
        PREFIX, route_handlers=[dashboard_config], opt=public_asset(), after_request=secure
    )
    root = Router("/", route_handlers=[dashboard_root], opt=public_asset())
    return [api, files, root]


def _no_such_file(
    request: Request[Any, Any, Any], exc: InternalServerException
) -> Response[ErrorBody]:
    """Litestar's static files answer 500 when the file system refuses the path itself (a
    name longer than the system allows, a file taken for a folder: ``/ui/index.html/x``).
    For a URL anyone may ask for, that is a file that does not exist: 404."""
    if isinstance(exc.__cause__, OSError):
        return status_handler(404)(request, exc.__cause__.__class__("no such file under /ui/"))
    return exception_handlers()[Exception](request, exc)


def content_security_policy(config: DashboardConfig) -> str:
    """The pages' policy: own scripts and style sheets only, no inline style (the pages set a
    bar's width through the CSSOM, ``ui.js`` ``h``, which the policy does not judge), data:
    images (the icon), and requests to this origin and the configured APIs only
    (``api_source``)."""
    apis = [
        api_source(url)
        for url in (config.scheduler_url, config.registry_url, config.billing_url)
        if url
    ]
    return "; ".join(
        [
            "default-src 'none'",
            "script-src 'self'",
            "style-src 'self'",
            "img-src 'self' data:",
            "connect-src " + " ".join(["'self'", *apis]),
            "base-uri 'self'",
            "form-action 'self'",
            "frame-ancestors 'none'",
        ]
    )


def api_source(url: str) -> str:
    """The CSP source of every URL under the API at ``url`` (``http(s)://host[:port][/path]``):
    its path ending in ``/``. A source path without the final ``/`` matches that one path
    only (CSP3, "path-part match"), so ``https://host/registry`` would let the page call no
    route of a registry served behind ``/registry``."""
    parts = urlsplit(url.strip())
    return f"{parts.scheme}://{parts.netloc}{parts.path.rstrip('/')}/"


_HEADERS = {"X-Content-Type-Options": "nosniff", "Referrer-Policy": "no-referrer"}
_NO_CACHE = CacheControlHeader(no_cache=True)
"""Revalidate on every load: a new release's modules are picked up at once."""
_NO_STORE = CacheControlHeader(no_store=True)
