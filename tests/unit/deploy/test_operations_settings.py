"""The settings tables of docs/operations.md list every setting a service reads, each with
its default as the code has it, and a setting the code requires is said to be required.

The scheduler's table said ``ADMIN_TOKEN`` defaults to unset, and the page's first section
that without it the admin routes are open to anyone: the scheduler refuses to start
without it (status 2, ``Field required``). Later the tables held the scheduler's settings
and some of NATS's only: 60 of the 100 settings the five services read (the submission
service's rate limits, the runner's, the registry's collector, billing's prices) were in no
table an operator would look at, some in no document at all.

A table is the first table after a line naming its prefix (``with the prefix
`TRAINYARD_NATS_```, ``TRAINYARD_<SERVICE>_`` for what every service has under its own
prefix) or saying its names are ``named in full``. A default is written as the code has it:
a number, ``true``/``false``, the text, a JSON list or object, ``unset`` for none,
``required``; a row of the ``<SERVICE>`` table gives a service's own default as ``runner
90``. Defaults the code computes where it starts (the host name, the current folder) are
described instead, and listed here."""

from __future__ import annotations

import importlib
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pydantic import SecretStr
from pydantic_core import PydanticUndefined
from pydantic_settings import BaseSettings

from trainyard_platform.shared.events.envelope import EventSchemaSettings

ROOT = Path(__file__).resolve().parents[3]
DOC = (ROOT / "docs" / "operations.md").read_text()
SETTINGS = DOC[DOC.index("\n## Settings\n") : DOC.index("\n## When a job does not start\n")]
SERVICES = ("submission", "scheduler", "runner", "registry", "billing")
_TABLE = re.compile(
    r"^[^|\n]*(?:prefix `(?P<prefix>[A-Z_<>]+)`|named in full)[^|]*?\n\n"
    r"\| setting \| default \| what \|\n\|---\|---\|---\|\n(?P<rows>(?:\|.*\n?)+)",
    re.MULTILINE,
)
_ROW = re.compile(r"^\| `([A-Z0-9_]+)` \| ([^|]+) \|", re.MULTILINE)
COMPUTED_AT_START = {
    "TRAINYARD_RUNNER_NODE_ID": "the host name",
    "TRAINYARD_RUNNER_CODE_DIR": "the current folder",
    "TRAINYARD_RUNNER_PYTHON": "the runner's own Python",
}
"""Defaults of the place a process starts in, so the doc says where they come from."""


def documented() -> dict[str, str]:
    """Each variable of the tables (``TRAINYARD_<SERVICE>_...`` as it is) -> its default."""
    rows: dict[str, str] = {}
    for table in _TABLE.finditer(SETTINGS):
        prefix = table.group("prefix") or ""
        for name, default in _ROW.findall(table.group("rows")):
            assert prefix + name not in rows, f"{prefix}{name} is in two tables"
            rows[prefix + name] = default.strip()
    return rows


DOCUMENTED = documented()


def read_settings(settings: type[BaseSettings], prefix: str | None = None) -> Iterator[Any]:
    """(variable, field) of every setting ``settings`` reads, those it holds included."""
    prefix = settings.model_config.get("env_prefix", "") if prefix is None else prefix
    for name, field in settings.model_fields.items():
        if isinstance(field.annotation, type) and issubclass(field.annotation, BaseSettings):
            yield from read_settings(field.annotation)
            continue
        alias = field.validation_alias
        yield (alias if isinstance(alias, str) else f"{prefix}{name}".upper()), field


def every_setting() -> Iterator[tuple[str, str, Any]]:
    """(service, variable, default) of every setting each service reads."""
    for service in SERVICES:
        config = importlib.import_module(f"trainyard_platform.services.{service}.config")
        for variable, field in (
            *read_settings(config.Settings),
            *read_settings(EventSchemaSettings),  # read by every process that publishes
        ):
            if field.default_factory is not None:
                default = field.default_factory()
            else:
                default = field.default
            yield service, variable, default


SETTINGS_READ = sorted(set((s, v, repr(d)) for s, v, d in every_setting()))
DEFAULTS = {(s, v): d for s, v, d in every_setting()}


def the_row(service: str, variable: str) -> str | None:
    """The doc's default of ``variable`` for ``service``: its own row, else the
    ``TRAINYARD_<SERVICE>_`` row, with the service's own value where the row gives one."""
    if variable in DOCUMENTED:
        return DOCUMENTED[variable]
    own = f"TRAINYARD_{service.upper()}_"
    if not variable.startswith(own):
        return None
    cell = DOCUMENTED.get("TRAINYARD_<SERVICE>_" + variable.removeprefix(own))
    if cell is None:
        return None
    values = [part.strip() for part in cell.split(", ")] if "," in cell else [cell]
    if all(" " not in v for v in values) or not any(v.split(" ")[0] in SERVICES for v in values):
        return cell
    per_service = dict(v.split(" ", 1) for v in values if v.split(" ")[0] in SERVICES)
    rest = [v for v in values if v.split(" ")[0] not in SERVICES]
    return per_service.get(service, rest[0] if rest else None)


