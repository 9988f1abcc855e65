"""The chaos tests: faults driven into the whole platform (``bench.chaos``) and the loss of
the JetStream store. Marked ``chaos``; ``-m "not chaos"`` leaves them out."""

from __future__ import annotations

import pytest


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "chaos: faults driven into the whole platform as processes (minutes)"
    )
