"""Test-wide fixtures: real servers (``tests.fixtures.servers``) and collected spans
(``tests.fixtures.telemetry``); and every test starts with no dependency known to be away
(``shared.outages`` keeps that per process, and one test's outage is not the next one's)."""

from collections.abc import Iterator

import pytest

from trainyard_platform.shared import outages

pytest_plugins = ["tests.fixtures.servers", "tests.fixtures.telemetry"]


@pytest.fixture(autouse=True)
def _no_dependency_away() -> Iterator[None]:
    outages.forget()
    yield
