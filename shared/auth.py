"""Bearer tokens: random, shown once, stored only as a hash.

Tokens carry 256 bits of randomness, so a fast hash (SHA-256) is enough: there is nothing
to brute-force that a slow password hash would protect.
"""

from __future__ import annotations

import hashlib
import secrets

TOKEN_PREFIX = "ty_"


def new_token() -> tuple[str, str]:
    """Return ``(token, token_hash)``; give the token to the user, store the hash."""
    token = TOKEN_PREFIX + secrets.token_urlsafe(32)
    return token, hash_token(token)


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def bearer_token(authorization: str | None) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` header, or None."""
    if not authorization:
        return None
    scheme, _, token = authorization.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        return None
    return token.strip()
