"""``python -m trainyard_platform.services.submission`` serves the API; ``... bootstrap-admin`` seeds a team.

``bootstrap-admin --team TEAM --user NAME [--role operator]`` applies the migrations, creates
the team (if new) and an admin user in it (or a platform operator), and prints only that
user's token on stdout, so that
``TOKEN=$(python -m trainyard_platform.services.submission bootstrap-admin ...)`` works. It refuses, with exit
status 1, when the user already exists: there are no default credentials, and a token is
shown exactly once. With ``--reissue``, an existing enabled user of that role gets a new
token instead (its other tokens stay valid; the audit log records it): the way back in for
whoever holds the database's credentials and lost the token.
"""

from __future__ import annotations

import argparse
import asyncio
import re
import sys

from trainyard_platform.shared.otel_import_check import refuse_before_import

# Before the imports below, which import the OpenTelemetry SDK: it reads one variable
# when it is imported, and a bad one would end the process with a traceback.
if __name__ == "__main__":
    refuse_before_import("submission")

from trainyard_platform.services.submission.config import Settings
from trainyard_platform.services.submission.errors import UserExists
from trainyard_platform.services.submission.schemas import NAME_PATTERN, new_team
from trainyard_platform.services.submission.service import bootstrap_user, serve
from trainyard_platform.shared.db import DATABASE_FAULTS
from trainyard_platform.shared.http_errors import NameTaken
from trainyard_platform.shared.identity import Role
from trainyard_platform.shared.logs import error_text
from trainyard_platform.shared.runtime import run_service, service_settings_or_exit


def _name(value: str) -> str:
    if not re.fullmatch(NAME_PATTERN, value):
        raise argparse.ArgumentTypeError(f"{value!r}: use 1-100 of A-Z a-z 0-9 . _ -")
    return value


def _team(value: str) -> str:
    try:
        return new_team(_name(value))
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"{value!r}: {exc}") from None


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m trainyard_platform.services.submission",
        description="Trainyard submission service (no command: serve the HTTP API).",
    )
    commands = parser.add_subparsers(dest="command")
    boot = commands.add_parser(
        "bootstrap-admin", help="create a team's admin user and print its token"
    )
    boot.add_argument("--team", required=True, type=_team, help="team name (created if new)")
    boot.add_argument("--user", required=True, type=_name, help="the admin's user name")
    boot.add_argument(
        "--role",
        choices=[str(Role.ADMIN), str(Role.OPERATOR)],
        default=str(Role.ADMIN),
        help="admin of the team (default) or platform operator",
    )
    boot.add_argument(
        "--reissue",
        action="store_true",
        help="if the user exists (enabled, same role), print a new token for it instead of "
        "refusing; its other tokens stay valid",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    settings = service_settings_or_exit(parser.prog, Settings)
    if args.command != "bootstrap-admin":
        return run_service(serve(settings))
    try:
        token = asyncio.run(
            bootstrap_user(settings, args.team, args.user, Role(args.role), args.reissue)
        )
    except (UserExists, NameTaken) as exc:
        print(f"bootstrap-admin: {exc}; nothing changed", file=sys.stderr)
        return 1
    except DATABASE_FAULTS as exc:
        # The DSN is not echoed: it may hold a password.
        print(
            f"bootstrap-admin: database (TRAINYARD_DATABASE_URL) failed: {error_text(exc)}",
            file=sys.stderr,
        )
        return 1
    print(token)
    return 0


if __name__ == "__main__":
    sys.exit(main())
