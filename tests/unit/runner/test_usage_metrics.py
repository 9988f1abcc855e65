"""Allocated GPUs count as idle while their job's latest utilisation is under 5%."""

from __future__ import annotations

from trainyard_platform.services.runner import usage_metrics


def test_idle_and_busy_gpus_of_the_sampled_jobs() -> None:
    training, waiting = object(), object()
    assert usage_metrics.readings() == []
    usage_metrics.record(training, 4, 87.0)
    usage_metrics.record(waiting, 2, 1.5)
    assert usage_metrics.readings() == [(4.0, {"state": "busy"}), (2.0, {"state": "idle"})]
    usage_metrics.record(waiting, 2, 40.0)  # it got its data
    assert usage_metrics.readings() == [(6.0, {"state": "busy"}), (0.0, {"state": "idle"})]
    usage_metrics.forget(training)
    usage_metrics.forget(waiting)
    assert usage_metrics.readings() == []
