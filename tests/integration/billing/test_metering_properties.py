"""Property: whatever the bus does to allocation events, the ledger bills each allocation
exactly as an independent reference says, to the micro-unit.

Hypothesis generates jobs with several attempts (each a new allocation at a higher epoch,
some on two nodes), each allocation's fate (released; lost and later reported succeeded;
its release never arriving), duplicates (the scheduler repeating an event under a new id),
redeliveries (the same event id again, past JetStream's de-duplication) and any order in
which a grant still precedes the releases of its allocation (the scheduler's outbox
publishes them in that order, and billing meters only announced allocations). The events
go through billing's real consumer (JetStream, the inbox, the handlers) into a real
PostgreSQL. The reference below prices with ``fractions.Fraction`` and integer
microseconds, sharing no code with billing.

Jobs declare CPUs and memory per GPU (or none): ``a100`` has a CPU price that changes
during the drawn leases and a memory price, ``cpu`` has neither (its CPU and memory time is
charged 0). A bill is split wherever a price of something it holds changes, each line of
each piece rounded on its own.

Some allocations' runners report a failure (in any order with the grant and releases): one
through the platform (``platform_error``) is billed nothing to its team, however the events
come; one through the job's code (``user_error``) is billed as any other.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from fractions import Fraction
from itertools import pairwise

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.integration.billing.conftest import Billing, grant_of, until
from trainyard_platform.shared.events import Envelope, Payload
from trainyard_platform.shared.events.payloads import (
    AllocationGranted,
    AllocationReleased,
    JobFailed,
)
from trainyard_platform.shared.events.trust import RUNNER, owner

pytestmark = pytest.mark.integration

PRICES = {"cpu": Fraction(1, 10), "a100": Fraction(5, 2)}  # the billing fixture's price book
T0 = datetime(2026, 11, 30, 22, 0, tzinfo=UTC)
BEGINNING = datetime(1970, 1, 1, tzinfo=UTC)
RESOURCE_PRICES = {
    ("a100", "cpu"): [
        (BEGINNING, Fraction(3, 100)),
        (T0 + timedelta(minutes=30), Fraction(7, 100)),
        (T0 + timedelta(hours=2), Fraction(1, 30)),
    ],
    ("a100", "memory"): [(BEGINNING, Fraction(1, 250)), (T0 + timedelta(hours=1), Fraction(0))],
}
"""Per CPU-hour and GiB-hour, set in the book by the test (``cpu`` has none)."""


@dataclass(frozen=True)
class Lease:
    """One allocation and what became of it."""

    allocation_id: str
    job_id: str
    team: str
    flavor: str
    gpus: int
    epoch: int
    granted_at: datetime
    ended_at: datetime
    fate: str
    """``released``, ``lost_then_succeeded`` or ``end_lost`` (its release never arrives)."""
    outcome: str
    lost_at: datetime
    cpus_per_gpu: int = 0
    memory_gib_per_gpu: int = 0
    report: str | None = None
    """The ``failure_kind`` of the runner's ``job.failed`` of it (None: no report sent); a
    ``platform_error`` makes it the platform's: its team is billed nothing."""


def _release(lease: Lease, outcome: str, at: datetime) -> AllocationReleased:
    return AllocationReleased(
        allocation_id=lease.allocation_id,
        job_id=lease.job_id,
        node_id=f"node-{lease.epoch % 2}",
        team=lease.team,
        user="ada",
        gpu_flavor=lease.flavor,
        gpus=lease.gpus,
        granted_at=lease.granted_at,
        released_at=at,
        outcome=outcome,  # type: ignore[arg-type]
    )


def failure_of(lease: Lease) -> JobFailed:
    """The runner's report that the lease's attempt failed (in any order with its grant and
    releases: billing may read it before either)."""
    return JobFailed(
        job_id=lease.job_id,
        allocation_id=lease.allocation_id,
        node_id=f"node-{lease.epoch % 2}",
        epoch=lease.epoch,
        finished_at=lease.ended_at,
        exit_code=None,
        reason="failed",
        failure_kind=lease.report,  # type: ignore[arg-type]
    )


def releases_of(lease: Lease) -> list[AllocationReleased]:
    if lease.fate == "end_lost":
        return []
    if lease.fate == "lost_then_succeeded":
        return [
            _release(lease, "lost", lease.lost_at),
            _release(lease, "succeeded", lease.ended_at),
        ]
    return [_release(lease, lease.outcome, lease.ended_at)]


