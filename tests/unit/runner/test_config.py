"""Runner settings: a node id that is a valid NATS token, and a drain that fits the grace."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from trainyard_platform.services.runner.__main__ import main
from trainyard_platform.services.runner.config import Settings, default_node_id
from trainyard_platform.shared.events.payloads import MAX_NODE_GPUS
from trainyard_platform.shared.worst_case import KILL_GRACE_SECONDS


@pytest.fixture(autouse=True)
def _admin_token(monkeypatch: pytest.MonkeyPatch) -> None:
    """The operator token is a required setting (``shared.access``)."""
    monkeypatch.setenv("TRAINYARD_RUNNER_ADMIN_TOKEN", "op-token")


@pytest.mark.parametrize(
    ("hostname", "node_id"),
    [
        ("gpu-01", "gpu-01"),
        ("GPU_01.cluster.example.com", "gpu-01-cluster-example-com"),
        ("--weird--", "weird"),
        ("...", "node"),
    ],
)
def test_the_default_node_id_is_the_sanitised_host_name(hostname: str, node_id: str) -> None:
    assert default_node_id(hostname) == node_id
    Settings(node_id=default_node_id(hostname))  # always valid


def test_node_ids_with_subject_wildcards_or_dots_are_refused() -> None:
    for bad in ("a.b", "a*", "a>", "A", ""):
        with pytest.raises(ValidationError):
            Settings(node_id=bad)


def test_the_drain_must_fit_in_the_shutdown_grace() -> None:
    with pytest.raises(ValidationError, match="drain_timeout_seconds"):
        Settings(drain_timeout_seconds=100, shutdown_grace_seconds=90)


def test_settings_come_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRAINYARD_RUNNER_VIRTUAL_GPUS", "4")
    monkeypatch.setenv("TRAINYARD_RUNNER_GPU_FLAVOR", "a100")
    settings = Settings()
    assert settings.virtual_gpus == 4 and settings.gpu_flavor == "a100"
    assert settings.port == 8082


def test_a_node_offers_no_more_virtual_gpus_than_a_heartbeat_may_say() -> None:
    """A heartbeat with more GPUs than ``MAX_NODE_GPUS`` is dead-lettered: the node would
    never be ready, so the runner refuses such a setting at start instead."""
    assert Settings(virtual_gpus=MAX_NODE_GPUS).virtual_gpus == MAX_NODE_GPUS
    with pytest.raises(ValidationError, match="virtual_gpus"):
        Settings(virtual_gpus=MAX_NODE_GPUS + 1)


def test_the_kill_grace_is_at_most_what_a_budget_reserves() -> None:
    """A budget reserves each job's worst case as its ``max_runtime_seconds`` and
    ``KILL_GRACE_SECONDS`` (``shared.worst_case``): a longer grace would let a job at its
    limit be billed past what its budget reserved, so the runner refuses it at start."""
    assert Settings().kill_grace_seconds == KILL_GRACE_SECONDS
    assert Settings(kill_grace_seconds=5).kill_grace_seconds == 5
    with pytest.raises(ValidationError, match="kill_grace_seconds"):
        Settings(kill_grace_seconds=KILL_GRACE_SECONDS + 1)


def test_topology_defaults_and_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    assert Settings().topology == "default"
    monkeypatch.setenv("TRAINYARD_RUNNER_TOPOLOGY", "rack-7")
    assert Settings().topology == "rack-7"
    with pytest.raises(ValidationError):
        Settings(topology="has space")


def test_the_cli_overrides_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRAINYARD_RUNNER_VIRTUAL_GPUS", "4")
    seen: list[Settings] = []

    async def fake_serve(settings: Settings) -> int:
        seen.append(settings)
        return 0

    monkeypatch.setattr("trainyard_platform.services.runner.__main__.serve", fake_serve)
    assert main(["--virtual-gpus", "2", "--node-id", "n-1", "--gpu-flavor", "h200"]) == 0
    assert (seen[0].virtual_gpus, seen[0].node_id, seen[0].gpu_flavor) == (2, "n-1", "h200")


def test_derived_choices_are_every_range_once_starting_with_the_node_ids() -> None:
    choices = Settings(node_id="node-7").job_uid_choices
    assert choices[0] == Settings(node_id="node-7").job_uids
    assert len({c.start for c in choices}) == 1000
    assert all(c.start % 64 == 0 and c.start >= 200_000 and c.stop <= 264_000 for c in choices)
    assert Settings(node_id="node-7", job_uid_base=300_000).job_uid_choices == [
        range(300_000, 300_064)
    ]
