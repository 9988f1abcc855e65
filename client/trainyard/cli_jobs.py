"""The CLI's job commands: submit, ls, get, describe, logs, attach, wait, cancel, rerun
(``--reproduce``), reproduction, queue.

Every command that takes a job takes its full id or any unique prefix of it
(``trainyard.cli_base.resolve``). Output for people goes to stdout as text or aligned
tables; ``--json`` prints the API's JSON instead; progress notes go to stderr.
"""

from __future__ import annotations

import argparse
import json
import math
import shlex
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

from trainyard.bundle import ALWAYS_EXCLUDED, Bundle, format_size, pack
from trainyard.cli_base import (
    FINAL_EXIT,
    CliError,
    Exit,
    Session,
    conditional,
    dumps,
    exit_code_of,
    if_match,
    note,
    refused,
    resolve,
)
from trainyard.cli_render import (
    LIST_HEADER,
    FollowPrinter,
    list_row,
    money,
    none_yet,
    pending_text,
    render_job,
    render_list,
    stream_text,
    summary_reason,
    table,
    time_text,
    waiting_reason,
    why,
)
from trainyard.client import (
    LIST_PAGE_MAX,
    SETTLE_SECONDS,
    TrainyardClient,
    TrainyardError,
    segment,
)
from trainyard.secret_names import looks_secret
from trainyard.spec import SECRET_WARNING, SpecFile, load, load_stream, plain_scalar
from trainyard.suggest import closest

LOG_POLL_SECONDS = 1.0
ESTIMATE_WAIT_SECONDS = 2.0
"""How long ``submit`` waits for the scheduler's first word (position, estimated start)."""
JOB_STATUSES = (
    "QUEUED",
    "PENDING",
    "SCHEDULED",
    "RUNNING",
    "SUCCEEDED",
    "FAILED",
    "PREEMPTED",
    "CANCELLED",
)
RERUN_LABEL = "trainyard.dev/rerun-of"
"""The label a rerun gets: the id of the job whose spec it repeats."""
MAX_LABELS = 64


LS_LIMIT = 50
"""How many jobs ``ls`` lists when ``--limit`` is not given."""


def status_arg(value: str) -> str:
    """``--status``: any case; an unknown one names the valid ones."""
    if value.upper() not in JOB_STATUSES:
        valid = ", ".join(s.lower() for s in JOB_STATUSES)
        raise argparse.ArgumentTypeError(f"{value!r} is not a status; use one of {valid}")
    return value.upper()


def key_value(value: str) -> tuple[str, str]:
    """``KEY=VALUE`` (``--label``, ``--set``)."""
    key, sep, rest = value.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"{value!r} is not KEY=VALUE")
    return key, rest


IDEMPOTENCY_KEY_MAX = 200
"""The longest ``Idempotency-Key`` the submission API takes (of printable ASCII)."""


def idempotency_key_arg(value: str) -> str:
    """``submit --idempotency-key``: 1 to ``IDEMPOTENCY_KEY_MAX`` printable ASCII characters,
    as the API takes it. Checked here, because an HTTP header cannot carry anything else: a
    newline was reported as a server that cannot be reached (exit 5), an ``é`` as an
    unexpected ``UnicodeEncodeError``."""
    if len(value) > IDEMPOTENCY_KEY_MAX:
        raise argparse.ArgumentTypeError(
            f"has {len(value)} characters, more than the {IDEMPOTENCY_KEY_MAX} a key may have"
        )
    wrong = next((c for c in value if not " " <= c <= "~"), None)
    if wrong is not None:
        at = value.index(wrong) + 1
        raise argparse.ArgumentTypeError(
            f"character {at} is U+{ord(wrong):04X}; a key holds only printable ASCII "
            "characters (letters, digits, punctuation and space)"
        )
    return value


# --- submit and rerun ------------------------------------------------------------------------


def submit(session: Session) -> int:
    # A usage error, said before the code is packed, checked or uploaded.
    if session.args.dry_run and session.args.follow:
        raise CliError("--follow cannot follow a dry run: nothing is submitted", Exit.USAGE)
    loaded, spec = prepared(session)
    return _submitted(session, spec, loaded)


