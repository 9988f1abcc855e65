"""Explanations rewritten for the reading team (``reasons``): a pass rewrites what precedes
a reason's last "; " and what follows it apart (and caches each), which is only right if
that gives the same text as rewriting the whole reason. Checked here over random reasons
built from job ids, team names, separators and the words of estimates."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from trainyard_platform.services.scheduler.policy.reasons import _as_seen_by

TEAM_OF = {"j1": "team-a", "j2": "team-b", "job": "team-b", "expected": "team-c", "3.5": "team-b"}
WORDS = st.sampled_from(
    ["j1", "j2", "job", "job j2", "expected", "start", "in", "~3.5", "3.5", "h", "qa", ",", ";"]
)


@settings(max_examples=300, derandomize=True, database=None)
@given(
    st.lists(WORDS, max_size=8),
    st.lists(WORDS, max_size=6),
    st.sampled_from([None, "team-a", "team-b"]),
)
def test_rewriting_around_the_last_separator_equals_rewriting_the_whole(
    head: list[str], tail: list[str], team: str | None
) -> None:
    a, b = " ".join(head), " ".join(tail)
    whole = _as_seen_by(f"{a}; {b}", "j1, j2", team, TEAM_OF)
    first, blocking = _as_seen_by(a, "j1, j2", team, TEAM_OF)
    rest = _as_seen_by(b, "", team, TEAM_OF)[0]
    assert whole == (f"{first}; {rest}", blocking)
