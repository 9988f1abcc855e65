"""``python -m services.registry``: run the registry until SIGTERM."""

from __future__ import annotations

import argparse
import asyncio
import sys

from services.registry.config import Settings
from services.registry.service import serve


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m services.registry",
        description="Trainyard registry: models, versions and lineage "
        "(settings come from TRAINYARD_REGISTRY_* and the shared TRAINYARD_* variables).",
    )
    parser.add_argument("--host", help="listen address (overrides TRAINYARD_REGISTRY_HOST)")
    parser.add_argument("--port", type=int, help="listen port (overrides TRAINYARD_REGISTRY_PORT)")
    args = parser.parse_args(argv)
    overrides = {k: v for k, v in (("host", args.host), ("port", args.port)) if v is not None}
    settings = Settings(**overrides)
    return asyncio.run(serve(settings))


if __name__ == "__main__":
    sys.exit(main())
