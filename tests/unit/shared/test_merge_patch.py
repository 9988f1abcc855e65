"""``merge_patch`` against the examples of RFC 7396, appendix A, and its promises: the
target and the patch are left as they were."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from trainyard_platform.shared.merge_patch import merge_patch

RFC_7396_APPENDIX_A: list[tuple[Any, Any, Any]] = [
    ({"a": "b"}, {"a": "c"}, {"a": "c"}),
    ({"a": "b"}, {"b": "c"}, {"a": "b", "b": "c"}),
    ({"a": "b"}, {"a": None}, {}),
    ({"a": "b", "b": "c"}, {"a": None}, {"b": "c"}),
    ({"a": ["b"]}, {"a": "c"}, {"a": "c"}),
    ({"a": "c"}, {"a": ["b"]}, {"a": ["b"]}),
    ({"a": {"b": "c"}}, {"a": {"b": "d", "c": None}}, {"a": {"b": "d"}}),
    ({"a": [{"b": "c"}]}, {"a": [1]}, {"a": [1]}),
    (["a", "b"], ["c", "d"], ["c", "d"]),
    ({"a": "b"}, ["c"], ["c"]),
    ({"a": "foo"}, None, None),
    ({"a": "foo"}, "bar", "bar"),
    ({"e": None}, {"a": 1}, {"e": None, "a": 1}),
    ([1, 2], {"a": "b", "c": None}, {"a": "b"}),
    ({}, {"a": {"bb": {"ccc": None}}}, {"a": {"bb": {}}}),
]


@pytest.mark.parametrize(("target", "patch", "result"), RFC_7396_APPENDIX_A)
def test_the_examples_of_rfc_7396(target: Any, patch: Any, result: Any) -> None:
    assert merge_patch(target, patch) == result


def test_neither_the_target_nor_the_patch_is_changed() -> None:
    target = {"quotas": {"a100": {"nominal": 8, "borrowing_limit": 4}}, "weight": 2}
    patch = {"quotas": {"a100": {"borrowing_limit": None}, "h100": {"nominal": 1}}}
    before = copy.deepcopy((target, patch))
    merged = merge_patch(target, patch)
    assert merged == {"quotas": {"a100": {"nominal": 8}, "h100": {"nominal": 1}}, "weight": 2}
    assert (target, patch) == before
