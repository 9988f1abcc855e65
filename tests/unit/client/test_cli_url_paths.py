"""Every value the CLI puts in a URL path is exactly one segment there (quoted, dots
included), so it reaches no other route and no other name. A metric key keeps its slashes;
a key with an empty, ``.`` or ``..`` part (which a URL resolves or merges) is refused
naming KEY."""

from __future__ import annotations

import httpx
import pytest

from trainyard import cli
from trainyard.cli_base import Exit
from trainyard.client import segment

JOB = "abc12345-0000-4000-8000-000000000001"
BASE = ["--url", "http://127.0.0.1:9", "--token", "ty_a"]


def test_values_in_a_path_are_one_segment_each() -> None:
    assert segment("..") == "%2E%2E" and segment(".") == "%2E"
    assert segment("a/b") == "a%2Fb" and segment("a%2Fb") == "a%252Fb"
    assert segment("v1.2") == "v1.2" and segment("..x") == "..x"


@pytest.mark.parametrize(
    ("argv", "path"),
    [
        (["tag", JOB, ".."], f"/v1/jobs/{JOB}/tags/%2E%2E"),
        (["metrics", JOB, "train/loss"], f"/v1/jobs/{JOB}/metrics/train/loss"),
        (["metrics", JOB, "a b%2F?#"], f"/v1/jobs/{JOB}/metrics/a%20b%252F%3F%23"),
        (["metrics", JOB, "..x/y.."], f"/v1/jobs/{JOB}/metrics/..x/y.."),
    ],
)
def test_the_request_reaches_the_named_path(
    argv: list[str], path: str, sent: list[httpx.Request]
) -> None:
    assert cli.main([*BASE, *argv]) == Exit.NOT_FOUND
    assert sent and sent[-1].url.raw_path.split(b"?")[0] == path.encode()


@pytest.mark.parametrize(
    "argv",
    [
        ["model", "grant", "a/b", ".."],
        ["model", "revoke", "a/b", "."],
        ["dataset", "grant", "a/b", "x%2Fy"],
    ],
)
def test_a_team_that_cannot_be_a_name_reaches_no_path_at_all(
    argv: list[str], sent: list[httpx.Request]
) -> None:
    """A grantee TEAM was quoted into one segment of the grant's path; it is now checked
    as a team name first (``cli_models.name_arg``), so it is sent nowhere."""
    with pytest.raises(SystemExit) as refused:
        cli.main([*BASE, *argv])
    assert refused.value.code == Exit.USAGE
    assert sent == []


@pytest.mark.parametrize("key", ["..", "a/../b", "a//b", "/a", "a/", "./a", "a/."])
def test_a_metric_key_a_url_cannot_carry_is_refused_naming_key(
    key: str, sent: list[httpx.Request], capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main([*BASE, "metrics", JOB, key]) == Exit.USAGE
    err = capsys.readouterr().err
    assert f"KEY: {key!r}" in err, err
    assert sent == []
