"""Did you mean ...? The closest known name to a misspelt one, for error messages.

Contract: ``closest`` returns a candidate only when it is plausibly what was meant: the same
name but for case, ``-``/``_`` and camelCase (``maxRestarts``, ``max-restarts`` ->
``max_restarts``), else the best ``difflib`` match at a similarity of at least 0.6; None
otherwise. Pure standard library: the client and the services use the same words.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable

_CAMEL = re.compile(r"(?<=[a-z0-9])(?=[A-Z])")


def _plain(name: str) -> str:
    return _CAMEL.sub("_", name).lower().replace("-", "_")


def closest(name: str, candidates: Iterable[str]) -> str | None:
    """The candidate ``name`` most likely stands for, or None."""
    known = sorted(set(candidates))
    plain = {_plain(c): c for c in known}
    if _plain(name) in plain:
        return plain[_plain(name)]
    match = difflib.get_close_matches(_plain(name), list(plain), n=1, cutoff=0.6)
    return plain[match[0]] if match else None


def unknown_field(name: str, candidates: Iterable[str]) -> str:
    """``unknown field 'hyperparameter': did you mean 'hyperparameters'?``"""
    guess = closest(name, candidates)
    return f"unknown field {name!r}" + (f": did you mean {guess!r}?" if guess else "")