def prepared(session: Session) -> tuple[SpecFile, dict[str, Any]]:
    """The spec file of ``args.file`` (``-``: stdin) with the command line's overrides, and
    its code packed and uploaded (unless ``--no-code`` or the spec names its code). Before
    the upload, the spec is checked as the API checks it (``_spec_refused``)."""
    args = session.args

    def warn(message: str) -> None:
        note(f"warning: {message}")

    if str(args.file) == "-":  # the spec from stdin (a script that writes specs)
        loaded = load_stream(getattr(sys.stdin, "buffer", sys.stdin), "<stdin>", warn)
    else:
        loaded = load(args.file, warn)
    spec = _overridden(loaded.spec, args)
    if not args.no_code and "code" not in spec:
        here = Path.cwd() if str(args.file) == "-" else args.file.parent
        workdir = args.workdir if args.workdir is not None else here
        spec["code"] = upload_code(
            session.client,
            workdir,
            session.settings.bundle_max_bytes,
            check=lambda bundle: _checked(session, loaded, spec, workdir, bundle),
        )
    return loaded, spec


def _checked(
    session: Session, loaded: SpecFile, spec: dict[str, Any], workdir: Path, bundle: Bundle
) -> None:
    """What stops a submission before its code is uploaded: a script missing from the code
    (no request), then the API's errors of the spec."""
    _script_packed(loaded, spec, workdir, bundle)
    _spec_refused(session, loaded, spec)


_SETTLED_BY_CODE = ("code", "entrypoint")
"""The fields whose errors a job without its code may have only for want of it (a ``.py``
entrypoint runs from the code)."""


def _spec_refused(session: Session, loaded: SpecFile, spec: dict[str, Any]) -> None:
    """Raise the API's errors of the spec, on its lines, before its code is uploaded: a
    dry run of the job without its code (``POST /v1/jobs?dry_run=true``, which stores
    nothing), whose errors about the code itself are left to the submission. A typo in
    ``gpu_flavor`` was found only after the code had been packed and uploaded. Any other
    answer (the dry run refused for another reason, or accepted) goes on to the upload: the
    submission itself says what it has to."""
    try:
        session.client.submit_warned({k: v for k, v in spec.items() if k != "code"}, dry_run=True)
    except TrainyardError as exc:
        errors = [
            error
            for error in exc.errors or []
            if str(error.get("field", "")).split(".")[0].split("[")[0] not in _SETTLED_BY_CODE
        ]
        if exc.status == 422 and errors:
            raise explained(errors, loaded, session.args) from None


def _script_packed(loaded: SpecFile, spec: dict[str, Any], workdir: Path, bundle: Bundle) -> None:
    """Raise a ``SpecError`` on the entrypoint's line when it names a ``.py`` script the
    bundle lacks: such a job could only fail, once per restart, with "can't open file". A
    path the API refuses anyway (absolute, ``..``) is left to its reason, and a dotted module
    to the runner (the requirements may install it)."""
    script = spec.get("entrypoint")
    if not isinstance(script, str) or not script.endswith(".py") or script.startswith("/"):
        return
    if any(part in ("", ".", "..") for part in script.split("/")) or script in bundle.names:
        return
    folder = workdir.resolve()
    if (folder / script).is_file():
        why = (
            f"{script} is in {folder} but not packed: a .gitignore or .trainyardignore leaves "
            f"it out, or a folder never packed ({', '.join(ALWAYS_EXCLUDED)}) holds it"
        )
    else:
        why = f"no file {script} in the code packed from {folder}"
    raise loaded.explain([{"field": "entrypoint", "message": why}])


PLATFORM_SET = ("user", "team", "reproduces")
"""Fields of a job's stored spec that the platform sets, never a request (one given is a
422): a rerun leaves them out. The parent model's version id stays, a pin: the rerun
fine-tunes from that very version, or is refused naming ``parent_model_version_id``."""


def rerun(session: Session) -> int:
    """Submit the spec of an earlier job again (same code, with the overrides given); with
    ``--reproduce``, reproduce it (``reproduce``)."""
    args = session.args
    if getattr(args, "reproduce", False):
        return reproduce(session)
    if getattr(args, "dataset", None):
        raise CliError("--dataset goes with --reproduce", Exit.USAGE)
    client = session.client
    old = client.get_job(resolve(client, args.job))
    spec = {
        k: v
        for k, v in old["spec"].items()
        if k not in PLATFORM_SET and v is not None and v != "" and v != []
    }
    labels = dict(spec.get("labels") or {})
    if len(labels) < MAX_LABELS or RERUN_LABEL in labels:  # the lineage, where it fits
        labels[RERUN_LABEL] = old["id"]
    spec["labels"] = labels
    return _submitted(session, _overridden(spec, args), None, rerun_of=old["id"])


# --- reproduce ----------------------------------------------------------------------------

VERDICT_WAIT_SECONDS = 60.0
"""How long ``rerun --reproduce --follow`` waits, after the job ends, for the verdict."""


