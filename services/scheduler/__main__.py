"""``python -m services.scheduler``: run the scheduler until SIGTERM."""

from __future__ import annotations

import argparse
import asyncio
import sys

from services.scheduler.config import Settings
from services.scheduler.service import serve


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m services.scheduler",
        description="Trainyard scheduler: places queued jobs on GPUs "
        "(settings come from TRAINYARD_SCHEDULER_* and the shared TRAINYARD_* variables).",
    )
    parser.add_argument("--host", help="listen address (overrides TRAINYARD_SCHEDULER_HOST)")
    parser.add_argument("--port", type=int, help="listen port (overrides TRAINYARD_SCHEDULER_PORT)")
    args = parser.parse_args(argv)
    overrides = {k: v for k, v in (("host", args.host), ("port", args.port)) if v is not None}
    settings = Settings(**overrides)
    return asyncio.run(serve(settings))


if __name__ == "__main__":
    sys.exit(main())
