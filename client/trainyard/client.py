"""A small synchronous client of the Trainyard submission API.

Contract:
- Every call sends ``Authorization: Bearer <token>`` and the current W3C trace context
  (``traceparent``), so a job's trace starts at the caller's span when there is one.
- A response other than 2xx raises ``TrainyardError(status, message, errors)``; ``errors`` is
  the server's list of ``{"field", "message"}`` for invalid input. A server that cannot be
  reached raises ``TrainyardError`` with status 0. An error answer that is not a Trainyard
  API's JSON error (an HTML page, an empty body, JSON without a string ``detail``) names the
  request and what came back (``refusal``); the server's texts are made safe to print.
  A server that takes a request and does not answer it in time raises status 0 too,
  naming the request and the time waited, and for a request that changes something, that
  it may have been done all the same.
- A 2xx answer that is not what its route answers raises ``MalformedAnswer`` (a
  ``TrainyardError`` with the answer's status), naming the request and what was wrong: not
  JSON (or nested too deeply to read), a list where an object belongs, a key it lacks when the caller reads it (every JSON
  object of an answer is an ``Answer``, whose missing key raises it rather than
  ``KeyError``), a page whose rows are no list or whose ``next`` is no cursor, or a value
  of another type than the route answers at any depth, named by where it is
  (``rows[3].cost: expected a number, got "abc"``; the shapes are in ``trainyard.answers``).
- ``wait`` polls a job until it has ended and its results have settled (see ``wait``).
- ``upload_bundle`` uploads a code bundle only when the team has not stored it yet: the
  bundle's sha256 names it, so an identical bundle is uploaded once.
"""

from __future__ import annotations

import email.utils
import json
import re
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx

from trainyard.answers import answer_problem
from trainyard.tracing import inject

TERMINAL = frozenset({"SUCCEEDED", "FAILED", "CANCELLED"})
SETTLE_SECONDS = 10.0
"""After a job ends, how long ``wait`` waits for its model and final cost to arrive."""
REQUEST_TIMEOUT_S = 30.0
"""How long a request may wait for each step of its answer. Longer than the services take to
give up on a database that does not answer (a statement's 10 s and a connection's 5 s by
default, ``TRAINYARD_DATABASE_*_TIMEOUT_SECONDS``), so the user reads their 503 naming the
database rather than a timeout of this client's own. Two transfers have longer ones:
``UPLOAD_TIMEOUT`` and ``DOWNLOAD_TIMEOUT`` (docs/cli.md, "Exit codes")."""
UPLOAD_TIMEOUT = httpx.Timeout(600.0, connect=10.0)
"""A code bundle's upload (``upload_bundle``, as ``submit`` packs one) may take minutes on
a slow link: 600 s for each step of it, 10 s to connect."""
BUDGET_WARNING_HEADER = "Trainyard-Budget-Warning"
"""What ``POST /v1/jobs`` says of a job a spent budget let in (docs/billing.md, "Budgets")."""
LIST_PAGE_MAX = 500
"""The most jobs ``GET /v1/jobs`` gives in one page (its ``limit`` is at most 500)."""
AUDIT_PAGE_MAX = 1000
"""The most entries ``GET /v1/audit`` gives in one page (its ``limit`` is at most 1000)."""
MAX_TOKEN_LENGTH = 1024
"""The longest bearer credential a Trainyard API accepts (a user token is 46 characters)."""
_TOKEN68 = re.compile(r"[A-Za-z0-9\-._~+/]+=*")
"""RFC 6750's ``b64token``: the only characters a bearer credential may hold."""


def token_problem(token: str) -> str | None:
    """Why no Trainyard API would accept ``token`` as a bearer credential (RFC 6750's
    ``b64token``: ASCII letters, digits and ``-._~+/``, then ``=`` padding; at most
    ``MAX_TOKEN_LENGTH`` characters), or None. The reason never quotes the token: at most
    the position and code point of its first wrong character."""
    if len(token) > MAX_TOKEN_LENGTH:
        return f"it has {len(token)} characters, more than a token's {MAX_TOKEN_LENGTH}"
    if _TOKEN68.fullmatch(token):
        return None
    allowed = _TOKEN68.match(token)
    at = allowed.end() if allowed else 0
    if at == len(token):
        return "it is empty"
    what = "a space" if token[at] == " " else f"U+{ord(token[at]):04X}"
    return (
        f"character {at + 1} is {what}; a token holds only ASCII letters, digits and "
        "-._~+/, then = padding"
    )


