"""A job's metric keys and the pace of its series are bounded, and what is dropped is said."""

from __future__ import annotations

import pytest

from trainyard_platform.services.runner import domain
from trainyard_platform.services.runner.gpus import GpuUsage, virtual_inventory
from trainyard_platform.services.runner.metric_limits import (
    BURST_SECONDS,
    NOTICE_INTERVAL_S,
    RUNNER_MEASURES,
    MetricLimits,
)


def test_keys_beyond_the_bound_are_dropped_and_known_ones_kept() -> None:
    limits = MetricLimits(points_per_second=10, max_keys=2)
    assert limits.keys({"loss": 1.0, "acc": 0.5, "lr": 0.1}) == {"loss": 1.0, "acc": 0.5}
    assert limits.keys({"lr": 0.2, "loss": 0.9}) == {"loss": 0.9}
    assert limits.keys({"x" * 201: 1.0, "": 2.0}) == {}
    assert limits.values_dropped_total == 4
    notice = limits.notice(0.0)
    assert notice is not None and "4 metric values dropped" in notice


def test_a_tight_loop_is_cut_to_the_pace_after_its_burst() -> None:
    limits = MetricLimits(points_per_second=10, max_keys=10)
    burst = int(10 * BURST_SECONDS)
    admitted = sum(limits.admit(1, now=0.0) for _ in range(burst + 50))
    assert admitted == burst
    assert limits.points_dropped_total == 50
    # Time refills it at the pace, never past the burst.
    assert sum(limits.admit(1, now=1.0) for _ in range(20)) == 10
    assert sum(limits.admit(1, now=1000.0) for _ in range(burst + 1)) == burst


def test_a_report_is_admitted_or_dropped_whole() -> None:
    limits = MetricLimits(points_per_second=1, max_keys=int(BURST_SECONDS))
    assert limits.admit(int(BURST_SECONDS), now=0.0)
    assert not limits.admit(3, now=2.0)  # 2 points of budget: not 2 of the 3
    assert limits.admit(2, now=2.0)
    assert limits.points_dropped_total == 3


def test_notices_come_at_most_once_an_interval_and_once_at_the_end() -> None:
    limits = MetricLimits(points_per_second=1, max_keys=int(BURST_SECONDS))
    assert limits.notice(0.0) is None  # nothing dropped, nothing said
    limits.admit(100, now=0.0)
    first = limits.notice(0.0)
    assert first is not None and first.startswith("[trainyard: 100 metric points left out")
    limits.admit(100, now=1.0)
    assert limits.notice(1.0) is None
    assert limits.notice(NOTICE_INTERVAL_S) == first
    limits.admit(70, now=NOTICE_INTERVAL_S + 1)
    last = limits.notice(NOTICE_INTERVAL_S + 1, final=True)
    assert last is not None and "70 metric points" in last
    assert limits.notice(1e9, final=True) is None


def test_a_report_of_every_allowed_key_is_admitted_however_low_the_pace() -> None:
    # METRICS_POINTS_PER_SECOND=10 with METRICS_MAX_KEYS=1000: the burst was 100 points, so
    # a report of the job's 1000 keys never entered its series, however long it waited.
    limits = MetricLimits(points_per_second=10, max_keys=1000)
    report = limits.keys({f"k{i}": float(i) for i in range(1000)})
    assert len(report) == 1000
    assert limits.admit(len(report), now=0.0)
    assert not limits.admit(len(report), now=1.0)  # the pace still holds: 10 points refilled
    assert limits.admit(len(report), now=100.0)
    assert limits.points_dropped_total == 1000


def test_a_bound_that_admits_nothing_is_refused() -> None:
    with pytest.raises(ValueError, match="points_per_second"):
        MetricLimits(points_per_second=0, max_keys=1)


def test_keys_holding_what_no_database_or_screen_shows_are_dropped_and_said() -> None:
    # Before: a key with a NUL went into job.progress and job.metrics, which submission
    # (JSONB) and the registry (text) cannot store, so each report was retried and
    # dead-lettered, and so was the job's end (its metrics carry every key); a terminal
    # escape or a bidirectional override reached every screen that lists metrics.
    limits = MetricLimits(points_per_second=100, max_keys=3)
    hostile = ["a\x00b", "acc\x1b[2J", "x\x85", "\u202eloss", "\ud800", "tab\there"]
    kept = limits.keys({"loss": 1.0, **dict.fromkeys(hostile, 2.0), "acc": 3.0})
    assert kept == {"loss": 1.0, "acc": 3.0}  # the bad keys took no place of the three
    notice = limits.notice(0.0)
    assert notice is not None and f"{len(hostile)} metric values dropped" in notice
    assert "control character" in notice


def test_what_the_runner_measures_is_never_the_jobs_to_report() -> None:
    # A job reporting gpu_utilization_mean=100 itself: on a node without NVML, or ending
    # before the first sample, its value reached job.succeeded as the runner's measure, and
    # billing's waste report counted its idle GPUs as busy (and data_wait_fraction_mean=0,
    # never measured, as a loop that never waited on input).
    limits = MetricLimits(points_per_second=100, max_keys=10)
    forged = {
        "gpu_utilization_mean": 100.0,
        "gpu_utilization": 100.0,
        "gpu_memory_used_bytes": 1.0,
        "data_wait_fraction_mean": 0.0,
        "input_bound": 0.0,
        "gpu_seconds_waiting_for_data": 0.0,
    }
    assert limits.keys({"loss": 1.0, "data_wait_fraction": 0.5, **forged}) == {
        "loss": 1.0,
        "data_wait_fraction": 0.5,  # the SDK's own measure, made in the job
    }
    notice = limits.notice(0.0)
    assert notice is not None and "6 metric values dropped" in notice
    assert "the runner's own measures" in notice


def test_every_measure_the_runner_adds_is_one_the_job_cannot_report() -> None:
    usage = GpuUsage(virtual_inventory(1), nvml=_FakeNvml())
    added = set(usage.sample([0])) | set(
        domain.input_bound_metrics(domain.RunningMean.of([0.9]), 10.0, 1)
    )
    assert added | {"gpu_utilization_mean"} <= RUNNER_MEASURES


class _FakeNvml:
    class _Rates:
        gpu = 50

    class _Memory:
        used = 1024

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        return index

    def nvmlDeviceGetUtilizationRates(self, handle: int) -> _Rates:
        return self._Rates()

    def nvmlDeviceGetMemoryInfo(self, handle: int) -> _Memory:
        return self._Memory()
