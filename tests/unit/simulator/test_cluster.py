"""Node layout and gang shapes."""

from __future__ import annotations

import pytest

from bench.simulator.cluster import build_cluster, gang_shape


def test_500_gpus_are_62_nodes_of_8_and_one_of_4_in_racks_of_8() -> None:
    nodes = build_cluster(500)
    assert len(nodes) == 63
    assert sum(n.gpus for n in nodes) == 500
    assert [n.gpus for n in nodes[-2:]] == [8, 4]
    assert {n.rack for n in nodes[:8]} == {"rack-000"}
    assert nodes[8].rack == "rack-001"
    assert nodes[-1].rack == "rack-007"


@pytest.mark.parametrize(
    ("gpus", "shape"),
    [(1, (1, 1)), (7, (1, 7)), (8, (1, 8)), (12, (2, 6)), (16, (2, 8)), (20, (4, 5)), (64, (8, 8))],
)
def test_gangs_split_equally_over_the_fewest_nodes(gpus: int, shape: tuple[int, int]) -> None:
    assert gang_shape(gpus) == shape


def test_impossible_requests_are_rejected() -> None:
    with pytest.raises(ValueError):
        gang_shape(0)
    with pytest.raises(ValueError):
        build_cluster(0)