class TrainyardError(Exception):
    """The API refused a request (or could not be reached: ``status`` 0)."""

    def __init__(
        self,
        status: int,
        message: str,
        errors: list[dict[str, str]] | None = None,
        retry_after: float | None = None,
    ) -> None:
        self.status = status
        self.message = message
        self.errors = list(errors or [])
        self.retry_after = retry_after
        """Seconds the server asked the caller to wait before trying again (its
        ``Retry-After``, on a 429 or 503), None when it said nothing usable."""
        self.service: str | None = None
        """The name of the API that refused (``TrainyardClient.service``), which the CLI
        says before the error (``registry: 409 ...``); None for the submission API's own."""
        super().__init__(str(self))

    def __str__(self) -> str:
        """``STATUS detail (field: message; ...)``, each reason said once: a field error
        whose message the detail already holds (the same words, or the detail names the
        field too: ``shared.http_errors.NameTaken``) is left out, and one whose message
        holds the detail and says more (``X is in use by Y: nothing changed``) is said in
        its place. Every command's refusal of an API reads this, so none says a reason
        twice."""
        detail, fields = self.message, []
        for error in self.errors:
            message = str(error.get("message") or "")
            if message and message in detail:
                continue
            if message and detail and detail in message and detail == self.message:
                detail = message  # once only: another field error may hold the detail too
                continue
            fields.append(f"{error.get('field', '?')}: {message or '?'}")
        head = f"{self.status} {detail}" if self.status else detail
        return f"{head} ({'; '.join(fields)})" if fields else head


class NoAnswer(TrainyardError):
    """A request the server took and did not answer in time (status 0, as any request that
    got no answer): it may have been done all the same, so only a request under an
    ``Idempotency-Key`` is safe to send again as it was. ``unanswered`` is what happened
    alone, without the advice to look before repeating the request that the message adds
    for one that changes something: a caller that sends it again by itself under its key
    says that instead."""

    def __init__(self, unanswered: str, advice: str | None = None) -> None:
        self.unanswered = unanswered
        super().__init__(0, unanswered if advice is None else f"{unanswered}; {advice}")


class MalformedAnswer(TrainyardError):
    """A successful (2xx) answer that is not what its route answers: the server's fault, or
    that of what stands between, not the caller's. ``status`` is the answer's, so it is
    never taken for an unreachable server (status 0)."""

    def __init__(self, response: httpx.Response, problem: str) -> None:
        super().__init__(
            response.status_code, f"unexpected answer to {_request_of(response)}: {problem}"
        )

    def __str__(self) -> str:
        return self.message


class Answer(dict[str, Any]):
    """A JSON object of a successful answer: reading a key it lacks (``answer["models"]``)
    raises ``MalformedAnswer`` naming the request and the key, where a plain dict raised a
    bare ``KeyError``; ``get`` answers its default as ever."""

    response: httpx.Response | None = None

    def __missing__(self, key: object) -> Any:
        if self.response is None:
            raise KeyError(key)
        raise MalformedAnswer(self.response, f"it has no {key!r}")


class AnswerList(list[Any]):
    """A JSON list of a successful answer: reading it by a key, as if it were an object,
    raises ``MalformedAnswer`` saying so, not ``TypeError``."""

    response: httpx.Response | None = None

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, str) and self.response is not None:
            raise MalformedAnswer(self.response, f"a list where an object with {index!r} belongs")
        return super().__getitem__(index)