def test_the_tables_are_read() -> None:
    assert len(DOCUMENTED) >= 80, sorted(DOCUMENTED)


@pytest.mark.parametrize(
    ("service", "variable"),
    [(s, v) for s, v, _ in SETTINGS_READ],
    ids=[f"{s}-{v}" for s, v, _ in SETTINGS_READ],
)
def test_each_setting_is_documented_with_the_code_s_default(service: str, variable: str) -> None:
    documented = the_row(service, variable)
    assert documented is not None, f"{variable} ({service}) is in no table of docs/operations.md"
    assert_agrees(variable, documented, DEFAULTS[(service, variable)])


def assert_agrees(variable: str, documented: str, default: Any) -> None:
    """``documented``, a table's default of ``variable``, is the code's ``default``."""
    if variable in COMPUTED_AT_START:
        assert documented == COMPUTED_AT_START[variable], variable
        return
    if default is PydanticUndefined:
        assert documented.startswith("required"), (
            f"{variable} is required, the doc says {documented!r}"
        )
        return
    if default is None:
        assert documented == "unset", f"{variable}: no default, the doc says {documented!r}"
        return
    if isinstance(default, SecretStr):
        default = default.get_secret_value()
    if isinstance(default, bool):
        assert documented == str(default).lower(), variable
    elif isinstance(default, int | float):
        assert float(documented) == default, variable
    elif isinstance(default, list | dict):
        assert json.loads(documented) == default, variable
    else:
        assert documented == str(default), variable


_OTHER_TABLE = re.compile(
    r"`(?P<prefix>TRAINYARD_[A-Z]+_)…`.*\n(?:\n|\|[^\n]*\n)*?\|---\|---\|---\|\n"
    r"(?P<rows>(?:\|.*\n?)+)"
)
OTHER_ROWS = [
    (doc.name, table.group("prefix") + name, default.strip())
    for doc in sorted((ROOT / "docs").glob("*.md"))
    if doc.name != "operations.md"
    for table in _OTHER_TABLE.finditer(doc.read_text())
    for name, default in _ROW.findall(table.group("rows"))
]


def test_other_pages_tables_are_read() -> None:
    """docs/scheduling.md ("Knobs") and docs/models.md ("Settings") have tables of their own."""
    assert {doc for doc, _, _ in OTHER_ROWS} >= {"scheduling.md", "models.md"}


@pytest.mark.parametrize(
    ("doc", "variable", "documented"), OTHER_ROWS, ids=[f"{d}-{v}" for d, v, _ in OTHER_ROWS]
)
def test_other_pages_give_the_code_s_defaults(doc: str, variable: str, documented: str) -> None:
    """A settings table on another page (its header or heading names ``TRAINYARD_X_…``) is
    held to the code as operations.md's are."""
    defaults = [d for (_, v), d in DEFAULTS.items() if v == variable]
    assert defaults, f"{doc}: {variable} is no setting of any service"
    assert_agrees(variable, documented, defaults[0])


def test_every_documented_setting_is_read() -> None:
    """A row for a setting no service reads any more is a promise nothing keeps."""
    read = {v for _, v, _ in SETTINGS_READ}
    for service in SERVICES:
        own = f"TRAINYARD_{service.upper()}_"
        read |= {"TRAINYARD_<SERVICE>_" + v.removeprefix(own) for v in read if v.startswith(own)}
    assert sorted(set(DOCUMENTED) - read) == []


def test_the_admin_token_is_not_said_to_be_optional() -> None:
    section = DOC[DOC.index("## Before anything else") : DOC.index("## What a fresh install")]
    assert "open to anyone" not in section
    assert "status 2" in section


@pytest.mark.parametrize(
    "doc",
    [ROOT / "README.md", ROOT / "deploy" / "README.md", *sorted((ROOT / "docs").glob("*.md"))],
    ids=lambda path: path.name,
)
def test_no_document_says_an_admin_token_may_be_left_unset(doc: Path) -> None:
    """docs/architecture.md said the scheduler's admin API needs the token "when the token
    is set: set it in production, or anyone who reaches the port can change quotas"."""
    text = " ".join(doc.read_text().split())
    for optional in ("when the token is set", "anyone who reaches the port", "open mode:"):
        assert optional not in text, f"{doc.name}: {optional!r}"


def test_deploy_readme_gives_every_service_s_default_port() -> None:
    """deploy/README.md's per-service table lists the default ports; registry's was missing."""
    readme = (ROOT / "deploy" / "README.md").read_text()
    [row] = [
        line for line in readme.splitlines() if line.startswith("| `TRAINYARD_<SERVICE>_PORT`")
    ]
    for service in SERVICES:
        config = importlib.import_module(f"trainyard_platform.services.{service}.config")
        port = config.Settings.model_fields["port"].default
        assert f"{service} `{port}`" in row, service


