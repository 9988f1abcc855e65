"""``python -m trainyard_platform.services.runner``: run this node's agent until SIGTERM."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from trainyard_platform.shared.otel_import_check import refuse_before_import

# Before the imports below, which import the OpenTelemetry SDK: it reads one variable
# when it is imported, and a bad one would end the process with a traceback.
if __name__ == "__main__":
    refuse_before_import("runner")

from trainyard_platform.services.runner.config import Settings
from trainyard_platform.services.runner.service import serve
from trainyard_platform.shared.runtime import run_service, service_settings_or_exit


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m trainyard_platform.services.runner",
        description="Trainyard runner: runs the jobs allocated to this node "
        "(settings come from TRAINYARD_RUNNER_* and the shared TRAINYARD_* variables).",
    )
    parser.add_argument(
        "--virtual-gpus",
        type=int,
        metavar="N",
        help="offer N virtual GPUs (jobs run on CPU) instead of discovering real ones",
    )
    parser.add_argument("--node-id", metavar="ID", help="this node's id (default: host name)")
    parser.add_argument("--gpu-flavor", metavar="F", help="GPU flavor offered (default: cpu)")
    parser.add_argument("--port", type=int, help="HTTP port (default 8082)")
    args = parser.parse_args(argv)
    overrides: dict[str, Any] = {
        key: value
        for key, value in (
            ("virtual_gpus", args.virtual_gpus),
            ("node_id", args.node_id),
            ("gpu_flavor", args.gpu_flavor),
            ("port", args.port),
        )
        if value is not None
    }
    settings = service_settings_or_exit(parser.prog, Settings, **overrides)
    # Another runner's job uids (sandbox.UidsInUse) end it with status 2 and one log line.
    return run_service(serve(settings))


if __name__ == "__main__":
    sys.exit(main())
