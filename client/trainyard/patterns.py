"""What the patterns of a job spec's fields mean, in words, so that an error says what a
value must be rather than quoting a regular expression.

``name: my job`` was refused with ``must match ^[A-Za-z0-9._-]{1,100}$`` by ``trainyard
submit`` and ``String should match pattern '^[A-Za-z0-9._-]{1,100}$'`` by ``POST /v1/jobs``.
Both now say ``must be 1 to 100 letters, digits, '.', '_' or '-'``: the client reads the
words here (``trainyard.spec``), the services' error answers too (``shared.http_errors``).
A pattern without words keeps the old message. Unit tests hold every pattern of the job
spec's JSON Schema and of the registry's request bodies to having words here."""

from __future__ import annotations

_REF_NAME = r"[A-Za-z0-9_-][A-Za-z0-9_.-]{0,99}"
_REF_NAME_WORDS = "names of 1 to 100 letters, digits, '_', '.' or '-', not starting with '.'"

PATTERN_WORDS: dict[str, str] = {
    r"^[A-Za-z0-9._-]{1,100}$": "1 to 100 letters, digits, '.', '_' or '-'",
    r"^[a-z][a-z0-9-]{0,39}$": (
        "a lower-case letter, then at most 39 lower-case letters, digits or '-'"
    ),
    r"^[a-z0-9][a-z0-9-]{0,39}$": (
        "a lower-case letter or a digit, then at most 39 lower-case letters, digits or '-'"
    ),
    r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$": (
        "1 to 63 lower-case letters, digits or '-', starting and ending with a letter or a digit"
    ),
    r"^[A-Za-z0-9._ -]{1,100}$": "1 to 100 letters, digits, spaces, '.', '_' or '-'",
    r"^[\x20-\x7e]*$": "printable ASCII (no control characters or non-ASCII letters)",
    r"^[A-Za-z][A-Za-z0-9+.-]{0,31}:[^\s\x00-\x1f\x7f]+$": (
        "a URI on one line: its scheme (a letter, then at most 31 letters, digits, '+', '.' "
        "or '-'), ':', then the rest without spaces or control characters (s3://bucket/key, "
        "https://host/path, file:///path)"
    ),
    r"^[0-9a-f]{64}$": "a sha256: 64 lower-case hexadecimal digits",
    r"^[0-9a-f]{40}$": "a whole commit id: 40 lower-case hexadecimal digits",
    r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$": (
        "an id of 32 lower-case hexadecimal digits in groups of 8-4-4-4-12 joined by '-' (a UUID)"
    ),
    rf"^{_REF_NAME}/{_REF_NAME}(?::[1-9][0-9]{{0,8}})?$": (
        f"TEAM/NAME or TEAM/NAME:VERSION ({_REF_NAME_WORDS}; a version from 1 to 999999999)"
    ),
    rf"^{_REF_NAME}/{_REF_NAME}(?::[1-9][0-9]{{0,8}}|@[a-z][a-z0-9_-]{{0,62}})$": (
        f"TEAM/NAME:VERSION or TEAM/NAME@ALIAS ({_REF_NAME_WORDS}; a version from 1 to "
        "999999999; an alias a lower-case letter, then at most 62 lower-case letters, digits, "
        "'_' or '-')"
    ),
}


def pattern_message(pattern: str) -> str | None:
    """``must be <words>`` for a value that does not match ``pattern``, or None when the
    pattern has no words here."""
    words = PATTERN_WORDS.get(pattern)
    return None if words is None else f"must be {words}"
