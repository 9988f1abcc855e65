"""A kept pass (the arrival fast path's state) is void from the first moment a pass would act
on something other than an arrival: its clock plus the pass interval, the first preemption
notice to run out, the first job backing off to become eligible, the next UTC month while a
budget deprioritizes."""

from __future__ import annotations

from datetime import UTC, datetime

from tests.unit.scheduler.policy.builders import NOW, node, queue, running, snap
from trainyard_platform.services.scheduler.convert import Built
from trainyard_platform.services.scheduler.fast_path import Kept
from trainyard_platform.services.scheduler.policy.engine import PolicyState
from trainyard_platform.services.scheduler.policy.model import PolicyConfig, Snapshot
from trainyard_platform.services.scheduler.scheduling import PassResult

CONFIG = PolicyConfig(grace_s=300.0)


def _kept(snapshot: Snapshot, eligible_at: tuple[float, ...] = ()) -> Kept:
    state = PolicyState(snapshot, CONFIG)
    decisions = state.run()
    backing_off = tuple({"eligible_at": datetime.fromtimestamp(t, UTC)} for t in eligible_at)
    built = Built(snapshot, backing_off=backing_off)
    return Kept.of(PassResult(built, state, decisions, {}), CONFIG, interval_s=60.0)


def _until(kept: Kept) -> float:
    return kept.valid_until.timestamp()


def test_a_kept_pass_lasts_the_pass_interval_when_nothing_comes_due() -> None:
    assert _until(_kept(snap((node("n1"),), (queue("a"),)))) == NOW + 60.0


def test_a_kept_pass_ends_when_the_first_preemption_notice_runs_out() -> None:
    leaving = running("v", "a", {"n1": 2}, notice=NOW - 280.0)
    later = running("w", "a", {"n1": 2}, notice=NOW - 10.0)
    kept = _kept(snap((node("n1"),), (queue("a"),), run=(leaving, later)))
    assert _until(kept) == NOW + 20.0  # its GPUs are revoked by force then


def test_a_kept_pass_ends_when_the_first_job_backing_off_becomes_eligible() -> None:
    kept = _kept(snap((node("n1"),), (queue("a"),)), eligible_at=(NOW + 45.0, NOW + 30.0))
    assert _until(kept) == NOW + 30.0


def test_a_kept_pass_ends_with_the_month_while_a_budget_deprioritizes() -> None:
    # A new month ends what a spent budget says to its team's waiting jobs at low: an
    # arrival decided against the kept pass after it would still be told.
    month_end = datetime(2025, 4, 1, tzinfo=UTC).timestamp()
    snapshot = snap((node("n1"),), (queue("a"),), now=month_end - 30.0)
    budget = {"team": "a", "project": "", "policy": "deprioritize"}
    for built, until in (
        (Built(snapshot), month_end + 30.0),
        (Built(snapshot, lowers={("a", ""): budget}), month_end),
    ):
        state = PolicyState(snapshot, CONFIG)
        kept = Kept.of(PassResult(built, state, state.run(), {}), CONFIG, interval_s=60.0)
        assert _until(kept) == until
