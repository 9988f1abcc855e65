"""A failed gang search leaves the sorted limits of the nodes with room (``PolicyState._find``),
and a later gang that fewer nodes allow fails without a search. That is only right if every
search so skipped would have failed: checked here by deciding seeded scale scenarios with the
limits kept and with them never kept, which must give the same decisions."""

from __future__ import annotations

import pytest

from bench.scheduler_scale import scenario
from trainyard_platform.services.scheduler.policy import PolicyState, backfill
from trainyard_platform.services.scheduler.policy.engine import _limit
from trainyard_platform.services.scheduler.policy.model import PolicyConfig


class _NeverKept(dict[tuple[str, int], tuple[int, list[float]]]):
    def __setitem__(self, key: tuple[str, int], value: tuple[int, list[float]]) -> None:
        pass


CASES = [
    (300, 1, 50, PolicyConfig()),
    (600, 2, 100, PolicyConfig()),
    (400, 3, 20, PolicyConfig(ageing_s=60.0, reservations=3)),
    (400, 4, 50, PolicyConfig(preemption=False)),
]


@pytest.mark.parametrize(("nodes", "seed", "queues", "config"), CASES)
def test_gangs_skipped_by_their_limits_would_not_have_fit(
    nodes: int, seed: int, queues: int, config: PolicyConfig
) -> None:
    snapshot = scenario(nodes, seed=seed, queues_count=queues, submit_times=True)
    kept = PolicyState(snapshot, config)
    kept._run()
    assert kept._gang_limits  # some gang search failed, so the limits were read
    searched = PolicyState(snapshot, config)
    searched._gang_limits = _NeverKept()
    searched._run()
    assert kept.decisions() == searched.decisions()


def test_a_node_allows_a_job_until_its_limit() -> None:
    # ``_find`` counts the nodes that allow a gang by their limits; ``backfill.allows`` is
    # what ``find`` asks of each. The nodes of a pass at its end carry its reservations.
    state = PolicyState(scenario(300, seed=1, queues_count=50, submit_times=True))
    state._run()
    nodes = [n for pool in state.pools.values() for n in pool.nodes.values() if n.reservations]
    assert len(nodes) > 10
    for node in nodes:
        starts = sorted({r.start for r in node.reservations})
        ends = [state.now, *starts, *(s - 1.0 for s in starts), *(s + 1.0 for s in starts)]
        for gpus in range(1, node.capacity + 1):
            limit = _limit(node, gpus)
            for end in ends:
                assert backfill.allows(node, gpus, end) == (end <= limit)
