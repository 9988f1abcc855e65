"""Scheduler settings: defaults, the environment, and a lock session that cannot time out."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from trainyard_platform.services.scheduler.config import Settings
from trainyard_platform.services.scheduler.inventory import InventoryMode
from trainyard_platform.services.scheduler.service import tuning_from


@pytest.fixture(autouse=True)
def _admin_token(monkeypatch: pytest.MonkeyPatch) -> None:
    """The operator token is a required setting (``shared.access``)."""
    monkeypatch.setenv("TRAINYARD_SCHEDULER_ADMIN_TOKEN", "op-token")


def test_defaults_become_the_policys_tunables() -> None:
    tuning = tuning_from(Settings())
    assert tuning.preemption_grace_s == 300.0
    assert tuning.cancel_grace_s == 30.0
    assert tuning.half_life_s == 7 * 24 * 3600.0
    assert (tuning.policy.backfill, tuning.policy.preemption) == (True, True)
    assert (tuning.restart_backoff_s, tuning.restart_backoff_max_s) == (5.0, 300.0)


def test_settings_come_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRAINYARD_SCHEDULER_PREEMPTION_GRACE_SECONDS", "45")
    monkeypatch.setenv("TRAINYARD_SCHEDULER_BACKFILL", "false")
    monkeypatch.setenv("TRAINYARD_SCHEDULER_ADMIN_TOKEN", "secret")
    monkeypatch.setenv("TRAINYARD_SCHEDULER_RESTART_BACKOFF_SECONDS", "0.2")
    monkeypatch.setenv("TRAINYARD_SCHEDULER_RESTART_BACKOFF_MAX_SECONDS", "60")
    settings = Settings()
    assert (
        tuning_from(settings).restart_backoff_s,
        tuning_from(settings).restart_backoff_max_s,
    ) == (
        0.2,
        60.0,
    )
    assert tuning_from(settings).preemption_grace_s == 45.0
    assert tuning_from(settings).policy.backfill is False
    assert settings.admin_token is not None
    assert settings.admin_token.get_secret_value() == "secret"


def test_the_leader_session_must_outlive_its_checks() -> None:
    with pytest.raises(ValidationError, match="leader_session_timeout_seconds"):
        Settings(leader_check_seconds=10, leader_session_timeout_seconds=5)
    Settings(leader_check_seconds=10, leader_session_timeout_seconds=0)  # off: any check


def test_the_node_inventory_is_optional_unless_required(monkeypatch: pytest.MonkeyPatch) -> None:
    """Optional by default (the zero-configuration local stack); ``required`` reaches the
    heartbeat handling's tunables; anything else is refused naming the setting."""
    assert tuning_from(Settings()).node_inventory is InventoryMode.OPTIONAL
    monkeypatch.setenv("TRAINYARD_SCHEDULER_NODE_INVENTORY", "required")
    assert tuning_from(Settings()).node_inventory is InventoryMode.REQUIRED
    monkeypatch.setenv("TRAINYARD_SCHEDULER_NODE_INVENTORY", "strict")
    with pytest.raises(ValidationError, match="node_inventory"):
        Settings()
