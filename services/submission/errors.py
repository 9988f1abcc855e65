"""The submission service's refusals, each answered with its own HTTP status by the API."""

from __future__ import annotations


class NotFound(Exception):
    """No such thing in the caller's team (answered 404)."""


class Forbidden(Exception):
    """The caller may not do this (answered 403)."""


class Conflict(Exception):
    """The request contradicts the current state (answered 409)."""


class UserExists(Exception):
    """The team already has a user of that name."""
