"""``trainyard experiments EXP --sort loss`` (or ``--filter final:loss>abc``) reached the
registry and ended ``422 invalid request (sort: must be final:<metric key> ...)``, exit 1.
Their form is judged before any request now, a usage error naming the option, as the
registry judges it (services/registry/tracking_query.py)."""

from __future__ import annotations

import pytest

from trainyard import cli


@pytest.fixture(autouse=True)
def token(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRAINYARD_TOKEN", "ty_a")
    monkeypatch.setenv("TRAINYARD_URL", "http://api.test")


@pytest.mark.parametrize(
    ("option", "value", "said"),
    [
        ("--sort", "loss", "is not final:KEY or best:KEY"),
        ("--sort", "last:loss", "is not final:KEY or best:KEY"),
        (
            "--filter",
            "final:loss>abc",
            "is not final:KEY or best:KEY, then <, <=, > or >=, then a number",
        ),
        (
            "--filter",
            "loss>=0.9",
            "is not final:KEY or best:KEY, then <, <=, > or >=, then a number",
        ),
        (
            "--filter",
            "final:loss",
            "is not final:KEY or best:KEY, then <, <=, > or >=, then a number",
        ),
    ],
)
def test_a_malformed_sort_or_filter_is_a_usage_error_before_any_request(
    option: str, value: str, said: str, sent: list[object], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as ended:
        cli.main(["experiments", "digits", option, value])
    assert ended.value.code == 2
    assert f"argument {option}: {value!r} {said}" in capsys.readouterr().err
    assert sent == []


@pytest.mark.parametrize(
    "argv",
    [["--sort", "best:val/acc"], ["--filter", "final:loss<=0.5"], ["--filter", "best:a>1e-3"]],
)
def test_well_formed_ones_go_to_the_registry(argv: list[str], sent: list[object]) -> None:
    cli.main(["experiments", "digits", *argv])
    assert sent  # asked (the fake registry knows no experiment)


def test_the_forms_are_the_registry_s() -> None:
    from trainyard import cli_tracking
    from trainyard_platform.services.registry import tracking_query

    assert cli_tracking._SORT.pattern == tracking_query._SORT.pattern
    assert cli_tracking._FILTER.pattern == tracking_query._FILTER.pattern
