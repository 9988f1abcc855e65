"""``grants.reader_of``: the one rule of whose rights a registry read applies — the caller's
team, or none for an operator, who reads every team's. The dataset routes, the model
routes and the lineage routes each had their own copy of it."""

from __future__ import annotations

from pathlib import Path

from trainyard_platform.services.registry import grants
from trainyard_platform.shared.identity import Principal, Role

REGISTRY = Path(grants.__file__).parent


def test_a_user_reads_with_the_rights_of_the_team_an_operator_with_none() -> None:
    user = Principal(user="ann", team="vision", role=Role.VIEWER, token_id=1)
    operator = Principal(user="ops", team=None, role=Role.OPERATOR, token_id=2)
    assert grants.reader_of(user) == "vision"
    assert grants.reader_of(operator) is None


def test_no_registry_module_has_a_copy_of_the_rule() -> None:
    copies = [
        f"{path.name}:{n}"
        for path in sorted(REGISTRY.glob("*.py"))
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if "is_operator else" in line and path.name != "grants.py"
    ]
    assert copies == []
