"""JSON Merge Patch (RFC 7396): change some fields of a JSON document, keep the rest.

A patch that is an object changes the target's members it names: a member whose value is
``null`` is removed (so whatever reads the result applies its default), an object is merged
into the target's member of the same name the same way, any other value replaces it. A patch
that is not an object replaces the target whole. The result is a new document; neither the
target nor the patch is changed.
"""

from __future__ import annotations

from typing import Any


def merge_patch(target: Any, patch: Any) -> Any:
    """``target`` with ``patch`` applied (RFC 7396, section 2)."""
    if not isinstance(patch, dict):
        return patch
    merged = dict(target) if isinstance(target, dict) else {}
    for name, value in patch.items():
        if value is None:
            merged.pop(name, None)
        else:
            merged[name] = merge_patch(merged.get(name), value)
    return merged


__all__ = ["merge_patch"]
