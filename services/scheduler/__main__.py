"""``python -m trainyard_platform.services.scheduler``: run the scheduler until SIGTERM."""

from __future__ import annotations

import sys

from trainyard_platform.shared.otel_import_check import refuse_before_import

# Before the imports below, which import the OpenTelemetry SDK: it reads one variable
# when it is imported, and a bad one would end the process with a traceback.
if __name__ == "__main__":
    refuse_before_import("scheduler")

from trainyard_platform.services.scheduler.config import Settings
from trainyard_platform.services.scheduler.service import serve
from trainyard_platform.shared.runtime import serve_from_command_line


def main(argv: list[str] | None = None) -> int:
    return serve_from_command_line("scheduler", "places queued jobs on GPUs", Settings, serve, argv)


if __name__ == "__main__":
    sys.exit(main())
