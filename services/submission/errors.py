"""The submission service's refusals, each answered with its own HTTP status by the API."""

from __future__ import annotations

from trainyard_platform.shared.http_errors import Conflicting


class NotFound(Exception):
    """No such thing in the caller's team (answered 404)."""


class Forbidden(Exception):
    """The caller may not do this (answered 403)."""


class Conflict(Conflicting):
    """The request contradicts the current state (answered 409): ``Conflict(detail,
    field=..., message=...)``, naming the field it is about and why
    (``shared.http_errors.Refused``)."""


class UserExists(Exception):
    """The team already has a user of that name."""