@st.composite
def leases(draw: st.DrawFn, team: str) -> list[Lease]:
    out = []
    epoch = 0
    for j in range(draw(st.integers(1, 3))):
        start = T0 + timedelta(microseconds=draw(st.integers(0, 3 * 3600 * 10**6)))
        for _attempt in range(draw(st.integers(1, 3))):
            epoch += draw(st.integers(1, 3))  # epochs only grow, with gaps
            flavor = draw(st.sampled_from(sorted(PRICES)))
            for _node in range(draw(st.integers(1, 2))):  # a gang of one or two nodes
                length = timedelta(microseconds=draw(st.integers(0, 5 * 3600 * 10**6)))
                lost_after = draw(st.integers(0, 10**6 * 600))
                out.append(
                    Lease(
                        allocation_id=f"{team}-a{len(out)}",
                        job_id=f"{team}-j{j}",
                        team=team,
                        flavor=flavor,
                        gpus=draw(st.integers(1, 8)),
                        epoch=epoch,
                        granted_at=start,
                        ended_at=start + length,
                        fate=draw(st.sampled_from(["released", "lost_then_succeeded", "end_lost"])),
                        outcome=draw(
                            st.sampled_from(
                                ["succeeded", "failed", "cancelled", "preempted", "lost"]
                            )
                        ),
                        lost_at=start + min(length, timedelta(microseconds=lost_after)),
                        cpus_per_gpu=draw(st.sampled_from([0, 1, 12])),
                        memory_gib_per_gpu=draw(st.sampled_from([0, 3, 80])),
                        report=draw(st.sampled_from([None, "user_error", "platform_error"])),
                    )
                )
            start = start + timedelta(microseconds=draw(st.integers(0, 3600 * 10**6)))
    return out


@dataclass(frozen=True)
class Sent:
    envelope: Envelope[Payload]
    redelivery: bool
    """Published again under its own event id (as JetStream redelivers), not a new event."""


@st.composite
def histories(draw: st.DrawFn) -> tuple[list[Lease], list[Sent]]:
    team = f"t{uuid.uuid4().hex[:10]}"
    drawn = draw(leases(team))
    first: list[Sent] = []
    for lease in drawn:
        grant = grant_of(_release(lease, "succeeded", lease.ended_at))
        assert isinstance(grant.data, AllocationGranted)
        spec = grant.data.spec.model_copy(
            update={
                "cpus_per_gpu": lease.cpus_per_gpu,
                "memory_gib_per_gpu": lease.memory_gib_per_gpu,
            }
        )
        grant = grant.model_copy(
            update={"data": grant.data.model_copy(update={"epoch": lease.epoch, "spec": spec})}
        )
        first.append(Sent(grant, False))
        for released in releases_of(lease):
            payload: Payload = released
            first.append(
                Sent(Envelope.wrap(payload, source=owner(payload), subject=lease.job_id), False)
            )
        if lease.report is not None:
            report: Payload = failure_of(lease)
            first.append(Sent(Envelope.wrap(report, source=RUNNER, subject=lease.job_id), False))
    extra: list[Sent] = []
    for sent in first:
        for _ in range(draw(st.integers(0, 2))):
            if draw(st.booleans()):
                extra.append(Sent(sent.envelope, True))
            else:  # the same fact said again as a new event
                again = Envelope.wrap(
                    sent.envelope.data, source=sent.envelope.source, subject=sent.envelope.subject
                )
                extra.append(Sent(again, False))
    order = draw(st.permutations(first + extra))
    return drawn, announced_first(order)


def announced_first(order: list[Sent]) -> list[Sent]:
    """``order`` with each allocation's first grant moved before its first release."""
    out: list[Sent] = []
    granted: set[str] = set()
    held: dict[str, list[Sent]] = {}
    for sent in order:
        data = sent.envelope.data
        allocation = getattr(data, "allocation_id", "")
        if isinstance(data, AllocationReleased) and allocation not in granted:
            held.setdefault(allocation, []).append(sent)
            continue
        out.append(sent)
        if allocation not in granted and isinstance(data, AllocationGranted):
            granted.add(allocation)
            out.extend(held.pop(allocation, []))
    assert not held
    return out


def _micro(value: Fraction) -> Fraction:
    """Half-up (away from zero) to 6 places, on exact fractions."""
    scaled = value * 10**6
    whole, rest = divmod(scaled.numerator, scaled.denominator)
    if 2 * rest >= scaled.denominator:
        whole += 1
    return Fraction(whole, 10**6)


def _seconds(start: datetime, end: datetime) -> Fraction:
    delta = end - start
    return Fraction((delta.days * 86_400 + delta.seconds) * 10**6 + delta.microseconds, 10**6)


def _price(flavor: str, resource: str, at: datetime) -> Fraction:
    """The resource's price at ``at``; 0 where the flavor has none."""
    return max(
        ((since, p) for since, p in RESOURCE_PRICES.get((flavor, resource), []) if since <= at),
        default=(BEGINNING, Fraction(0)),
    )[1]


