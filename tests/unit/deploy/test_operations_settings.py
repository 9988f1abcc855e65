"""The settings tables of docs/operations.md give each setting's default as the code has it,
and a setting the code requires is said to be required.

The scheduler's table said ``ADMIN_TOKEN`` defaults to unset, and the page's first section
that without it the admin routes are open to anyone: the scheduler refuses to start
without it (status 2, ``Field required``)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from pydantic_core import PydanticUndefined
from pydantic_settings import BaseSettings

from trainyard_platform.services.scheduler.config import Settings as SchedulerSettings
from trainyard_platform.shared.settings import NatsSettings

ROOT = Path(__file__).resolve().parents[3]
DOC = (ROOT / "docs" / "operations.md").read_text()
_ROW = re.compile(r"^\| `([A-Z_]+)`(?: / `(_[A-Z_]+)`)? \| ([^|]+) \|", re.MULTILINE)


def _table(after: str, settings: type[BaseSettings]) -> list[tuple[str, str, Any]]:
    """(variable, the doc's default, the field's default) of the table after ``after``."""
    start = DOC.index(after)
    end = DOC.index("\n\n", DOC.index("|---|", start))
    rows = []
    for match in _ROW.finditer(DOC[start:end]):
        for name in filter(None, (match.group(1), match.group(2))):
            field_name = name if not name.startswith("_") else _joined(match.group(1), name)
            field = settings.model_fields[field_name.lower()]
            rows.append((field_name, match.group(3).strip(), field.default))
    return rows


def _joined(first: str, suffix: str) -> str:
    """``OUTAGE_RETRY_INITIAL_SECONDS`` / ``_MAX_SECONDS``: the second is the first's stem
    with that ending."""
    stem = first.rsplit("_", 2)[0]
    return stem + suffix


ROWS = [
    *_table("The scheduler's, all with the prefix", SchedulerSettings),
    *_table("Shared by every service, with the prefix `TRAINYARD_NATS_`", NatsSettings),
]


def test_the_tables_are_read() -> None:
    assert len(ROWS) >= 20


@pytest.mark.parametrize(("name", "documented", "default"), ROWS, ids=[r[0] for r in ROWS])
def test_each_documented_default_is_the_code_s(name: str, documented: str, default: Any) -> None:
    if default is PydanticUndefined:
        assert documented.startswith("required"), f"{name} is required, the doc says {documented!r}"
        return
    first = documented.split(" / ")[0] if name.endswith("INITIAL_SECONDS") else documented
    if name.endswith("MAX_SECONDS") and " / " in documented:
        first = documented.split(" / ")[1]
    if isinstance(default, bool):
        assert first == str(default).lower(), name
    elif isinstance(default, int | float):
        assert float(first) == default, name
    else:
        assert first == str(default), name


def test_the_admin_token_is_not_said_to_be_optional() -> None:
    section = DOC[DOC.index("## Before anything else") : DOC.index("## What a fresh install")]
    assert "open to anyone" not in section
    assert "status 2" in section


def test_deploy_readme_gives_every_service_s_default_port() -> None:
    """deploy/README.md's per-service table lists the default ports; registry's was missing."""
    import importlib

    readme = (ROOT / "deploy" / "README.md").read_text()
    [row] = [
        line for line in readme.splitlines() if line.startswith("| `TRAINYARD_<SERVICE>_PORT`")
    ]
    for service in ("submission", "scheduler", "runner", "registry", "billing"):
        config = importlib.import_module(f"trainyard_platform.services.{service}.config")
        port = config.Settings.model_fields["port"].default
        assert f"{service} `{port}`" in row, service
