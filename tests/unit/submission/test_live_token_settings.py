"""``TRAINYARD_SUBMISSION_LIVE_TOKENS_PER_USER``/``_PER_TEAM``: bounded, and a team's bound
below a user's (which would make the user's unreachable) is refused at start, naming both."""

from __future__ import annotations

import pytest

from trainyard_platform.services.submission.config import Settings
from trainyard_platform.shared.runtime import settings_or_exit


def test_defaults_are_100_per_user_and_1000_per_team() -> None:
    settings = Settings()
    assert (settings.live_tokens_per_user, settings.live_tokens_per_team) == (100, 1000)


@pytest.mark.parametrize(
    ("variable", "value"),
    [("LIVE_TOKENS_PER_USER", "0"), ("LIVE_TOKENS_PER_TEAM", "0"), ("LIVE_TOKENS_PER_USER", "x")],
)
def test_a_bound_out_of_range_is_refused_naming_it(
    variable: str, value: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv(f"TRAINYARD_SUBMISSION_{variable}", value)
    with pytest.raises(SystemExit) as exited:
        settings_or_exit("submission", Settings)
    assert exited.value.code == 2
    assert f"invalid setting TRAINYARD_SUBMISSION_{variable}:" in capsys.readouterr().err


def test_a_team_bound_below_a_users_is_refused(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("TRAINYARD_SUBMISSION_LIVE_TOKENS_PER_USER", "50")
    monkeypatch.setenv("TRAINYARD_SUBMISSION_LIVE_TOKENS_PER_TEAM", "20")
    with pytest.raises(SystemExit):
        settings_or_exit("submission", Settings)
    assert capsys.readouterr().err.strip() == (
        "submission: invalid setting TRAINYARD_SUBMISSION_LIVE_TOKENS_PER_TEAM: must be at "
        "least TRAINYARD_SUBMISSION_LIVE_TOKENS_PER_USER (20 < 50)"
    )


def test_refused_authentications_are_not_bounded_per_address_unless_asked() -> None:
    # Keyed by address, the bound holds back everyone sharing a failing client's address
    # (a proxy, the other services): an operator turns it on where addresses are one's own.
    assert Settings().failed_auth_burst == 0
