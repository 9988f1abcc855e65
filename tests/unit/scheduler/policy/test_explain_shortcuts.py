"""Explaining a pass explains a held job once per holder (``reasons._Explainer.run``): every
job one holder holds gets the same explanation but for its position, once the holder's quota
estimate (which the held job's estimated start reads) is recorded. That is only right if it
gives what explaining each held job on its own gives, including for the jobs explained
before their holder's estimate is recorded. Checked here on seeded scale scenarios and
configurations, against the same pass explained with the shortcut never taken."""

from __future__ import annotations

from collections import Counter

import pytest

from bench.scheduler_scale import scenario
from trainyard_platform.services.scheduler.policy import PolicyState
from trainyard_platform.services.scheduler.policy.model import PolicyConfig
from trainyard_platform.services.scheduler.policy.reasons import _Explainer, explain_all

CASES = [
    (120, 3, 20, PolicyConfig()),
    (300, 1, 50, PolicyConfig()),
    (300, 4, 100, PolicyConfig(ageing_s=60.0, reservations=3)),
    (200, 2, 50, PolicyConfig(backfill=False)),
]


@pytest.mark.parametrize(("nodes", "seed", "queues", "config"), CASES)
def test_held_jobs_are_explained_as_each_on_its_own(
    nodes: int, seed: int, queues: int, config: PolicyConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    state = PolicyState(scenario(nodes, seed=seed, queues_count=queues, submit_times=True), config)
    state._run()
    held = Counter(w.holder.job_id for w in state.waiting if w.kind == "held" and w.holder)
    assert max(held.values()) > 1  # the shortcut is taken
    got = explain_all(state, state.waiting)
    monkeypatch.setattr(_Explainer, "_holder_estimated", lambda self, holder: False)
    each = explain_all(state, state.waiting)
    assert list(got.items()) == list(each.items())


@pytest.mark.parametrize(("nodes", "seed", "queues", "config"), CASES)
def test_jobs_waiting_for_quota_share_an_explanation_only_with_jobs_of_the_same_request(
    nodes: int, seed: int, queues: int, config: PolicyConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Jobs of one queue, flavor and size shared one explanation whether or not they may
    borrow, so a job of a class that never borrows could read another's "its cohort has 0
    idle to lend" (127 of 1,075 waiting jobs at 120 nodes, seed 3), and the reverse."""
    state = PolicyState(scenario(nodes, seed=seed, queues_count=queues, submit_times=True), config)
    state._run()
    got = explain_all(state, state.waiting)
    monkeypatch.setattr(_Explainer, "quota_request", lambda self, job: job.job_id)
    each = explain_all(state, state.waiting)
    assert list(got.items()) == list(each.items())
