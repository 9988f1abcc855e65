"""Request and response bodies of users, tokens and ``/v1/me``."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

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


class TokenCreated(BaseModel):
    id: int
    name: str
    user: str
    team: str
    created_at: datetime
    expires_at: datetime | None
    token: str
    """Shown once; only its hash is stored."""


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
