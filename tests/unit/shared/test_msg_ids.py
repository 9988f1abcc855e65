"""The ``Nats-Msg-Id`` a bus sends (``bus.keyed_msg_id``): its own service's, one subject's."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import SecretStr

from trainyard_platform.shared import bus as bus_module
from trainyard_platform.shared.bus import Bus, UnkeyedMsgIds, dedup_key, keyed_msg_id
from trainyard_platform.shared.runtime import run_service
from trainyard_platform.shared.settings import NatsSettings


def _key(
    user: str | None, password: str | None, url: str = "nats://127.0.0.1:4222"
) -> bytes | None:
    secret = SecretStr(password) if password is not None else None
    return dedup_key(NatsSettings(url=url, user=user, password=secret))


def test_one_service_makes_one_id_and_no_other_user_the_same() -> None:
    subject, event = "trainyard.allocation.revoked.v1.node-a", "preempt:a-1"
    scheduler = keyed_msg_id(_key("scheduler", "s3cret"), subject, event)
    assert scheduler == keyed_msg_id(_key("scheduler", "s3cret"), subject, event)  # a replica
    assert len(scheduler) == 22 and scheduler != event
    others = {
        keyed_msg_id(_key("runner-node-a", "s3cret"), subject, event),
        keyed_msg_id(_key("scheduler", "another"), subject, event),
        keyed_msg_id(_key("scheduler", "s3cret"), subject + "x", event),
        keyed_msg_id(_key("scheduler", "s3cret"), subject, event + "x"),
    }
    assert scheduler not in others and len(others) == 4


def test_credentials_in_the_url_key_it_and_none_leave_the_event_id() -> None:
    in_url = _key(None, None, "nats://admin:pw@127.0.0.1:4222")
    assert in_url is not None and in_url == _key("admin", "pw")
    assert _key(None, None) is None
    assert keyed_msg_id(None, "s", "event-1") == "event-1"


async def test_a_bus_without_a_password_refuses_to_start(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without a password the ids were the bare event ids, which another publisher can
    foresee and send first, so the server drops the real event as a duplicate: the bus
    used them silently. It refuses to connect, naming the settings, unless the development
    setting allows it; a service started so exits with status 2 and one line."""
    connected: list[str] = []

    async def connect(url: str, **options: Any) -> None:
        connected.append(url)
        raise RuntimeError("stop here")

    monkeypatch.setattr(bus_module.nats, "connect", connect)
    with pytest.raises(UnkeyedMsgIds) as refused:
        async with Bus.connect(NatsSettings(), "test"):
            pass
    assert connected == []
    text = str(refused.value)
    assert "TRAINYARD_NATS_PASSWORD" in text and "TRAINYARD_NATS_UNKEYED_MSG_IDS" in text


def test_a_service_whose_bus_is_refused_exits_with_status_2(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async def serve() -> int:
        async with Bus.connect(NatsSettings(), "test"):
            return 0

    monkeypatch.delenv("TRAINYARD_NATS_UNKEYED_MSG_IDS", raising=False)
    assert run_service(serve()) == 2


async def test_the_development_setting_lets_a_bus_without_a_password_connect(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    connected: list[str] = []

    async def connect(url: str, **options: Any) -> None:
        connected.append(url)
        raise RuntimeError("stop here")

    monkeypatch.setattr(bus_module.nats, "connect", connect)
    monkeypatch.setenv("TRAINYARD_NATS_UNKEYED_MSG_IDS", "true")
    with pytest.raises(RuntimeError, match="stop here"):
        async with Bus.connect(NatsSettings(), "test"):
            pass
    assert connected == ["nats://127.0.0.1:4222"]
    # With a password, as every deployment has, nothing is asked.
    monkeypatch.delenv("TRAINYARD_NATS_UNKEYED_MSG_IDS")
    with pytest.raises(RuntimeError, match="stop here"):
        async with Bus.connect(NatsSettings(user="x", password=SecretStr("pw")), "test"):
            pass
    assert len(connected) == 2
