"""How fast the loop trains and how long it waits for data, measured without a profiler.

``DataMeter.wrap(loader)`` yields the loader's batches unchanged and times each ``next()``
(time waiting for data) against the wall time between reports. ``take()`` returns the
figures since the previous report and starts a new window:

- ``data_wait_fraction``: the share of the window spent inside the loader's ``next()``;
- ``samples_per_s``: samples delivered per second of the window (a batch's sample count
  is the first dimension of its first tensor, else 1).

The cost is two ``perf_counter`` calls per batch, so it stays on by default.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from typing import Any, TypeVar

import torch

T = TypeVar("T")


def batch_size(batch: Any) -> int:
    """Samples in ``batch``: the first dimension of its first tensor, else 1."""
    if isinstance(batch, torch.Tensor):
        return int(batch.shape[0]) if batch.dim() else 1
    if isinstance(batch, list | tuple) and batch:
        return batch_size(batch[0])
    if isinstance(batch, dict) and batch:
        return batch_size(next(iter(batch.values())))
    return 1


class DataMeter:
    """Times a loader's batches between metric reports (see the module docstring)."""

    def __init__(self) -> None:
        self._window_start = time.perf_counter()
        self._waiting = 0.0
        self._samples = 0
        self._used = False

    def wrap(self, loader: Iterable[T]) -> Iterator[T]:
        self._used = True
        iterator = iter(loader)
        while True:
            started = time.perf_counter()
            try:
                batch = next(iterator)
            except StopIteration:
                self._waiting += time.perf_counter() - started
                return
            self._waiting += time.perf_counter() - started
            self._samples += batch_size(batch)
            yield batch

    def take(self) -> dict[str, float]:
        """The window's figures (empty until a loader was wrapped, and for a window in which
        no batch came); starts a new window."""
        if not self._used:
            return {}
        now = time.perf_counter()
        if self._samples == 0:  # no batch since the last report (e.g. after the loop)
            self._window_start, self._waiting = now, 0.0
            return {}
        elapsed = max(now - self._window_start, 1e-9)
        figures = {
            "data_wait_fraction": min(1.0, self._waiting / elapsed),
            "samples_per_s": self._samples / elapsed,
        }
        self._window_start, self._waiting, self._samples = now, 0.0, 0
        return figures
