"""``python -m trainyard_platform.services.billing``: run the billing service until SIGTERM."""

from __future__ import annotations

import sys

from trainyard_platform.shared.otel_import_check import refuse_before_import

# Before the imports below, which import the OpenTelemetry SDK: it reads one variable
# when it is imported, and a bad one would end the process with a traceback.
if __name__ == "__main__":
    refuse_before_import("billing")

from trainyard_platform.services.billing.config import Settings
from trainyard_platform.services.billing.service import serve
from trainyard_platform.shared.runtime import serve_from_command_line


def main(argv: list[str] | None = None) -> int:
    return serve_from_command_line(
        "billing", "turns ended GPU leases into cost", Settings, serve, argv
    )


if __name__ == "__main__":
    sys.exit(main())