def reproduce(session: Session) -> int:
    """``rerun --reproduce JOB``: the submission service submits the job again with its
    resolved spec, code, dataset versions and seed, linked to it (``--set`` and
    ``--dataset`` change it on purpose); the registry judges the reproduction when it ends.
    With ``--follow`` the verdict is printed after the job ends."""
    args = session.args
    kept = [
        f"--{name}"
        for name in ("name", "project", "experiment", "label")
        if getattr(args, name, None)
    ]
    if kept:
        raise CliError(
            f"{', '.join(kept)}: a reproduction keeps the original's spec (only --set and "
            "--dataset change it)",
            Exit.USAGE,
        )
    client = session.client
    original = resolve(client, args.job)
    body: dict[str, Any] = {}
    if getattr(args, "set", None):
        body["hyperparameters"] = set_values(args.set)
    if getattr(args, "dataset", None):
        body["datasets"] = list(args.dataset)
    view = client.call("POST", f"/v1/jobs/{segment(original)}/reproduce", body)
    if not args.follow:
        if session.as_json:
            print(dumps(view))
            return Exit.OK
        print(
            f"submitted job {view['id']} ({view['name']}), a reproduction of {original}; "
            f"`trainyard reproduction {view['id']}` shows the verdict once it has ended",
            flush=True,
        )
        return Exit.OK
    if not session.as_json:
        print(
            f"submitted job {view['id']} ({view['name']}), a reproduction of {original}; following"
        )
    code = follow(session, view["id"], args.timeout)
    found = _verdict(session, view["id"], wait_s=VERDICT_WAIT_SECONDS)
    if session.as_json:
        print(dumps(found))
    else:
        print(render_verdict(found))
    return code


def reproduction(session: Session) -> int:
    """``trainyard reproduction JOB``: the registry's verdict on a reproduction."""
    job = resolve(session.client, session.args.job)
    found = _verdict(session, job, wait_s=0.0)
    print(dumps(found) if session.as_json else render_verdict(found))
    return Exit.OK


def _verdict(session: Session, job_id: str, wait_s: float) -> dict[str, Any]:
    registry = session.service("registry")
    deadline = time.monotonic() + wait_s
    while True:
        found: dict[str, Any] = registry.get(f"/v1/jobs/{segment(job_id)}/reproduction")
        if found.get("verdict") is not None or time.monotonic() >= deadline:
            return found
        time.sleep(1.0)


def render_verdict(found: dict[str, Any]) -> str:
    """The verdict as lines: what was reproduced, the verdict, every difference named, the
    metrics side by side and the weights."""
    verdict = found.get("verdict")
    lines = [f"reproduction {found['job_id']} of job {found['original_job_id']}"]
    if verdict is None:
        lines.append("verdict: not decided yet (the reproduction has not ended)")
        return "\n".join(lines)
    lines.append(f"verdict: {verdict}")
    for difference in found.get("differences") or []:
        lines.append(
            f"  differs: {difference['field']}: {_shown(difference['original'])} -> "
            f"{_shown(difference['reproduction'])}"
        )
    metrics = found.get("metrics") or {}
    if metrics:
        lines.append(f"metrics (relative tolerance {found.get('relative_tolerance')}):")
        for key, values in metrics.items():
            how = (
                "a measure of speed, not compared"
                if values.get("compared") is False
                else f"relative difference {_shown(values.get('relative_difference'))}"
            )
            lines.append(
                f"  {key}: {_shown(values.get('original'))} -> "
                f"{_shown(values.get('reproduction'))} ({how})"
            )
    weights = found.get("weights") or {}
    if weights.get("compared"):
        same = "equal" if weights.get("equal") else "not equal"
        lines.append(
            f"weights: {same} (sha256 {str(weights.get('original_sha256'))[:12]} -> "
            f"{str(weights.get('reproduction_sha256'))[:12]})"
        )
    else:
        lines.append("weights: not compared (a final checkpoint is missing)")
    return "\n".join(lines)


def _shown(value: Any) -> str:
    return "-" if value is None else value if isinstance(value, str) else json.dumps(value)