class TrainyardClient:
    """The submission API at ``base_url`` (e.g. ``http://127.0.0.1:8080``) as ``token``."""

    def __init__(
        self,
        base_url: str,
        token: str,
        timeout: float = REQUEST_TIMEOUT_S,
        *,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self._http = httpx.Client(
            base_url=base_url.rstrip("/"),
            headers={"Authorization": f"Bearer {token}", "Accept": "application/json"},
            timeout=timeout,
            transport=transport,
        )
        self.service: str | None = None
        """The name of the API at ``base_url`` when it is not the submission API's
        (``registry``, ``billing``, ``scheduler``): every refusal and unanswered request of
        this client carries it (``TrainyardError.service``)."""

    def __enter__(self) -> TrainyardClient:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    def submit(self, spec: dict[str, Any], idempotency_key: str | None = None) -> dict[str, Any]:
        """Submit a job spec; return the job view. With ``idempotency_key``, submitting the
        same spec again returns the job created the first time."""
        return self.submit_warned(spec, idempotency_key)[0]

    def submit_warned(
        self, spec: dict[str, Any], idempotency_key: str | None = None, dry_run: bool = False
    ) -> tuple[dict[str, Any], str | None]:
        """``submit``, with the server's warning about the job (``Trainyard-Budget-Warning``:
        a spent budget let it in, perhaps at a lower priority than it asked), or None. With
        ``dry_run`` the server checks the job as it checks a submission and stores nothing
        (``POST /v1/jobs?dry_run=true``): the view is of the job as it would be, under an id
        no job has (a used ``idempotency_key``'s: that job), or the refusal is raised."""
        headers = {"Idempotency-Key": idempotency_key} if idempotency_key else {}
        params = {"dry_run": "true"} if dry_run else {}
        response = self._response("POST", "/v1/jobs", headers, json=spec, params=params)
        return _object(response), response.headers.get(BUDGET_WARNING_HEADER) or None

    def get_job(self, job_id: str) -> dict[str, Any]:
        """The job's view; one without a status (a string) is a ``MalformedAnswer``: every
        command that polls a job waits for its status, and would wait for one forever."""
        view = self._object("GET", f"/v1/jobs/{segment(job_id)}")
        if not isinstance(view.get("status"), str) and view.response is not None:
            raise MalformedAnswer(view.response, "a job view without a status")
        return view

    def list_page(
        self, limit: int = 50, after: str | None = None, **filters: str | None
    ) -> tuple[list[dict[str, Any]], str | None]:
        """One page of the team's jobs, newest first, and the cursor of the next (None: no
        more). ``filters``: ``status``, ``id_prefix``, ... as ``GET /v1/jobs`` takes them."""
        params: dict[str, str | int] = {"limit": min(limit, LIST_PAGE_MAX)}
        params.update({k: v for k, v in filters.items() if v})
        if after:
            params["after"] = after
        response = self._response("GET", "/v1/jobs", params=params)
        page = _json(response)
        if not isinstance(page, list):
            raise MalformedAnswer(response, "not a list of jobs")
        cursor = httpx.URL(response.links.get("next", {}).get("url", "")).params.get("after")
        if cursor and cursor == after:
            raise MalformedAnswer(response, f"its next page is the one just read ({cursor!r})")
        return page, cursor or None

    def get(self, path: str, **params: str | int | None) -> dict[str, Any]:
        """The JSON object that answers ``GET path`` (any endpoint of this base URL whose
        answer is an object; anything else: ``MalformedAnswer``)."""
        query = {k: v for k, v in params.items() if v is not None}
        return self._object("GET", path, params=query)

    def get_every(self, path: str, field: str, **params: str | int | None) -> dict[str, Any]:
        """The answer of a paged list ``path`` (the registry's and billing's: rows in
        ``field``, the cursor of the next page in ``next``) with every page's rows in
        ``field``, following ``next`` as ``after`` to the last page. A page that is no
        object, whose ``field`` is no list, or whose ``next`` is neither null nor a new
        cursor raises ``MalformedAnswer``."""
        query = {k: v for k, v in params.items() if v is not None}
        rows: list[Any] = []
        after: str | None = None
        while True:
            response = self._response("GET", path, params={**query, **_after(after)})
            answer = _object(response)
            page, following = answer[field], answer.get("next")
            if not isinstance(page, list):
                raise MalformedAnswer(response, f"{field!r} is not a list")
            if following is not None and (not isinstance(following, str) or following == after):
                raise MalformedAnswer(
                    response, f"'next' is not the cursor of a next page: {following!r}"
                )
            rows.extend(page)
            if not following:
                return amended(answer, **{field: _listed(response, rows), "next": None})
            after = following

    def call(
        self, method: str, path: str, body: Any = None, headers: dict[str, str] | None = None
    ) -> dict[str, Any]:
        """The JSON object that answers ``method path`` (with a JSON ``body`` and
        ``headers``), for any endpoint whose answer is an object (anything else:
        ``MalformedAnswer``)."""
        kwargs = {} if body is None else {"json": body}
        return _object(self._response(method, path, headers, **kwargs))

    def get_all(self, path: str, **params: str | int | None) -> list[dict[str, Any]]:
        """Every row of the plain-list route ``path`` (the scheduler's admin lists, billing's
        prices), page after page as its ``Link: <...>; rel="next"`` header leads."""
        query = {k: v for k, v in params.items() if v is not None}
        return self._list("GET", path, params=query)

    def get_pages(self, path: str, **params: str | int | None) -> Iterator[list[Any]]:
        """The pages of the plain-list route ``path`` (a queue's waiting jobs), one request
        each as the caller reads on: a caller that has what it needs stops the reading."""
        query = {k: v for k, v in params.items() if v is not None}
        return self._pages("GET", path, params=query)

    def get_list(self, path: str, **params: str | int | None) -> list[Any]:
        """The JSON list that answers ``GET path``, one answer (no pages), with its response
        (its ``ETag``); anything else: ``MalformedAnswer``."""
        query = {k: v for k, v in params.items() if v is not None}
        response = self._response("GET", path, None, params=query)
        body = _json(response)
        if not isinstance(body, list):
            raise MalformedAnswer(response, "not a JSON list")
        return body

    def delete(self, path: str, headers: dict[str, str] | None = None) -> None:
        """``DELETE path`` (with ``headers``), whose success answers nothing (204); a body it
        has anyway must be JSON (``MalformedAnswer`` else: a proxy's page, JSON nested too
        deeply)."""
        response = self._response("DELETE", path, headers)
        if response.content:
            _json(response)

    def list_jobs(self, status: str | None = None, limit: int = 50) -> list[dict[str, Any]]:
        """The team's newest ``limit`` jobs, newest first (optionally only those in
        ``status``). The server gives at most ``LIST_PAGE_MAX`` a request; more are fetched
        page by page, following its cursor (``Link: <...>; rel="next"``)."""
        jobs: list[dict[str, Any]] = []
        after: str | None = None
        while len(jobs) < limit:
            page, after = self.list_page(limit - len(jobs), after, status=status)
            jobs.extend(page)
            if not after or not page:
                break
        return jobs

    def cancel(self, job_id: str, headers: dict[str, str] | None = None) -> dict[str, Any]:
        """Ask for the job to be cancelled (with ``headers``: ``If-Match``); return its view
        (status changes when the scheduler confirms)."""
        return _object(self._response("POST", f"/v1/jobs/{segment(job_id)}/cancel", headers))

    def logs(self, job_id: str, after: str = "", limit: int | None = None) -> dict[str, Any]:
        """One page of the job's output after the cursor ``after`` (``""``: from the start):
        ``{"chunks": [{"stream", "seq", "text"}], "cursor", "streams_complete",
        "job_terminal"}``."""
        params: dict[str, str | int] = {"after": after}
        if limit is not None:
            params["limit"] = limit
        response = self._response("GET", f"/v1/jobs/{segment(job_id)}/logs", params=params)
        page = _object(response)
        if not isinstance(page["chunks"], list):
            raise MalformedAnswer(response, "'chunks' is not a list")
        if page["chunks"] and page["cursor"] == after:
            # Output after ``after`` whose cursor is ``after`` again: asked for, it would
            # come again, for ever.
            raise MalformedAnswer(response, f"its chunks end at the cursor asked for ({after!r})")
        return page

    # --- who: the caller, tokens, users, the audit log -----------------------------------

    def whoami(self) -> dict[str, Any]:
        """The user, team and role of this client's token, and the token's id and expiry."""
        return self._object("GET", "/v1/me")

    def tokens(self, user: str | None = None, team: str | None = None) -> list[dict[str, Any]]:
        """Tokens (never their secrets) of ``user`` (default: this client's user)."""
        params = {k: v for k, v in (("user", user), ("team", team)) if v}
        return self._list("GET", "/v1/tokens", params=params)

    def create_token(
        self, name: str | None = None, days: int | None = None, idempotency_key: str | None = None
    ) -> dict[str, Any]:
        """A new token for this client's user; the secret is in ``token``, shown once. With
        ``idempotency_key``, a request the server already made a token for answers that
        token with ``token`` None: its secret is not kept (docs/security.md, "Tokens")."""
        headers = {"Idempotency-Key": idempotency_key} if idempotency_key else {}
        return self.call("POST", "/v1/tokens", _token_body(name, days), headers)

    def rotate_token(
        self, name: str | None = None, days: int | None = None, idempotency_key: str | None = None
    ) -> dict[str, Any]:
        """Replace this client's token: a new one (``token``) and the old one revoked. With
        ``idempotency_key``, the retry of a rotation the server already made (presenting the
        token it revoked) answers the new token with a new secret, the lost one dead, or
        ``token`` None should that token be revoked or expired since (docs/security.md,
        "Tokens")."""
        headers = {"Idempotency-Key": idempotency_key} if idempotency_key else {}
        return self.call("POST", "/v1/tokens/rotate", _token_body(name, days), headers)

    def revoke_token(self, token_id: int) -> None:
        self._response("DELETE", f"/v1/tokens/{int(token_id)}")

    def users(self, team: str | None = None) -> list[dict[str, Any]]:
        return self._list("GET", "/v1/admin/users", params={"team": team} if team else {})

    def create_user(self, name: str, role: str, team: str | None = None) -> dict[str, Any]:
        body = {"name": name, "role": role, **({"team": team} if team else {})}
        return self._object("POST", "/v1/admin/users", json=body)

    def user(self, name: str, team: str | None = None) -> dict[str, Any]:
        """The user (with its ``ETag``, for ``If-Match`` on ``change_role`` and
        ``disable_user``)."""
        params = {"team": team} if team else {}
        return self._object("GET", f"/v1/admin/users/{segment(name)}", params=params)

    def change_role(
        self,
        name: str,
        role: str,
        team: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> dict[str, Any]:
        params = {"team": team} if team else {}
        path = f"/v1/admin/users/{segment(name)}"
        return _object(self._response("PATCH", path, headers, json={"role": role}, params=params))

    def disable_user(
        self, name: str, team: str | None = None, headers: dict[str, str] | None = None
    ) -> None:
        params = {"team": team} if team else {}
        self._response("DELETE", f"/v1/admin/users/{segment(name)}", headers, params=params)

    def audit(
        self,
        before: int | None = None,
        limit: int | None = 100,
        since: str | None = None,
        until: str | None = None,
    ) -> list[dict[str, Any]]:
        """The newest ``limit`` entries of the audit log (every one when None), below the id
        ``before``, written at or after ``since`` and before ``until`` (RFC 3339 times, the
        server checks them), page after page as the server gives them (at most 1000 a page)."""
        params: dict[str, int | str] = {
            "limit": AUDIT_PAGE_MAX if limit is None else min(limit, AUDIT_PAGE_MAX),
            **({"before": before} if before else {}),
            **({"since": since} if since else {}),
            **({"until": until} if until else {}),
        }
        return self._list("GET", "/v1/audit", params=params, most=limit)

    def audit_export(
        self, before: int | None = None, since: str | None = None, until: str | None = None
    ) -> Iterator[str]:
        """Every entry of the audit log below the id ``before``, written at or after ``since``
        and before ``until``, oldest first: each the line of JSON the service sent
        (``GET /v1/audit`` with ``Accept: application/x-ndjson``), read as it streams, so no
        window is held in memory. A refusal raises as every request's does; an answer that
        is no NDJSON (a service older than this client answers a JSON page), a line that is
        no JSON object, and a transfer that breaks off (the service lost its database
        mid-export) raise too, so a short export never passes for a whole one."""
        params: dict[str, int | str] = {
            **({"before": before} if before else {}),
            **({"since": since} if since else {}),
            **({"until": until} if until else {}),
        }
        headers = inject({"Accept": AUDIT_NDJSON})
        try:
            with self._http.stream("GET", "/v1/audit", params=params, headers=headers) as answer:
                if not answer.is_success:
                    answer.read()
                    raise refusal(answer)
                if answer.headers.get("Content-Type", "").split(";")[0].strip() != AUDIT_NDJSON:
                    answer.read()
                    raise MalformedAnswer(
                        answer, "not an NDJSON export (the service may be older than this client)"
                    )
                for line in answer.iter_lines():
                    if not line:
                        continue
                    if not isinstance(_parsed(line), dict):
                        raise MalformedAnswer(answer, "a line of the export is no JSON object")
                    yield line
        except httpx.HTTPError as exc:
            raise TrainyardError(
                0, f"the audit export from {self._http.base_url} broke off: {exc}"
            ) from exc

    def bundle_stored(self, sha256: str) -> bool:
        """Whether the caller's team has uploaded the bundle ``sha256``."""
        path = f"/v1/bundles/{segment(sha256)}"
        try:
            response = self._http.request("HEAD", path, headers=inject(None))
        except httpx.HTTPError as exc:
            raise self._no_answer("HEAD", path, exc) from exc
        if response.status_code in (200, 404):
            return response.status_code == 200
        raise refusal(response)

    def upload_bundle(self, path: Path, sha256: str) -> bool:
        """Upload the bundle at ``path`` (whose sha256 is ``sha256``) unless the team has it
        already; True when it was uploaded, False when it was already stored."""
        if self.bundle_stored(sha256):
            return False
        with path.open("rb") as body:
            self._request(
                "PUT",
                f"/v1/bundles/{segment(sha256)}",
                content=body,
                headers={"Content-Type": "application/gzip"},
                timeout=UPLOAD_TIMEOUT,
            )
        return True

    def wait(
        self,
        job_id: str,
        timeout_s: float,
        on_change: Callable[[dict[str, Any]], None] | None = None,
        poll_s: float = 0.5,
        on_poll: Callable[[dict[str, Any]], object] | None = None,
    ) -> dict[str, Any]:
        """Poll until the job has ended, and return its view.

        A job's results arrive after it ends: the model from the registry (for SUCCEEDED,
        when its spec asked for one) and the cost from billing. ``wait`` therefore keeps polling an ended job until
        its cost is final and, for SUCCEEDED, its model is there, or until
        ``SETTLE_SECONDS`` have passed since it ended (or ``timeout_s`` runs out), and
        then returns the view as it is.

        ``on_change`` is called with the view each time it differs from the last one seen
        (status, metrics, checkpoints, ...), then ``on_poll`` with every view. Raises
        ``TimeoutError`` naming the last status when the job has not ended within
        ``timeout_s``.
        """
        deadline = time.monotonic() + timeout_s
        ended_at: float | None = None
        last: dict[str, Any] | None = None
        while True:
            view = self.get_job(job_id)
            if view != last and on_change is not None:
                on_change(view)
            if on_poll is not None:
                on_poll(view)
            last = view
            now = time.monotonic()
            if view.get("status") in TERMINAL:
                ended_at = ended_at if ended_at is not None else now
                if _settled(view) or now - ended_at >= SETTLE_SECONDS or now >= deadline:
                    return view
            elif now >= deadline:
                raise TimeoutError(
                    f"job {job_id} did not finish within {timeout_s:g}s "
                    f"(last status: {view.get('status')})"
                )
            time.sleep(min(poll_s, max(deadline - now, 0.0)))

    def _object(self, method: str, path: str, **kwargs: Any) -> Answer:
        return _object(self._response(method, path, None, **kwargs))

    def _list(
        self, method: str, path: str, most: int | None = None, **kwargs: Any
    ) -> list[dict[str, Any]]:
        """Every row of a list route whose body is a plain list (the first ``most`` when
        given), following its ``Link: <...>; rel="next"`` header page after page."""
        rows: list[dict[str, Any]] = []
        for page in self._pages(method, path, **kwargs):
            rows.extend(page)
            if most is not None and len(rows) >= most:
                return rows[:most]
        return rows

    def _pages(self, method: str, path: str, **kwargs: Any) -> Iterator[list[Any]]:
        """The pages of a list route whose body is a plain list, one request each as the
        caller asks for the next, following its ``Link: <...>; rel="next"`` header (a caller
        that stops early asks for no more)."""
        read: set[str] = set()
        while True:
            response = self._response(method, path, None, **kwargs)
            body = _json(response)
            if not isinstance(body, list):
                raise MalformedAnswer(response, "not a JSON list")
            yield body
            read.add(str(response.request.url))
            following = response.links.get("next", {}).get("url")
            if not following:
                return
            if str(response.request.url.join(following)) in read:
                raise MalformedAnswer(response, f"its next page is one already read ({following})")
            # The next page's URL carries every parameter, the cursor included.
            path, kwargs = following, {k: v for k, v in kwargs.items() if k != "params"}

    def _request(
        self, method: str, path: str, headers: dict[str, str] | None = None, **kwargs: Any
    ) -> Any:
        return _json(self._response(method, path, headers, **kwargs))

    def _response(
        self, method: str, path: str, headers: dict[str, str] | None = None, **kwargs: Any
    ) -> httpx.Response:
        """The successful response to a request (``TrainyardError`` otherwise)."""
        try:
            response = self._http.request(method, path, headers=inject(headers), **kwargs)
        except httpx.HTTPError as exc:
            raise self._labelled(self._no_answer(method, path, exc)) from exc
        if response.is_success:
            return response
        raise self._labelled(refusal(response))

    def _labelled(self, error: TrainyardError) -> TrainyardError:
        """``error`` with this client's ``service`` name."""
        error.service = self.service
        return error

    def _no_answer(self, method: str, path: str, exc: httpx.HTTPError) -> TrainyardError:
        """The error (status 0) of a request that got no answer: ``cannot reach URL: ...``
        (``unreached``), or, for a request the server took and did not answer in time
        (``httpx.ReadTimeout``), ``no answer from URL to METHOD PATH within N s``
        (``unanswered``) with the time waited, where "cannot reach URL: timed out" read as a
        server never reached; and a request that changes something may have changed it, so
        it is said to look before repeating it (``submit`` again would make a second
        job)."""
        base = str(self._http.base_url)
        if not isinstance(exc, httpx.ReadTimeout):
            return TrainyardError(0, f"{unreached(base)}: {exc}")
        waited = exc.request.extensions.get("timeout", {}).get("read")
        said = f"{unanswered(base)} {method} {path} within "
        said += "the time allowed" if waited is None else f"{waited:g} s"
        if method in ("GET", "HEAD"):
            return NoAnswer(said)
        return NoAnswer(said, "the server may have done it all the same: look before you repeat it")


def unreached(base_url: str) -> str:
    """How the error of a client of ``base_url`` that reached no server begins: ``cannot
    reach`` and the URL as httpx writes a base URL (host in lower case, a trailing slash), so that a
    caller that made several clients tells by it which one it was."""
    return f"cannot reach {_base(base_url)}"


def unanswered(base_url: str) -> str:
    """How the error of a client of ``base_url`` whose request was taken but not answered in
    time begins (``no answer from URL to``, the request follows), told from ``unreached``'s
    the same way."""
    return f"no answer from {_base(base_url)} to"


def _base(base_url: str) -> str:
    """``base_url`` as httpx writes a base URL: host in lower case, a trailing slash."""
    return str(httpx.URL(base_url.rstrip("/") + "/"))


def client_version() -> str | None:
    """The installed ``trainyard`` distribution's version (None when it is not installed:
    run from a source tree)."""
    try:
        return metadata.version("trainyard")
    except metadata.PackageNotFoundError:
        return None


AUDIT_NDJSON = "application/x-ndjson"
"""The media type of the audit log's export: one JSON object a line."""


def _parsed(line: str) -> Any:
    """``line`` as JSON, or None when it is none."""
    try:
        return json.loads(line)
    except ValueError:
        return None


def refusal(response: httpx.Response) -> TrainyardError:
    """The ``TrainyardError`` of a non-2xx ``response``, whatever its body.

    Every Trainyard API answers an error as JSON ``{"detail": "...", "errors": [{"field",
    "message"}]}``: its detail and field errors are the message. Any other body (an HTML
    page of a proxy or of another server, an empty one, JSON without a string ``detail``)
    is no Trainyard API's answer: the message names the request and what came back, so a
    wrong URL is not read as, say, "404 Not Found" of a job (an answer to ``HEAD``, which
    has no body, is its status alone). So is a 404 whose detail is the bare "Not Found" a
    service answers for a path it has no route for (another service's URL, or a service
    older than this client), and a 405 whose detail is the bare "Method Not Allowed" (a
    method of a path the service lacks: it may be older than this client; the methods its
    ``Allow`` names are said). Both name the client's version. Error items of another shape
    become strings rather than failing the command, and every text is made safe to print
    (``printable``)."""
    body = _json(response, default={}) if response.content else {}
    detail = body.get("detail") if isinstance(body, dict) else None
    wait = retry_after(response.headers.get("Retry-After"))
    url = response.request.url.copy_with(query=None, fragment=None)
    method = response.request.method
    cli = f"this CLI (trainyard {client_version() or 'of unknown version'})"
    if response.status_code == 404 and detail == "Not Found" and not body.get("errors"):
        # The bare detail a platform service answers for a path none of its routes has
        # (every missing thing is named: "no model 'x' ..."): a URL of another service, or
        # a service older than the route.
        return TrainyardError(
            404,
            f"Not Found from {method} {url}: this server has no such route (the URL of "
            "another service, or of no Trainyard API: is the URL right? Or the service is "
            f"older than {cli} and lacks it)",
            retry_after=wait,
        )
    if response.status_code == 405 and detail == "Method Not Allowed" and not body.get("errors"):
        # A platform service's answer to a method its path does not have: a path an older
        # service has, asked with a method added since (PATCH of what only had PUT).
        allowed = [m.strip() for m in response.headers.get("Allow", "").split(",")]
        allows = ", ".join(printable(m, 20) for m in allowed if m and m != "OPTIONS")
        server = str(url.copy_with(path="/")).rstrip("/")
        said = f" (it allows {allows})" if allows else ""
        return TrainyardError(
            405,
            f"Method Not Allowed from {method} {url}: the service at {server} has no "
            f"{method} of this path{said}: it may be older than {cli}; upgrade it, or use a "
            "CLI of its version",
            retry_after=wait,
        )
    if isinstance(detail, str) and detail.strip():
        return TrainyardError(
            response.status_code,
            printable(detail),
            field_errors(body.get("errors")),
            retry_after=wait,
        )
    reason = response.reason_phrase or "error"
    if response.request.method == "HEAD":  # never has a body: nothing to judge it by
        return TrainyardError(response.status_code, reason, retry_after=wait)
    if not response.content:
        what = "an empty answer"
    elif "html" in response.headers.get("content-type", "").lower():
        what = "an HTML page"
    elif isinstance(body, dict) and body:
        what = "JSON without a 'detail'"
    else:
        what = "not JSON" if not isinstance(body, list) else "a JSON list"
    return TrainyardError(
        response.status_code,
        f"{reason} from {response.request.method} {url} ({what}, not the JSON error of a "
        "Trainyard API: is the URL right?)",
        retry_after=wait,
    )


ERROR_TEXT_MAX = 2000
"""The most characters of a server's text an error shows (a detail, a field's message)."""
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def printable(text: str, limit: int = ERROR_TEXT_MAX) -> str:
    """A server's ``text`` safe for a terminal: control characters other than newline and
    tab, and bidirectional overrides, as escapes (an ESC as ``\\x1b``: an answer cannot
    recolour, rewrite or reorder the screen), and at most ``limit`` characters, the rest
    counted."""
    shown = _CONTROL.sub(lambda m: repr(m.group())[1:-1], text)
    if len(shown) <= limit:
        return shown
    return f"{shown[:limit]}... ({len(shown) - limit} more characters)"


def field_errors(errors: Any) -> list[dict[str, str]]:
    """A 422's ``errors`` as ``{"field", "message"}`` strings, whatever the server sent: an
    item that is no object is its message, a field or message that is no string its JSON;
    anything but a list is no errors."""
    if not isinstance(errors, list):
        return []
    found = []
    for item in errors:
        field, message = (
            (item.get("field"), item.get("message")) if isinstance(item, dict) else (None, item)
        )
        found.append(
            {
                "field": printable(field if isinstance(field, str) else "?"),
                "message": printable(message if isinstance(message, str) else json.dumps(message)),
            }
        )
    return found


def amended(answer: dict[str, Any], **fields: Any) -> dict[str, Any]:
    """A copy of ``answer`` with ``fields`` set: an ``Answer`` stays one (of the same request),
    so a key it lacks still raises ``MalformedAnswer``."""
    if not isinstance(answer, Answer):
        return {**answer, **fields}
    copy = Answer({**answer, **fields})
    copy.response = answer.response
    return copy


def _token_body(name: str | None, days: int | None) -> dict[str, Any]:
    return {k: v for k, v in (("name", name), ("expires_in_days", days)) if v is not None}


def _settled(view: dict[str, Any]) -> bool:
    """Whether an ended job's results are all in: its final cost, and the model it asked
    for (``register_model``) when it SUCCEEDED; a job that asked for none gets none."""
    cost_final = bool((view.get("cost") or {}).get("final"))
    asked = bool((view.get("spec") or {}).get("register_model"))
    model_in = view.get("status") != "SUCCEEDED" or not asked or view.get("model") is not None
    return cost_final and model_in


def retry_after(value: str | None) -> float | None:
    """A ``Retry-After`` header as seconds from now: delay-seconds, or an HTTP date (RFC 9110
    10.2.3); None when absent or not one of those (a date in the past is 0)."""
    if value is None:
        return None
    text = value.strip()
    if text.isascii() and text.isdigit():  # RFC 9110's DIGIT; isdigit() alone takes '²'
        return float(text)
    try:
        when = email.utils.parsedate_to_datetime(text)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        return None
    return max(0.0, (when - datetime.now(UTC)).total_seconds())


def segment(value: str) -> str:
    """``value`` (a job id, a name, a tag, a metric key) as exactly one URL path segment, so
    no value can reach another route or another name: every ``/`` and ``%`` is quoted, and
    a value of dots only (``.``, ``..``), which a URL would resolve away, has its dots
    quoted too (``%2E``)."""
    quoted = quote(value, safe="")
    return quoted.replace(".", "%2E") if not quoted.strip(".") else quoted


def _json(response: httpx.Response, default: Any = None) -> Any:
    """The JSON body of ``response``, its objects ``Answer``s and their lists ``AnswerList``s
    (so a key it lacks raises ``MalformedAnswer``); not JSON: ``default`` if given, else
    ``MalformedAnswer``. A successful answer with a value of another type than its route
    answers, at any depth, raises ``MalformedAnswer`` naming where (``answers``)."""

    def answer(pairs: dict[str, Any]) -> Answer:
        found = Answer(
            (k, _listed(response, v) if type(v) is list else v) for k, v in pairs.items()
        )
        found.response = response
        return found

    try:
        body = response.json(object_hook=answer)
    except (ValueError, RecursionError) as exc:
        # RecursionError: JSON nested deeper than the parser follows, also not an answer.
        if default is not None:
            return default
        why = "it is nested too deeply to read" if isinstance(exc, RecursionError) else None
        raise MalformedAnswer(response, why or "it is not JSON") from None
    if response.is_success:
        request = response.request
        path = request.url.raw_path.decode("ascii").partition("?")[0]
        problem = answer_problem(request.method, path, body)
        if problem is not None:
            raise MalformedAnswer(response, problem)
    return _listed(response, body) if type(body) is list else body


def malformed(answer: Answer, problem: str) -> MalformedAnswer:
    """A ``MalformedAnswer`` naming ``answer``'s request, for what a caller found wrong in
    it."""
    assert answer.response is not None  # every Answer the client returns has its response
    return MalformedAnswer(answer.response, problem)


def _listed(response: httpx.Response, items: list[Any]) -> AnswerList:
    found = AnswerList(items)
    found.response = response
    return found


def _object(response: httpx.Response) -> Answer:
    """The answer of ``response``, which must be a JSON object (``MalformedAnswer``)."""
    body = _json(response)
    if not isinstance(body, Answer):
        raise MalformedAnswer(response, f"{_kind(body)} where an object belongs")
    return body


def _kind(value: Any) -> str:
    """What a JSON value is, in words."""
    if isinstance(value, list):
        return "a list"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, bool | int | float):
        return "a number" if not isinstance(value, bool) else "a boolean"
    return "null"


def _after(cursor: str | None) -> dict[str, str]:
    return {"after": cursor} if cursor is not None else {}


def _request_of(response: httpx.Response) -> str:
    return f"{response.request.method} {response.request.url.path}"


# --- downloads (appended for the model commands) -----------------------------------------


DOWNLOAD_TIMEOUT = httpx.Timeout(600.0, connect=10.0)
"""A model's bytes (``model download``) may take minutes on a slow link: 600 s for each
step of it, 10 s to connect."""
DOWNLOAD_CHUNK = 1 << 20


def download(
    client: TrainyardClient, url: str, needs_token: bool, sink: Callable[[bytes], object]
) -> None:
    """GET ``url`` and hand its body to ``sink`` chunk by chunk.

    ``url`` is absolute (a presigned URL: sent with no token, so it never reaches a store
    or a host the token was not meant for) or a path of ``client``'s base URL; the token
    is sent only when ``needs_token`` says the answer needs it. A non-2xx answer raises
    ``TrainyardError`` (status 0 when unreachable)."""
    base = client._http.base_url
    target = base.join(url) if not httpx.URL(url).is_absolute_url else httpx.URL(url)
    headers = {"Authorization": client._http.headers["Authorization"]} if needs_token else {}
    try:
        with (
            httpx.Client(timeout=DOWNLOAD_TIMEOUT) as http,
            http.stream("GET", target, headers=headers) as response,
        ):
            if not response.is_success:
                response.read()
                raise refusal(response)
            for chunk in response.iter_bytes(DOWNLOAD_CHUNK):
                sink(chunk)
    except httpx.HTTPError as exc:
        raise TrainyardError(0, f"cannot download from {target.host}: {exc}") from exc


def get_text(client: TrainyardClient, path: str, **params: str | None) -> str:
    """The text body of ``GET path`` on ``client``'s base URL (a CSV report, say), as the
    server wrote it; errors as for every call (``TrainyardError``)."""
    return get_response(client, path, **params).text


def get_response(client: TrainyardClient, path: str, **params: str | None) -> httpx.Response:
    """The successful response to ``GET path`` (``params`` that are None left out): its
    text and its headers, for an answer whose headers say more than its body (a CSV
    report's ``Trainyard-Truncated``); errors as for every call (``TrainyardError``)."""
    query = {k: v for k, v in params.items() if v is not None}
    return client._response("GET", path, params=query)