def reference(lease: Lease, order: list[Sent]) -> tuple[Fraction, Fraction] | None:
    """What ``lease``'s team must be billed: (GPU-seconds, cost of GPUs, CPUs and memory),
    or None (nothing); 0 and 0 for an attempt the runner said failed through the platform."""
    seen = [
        s.envelope.data
        for s in order
        if isinstance(s.envelope.data, AllocationReleased)
        and s.envelope.data.allocation_id == lease.allocation_id
    ]
    if not seen:
        return None
    if lease.report == "platform_error":
        return Fraction(0), Fraction(0)
    bill = seen[0]
    end, outcome = bill.released_at, bill.outcome
    for later in seen[1:]:
        if outcome == "lost" and later.outcome == "succeeded":
            end, outcome = max(end, later.released_at), "succeeded"
    cpus, memory = lease.gpus * lease.cpus_per_gpu, lease.gpus * lease.memory_gib_per_gpu
    cuts = {
        since
        for (flavor, resource), dated in RESOURCE_PRICES.items()
        for since, _ in dated
        if flavor == lease.flavor
        and (cpus if resource == "cpu" else memory)
        and lease.granted_at < since < end
    }
    bounds = [lease.granted_at, *sorted(cuts), end]
    cost = Fraction(0)
    for a, b in pairwise(bounds):
        secs = _seconds(a, b)
        cost += _micro(lease.gpus * secs * PRICES[lease.flavor] / 3600)
        if cpus:
            cost += _micro(cpus * secs * _price(lease.flavor, "cpu", a) / 3600)
        if memory:
            cost += _micro(memory * secs * _price(lease.flavor, "memory", a) / 3600)
    return lease.gpus * _seconds(lease.granted_at, end), cost


@settings(
    max_examples=20,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(history=histories())
async def test_the_ledger_equals_the_reference_under_any_delivery(
    billing: Billing, history: tuple[list[Lease], list[Sent]]
) -> None:
    drawn, order = history
    team = drawn[0].team
    for (flavor, resource), dated in RESOURCE_PRICES.items():
        for since, price in dated:
            await billing.pool.execute(
                "INSERT INTO resource_prices (flavor, resource, effective_from, "
                "price_per_unit_hour, currency, set_by, recorded_at) "
                "VALUES ($1, $2, $3, $4, 'USD', 'test', now()) ON CONFLICT DO NOTHING",
                flavor,
                resource,
                since,
                Decimal(price.numerator) / Decimal(price.denominator),
            )
    for n, sent in enumerate(order):
        if sent.redelivery:
            env = sent.envelope
            await billing.bus.publish_raw(
                env.nats_subject, env.to_json(), f"{env.id}:again:{n}", {}
            )
        else:
            await billing.bus.publish(sent.envelope)
    ids = {s.envelope.id for s in order}

    async def all_handled() -> bool:
        count = await billing.pool.fetchval(
            "SELECT count(*) FROM inbox WHERE consumer = 'billing' AND event_id = ANY($1::text[])",
            list(ids),
        )
        return bool(count == len(ids))

    await until(all_handled)
    # Redeliveries behind the last new event: let the consumer reach the stream's end.
    last = grant_of(_release(drawn[0], "succeeded", drawn[0].ended_at))  # a repeated grant
    await billing.bus.publish(last)
    await billing.processed(last)

    rows = await billing.pool.fetch(
        "SELECT allocation_id, kind, revision, segment, gpu_seconds, cost FROM ledger_entries "
        "WHERE team = $1",
        team,
    )
    billed: dict[str, tuple[Decimal, Decimal]] = {}
    kinds: dict[str, list[tuple[str, int]]] = {}
    segments: dict[tuple[str, str, int], list[int]] = {}
    for r in rows:
        secs, cost = billed.get(r["allocation_id"], (Decimal(0), Decimal(0)))
        billed[r["allocation_id"]] = (secs + r["gpu_seconds"], cost + r["cost"])
        if r["segment"] == 0:
            kinds.setdefault(r["allocation_id"], []).append((r["kind"], r["revision"]))
        key = (r["allocation_id"], r["kind"], r["revision"])
        segments.setdefault(key, []).append(r["segment"])
    # Each charge or reversal is its pieces, numbered from 0 without a gap.
    assert all(sorted(numbers) == list(range(len(numbers))) for numbers in segments.values())
    platforms = {lease.allocation_id for lease in drawn if lease.report == "platform_error"}
    expected = {}
    for lease in drawn:
        ref = reference(lease, order)
        if ref is not None:
            expected[lease.allocation_id] = ref
    assert set(billed) <= set(expected)
    for allocation, (secs, cost) in expected.items():
        team_pays = allocation not in platforms
        assert Fraction(billed.get(allocation, (0, 0))[0]) == secs, allocation
        assert Fraction(billed.get(allocation, (0, 0))[1]) == cost, allocation
        assert sorted(kinds.get(allocation, [])) in (
            ([("charge", 0)], [("charge", 0), ("charge", 1), ("reversal", 0)])
            if team_pays
            # the platform's: no charge, or the team's current charge reversed (the report
            # came after the bill, or after its amendment too)
            else (
                [],
                [("charge", 0), ("reversal", 0)],
                [("charge", 0), ("charge", 1), ("reversal", 0), ("reversal", 1)],
            )
        ), allocation
    # The rollups hold exactly the ledger, at every granularity.
    total_cost = sum((c for _, c in expected.values()), Fraction(0))
    total_secs = sum((s for s, _ in expected.values()), Fraction(0))
    for unit in ("hour", "day", "month"):
        secs, cost = await billing.pool.fetchrow(
            "SELECT coalesce(sum(gpu_seconds), 0), coalesce(sum(cost), 0) FROM cost_rollups "
            "WHERE team = $1 AND granularity = $2",
            team,
            unit,
        )
        assert (Fraction(secs), Fraction(cost)) == (total_secs, total_cost), unit
