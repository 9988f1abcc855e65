"""``trainyard metrics JOB KEY --points 3`` reached the registry and came back as ``422
invalid request (max_points: Expected `int` >= 4)``, exit 1: a field the user never wrote,
for an option the command line alone can judge. It is a usage error naming --points now,
with the bounds the registry takes, before any request."""

from __future__ import annotations

import pytest

from trainyard import cli


@pytest.mark.parametrize("points", ["3", "0", "-1", "100001", "abc"])
def test_points_out_of_the_registry_s_bounds_are_a_usage_error(
    points: str, sent: list[object], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as ended:
        cli.main(["metrics", "j-1", "loss", "--points", points])
    assert ended.value.code == 2
    assert (
        f"argument --points: {points!r} is not a whole number from 4 to 100000"
        in capsys.readouterr().err
    )
    assert sent == []
