"""What the front door remembers of the tokens that submitted lately, never trusted as such.

``POST /v1/jobs`` used to be two round trips to PostgreSQL: the token check (with the
flavor catalogue and budgets it screens the job against) and the statement that stores the
job. A ``KnownCaller`` is what the last check of a token read. The guard lets a request
through on it without a query (the rate limit is spent by its user id, which a token never
changes; the role is checked as remembered), and the submission's one statement
(``repository.insert_job_if_caller``) checks the token, the caller and the screening again
and stores the job only where every one of them still equals what was remembered. Anything
else (the token revoked, expired or its user disabled, the role or the team's screening
changed, any refusal before the statement) goes back to the full check, whose answer
(401, 403, 409, 422) is the one the caller gets: a remembered caller can only save a round
trip, never admit a job the database would not.

Contract: ``KnownCallers`` holds at most ``max_entries`` callers (the oldest forgotten first)
keyed by token hash; tokens themselves are never kept.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

import asyncpg

from trainyard_platform.services.submission import identity_repository as repo
from trainyard_platform.services.submission.governance import Screening, current_month, screening_of
from trainyard_platform.services.submission.identity import Caller, caller_of


@dataclass(frozen=True)
class KnownCaller:
    """A token's caller and screening as one query read them, with what the submission's
    statement compares: the catalogue's declared and retired flavors (sorted) and the
    team's budgets admission acts on in ``month`` (``governance.Screening``) as the query
    rendered them."""

    token_hash: str
    caller: Caller
    screening: Screening
    month: str
    declared: list[str]
    retired: list[str]
    budgets: str

    def usable(self, month: str, now: datetime) -> bool:
        """Whether a request may start on it: same budget month, token not yet expired (the
        statement checks both again)."""
        expires = self.caller.expires_at
        return self.month == month and (expires is None or expires > now)


class KnownCallers:
    """The last ``KnownCaller`` of each token hash, at most ``max_entries`` of them."""

    def __init__(self, max_entries: int = 10_000) -> None:
        self._max = max_entries
        self._known: OrderedDict[str, KnownCaller] = OrderedDict()

    def get(self, token_hash: str) -> KnownCaller | None:
        return self._known.get(token_hash)

    def remember(self, known: KnownCaller) -> None:
        self._known.pop(known.token_hash, None)
        self._known[known.token_hash] = known
        while len(self._known) > self._max:
            self._known.popitem(last=False)

    def forget(self, token_hash: str) -> None:
        self._known.pop(token_hash, None)

    def __len__(self) -> int:
        return len(self._known)


async def check(
    conn: asyncpg.Connection, token_hash: str, bootstrap: Sequence[str], now: datetime | None = None
) -> KnownCaller | None:
    """The token's caller and its team's screening (``bootstrap``: the flavors configured),
    read in one query as ``identity.authenticate_screened_on`` reads them; None when the
    token is not valid now."""
    month = current_month(now)
    row = await repo.caller_and_screening(conn, token_hash, month)
    if row is None:
        return None
    return KnownCaller(
        token_hash=token_hash,
        caller=caller_of(row),
        screening=screening_of(row, bootstrap, row["team_name"]),
        month=month,
        declared=sorted(row["screen_declared"]),
        retired=sorted(row["screen_retired"]),
        budgets=row["screen_budgets"],
    )


def month_and_now() -> tuple[str, datetime]:
    """``KnownCaller.usable``'s arguments for this instant."""
    now = datetime.now(UTC)
    return current_month(now), now
