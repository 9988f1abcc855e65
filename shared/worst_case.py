"""A job's worst case against a budget that reserves it: what the scheduler reserves a job
at (``budget_holds``) and what submission refuses at admission when it is more than the
whole budget (``governance``), one computation for both.

Contract:
- ``holds_queued(policy, on_exhausted)``: a spent budget holds its queued jobs when its
  policy is ``refuse`` or its ``on_exhausted`` is ``stop``; such a budget whose state
  carries billing's ``rates`` reserves each job's worst case (``reserves``).
- ``decimal(value)``: a decimal string (amount, spent, a price) as a ``Decimal``; 0 for
  anything that is no positive finite number (a state's values are billing's, never
  trusted to parse).
- ``hourly(job, rates)``: what an hour of ``job`` (a mapping with ``gpus``, ``gpu_flavor``,
  ``cpus_per_gpu``, ``memory_gib_per_gpu``) costs at most at ``rates`` (a budget state's,
  per flavor ``gpu_hour``, ``cpu_hour``, ``memory_gib_hour``); 0 for a flavor without a
  rate. ``prices(rate)``/``hourly_at(job, prices)`` do the same from one flavor's rate
  parsed once.
- ``KILL_GRACE_SECONDS``: the most a job runs past its ``max_runtime_seconds``. The runner
  stops a job at its limit with SIGTERM and SIGKILLs it after its ``kill_grace_seconds``,
  which is at most this (its settings refuse more); all the while the job holds its GPUs
  and is billed them. ``attempt_seconds(max_runtime_seconds)``: the limit and the grace,
  the most one attempt (one allocation) is billed: ``billed_until(granted_at,
  max_runtime_seconds)``, its grant plus that, is the latest end of its billed interval,
  and the scheduler ends every release's billed interval by then
  (``services.scheduler.domain.release_time``). An allocation is held longer than its
  process runs (before: its code fetched, environment built, checkpoint restored, with
  no bound while the object store is away; after: the wait for its last checkpoint's
  upload, ``checkpoint_upload_wait_seconds`` of its runner): that time is billed only as
  far as this bound, the rest is the platform's, so the worst case is a true bound.
- ``worst(per_hour, seconds)``: ``seconds`` at ``per_hour``, rounded up to a micro-unit;
  ``reservation(job, rates)`` is ``worst(hourly(job, rates),
  attempt_seconds(max_runtime_seconds))``.
- ``longest_within(per_hour, amount)``: the most whole seconds whose ``worst`` is within
  ``amount``; ``longest_runtime_within(per_hour, amount)``: the longest
  ``max_runtime_seconds`` whose attempt (``attempt_seconds``) is, 0 when not even the grace
  is.
- ``over_whole(need, per_hour, amount)``: ``OverWhole`` when a worst case ``need`` (at
  ``per_hour``) is more than the whole ``amount``, with the longest ``max_runtime_seconds``
  the amount covers (``longest_runtime_within``); else None. ``over_whole_reason`` and ``over_whole_remedy`` say it in
  words, as the scheduler's note and submission's refusal both say it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import ROUND_CEILING, Decimal, InvalidOperation
from typing import Any

Job = Mapping[str, Any]
Prices = tuple[Decimal, Decimal, Decimal]
"""One flavor's rates parsed: GPU-hour, CPU-hour and memory GiB-hour prices."""
_MICRO = Decimal("0.000001")

KILL_GRACE_SECONDS = 30
"""The most a job runs past its ``max_runtime_seconds`` before it is killed (module
contract): the runner's default and largest ``kill_grace_seconds``, so a worst case that
counts it is one the runner cannot exceed."""


def attempt_seconds(max_runtime_seconds: int) -> int:
    """What one attempt of a job with this limit is reserved and billed at most: the limit
    and the kill grace after it, the longest its process runs, counted from its grant
    (``billed_until``): its preparation and its last checkpoint's upload wait are billed
    within it, never beyond."""
    return max_runtime_seconds + KILL_GRACE_SECONDS


def billed_until(granted_at: datetime, max_runtime_seconds: int) -> datetime:
    """The latest end of the billed interval of an allocation granted at ``granted_at`` to
    a job with this limit: the grant plus ``attempt_seconds`` (module contract)."""
    return granted_at + timedelta(seconds=attempt_seconds(max_runtime_seconds))


def holds_queued(policy: str, on_exhausted: str) -> bool:
    """Whether a spent budget with this policy holds its queued jobs (module contract)."""
    return policy == "refuse" or on_exhausted == "stop"


def reserves(policy: str, on_exhausted: str, rates: object) -> bool:
    """Whether a budget state reserves each job's worst case (module contract)."""
    return rates is not None and holds_queued(policy, on_exhausted)


def decimal(value: object) -> Decimal:
    """``value`` as a positive finite ``Decimal``, else 0 (module contract)."""
    try:
        found = Decimal(str(value))
    except InvalidOperation:
        return Decimal(0)
    return found if found.is_finite() and found > 0 else Decimal(0)


def prices(rate: Mapping[str, Any]) -> Prices:
    """One flavor's rate parsed (``hourly_at``)."""
    return (
        decimal(rate.get("gpu_hour")),
        decimal(rate.get("cpu_hour")),
        decimal(rate.get("memory_gib_hour")),
    )


