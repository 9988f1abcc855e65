"""Explanations: human sentences for why a pending job waits, who holds what it needs, what
would let it start now, and when it should start.

Contract: pure text builders over plain values; every function returns a non-empty reason
and a non-empty ``blocking`` (who or what holds it: job ids, queue names, or the constraint
itself). Durations are rendered relative to the snapshot's ``now`` ("~12 min").
"""

from __future__ import annotations

from collections.abc import Sequence

from trainyard_platform.shared.waits import NEXT_PASS, duration

MAX_NAMES = 3


def eta(start: float | None, now: float) -> str:
    """Ends a reason; readers count it again from the estimated start (``waits``)."""
    if start is None:
        return "no start can be estimated yet"
    if start <= now:
        return NEXT_PASS
    return f"expected start in {duration(start - now)}"


def names(items: Sequence[str]) -> str:
    """'a', 'a and b', 'a, b, c and 2 more'."""
    shown = list(items[:MAX_NAMES])
    rest = len(items) - len(shown)
    if rest > 0:
        return f"{', '.join(shown)} and {rest} more"
    if len(shown) <= 1:
        return "".join(shown)
    return f"{', '.join(shown[:-1])} and {shown[-1]}"


def gpus(n: int, flavor: str) -> str:
    return f"{n} {flavor} GPU{'s' if n != 1 else ''}"


def layout(count: int, per_node: int) -> str:
    return "on one node" if count == 1 else f"as {count} nodes x {per_node}"


# --- reasons -------------------------------------------------------------------------------


def unknown_queue(queue: str) -> str:
    return f"queue {queue} does not exist; resubmit to an existing queue"


def bad_request(job_gpus: int) -> str:
    return f"asks for {job_gpus} GPUs; a job needs at least 1"


def no_nodes(flavor: str) -> str:
    return f"no ready node has {flavor} GPUs"


def no_shape(job_gpus: int, flavor: str, per_node: int | None, capacity: int, total: int) -> str:
    if job_gpus > total:
        return f"needs {gpus(job_gpus, flavor)}; all ready {flavor} nodes together have {total}"
    if per_node is not None:
        return (
            f"needs {gpus(job_gpus, flavor)} as equal parts of {per_node} per node, which "
            f"{flavor} nodes (at most {capacity} GPUs each) cannot hold"
        )
    return (
        f"needs {gpus(job_gpus, flavor)}, which cannot be split into equal parts on "
        f"{flavor} nodes of at most {capacity} GPUs"
    )


def quota_ceiling(queue: str, job_gpus: int, flavor: str, ceiling: int) -> str:
    return (
        f"needs {gpus(job_gpus, flavor)} but queue {queue} can never hold more than {ceiling} "
        f"(its quota plus what it may borrow)"
    )


def no_borrowing(queue: str, job_gpus: int, flavor: str, nominal: int, priority: str) -> str:
    return (
        f"needs {gpus(job_gpus, flavor)} but priority class {priority} is not preemptible, so "
        f"its jobs never borrow and queue {queue} holds at most its nominal quota of {nominal}"
    )


NOT_BORROWING = "its priority class is not preemptible, so it never borrows"
"""Said after a quota wait of a job that would borrow if it were preemptible."""


def nominal_full(queue: str, flavor: str, used: int, nominal: int, holders: Sequence[str]) -> str:
    held = f" (jobs {names(holders)})" if holders else ""
    if nominal == 0:
        return f"queue {queue} has no {flavor} quota"
    return f"queue {queue} uses {used} of its {nominal} {flavor} quota{held}"


def borrow_limit(queue: str, flavor: str, borrowed: int, limit: int) -> str:
    return (
        f"queue {queue} already borrows {borrowed} {flavor} GPUs of its cohort; its borrowing "
        f"limit is {limit}"
    )


def cohort_full(
    queue: str, flavor: str, used: int, nominal: int, idle: int, holders: Sequence[str]
) -> str:
    """'queue qa uses 15 of its 16 a100 quota and the cohort has 1 idle GPU to lend
    (held by qb using 16)'."""
    held = f" (the rest is used by {names(holders)})" if holders else ""
    return (
        f"queue {queue} uses {used} of its {nominal} {flavor} quota and its cohort has "
        f"{idle} idle to lend{held}"
    )


