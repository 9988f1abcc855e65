"""What every CLI command shares: settings, the session (which API, which token), exit
codes, output, and job references by unique id prefix.

Exit codes (stable; scripts may rely on them):

    0    success (``wait``, ``attach``, ``submit --follow``: the job SUCCEEDED)
    1    error: the API refused the request, a spec file is invalid, anything unexpected
    2    usage: the command line is wrong
    3    not found: no such job, or an id prefix that matches no job or several
    4    not allowed: a token the API refuses (401), or a forbidden action (403)
    5    unreachable: the API did not answer
    6    timed out (``wait --timeout``, ``submit --follow --timeout``)
    7    not configured: the command lacks part of its context (no token, no context of the
         name given, no current context, no URL of a service it calls); ``not_configured``
    10   the job ended FAILED
    11   the job ended CANCELLED
    130  interrupted (Ctrl-C)
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from enum import IntEnum
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from pydantic import Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from trainyard.bundle import DEFAULT_MAX_BYTES
from trainyard.cli_config import (
    DEFAULT_URL,
    SERVICES,
    Config,
    Context,
    default_path,
    pick,
    read,
)
from trainyard.cli_render import short
from trainyard.client import (
    TrainyardClient,
    TrainyardError,
    token_problem,
    unanswered,
    unreached,
)


class Exit(IntEnum):
    OK = 0
    ERROR = 1
    USAGE = 2
    NOT_FOUND = 3
    DENIED = 4
    UNREACHABLE = 5
    TIMEOUT = 6
    NOT_CONFIGURED = 7
    JOB_FAILED = 10
    JOB_CANCELLED = 11
    INTERRUPTED = 130


EXIT_WORDS: dict[Exit, str] = {
    Exit.OK: "ok",
    Exit.ERROR: "error",
    Exit.USAGE: "usage",
    Exit.NOT_FOUND: "not found",
    Exit.DENIED: "not allowed",
    Exit.UNREACHABLE: "unreachable",
    Exit.TIMEOUT: "timed out",
    Exit.NOT_CONFIGURED: "not configured",
    Exit.JOB_FAILED: "job failed",
    Exit.JOB_CANCELLED: "job cancelled",
    Exit.INTERRUPTED: "interrupted",
}
"""Every exit code in a few words, as ``trainyard --help`` lists them (made from this, so the
list cannot leave one out)."""

FINAL_EXIT = {"SUCCEEDED": Exit.OK, "FAILED": Exit.JOB_FAILED, "CANCELLED": Exit.JOB_CANCELLED}


class CliSettings(BaseSettings):
    """What the environment tells the CLI (env prefix ``TRAINYARD_``); options and the
    config file's context fill in the rest (``trainyard.cli_config``)."""

    model_config = SettingsConfigDict(env_prefix="TRAINYARD_")

    url: str | None = None
    """Base URL of the submission API (overrides the context's)."""
    token: SecretStr | None = None
    """Bearer token (overrides the context's)."""
    context: str | None = None
    """The context to use instead of the current one."""
    config: Path | None = None
    """The config file (default ``~/.config/trainyard/config.json``)."""

    @field_validator("config", mode="before")
    @classmethod
    def _empty_is_unset(cls, value: Any) -> Any:
        """``TRAINYARD_CONFIG=`` means the default file, as an empty ``TRAINYARD_URL``,
        ``TRAINYARD_TOKEN`` or ``TRAINYARD_CONTEXT`` means none: it was read as the path
        ``.``, the current folder ("cannot read .: not a file")."""
        return None if isinstance(value, str) and not value.strip() else value

    registry_url: str | None = None
    """Base URL of the registry API (models, metrics, experiments)."""
    billing_url: str | None = None
    """Base URL of the billing API (``cost``)."""
    scheduler_url: str | None = None
    """Base URL of the scheduler API."""
    bundle_max_bytes: int = Field(default=DEFAULT_MAX_BYTES, ge=1)
    """Largest code bundle ``submit`` uploads (compressed bytes)."""


