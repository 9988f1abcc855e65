"""The SDK's data meter: batches pass through unchanged, waiting time and rate measured."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
import torch

from trainyard.sdk.throughput import DataMeter, batch_size


def slow_loader(batches: int, wait_s: float) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    for i in range(batches):
        time.sleep(wait_s)
        yield torch.full((8, 2), float(i)), torch.zeros(8)


def test_batches_pass_through_and_the_wait_is_measured() -> None:
    meter = DataMeter()
    assert meter.take() == {}, "nothing to say before a loader is wrapped"
    seen = []
    for x, _ in meter.wrap(slow_loader(3, 0.02)):
        seen.append(float(x[0, 0]))
    figures = meter.take()
    assert seen == [0.0, 1.0, 2.0]
    assert 0.0 < figures["data_wait_fraction"] <= 1.0
    assert figures["samples_per_s"] > 0
    # A new window starts after each take; one without a batch says nothing.
    assert meter.take() == {}


@pytest.mark.parametrize(
    ("batch", "size"),
    [
        (torch.zeros(5, 3), 5),
        ((torch.zeros(4), torch.zeros(4)), 4),
        ({"x": torch.zeros(6, 1)}, 6),
        (torch.tensor(1.0), 1),
        ("text", 1),
    ],
)
def test_batch_sizes(batch: object, size: int) -> None:
    assert batch_size(batch) == size
