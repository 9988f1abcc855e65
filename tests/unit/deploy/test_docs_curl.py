"""Every ``curl`` in the docs that sends a body sends it as JSON.

The services' JSON endpoints answer 415 to a body without ``Content-Type: application/json``
(``shared.http_errors.read_json_body``), and ``curl -d`` says
``application/x-www-form-urlencoded``: an example without the header fails as written.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
DOCS = sorted([*(ROOT / "docs").glob("*.md"), ROOT / "README.md", ROOT / "deploy" / "README.md"])
_FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.MULTILINE | re.DOTALL)
_BODY = re.compile(r"(?:^|\s)(?:-d|--data|--data-raw|--data-binary)(?:\s|=)")
_JSON_TYPE = "Content-Type: application/json"
_MERGE_PATCH_TYPE = "Content-Type: application/merge-patch+json"
"""JSON too: the media type of a JSON Merge Patch, which the scheduler's PATCH routes read."""


def _commands(text: str) -> Iterator[str]:
    """Each shell command of the fenced blocks, continuation lines joined, a quoted body
    spanning lines kept whole."""
    for match in _FENCE.finditer(text):
        if match.group(1) not in ("", "sh", "bash", "shell"):
            continue
        command = ""
        for line in match.group(2).splitlines():
            command += line + "\n"
            if line.rstrip().endswith("\\") or command.count("'") % 2 == 1:
                continue
            yield command
            command = ""
        if command:
            yield command


def _json_variables(text: str) -> set[str]:
    """Shell variables a doc sets to the JSON content type (``JSON="Content-Type: ..."``)."""
    found = re.findall(r"^\s*(?:export\s+)?(\w+)=[\"']" + re.escape(_JSON_TYPE), text, re.MULTILINE)
    return set(found)


def _curls_with_a_body() -> list[tuple[str, str, set[str]]]:
    cases = []
    for doc in DOCS:
        text = doc.read_text()
        variables = _json_variables(text)
        for command in _commands(text):
            if re.search(r"\bcurl\b", command) and _BODY.search(command):
                cases.append((doc.relative_to(ROOT).as_posix(), command, variables))
    return cases


CASES = _curls_with_a_body()


def test_the_docs_have_curl_examples_with_a_body() -> None:
    assert len(CASES) >= 8


@pytest.mark.parametrize(
    ("doc", "command", "variables"), CASES, ids=[f"{d}:{c[:50]}" for d, c, _ in CASES]
)
def test_a_curl_with_a_body_says_it_is_json(doc: str, command: str, variables: set[str]) -> None:
    sends_json = (
        _JSON_TYPE in command
        or ("-X PATCH" in command and _MERGE_PATCH_TYPE in command)
        or any(f'"${name}"' in command for name in variables)
    )
    assert sends_json, f"{doc}: this curl sends a body without {_JSON_TYPE} (415):\n{command}"
