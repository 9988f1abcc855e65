"""What GPUs this node has, and how a job is shown only its own.

Discovery order: ``virtual_gpus`` set -> that many virtual GPUs (model ``virtual-cpu``; jobs
run on CPU with ``CUDA_VISIBLE_DEVICES=""``), whatever hardware is present. Otherwise NVML
(``pynvml`` from ``nvidia-ml-py``, imported only if installed), then
``torch.cuda`` (imported only here, never at the runner's module level), else none.
Real GPUs are numbered as NVML numbers them (PCI bus order), and jobs get
``CUDA_DEVICE_ORDER=PCI_BUS_ID`` so CUDA's numbering matches. Each real GPU's device file is
``/dev/nvidia<minor>`` (char major 195): NVML gives the minor numbers
(``nvmlDeviceGetMinorNumber``); without NVML (found through torch) they are assumed to equal
the indices, which holds where the driver numbered the GPUs in PCI bus order, and the
runner says so once.

Discovery is blocking (driver calls): run it with ``asyncio.to_thread``.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

log = logging.getLogger(__name__)

Source = Literal["virtual", "nvml", "torch", "none"]


@dataclass(frozen=True)
class GpuInventory:
    names: tuple[str, ...]
    source: Source
    cuda: str | None = None
    """CUDA version the driver supports (NVML) or torch was built with; None when virtual."""
    minors: tuple[int, ...] | None = None
    """The minor number of each GPU's device file (``/dev/nvidia<minor>``), by index, as
    NVML gives them; None where unknown (``device_minors`` then assumes the indices)."""

    @property
    def device_minors(self) -> tuple[int, ...]:
        """The minor number of each GPU's device file, by index."""
        return self.minors if self.minors is not None else tuple(range(self.count))

    @property
    def count(self) -> int:
        return len(self.names)

    @property
    def virtual(self) -> bool:
        return self.source in ("virtual", "none")

    def invalid_indices(self, indices: Sequence[int]) -> str | None:
        """Why ``indices`` can't be an allocation on this node, or None if they can."""
        if len(set(indices)) != len(indices):
            return f"GPU indices {list(indices)} repeat"
        missing = [i for i in indices if not 0 <= i < self.count]
        if missing:
            return f"GPU indices {missing} do not exist on this node ({self.count} GPUs)"
        return None

    def job_env(self, indices: Sequence[int]) -> dict[str, str]:
        """Variables that confine a job to its GPUs (to none at all on virtual GPUs)."""
        if self.virtual:
            return {"CUDA_VISIBLE_DEVICES": ""}
        return {
            "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
            "CUDA_VISIBLE_DEVICES": ",".join(str(i) for i in indices),
        }


def virtual_inventory(count: int) -> GpuInventory:
    # One model name for every slot, as NVML names eight A100s alike: a name is a model, not
    # a slot, so a reproduction that lands on another slot has the same hardware.
    return GpuInventory(("virtual-cpu",) * count, "virtual")


def discover_gpus(virtual_gpus: int | None) -> GpuInventory:
    """This node's GPUs (see the module docstring for the order)."""
    if virtual_gpus is not None:
        return virtual_inventory(virtual_gpus)
    found = _from_nvml() or _from_torch()
    if found is None:
        log.warning("no GPUs found (NVML and torch.cuda see none); set --virtual-gpus N")
        return GpuInventory((), "none")
    return found


def _from_nvml() -> GpuInventory | None:
    if importlib.util.find_spec("pynvml") is None:
        return None
    nvml: Any = importlib.import_module("pynvml")
    try:
        nvml.nvmlInit()
    except Exception as exc:  # no driver on this machine: NVMLError of many kinds
        log.info("NVML present but unusable: %s", exc)
        return None
    try:
        count = int(nvml.nvmlDeviceGetCount())
        names = tuple(
            _text(nvml.nvmlDeviceGetName(nvml.nvmlDeviceGetHandleByIndex(i))) for i in range(count)
        )
        cuda = _cuda_from_nvml(nvml)
        minors = _minors_from_nvml(nvml, count)
    except Exception as exc:
        log.warning("NVML failed while listing GPUs: %s", exc)
        return None
    finally:
        # Shutting down a half-initialised NVML may fail too: nothing more to do then.
        with contextlib.suppress(Exception):
            nvml.nvmlShutdown()
    return GpuInventory(names, "nvml", cuda, minors) if names else None


def _minors_from_nvml(nvml: Any, count: int) -> tuple[int, ...] | None:
    getter = getattr(nvml, "nvmlDeviceGetMinorNumber", None)
    if getter is None:
        return None
    return tuple(int(getter(nvml.nvmlDeviceGetHandleByIndex(i))) for i in range(count))


def _cuda_from_nvml(nvml: Any) -> str | None:
    getter = getattr(nvml, "nvmlSystemGetCudaDriverVersion_v2", None) or getattr(
        nvml, "nvmlSystemGetCudaDriverVersion", None
    )
    if getter is None:
        return None
    version = int(getter())  # e.g. 12040 for 12.4
    return f"{version // 1000}.{(version % 1000) // 10}"


def _from_torch() -> GpuInventory | None:
    if importlib.util.find_spec("torch") is None:
        return None
    torch: Any = importlib.import_module("torch")
    try:
        if not torch.cuda.is_available():
            return None
        count = int(torch.cuda.device_count())
        names = tuple(str(torch.cuda.get_device_name(i)) for i in range(count))
    except Exception as exc:  # a broken CUDA install: treat as no GPUs, say why
        log.warning("torch.cuda failed while listing GPUs: %s", exc)
        return None
    if not names:
        return None
    log.info(
        "GPUs found through torch, without NVML: their device files' minor numbers are "
        "assumed to equal their indices (/dev/nvidia0 is GPU 0)"
    )
    return GpuInventory(names, "torch", torch.version.cuda)


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class GpuUsage:
    """Utilisation and memory of a job's GPUs, read through NVML while it runs.

    ``sample(indices)`` answers ``{"gpu_utilization": mean % over the GPUs,
    "gpu_memory_used_bytes": their sum}``, or ``{}`` where NVML is not available (virtual
    GPUs, no driver, no ``pynvml``) or a read fails: usage is a convenience, never a
    reason to disturb a job. Blocking (driver calls): run it in a thread.
    """

    def __init__(self, inventory: GpuInventory, nvml: Any = None) -> None:
        self._nvml = nvml
        if nvml is None and inventory.source == "nvml" and importlib.util.find_spec("pynvml"):
            module: Any = importlib.import_module("pynvml")
            try:
                module.nvmlInit()
                self._nvml = module
            except Exception as exc:  # discovery worked a moment ago; say why it stopped
                log.warning("NVML unusable for GPU usage: %s", exc)

    def sample(self, indices: Sequence[int]) -> dict[str, float]:
        if self._nvml is None or not indices:
            return {}
        try:
            utilization, memory = 0.0, 0.0
            for index in indices:
                handle = self._nvml.nvmlDeviceGetHandleByIndex(index)
                utilization += float(self._nvml.nvmlDeviceGetUtilizationRates(handle).gpu)
                memory += float(self._nvml.nvmlDeviceGetMemoryInfo(handle).used)
        except Exception as exc:
            log.debug("NVML sample failed: %s", exc)
            return {}
        return {"gpu_utilization": utilization / len(indices), "gpu_memory_used_bytes": memory}
