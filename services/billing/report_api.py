"""What billing's read routes share: the query parameters of its reports (``GET /v1/costs``,
``GET /v1/waste``), the refusal of unknown or repeated parameters, JSON or CSV, and which
team a caller reads.

One definition each, so the two reports take the same parameters with the same limits and
descriptions (their OpenAPI entries read alike), and every billing route answers a caller
asking for another team's figures the same way: 404, as for another team's job.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Annotated, Any, Literal

from litestar import Request, Response
from litestar.di import NamedDependency
from litestar.exceptions import NotFoundException
from litestar.openapi.spec import (
    OpenAPIHeader,
    OpenAPIMediaType,
    OpenAPIResponse,
    OpenAPIType,
    Operation,
    Schema,
)
from litestar.params import QueryParameter

from trainyard_platform.services.billing.costs import Dimension
from trainyard_platform.shared.http_errors import FieldError, RequestInvalid
from trainyard_platform.shared.identity import Principal

Caller = NamedDependency[Principal]
Clock = Callable[[], datetime]

MAX_ROWS = 100_000
"""The most rows a report answers (``limit``'s bound)."""

Name = Annotated[str | None, QueryParameter(min_length=1, max_length=200)]
"""A filter on one dimension (team, project, user, queue, flavor, job)."""
GroupBy = Annotated[
    str | None,
    QueryParameter(
        max_length=100, description="comma-separated: team, project, user, queue, flavor, job"
    ),
]
From = Annotated[
    str | None,
    QueryParameter(
        name="from",
        format="date-time",
        max_length=40,
        description="ISO 8601, a whole UTC hour, or a month (2026-12); default: the current month's start",
    ),
]
To = Annotated[
    str | None,
    QueryParameter(
        name="to",
        format="date-time",
        max_length=40,
        description="ISO 8601, a whole UTC hour, or a month (2026-12); default: the end of from's month (in its offset)",
    ),
]
Format = Annotated[Literal["json", "csv"] | None, QueryParameter(description="default: by Accept")]
Rows = Annotated[int, QueryParameter(ge=1, le=MAX_ROWS)]

REPORT_PARAMETERS = frozenset(
    {"group_by", "from", "to", "team", "project", "user", "queue", "flavor", "job"}
    | {"format", "limit"}
)
"""The query parameters every report takes (``GET /v1/costs`` also ``granularity``)."""


def utc_now() -> datetime:
    return datetime.now(UTC)


def check_parameters(request: Request[Any, Any, Any], known: frozenset[str]) -> None:
    """422 naming every query parameter not in ``known`` or given more than once."""
    errors = []
    for name in sorted(set(request.query_params.keys())):
        if name not in known:
            listed = f" ({', '.join(sorted(known))})" if known else " (this takes none)"
            errors.append(FieldError(field=name, message=f"unknown query parameter{listed}"))
        elif len(request.query_params.getall(name)) > 1:
            errors.append(FieldError(field=name, message="given more than once"))
    if errors:
        raise RequestInvalid(errors)


def team_to_read(principal: Principal, team: str | None, what: str) -> str | None:
    """The team whose ``what`` (e.g. "costs") ``principal`` reads when asking for ``team``:
    an operator any team, or every team (None); anyone else their own team (the default),
    and asking for another answers 404, as another team's job does."""
    if principal.is_operator:
        return team
    team = team or principal.team
    if team is None or not principal.may_see_team(team):
        # Said as for a team that does not exist (nothing of another team shows), with the
        # one team the caller does read, so a misspelt name shows and what to ask instead.
        own = f": you read your own team's, {principal.team}'s" if principal.team else ""
        raise NotFoundException(f"no {what} of team {team!r} for you to read{own}")
    return team


def dimension_filters(
    team: str | None,
    project: str | None,
    user: str | None,
    queue: str | None,
    flavor: str | None,
    job: str | None,
) -> dict[Dimension, str | None]:
    """A report's filters, by dimension (None: not filtered on it)."""
    return {
        "team": team,
        "project": project,
        "user": user,
        "queue": queue,
        "flavor": flavor,
        "job": job,
    }


def wants_csv(request: Request[Any, Any, Any], fmt: str | None) -> bool:
    """Whether to answer CSV: ``format`` when given, else the ``Accept`` header."""
    if fmt is not None:
        return fmt == "csv"
    accept = request.headers.get("accept", "")
    return "text/csv" in accept and "application/json" not in accept


TRUNCATED = "Trainyard-Truncated"
"""The header of a CSV report saying whether rows past ``limit`` were left out (``true``)
or not (``false``): the JSON's ``truncated``, which the CSV, rows only, cannot hold."""


def csv_answer(text: str, truncated: bool) -> Response[str]:
    """A report's CSV, saying in ``TRUNCATED`` whether rows were left out of it."""
    return Response(
        text, media_type="text/csv", headers={TRUNCATED: "true" if truncated else "false"}
    )


@dataclass
class JsonOrCsvOperation(Operation):
    """A report's operation: its 200 answer is JSON or, when asked for, ``text/csv``
    (with ``TRUNCATED``)."""

    def __post_init__(self) -> None:
        ok = (self.responses or {}).get("200")
        if isinstance(ok, OpenAPIResponse) and ok.content is not None:
            ok.content["text/csv"] = OpenAPIMediaType(
                schema=Schema(
                    type=OpenAPIType.STRING,
                    description="a header row, then one row per report row (docs/billing.md)",
                )
            )
            ok.headers = {
                **(ok.headers or {}),
                TRUNCATED: OpenAPIHeader(
                    schema=Schema(type=OpenAPIType.STRING, enum=["true", "false"]),
                    description="of a CSV answer: whether rows past limit were left out",
                ),
            }
