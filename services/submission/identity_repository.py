"""SQL of teams, users and tokens: one function per query, each on a given connection.

Only token hashes are ever stored or compared (``shared.auth``). A token is valid while it is
not revoked, not expired, and its user is not disabled; ``caller_by_token`` checks all three
in one indexed lookup (the primary key), so revocation needs no cache to expire.
"""

from __future__ import annotations

from datetime import datetime

import asyncpg

from trainyard_platform.services.submission.governance import screening_columns
from trainyard_platform.shared.http_errors import NameTaken


async def caller_by_token(conn: asyncpg.Connection, token_hash: str) -> asyncpg.Record | None:
    return await conn.fetchrow(
        """SELECT u.id AS user_id, u.name AS user_name, u.role, t.id AS team_id,
                  t.name AS team_name, k.id AS token_id, k.name AS token_name, k.expires_at
           FROM tokens k JOIN users u ON u.id = k.user_id JOIN teams t ON t.id = u.team_id
           WHERE k.token_hash = $1 AND k.revoked_at IS NULL AND u.disabled_at IS NULL
             AND (k.expires_at IS NULL OR k.expires_at > now())""",
        token_hash,
    )


async def caller_by_rotated_token(
    conn: asyncpg.Connection, token_hash: str, idempotency_key: str, since: datetime
) -> asyncpg.Record | None:
    """As ``caller_by_token``, for a token that is revoked because a rotation under
    ``idempotency_key`` replaced it at ``since`` or later (its user still enabled); with the
    new token's ``successor_id``. Only a rotation sets ``replaces``, and it revokes the
    token it names in the same transaction."""
    return await conn.fetchrow(
        """SELECT u.id AS user_id, u.name AS user_name, u.role, t.id AS team_id,
                  t.name AS team_name, k.id AS token_id, k.name AS token_name, k.expires_at,
                  s.id AS successor_id
           FROM tokens k JOIN users u ON u.id = k.user_id JOIN teams t ON t.id = u.team_id
                JOIN tokens s ON s.replaces = k.id AND s.user_id = k.user_id
           WHERE k.token_hash = $1 AND k.revoked_at IS NOT NULL AND u.disabled_at IS NULL
             AND s.idempotency_key = $2 AND s.created_at >= $3""",
        token_hash,
        idempotency_key,
        since,
    )


async def reissue_token(conn: asyncpg.Connection, token_id: int, token_hash: str) -> bool:
    """Give a live (unrevoked, unexpired) token a new secret (``token_hash``): the old one
    stops working at once. False when the token is not live."""
    done = await conn.fetchval(
        """UPDATE tokens SET token_hash = $2 WHERE id = $1 AND revoked_at IS NULL
             AND (expires_at IS NULL OR expires_at > now()) RETURNING true""",
        token_id,
        token_hash,
    )
    return bool(done)


async def caller_and_screening(
    conn: asyncpg.Connection, token_hash: str, month: str
) -> asyncpg.Record | None:
    """``caller_by_token`` and, in the same query, what ``governance.screening`` reads for
    the caller's team in ``month`` (``governance.screening_columns``)."""
    return await conn.fetchrow(
        f"""SELECT u.id AS user_id, u.name AS user_name, u.role, t.id AS team_id,
                   t.name AS team_name, k.id AS token_id, k.name AS token_name, k.expires_at,
                   {screening_columns("t.name", "$2")}
            FROM tokens k JOIN users u ON u.id = k.user_id JOIN teams t ON t.id = u.team_id
            WHERE k.token_hash = $1 AND k.revoked_at IS NULL AND u.disabled_at IS NULL
              AND (k.expires_at IS NULL OR k.expires_at > now())""",
        token_hash,
        month,
    )


