"""A service started with bad settings names each one and starts nothing."""

from __future__ import annotations

import pytest

from trainyard_platform.services.billing.config import Settings
from trainyard_platform.services.runner.__main__ import main as runner_main
from trainyard_platform.shared.runtime import serve_from_command_line


async def _must_not_serve(_: Settings) -> int:
    raise AssertionError("served with invalid settings")


def test_bad_settings_are_named_with_their_variable(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("TRAINYARD_NATS_RETENTION_HOURS", "-1")

    with pytest.raises(SystemExit) as exited:
        serve_from_command_line("billing", "test", Settings, _must_not_serve, [])

    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert "invalid setting TRAINYARD_NATS_RETENTION_HOURS: Input should be greater than 0" in err
    assert "(got '-1')" in err
    assert "Traceback" not in err


def test_a_bad_service_setting_is_named_with_the_service_prefix(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("TRAINYARD_BILLING_SHUTDOWN_GRACE_SECONDS", "soon")

    with pytest.raises(SystemExit) as exited:
        serve_from_command_line("billing", "test", Settings, _must_not_serve, [])

    assert exited.value.code == 2
    assert "invalid setting TRAINYARD_BILLING_SHUTDOWN_GRACE_SECONDS:" in capsys.readouterr().err


def test_the_runner_names_a_bad_setting_too(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("TRAINYARD_NATS_MAX_DELIVER", "many")

    with pytest.raises(SystemExit) as exited:
        runner_main([])

    assert exited.value.code == 2
    assert "invalid setting TRAINYARD_NATS_MAX_DELIVER:" in capsys.readouterr().err
