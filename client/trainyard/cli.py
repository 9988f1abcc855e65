"""``trainyard``: the command line of the platform.

    trainyard login URL [--token T | --token-stdin] [--name CTX]   store a context (0600)
    trainyard context ls | use CTX | rm CTX                       named contexts
    trainyard submit SPEC [--follow] [--set K=V] [--label K=V]    submit a spec file (YAML/JSON)
    trainyard ls [--status S] [--mine] [--project P] [--after C]  the team's jobs, newest first
    trainyard get JOB... | describe JOB                           a job as a row | in full
    trainyard logs JOB [-f] [--raw]                               its output
    trainyard attach JOB | wait JOB                               follow it | wait for its end
    trainyard cancel JOB... [--if-match ETAG] | rerun JOB         cancel | submit its spec again
    trainyard sweep SPEC --grid K=V1,V2 [--random N] [--metric M]  hyper-parameter search
    trainyard rerun --reproduce JOB [--follow] | reproduction JOB reproduce it | the verdict
    trainyard queue [--all-teams]                                 the team's waiting line, why
    trainyard metrics JOB [KEY] | experiments [EXP] | compare EXP curves, experiments, runs
    trainyard tag JOB TAG... [--rm] | note JOB [TEXT]             tags and notes on runs
    trainyard models NAME                                         a model's versions (older)
    trainyard model ls|show|register|alias|download|rm            models, versions, aliases
    trainyard dataset ls|show|register|grant|revoke               datasets and grants
    trainyard lineage up TEAM/MODEL:V | down TEAM/DATASET:V       lineage as a tree
    trainyard cost [JOB] [--by DIMS] [--from T] [--to T] [--csv]  exact costs (billing)
    trainyard waste [--by DIMS] [--from T] [--to T] [--csv]       waste priced, success rate
    trainyard trace JOB [--file PATH]                             its spans as a tree, timed
    trainyard nodes ls | show | cordon NODE --reason T | uncordon  nodes (operators, scheduler)
    trainyard nodes retire NODE                                   forget a node gone for good
    trainyard admin flavors|cohorts|queues|priority-classes ls|show|set|rm   configuration
    trainyard admin node-inventory ls|show|set|rm NODE            what each node has (ops)
    trainyard admin prices ls | show FLAVOR | set FLAVOR --gpu-hour P  billing's price book
    trainyard budget ls | show TEAM | set TEAM --amount A | rm TEAM   monthly budgets (billing)
    trainyard whoami | tokens | token ... | user ... | audit      who may do what
    trainyard schema | version | completion bash|zsh|tcsh

JOB is a job id or any unique prefix of one (``trainyard ls`` shows 8 characters).

Why argparse: the standard library, so the client installs nothing for its command line;
the command tree, the access and dead-letter modules and their tests were already built on
it; and shell completion comes from ``shtab``, which generates static bash, zsh and tcsh
scripts from the parser (no Python started at each TAB, unlike Click's or argcomplete's
runtime completion). Click with Rich would give coloured help and tables, but would add
three packages to every training environment and rewrite every command for no behaviour a
user needs: tables here are plain aligned text that reads the same in a pipe.

Output: people get text and aligned tables on stdout, progress notes on stderr; ``--json``
prints the API's JSON (one object, or a list) for scripts. Errors are one line each on
stderr, ``trainyard: error: ...``, never a traceback; exit codes are stable and listed in
``trainyard.cli_base``. A reader that goes away (``trainyard ls | head -1``) is not an
error. The server, token and context come from options, then the environment
(``TRAINYARD_URL``, ``TRAINYARD_TOKEN``, ``TRAINYARD_CONTEXT``), then the config file
(``trainyard.cli_config``).
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NoReturn

from pydantic import ValidationError

from trainyard import (
    cli_access,
    cli_admin,
    cli_budgets,
    cli_config,
    cli_data,
    cli_jobs,
    cli_models,
    cli_nodes,
    cli_queue,
    cli_sweep,
    cli_trace,
    cli_tracking,
    cli_waste,
)
from trainyard.bundle import BundleError
from trainyard.cli_base import (
    EXIT_WORDS,
    CliError,
    CliSettings,
    Exit,
    Session,
    add_if_match,
    checked_token,
    checked_url,
    dumps,
    exit_code_of,
    labelled,
    not_configured,
    note,
    pick_context,
    positive_arg,
)
from trainyard.cli_deadletters import add_deadletter_commands, run_deadletters
from trainyard.cli_jobs import LogFollower, status_arg, upload_code
from trainyard.cli_render import none_yet, table
from trainyard.client import TrainyardClient, TrainyardError, client_version
from trainyard.spec import SpecError, schema_text
from trainyard.terminal_text import guarded_terminal

__all__ = ["LogFollower", "main", "upload_code"]

Runner = Callable[[Session], int]


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        print(f"{self.prog}: error: {message} (see {self.prog} --help)", file=sys.stderr)
        sys.exit(Exit.USAGE)

    def parse_known_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        parsed, extras = super().parse_known_args(args, namespace)
        if extras and not hasattr(parsed, _USAGE_OWNER):
            # The innermost command that left them over (its namespace is copied into its
            # parent's): its usage error names the command and its help, where argparse
            # would leave them to the top-level parser's.
            setattr(parsed, _USAGE_OWNER, self)
        return parsed, extras

    def parse_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> argparse.Namespace:
        parsed, extras = self.parse_known_args(args, namespace)
        owner: _Parser = getattr(parsed, _USAGE_OWNER, self)
        if extras:
            owner.error(f"unrecognized arguments: {' '.join(extras)}")
        if hasattr(parsed, _USAGE_OWNER):
            delattr(parsed, _USAGE_OWNER)
        return parsed


_USAGE_OWNER = "_trainyard_usage_owner"


FREE_TEXT = frozenset({"description", "feature_version", "text"})
"""Arguments (by ``dest``) whose value may be empty: a version's description, a dataset's
feature version, a run's note (``''`` clears it)."""


