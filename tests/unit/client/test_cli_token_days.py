"""``trainyard token create --days 0`` (or ``rotate --days 400``) reached the API and came
back as ``422 invalid request (expires_in_days: Input should be greater than or equal to
1)``, exit 1, naming a body field the user never wrote. ``--days`` is judged before any
request against the bounds docs/security.md gives (1 to 366), a usage error naming it."""

from __future__ import annotations

import pytest

from trainyard import cli


@pytest.mark.parametrize("action", ["create", "rotate"])
@pytest.mark.parametrize("days", ["0", "367", "-5", "ten"])
def test_days_out_of_bounds_are_a_usage_error_naming_the_option(
    action: str, days: str, sent: list[object], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as ended:
        cli.main(["token", action, "--days", days])
    assert ended.value.code == 2
    assert (
        f"argument --days: {days!r} is not a whole number of days from 1 to 366"
        in capsys.readouterr().err
    )
    assert sent == []


def test_the_bounds_are_the_api_s() -> None:
    from trainyard.cli_access import TOKEN_DAYS_MAX, TOKEN_DAYS_MIN
    from trainyard_platform.services.submission.identity_schemas import TokenDays

    [field] = TokenDays.__metadata__
    bounds = {type(c).__name__: getattr(c, type(c).__name__.lower()) for c in field.metadata}
    assert bounds == {"Ge": TOKEN_DAYS_MIN, "Le": TOKEN_DAYS_MAX}
