"""GPU discovery: virtual GPUs on request, NVML when present, and what a job is shown."""

from __future__ import annotations

import importlib.machinery
import sys
import types

import pytest

from trainyard_platform.services.runner import gpus
from trainyard_platform.services.runner.gpus import (
    GpuInventory,
    GpuUsage,
    discover_gpus,
    virtual_inventory,
)


def test_virtual_gpus_are_named_and_counted() -> None:
    inventory = discover_gpus(3)
    assert inventory.names == ("virtual-cpu",) * 3
    assert inventory.count == 3 and inventory.virtual and inventory.source == "virtual"
    assert inventory.cuda is None


def test_zero_virtual_gpus_is_allowed() -> None:
    assert discover_gpus(0).count == 0


def test_jobs_on_virtual_gpus_see_no_cuda_device() -> None:
    assert virtual_inventory(2).job_env([1]) == {"CUDA_VISIBLE_DEVICES": ""}


def test_jobs_on_real_gpus_see_exactly_their_own_in_pci_order() -> None:
    inventory = GpuInventory(("H200", "H200", "H200", "H200"), "nvml", "12.4")
    assert inventory.job_env([2, 3]) == {
        "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
        "CUDA_VISIBLE_DEVICES": "2,3",
    }


def test_allocations_must_name_gpus_the_node_has_once_each() -> None:
    inventory = virtual_inventory(2)
    assert inventory.invalid_indices([0, 1]) is None
    assert inventory.invalid_indices([]) is None
    assert "[2]" in (inventory.invalid_indices([1, 2]) or "")
    assert "repeat" in (inventory.invalid_indices([1, 1]) or "")


def _fake_nvml(names: list[bytes | str], cuda: int = 12040) -> types.ModuleType:
    module = types.ModuleType("pynvml")
    module.__spec__ = importlib.machinery.ModuleSpec("pynvml", None)
    calls: list[str] = []
    module.calls = calls  # type: ignore[attr-defined]
    module.nvmlInit = lambda: calls.append("init")  # type: ignore[attr-defined]
    module.nvmlShutdown = lambda: calls.append("shutdown")  # type: ignore[attr-defined]
    module.nvmlDeviceGetCount = lambda: len(names)  # type: ignore[attr-defined]
    module.nvmlDeviceGetHandleByIndex = lambda i: i  # type: ignore[attr-defined]
    module.nvmlDeviceGetName = lambda handle: names[handle]  # type: ignore[attr-defined]
    module.nvmlSystemGetCudaDriverVersion_v2 = lambda: cuda  # type: ignore[attr-defined]
    return module


def test_nvml_gpus_are_found_by_name_with_the_driver_cuda_version(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fake = _fake_nvml([b"NVIDIA H200", "NVIDIA H200"])
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    inventory = discover_gpus(None)
    assert inventory == GpuInventory(("NVIDIA H200", "NVIDIA H200"), "nvml", "12.4")
    assert not inventory.virtual
    assert fake.calls == ["init", "shutdown"]


def test_nvml_gives_each_gpus_device_minor_and_torch_assumes_the_index(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fake = _fake_nvml([b"NVIDIA H200", b"NVIDIA H200"])
    fake.nvmlDeviceGetMinorNumber = lambda handle: [3, 1][handle]  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    assert discover_gpus(None).device_minors == (3, 1)

    # Found through torch (no NVML): the minors are assumed to be the indices.
    assert GpuInventory(("A100", "A100"), "torch", "12.1").device_minors == (0, 1)


def test_virtual_gpus_win_over_real_ones(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", _fake_nvml([b"NVIDIA H200"]))
    assert discover_gpus(2).source == "virtual"


def test_an_unusable_nvml_falls_through_to_torch(monkeypatch: pytest.MonkeyPatch) -> None:
    broken = _fake_nvml([])

    def no_driver() -> None:
        raise RuntimeError("NVML Shared Library Not Found")

    broken.nvmlInit = no_driver  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "pynvml", broken)
    monkeypatch.setattr(gpus, "_from_torch", lambda: GpuInventory(("A100",), "torch", "12.1"))
    assert discover_gpus(None).source == "torch"


def test_no_gpus_at_all_is_an_empty_inventory(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gpus, "_from_nvml", lambda: None)
    monkeypatch.setattr(gpus, "_from_torch", lambda: None)
    inventory = discover_gpus(None)
    assert inventory.count == 0 and inventory.source == "none"


class FakeNvml:
    """NVML as pynvml shows it: handles by index, utilisation and memory records."""

    def __init__(self, util: dict[int, int], used: dict[int, int]) -> None:
        self.util, self.used = util, used

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        return index

    def nvmlDeviceGetUtilizationRates(self, handle: int) -> types.SimpleNamespace:
        return types.SimpleNamespace(gpu=self.util[handle])

    def nvmlDeviceGetMemoryInfo(self, handle: int) -> types.SimpleNamespace:
        return types.SimpleNamespace(used=self.used[handle])


def test_gpu_usage_is_the_mean_utilisation_and_total_memory_of_the_jobs_gpus() -> None:
    nvml = FakeNvml({0: 10, 1: 90, 2: 50}, {0: 1, 1: 2_000, 2: 3_000})
    usage = GpuUsage(GpuInventory(("H200",) * 3, "nvml"), nvml)
    assert usage.sample([1, 2]) == {"gpu_utilization": 70.0, "gpu_memory_used_bytes": 5_000.0}
    assert usage.sample([]) == {}
    assert usage.sample([7]) == {}, "a failing read is no reason to disturb the job"


def test_virtual_gpus_have_no_usage() -> None:
    assert GpuUsage(virtual_inventory(2)).sample([0, 1]) == {}
