"""Bearer tokens: random, shown once, stored only as a hash.

Tokens carry 256 bits of randomness, so a fast hash (SHA-256) is enough: there is nothing
to brute-force that a slow password hash would protect.
"""

from __future__ import annotations

import hashlib
import re
import secrets

from litestar.datastructures import Headers

TOKEN_PREFIX = "ty_"
MAX_TOKEN_LENGTH = 1024
"""The longest credential a request may present (a user token is 46 characters; an operator
token is whatever its service was given, and must fit)."""
_TOKEN68 = re.compile(r"[A-Za-z0-9\-._~+/]+=*")
"""RFC 6750's ``b64token``: the only characters a bearer credential may hold."""


def new_token() -> tuple[str, str]:
    """Return ``(token, token_hash)``; give the token to the user, store the hash."""
    token = TOKEN_PREFIX + secrets.token_urlsafe(32)
    return token, hash_token(token)


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def is_token68(credential: str) -> bool:
    """Whether ``credential`` could be presented as a bearer token at all: RFC 6750's
    ``b64token`` (ASCII letters, digits and ``-._~+/``, then ``=`` padding), at most
    ``MAX_TOKEN_LENGTH`` characters."""
    return len(credential) <= MAX_TOKEN_LENGTH and _TOKEN68.fullmatch(credential) is not None


def bearer_token(authorization: str | None) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` header, or None: also for a token
    that is not ``is_token68`` (a byte beyond ASCII, a space or a control character inside,
    too long), so no such value reaches a hash, a lookup or a header sent on."""
    if not authorization:
        return None
    scheme, _, token = authorization.partition(" ")
    token = token.strip(" \t")
    if scheme.lower() != "bearer" or not is_token68(token):
        return None
    return token


def presented_token(headers: Headers) -> str | None:
    """The bearer token of a request's headers, or None when there is none, it is malformed
    (``bearer_token``), or ``Authorization`` comes more than once: a second header is not a
    list the server may pick from (RFC 9110, 5.3), and a proxy in front that read the other
    one would authorize and log someone else than the service does."""
    values = headers.getall("authorization", [])
    return bearer_token(values[0]) if len(values) == 1 else None
