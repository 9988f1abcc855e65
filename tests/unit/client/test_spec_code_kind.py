"""A spec's ``code`` of no known ``kind`` is told the kinds there are, in the CLI's check
and in the API's answer alike."""

from __future__ import annotations

import pytest

from trainyard.spec import SpecError, parse

BASE = "name: a\nentrypoint: m\ngpu_flavor: cpu\n"


@pytest.mark.parametrize(
    ("code", "says"),
    [
        (
            "{repository: 'https://h/r', commit: " + "a" * 40 + "}",
            "code.kind: field required (one of 'bundle', 'git')",
        ),
        ("{kind: gitt, repository: 'https://h/r'}", "code.kind: must be one of 'bundle', 'git'"),
    ],
)
def test_code_of_no_known_kind_is_told_the_kinds(code: str, says: str) -> None:
    """``code`` without a ``kind`` (or with one that is none) was told it ``matches none of
    the allowed forms (see `trainyard schema`)``, which says neither what is wrong nor how
    to write it."""
    with pytest.raises(SpecError) as caught:
        parse(BASE + f"gpus: 1\ncode: {code}\n", "j.yaml")
    (line,) = str(caught.value).splitlines()
    assert says in line, line
