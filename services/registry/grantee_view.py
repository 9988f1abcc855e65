"""What another team sees of a model or dataset granted to it (docs/models.md and
docs/datasets.md, "Grants"; docs/lineage.md): a grant opens the model or the dataset, not
the work of the team that made it.

Contract:
- ``shown(answer, team, reader)`` is ``answer`` (a read answer about ``team``'s model or
  dataset) as ``reader`` (a team; None: an operator) may see it: unchanged for ``team``
  itself and for operators; for any other team (one it was granted to) every field named in
  the ``OWNER_ONLY`` of its schema is null, in nested answers and lists of them too.
- A schema that carries the owner's work — job or allocation ids, the job's spec (its
  project too: a model's is its first job's) and environment, people, checkpoints, grants
  — names those fields in ``OWNER_ONLY`` and declares them nullable; every read route
  passes its answer through ``shown``, so what a grantee sees is decided here and in those declarations, nowhere else.
- A version whose artifact is not the registry's own copy (``owned`` false: registered
  before the registry kept copies) has the owner's checkpoint as its artifact: its ``uri``
  is hidden as well.
- The lineage graph (``lineage.Graph.visible_to``) keeps another team's model or dataset
  version node only when granted, and passes its detail through ``shown_detail``: the keys
  in ``NODE_OWNER_ONLY`` (the job that made it) are null there too.
- ``sees_all(team, reader)`` is the rule itself, for what is not a schema (an error message
  that would name the owner's checkpoint).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final, TypeVar

from pydantic import BaseModel

from trainyard_platform.services.registry.schemas import VersionSummary

Answer = TypeVar("Answer", bound=BaseModel)

NODE_OWNER_ONLY: Final = frozenset({"job_id"})
"""The detail of a version node of the lineage graph that is its owner's work."""


def sees_all(team: str, reader: str | None) -> bool:
    """Whether ``reader`` (None: an operator) sees all of ``team``'s work: its own team and
    operators do; a team something was granted to does not."""
    return reader is None or reader == team


def shown(answer: Answer, team: str, reader: str | None) -> Answer:
    """``answer`` as ``reader`` may see it (module docstring)."""
    if sees_all(team, reader):
        return answer
    return _redacted(answer)


def shown_detail(detail: dict[str, Any], team: str, reader: str | None) -> dict[str, Any]:
    """The detail of a lineage node of ``team`` as ``reader`` may see it (module docstring)."""
    if sees_all(team, reader):
        return detail
    return {key: None if key in NODE_OWNER_ONLY else value for key, value in detail.items()}


def _redacted(answer: Answer) -> Answer:
    hidden: frozenset[str] = getattr(answer, "OWNER_ONLY", frozenset())
    changes: dict[str, Any] = {name: None for name in hidden}
    for name in type(answer).model_fields:
        if name in hidden:
            continue
        value = getattr(answer, name)
        if isinstance(value, BaseModel):
            changes[name] = _redacted(value)
        elif isinstance(value, list) and value and isinstance(value[0], BaseModel):
            changes[name] = [_redacted(v) for v in value]
    if isinstance(answer, VersionSummary) and not answer.owned:
        changes["artifact"] = changes["artifact"].model_copy(update={"uri": None})
    return answer.model_copy(update=changes)


__all__: Sequence[str] = ["NODE_OWNER_ONLY", "sees_all", "shown", "shown_detail"]
