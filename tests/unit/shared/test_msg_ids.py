"""The ``Nats-Msg-Id`` a bus sends (``bus.keyed_msg_id``): its own service's, one subject's."""

from __future__ import annotations

from pydantic import SecretStr

from trainyard_platform.shared.bus import dedup_key, keyed_msg_id
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