def test_deploy_readme_gives_the_job_environment_s_variables_by_name() -> None:
    """deploy/README.md gave the default of ``TRAINYARD_RUNNER_JOB_ENV_PASSTHROUGH`` as
    ``NCCL_*``: the runner lets three NCCL variables through by name, no other."""
    readme = (ROOT / "deploy" / "README.md").read_text()
    [row] = [
        line
        for line in readme.splitlines()
        if line.startswith("| `TRAINYARD_RUNNER_JOB_ENV_PASSTHROUGH`")
    ]
    default = row[row.rindex("[") :]
    runner = importlib.import_module("trainyard_platform.services.runner.config")
    field = runner.Settings.model_fields["job_env_passthrough"]
    assert field.default_factory is not None
    assert re.findall(r"`([A-Z_*]+)`", default) == field.default_factory()


def test_every_otel_variable_the_services_read_is_in_the_tracing_table() -> None:
    """``shared.telemetry.OtelExportSettings`` reads standard ``OTEL_*`` variables itself
    (the exporters read more); each has a row in docs/operations.md's "Tracing" table.
    ``OTEL_EXPORTER_OTLP_METRICS_ENDPOINT`` was read (checked as a URL) and in no table."""
    from trainyard_platform.shared.telemetry import OtelExportSettings

    section = DOC[DOC.index("\n### Tracing\n") : DOC.index("\n### Metrics\n")]
    table = section[section.index("| variable | effect |") :]
    table = table[: table.index("\n\n")]
    named = {name for row in table.splitlines() for name in re.findall(r"`(OTEL_[A-Z_]+)`", row)}
    read = {variable for variable, _ in read_settings(OtelExportSettings)}
    assert sorted(read - named) == []


def readme_rows() -> Iterator[tuple[str, str | None]]:
    """(variable, its default as deploy/README.md's tables give it, or None where the row
    gives none) of every variable those tables name in full, ``TRAINYARD_<SERVICE>_`` rows
    aside (held above). ``TRAINYARD_NATS_USER`` / ``_PASSWORD`` names
    ``TRAINYARD_NATS_PASSWORD``; ``[`1` / `10`]`` gives one default each, ``[`x`]`` one for
    all; ``[none: ...]`` is unset."""
    readme = (ROOT / "deploy" / "README.md").read_text()
    section = readme[readme.index("## Environment variables") :]
    for line in section.splitlines():
        cells = line.split(" | ")
        if not line.startswith("| `TRAINYARD_") or "<SERVICE>" in cells[0]:
            continue
        first, *others = re.findall(r"`((?:TRAINYARD|\.\.\.|)_[A-Z0-9_]+)`", cells[0])
        names = [first]
        for other in others:
            if other.startswith("TRAINYARD_"):
                names.append(other)
            elif other.startswith("..._"):  # the first name's service prefix
                names.append("_".join(first.split("_")[:2]) + other[3:])
            else:  # as many trailing words of the first name replaced
                names.append("_".join(first.split("_")[: -other.count("_")]) + other)
        bracket = re.search(r"\[([^\]]*)\](?!\()", cells[-1])  # not a link
        if bracket is None:
            for name in names:
                yield name, None
            continue
        given = bracket.group(1)
        values = re.findall(r"`([^`]*)`", given)
        if given.startswith("none"):
            values = ["unset"] * len(names)
        elif not values:
            values = [given]
        if len(values) == 1:
            values *= len(names)
        if len(values) != len(names):  # a list of names, not one value each
            values = [json.dumps(values)] * len(names)
        yield from zip(names, values, strict=True)


README_ROWS = list(readme_rows())


def test_deploy_readme_s_tables_are_read() -> None:
    assert len(README_ROWS) >= 30, README_ROWS
    assert ("TRAINYARD_NATS_PASSWORD", "unset") in README_ROWS
    assert ("TRAINYARD_DATABASE_POOL_MAX_SIZE", "10") in README_ROWS
    assert ("TRAINYARD_SUBMISSION_BILLING_PUBLIC_URL", None) in README_ROWS


@pytest.mark.parametrize(("variable", "documented"), README_ROWS, ids=[v for v, _ in README_ROWS])
def test_deploy_readme_names_settings_with_the_code_s_defaults(
    variable: str, documented: str | None
) -> None:
    """deploy/README.md's "Environment variables" tables say each default in brackets; only
    their per-service ports and the runner's job variables were held to the code."""
    defaults = [d for (_, v), d in DEFAULTS.items() if v == variable]
    assert defaults, f"deploy/README.md: {variable} is no setting of any service"
    if documented is not None:
        assert_agrees(variable, documented, defaults[0])
