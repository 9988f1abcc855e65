"""``TRAINYARD_SUBMISSION_TOKEN_TTL_DAYS`` cannot turn token expiry off: its comment said
"null: tokens never expire", but the environment refuses every way of saying so."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from trainyard_platform.services.submission.config import Settings


@pytest.mark.parametrize("value", ["null", "", "None", "0"])
def test_no_value_of_the_environment_makes_tokens_never_expire(
    value: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TRAINYARD_SUBMISSION_TOKEN_TTL_DAYS", value)
    with pytest.raises(ValidationError) as refused:
        Settings()
    assert [e["loc"] for e in refused.value.errors()] == [("token_ttl_days",)]


def test_the_environment_sets_a_lifetime_in_days(monkeypatch: pytest.MonkeyPatch) -> None:
    assert Settings().token_ttl_days == 90
    monkeypatch.setenv("TRAINYARD_SUBMISSION_TOKEN_TTL_DAYS", "3660")
    assert Settings().token_ttl_days == 3660
