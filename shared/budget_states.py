"""A service's replica of billing's budget states, kept from its ``budget.updated`` events
(billing owns budgets; submission keeps them for admission, the scheduler to hold queued
jobs).

Contract:
- ``keep(conn, table, state, fields)`` writes ``state`` into the replica ``table``, one row
  per team and project (project ``''`` for the team's own budget, as None says in the event),
  with its ``revision`` and the payload's ``fields`` in columns of the same names, unless the
  row already holds that revision or a higher one: redelivery and reordering never bring back
  an older state. It answers whether the row changed.
- The table has a primary key (or unique constraint) on ``(team, project)`` and a ``revision``
  column; ``fields`` are those of ``BudgetUpdated`` a replica keeps (``FIELDS``, the default,
  or with ``OPTIONAL`` ones): ``ValueError`` for a table that is no plain SQL name or a field that is none
  of them, before anything is written.
- A state whose ``rates`` were unreadable on the wire (``BudgetUpdated.rates_unread``: a
  billing of another version, a malformed rate) is kept all the same, every other field
  with it, but the row's ``rates`` stay as they were (a new row: none), and a warning names
  the budget, the field and why: a spent budget holds whatever its rates say, and a budget
  that reserves goes on reserving at the last rates it read (with none: nothing) until a
  state with readable ones comes (billing says every budget again at its start).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence

import asyncpg

from trainyard_platform.shared.events.payloads import BudgetUpdated

FIELDS: tuple[str, ...] = (
    "month",
    "amount",
    "spent",
    "currency",
    "policy",
    "on_exhausted",
    "exhausted",
    "deleted",
)
"""The fields of a ``budget.updated`` besides its key (team, project) and revision that
every replica may keep."""
OPTIONAL: tuple[str, ...] = ("rates", "spent_at", "accruing")
"""Fields a replica keeps only when it names them: ``rates`` and ``accruing`` (JSON in a
``jsonb`` column), ``spent_at`` (a ``timestamptz``); null when the state has none."""
_JSON: tuple[str, ...] = ("rates", "accruing")
log = logging.getLogger(__name__)
_TABLE = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")


async def keep(
    conn: asyncpg.Connection,
    table: str,
    state: BudgetUpdated,
    fields: Sequence[str] = FIELDS,
) -> bool:
    """Keep ``state`` in ``table`` unless a newer one is kept already (module contract);
    True when the row changed."""
    if not _TABLE.fullmatch(table):
        raise ValueError(f"table {table!r} is no plain SQL name")
    unknown = [f for f in fields if f not in FIELDS + OPTIONAL]
    if unknown or not fields:
        raise ValueError(f"fields {unknown or 'none'}: a replica keeps some of {FIELDS + OPTIONAL}")
    if "rates" in fields and state.rates_unread is not None:
        # The state is good but for its rates: keep it (a spent budget must hold), with the
        # rates the row had (a budget reserves at the last rates read, or at none).
        fields = [f for f in fields if f != "rates"]
        log.warning(
            "budget of team %s%s revision %d: kept without its rates, which are unreadable "
            "(%s); %s keeps the rates it had, until a state with readable ones",
            state.team,
            f" project {state.project}" if state.project else "",
            state.revision,
            state.rates_unread,
            table,
        )
    columns = ["team", "project", *fields, "revision"]
    values = [state.team, state.project or "", *(_value(state, f) for f in fields)]
    updates = ", ".join(f"{c} = EXCLUDED.{c}" for c in [*fields, "revision"])
    changed = await conn.fetchval(
        f"INSERT INTO {table} ({', '.join(columns)}) "
        f"VALUES ({', '.join(f'${i}' for i in range(1, len(columns) + 1))}) "
        f"ON CONFLICT (team, project) DO UPDATE SET {updates} "
        f"WHERE {table}.revision < EXCLUDED.revision "
        "RETURNING true",
        *values,
        state.revision,
    )
    return bool(changed)


def _value(state: BudgetUpdated, field: str) -> object:
    if field in _JSON:
        return state.model_dump(mode="json")[field]  # plain JSON values for a jsonb column
    return getattr(state, field)


__all__ = ["FIELDS", "OPTIONAL", "keep"]