def _given(convert: Callable[[str], Any] | None, action: argparse.Action) -> Callable[[str], Any]:
    """``convert`` (or the string itself), refusing an empty or blank value with a
    ``CliError`` naming the argument (exit 2; argparse lets it through, ``main`` says it)."""
    if action.option_strings:
        name = action.option_strings[-1]
        # A required option cannot be left out: that would be the next usage error.
        hint = "give a value" if action.required else "give a value or leave the option out"
    else:
        name = str(action.metavar or action.dest.upper())
        hint = "give a job id or the beginning of one" if name == "JOB" else "give one"

    def check(value: str) -> Any:
        # A type of the argument's own judges first, with its own message (a --timeout of
        # '' is no number of seconds); what it lets through empty is refused here.
        converted = value if convert is None else convert(value)
        if not value.strip():
            raise CliError(f"{name} is empty: {hint}", Exit.USAGE)
        return converted

    check.__name__ = getattr(convert, "__name__", "value")  # argparse names it in errors
    return check


def _refuse_empty(
    parser: argparse.ArgumentParser, seen: set[argparse.Action] | None = None
) -> None:
    """Every argument of ``parser`` and its subcommands that takes a value refuses an empty
    one, a usage error naming it (exit 2, before any request): an empty name would otherwise
    mean none at all (``ls --experiment ''`` listing every experiment's runs), or reach a
    URL as nothing."""
    seen = set() if seen is None else seen
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in set(action.choices.values()):
                _refuse_empty(sub, seen)
        elif action.nargs != 0 and action.dest not in FREE_TEXT and action not in seen:
            seen.add(action)  # the common options are one action shared by every command
            # Every type here is a function (none is a registry name such as "int").
            action.type = _given(action.type if callable(action.type) else None, action)