def reclaim(
    flavor: str,
    nominal: int,
    taken: Sequence[tuple[str, int]],
    start: float | None,
    now: float,
    preempting: bool,
) -> str:
    """'team-b borrows 6 of your 8 a100 quota; reclaim expected in ~12 min' when the quota
    comes back by preemption; '...; it returns as their jobs end, expected in ~5.5 h' when
    it waits for jobs that end by themselves first (ones that may not be preempted, or not
    yet): telling that user "reclaim" promised a preemption that was not coming."""
    parts = [f"{team} borrows {n}" for team, n in taken[:MAX_NAMES]] or ["other queues borrow it"]
    joined = f"{names(parts)} of your {nominal} {flavor} quota"
    if start is None:
        return f"{joined}; no return can be estimated yet"
    when = eta(start, now).replace("expected start", "expected")
    if preempting:
        return f"{joined}; reclaim {when}"
    return f"{joined}; it returns as their jobs end, {when}"


def capacity(
    job_gpus: int,
    flavor: str,
    shape: tuple[int, int],
    largest: int,
    where: str,
    holders: Sequence[str],
) -> str:
    if largest == 0:
        held = f"; they are held by {names(holders)}" if holders else ""
        return f"needs {gpus(job_gpus, flavor)} {layout(*shape)}; no {flavor} GPU is free{held}"
    held = f"; the rest is held by {names(holders)}" if holders else ""
    at = f" on {where}" if where else ""
    return (
        f"needs {gpus(job_gpus, flavor)} {layout(*shape)}; the largest free block is "
        f"{largest}{at}{held}"
    )


def reserved_for(flavor: str, holders: Sequence[str]) -> str:
    return (
        f"the free {flavor} GPUs it fits on are reserved for {names(holders)} (ahead in line), "
        f"and it would still be running when they start"
    )


def reserved_ahead(flavor: str, holders: Sequence[str]) -> str:
    """Why a job that could preempt does not: what it would free is reserved ahead of it."""
    return (
        f"the {flavor} GPUs preempting would free are reserved for {names(holders)} (ahead in "
        f"line), and it would still be running when they start"
    )


def held(job_id: str, queue: str, flavor: str, waited: str) -> str:
    return (
        f"waits behind job {job_id}, which has waited {waited} for queue {queue}'s {flavor} "
        f"quota and goes first when it frees up"
    )


def behind(job_id: str) -> str:
    return f"waits behind job {job_id}, which is first in line for its GPUs (backfill is off)"


def preempting(victims: Sequence[str], kind: str, grace: str) -> str:
    why = {
        "priority": "lower priority jobs of its queue",
        "reclaim": "jobs running on borrowed quota",
        "leaving": "jobs already leaving",
    }[kind]
    return f"freeing GPUs held by {why} ({names(victims)}); they checkpoint and stop within {grace}"


def work_lost(seconds: float, gpus: int, checkpointed: bool) -> str:
    """What a victim loses: 'it loses ~12 min of work on 4 GPUs since its last checkpoint'."""
    since = "its last checkpoint" if checkpointed else "it started"
    return f"it loses {duration(seconds)} of work on {gpus} GPU{'s' if gpus != 1 else ''} since {since}"


def victim(for_job: str, kind: str, detail: str) -> str:
    """A victim's notice; ``for_job``: the waiting job's id (priority: the same queue, so the
    same team) or a description of it (reclaim: another team's)."""
    if kind == "priority":
        return f"preempted for job {for_job}: {detail}"
    return f"preempted to return borrowed quota for {for_job}: {detail}"


# --- suggestions ---------------------------------------------------------------------------


def fewer_gpus(n: int) -> str:
    return f"asking for {n} GPU{'s' if n != 1 else ''} would let it start now"


def shorter_runtime(seconds: float) -> str:
    return f"a declared max runtime under {duration(seconds)[1:]} would let it start now"
