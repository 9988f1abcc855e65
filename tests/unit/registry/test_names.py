"""Names the model API accepts: nothing that could leave the registry's prefix gets through."""

from __future__ import annotations

import pytest

from trainyard_platform.services.registry import names
from trainyard_platform.shared.http_errors import RequestInvalid
from trainyard_platform.shared.storage import validate_key

HOSTILE = [
    "..",
    ".",
    ".hidden",
    "a/b",
    "../etc",
    "a%2Fb",
    "/abs",
    "a\\b",
    "a\x00b",
    "a\nb",
    "",
    "x" * 101,
    "ünïcode",
    "a b",
]


@pytest.mark.parametrize("value", HOSTILE)
@pytest.mark.parametrize("kind", ["team", "model", "alias", "tag"])
def test_hostile_names_are_refused_naming_the_field(kind: names.Kind, value: str) -> None:
    assert not names.is_valid(kind, value)
    with pytest.raises(RequestInvalid) as refused:
        names.check(kind, value)
    assert [e.field for e in refused.value.errors] == [kind]


@pytest.mark.parametrize(
    ("kind", "value"),
    [
        ("team", "vision"),
        ("model", "resnet-50_v2.1"),
        ("model", "x" * 100),
        ("alias", "production"),
        ("alias", "candidate-2"),
        ("tag", "release:2026.12"),
    ],
)
def test_ordinary_names_pass(kind: names.Kind, value: str) -> None:
    assert names.check(kind, value) == value


def test_aliases_are_lower_case_and_start_with_a_letter() -> None:
    assert not names.is_valid("alias", "Production")
    assert not names.is_valid("alias", "1st")
    assert not names.is_valid("alias", "a" * 64)


def test_both_path_names_are_named_at_once_as_the_path_parameters() -> None:
    with pytest.raises(RequestInvalid) as refused:
        names.check_model("..", "a/b")
    assert [e.field for e in refused.value.errors] == ["team", "name"]
    names.check_model("vision", "digits")


def test_artifact_keys_stay_under_the_registry_prefix() -> None:
    key = names.artifact_key("vision", "digits", "0" * 8 + "-0000-0000-0000-" + "0" * 12, "w.pt")
    assert key.startswith(names.REGISTRY_PREFIX) and validate_key(key) == key
    with pytest.raises(RequestInvalid):
        names.artifact_key("..", "digits", "0" * 36, "w.pt")
    with pytest.raises(ValueError, match="not a UUID"):
        names.artifact_key("vision", "digits", "../../x", "w.pt")
    with pytest.raises(ValueError, match="plain name"):
        names.artifact_key("vision", "digits", "0" * 36, "../w.pt")
