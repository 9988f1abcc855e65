"""The chaos suite's short version (``python -m bench.chaos --short``): the whole platform
under load from three teams while every kind of fault happens once (SIGKILL and restart of
each service, a runner, NATS and PostgreSQL; a runner paused past its node timeout;
PostgreSQL paused; a process cut off NATS; the JetStream store lost), then every invariant checked from the
stores (``bench._chaos_check``). The seed is ``TRAINYARD_CHAOS_SEED`` (default 1); a failure
prints it, and ``python -m bench.chaos --short --seed N --keep`` runs the same schedule."""

from __future__ import annotations

import os

import pytest

from bench._chaos_faults import KINDS
from bench.chaos import run_chaos, short_options

pytestmark = [pytest.mark.e2e, pytest.mark.chaos]


@pytest.mark.timeout(900)
def test_every_invariant_holds_through_one_fault_of_each_kind() -> None:
    seed = int(os.environ.get("TRAINYARD_CHAOS_SEED", "1"))
    result = run_chaos(short_options(seed), say=print)
    summary = result.summary()
    print(summary)
    assert not result.report.failed, f"seed {seed}:\n{result.report.summary()}"
    # Before the kinds: the faults stop after one the platform did not recover from.
    not_recovered = [f.row() for f in result.faults if f.recovered_s is None]
    assert not not_recovered, f"seed {seed}: {not_recovered}"
    assert {fault.kind for fault in result.faults} == set(KINDS)
    assert summary["jobs_submitted"] >= 20
    assert summary["terminal"] == summary["jobs_submitted"]
