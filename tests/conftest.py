"""Test-wide fixtures: real servers (``tests.fixtures.servers``) and collected spans
(``tests.fixtures.telemetry``)."""

pytest_plugins = ["tests.fixtures.servers", "tests.fixtures.telemetry"]
