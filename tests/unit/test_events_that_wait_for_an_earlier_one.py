"""The handlers' errors for an event that follows one not applied yet are the bus's
``NotYet``, so they are retried past ``ack_wait`` (the earlier event may be held by a replica
that died) rather than dead-lettered after ``max_deliver`` quick deliveries."""

from __future__ import annotations

from trainyard_platform.services.billing.handlers import NotAnnounced
from trainyard_platform.services.registry.domain import RunNotRecorded
from trainyard_platform.shared.bus import NotYet


def test_a_release_before_its_grant_waits_for_it() -> None:
    assert issubclass(NotAnnounced, NotYet)


def test_a_success_or_metrics_before_their_start_wait_for_it() -> None:
    assert issubclass(RunNotRecorded, NotYet)
    assert issubclass(RunNotRecorded, LookupError)  # as callers caught it before