def _parser() -> argparse.ArgumentParser:
    common = _Parser(add_help=False)
    # SUPPRESS: an option given before the command is not reset by the command's parser.
    common.add_argument("--url", default=argparse.SUPPRESS, help="API base URL ($TRAINYARD_URL)")
    common.add_argument(
        "--token", default=argparse.SUPPRESS, help="bearer token ($TRAINYARD_TOKEN)"
    )
    common.add_argument(
        "--context", default=argparse.SUPPRESS, help="a context of `trainyard context ls`"
    )
    common.add_argument(
        "--json", action="store_true", default=argparse.SUPPRESS, help="print the API's JSON"
    )
    parser = _Parser(
        prog="trainyard",
        description="Trainyard: training jobs on shared GPUs.",
        epilog="JOB: a job id or a unique prefix of one. Exit codes: "
        + ", ".join(f"{int(code)} {words}" for code, words in EXIT_WORDS.items())
        + ".",
        parents=[common],
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(name: str, run: Runner | None, text: str, **kwargs: Any) -> argparse.ArgumentParser:
        sub: argparse.ArgumentParser = commands.add_parser(
            name, parents=[common], help=text, description=text, **kwargs
        )
        if run is not None:
            sub.set_defaults(run=run)
        return sub

    _login_commands(command, common)
    submit = command("submit", cli_jobs.submit, "submit a job spec file (YAML or JSON)")
    submit.add_argument(
        "file",
        metavar="SPEC",
        type=Path,
        help="job spec (YAML or JSON), e.g. examples/digits.job.yaml; - reads stdin",
    )
    _follow_options(submit)
    submit.add_argument(
        "--idempotency-key",
        type=cli_jobs.idempotency_key_arg,
        metavar="KEY",
        help="submit at most once under this key (1-200 printable ASCII characters)",
    )
    submit.add_argument(
        "--dry-run",
        action="store_true",
        help="have the server check the job as it checks a submission; submit nothing",
    )
    code = submit.add_mutually_exclusive_group()
    code.add_argument(
        "--workdir", type=folder_arg, help="folder to pack as the job's code (default: the spec's)"
    )
    code.add_argument("--no-code", action="store_true", help="submit without a code bundle")
    _override_options(submit)
    sweep = command(
        "sweep", cli_sweep.sweep, "a hyper-parameter search: one job per trial, best first"
    )
    sweep.add_argument(
        "file", metavar="SPEC", type=Path, help="the job spec every trial starts from"
    )
    cli_sweep.add_arguments(sweep)
    sweep.add_argument(
        "--timeout", type=seconds_arg, default=7 * 86_400.0, help="seconds to wait (7 days)"
    )
    sweep_code = sweep.add_mutually_exclusive_group()
    sweep_code.add_argument(
        "--workdir", type=folder_arg, help="folder to pack as the code (default: the spec's)"
    )
    sweep_code.add_argument("--no-code", action="store_true", help="submit without a code bundle")
    _override_options(sweep)
    rerun = command("rerun", cli_jobs.rerun, "submit the spec (and code) of a job again")
    rerun.add_argument("job", metavar="JOB")
    rerun.add_argument(
        "--reproduce",
        action="store_true",
        help="reproduce JOB: its resolved spec, code, dataset versions and seed, linked to it; "
        "the registry judges it when it ends (--follow prints the verdict)",
    )
    rerun.add_argument(
        "--dataset",
        action="append",
        metavar="TEAM/NAME[:V]",
        help="with --reproduce: this dataset version instead of the original's (a deliberate "
        "change; repeat for several)",
    )
    _follow_options(rerun)
    _override_options(rerun)
    verdict = command(
        "reproduction", cli_jobs.reproduction, "the registry's verdict on a reproduction"
    )
    verdict.add_argument("job", metavar="JOB")

    listing = command("ls", cli_jobs.ls, "the team's jobs, newest first", aliases=["list"])
    listing.add_argument(
        "--status",
        type=status_arg,
        help=f"only jobs in this status, any case: {', '.join(s.lower() for s in cli_jobs.JOB_STATUSES)}",
    )
    whose = listing.add_mutually_exclusive_group()
    whose.add_argument("--user", help="only this user's jobs")
    whose.add_argument("--mine", action="store_true", help="only your own jobs")
    listing.add_argument("--project", help="only jobs of this project")
    listing.add_argument("--experiment", help="only runs of this experiment")
    listing.add_argument(
        "--label", type=cli_jobs.key_value, metavar="K=V", help="only jobs with this label"
    )
    listing.add_argument(
        "--limit",
        type=positive_arg,
        default=cli_jobs.LS_LIMIT,
        help=f"at most this many ({cli_jobs.LS_LIMIT})",
    )
    teams = listing.add_mutually_exclusive_group()
    teams.add_argument("--team", metavar="TEAM", help="operators: this team's jobs")
    teams.add_argument(
        "--all-teams", action="store_true", help="operators: every team's jobs (a TEAM column)"
    )
    listing.add_argument("--after", metavar="CURSOR", help="the page after this cursor")
    listing.add_argument("--all", action="store_true", help="every page")
    get = command("get", cli_jobs.get, "jobs as table rows")
    get.add_argument("jobs", nargs="+", metavar="JOB")
    describe = command(
        "describe",
        cli_jobs.describe,
        "a job in full: status, history, metrics, cost",
        aliases=["status"],
    )
    describe.add_argument("job", metavar="JOB")
    logs = command("logs", cli_jobs.logs, "a job's output")
    logs.add_argument("job", metavar="JOB")
    logs.add_argument("-f", "--follow", action="store_true", help="until the job has ended")
    logs.add_argument(
        "--raw",
        action="store_true",
        help="on a terminal too, print the output's escape sequences as the job printed them "
        "(by default only colours and line-bound cursor moves act; the rest is written out)",
    )
    attach = command("attach", cli_jobs.attach, "follow a job: status, output, metrics")
    attach.add_argument("job", metavar="JOB")
    attach.add_argument("--timeout", type=seconds_arg, default=86_400.0, help="seconds (1 day)")
    wait = command("wait", cli_jobs.wait, "wait for a job's end; the exit code says how")
    wait.add_argument("job", metavar="JOB")
    wait.add_argument("--timeout", type=seconds_arg, default=86_400.0, help="seconds (1 day)")
    cancel = command("cancel", cli_jobs.cancel, "ask for jobs to be cancelled")
    cancel.add_argument("jobs", nargs="+", metavar="JOB")
    add_if_match(cancel)  # one JOB only: the ETag is of one job (``describe`` prints it)
    cli_queue.add_command(command)
    cli_tracking.add_commands(command)
    cli_waste.add_command(command)
    cli_models.add_commands(command, common)
    cli_data.add_commands(command, common)
    cli_nodes.add_commands(command, common)
    cli_admin.add_commands(command, common)
    cli_budgets.add_commands(command, common)
    cli_trace.add_command(command)

    tokens = command("tokens", _tokens, "your tokens (as token list)")
    tokens.add_argument("--user", help="another user of your team (admins)")
    tokens.add_argument("--team", help="another team (operators)")
    command("schema", _schema, "print the JSON Schema of a job spec file")
    command("version", _version, "the client's version")
    completion = command("completion", _completion, "print a shell completion script")
    completion.add_argument(
        "shell", metavar="SHELL", choices=("bash", "zsh", "tcsh"), help="bash, zsh or tcsh"
    )
    cli_access.add_commands(commands, common)
    add_deadletter_commands(commands, common)
    _refuse_empty(parser)
    return parser


def folder_arg(value: str) -> Path:
    """A ``--workdir``: a folder that exists (argparse's usage error naming the option)."""
    path = Path(value)
    if not path.expanduser().is_dir():
        missing = "" if path.expanduser().exists() else ": nothing has that path"
        raise argparse.ArgumentTypeError(f"{value!r} is not a folder{missing}")
    return path


def seconds_arg(value: str) -> float:
    """A ``--timeout``: seconds, 0 or more (``inf``: no limit). NaN, which compares with no
    time, and a negative number are refused."""
    try:
        seconds = float(value)
    except ValueError:
        seconds = math.nan
    if not seconds >= 0:
        raise argparse.ArgumentTypeError(f"{value!r} is not a number of seconds (0 or more)")
    return seconds


def _follow_options(sub: argparse.ArgumentParser) -> None:
    sub.add_argument("--follow", action="store_true", help="follow the job until it ends")
    sub.add_argument(
        "--timeout", type=seconds_arg, default=86_400.0, help="seconds --follow waits (1 day)"
    )


def _override_options(sub: argparse.ArgumentParser) -> None:
    sub.add_argument("--name", help="the job's name instead of the spec's")
    sub.add_argument("--project", help="the job's project instead of the spec's")
    sub.add_argument("--experiment", help="the job's experiment instead of the spec's")
    sub.add_argument(
        "--label", action="append", type=cli_jobs.key_value, metavar="K=V", help="add a label"
    )
    sub.add_argument(
        "--set",
        action="append",
        type=cli_jobs.key_value,
        metavar="K=V",
        help="set a hyperparameter (lr=1e-3)",
    )


def _login_commands(
    command: Callable[..., argparse.ArgumentParser], common: argparse.ArgumentParser
) -> None:
    login = command("login", _login, "check a token and store it as a context (0600)")
    login.add_argument("login_url", metavar="URL", help="the submission API's base URL")
    given = login.add_mutually_exclusive_group()
    given.add_argument("--token-stdin", action="store_true", help="read the token from stdin")
    login.add_argument("--name", default="default", help="the context's name (default)")
    for service in cli_config.SERVICES:
        login.add_argument(f"--{service}-url", help=f"the {service} API's base URL")
    logout = command("logout", _logout, "forget a context and its token")
    logout.add_argument(
        "name", metavar="CTX", nargs="?", help="the context (default: the current one)"
    )
    context = command("context", None, "list, switch or remove contexts")
    actions = context.add_subparsers(dest="action", required=True, metavar="ACTION")
    actions.add_parser("ls", parents=[common], help="the contexts").set_defaults(run=_context_ls)
    use = actions.add_parser("use", parents=[common], help="make a context the current one")
    use.add_argument("name", metavar="CTX")
    use.set_defaults(run=_context_use)
    rm = actions.add_parser("rm", parents=[common], help="remove a context")
    rm.add_argument("name", metavar="CTX")
    rm.set_defaults(run=_logout)


def main(argv: Sequence[str] | None = None) -> int:
    try:
        args = _parser().parse_args(argv)
    except CliError as exc:  # an empty value (``_refuse_empty``)
        return _fail(str(exc), exc.code)
    except KeyboardInterrupt:  # building the parser takes a moment too
        return _interrupted()
    # Everything the command prints, its errors too, on a terminal (``terminal_text``).
    with guarded_terminal(raw=getattr(args, "raw", False)):
        return _main(args)


def _main(args: argparse.Namespace) -> int:
    session: Session | None = None
    try:
        session = Session(_settings(), args, lambda url, token: TrainyardClient(url, token))
        code = _run(session)
        sys.stdout.flush()
        return code
    except SpecError as exc:
        return _fail(str(exc), Exit.ERROR)
    except CliError as exc:
        if exc.code == Exit.INTERRUPTED:  # the user stopped following: a note, not an error
            print(f"trainyard: {exc}", file=sys.stderr)
            return Exit.INTERRUPTED
        return _fail(str(exc) + _hint(session, exc.status, str(exc)), exc.code)
    except cli_config.ConfigError as exc:
        return _fail(str(exc), Exit.ERROR)
    except BundleError as exc:
        return _fail(str(exc), Exit.ERROR)
    except TrainyardError as exc:
        said = labelled(exc)
        return _fail(said + _hint(session, exc.status, said), exit_code_of(exc))
    except TimeoutError as exc:
        return _fail(str(exc), Exit.TIMEOUT)
    except KeyboardInterrupt:
        return _interrupted()
    except BrokenPipeError:
        # The reader went away (``trainyard ls | head -1``): not an error. Python would
        # complain again when it flushes stdout at exit, so point stdout at nothing.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return Exit.OK
    except Exception as exc:  # the CLI never shows a traceback
        return _fail(f"unexpected {type(exc).__name__}: {exc}", Exit.ERROR)
    finally:
        if session is not None:
            session.close()


def _hint(session: Session | None, status: int | None, said: str) -> str:
    """What to add to a service's refusal (``said``, of HTTP ``status``; 0: no answer): for
    a token refused (401) by any service, where it came from and what to do; for any API
    that did not answer, where its URL came from (``Session.unreachable``). Nothing for
    ``login``, whose token and URL are the ones it was just given."""
    if session is None or getattr(session.args, "run", None) == _login:
        return ""
    if status == 401:
        return f"\n{session.refused_token()}"
    hint = session.unreachable(said) if status == 0 else None
    return f"\n{hint}" if hint else ""


def _settings() -> CliSettings:
    try:
        return CliSettings()
    except ValidationError as exc:
        first = exc.errors()[0]
        name = "TRAINYARD_" + "_".join(str(part) for part in first["loc"]).upper()
        raise CliError(f"{name}: {first['msg']} (got {first['input']!r})") from None


def _run(session: Session) -> int:
    args = session.args
    if args.command == "deadletters":
        return run_deadletters(session.client, args)
    if args.command in cli_access.COMMANDS:
        rotated = args.command == "token" and args.action == "rotate"
        context = session.token_context() if rotated else None
        shown = cli_access.run(session.client, args, session.as_json)
        # Printed first: should the config file not be written, the new token is not lost.
        if shown is not None:
            print(shown if isinstance(shown, str) else dumps(shown), flush=True)
        if context is not None:
            _keep_rotated(session, context, shown)
        return Exit.OK
    run: Runner = args.run
    return run(session)


def _keep_rotated(session: Session, name: str, shown: Any) -> None:
    """Store the token a rotation made in context ``name``, whose token it revoked: left
    there, the context's next command was refused (401) until the user logged in again."""
    token = shown if isinstance(shown, str) else shown["token"]
    path = session.config_path
    config = cli_config.read(path)
    config.named()[name].token = token
    cli_config.write(path, config)
    note(f"context {name!r} now holds the new token (the old one is revoked)")


def _tokens(session: Session) -> int:
    session.args.command, session.args.action = "token", "list"
    return _run(session)


def _schema(session: Session) -> int:
    print(schema_text(), end="")
    return Exit.OK


def _version(session: Session) -> int:
    version = client_version() or "unknown"
    session.emit({"client": version}, lambda: f"trainyard {version}")
    return Exit.OK


def _completion(session: Session) -> int:
    if session.as_json:
        raise CliError("completion prints a shell script, not JSON: leave out --json", Exit.USAGE)
    try:
        import shtab
    except ImportError:
        raise CliError("shell completion needs shtab: pip install shtab") from None
    print(shtab.complete(_parser(), shell=session.args.shell))
    return Exit.OK


# --- login and contexts ----------------------------------------------------------------------


def _login(session: Session) -> int:
    args = session.args
    # Options login would otherwise ignore without a word: its URL is its argument, and a
    # token comes from one place (--token-stdin took precedence over --token silently).
    if getattr(args, "url", None) is not None:
        raise CliError("login takes the API's URL as its argument, not --url", Exit.USAGE)
    if args.token_stdin and getattr(args, "token", None) is not None:
        raise CliError("give --token or --token-stdin, not both", Exit.USAGE)
    url = checked_url(args.login_url, "given").rstrip("/")  # before a token is asked for
    for service in cli_config.SERVICES:
        if getattr(args, f"{service}_url"):
            checked_url(getattr(args, f"{service}_url"), f"from --{service}-url")
    token = getattr(args, "token", None)
    if args.token_stdin:
        token = sys.stdin.readline().strip()
    elif not token:
        if not sys.stdin.isatty():
            raise CliError("no token: pass --token or --token-stdin", Exit.USAGE)
        import getpass

        token = getpass.getpass("token: ").strip()
    if not token:
        raise CliError("the token is empty", Exit.USAGE)
    token = checked_token(token, "given")
    with session.make(url, token) as client:
        try:
            me = client.whoami()
        except TrainyardError as exc:
            if exc.status != 404:
                raise
            # The submission API always has /v1/me: a 404 means the URL names something else.
            raise CliError(
                f"{url} is not the submission API (GET {url}/v1/me answered 404); give the "
                "API's base URL, without a path such as /ui/ (the dashboard's)",
                Exit.USAGE,
            ) from None
    path = session.config_path
    config = cli_config.read(path)
    config.named()[args.name] = cli_config.Context(
        url=url,
        token=token,
        user=str(me.get("user", "")),
        team=str(me.get("team", "")),
        **{f"{s}_url": getattr(args, f"{s}_url") or "" for s in cli_config.SERVICES},
    )
    config.current = args.name
    cli_config.write(path, config)
    session.emit(
        {"context": args.name, "url": url, "user": me.get("user"), "team": me.get("team")},
        lambda: (
            f"logged in to {url} as {me.get('team')}/{me.get('user')} "
            f"(context {args.name!r}, stored in {path})"
        ),
    )
    return Exit.OK


def _logout(session: Session) -> int:
    path = session.config_path
    config = cli_config.read(path)
    name = session.args.name or config.current
    if not name:
        raise not_configured(
            "no current context to forget",
            "name one: trainyard logout NAME (context ls lists them)",
        )
    pick_context(config, name)  # an error naming the contexts if unknown
    del config.named()[name]
    if config.current == name:
        config.current = ""
    cli_config.write(path, config)
    session.emit({"removed": name}, lambda: f"removed context {name!r}")
    return Exit.OK


def _context_ls(session: Session) -> int:
    rows = cli_config.rows(cli_config.read(session.config_path))
    session.emit(
        rows,
        lambda: table(
            ("CURRENT", "NAME", "URL", "USER"),
            [("*" if r["current"] else "", r["name"], r["url"], r["user"]) for r in rows],
            empty=none_yet("no contexts", "trainyard login URL", "stores one"),
        ),
    )
    return Exit.OK


def _context_use(session: Session) -> int:
    path = session.config_path
    config = cli_config.read(path)
    pick_context(config, session.args.name)  # an error naming the contexts if unknown
    config.current = session.args.name
    cli_config.write(path, config)
    session.emit({"current": config.current}, lambda: f"using context {config.current!r}")
    return Exit.OK


def _interrupted() -> int:
    """Ctrl-C: one word on stderr and exit 130, wherever it came (``trainyard.launch`` says
    the same of one that comes while this module is still being imported)."""
    print("interrupted", file=sys.stderr)
    return Exit.INTERRUPTED


def _fail(message: str, code: int) -> int:
    for line in message.splitlines() or [""]:
        print(f"trainyard: error: {line}", file=sys.stderr)
    return int(code)


if __name__ == "__main__":
    sys.exit(main())