def hourly_at(job: Job, parsed: Prices) -> Decimal:
    """What an hour of ``job`` costs at most at its flavor's parsed ``prices``."""
    gpu, cpu, memory = parsed
    return Decimal(job["gpus"]) * (
        gpu
        + Decimal(job.get("cpus_per_gpu") or 0) * cpu
        + Decimal(job.get("memory_gib_per_gpu") or 0) * memory
    )


def hourly(job: Job, rates: Mapping[str, Any]) -> Decimal:
    """What an hour of ``job`` costs at most at ``rates``; 0 for a flavor without a rate."""
    rate = rates.get(job["gpu_flavor"])
    if not rate:
        return Decimal(0)
    return hourly_at(job, prices(rate))


def worst(per_hour: Decimal, seconds: int) -> Decimal:
    """``seconds`` at ``per_hour``, rounded up to a micro-unit."""
    cost = per_hour * Decimal(seconds) / Decimal(3600)
    return cost.quantize(_MICRO, rounding=ROUND_CEILING)


def reservation(job: Job, rates: Mapping[str, Any]) -> Decimal:
    """The worst case of one attempt of ``job`` at ``rates`` (module contract)."""
    return worst(hourly(job, rates), attempt_seconds(job["max_runtime_seconds"]))


def longest_within(per_hour: Decimal, amount: Decimal) -> int:
    """The most whole seconds whose worst case at ``per_hour`` (rounded up as
    ``reservation`` rounds it) is within ``amount``."""
    if per_hour <= 0:
        raise ValueError("per_hour: must be > 0")
    seconds = int(max(amount, Decimal(0)) * 3600 / per_hour)
    while seconds > 0 and worst(per_hour, seconds) > amount:
        seconds -= 1
    return seconds


def longest_runtime_within(per_hour: Decimal, amount: Decimal) -> int:
    """The longest ``max_runtime_seconds`` whose attempt (the limit and the kill grace,
    ``attempt_seconds``) costs at most ``amount`` at ``per_hour``; 0 when none does."""
    return max(0, longest_within(per_hour, amount) - KILL_GRACE_SECONDS)


@dataclass(frozen=True)
class OverWhole:
    """A worst case more than a budget's whole amount."""

    need: Decimal
    """The job's worst case."""
    longest: int
    """The longest ``max_runtime_seconds`` the amount covers at the job's hourly price (0:
    not a second: the job must ask for less than that)."""


def over_whole(need: Decimal, per_hour: Decimal, amount: Decimal) -> OverWhole | None:
    """``OverWhole`` when ``need`` is more than ``amount``, else None (module contract)."""
    if need <= amount:
        return None
    return OverWhole(need, longest_runtime_within(per_hour, amount) if per_hour > 0 else 0)


def over_whole_reason(over: OverWhole, scope: str, amount: str, currency: str) -> str:
    """What is wrong, in words: the worst case, and the whole budget of ``scope`` (its
    ``amount`` as billing said it)."""
    return (
        f"this job's worst case ({over.need} {currency}: its GPUs, CPUs and memory for its "
        f"max_runtime_seconds and the {KILL_GRACE_SECONDS} s kill grace at the highest prices) "
        f"is more than the whole budget of {scope} ({amount} {currency} a month)"
    )


def raise_budget(
    team: str, project: str | None, at_least: Decimal | None = None, currency: str = ""
) -> str:
    """Who raises the budget of ``team`` (its ``project``'s, when one is named) and how: the
    CLI command and the route it calls, to ``at_least`` ``currency`` when that is known.
    Every suggestion to raise a budget is worded by this."""
    target, path = team, f"/v1/budgets/{team}"
    if project:
        target, path = f"{team} --project {project}", f"/v1/budgets/{team}/{project}"
    to = "" if at_least is None else f" to at least {at_least} {currency}"
    amount = "AMOUNT" if at_least is None else str(at_least)
    return (
        f"ask a team admin or an operator to raise the budget{to} "
        f"(trainyard budget set {target} --amount {amount}, or PATCH {path})"
    )


def over_whole_remedy(over: OverWhole, currency: str, team: str, project: str | None) -> str:
    """What would let the job start: the longest ``max_runtime_seconds`` the budget covers
    (or fewer GPUs when not a second is covered), or a budget of ``team`` (``project``) of at
    least the worst case (``raise_budget``)."""
    shorter = (
        f"lower max_runtime_seconds to at most {over.longest} (what the budget covers at these "
        "prices)"
        if over.longest > 0
        else "ask for fewer GPUs"
    )
    return f"{shorter}, or {raise_budget(team, project, over.need, currency)}"


__all__ = [
    "KILL_GRACE_SECONDS",
    "OverWhole",
    "Prices",
    "attempt_seconds",
    "billed_until",
    "decimal",
    "holds_queued",
    "hourly",
    "hourly_at",
    "longest_runtime_within",
    "longest_within",
    "over_whole",
    "over_whole_reason",
    "over_whole_remedy",
    "prices",
    "raise_budget",
    "reservation",
    "reserves",
    "worst",
]
