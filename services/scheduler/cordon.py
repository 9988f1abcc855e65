"""Cordoned nodes: taken out of placement, their running jobs left alone.

Contract:
- A cordoned node gets no new allocation: the snapshot leaves it out of the policy's
  ``nodes`` (``repository.load_snapshot_rows``), as it leaves out a lost one, while its
  running jobs stay in ``running`` (their quota, usage and fair share still count, and
  with no node of theirs in the pool they never free GPUs for a waiting job there). It
  still heartbeats, reports and releases as before.
- An operator cordons (``cordon``, with a reason) until an operator uncordons (``uncordon``,
  which also forgets the node's platform failures). The scheduler cordons a node itself when
  ``Tuning.cordon_after_platform_failures`` (K; 0: never) of its allocations in a row
  ended in ``platform_error`` that its runner said was the node's own fault
  (``JobFailed.node_fault``: its GPUs, disk, runtime, own credentials), for
  ``Tuning.cordon_seconds`` (its ``cordoned_until``), with the reason ``N platform
  failures in a row: <the last one's reason>``, and logs a warning naming the node. A
  success on the node resets its count; other ends (a job's own failure, a platform
  failure that follows the job's own input such as its git host or its command, a
  preemption, a cancel, a lost node) neither count nor reset: what a tenant submits never
  takes a node out of service. A further
  platform failure while it is cordoned so extends the period; an operator's cordon is
  never replaced by an automatic one (an operator's cordon replaces an automatic one).
- ``lift_expired`` (the pass loop, before each pass) uncordons the nodes whose automatic
  cordon has run out, and says when the next one ends; their count stays, so one more
  platform failure cordons again.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from datetime import datetime, timedelta

import asyncpg

log = logging.getLogger(__name__)

SCHEDULER = "scheduler"
"""``cordoned_by`` of an automatic cordon."""

NodeEnd = tuple[str, str | None]
"""An allocation's end as the node's health sees it: (node id, the platform failure's
reason), the reason None for a success."""


def tally(before: int, ends: Sequence[str | None]) -> tuple[int, str | None]:
    """The node's count of platform failures in a row after ``ends`` (in order: a reason
    adds one, None -- a success -- resets to 0), from ``before``; and the reason of the
    last failure counted (None when the count is 0)."""
    count, last = before, None
    for reason in ends:
        if reason is None:
            count, last = 0, None
        else:
            count, last = count + 1, reason
    return count, last


def cordons(count: int, after: int) -> bool:
    """Whether ``count`` platform failures in a row cordon the node (``after``: K; 0 never)."""
    return after > 0 and count >= after


def automatic_reason(count: int, last: str) -> str:
    return f"{count} platform failures in a row: {last}"


async def record_ends(
    conn: asyncpg.Connection,
    ends: Sequence[NodeEnd],
    now: datetime,
    after: int,
    period_s: float,
) -> list[str]:
    """Count these ends (in order) against their nodes and cordon those that reach ``after``
    platform failures in a row for ``period_s`` (see the module docstring); returns the
    nodes cordoned or whose cordon was extended."""
    by_node: dict[str, list[str | None]] = {}
    for node_id, reason in ends:
        by_node.setdefault(node_id, []).append(reason)
    if not by_node:
        return []
    if all(reason is None for reasons in by_node.values() for reason in reasons):
        # Successes only (nearly every batch): one statement, which writes only the rows
        # of nodes that had failures to forget.
        await conn.execute(
            "UPDATE nodes SET platform_failures = 0 "
            "WHERE node_id = ANY($1::text[]) AND platform_failures <> 0",
            sorted(by_node),
        )
        return []
    rows = await conn.fetch(
        "SELECT node_id, platform_failures FROM nodes WHERE node_id = ANY($1::text[]) "
        "ORDER BY node_id FOR UPDATE",
        sorted(by_node),
    )
    counted = {r["node_id"]: tally(r["platform_failures"], by_node[r["node_id"]]) for r in rows}
    await conn.execute(
        "UPDATE nodes SET platform_failures = v.count "
        "FROM unnest($1::text[], $2::int[]) AS v(node_id, count) "
        "WHERE nodes.node_id = v.node_id AND nodes.platform_failures <> v.count",
        list(counted),
        [count for count, _ in counted.values()],
    )
    cordoned: list[str] = []
    for node_id, (count, last) in counted.items():
        if last is None or not cordons(count, after):
            continue
        reason = automatic_reason(count, last)
        done = await conn.fetchval(
            "UPDATE nodes SET cordoned_at = COALESCE(cordoned_at, $2), cordon_reason = $3, "
            "cordoned_by = $4, cordoned_until = $5 "
            # An operator's cordon (no end) stays as the operator set it.
            "WHERE node_id = $1 AND (cordoned_at IS NULL OR cordoned_until IS NOT NULL) "
            "RETURNING true",
            node_id,
            now,
            reason,
            SCHEDULER,
            now + timedelta(seconds=period_s),
        )
        if done:
            cordoned.append(node_id)
            log.warning(
                "node %s cordoned for %.0f s: %s (no new allocation is placed on it)",
                node_id,
                period_s,
                reason,
            )
    return cordoned


async def lift_expired(conn: asyncpg.Connection, now: datetime) -> datetime | None:
    """Uncordon the nodes whose automatic cordon ended by ``now`` (each logged), and return
    when the next automatic cordon still in place ends (None: none is). One statement: the
    pass loop calls it before every pass."""
    row = await conn.fetchrow(
        "WITH lifted AS (UPDATE nodes SET cordoned_at = NULL, cordon_reason = NULL, "
        "cordoned_by = NULL, cordoned_until = NULL WHERE cordoned_until <= $1 "
        "RETURNING node_id) "
        "SELECT ARRAY(SELECT node_id FROM lifted ORDER BY node_id) AS lifted, "
        "(SELECT min(cordoned_until) FROM nodes WHERE cordoned_until > $1) AS next_end",
        now,
    )
    assert row is not None  # a SELECT without FROM has one row
    for node_id in row["lifted"]:
        log.info("node %s: its automatic cordon ended; it takes new allocations again", node_id)
    next_end: datetime | None = row["next_end"]
    return next_end


async def cordon(
    conn: asyncpg.Connection, node_id: str, reason: str, by: str, now: datetime
) -> bool:
    """An operator's cordon of ``node_id`` (until ``uncordon``): it replaces any cordon in
    place; an operator's cordon already in place keeps its start. False: no such node."""
    done = await conn.fetchval(
        "UPDATE nodes SET cordoned_at = CASE WHEN cordoned_until IS NULL "
        "THEN COALESCE(cordoned_at, $4) ELSE $4 END, "
        "cordon_reason = $2, cordoned_by = $3, cordoned_until = NULL "
        "WHERE node_id = $1 RETURNING true",
        node_id,
        reason,
        by,
        now,
    )
    return bool(done)


async def uncordon(conn: asyncpg.Connection, node_id: str) -> bool:
    """Lift any cordon of ``node_id`` and forget its platform failures (the operator says it
    is fixed). False: no such node."""
    done = await conn.fetchval(
        "UPDATE nodes SET cordoned_at = NULL, cordon_reason = NULL, cordoned_by = NULL, "
        "cordoned_until = NULL, platform_failures = 0 WHERE node_id = $1 RETURNING true",
        node_id,
    )
    return bool(done)
