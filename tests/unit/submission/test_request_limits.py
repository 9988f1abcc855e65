"""Request limits: the JSON screen, and the worst case of what a job spec puts on the bus."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import pytest

from trainyard_platform.services.submission.api import _JOB_FREE_TEXT, JSON_BODY_MAX_BYTES
from trainyard_platform.services.submission.schemas import parse_job_request
from trainyard_platform.shared.events import Envelope
from trainyard_platform.shared.events.payloads import JobSubmitted
from trainyard_platform.shared.http_errors import MAX_JSON_DEPTH, RequestInvalid, check_json
from trainyard_platform.shared.outbox import DEFAULT_MAX_PAYLOAD

FLAVORS = ["cpu", "h200"]
BASE: dict[str, Any] = {"name": "n", "entrypoint": "m", "gpus": 1, "gpu_flavor": "cpu"}


def _errors(body: bytes, free_text: bool = False) -> list[tuple[str, str]]:
    with pytest.raises(RequestInvalid) as caught:
        check_json(body, free_text=_JOB_FREE_TEXT.fullmatch if free_text else lambda _: False)
    return [(e.field, e.message) for e in caught.value.errors]


def test_a_clean_body_passes_and_is_parsed() -> None:
    assert check_json(b'{"a": [1, 2.5, "x", true, null]}') == {"a": [1, 2.5, "x", True, None]}


def test_every_problem_is_named_by_its_field() -> None:
    body = (
        b'{"name": "a\\u0000", "args": ["ok", "\\u001b"], "h": {"k": 1, "k": 2},'
        b' "n": 1e400, "i": -9223372036854775809, "x\\u0007": 1}'
    )
    fields = sorted(field for field, _ in _errors(body))
    assert fields == sorted(["name", "args[1]", "h.k", "n", "i", "x\\u0007"])


def test_tab_newline_and_cr_only_in_free_text() -> None:
    ok = {**BASE, "args": ["a\tb\r\n"], "hyperparameters": {"p": "x\ny"}}
    check_json(json.dumps(ok).encode(), free_text=lambda p: bool(_JOB_FREE_TEXT.fullmatch(p)))
    assert [f for f, _ in _errors(json.dumps({**BASE, "name": "a\tb"}).encode(), True)] == ["name"]
    key = json.dumps({**BASE, "hyperparameters": {"a\tb": 1}}).encode()
    assert [f for f, _ in _errors(key, True)] == ["hyperparameters.a\\u0009b"]


def test_nesting_is_bounded() -> None:
    deep = b"[" * (MAX_JSON_DEPTH + 1) + b"]" * (MAX_JSON_DEPTH + 1)
    check_json(b"[" * MAX_JSON_DEPTH + b"]" * MAX_JSON_DEPTH)
    assert _errors(deep)[0][1].startswith("nested too deeply")
    assert _errors(b"[" * 50_000 + b"]" * 50_000) == [
        ("body", f"nested too deeply (at most {MAX_JSON_DEPTH} levels)")
    ]


@pytest.mark.parametrize(
    "body",
    [b"\xff", b"", b"{", b"NaN", b"Infinity", b'{"a": -Infinity}', b"1" * 5000, b'"\\ud800"'],
)
def test_garbage_is_refused_not_raised(body: bytes) -> None:
    assert _errors(body)


def _largest(fill: Any) -> bytes:
    """The spec ``fill(n)`` for the largest ``n`` whose body fits ``JSON_BODY_MAX_BYTES``."""
    low, high = 0, JSON_BODY_MAX_BYTES
    while low < high:
        mid = (low + high + 1) // 2
        body = json.dumps({**BASE, **fill(mid)}, ensure_ascii=False).encode()
        if len(body) <= JSON_BODY_MAX_BYTES:
            low = mid
        else:
            high = mid - 1
    return json.dumps({**BASE, **fill(low)}, ensure_ascii=False).encode()


def _floats(n: int) -> dict[str, Any]:
    # 9e15 is written 9000000000000000.0 on the wire: the most a number grows.
    return {"hyperparameters": {f"{i:x}": 9e15 for i in range(min(n, 1000))}, "args": []}


WORST_CASES = {
    "args of tabs": lambda n: {"args": ["\t" * min(n, 10_000)] * max(1, n // 10_000)},
    "args of quotes": lambda n: {"args": ['"' * min(n, 10_000)] * max(1, n // 10_000)},
    "many empty args": lambda n: {"args": [""] * min(n, 1000)},
    "4-byte characters": lambda n: {"args": ["\U0001f600" * min(n, 10_000)]},
    "long hyperparameter strings": lambda n: {
        "hyperparameters": {f"k{i}": "\\" * min(n, 10_000) for i in range(1 + n // 10_000)}
    },
    "1000 hyperparameters": _floats,
    "command of tabs": lambda n: {
        "entrypoint": None,
        "command": ["python", *["\t" * min(n, 10_000)] * max(1, n // 10_000)],
    },
}


@pytest.mark.parametrize("case", list(WORST_CASES))
def test_the_largest_accepted_spec_is_well_under_the_bus_limit(case: str) -> None:
    """Whatever fits the body limit, its job.submitted event stays under a quarter of the
    bus's 1 MiB message limit (escapes and number formats grow a body, never by 4x)."""
    body = _largest(WORST_CASES[case])
    if case == "1000 hyperparameters":
        body = body.replace(b"9000000000000000.0", b"9e15")
    check_json(body, free_text=lambda p: bool(_JOB_FREE_TEXT.fullmatch(p)))
    spec = parse_job_request(body, FLAVORS).to_spec(user="u" * 100, team="t" * 100)
    event = JobSubmitted(job_id="j" * 36, spec=spec, submitted_at=datetime.now(UTC))
    size = len(Envelope.wrap(event, source="trainyard/submission", subject="j" * 36).to_json())
    assert size < DEFAULT_MAX_PAYLOAD // 4, (case, len(body), size)
    assert size < 3 * JSON_BODY_MAX_BYTES, (case, len(body), size)


@pytest.mark.parametrize("mark", ["\u202e", "\u202a", "\u2066", "\u2069"])
def test_bidirectional_overrides_only_in_free_text(mark: str) -> None:
    """A name with a right-to-left override reads as another name ("Trojan Source"); prose
    in a right-to-left language may use them."""
    body = json.dumps({**BASE, "name": f"train{mark}gpj.exe"}).encode()
    assert _errors(body, True) == [
        ("name", f"must not contain control characters (found U+{ord(mark):04X}; allowed: none)")
    ]
    prose = {**BASE, "hyperparameters": {"note": f"{mark}prose"}}
    check_json(json.dumps(prose).encode(), free_text=lambda p: bool(_JOB_FREE_TEXT.fullmatch(p)))
