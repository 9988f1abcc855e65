"""Did you mean ...? The closest known name to a misspelt one, for error messages.

Contract: ``closest`` returns a candidate only when it is plausibly what was meant, by the
first of these rules that picks exactly one candidate (names compared after camelCase,
``-`` and case are made ``_`` and lower case):

1. the same name (``maxRestarts``, ``max-restarts`` -> ``max_restarts``);
2. the words of one are all among the other's, the most letters shared winning
   (``cpus`` -> ``cpus_per_gpu``, ``num_gpus`` -> ``gpus``, ``experiment_name`` ->
   ``experiment`` rather than ``name``);
3. a typo: at most one edit (insertion, deletion, substitution, swap of neighbours) per four
   characters, at least one (``hyperparamters``, ``gpu``, ``label``);
4. an abbreviation: the name's letters in order in the candidate, with its first letter
   (``hparams`` -> ``hyperparameters``), for names of four letters or more.

A rule that fits several candidates equally picks none; None when no rule picks one
(``model``: ``parent_model`` or ``register_model``), or when there is no candidate at all: a
wrong guess (``cpus`` -> ``gpus``) sends a person the wrong way. Pure
standard library: the client and the services use the same words.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping

_CAMEL = re.compile(r"(?<=[a-z0-9])(?=[A-Z])")
MAX_GUESSED = 64
"""No name longer than this is guessed at, nor shown whole in a message: no field is that
long, and comparing a key of a request's size with every field cost seconds."""


def _plain(name: str) -> str:
    return _CAMEL.sub("_", name).lower().replace("-", "_")


def _edits(a: str, b: str) -> int:
    """Optimal string alignment distance: edits, a swap of neighbours counting one."""
    rows = [list(range(len(b) + 1))]
    for i in range(1, len(a) + 1):
        row = [i] + [0] * len(b)
        for j in range(1, len(b) + 1):
            row[j] = min(rows[-1][j] + 1, row[j - 1] + 1, rows[-1][j - 1] + (a[i - 1] != b[j - 1]))
            if i > 1 and j > 1 and a[i - 1] == b[j - 2] and a[i - 2] == b[j - 1]:
                row[j] = min(row[j], rows[-2][j - 2] + 1)
        rows.append(row)
    return rows[-1][-1]


def _close_in_spelling(name: str, candidate: str) -> bool:
    """At most a quarter of ``name``'s letters (at least one) edited; lengths further apart
    than that are not, without aligning them (an alignment costs both lengths' product)."""
    most = max(1, len(name) // 4)
    return abs(len(name) - len(candidate)) <= most and _edits(name, candidate) <= most


def _words(name: str) -> set[str]:
    return {w for w in name.split("_") if w}


def _abbreviates(name: str, candidate: str) -> bool:
    letters = iter(candidate)
    return len(name) >= 4 and name[0] == candidate[0] and all(c in letters for c in name)


def _shared_words(name: str, candidate: str) -> int:
    """Letters in the words the two share when one's words are all among the other's."""
    mine, theirs = _words(name), _words(candidate)
    return sum(map(len, mine & theirs)) if mine <= theirs or theirs <= mine else 0


def closest(name: str, candidates: Iterable[str]) -> str | None:
    """The candidate ``name`` most likely stands for, or None (see the module)."""
    plain = {_plain(c): c for c in sorted(set(candidates))}
    wanted = _plain(name)
    if not wanted or not plain or len(wanted) > MAX_GUESSED:
        return None
    if wanted in plain:
        return plain[wanted]
    rules: list[Callable[[str], int]] = [
        lambda c: _shared_words(wanted, c),
        lambda c: int(_close_in_spelling(wanted, c)),
        lambda c: int(_abbreviates(wanted, c)),
    ]
    for score in rules:
        scores = {c: score(c) for c in plain}
        best = max(scores.values())  # (``plain`` is not empty: checked above)
        found = [c for c, n in scores.items() if n == best]
        if best and len(found) == 1:
            return plain[found[0]]
    return None


NOT_JOB_FIELDS: dict[str, str] = {
    **dict.fromkeys(
        ("env", "environment", "env_vars", "environment_variables", "envs"),
        "a job gets no environment variables of yours: give values as hyperparameters (the "
        "job reads TRAINYARD_HYPERPARAMETERS, or ctx.hyperparameters), never credentials",
    ),
    "queue": "a job goes to its team's queue, which operators define; a spec does not pick it",
    "timeout": "the time limit is max_runtime_seconds",
    **dict.fromkeys(
        ("nodes", "num_nodes"),
        "the scheduler chooses the nodes: a job asks for gpus, and gets several nodes (a "
        "gang) when one has too few",
    ),
}
"""Fields people expect in a job spec that it has not, each with what to do instead (keys
as ``_plain`` makes names: lower case, ``_``)."""


def unknown_field(
    name: str, candidates: Iterable[str], absent: Mapping[str, str] | None = None
) -> str:
    """``unknown field 'hyperparameter': did you mean 'hyperparameters'?``; with no close
    name, what ``absent`` says of it (``NOT_JOB_FIELDS`` for a job spec), if anything."""
    guess = closest(name, candidates)
    shown = repr(name if len(name) <= MAX_GUESSED else name[:MAX_GUESSED] + "…")
    if guess:
        return f"unknown field {shown}: did you mean {guess!r}?"
    instead = (absent or {}).get(_plain(name))
    return f"unknown field {shown}" + (f": {instead}" if instead else "")
