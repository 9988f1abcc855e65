"""The submission service's outbox relay gathers its busy rounds as configured."""

from __future__ import annotations

from typing import cast

import asyncpg

from trainyard_platform.services.submission.config import Settings
from trainyard_platform.services.submission.service import outbox_relay
from trainyard_platform.shared.bus import Bus


def test_a_busy_relay_gathers_40_ms_of_submissions_by_default() -> None:
    """Each round costs about a millisecond of CPU whatever it carries: at a thousand
    submissions a second, 10 ms rounds (the outbox's default) cost four times as much."""
    pool, bus = cast(asyncpg.Pool, object()), cast(Bus, object())
    assert outbox_relay(pool, bus, Settings()).busy_round_s == 0.04
    configured = Settings(outbox_busy_round_s=0.005)
    assert outbox_relay(pool, bus, configured).busy_round_s == 0.005
