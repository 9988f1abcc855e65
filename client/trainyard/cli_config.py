"""Where the CLI finds the platform: named contexts in a config file.

    trainyard login URL [--token T | --token-stdin] [--name NAME] [--registry-url U] ...
    trainyard logout [NAME]
    trainyard context ls | use NAME | rm NAME

Contract:
- The file is ``$TRAINYARD_CONFIG``, else ``~/.config/trainyard/config.json``: JSON
  ``{"current": NAME, "contexts": {NAME: {"url", "token", "user", "team", "registry_url",
  "billing_url", "scheduler_url"}}}``. It is written whole to a temporary file of mode 0600
  in the same folder (created 0700), then renamed over the old one: never half written,
  never readable by others (a link to the file is followed: the file it names is
  replaced, the link kept). A file others may read is refused until it is 0600 again.
- What a command uses, strongest first: ``--url``/``--token``, then
  ``TRAINYARD_URL``/``TRAINYARD_TOKEN``, then the context ``--context`` names, else the
  one ``TRAINYARD_CONTEXT`` names, else the current one, then ``http://127.0.0.1:8080``
  without a token.
- ``login`` checks the token (``GET /v1/me``) before it stores anything.
"""

from __future__ import annotations

import json
import os
import stat
import tempfile
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

DEFAULT_URL = "http://127.0.0.1:8080"
SERVICES = ("registry", "billing", "scheduler")


class ConfigError(Exception):
    """The config file cannot be read or written, or names no such context."""


@dataclass
class Context:
    """One platform and the token to use there."""

    url: str
    token: str = ""
    user: str = ""
    team: str = ""
    registry_url: str = ""
    billing_url: str = ""
    scheduler_url: str = ""


@dataclass
class Config:
    current: str = ""
    contexts: dict[str, Context] | None = None

    def named(self) -> dict[str, Context]:
        if self.contexts is None:
            self.contexts = {}
        return self.contexts


def default_path() -> Path:
    return Path.home() / ".config" / "trainyard" / "config.json"


def read(path: Path) -> Config:
    """The config at ``path`` (empty when there is none)."""
    try:
        mode = path.stat().st_mode
    except FileNotFoundError:
        return Config()
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc.strerror or exc}") from None
    if not stat.S_ISREG(mode):
        raise ConfigError(f"cannot read {path}: not a file")
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise ConfigError(
            f"{path} holds tokens but others may read it (mode {stat.S_IMODE(mode):04o}); "
            f"run: chmod 600 {path}"
        )
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot read {path}: {exc}") from None
    if not _is_config(raw):
        raise ConfigError(
            f"cannot read {path}: not a trainyard config (a JSON object: "
            '{"current": NAME, "contexts": {NAME: {"url": ..., "token": ...}}}); fix or remove it'
        )
    contexts = {
        name: Context(**{k: v for k, v in ctx.items() if k in _CONTEXT_FIELDS})
        for name, ctx in raw.get("contexts", {}).items()
    }
    return Config(current=raw.get("current", ""), contexts=contexts)


_CONTEXT_FIELDS = frozenset(f.name for f in fields(Context))


def _is_config(raw: Any) -> bool:
    """Whether ``raw`` has the file's shape (see the contract): the contexts' known fields
    strings, ``url`` among them; other keys are left alone."""
    if not isinstance(raw, dict) or not isinstance(raw.get("current", ""), str):
        return False
    contexts = raw.get("contexts", {})
    return isinstance(contexts, dict) and all(
        isinstance(ctx, dict)
        and isinstance(ctx.get("url"), str)
        and all(isinstance(v, str) for k, v in ctx.items() if k in _CONTEXT_FIELDS)
        for ctx in contexts.values()
    )


def write(path: Path, config: Config) -> None:
    """Replace the file at ``path`` with ``config``, mode 0600 (see the contract); a link
    stays a link, the file it names replaced (as ``read`` follows it)."""
    path = Path(os.path.realpath(path))
    body: dict[str, Any] = {
        "current": config.current,
        "contexts": {name: asdict(ctx) for name, ctx in sorted(config.named().items())},
    }
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd, temporary = tempfile.mkstemp(prefix=".config-", dir=path.parent)  # mode 0600
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as out:
                json.dump(body, out, indent=2)
                out.write("\n")
            os.chmod(temporary, 0o600)
            os.replace(temporary, path)
        except BaseException:
            Path(temporary).unlink(missing_ok=True)
            raise
    except OSError as exc:
        raise ConfigError(f"cannot write {path}: {exc.strerror or exc}") from None


def pick(config: Config, name: str | None) -> Context | None:
    """The context ``name`` (an error if there is none of that name), else the current one."""
    contexts = config.named()
    if name:
        if name not in contexts:
            known = ", ".join(sorted(contexts)) or "none yet: trainyard login URL"
            raise ConfigError(f"no context {name!r} (contexts: {known})")
        return contexts[name]
    return contexts.get(config.current)


def rows(config: Config) -> list[dict[str, Any]]:
    """The contexts for ``context ls`` (never their tokens)."""
    return [
        {
            "current": name == config.current,
            "name": name,
            "url": ctx.url,
            "user": f"{ctx.team}/{ctx.user}" if ctx.user else "",
            "token": bool(ctx.token),
        }
        for name, ctx in sorted(config.named().items())
    ]
