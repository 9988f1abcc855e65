"""What the documents name, held to the code mechanically: settings, their defaults, files.

A document that names a ``TRAINYARD_*`` variable no code reads, gives a setting a default
in its prose that the code does not have, or sends the reader to a file that is not there
promises what nothing keeps. The settings tables are held to the code by
tests/unit/deploy/test_operations_settings.py; these hold the prose of every document:

* every ``TRAINYARD_*`` name is a setting a service reads (or the prefix of some), or is
  used by name in the code, the client or the deployment files (the CLI's
  ``TRAINYARD_TOKEN``, compose's ``TRAINYARD_ADMIN_TOKEN``, a stream's name);
* a default said beside a setting, ``TRAINYARD_X`` (5 s), ``TRAINYARD_X``, default 600,
  is the code's, its unit (s, min, h, days, KiB ... GiB) converted to the setting's own
  (``_SECONDS``, ``_HOURS``, ``_DAYS``, ``_BYTES``, ``_GIB``);
* every path in backticks under a folder of the repository exists;
* a constant named with its module (``supervisor.MAX_CONTROL_CONNECTIONS``) or its file
  (``SAY_MIN_INTERVAL``, ``services/scheduler/inventory.py``) is assigned there."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.unit.deploy.test_operations_settings import DEFAULTS, SETTINGS_READ

ROOT = Path(__file__).resolve().parents[2]
DOCS = sorted([*(ROOT / "docs").glob("*.md"), ROOT / "README.md", ROOT / "deploy" / "README.md"])
CODE_FOLDERS = ("services", "shared", "client", "deploy", "bench", "tests")

_VARIABLE = re.compile(r"\bTRAINYARD_[A-Z0-9_]*[A-Z0-9]\b")


def _used_by_name() -> set[str]:
    """Every ``TRAINYARD_*`` name the code uses as a string (``"TRAINYARD_TOKEN"``,
    compose's ``${TRAINYARD_ADMIN_TOKEN...}``) or any configuration file names, this
    file aside."""
    names: set[str] = set()
    files = [ROOT / "dev.py"]
    for folder in CODE_FOLDERS:
        files += [p for p in (ROOT / folder).rglob("*") if p.suffix in (".py", ".js", ".sh")]
        config = [p for p in (ROOT / folder).rglob("*") if p.suffix in (".yaml", ".yml", ".conf")]
        for path in config:
            names |= set(_VARIABLE.findall(path.read_text(errors="replace")))
    for path in files:
        if path == Path(__file__).resolve():
            continue  # its examples of wrong names
        names |= set(re.findall(r"[\"'{]\$?\{?(TRAINYARD_[A-Z0-9_]+)", path.read_text()))
    return names


READ = {variable for _, variable, _ in SETTINGS_READ}
KNOWN = READ | _used_by_name()


def unknown_variables(text: str) -> list[str]:
    """The ``TRAINYARD_*`` names of ``text`` that are no setting read, no prefix of one and
    no name the code uses."""
    return sorted(
        name
        for name in set(_VARIABLE.findall(text))
        if name not in KNOWN and not any(known.startswith(name + "_") for known in KNOWN)
    )


@pytest.mark.parametrize("doc", DOCS, ids=lambda path: path.name)
def test_every_variable_a_document_names_is_one_the_code_reads(doc: Path) -> None:
    assert unknown_variables(doc.read_text()) == [], doc.name


_UNIT_FACTORS = {
    "s": 1,
    "second": 1,
    "seconds": 1,
    "min": 60,
    "minute": 60,
    "minutes": 60,
    "h": 3600,
    "hour": 3600,
    "hours": 3600,
    "day": 86400,
    "days": 86400,
    "KiB": 1024,
    "MiB": 1024**2,
    "GiB": 1024**3,
    "TiB": 1024**4,
}
_SETTING_UNITS = {"_SECONDS": 1, "_HOURS": 3600, "_DAYS": 86400, "_BYTES": 1, "_GIB": 1024**3}
_SAID_DEFAULT = re.compile(
    r"`(?P<variable>TRAINYARD_[A-Z0-9_]+)`"
    r"(?:,? \((?:default:? )?|, (?:default:? |by default )?)"
    r"(?P<number>\d[\d,]*(?:\.\d+)?)"
    rf"(?: ?(?P<unit>{'|'.join(_UNIT_FACTORS)})\b)?"
)


def said_defaults(text: str) -> Iterator[tuple[str, str, float | None]]:
    """(variable, the words, the value in the setting's own unit or None when the words
    give a unit the setting's name does not have) of every default ``text`` says beside a
    setting's name."""
    for found in _SAID_DEFAULT.finditer(" ".join(text.split())):
        variable, unit = found.group("variable"), found.group("unit")
        value = float(found.group("number").replace(",", ""))
        if unit is not None:
            own = [factor for suffix, factor in _SETTING_UNITS.items() if variable.endswith(suffix)]
            if not own:
                yield variable, found.group(0), None
                continue
            value = value * _UNIT_FACTORS[unit] / own[0]
        yield variable, found.group(0), value


def wrong_defaults(text: str) -> list[str]:
    """The defaults ``text`` says beside a setting that are not the code's."""
    wrong = []
    for variable, words, value in said_defaults(text):
        code = {d for (_, v), d in DEFAULTS.items() if v == variable}
        numbers = {float(d) for d in code if isinstance(d, int | float) and not isinstance(d, bool)}
        if value is None or not any(abs(n - value) <= 1e-9 * max(1.0, n) for n in numbers):
            wrong.append(f"{words} (the code: {sorted(map(repr, code))})")
    return wrong


def test_said_defaults_are_found() -> None:
    text = "\n".join(doc.read_text() for doc in DOCS)
    assert len(list(said_defaults(text))) >= 40


@pytest.mark.parametrize("doc", DOCS, ids=lambda path: path.name)
def test_a_default_said_beside_a_setting_is_the_code_s(doc: Path) -> None:
    assert wrong_defaults(doc.read_text()) == [], doc.name


def test_the_checks_find_what_they_are_for() -> None:
    """Each check refuses a sentence that says what the code does not."""
    assert unknown_variables("set `TRAINYARD_RUNNER_JOB_DISK_GB` (512)") == [
        "TRAINYARD_RUNNER_JOB_DISK_GB"
    ]
    assert unknown_variables("`TRAINYARD_NATS_OUTAGE_RETRY_*`, `TRAINYARD_TOKEN`") == []
    assert wrong_defaults("`TRAINYARD_RUNNER_JOB_DISK_CHECK_SECONDS` (5)") == []
    assert wrong_defaults("`TRAINYARD_NATS_RETENTION_HOURS` (7 days)") == []
    assert wrong_defaults("`TRAINYARD_SUBMISSION_BUNDLE_MAX_BYTES`, 100 MiB") == []
    assert len(wrong_defaults("`TRAINYARD_NATS_RETENTION_HOURS` (24 h)")) == 1
    assert len(wrong_defaults("`TRAINYARD_SCHEDULER_MAX_WAITING_JOBS_PER_TEAM` (1,000)")) == 1
    assert len(wrong_defaults("`TRAINYARD_RUNNER_JOB_MAX_PROCESSES` (16384 s)")) == 1
    assert missing_paths("`services/runner/sandbox.py`, `tests/unit/nothing_here.py`") == [
        "tests/unit/nothing_here.py"
    ]
    assert misplaced_constants("`SAY_MIN_INTERVAL`, `services/scheduler/inventory.py`") == []
    assert misplaced_constants("`supervisor.MAX_CONTROL_CONNECTIONS`") == []
    assert misplaced_constants("`SAY_MIN_INTERVAL`, `services/scheduler/node_supply.py`") == [
        "SAY_MIN_INTERVAL in services/scheduler/node_supply.py"
    ]
    assert misplaced_constants("`sandbox.MAX_CONTROL_CONNECTIONS`") == [
        "MAX_CONTROL_CONNECTIONS in sandbox"
    ]


_PATH = re.compile(rf"`((?:{'|'.join((*CODE_FOLDERS, 'docs', 'examples'))})/[\w./-]*)`")
MADE_BY_THE_OPERATOR = {"deploy/.env"}
"""Paths a document tells the reader to create."""


def missing_paths(text: str) -> list[str]:
    """The paths in backticks of ``text`` (under a folder of the repository) that do not
    exist."""
    return sorted(
        path
        for path in set(_PATH.findall(text))
        if path not in MADE_BY_THE_OPERATOR and not (ROOT / path.rstrip("/")).exists()
    )


@pytest.mark.parametrize("doc", DOCS, ids=lambda path: path.name)
def test_every_path_a_document_names_exists(doc: Path) -> None:
    assert missing_paths(doc.read_text()) == [], doc.name


_CONSTANT_IN_FILE = re.compile(r"`([A-Z][A-Z0-9_]{2,})`(?:,| in| from| of) `([\w/]+\.py)`")
_CONSTANT_OF_MODULE = re.compile(r"`((?:[a-z_]+\.)+)([A-Z][A-Z0-9_]{2,})`")
_SOURCES = [
    path for folder in ("services", "shared", "client") for path in (ROOT / folder).rglob("*.py")
]


def _assigns(path: Path, constant: str) -> bool:
    pattern = rf"^{constant}\s*(?::[^=\n]*)?="
    return re.search(pattern, path.read_text(), re.MULTILINE) is not None


def misplaced_constants(text: str) -> list[str]:
    """The constants ``text`` names with a module or file that does not assign them."""
    text = " ".join(text.split())
    wrong = []
    for constant, file in _CONSTANT_IN_FILE.findall(text):
        if not (ROOT / file).exists() or not _assigns(ROOT / file, constant):
            wrong.append(f"{constant} in {file}")
    for dotted, constant in _CONSTANT_OF_MODULE.findall(text):
        parts = dotted.rstrip(".").split(".")
        if parts[0] in ("shared", "services"):
            files = [ROOT.joinpath(*parts).with_suffix(".py")]
        else:
            files = [path for path in _SOURCES if path.stem == parts[-1]]
        if not any(path.exists() and _assigns(path, constant) for path in files):
            wrong.append(f"{constant} in {dotted.rstrip('.')}")
    return wrong


@pytest.mark.parametrize("doc", DOCS, ids=lambda path: path.name)
def test_a_constant_named_with_its_module_is_there(doc: Path) -> None:
    assert misplaced_constants(doc.read_text()) == [], doc.name
