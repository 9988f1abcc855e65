"""The names a caller gives the model API, held to strict patterns before anything uses them.

Contract:
- A team or model name is 1 to 100 letters, digits, ``_``, ``.`` or ``-``, not starting with
  ``.`` (so never ``.`` or ``..``) — the job-name rule of submission, minus leading dots.
- An alias is 1 to 63 lower-case letters, digits, ``_`` or ``-``, starting with a letter
  (``production``, ``candidate``).
- A tag is 1 to 64 letters, digits, ``_``, ``.``, ``:`` or ``-``, starting with a letter or
  digit (the rule of run tags, ``tracking_query.check_tag``).
- ``check`` raises ``RequestInvalid`` (422) naming the field and the rule. Nothing here
  can contain ``/``, ``\\``, ``%``, a NUL or another control character, so a checked name
  joined into an object key (``artifact_key``) cannot leave the registry's prefix; the key
  is validated again by the store (``shared.storage.validate_key``).
"""

from __future__ import annotations

import re
from typing import Final, Literal

from trainyard_platform.shared import paging
from trainyard_platform.shared.http_errors import FieldError, RequestInvalid

Kind = Literal["team", "model", "alias", "tag"]

_NAME = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9_.-]{0,99}")
_RULES: Final[dict[Kind, tuple[re.Pattern[str], str]]] = {
    "team": (_NAME, "must be 1 to 100 letters, digits, '_', '.' or '-', not starting with '.'"),
    "model": (_NAME, "must be 1 to 100 letters, digits, '_', '.' or '-', not starting with '.'"),
    "alias": (
        re.compile(r"[a-z][a-z0-9_-]{0,62}"),
        "must be 1 to 63 lower-case letters, digits, '_' or '-', starting with a letter",
    ),
    "tag": (
        re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:-]{0,63}"),
        "must be 1 to 64 letters, digits, '_', '.', ':' or '-', starting with a letter or digit",
    ),
}


def is_valid(kind: Kind, value: str) -> bool:
    pattern, _ = _RULES[kind]
    return pattern.fullmatch(value) is not None


def check(kind: Kind, value: str, field: str | None = None) -> str:
    """``value`` if it is a valid ``kind`` name, else ``RequestInvalid`` naming ``field``
    (default: the kind)."""
    pattern, rule = _RULES[kind]
    if pattern.fullmatch(value) is None:
        raise RequestInvalid.one(field or kind, rule)
    return value


def by_name(route: str) -> paging.Cursor:
    """The cursor of ``route``, a list of models or datasets by team and name: the
    platform's cursor (``shared.paging``) of ``(team, name)``, whose parts must be valid
    names; anything else is paging's 422 naming ``after``."""
    return paging.Cursor(route, _name_part("team"), _name_part("model"))


def _name_part(kind: Kind) -> paging.Parser:
    def parse(part: object) -> str:
        if not isinstance(part, str) or not is_valid(kind, part):
            raise ValueError(f"not a {kind} name")
        return part

    return parse


def check_model(team: str, model: str) -> None:
    """Both path names of a model, every bad one named at once (as ``team`` and ``name``)."""
    # Named as the path parameters are: {team} and {name}.
    given: list[tuple[Kind, str, str]] = [("team", team, "team"), ("model", model, "name")]
    errors = [
        FieldError(field=field, message=_RULES[kind][1])
        for kind, value, field in given
        if not is_valid(kind, value)
    ]
    if errors:
        raise RequestInvalid(errors)


def artifact_key(team: str, model: str, version_id: str, filename: str) -> str:
    """The registry-owned key of a version's artifact: ``registry/<team>/<model>/<id>/<file>``
    (names checked here too: a key is never built from an unchecked name)."""
    check("team", team)
    check("model", model)
    if not re.fullmatch(r"[0-9a-f-]{36}", version_id):
        raise ValueError(f"version id {version_id!r} is not a UUID")
    if not _NAME.fullmatch(filename):
        raise ValueError(f"artifact file name {filename!r} is not a plain name")
    return f"registry/{team}/{model}/{version_id}/{filename}"


REGISTRY_PREFIX: Final = "registry/"
"""Every object the registry owns lives under this prefix of the store."""
