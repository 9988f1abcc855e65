"""The ``trainyard`` command's entry point: ``trainyard.cli.main``, with Ctrl-C caught from
the first moment.

Importing the command line (httpx, pydantic, jsonschema, every command's module) takes about
half a second, and a Ctrl-C in that time was a ``KeyboardInterrupt`` raised in the import,
before ``trainyard.cli.main`` could catch anything: the user got a page of traceback. This
module imports nothing but the standard library's ``sys`` before it catches it, so a Ctrl-C
at any moment is ``interrupted`` and exit 130, as ``main`` answers it once it runs."""

from __future__ import annotations

import sys

INTERRUPTED = 130
"""``trainyard.cli_base.Exit.INTERRUPTED``, which this module must not import to know."""


def main() -> int:
    try:
        from trainyard.cli import main as run

        return run()
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return INTERRUPTED


if __name__ == "__main__":
    sys.exit(main())