class CliError(Exception):
    """A problem to report as one line on stderr, with its exit code; ``status``: the HTTP
    status of the service's refusal it reports (``refused``), None for any other problem."""

    def __init__(self, message: str, code: Exit = Exit.ERROR, status: int | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.status = status


def refused(message: str, exc: TrainyardError) -> CliError:
    """A service's refusal ``exc`` said as ``message`` (``scheduler: 401 ...``): the exit code
    of its status, and the status kept, so that ``cli.main`` says of a token any service
    refused (401) where it came from and what to do, as of one the submission API refused."""
    return CliError(message, exit_code_of(exc), exc.status)


def not_configured(missing: str, how: str) -> CliError:
    """The error of any command that lacks part of its context: one line, ``missing`` (what
    is missing: ``no token``, ``no registry URL``, ``no context 'lab'``), then ``how`` to set
    it, exit ``Exit.NOT_CONFIGURED`` whatever the command. Every such error is made here, so
    a script tells "set up first" from a refusal or a failure by one code."""
    return CliError(f"{missing}: {how}", Exit.NOT_CONFIGURED)


def pick_context(config: Config, name: str | None, named_by: str = "") -> Context | None:
    """The context ``name`` of ``config`` (``cli_config.pick``), else the current one (None
    when there is none); a name it does not hold is ``not_configured``, listing those it
    holds, ``named_by`` saying where the name came from (``--context``)."""
    if name and name not in config.named():
        known = ", ".join(sorted(config.named())) or "none yet"
        by = f" (named by {named_by})" if named_by else ""
        raise not_configured(
            f"no context {name!r}{by} (contexts: {known})",
            f"trainyard login URL --name {name} stores one (trainyard context ls lists them)",
        )
    return pick(config, name)


def checked_url(url: str, where: str) -> str:
    """``url`` when it is an ``http://`` or ``https://`` URL with a host, else a
    ``CliError`` (exit 2) saying ``where`` it came from (``from TRAINYARD_URL``): a URL no
    request could be sent to is a mistake in the command or settings, not a server that
    cannot be reached."""
    try:
        parts = urlsplit(url)
        usable = parts.scheme in ("http", "https") and bool(parts.hostname)
        parts.port  # noqa: B018  # a port that is no number raises ValueError
    except ValueError:
        usable = False
    if not usable:
        raise CliError(f"the URL {where} is not an http:// or https:// URL: {url!r}", Exit.USAGE)
    return url


def checked_token(token: str, where: str) -> str:
    """``token`` when an API could accept it, else a ``CliError`` (exit 4) saying ``where``
    it came from (``from --token``) and what is wrong (``client.token_problem``), before anything is sent: such a
    token would only fail in the HTTP library, whose message may hold the header, token
    included."""
    problem = token_problem(token)
    if problem is not None:
        raise CliError(f"the token {where} is malformed: {problem}", Exit.DENIED)
    return token


def exit_code_of(exc: TrainyardError) -> Exit:
    if exc.status == 0:
        return Exit.UNREACHABLE
    if exc.status in (401, 403):
        return Exit.DENIED
    if exc.status == 404:
        return Exit.NOT_FOUND
    return Exit.ERROR


def asked(
    service: str,
    call: Callable[[], Any],
    reread: str | None = None,
    options: Mapping[str, str] | None = None,
) -> Any:
    """``call()``'s answer; ``service``'s refusal (``TrainyardError``) as one line naming the
    service (``scheduler: 409 ...``), with the exit code of its status (``exit_code_of``),
    each field set by one of ``options`` (field: option) named by its option (``optioned``).
    A write refused because what it was conditional on changed (412 on ``If-Match``:
    ``--if-match``) says so plainly, and how to go on: ``reread``, the command that shows
    the resource as it is now."""
    try:
        return call()
    except TrainyardError as exc:
        raise refused(refusal_text(service, optioned(exc, options), reread), exc) from None


def labelled(exc: TrainyardError) -> str:
    """``exc`` as a command that did not catch it says it: after the name of the API that
    refused, when that is not the submission API's (``registry: 409 ...``), as ``asked``
    says the refusals it catches; so a command that lets another service's refusal pass
    says where it came from all the same."""
    return f"{exc.service}: {exc}" if exc.service else str(exc)


def optioned(exc: TrainyardError, options: Mapping[str, str] | None) -> TrainyardError:
    """``exc`` with each field error of a field that an option of the command sets
    (``options``: field -> option) named by that option, as the user typed it: ``--gpus
    (gpu_count): must be at least 0``, ``--value: field required``; ``exc`` itself when
    none is."""
    if not options or not any(e.get("field") in options for e in exc.errors):
        return exc
    errors = []
    for error in exc.errors:
        field = str(error.get("field", ""))
        option = options.get(field)
        named = option if option is None or option == f"--{field}" else f"{option} ({field})"
        errors.append({**error, "field": named} if named else error)
    return TrainyardError(exc.status, exc.message, errors, exc.retry_after)


def refusal_text(
    service: str,
    exc: TrainyardError,
    reread: str | None = None,
    again: str = "--if-match set to its new ETag",
) -> str:
    """``service``'s refusal as the user reads it (see ``asked``); ``again``: what the
    command is repeated with after a 412 on ``If-Match``. A 412 on ``If-None-Match: *`` (a
    create that found the resource made meanwhile) says so, and to repeat the command as
    it is once ``reread`` shows what was made."""
    stale = next((e for e in exc.errors if e.get("field") in ("If-Match", "If-None-Match")), None)
    if exc.status != 412 or stale is None:
        return f"{service}: {exc}"
    what = str(stale.get("message", "")).split(", and If-")[0].split(": nothing changed")[0]
    look = f"run `{reread}`" if reread else "read it again"
    made = stale.get("field") == "If-None-Match"
    return (
        f"{service}: nothing was changed: someone else "
        f"{'made' if made else 'changed'} it since you read it ({what}). "
        f"{look.capitalize()} to see it as it is now, then repeat the command"
        f"{'' if made else f' with {again}'} if your change still applies."
    )


IF_MATCH_HELP = (
    "only if it is still as you read it: the etag its show (for a job: describe) printed; "
    "when someone changed it since, nothing is changed (exit 1)"
)
"""The help of ``--if-match`` of every command that takes it."""


def add_if_match(parser: argparse.ArgumentParser) -> None:
    """Give a conditional write's command its ``--if-match ETAG`` (``IF_MATCH_HELP``)."""
    parser.add_argument("--if-match", metavar="ETAG", help=IF_MATCH_HELP)


def if_match(args: argparse.Namespace) -> dict[str, str]:
    """The ``If-Match`` header of the command's ``--if-match`` (none: no header, the write
    goes ahead whatever changed since)."""
    tag = getattr(args, "if_match", None)
    return {"If-Match": tag} if tag else {}


def etag_of(answer: Any) -> str | None:
    """The ``ETag`` an answer of ``TrainyardClient`` came with (None: none)."""
    response = getattr(answer, "response", None)
    return None if response is None else response.headers.get("ETag")


def etag_line(answer: Any) -> str:
    """``etag: "..."`` (for ``--if-match``) under what a ``show`` prints; empty without one."""
    tag = etag_of(answer)
    return f"\netag: {tag}" if tag else ""


def emit_tagged(as_json: bool, answer: Any, text: Callable[[], str]) -> None:
    """What a ``show`` of a resource with an ``ETag`` prints: ``text()`` with ``etag: "..."``
    last (``etag_line``); with ``--json`` (``as_json``) the service's answer as it is on
    stdout and that same ``etag:`` line on stderr, one rule for every such ``show``, the
    answer a list or an object."""
    if not as_json:
        print(text() + etag_line(answer))
        return
    print(dumps(answer))
    tag = etag_of(answer)
    if tag:
        print(f"etag: {tag}", file=sys.stderr)


def conditional(service: str, call: Callable[[], Any], reread: str) -> Any:
    """``call()``'s answer, for a command whose other refusals the CLI reports as they come
    (``TrainyardError``): a 412 on its ``--if-match`` is ``refusal_text``'s line (exit 1),
    as ``asked`` says it."""
    try:
        return call()
    except TrainyardError as exc:
        if exc.status != 412:
            raise
        raise refused(refusal_text(service, exc, reread), exc) from None


def patch_or_create(
    service: str,
    client: TrainyardClient,
    path: str,
    patch: Any,
    body: Callable[[], Any],
    conditions: dict[str, str] | None = None,
    reread: str | None = None,
    options: Mapping[str, str] | None = None,
) -> tuple[dict[str, Any], bool]:
    """Change the resource at ``path`` with ``PATCH`` of ``patch`` (only the fields it names);
    when there is none (404), create it with ``PUT`` of ``body()`` saying ``If-None-Match:
    *``, so that one another admin created between the two requests is not replaced: on 412
    patch that one instead, once. The answer and whether it was created (201). A refusal is
    ``asked``'s one line naming ``service``. With ``conditions`` (``if_match``: the user
    read the resource) it only patches, under them: one deleted since is a 404, never
    created again. ``options``: as ``asked`` takes them."""
    if conditions:
        call = lambda: client.call("PATCH", path, patch, conditions)  # noqa: E731
        return asked(service, call, reread, options), False
    try:
        return client.call("PATCH", path, patch), False
    except TrainyardError as exc:
        if exc.status != 404:
            raise refused(f"{service}: {optioned(exc, options)}", exc) from None
    sent = body()  # its usage errors only now: a patch needs no whole definition
    try:
        found = client.call("PUT", path, sent, headers={"If-None-Match": "*"})
    except TrainyardError as exc:
        if exc.status != 412:
            raise refused(f"{service}: {optioned(exc, options)}", exc) from None
        return asked(service, lambda: client.call("PATCH", path, patch), None, options), False
    return found, created(found)


def created(found: Any) -> bool:
    """Whether ``found``, an answer of ``TrainyardClient.call``, came with 201 (created)."""
    response = getattr(found, "response", None)
    return response is not None and response.status_code == 201


@dataclass
class Session:
    """The API, the token and the output options of one command."""

    settings: CliSettings
    args: argparse.Namespace
    make: Callable[[str, str], TrainyardClient]
    """How a client is made (``cli.TrainyardClient``, replaced in tests)."""
    clients: dict[str, TrainyardClient] = field(default_factory=dict)
    origins: dict[str, str] = field(default_factory=dict)
    """The URL of each client made, and what to say when it does not answer: where it came
    from (an option, a variable, a context, the default) and what to change
    (``unreachable``)."""

    @property
    def as_json(self) -> bool:
        return bool(getattr(self.args, "json", False))

    @property
    def config_path(self) -> Path:
        return self.settings.config or default_path()

    def context(self) -> Context | None:
        """The context named by ``--context`` or ``TRAINYARD_CONTEXT``, else the current one
        (None when there is none); a name the config file does not hold is
        ``not_configured``."""
        given = getattr(self.args, "context", None)
        named_by = "--context" if given else "TRAINYARD_CONTEXT"
        return pick_context(read(self.config_path), given or self.settings.context, named_by)

    def _context_name(self) -> str:
        name = getattr(self.args, "context", None) or self.settings.context
        return name or read(self.config_path).current

    @property
    def url(self) -> str:
        """The submission API's URL, checked (``checked_url``)."""
        if getattr(self.args, "url", None):
            return checked_url(self.args.url, "from --url")
        if self.settings.url:
            return checked_url(self.settings.url, "from TRAINYARD_URL")
        ctx = self.context()
        if ctx is not None and ctx.url:
            return checked_url(ctx.url, f"of context {self._context_name()!r}")
        return DEFAULT_URL

    def _url_given(self) -> bool:
        return bool(getattr(self.args, "url", None) or self.settings.url)

    def _sends_token_of(self, ctx: Context) -> bool:
        """Whether the token of ``ctx`` goes to the URL this command calls: with no URL
        given, the context's own; with ``--url`` or ``TRAINYARD_URL``, only one of the
        context's own URLs (``own_urls``), such as its scheduler's for ``deadletters`` or
        ``audit`` of that service. Never another server's."""
        return not self._url_given() or self.url.rstrip("/") in own_urls(ctx)

    @property
    def token(self) -> str:
        """The token to send, checked (``checked_token``)."""
        given = getattr(self.args, "token", None)
        if given:
            return checked_token(str(given), "from --token")
        if self.settings.token and self.settings.token.get_secret_value():
            return checked_token(self.settings.token.get_secret_value(), "from TRAINYARD_TOKEN")
        ctx = self.context()
        if ctx is not None and ctx.token and self._sends_token_of(ctx):
            return checked_token(ctx.token, f"of context {self._context_name()!r}")
        if ctx is not None and ctx.token:  # a context's token never goes to another server
            raise not_configured(
                f"no token for {self.url}",
                f"the token of context {self._context_name()!r} is sent to "
                f"{_listed(own_urls(ctx))} only: "
                f"trainyard login {self.url}, set TRAINYARD_TOKEN or pass --token",
            )
        if ctx is None:
            self._current_missing()
        raise not_configured(
            "no token" if ctx is not None else "no token (no context: not logged in)",
            "trainyard login URL, set TRAINYARD_TOKEN or pass --token",
        )

    def _current_missing(self) -> None:
        """Refuse a config file whose ``current`` names a context it does not hold (edited
        by hand, or written by another version): said as such, with how to mend it, where
        "no context: not logged in" sent a user who had logged in to log in again."""
        config = read(self.config_path)
        if config.current and config.current not in config.named():
            known = ", ".join(sorted(config.named()))
            store = f"trainyard login URL --name {config.current} stores it"
            raise not_configured(
                f"no token: the current context {config.current!r} of {self.config_path} "
                f"does not exist (contexts: {known or 'none'})",
                f"trainyard context use CTX picks one, or {store}" if known else store,
            )

    def token_context(self) -> str | None:
        """The name of the context whose token ``token`` sends; None when ``--token`` or
        ``TRAINYARD_TOKEN`` gives it (or there is none)."""
        if getattr(self.args, "token", None) or (
            self.settings.token and self.settings.token.get_secret_value()
        ):
            return None
        ctx = self.context()
        if ctx is not None and ctx.token and self._sends_token_of(ctx):
            return self._context_name()
        return None

    def unreachable(self, said: str) -> str | None:
        """What to add when an API did not answer (``said``: the error, ``cannot reach URL:
        ...``, perhaps after the service's name): where the URL of the client that asked
        came from and what to change (``origins``); for a request a server there took and
        did not answer in time (``no answer from URL to ...``), that the URL reaches a
        server, which is slow or stuck, not that it may be down or elsewhere; None when
        ``said`` names none of them."""
        for url, hint in self.origins.items():
            # ": " after it: a URL that begins another (http://h/ of http://h/api/) is not it.
            if f"{unreached(url)}: " in said:
                return hint
            if f"{unanswered(url)} " in said:
                return (
                    "the URL reaches a server, which took the request but did not answer in "
                    "time: the API there is busy or stuck (its logs say why)"
                )
        return None

    def _submission_hint(self) -> str | None:
        """What to say when the submission API's URL (``url``) did not answer; None for a URL
        given by ``--url``, on this very command line, where the error alone says it."""
        if getattr(self.args, "url", None):
            return None
        if self.settings.url:
            return "that is the URL from TRAINYARD_URL: is the API up there?"
        ctx = self.context()
        if ctx is not None and ctx.url:
            name = self._context_name()
            said = f"that is the URL of context {name!r}: is the API up there?"
            if not on_this_machine(ctx.url):
                return said
            return (
                f"{said} (dev.py up takes new ports at each start: log in again with the URL "
                f"it prints, trainyard login URL --name {name})"
            )
        # Not a server down: none was configured, and the local stack's URL was tried.
        return (
            f"no URL is configured, so {DEFAULT_URL} (a local stack's) was tried: trainyard "
            "login URL, set TRAINYARD_URL or pass --url"
        )

    def refused_token(self) -> str:
        """What to say of a token an API refused (401): where it came from and how to get
        one that works; never the token."""
        name = self._context_name()
        ctx = self.context()
        # A token given on top of a context hides the context's, which may well work.
        hidden = ctx is not None and ctx.token and self._sends_token_of(ctx)
        instead = f" to use the token of context {name!r}" if hidden else ""
        if getattr(self.args, "token", None):
            return "the token from --token was refused (expired or revoked?): give a valid one" + (
                f", or leave --token out{instead}" if instead else ""
            )
        if self.settings.token and self.settings.token.get_secret_value():
            return (
                "the token from TRAINYARD_TOKEN was refused (expired or revoked?): set a valid "
                "one" + (f", or unset TRAINYARD_TOKEN{instead}" if instead else "")
            )
        if ctx is None:
            return "the token was refused"
        return (
            f"the token of context {name!r} was refused (expired or revoked?): "
            f"trainyard login {ctx.url} --name {name}"
        )

    @property
    def client(self) -> TrainyardClient:
        """The submission API's client (made once)."""
        if "submission" not in self.clients:
            self._named_context()
            url = self.url
            self.clients["submission"] = self.make(url, self.token)
            hint = self._submission_hint()
            if hint is not None:
                self.origins.setdefault(url, hint)
        return self.clients["submission"]

    def _named_context(self) -> None:
        """Refuse a context named by ``--context`` or ``TRAINYARD_CONTEXT`` that the config
        file does not hold (``not_configured``) before any client is made, even where
        options and variables give every URL and the token, so that the context is not
        read: such a name was ignored without a word, and a typo in it went unnoticed."""
        if getattr(self.args, "context", None) or self.settings.context:
            self.context()

    def service(self, name: str) -> TrainyardClient:
        """The client of another service's API (``registry``, ``billing``, ``scheduler``)."""
        if name not in self.clients:
            self._named_context()
            given = getattr(self.settings, f"{name}_url")
            variable = f"TRAINYARD_{name.upper()}_URL"
            if given:
                url = checked_url(given, f"from {variable}")
                hint = f"that is the {name} URL from {variable}: is the {name} API up there?"
            else:
                ctx = self.context()
                stored = ctx and getattr(ctx, f"{name}_url")
                if not stored:
                    raise not_configured(
                        f"no {name} URL",
                        f"set TRAINYARD_{name.upper()}_URL or "
                        f"trainyard login URL --{name}-url {name.upper()}_URL",
                    )
                context = self._context_name()
                url = checked_url(stored, f"--{name}-url of context {context!r}")
                hint = (
                    f"that is the {name} URL of context {context!r} (login --{name}-url): "
                    f"is the {name} API up there?"
                )
                if on_this_machine(url):
                    hint += (
                        " (dev.py up takes new ports at each start: log in again with the "
                        f"URLs it prints, trainyard login URL --name {context} --{name}-url "
                        f"{name.upper()}_URL)"
                    )
            self.clients[name] = self.make(url, self.token)
            self.clients[name].service = name  # its errors name it (``labelled``)
            self.origins.setdefault(url, hint)
        return self.clients[name]

    def close(self) -> None:
        for client in self.clients.values():
            client.close()

    def emit(self, value: Any, text: Callable[[], str]) -> None:
        """``value`` as JSON with ``--json``, else ``text()``."""
        print(dumps(value) if self.as_json else text())

    def emit_tagged(self, answer: Any, text: Callable[[], str]) -> None:
        """``answer`` and its ``ETag`` as a ``show`` prints them (``emit_tagged``)."""
        emit_tagged(self.as_json, answer, text)


LOOPBACK_HOSTS = frozenset({"127.0.0.1", "localhost", "::1"})
"""Hosts of a stack on this machine, where ``dev.py up`` starts one (on new ports each
time, so a context's stored URL goes stale)."""


def on_this_machine(url: str) -> bool:
    """Whether ``url`` names this machine (a loopback host), where the hint about
    ``dev.py up``'s new ports applies; a remote stack's URL is not moved by it."""
    try:
        return (urlsplit(url).hostname or "") in LOOPBACK_HOSTS
    except ValueError:
        return False


def own_urls(ctx: Context) -> list[str]:
    """The URLs the token of ``ctx`` is sent to: its submission API's, then the registry,
    billing and scheduler URLs stored with it (``login --registry-url`` ...), which the
    commands that call those services send it to anyway."""
    urls = [ctx.url, *(getattr(ctx, f"{name}_url") for name in SERVICES)]
    return list(dict.fromkeys(url.rstrip("/") for url in urls if url))


def _listed(items: list[str]) -> str:
    """``a``, ``a and b``, ``a, b and c``."""
    return items[0] if len(items) == 1 else f"{', '.join(items[:-1])} and {items[-1]}"


ID_MAX = 2**63 - 1
"""The largest id, sequence or count the services take (a signed 64-bit integer)."""


def positive_arg(value: str) -> int:
    """An argparse ``type`` for a whole number from 1 to ``ID_MAX`` (a limit, an id), judged
    on the command line so that the error names the option, not the API's field."""
    try:
        number = int(value)
    except ValueError:
        number = 0
    if not 1 <= number <= ID_MAX:
        raise argparse.ArgumentTypeError(f"{value!r} is not a positive integer")
    return number


def whole_arg(low: int, high: int, unit: str = "") -> Callable[[str], int]:
    """An argparse ``type`` for a whole number from ``low`` to ``high`` (of ``unit``, when
    given), judged on the command line so that the error names the option, not the API's
    field."""
    what = f"{unit} " if unit else ""

    def check(value: str) -> int:
        try:
            number = int(value)
        except ValueError:
            number = low - 1
        if not low <= number <= high:
            raise argparse.ArgumentTypeError(
                f"{value!r} is not a whole number of {what}from {low} to {high}"
                if unit
                else f"{value!r} is not a whole number from {low} to {high}"
            )
        return number

    return check


def decimal_arg(example: str) -> Callable[[str], str]:
    """An argparse ``type`` for money as written (billing reads its decimal text as given):
    a finite decimal number passes unchanged; its bounds and precision are billing's to
    judge. ``example`` is shown in the error."""

    def check(value: str) -> str:
        try:
            finite = Decimal(value).is_finite()
        except InvalidOperation:
            finite = False
        if not finite:
            raise argparse.ArgumentTypeError(f"{value!r} is not a decimal number such as {example}")
        return value

    return check


def dumps(value: object) -> str:
    return json.dumps(value, indent=2, sort_keys=True)


def note(message: str) -> None:
    """A progress note for people, on stderr."""
    print(message, file=sys.stderr, flush=True)


# --- job references --------------------------------------------------------------------------

_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
_PREFIX = re.compile(r"[0-9a-f][0-9a-f-]{0,34}")
PREFIX_CANDIDATES = 10
"""How many jobs an ambiguous prefix lists."""


def resolve(client: TrainyardClient, ref: str) -> str:
    """The job id ``ref`` stands for: a full id, or a unique prefix of one of the team's jobs
    (``GET /v1/jobs?id_prefix=``). Anything else is passed on as it is (the API answers;
    callers put it in a URL as one path segment, ``client.segment``), except what is no
    segment at all: an empty ``ref`` is a usage error (exit 2), and ``.`` or ``..`` (which
    a URL resolves away) names no job (exit 3), both without a request."""
    plain = ref.strip().lower()
    if not plain:
        raise CliError("JOB is empty: give a job id or the beginning of one", Exit.USAGE)
    if plain in (".", ".."):
        raise CliError(f"no job of your team has the id {ref!r}", Exit.NOT_FOUND)
    if _UUID.fullmatch(plain):
        return plain
    if not _PREFIX.fullmatch(plain):
        return ref
    ref = plain
    jobs, _ = client.list_page(limit=PREFIX_CANDIDATES + 1, id_prefix=ref)
    matches = [j for j in jobs if str(j.get("id", "")).startswith(ref)]
    if not matches:
        raise CliError(f"no job of your team has an id starting with {ref!r}", Exit.NOT_FOUND)
    if len(matches) > 1:
        listed = ", ".join(
            f"{short(j['id'])} ({j['name']}, {j['status']})" for j in matches[:PREFIX_CANDIDATES]
        )
        more = " and more" if len(matches) > PREFIX_CANDIDATES else ""
        raise CliError(
            f"{ref!r} is ambiguous: it starts the ids of {listed}{more}; give more characters",
            Exit.NOT_FOUND,
        )
    return str(matches[0]["id"])


def resolved_job(session: Session, ref: str) -> str:
    """``resolve`` for a command that calls another service (``cost JOB``, ``waste --job``):
    the submission API resolves the reference, so its refusal is said as its own
    (``submission: 404 ...``), not as one of the service the command goes on to call."""
    return str(asked("submission", lambda: resolve(session.client, ref)))
