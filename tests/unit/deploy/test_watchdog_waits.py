"""The local stack's watchdog (``deploy.local.processes.Watchdog``) on a fake clock: a
service that cannot start only because a dependency is away (exit status 75) is started
again for as long as it takes, with capped back-off and a one-line report saying why; a
genuine crash loop is still given up on, and said so."""

from __future__ import annotations

import signal
from pathlib import Path

from trainyard_platform.deploy.local.processes import (
    DEPENDENCY_WAIT_STATUS,
    WAIT_TAIL_EVERY,
    Exit,
    RestartPolicy,
    Watchdog,
)
from trainyard_platform.shared.runtime import DEPENDENCY_UNAVAILABLE_STATUS

POLICY = RestartPolicy(first_delay_s=1, max_delay_s=8, stable_after_s=30, max_failures=3)


class FakeUnit:
    def __init__(self, log_path: Path) -> None:
        self.log_path = log_path
        self.ended: Exit | None = None
        self.revives = 0

    def die(self, returncode: int, says: str) -> None:
        with self.log_path.open("a") as log:
            log.write(f"starting\n{says}\n")
        self.ended = Exit(returncode)

    def exited(self) -> Exit | None:
        return self.ended

    def revive(self) -> None:
        self.revives += 1
        self.ended = None


def watched(tmp_path: Path) -> tuple[Watchdog, FakeUnit, list[float], list[str]]:
    now = [0.0]
    reports: list[str] = []
    dog = Watchdog(POLICY, report=reports.append, clock=lambda: now[0])
    unit = FakeUnit(tmp_path / "billing.log")
    dog.watch("billing", exited=unit.exited, revive=unit.revive, log_path=unit.log_path)
    return dog, unit, now, reports


def test_the_services_and_the_watchdog_agree_on_the_status_of_a_dependency_away() -> None:
    assert DEPENDENCY_WAIT_STATUS == DEPENDENCY_UNAVAILABLE_STATUS == 75


def test_a_dependency_away_is_waited_out_however_long_then_the_service_comes_back(
    tmp_path: Path,
) -> None:
    """Five failed starts used to be a crash loop given up on, though PostgreSQL was only
    away for a while: the service stayed down after it came back."""
    dog, unit, now, reports = watched(tmp_path)
    delays = []
    says = "cannot start: PostgreSQL (TRAINYARD_DATABASE_URL): Connect call failed"
    for wait in range(1, 4 * POLICY.max_failures + 1):
        now[0] += 0.5
        unit.die(DEPENDENCY_WAIT_STATUS, says)
        (death,) = dog.poll()
        assert death.waiting and not death.gave_up and not death.crash_loop
        assert death.waits == wait and death.failures == 0
        assert death.restart_in_s is not None
        delays.append(death.restart_in_s)
        now[0] += death.restart_in_s
        assert dog.poll() == [] and unit.revives == wait
        assert dog.down() == []  # never down for good
    assert delays[:5] == [1, 2, 4, 8, 8]  # doubling, capped
    assert set(delays[4:]) == {8}
    first = reports[0]
    assert first.startswith(
        "billing cannot start yet, a dependency is unavailable (exit status 75, after 0.5 s); "
        f"its log: {says}; waiting for it: starting it again in 1 s (1 in a row)\n"
        f"--- last lines of {unit.log_path} ---\n"
    )
    # Later ones are one line each (the tail again every WAIT_TAIL_EVERY-th), never silent.
    waits = [r for r in reports if "cannot start yet" in r]
    assert len(waits) == 4 * POLICY.max_failures
    with_tail = [i + 1 for i, r in enumerate(waits) if "--- last lines of" in r]
    assert with_tail == [1, WAIT_TAIL_EVERY]
    assert waits[1] == (
        "billing cannot start yet, a dependency is unavailable (exit status 75, after 0.5 s); "
        f"its log: {says}; waiting for it: starting it again in 2 s (2 in a row)"
    )

    # Up for good now: a crash much later is a first failure, not a crash loop.
    now[0] += 60
    unit.die(1, "Traceback: boom")
    (death,) = dog.poll()
    assert not death.waiting and death.failures == 1 and death.restart_in_s == 1


def test_a_genuine_crash_loop_is_still_given_up_on_and_said_so(tmp_path: Path) -> None:
    """A bad configuration (exit status 2) or a crash can never succeed by being started
    again: the row is counted, reported with the log tail, and ends in giving up."""
    dog, unit, now, reports = watched(tmp_path)
    for failure in range(1, POLICY.max_failures + 1):
        now[0] += 0.5
        unit.die(2, "cannot start: invalid setting TRAINYARD_BILLING_PORT")
        (death,) = dog.poll()
        assert not death.waiting and death.failures == failure
        if death.restart_in_s is not None:
            now[0] += death.restart_in_s
            dog.poll()
    assert death.gave_up
    assert death.summary.endswith(
        "crash loop: 3 failures in a row (each within 30 s of its start); "
        "not restarting it any more"
    )
    assert "invalid setting TRAINYARD_BILLING_PORT" in reports[-1]
    assert dog.down() == [death]


def test_waits_between_crashes_neither_hide_nor_end_the_crash_loop(tmp_path: Path) -> None:
    dog, unit, now, _ = watched(tmp_path)
    outcomes = [1, DEPENDENCY_WAIT_STATUS, -signal.SIGSEGV, DEPENDENCY_WAIT_STATUS, 1]
    for returncode in outcomes:
        now[0] += 0.5
        unit.die(returncode, "bye")
        (death,) = dog.poll()
        if death.restart_in_s is not None:
            now[0] += death.restart_in_s
            dog.poll()
    assert death.failures == 3 and death.gave_up
