"""Request and response bodies of users, tokens and ``/v1/me``."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

from trainyard_platform.services.submission.schemas import sha256_of_json

TokenName = Annotated[str, Field(pattern=r"^[A-Za-z0-9._ -]{1,100}$")]
TokenDays = Annotated[int, Field(ge=1, le=366)]


class MeView(BaseModel):
    """Who the presented token belongs to (other services check user tokens with it)."""

    user: str
    team: str
    role: str
    token_id: int
    token_name: str
    expires_at: datetime | None


class TeamView(BaseModel):
    """A team that exists (``GET /v1/teams/{team}``): other services ask before they store a
    reference to a team (a grant, a budget)."""

    team: str


class TokenRequest(BaseModel):
    """The body of ``POST /v1/tokens`` and ``POST /v1/tokens/rotate``."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    name: TokenName | None = None
    """A label to tell tokens apart (``laptop``, ``ci``); rotation keeps the old one's."""
    expires_in_days: TokenDays | None = None
    """Lifetime; the server's ``token_ttl_days`` when absent."""


def token_request_fingerprint(request: TokenRequest) -> str:
    """What identifies a ``POST /v1/tokens`` under an ``Idempotency-Key``: the sha256 of
    the request as validated (``schemas.sha256_of_json``), its name left out or sent as
    ``default`` alike (the token is named so either way). ``expires_in_days`` left out is
    not the server's ``token_ttl_days`` sent: that setting may change between a request
    and its retry."""
    fields = {"name": request.name or "default", "expires_in_days": request.expires_in_days}
    return sha256_of_json({"$request": "POST /v1/tokens", **fields})


def rotation_fingerprint(request: TokenRequest, name: str, replaces: int) -> str:
    """What identifies a ``POST /v1/tokens/rotate`` under an ``Idempotency-Key``: as
    ``token_request_fingerprint``, with the token rotated (``replaces``), so that a key names
    one rotation of one token. ``name`` is the new token's: the one sent, or the rotated
    token's when left out (the same request either way)."""
    fields = {"name": name, "expires_in_days": request.expires_in_days, "replaces": replaces}
    return sha256_of_json({"$request": "POST /v1/tokens/rotate", **fields})


class TokenCreated(BaseModel):
    id: int
    name: str
    user: str
    team: str
    created_at: datetime
    expires_at: datetime | None
    token: str | None
    """Shown once, in the answer that made it (201); only its hash is stored. None in the
    answer (200) to a retry under the ``Idempotency-Key`` that made it: the token exists,
    its secret is gone (see ``identity.create_token``)."""
    revoked_at: datetime | None = None
    """When the token was revoked: only ever set in a retry's answer, of a token revoked
    since it was made."""


class TokenView(BaseModel):
    id: int
    name: str
    user: str
    team: str
    created_at: datetime
    expires_at: datetime | None
    revoked_at: datetime | None


class UserView(BaseModel):
    name: str
    team: str
    role: str
    created_at: datetime
    disabled_at: datetime | None
