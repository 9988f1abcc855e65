"""A service whose PostgreSQL or object store cannot be reached or used at start says so in
one line naming the setting, and exits with status 75 when it was an outage (a supervisor
starts it again until it is over) or 1 when it can never work: no traceback, no secret."""

from __future__ import annotations

import json
import logging

import pytest

from trainyard_platform.services.billing.config import Settings
from trainyard_platform.services.billing.service import serve
from trainyard_platform.shared.runtime import (
    StartupFailed,
    open_service_store,
    serve_from_command_line,
)
from trainyard_platform.shared.settings import StorageSettings

TOKEN = "startup-failure-test-token-0123456789abcdef"


@pytest.fixture(autouse=True)
def fresh_log_handlers() -> None:
    """A service configures logging to the stderr of its test (captured, then closed): drop
    an earlier test's handler, as a process of its own would start without one."""
    logging.getLogger().handlers.clear()


@pytest.fixture(autouse=True)
def billing_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRAINYARD_BILLING_ADMIN_TOKEN", TOKEN)
    monkeypatch.setenv("TRAINYARD_BILLING_PORT", "0")
    monkeypatch.delenv("TRAINYARD_TELEMETRY_SPAN_FILE", raising=False)


@pytest.mark.parametrize(
    ("url", "reason", "exit_status"),
    [
        # Port 1 on loopback: nothing listens, the connection is refused at once. An outage:
        # the same start may work later (EX_TEMPFAIL).
        ("postgresql://trainyard:pg-secret-pw@127.0.0.1:1/trainyard", "Connect call failed", 75),
        ("mysql://trainyard:pg-secret-pw@db/trainyard", "invalid DSN", 1),
    ],
)
def test_postgresql_unusable_at_start_is_one_line_naming_the_setting(
    url: str,
    reason: str,
    exit_status: int,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("TRAINYARD_DATABASE_URL", url)

    status = serve_from_command_line("billing", "test", Settings, serve, [])

    assert status == exit_status
    err = capsys.readouterr().err
    [line] = [line for line in err.splitlines() if "cannot start" in line]
    assert "PostgreSQL (TRAINYARD_DATABASE_URL)" in line
    assert reason in line
    assert "Traceback" not in err
    assert "pg-secret-pw" not in err


async def test_an_object_store_uri_that_is_none_names_its_setting() -> None:
    with pytest.raises(StartupFailed) as failed:
        await open_service_store(StorageSettings(uri="garbage"))

    assert "the object store (TRAINYARD_STORAGE_URI" in str(failed.value)
    assert "not an object-store URI" in str(failed.value)


def test_the_services_open_their_store_through_the_runtime() -> None:
    """Each service that opens the object store at start does it with ``open_service_store``
    (or ``ServiceRuntime.open_pool`` for PostgreSQL), so its failure is the one line above."""
    from pathlib import Path

    services = Path(__file__).resolve().parents[3] / "services"
    for name in ("registry", "runner", "submission"):
        source = (services / name / "service.py").read_text()
        assert "open_service_store(" in source, name
        assert "to_thread(open_store" not in source, name
    for name in ("billing", "registry", "scheduler", "submission"):
        source = (services / name / "service.py").read_text()
        assert "rt.open_pool(" in source, name


def test_a_runner_work_folder_that_cannot_be_made_names_its_setting(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """TRAINYARD_RUNNER_WORK_DIR where no folder can be made ended the runner in a
    traceback (FileNotFoundError from mkdir, before anything was set up)."""
    from trainyard_platform.services.runner.__main__ import main as runner_main

    monkeypatch.setenv("TRAINYARD_RUNNER_ADMIN_TOKEN", TOKEN)
    monkeypatch.setenv("TRAINYARD_RUNNER_PORT", "0")
    monkeypatch.setenv("TRAINYARD_RUNNER_WORK_DIR", "/proc/no-folder-can-be-made-here")

    assert runner_main(["--virtual-gpus", "1"]) == 1
    err = capsys.readouterr().err
    [line] = [line for line in err.splitlines() if "cannot start" in line]
    assert "(TRAINYARD_RUNNER_WORK_DIR)" in line
    assert "/proc/no-folder-can-be-made-here" in line
    assert "Traceback" not in err


def test_another_runners_job_uids_are_one_log_line_in_the_log_format_and_status_2(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The runner printed this refusal as plain text whatever TRAINYARD_LOG_FORMAT said (a
    log pipeline reading JSON lines lost it); now it is a log line like every other
    refusal to start, with the status of a bad setting."""
    from trainyard_platform.services.runner.sandbox import UidsInUse
    from trainyard_platform.shared.runtime import ServiceRuntime, run_service
    from trainyard_platform.shared.settings import ServiceSettings

    monkeypatch.setenv("TRAINYARD_LOG_FORMAT", "json")

    async def serve_held() -> int:
        async with ServiceRuntime("runner", ServiceSettings(port=0)):
            # What claim_job_uids raises while another runner holds the uids.
            raise UidsInUse("job uids 1-2 are held by another runner on this host")

    assert run_service(serve_held()) == 2
    [line] = capsys.readouterr().err.splitlines()
    record = json.loads(line)
    assert record["level"] == "CRITICAL" and record["service"] == "runner"
    assert record["message"] == (
        "cannot start: job uids 1-2 are held by another runner on this host"
    )
