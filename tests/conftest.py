"""Test-wide fixtures: real servers come from the ``tests.fixtures.servers`` plugin."""

pytest_plugins = ["tests.fixtures.servers"]
