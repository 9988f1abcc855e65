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


def test_several_jobs_of_one_other_team_are_counted() -> None:
    # Seen on a local stack: "the rest is held by a nlp job, a nlp job and a nlp job".
    team_of = {"n1": "nlp", "n2": "nlp", "n3": "nlp", "v1": "vision", "m1": "ml"}
    held = "the rest is held by n1, n2 and n3; expected start in ~28 min"
    assert _as_seen_by(held, "n1, n2, n3", "ml", team_of) == (
        "the rest is held by 3 nlp jobs; expected start in ~28 min",
        "nlp",
    )
    mixed = "they are held by v1, n1, m1, n2 and 2 more"
    assert _as_seen_by(mixed, "", "ml", team_of)[0] == (
        "they are held by a vision job, 2 nlp jobs, m1 and 2 more"
    )
    # The reader's own jobs keep their ids; one job of a team stays "a <team> job".
    assert _as_seen_by("held by m1 and n1", "", "ml", team_of)[0] == "held by m1 and a nlp job"
