"""docs/job-spec.md's "Errors" example: the file it shows gives exactly the lines it shows.

The section said "Every problem of a file is reported at once" over three lines no one file
gives: a YAML syntax error beside two schema problems (the reading stops at a syntax error,
so nothing else of that file is checked) and lines out of their order. Now the section shows
a file (the first ``yaml`` block) and what ``trainyard submit`` prints for it (the next
block); this test parses the one and compares with the other."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from trainyard.spec import SpecError, parse

DOC = (Path(__file__).resolve().parents[3] / "docs" / "job-spec.md").read_text()


def _blocks(section: str) -> list[tuple[str, str]]:
    return re.findall(r"```(\w*)\n(.*?)```", section, flags=re.S)


def test_the_errors_example_is_what_its_file_gives() -> None:
    section = DOC.split("## Errors", 1)[1].split("\n## ", 1)[0]
    blocks = _blocks(section)
    files = [text for kind, text in blocks if kind == "yaml"]
    outputs = [text for kind, text in blocks if kind == ""]
    assert files and len(outputs) >= len(files)
    for text, shown in zip(files, outputs, strict=False):
        with pytest.raises(SpecError) as caught:
            parse(text, "job.yaml")
        printed = [f"trainyard: error: {line}" for line in str(caught.value).splitlines()]
        assert printed == shown.splitlines()