def _overridden(spec: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    spec = dict(spec)
    for name in ("name", "project", "experiment"):
        if getattr(args, name, None):
            spec[name] = getattr(args, name)
    if getattr(args, "label", None):
        spec["labels"] = {**(spec.get("labels") or {}), **dict(args.label)}
    if getattr(args, "set", None):
        values = set_values(args.set)
        known = spec.get("hyperparameters") or {}
        for key in values:
            meant = None if key in known or not known else closest(key, known)
            if meant is not None:
                # A new key a typo away from one the job has: the job would run with the
                # old value of the one meant, and nothing would say so.
                note(
                    f"warning: --set {key}: the spec has no hyper-parameter {key!r}; did you "
                    f"mean {meant!r}? (it is added as a new one)"
                )
        spec["hyperparameters"] = {**known, **values}
    return spec


def scalar(text: str) -> Any:
    """``--set lr=1e-3``: the value as a spec file reads a plain scalar (YAML 1.2's core
    schema, ``spec.plain_scalar``: a number, true/false, else the text; ``no``, ``on`` and
    dates stay strings), null as the text itself."""
    value = plain_scalar(text)
    return text if value is None else value


def set_values(pairs: list[tuple[str, str]]) -> dict[str, Any]:
    """The hyper-parameters of ``--set K=V`` options; a value that is a number but not a
    finite one (``1e999``, ``.inf``, ``.nan``: no JSON holds it) is a usage error."""
    values = {}
    for key, text in pairs:
        value = scalar(text)
        if isinstance(value, float) and not math.isfinite(value):
            raise CliError(f"--set {key}={text}: not a finite number", Exit.USAGE)
        if looks_secret(key):
            note(f"warning: --set {key}: {SECRET_WARNING}")
        values[key] = value
    return values


def _override_options(args: argparse.Namespace) -> dict[str, str]:
    """The spec's field paths the command line set (``_overridden``), each with its option:
    ``{"name": "--name", "labels.team": "--label team", "hyperparameters.lr": "--set lr"}``."""
    options = {name: f"--{name}" for name in ("name", "project", "experiment")}
    given = {field: option for field, option in options.items() if getattr(args, field, None)}
    given.update({f"labels.{k}": f"--label {k}" for k, _ in getattr(args, "label", None) or []})
    given.update(
        {f"hyperparameters.{k}": f"--set {k}" for k, _ in getattr(args, "set", None) or []}
    )
    return given


def explained(errors: list[dict[str, str]], loaded: SpecFile, args: argparse.Namespace) -> CliError:
    """The API's field errors of a submission: one about a value the command line set names
    its option (``--name: name: ...``); the rest stand on the spec file's lines."""
    options = _override_options(args)
    ours, theirs = [], []
    for error in errors:
        field = str(error.get("field", ""))
        message = str(error.get("message", ""))
        option = next(
            (
                o
                for f, o in options.items()
                if field == f
                or field.startswith((f"{f}.", f"{f}["))
                # A mapping's bad key is named on the mapping, the key in the message
                # (``labels``: "label key 'bad key' must be ..."): the option added it.
                or (f.startswith(f"{field}.") and repr(f[len(field) + 1 :]) in message)
            ),
            None,
        )
        if option is None:
            theirs.append(error)
        else:
            ours.append(f"{option}: {field}: {error.get('message', '')}")
    lines = ours + (str(loaded.explain(theirs)).splitlines() if theirs else [])
    return CliError("\n".join(lines))


def _submitted(
    session: Session, spec: dict[str, Any], loaded: SpecFile | None, rerun_of: str | None = None
) -> int:
    args = session.args
    client = session.client
    dry_run = bool(getattr(args, "dry_run", False))
    no_estimate = _say_estimate(session, spec)
    try:
        view, warning = client.submit_warned(
            spec, getattr(args, "idempotency_key", None), dry_run=dry_run
        )
    except TrainyardError as exc:
        if exc.status == 422 and exc.errors and loaded is not None:
            raise explained(exc.errors, loaded, args) from None
        raise
    if no_estimate:
        note(no_estimate)
    if warning:
        note(f"warning: {warning}")
    if dry_run:
        spec_of = view["spec"]
        session.emit(
            view,
            lambda: (
                f"the job would be accepted: {view['name']} ({spec_of['gpus']} x "
                f"{spec_of['gpu_flavor']}); nothing was submitted"
            ),
        )
        return Exit.OK
    if not args.follow:
        if session.as_json:
            print(dumps(view))
            return Exit.OK
        again = f" (rerun of {rerun_of})" if rerun_of else ""
        print(f"submitted job {view['id']} ({view['name']}){again}", flush=True)
        view = _first_look(client, view)
        waiting = _first_word(view)
        if waiting:
            print(waiting, flush=True)
        # A job the scheduler refused (it never ran) ends the command as `wait` would; one
        # that ran, however fast it ended, is the user's to `wait` for as before.
        refused = (view.get("failure") or {}).get("failure_kind") == "rejected"
        return ended(view) if refused else Exit.OK
    if not session.as_json:
        print(f"submitted job {view['id']} ({view['name']}); following (Ctrl-C stops following)")
    return follow(session, view["id"], args.timeout)


def _say_estimate(session: Session, spec: dict[str, Any]) -> str | None:
    """The most the job costs (billing's ``POST /v1/costs/estimate``), as a note on stderr,
    when a billing URL is configured. A failed estimate never stops the submission: its
    note is returned, for the caller to say once the API has accepted the job. Said at
    once, billing's refusal of a bad spec ("no cost estimate: 422 ... gpu_flavor") came
    just before the API's refusal of the same spec, the one problem said twice."""
    if not (session.settings.billing_url or getattr(session.context(), "billing_url", "")):
        return None
    try:
        cost = session.service("billing").call("POST", "/v1/costs/estimate", spec)
    except (TrainyardError, CliError) as exc:
        return f"no cost estimate: {exc}"
    note(
        f"estimated cost: at most {money(cost['estimated_cost'], cost['currency'])} "
        f"({cost['gpus']} x {cost['gpu_flavor']} for {cost['max_runtime_seconds']} s; "
        f"{money(cost['worst_case_cost'], cost['currency'])} if every restart is used)"
    )
    return None


def _first_look(client: TrainyardClient, view: dict[str, Any]) -> dict[str, Any]:
    """The job's view once the scheduler has seen it, or as it is after
    ``ESTIMATE_WAIT_SECONDS``."""
    deadline = time.monotonic() + ESTIMATE_WAIT_SECONDS
    while view["status"] == "QUEUED" and time.monotonic() < deadline:
        time.sleep(0.2)
        view = client.get_job(view["id"])
    return view


def _first_word(view: dict[str, Any]) -> str:
    """The job's status after its first look (its place and estimated start while it
    waits), or "" while it is still QUEUED."""
    if view.get("pending"):
        return f"{view['status']}: {pending_text(view['pending'])}"
    return "" if view["status"] == "QUEUED" else f"status: {view['status']}"


def upload_code(
    client: TrainyardClient,
    workdir: Path,
    max_bytes: int,
    check: Callable[[Bundle], None] | None = None,
) -> dict[str, Any]:
    """Pack ``workdir``, upload the bundle unless the team has it, and return the spec's
    ``code``; says what happened in one line on stderr. ``check`` sees the packed bundle
    first and raises to stop before anything is uploaded."""
    bundle = pack(workdir, max_bytes=max_bytes, warn=lambda m: note(f"warning: {m}"))
    try:
        if check is not None:
            check(bundle)
        uploaded = client.upload_bundle(bundle.path, bundle.sha256)
    finally:
        bundle.path.unlink(missing_ok=True)
    what = "uploaded" if uploaded else "already stored"
    note(f"code: {format_size(bundle.size_bytes)} bundle {bundle.sha256[:7]} ({what})")
    return {"kind": "bundle", "sha256": bundle.sha256, "size_bytes": bundle.size_bytes}


# --- following -------------------------------------------------------------------------------


def follow(session: Session, job_id: str, timeout_s: float) -> int:
    """Print the job's changes (status, metrics, checkpoints) and output until it ends;
    the exit code says how it ended."""
    client = session.client
    printer = FollowPrinter(quiet=session.as_json)
    output = None if session.as_json else LogFollower(client, job_id, best_effort=True)
    try:
        final = client.wait(
            job_id,
            timeout_s=timeout_s,
            on_change=printer,
            on_poll=None if output is None else lambda _: output.poll(),
        )
        if output is not None:
            output.run(follow=True)  # the output's last chunks
    except KeyboardInterrupt:
        raise _stopped("following", f"trainyard attach {job_id}") from None
    except TimeoutError as exc:
        raise _timed_out(exc, job_id) from None
    print(dumps(final) if session.as_json else "\n" + render_job(final))
    return ended(final)


def _stopped(doing: str, again: str) -> CliError:
    """Ctrl-C while a command follows or waits for a job (exit 130): only that stops, and
    the job goes on, which ``interrupted`` alone (or nothing, as ``logs -f`` said) left the
    user to guess; ``again``: the command that takes it up again."""
    return CliError(f"stopped {doing}; the job goes on: {again}", Exit.INTERRUPTED)


def _timed_out(exc: TimeoutError, job_id: str) -> CliError:
    """``--timeout`` ran out: only the waiting stops, which the message says."""
    return CliError(
        f"{exc}; it goes on: trainyard attach {job_id}, or trainyard cancel {job_id}",
        Exit.TIMEOUT,
    )


def ended(view: dict[str, Any]) -> int:
    """The exit code of a job's final view (one line on stderr unless it succeeded)."""
    code = FINAL_EXIT.get(view["status"], Exit.ERROR)
    if code != Exit.OK:
        print(
            f"trainyard: error: job {view['id']} ended {view['status']}{why(view)}",
            file=sys.stderr,
        )
    return code


def attach(session: Session) -> int:
    job_id = resolve(session.client, session.args.job)
    if not session.as_json:
        note(f"following job {job_id} (Ctrl-C stops following; the job goes on)")
    return follow(session, job_id, session.args.timeout)


def wait(session: Session) -> int:
    client = session.client
    job_id = resolve(client, session.args.job)
    try:
        final = client.wait(job_id, timeout_s=session.args.timeout)
    except KeyboardInterrupt:
        raise _stopped("waiting", f"trainyard wait {job_id}") from None
    except TimeoutError as exc:
        raise _timed_out(exc, job_id) from None
    session.emit(final, lambda: f"{final['id']}  {final['status']}{why(final)}")
    return ended(final)


class LogFollower:
    """Prints a job's output as it arrives (``GET /v1/jobs/{id}/logs``).

    Chunks go to ``out`` as they are; a ``==> attempt N on NODE <==`` line on ``err`` says
    whose output follows whenever the stream (attempt and node) changes. Following ends once the job has
    ended and all its streams are complete, or ``grace_s`` after the job ended (a runner
    that died never completes its streams). ``best_effort`` (for ``submit --follow``):
    an error reading the logs stops printing them instead of failing."""

    def __init__(
        self,
        client: TrainyardClient,
        job_id: str,
        *,
        as_json: bool = False,
        best_effort: bool = False,
        out: TextIO | None = None,
        err: TextIO | None = None,
        poll_s: float = LOG_POLL_SECONDS,
        grace_s: float = SETTLE_SECONDS,
        clock: Callable[[], float] | None = None,
        sleep: Callable[[float], None] | None = None,
    ) -> None:
        self._client = client
        self._job_id = job_id
        self._as_json = as_json
        self._best_effort = best_effort
        self._out = out
        self._err = err
        self._poll_s = poll_s
        self._grace_s = grace_s
        self._clock = clock or (lambda: time.monotonic())
        self._sleep = sleep or (lambda s: time.sleep(s))
        self.cursor = ""
        self.done = False
        self.printed = False
        """True once a chunk of output has been printed."""
        self.job_ended = False
        """True once the API said the job has ended."""
        self._stream: str | None = None
        self._open_line = False
        self._ended_at: float | None = None

    def run(self, follow: bool) -> None:
        """Print what there is; with ``follow``, poll until the job's output is complete."""
        while not self.poll() and follow:
            self._sleep(self._poll_s)

    def poll(self) -> bool:
        """Print every chunk available now; True once there will be no more."""
        if self.done:
            return True
        while True:
            try:
                page = self._client.logs(self._job_id, after=self.cursor)
            except TrainyardError:
                if not self._best_effort:
                    raise
                self.done = True  # e.g. a server without logs: follow the status only
                return True
            for chunk in page["chunks"]:
                self._print(chunk)
            self.cursor = page["cursor"]
            if not page["chunks"]:
                break
        if page["job_terminal"]:
            self.job_ended = True
            now = self._clock()
            self._ended_at = now if self._ended_at is None else self._ended_at
            if page["streams_complete"] or now - self._ended_at >= self._grace_s:
                self.done = True
        return self.done

    def _print(self, chunk: dict[str, Any]) -> None:
        self.printed = True
        out = self._out or sys.stdout
        if self._as_json:
            print(dumps_line(chunk), file=out, flush=True)
            return
        if chunk["stream"] != self._stream:
            if self._open_line:
                out.write("\n")
            out.flush()
            print(
                f"==> {stream_text(chunk['stream'])} <==", file=self._err or sys.stderr, flush=True
            )
            self._stream = chunk["stream"]
        text = chunk["text"]
        if text:
            out.write(text)
            out.flush()
            self._open_line = not text.endswith("\n")


def dumps_line(value: object) -> str:
    return json.dumps(value, sort_keys=True)


def logs(session: Session) -> int:
    client = session.client
    job_id = resolve(client, session.args.job)
    follower = LogFollower(client, job_id, as_json=session.as_json)
    try:
        follower.run(follow=session.args.follow)
    except KeyboardInterrupt:
        if not session.args.follow:
            raise
        raise _stopped("following its output", f"trainyard logs {job_id} -f") from None
    if not follower.printed and not session.as_json:
        # Empty stdout alone cannot be told from a command that did nothing.
        note(
            f"job {job_id} printed no output"
            if follower.job_ended
            else f"no output from job {job_id} yet; trainyard logs {job_id} -f follows it"
        )
    return Exit.OK


# --- reading ---------------------------------------------------------------------------------


def ls(session: Session) -> int:
    args = session.args
    client = session.client
    user, team, all_teams = args.user, args.team, args.all_teams
    if args.mine:
        # A user's name is its team's alone: every team's jobs of that name would list
        # other teams' users of the same name as the caller's own jobs.
        me = client.whoami()
        if team and team != me["team"]:
            raise CliError(f"--mine: your jobs are team {me['team']}'s, not {team}'s", Exit.USAGE)
        user, team, all_teams = me["user"], me["team"], False
    filters = {
        "status": args.status,
        "user": user,
        "project": args.project,
        "experiment": args.experiment,
        "label": "=".join(args.label) if args.label else None,
        "team": team,
        "all_teams": "true" if all_teams else None,
    }
    jobs: list[dict[str, Any]] = []
    cursor = args.after
    while True:
        size = LIST_PAGE_MAX if args.all else args.limit - len(jobs)
        page, cursor = _page(session, size, cursor, filters)
        # A server that does not know a filter ignores it: hold every row to it here too.
        jobs += [j for j in page if all(_matches(j, k, v) for k, v in filters.items())]
        if not cursor or not page or (len(jobs) >= args.limit and not args.all):
            break
    session.emit(jobs, lambda: render_list(jobs, with_team=args.all_teams))
    if cursor and not session.as_json and not args.all:
        note(f"more jobs: {_next_page_command(args, cursor)}")
    return Exit.OK


def _page(
    session: Session, size: int, cursor: str | None, filters: dict[str, str | None]
) -> tuple[list[dict[str, Any]], str | None]:
    """A page of ``ls``; the API's refusal of ``--all-teams`` (403) or of ``--team`` (404:
    the API answers a team the caller may not list as one that does not exist) names the
    option, so that a caller who is no operator sees which of its options was refused."""
    args = session.args
    try:
        return session.client.list_page(limit=size, after=cursor, **filters)
    except TrainyardError as exc:
        if args.all_teams and exc.status == 403:
            raise refused(f"--all-teams: {exc}", exc) from None
        if args.team and exc.status == 404:
            raise refused(
                f"--team {args.team}: {exc} (another team's jobs are listed by operators only)",
                exc,
            ) from None
        raise


def _next_page_command(args: argparse.Namespace, cursor: str) -> str:
    """The ``ls`` that lists the page after ``cursor`` of the same list: the cursor holds a
    place, not the filters, so they are repeated (without them it lists every job)."""
    words = ["trainyard", "ls"]
    if args.status:
        words += ["--status", args.status.lower()]
    if args.mine:
        words.append("--mine")
    for option in ("user", "project", "experiment", "team"):
        if getattr(args, option):
            words += [f"--{option}", getattr(args, option)]
    if args.label:
        words += ["--label", "=".join(args.label)]
    if args.all_teams:
        words.append("--all-teams")
    if args.limit != LS_LIMIT:
        words += ["--limit", str(args.limit)]
    return shlex.join([*words, "--after", cursor])


def _matches(job: dict[str, Any], key: str, wanted: str | None) -> bool:
    if not wanted or key not in job:
        return True
    return bool(job[key] == wanted)


def get(session: Session) -> int:
    client = session.client
    views = [client.get_job(resolve(client, ref)) for ref in session.args.jobs]
    session.emit(
        views[0] if len(views) == 1 else views,
        lambda: table(LIST_HEADER, [list_row(_summary(v)) for v in views]),
    )
    return Exit.OK


def _summary(view: dict[str, Any]) -> dict[str, Any]:
    """A job view as a line of ``GET /v1/jobs``, its reason chosen as that line's is."""
    spec = view["spec"]
    return {
        **view,
        "gpus": spec.get("gpus"),
        "gpu_flavor": spec.get("gpu_flavor"),
        "cost": view["cost"]["cost"],
        "currency": view["cost"].get("currency"),
        "reason": summary_reason(view),
    }


def describe(session: Session) -> int:
    client = session.client
    view = client.get_job(resolve(client, session.args.job))
    session.emit_tagged(view, lambda: render_job(view))
    return Exit.OK


def cancel(session: Session) -> int:
    """Cancel every JOB named. Each is resolved first, so a prefix that names no job (or
    several) cancels none; then each is asked for, and one the API refuses does not keep
    the rest from being cancelled: those are reported, then the refusals, one line each,
    with the exit code of the first. It stopped at the first refusal and printed nothing,
    so a user did not learn that the jobs before it had been cancelled."""
    client = session.client
    conditions = if_match(session.args)
    if conditions and len(session.args.jobs) > 1:  # an ETag is of one job
        raise CliError("--if-match takes one JOB: the ETag `describe` printed for it", Exit.USAGE)
    ids = [resolve(client, ref) for ref in session.args.jobs]
    if conditions:
        job_id = ids[0]
        view = conditional(
            "submission",
            lambda: _cancelled(client, job_id, conditions),
            f"trainyard describe {job_id}",
        )
        session.emit(view, lambda: _cancel_text(view))
        return Exit.OK
    views, refused = [], []
    for job_id in ids:
        try:
            views.append(_cancelled(client, job_id))
        except TrainyardError as exc:
            if len(ids) == 1:
                raise
            refused.append((job_id, exc))
    if views:
        session.emit(
            views[0] if len(ids) == 1 else views,
            lambda: "\n".join(_cancel_text(v) for v in views),
        )
    if refused:
        lines = [_refusal_text(job_id, exc) for job_id, exc in refused]
        raise CliError("\n".join(lines), exit_code_of(refused[0][1]))
    return Exit.OK


def _cancelled(
    client: TrainyardClient, job_id: str, conditions: dict[str, str] | None = None
) -> dict[str, Any]:
    """``client.cancel``'s view, its 409 said once: the API's detail (``job J has already
    ended (SUCCEEDED)``) with its one field error (``job_id: the job has already ended
    (SUCCEEDED): there is nothing to cancel``) read as the same reason twice; any other
    field error is kept."""
    try:
        return client.cancel(job_id, conditions)
    except TrainyardError as exc:
        if exc.status != 409:
            raise
        others = [e for e in exc.errors if e.get("field") != "job_id"]
        raise TrainyardError(exc.status, exc.message, others, exc.retry_after) from None


_NOT_STARTED = ("QUEUED", "PENDING", "PREEMPTED")
"""Statuses of a job that holds no GPUs: the scheduler cancels it as soon as it reads the
request, with no runner to wait for."""


def _cancel_text(view: dict[str, Any]) -> str:
    """What a cancel does to the job of ``view`` (the API's answer, written before the
    scheduler acts on it: its status is the one the job had). "(status now PENDING)" read
    as if the job stayed pending, although a waiting job ends CANCELLED at once."""
    job_id, status = view["id"], view["status"]
    if view.get("terminal") or status in ("SUCCEEDED", "FAILED", "CANCELLED"):
        return f"job {job_id} has already ended ({status})"
    if status in _NOT_STARTED:
        again = " again" if status == "PREEMPTED" else ""
        return f"job {job_id} is cancelled before it starts{again} (it was {status})"
    return (
        f"cancellation requested for job {job_id}: it was {status} and ends CANCELLED once "
        f"its runner has stopped it (`trainyard wait {job_id}` waits for that)"
    )


def _refusal_text(job_id: str, exc: TrainyardError) -> str:
    """A refused cancel as one line that names the job once: the API's reason names it
    already ("409 job j-1 has already ended"), where it does."""
    reason = str(exc)
    return (
        f"not cancelled: {reason}"
        if job_id in reason
        else f"job {job_id} was not cancelled: {reason}"
    )


QUEUE_HEADER = (
    "POS",
    "ID",
    "NAME",
    "USER",
    "GPUS",
    "STATUS",
    "WAITING SINCE",
    "EST. START",
    "REASON",
)


NO_WAITING = none_yet(
    "no job of your team waits",
    "trainyard ls shows the others; trainyard submit SPEC",
    "submits one",
)


def queue(session: Session) -> int:
    """The team's waiting jobs in the scheduler's order, with why each waits."""
    client = session.client
    waiting: list[dict[str, Any]] = []
    for status in ("PENDING", "QUEUED", "PREEMPTED"):
        page, _ = client.list_page(limit=session.args.limit, status=status)
        waiting += [client.get_job(j["id"]) for j in page]
    waiting.sort(
        key=lambda v: ((v.get("pending") or {}).get("position") or 10**9, v["submitted_at"])
    )
    rows = []
    for view in waiting:
        pending = view.get("pending") or {}
        spec = view["spec"]
        rows.append(
            (
                pending.get("position") or "-",
                view["id"][:8],
                view["name"],
                view["user"],
                f"{spec['gpus']}x{spec['gpu_flavor']}",
                view["status"],
                time_text(view["submitted_at"]),
                time_text(pending.get("estimated_start")),
                waiting_reason(pending),
            )
        )
    session.emit(waiting, lambda: table(QUEUE_HEADER, rows, empty=NO_WAITING))
    return Exit.OK
