"""References a job spec makes to registered things: ``team/name``, ``team/name:version`` and
(models only) ``team/name@alias`` (docs/job-spec.md).

Contract: ``parse`` returns a ``Reference`` whose names pass ``names`` (so none can leave the
registry's prefix) or raises ``ValueError``; submission refused anything else at admission, so
a bad reference here is a spec that bypassed it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from trainyard_platform.services.registry import names

_REFERENCE = re.compile(r"([^/]+)/([^/:@]+)(?::([1-9][0-9]{0,8})|@([^/:@]+))?")


@dataclass(frozen=True)
class Reference:
    team: str
    name: str
    version: int | None = None
    alias: str | None = None

    def __str__(self) -> str:
        tail = f":{self.version}" if self.version else f"@{self.alias}" if self.alias else ""
        return f"{self.team}/{self.name}{tail}"


def parse(text: str, *, alias_allowed: bool) -> Reference:
    found = _REFERENCE.fullmatch(text)
    if found is None:
        raise ValueError(f"{text!r} is not team/name[:version]")
    team, name, version, alias = found.groups()
    if alias is not None and not alias_allowed:
        raise ValueError(f"{text!r}: only a model reference may name an alias")
    if not (names.is_valid("team", team) and names.is_valid("model", name)):
        raise ValueError(f"{text!r}: not valid names (names.py)")
    if alias is not None and not names.is_valid("alias", alias):
        raise ValueError(f"{text!r}: not a valid alias")
    return Reference(team, name, int(version) if version else None, alias)
