"""``python -m services.scheduler``: run the scheduler until SIGTERM."""

from __future__ import annotations

import sys

from services.scheduler.config import Settings
from services.scheduler.service import serve
from shared.runtime import serve_from_command_line


def main(argv: list[str] | None = None) -> int:
    return serve_from_command_line("scheduler", "places queued jobs on GPUs", Settings, serve, argv)


if __name__ == "__main__":
    sys.exit(main())
