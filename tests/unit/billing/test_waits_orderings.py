"""A job's waits over any order of its facts (pure, property-style): billing reads a job's
allocations in whatever order its consumer recorded them (grants and releases come on other
subjects than the job's submission and end, and a gang's members on other nodes), so
``waste.waits`` must give the same waits for every order, and a job never waits while it
holds an allocation (its GPUs are billed to it then, not waited for)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from hypothesis import given, settings
from hypothesis import strategies as st

from trainyard_platform.services.billing.waste import (
    INTERRUPTED,
    Allocation,
    JobWaits,
    Owner,
    waits,
)

T = datetime(2026, 11, 2, 10, tzinfo=UTC)
NOW = T + timedelta(days=1)
OWNER = Owner("ml", "p", "ada", "q", "a100", "j")
ENDED = sorted(INTERRUPTED)


@st.composite
def histories(draw: st.DrawFn) -> tuple[JobWaits, list[Allocation]]:
    """A job's attempts one after another (each a gang of one or two nodes, the last maybe
    still running), its allocations in a drawn order, and maybe its end."""
    allocations: list[Allocation] = []
    at = T + timedelta(minutes=draw(st.integers(0, 30)))
    attempts = draw(st.integers(0, 4))
    for attempt in range(1, attempts + 1):
        last = attempt == attempts
        runs = draw(st.integers(1, 120))
        outcome = draw(
            st.sampled_from([None, "succeeded", "cancelled", *ENDED])
            if last
            else st.sampled_from(ENDED)
        )
        for member in range(draw(st.integers(1, 2))):
            allocations.append(
                Allocation(
                    allocation_id=f"{attempt}-{member}",
                    owner=OWNER,
                    gpus=1,
                    granted_at=at,
                    ended_at=None if outcome is None else at + timedelta(minutes=runs),
                    outcome=outcome,
                    attempt=attempt,
                    priority="normal",
                )
            )
        at += timedelta(minutes=runs + draw(st.integers(0, 30)))
    ended = draw(st.none() | st.just(at + timedelta(minutes=draw(st.integers(0, 30)))))
    job = JobWaits(OWNER, 1, "normal", T, allocations, ended)
    order = draw(st.permutations(allocations))
    return job, list(order)


@settings(max_examples=300, deadline=None)
@given(histories())
def test_a_job_s_waits_are_the_same_in_any_order_and_never_while_it_holds_gpus(
    history: tuple[JobWaits, list[Allocation]],
) -> None:
    job, reordered = history
    expected = waits(job, NOW)
    assert waits(JobWaits(OWNER, 1, "normal", T, reordered, job.ended_at), NOW) == expected
    for wait in expected:
        assert wait.start < wait.end
        for a in job.allocations:
            held_until = a.ended_at if a.ended_at is not None else NOW
            assert wait.end <= a.granted_at or held_until <= wait.start, (wait, a)