async def ensure_team(conn: asyncpg.Connection, name: str) -> int:
    """The id of team ``name``, created if there is none; ``NameTaken`` (field ``team``) when
    only a team whose name differs from it by case exists (the unique index on
    ``lower(name)`` holds this against concurrent creates too)."""
    for _ in range(2):  # a second look only after a concurrent create won the insert
        found = await _same_name_any_case(conn, "SELECT id, name FROM teams", "", name)
        if found is not None:
            if found["name"] != name:
                raise NameTaken("team", "team", found["name"])
            return int(found["id"])
        team_id = await conn.fetchval(
            "INSERT INTO teams (name) VALUES ($1) ON CONFLICT DO NOTHING RETURNING id", name
        )
        if team_id is not None:
            return int(team_id)
    raise AssertionError(f"team {name!r}: neither found nor created")


async def _same_name_any_case(
    conn: asyncpg.Connection, select: str, scope: str, name: str, *args: object
) -> asyncpg.Record | None:
    """The row of ``select`` (whose ``WHERE`` is ``scope``, ``$2``... being ``args``) named
    ``name`` regardless of case: the one spelled exactly so if any, else the oldest."""
    where = f"{scope} AND " if scope else ""
    row: asyncpg.Record | None = await conn.fetchrow(
        f"{select} WHERE {where}lower(name) = lower($1) ORDER BY name = $1 DESC, id LIMIT 1",
        name,
        *args,
    )
    return row


async def team_id(conn: asyncpg.Connection, name: str) -> int | None:
    found = await conn.fetchval("SELECT id FROM teams WHERE name = $1", name)
    return None if found is None else int(found)


async def insert_user(conn: asyncpg.Connection, team_id: int, name: str, role: str) -> int | None:
    """The new user's id, or None when the team already has a user of that name;
    ``NameTaken`` (field ``name``) when it has one whose name differs from it only by case
    (the unique index on ``(team_id, lower(name))`` holds this against concurrent creates)."""
    for _ in range(2):  # a second look only after a concurrent create won the insert
        found = await _same_name_any_case(
            conn, "SELECT name FROM users", "team_id = $2", name, team_id
        )
        if found is not None:
            if found["name"] != name:
                team = await conn.fetchval("SELECT name FROM teams WHERE id = $1", team_id)
                raise NameTaken("name", "user", found["name"], f"team {team}")
            return None
        user_id = await conn.fetchval(
            "INSERT INTO users (team_id, name, role) VALUES ($1, $2, $3) "
            "ON CONFLICT DO NOTHING RETURNING id",
            team_id,
            name,
            role,
        )
        if user_id is not None:
            return int(user_id)
    raise AssertionError(f"user {name!r}: neither found nor created")


async def user(
    conn: asyncpg.Connection, team_id: int, name: str, lock: bool = False
) -> asyncpg.Record | None:
    """The user ``name`` of the team (None: none), its row locked until the transaction ends
    with ``lock`` (a change judges its conditions on it, then writes, in turn)."""
    return await conn.fetchrow(
        "SELECT id, name, role, created_at, disabled_at FROM users WHERE team_id = $1 AND name = $2"
        + (" FOR UPDATE" if lock else ""),
        team_id,
        name,
    )


async def users(
    conn: asyncpg.Connection, team_id: int, limit: int, after: str = ""
) -> list[asyncpg.Record]:
    """At most ``limit`` users of the team named after ``after``, by name."""
    rows: list[asyncpg.Record] = await conn.fetch(
        "SELECT id, name, role, created_at, disabled_at FROM users "
        "WHERE team_id = $1 AND name > $3 ORDER BY name LIMIT $2",
        team_id,
        limit,
        after,
    )
    return rows


async def set_role(conn: asyncpg.Connection, user_id: int, role: str) -> None:
    await conn.execute("UPDATE users SET role = $2 WHERE id = $1", user_id, role)


async def disable_user(conn: asyncpg.Connection, user_id: int, at: datetime) -> None:
    """Disable the user and revoke every token it holds."""
    await conn.execute(
        "UPDATE users SET disabled_at = $2 WHERE id = $1 AND disabled_at IS NULL", user_id, at
    )
    await conn.execute(
        "UPDATE tokens SET revoked_at = $2 WHERE user_id = $1 AND revoked_at IS NULL", user_id, at
    )


