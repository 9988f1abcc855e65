"""``python -m services.billing``: run the billing service until SIGTERM."""

from __future__ import annotations

import argparse
import asyncio
import sys

from services.billing.config import Settings
from services.billing.service import serve


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m services.billing",
        description="Trainyard billing: turns ended GPU leases into cost "
        "(settings come from TRAINYARD_BILLING_* and the shared TRAINYARD_* variables).",
    )
    parser.add_argument("--host", help="listen address (overrides TRAINYARD_BILLING_HOST)")
    parser.add_argument("--port", type=int, help="listen port (overrides TRAINYARD_BILLING_PORT)")
    args = parser.parse_args(argv)
    overrides = {k: v for k, v in (("host", args.host), ("port", args.port)) if v is not None}
    settings = Settings(**overrides)
    return asyncio.run(serve(settings))


if __name__ == "__main__":
    sys.exit(main())
