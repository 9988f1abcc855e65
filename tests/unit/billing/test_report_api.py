"""Which team a caller reads from billing's read routes (``report_api.team_to_read``)."""

from __future__ import annotations

import pytest
from litestar.exceptions import NotFoundException

from trainyard_platform.services.billing.report_api import team_to_read
from trainyard_platform.shared.identity import Principal, Role, operator_token_principal


def member(team: str) -> Principal:
    return Principal(user="ada", team=team, role=Role.MEMBER, token_id=1)


def test_an_operator_reads_the_team_asked_for_or_every_team() -> None:
    operator = operator_token_principal()
    assert team_to_read(operator, None, "costs") is None
    assert team_to_read(operator, "vision", "costs") == "vision"


def test_a_member_reads_their_own_team_by_default_and_when_naming_it() -> None:
    assert team_to_read(member("vision"), None, "costs") == "vision"
    assert team_to_read(member("vision"), "vision", "costs") == "vision"


def test_a_member_naming_another_team_gets_404_naming_what_and_which() -> None:
    with pytest.raises(NotFoundException) as refused:
        team_to_read(member("vision"), "audio", "waste")
    assert refused.value.detail == (
        "no waste of team 'audio' for you to read: you read your own team's, vision's"
    )
