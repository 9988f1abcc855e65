"""Start a service with its NATS connection routed through its chaos proxy.

``python -m bench._chaos_launch KIND [ARGS...]`` runs ``python -m trainyard_platform.services.KIND [ARGS...]``
after setting ``TRAINYARD_NATS_URL`` from ``CHAOS_NATS_ROUTES`` (``key=url,key=url``; the
key is the service kind, or ``TRAINYARD_RUNNER_NODE_ID`` for a runner), so the chaos suite
can cut one service off NATS (``bench._chaos_proxy``) while the others keep it.
"""

from __future__ import annotations

import os
import runpy
import sys

ROUTES = "CHAOS_NATS_ROUTES"


def routes(text: str) -> dict[str, str]:
    pairs = (item.split("=", 1) for item in text.split(",") if "=" in item)
    return {key: url for key, url in pairs}


def main() -> None:
    kind, rest = sys.argv[1], sys.argv[2:]
    key = os.environ.get("TRAINYARD_RUNNER_NODE_ID", kind) if kind == "runner" else kind
    url = routes(os.environ.get(ROUTES, "")).get(key)
    if url is not None:
        os.environ["TRAINYARD_NATS_URL"] = url
    os.environ.pop(ROUTES, None)
    sys.argv = [f"trainyard_platform.services.{kind}", *rest]
    runpy.run_module(f"trainyard_platform.services.{kind}", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
