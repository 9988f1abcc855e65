"""Print the published JSON Schema of a job spec file, generated from ``JobRequest``.

    python -m trainyard_platform.services.submission.jobschema > client/trainyard/schemas/job.v1.json

The file is committed (``trainyard schema`` prints it, editors read it) and a test fails when
it no longer matches the models.
"""

from __future__ import annotations

import json
from functools import cache

from trainyard_platform.services.submission.schemas import job_json_schema


@cache
def render() -> str:
    """The schema file's exact text."""
    return json.dumps(job_json_schema(), indent=2, ensure_ascii=False) + "\n"


if __name__ == "__main__":
    print(render(), end="")
