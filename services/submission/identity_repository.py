"""SQL of teams, users and tokens: one function per query, each on a given connection.

Only token hashes are ever stored or compared (``shared.auth``). A token is valid while it is
not revoked, not expired, and its user is not disabled; ``caller_by_token`` checks all three
in one indexed lookup (the primary key), so revocation needs no cache to expire.
"""

from __future__ import annotations

from datetime import datetime

import asyncpg

from trainyard_platform.services.submission.governance import screening_columns


async def caller_by_token(conn: asyncpg.Connection, token_hash: str) -> asyncpg.Record | None:
    return await conn.fetchrow(
        """SELECT u.id AS user_id, u.name AS user_name, u.role, t.id AS team_id,
                  t.name AS team_name, k.id AS token_id, k.name AS token_name, k.expires_at
           FROM tokens k JOIN users u ON u.id = k.user_id JOIN teams t ON t.id = u.team_id
           WHERE k.token_hash = $1 AND k.revoked_at IS NULL AND u.disabled_at IS NULL
             AND (k.expires_at IS NULL OR k.expires_at > now())""",
        token_hash,
    )


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
    team_id = await conn.fetchval(
        "INSERT INTO teams (name) VALUES ($1) ON CONFLICT (name) DO NOTHING RETURNING id", name
    )
    if team_id is None:
        team_id = await conn.fetchval("SELECT id FROM teams WHERE name = $1", name)
    return int(team_id)


async def team_id(conn: asyncpg.Connection, name: str) -> int | None:
    found = await conn.fetchval("SELECT id FROM teams WHERE name = $1", name)
    return None if found is None else int(found)


async def insert_user(conn: asyncpg.Connection, team_id: int, name: str, role: str) -> int | None:
    """The new user's id, or None when the team already has a user of that name."""
    user_id = await conn.fetchval(
        "INSERT INTO users (team_id, name, role) VALUES ($1, $2, $3) "
        "ON CONFLICT (team_id, name) DO NOTHING RETURNING id",
        team_id,
        name,
        role,
    )
    return None if user_id is None else int(user_id)


async def user(conn: asyncpg.Connection, team_id: int, name: str) -> asyncpg.Record | None:
    return await conn.fetchrow(
        "SELECT id, name, role, created_at, disabled_at FROM users WHERE team_id = $1 AND name = $2",
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


async def live_tokens(conn: asyncpg.Connection, user_id: int, now: datetime) -> int:
    """How many unrevoked, unexpired tokens the user has; its row is locked first, so two
    transactions issuing tokens to one user take turns."""
    await conn.execute("SELECT 1 FROM users WHERE id = $1 FOR UPDATE", user_id)
    found: int = await conn.fetchval(
        "SELECT count(*) FROM tokens WHERE user_id = $1 AND revoked_at IS NULL "
        "AND (expires_at IS NULL OR expires_at > $2)",
        user_id,
        now,
    )
    return found


async def insert_token(
    conn: asyncpg.Connection,
    token_hash: str,
    user_id: int,
    name: str,
    expires_at: datetime | None,
    created_by: int | None,
) -> asyncpg.Record:
    row = await conn.fetchrow(
        """INSERT INTO tokens (token_hash, user_id, name, expires_at, created_by)
           VALUES ($1, $2, $3, $4, $5) RETURNING id, name, created_at, expires_at""",
        token_hash,
        user_id,
        name,
        expires_at,
        created_by,
    )
    assert row is not None
    return row


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
