"""The machine a benchmark ran on, described the same way in every results file.

``describe(**extra)``: platform, processor model, CPU count, memory, Python version and the
load average (1, 5 and 15 minutes) when called, then ``extra`` (a benchmark's own facts:
versions of what it measures, the load average before it began). Call it when the
measurement ends, so the load average says how busy the machine was while it ran.
"""

from __future__ import annotations

import os
import platform
import sys
from pathlib import Path
from typing import Any


def cpu_model() -> str:
    """The processor's model name (``/proc/cpuinfo``), else what ``platform`` knows."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def describe(**extra: Any) -> dict[str, Any]:
    """The machine (module docstring), with ``extra`` after it."""
    memory_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return {
        "platform": platform.platform(),
        "processor": cpu_model(),
        "cpu_count": os.cpu_count(),
        "memory_gib": round(memory_gib, 1),
        "python": sys.version.split()[0],
        "load_average": [round(x, 2) for x in os.getloadavg()],
        **extra,
    }
