"""Golden decisions: a pass gives exactly the decisions it gave when these digests were taken.

The digests are of every field of the ``Decisions`` (placements with their GPUs, preemptions
with their reasons, and every explanation: position, reason, blocking, suggestion, estimated
start, in the order the pass gives them) of seeded scenarios of the scale benchmark, under
several configurations, and of arrivals decided on the fast path (``decide_arrival``) after a
pass. They guard changes made for speed alone: such a change must leave every digest as it
is. A change of policy or of an explanation's text changes them on purpose; the digests are
then retaken (``python -m tests.unit.scheduler.policy.test_golden``) and the change says why.
Last retaken for two changes of policy: the first tier of the order (``QuotaBook.first_tier``:
an idle queue's job larger than its whole nominal quota is ordered with the jobs within their
quota; 7 of the 20 digests changed), then reclaim sparing a job larger than what its queue
borrows for ``oversize_protection_s`` (5 more changed), then no preemption for GPUs
reserved for a job decided earlier in the pass (``preemption.Reserved``; 7 changed: only
preemptions and explanations, no placement), then reclaim counting what a lender borrows
once the pass's preemptions are played out (``PolicyState.outgoing``; 8 changed, no
placement: in three, a 2-GPU job reclaimed from a queue that borrowed no more once its own
8-GPU job had been preempted for a 1-GPU one, and preempts within its own queue instead;
in all, explanations of jobs waiting for reclaim leave out the victims already chosen and
name what the lenders still borrow), then the text of a job waiting for reclaim (11 changed,
explanations only: a wait for borrowers' jobs to end is no longer called "reclaim expected",
and "reclaim no start can be estimated yet" reads "no return can be estimated yet"), then
lists naming several jobs of one other team counting them ("2 team-00 jobs"; 6 changed,
explanations only), then jobs of a class that is not preemptible (the scenario's ``high``)
never borrowing (``QuotaBook.check``'s ``borrows``; all 20 changed, and with every job let
borrow all 20 are as before: at 40 and 120 nodes, 5 and 10 ``high`` jobs that borrowed wait
for their queue's nominal quota instead, and other jobs take the GPUs, 95 placed against 90
and 125 against 123), then a fix of explanations alone: jobs waiting for quota shared one
explanation per queue, flavor and size whether or not they may borrow, so a ``high`` job
could read a borrowing job's text (``_Explainer.quota_request``; 18 changed, placements and
preemptions of all 20 as before).
"""

from __future__ import annotations

import hashlib
import json

import pytest

from bench.scheduler_scale import arrival_scenario, scenario
from trainyard_platform.services.scheduler.policy import PolicyState, decide_arrival, schedule
from trainyard_platform.services.scheduler.policy.model import Decisions, PolicyConfig

CONFIGS = {
    "default": PolicyConfig(),
    "no-backfill": PolicyConfig(backfill=False),
    "no-reservations": PolicyConfig(reservations=0),
    "no-preemption": PolicyConfig(preemption=False),
    "no-fair-share": PolicyConfig(fair_share=False, size_weight=0.0),
    "short-ageing": PolicyConfig(ageing_s=60.0, reservations=3),
}
PASSES = [
    (nodes, seed, queues, config)
    for nodes, seed, queues in ((10, 1, 5), (40, 2, 50), (120, 3, 20))
    for config in CONFIGS
]

GOLDEN: dict[str, str] = {
    "pass-10-1-5-default": "6eed264a08e8ce6f88b9",
    "pass-10-1-5-no-backfill": "d1201a89bc7072afd596",
    "pass-10-1-5-no-reservations": "432ed75cc4f0c4689c59",
    "pass-10-1-5-no-preemption": "1c47773565cc07bde6bc",
    "pass-10-1-5-no-fair-share": "34af86e766946ca21b2b",
    "pass-10-1-5-short-ageing": "fdd4375e38ac7f5c6aa2",
    "pass-40-2-50-default": "afc6157b3d18a543e91d",
    "pass-40-2-50-no-backfill": "91e8b25140d0430b4d98",
    "pass-40-2-50-no-reservations": "9fc4739fcc94b5beb5b4",
    "pass-40-2-50-no-preemption": "8bfba9d1862926555a0e",
    "pass-40-2-50-no-fair-share": "0184e55b5155a12ea785",
    "pass-40-2-50-short-ageing": "dc55be6e648fcfffd7c9",
    "pass-120-3-20-default": "09ec252ee7c0de282ae9",
    "pass-120-3-20-no-backfill": "fe49d054bd5372d05b8d",
    "pass-120-3-20-no-reservations": "5c1c9854ea5141f578f0",
    "pass-120-3-20-no-preemption": "b53cbb6245f217f1fffa",
    "pass-120-3-20-no-fair-share": "8238950e811a013d9872",
    "pass-120-3-20-short-ageing": "ce1bfcf6bb4953383177",
    "arrivals-20-2": "70d5c33f03dffad8d75a",
    "arrivals-60-5": "103501e5604fd5b3da80",
}


def canonical(d: Decisions) -> list[object]:
    return [
        [
            [p.job_id, sorted((k, list(v)) for k, v in p.gpus.items()), p.borrowed]
            for p in d.placements
        ],
        [[p.job_id, p.for_job_id, p.kind, p.reason] for p in d.preemptions],
        [
            [k, e.position, e.reason, e.blocking, e.suggestion, repr(e.estimated_start)]
            for k, e in d.explanations.items()
        ],
    ]


def digest(d: Decisions | list[Decisions]) -> str:
    items = d if isinstance(d, list) else [d]
    text = json.dumps([canonical(x) for x in items])
    return hashlib.sha256(text.encode()).hexdigest()[:20]


def pass_digest(nodes: int, seed: int, queues: int, config: str) -> str:
    return digest(schedule(scenario(nodes, seed=seed, queues_count=queues), CONFIGS[config]))


def arrivals_digest(nodes: int, seed: int) -> str:
    snapshot, arrivals = arrival_scenario(nodes, seed=seed)
    state = PolicyState(snapshot, PolicyConfig())
    first = state.run()
    return digest([first] + [decide_arrival(state, job) for job in arrivals[:30]])


def name(nodes: int, seed: int, queues: int, config: str) -> str:
    return f"pass-{nodes}-{seed}-{queues}-{config}"


@pytest.mark.parametrize(("nodes", "seed", "queues", "config"), PASSES)
def test_pass_decisions_are_unchanged(nodes: int, seed: int, queues: int, config: str) -> None:
    assert pass_digest(nodes, seed, queues, config) == GOLDEN[name(nodes, seed, queues, config)]


@pytest.mark.parametrize(("nodes", "seed"), [(20, 2), (60, 5)])
def test_arrival_decisions_are_unchanged(nodes: int, seed: int) -> None:
    assert arrivals_digest(nodes, seed) == GOLDEN[f"arrivals-{nodes}-{seed}"]


if __name__ == "__main__":  # prints the table of digests for GOLDEN
    for p in PASSES:
        print(f'    "{name(*p)}": "{pass_digest(*p)}",')
    for nodes, seed in ((20, 2), (60, 5)):
        print(f'    "arrivals-{nodes}-{seed}": "{arrivals_digest(nodes, seed)}",')