async def live_tokens(
    conn: asyncpg.Connection, team_id: int, user_id: int, now: datetime
) -> tuple[int, int]:
    """How many unrevoked, unexpired tokens of enabled users the user and its whole team
    hold. The team's row is locked first (``FOR NO KEY UPDATE``, until the transaction
    ends), so two transactions issuing tokens in one team, on any replica, take turns: the
    second counts the first's token. It does not hold back what only references the team
    (a job, a user inserted)."""
    await conn.execute("SELECT 1 FROM teams WHERE id = $1 FOR NO KEY UPDATE", team_id)
    row = await conn.fetchrow(
        """SELECT count(*) FILTER (WHERE k.user_id = $2) AS user_held, count(*) AS team_held
           FROM tokens k JOIN users u ON u.id = k.user_id
           WHERE u.team_id = $1 AND u.disabled_at IS NULL AND k.revoked_at IS NULL
             AND (k.expires_at IS NULL OR k.expires_at > $3)""",
        team_id,
        user_id,
        now,
    )
    assert row is not None
    return int(row["user_held"]), int(row["team_held"])


async def insert_token(
    conn: asyncpg.Connection,
    token_hash: str,
    user_id: int,
    name: str,
    expires_at: datetime | None,
    created_by: int | None,
    idempotency_key: str | None = None,
    request_fingerprint: str | None = None,
    replaces: int | None = None,
) -> asyncpg.Record:
    """Insert a token (its hash); with ``idempotency_key`` (and the request's
    ``request_fingerprint``) a second token of the user under that key raises
    ``asyncpg.UniqueViolationError`` (``tokens_idempotency_key``). ``replaces``: the token
    a rotation revoked for it."""
    row = await conn.fetchrow(
        """INSERT INTO tokens (token_hash, user_id, name, expires_at, created_by,
                               idempotency_key, request_fingerprint, replaces)
           VALUES ($1, $2, $3, $4, $5, $6, $7, $8)
           RETURNING id, name, created_at, expires_at""",
        token_hash,
        user_id,
        name,
        expires_at,
        created_by,
        idempotency_key,
        request_fingerprint,
        replaces,
    )
    assert row is not None
    return row


async def token_by_idempotency_key(
    conn: asyncpg.Connection, user_id: int, idempotency_key: str
) -> asyncpg.Record | None:
    """The token the user made under ``idempotency_key``, with its request's fingerprint."""
    return await conn.fetchrow(
        """SELECT id, name, created_at, expires_at, revoked_at, request_fingerprint, replaces
           FROM tokens WHERE user_id = $1 AND idempotency_key = $2""",
        user_id,
        idempotency_key,
    )


_TOKEN_COLUMNS = """k.id, k.name, k.created_at, k.expires_at, k.revoked_at, u.name AS user_name,
                    t.name AS team_name, u.team_id"""


async def tokens_of_user(
    conn: asyncpg.Connection, user_id: int, limit: int, after: int = 0
) -> list[asyncpg.Record]:
    """At most ``limit`` tokens of the user with an id above ``after``, oldest first."""
    rows: list[asyncpg.Record] = await conn.fetch(
        f"""SELECT {_TOKEN_COLUMNS}
            FROM tokens k JOIN users u ON u.id = k.user_id JOIN teams t ON t.id = u.team_id
            WHERE k.user_id = $1 AND k.id > $3 ORDER BY k.id LIMIT $2""",
        user_id,
        limit,
        after,
    )
    return rows


async def token(conn: asyncpg.Connection, token_id: int) -> asyncpg.Record | None:
    return await conn.fetchrow(
        f"""SELECT {_TOKEN_COLUMNS}, k.user_id, u.role AS user_role
            FROM tokens k JOIN users u ON u.id = k.user_id JOIN teams t ON t.id = u.team_id
            WHERE k.id = $1""",
        token_id,
    )


async def revoke_token(conn: asyncpg.Connection, token_id: int, at: datetime) -> bool:
    """Revoke the token; False when it was revoked already."""
    done = await conn.fetchval(
        "UPDATE tokens SET revoked_at = $2 WHERE id = $1 AND revoked_at IS NULL RETURNING true",
        token_id,
        at,
    )
    return bool(done)
