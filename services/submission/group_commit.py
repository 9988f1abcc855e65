"""Group commit of the front door's remembered submissions: concurrent ones written together.

A remembered caller's ``POST /v1/jobs`` is one statement (``known_callers``,
``repository.insert_job_if_caller``). Under load each was also its own pool round, its own
transaction and its own commit (a WAL flush); here the submissions that arrive while others
are being written are written together, in one statement, one pool round, one commit.

Contract (``GroupCommit.write``):
- The answer is ``(held, stored)`` exactly as ``repository.insert_job_if_caller`` gives it for
  that one submission, and it comes only after the transaction that holds its rows (the job,
  its history entry and its outbox row, when stored) committed.
- No added wait: when no write is under way, a submission is written at once and alone, on
  the single-row statement, in its request's own context (its database span in its trace).
  One that arrives while a write is under way is queued, and when the writes under way end
  the queue (its oldest ``max_rows`` at most) is the next batch. No timers: a batch is
  whatever queued while the database was busy. So that one slow commit does not hold up
  everything, a queue of ``max_rows`` is written at once while fewer than ``in_flight``
  writes are under way.
- A batch of one is written as above by its own request. A batch of two or more is one
  statement (``repository.insert_jobs_if_callers``): every row's token, caller and screening
  checked in it as alone, every row stored or not on its own, in arrival order (two of one
  user with the same idempotency key: the second is not stored, and its request answers as
  if it had come second). It runs outside every request's context, so its statement is in
  no request's trace; a span ``submission group commit`` (a trace of its own, made only
  where tracing is on) holds its database span, with a link to each request's span and the
  number of rows (``trainyard.group_commit.rows``).
- A batch whose statement fails as a whole (any exception) has each of its rows written
  again alone on the single-row statement, one after the other in arrival order, each in its
  request's context (its database span in its trace): one bad row can never fail or lose
  another's request. A statement that failed is a transaction that did not commit, unless
  the connection was lost after the commit: then each row written again finds its own job
  stored (its job id is its own) and nothing is stored twice; a row without an
  idempotency key answers as stored, one with a key as that key's replay (its own job);
  the outbox relay, not woken for that commit, finds its event at its next poll. A row
  written alone that fails for an outage (the database away or not answering) ends the
  rewrites: the rows after it answer that failure (503, try again), unwritten.
- A request cancelled while its submission is queued takes it out of the queue: nothing of
  it is written. Cancelled while its batch is being written, the batch goes on (all of its
  stored rows or none, as one statement) and only that answer is lost, as when a request is
  cancelled during its own statement.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field

import asyncpg
from opentelemetry import trace

from trainyard_platform.services.submission import repository as repo
from trainyard_platform.shared import outbox
from trainyard_platform.shared.bus import infrastructure_fault
from trainyard_platform.shared.telemetry import tracer

log = logging.getLogger(__name__)
_tracer = tracer(__name__)

MAX_ROWS = 64
"""The most submissions one statement writes."""
IN_FLIGHT = 2
"""How many writes may be under way at once (a second one only for a full batch)."""

_JOB_ID = "jobs_pkey"
"""The constraint a job's id breaks when that job is stored already."""

Outcome = tuple[bool, bool]
"""``(held, stored)``, as ``repository.insert_job_if_caller`` returns them."""


class _Alone:
    """A queued submission's answer telling its request to write it alone now, in the write
    slot taken for it."""


_ALONE = _Alone()


@dataclass(eq=False)
class _Queued:
    submission: repo.Submission
    link: trace.SpanContext
    """The request's span, which a batch's span links to."""
    answer: asyncio.Future[Outcome | _Alone] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future()
    )
    context: contextvars.Context = field(default_factory=contextvars.copy_context)
    """The request's context, where a failed batch writes this submission again."""
    reserved: bool = False
    """Whether a write slot was taken for this submission's own single-row write."""


class GroupCommit:
    """The front door's writer of remembered submissions over ``pool`` (see the module)."""

    def __init__(
        self, pool: asyncpg.Pool, max_rows: int = MAX_ROWS, in_flight: int = IN_FLIGHT
    ) -> None:
        if max_rows < 2 or in_flight < 1:
            raise ValueError("a group commit needs max_rows >= 2 and in_flight >= 1")
        self.pool = pool
        self._max_rows = max_rows
        self._in_flight_max = in_flight
        self._in_flight = 0
        self._queue: list[_Queued] = []
        self._tasks: set[asyncio.Task[None]] = set()
        self.batches = 0
        """Statements of two or more rows sent so far."""
        self.batched_rows = 0
        """Rows those statements carried."""

    @property
    def queued(self) -> int:
        """Submissions waiting for the next batch."""
        return len(self._queue)

    async def write(self, submission: repo.Submission) -> Outcome:
        """Write one submission, alone or with others (see the module)."""
        if not self._in_flight:
            self._in_flight += 1
            return await self._alone(submission)
        queued = _Queued(submission, trace.get_current_span().get_span_context())
        self._queue.append(queued)
        if len(self._queue) >= self._max_rows:
            self._next()
        try:
            answer = await queued.answer
        except asyncio.CancelledError:
            self._withdraw(queued)
            raise
        if isinstance(answer, _Alone):  # a batch of one: a slot was taken for it
            return await self._alone(submission)
        return answer

    async def _alone(self, submission: repo.Submission) -> Outcome:
        """The single-row write in a slot already taken, which it gives back."""
        try:
            return await self._write_alone(submission)
        finally:
            self._release()

    async def _write_alone(self, submission: repo.Submission) -> Outcome:
        async with self.pool.acquire() as conn:
            held, stored = await repo.insert_job_if_caller(conn, *submission)
            if stored:
                outbox.enqueued_by(conn)
        return held, stored

    def _withdraw(self, queued: _Queued) -> None:
        """A cancelled request's submission: out of the queue if still there; a slot taken
        for its own write, given back."""
        if queued in self._queue:
            self._queue.remove(queued)
        elif queued.reserved:
            self._release()

    def _release(self) -> None:
        self._in_flight -= 1
        self._next()

    def _next(self) -> None:
        """Start the next writes of the queue: one when none is under way, and one for each
        full batch while fewer than ``in_flight`` are."""
        while self._queue and (
            not self._in_flight
            or (self._in_flight < self._in_flight_max and len(self._queue) >= self._max_rows)
        ):
            batch = self._queue[: self._max_rows]
            del self._queue[: self._max_rows]
            batch = [q for q in batch if not q.answer.done()]  # cancelled, not yet withdrawn
            if not batch:
                continue
            self._in_flight += 1
            if len(batch) == 1:
                batch[0].reserved = True
                batch[0].answer.set_result(_ALONE)
                return
            # Outside every request's context: in no request's trace (see the module).
            task = asyncio.create_task(self._write_batch(batch), context=contextvars.Context())
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _write_batch(self, batch: Sequence[_Queued]) -> None:
        try:
            try:
                answers = await self._statement(batch)
            except Exception:
                log.warning(
                    "a group commit of %d submissions failed; each is written again alone",
                    len(batch),
                    exc_info=True,
                )
                await self._one_by_one(batch)
            else:
                for queued, answer in zip(batch, answers, strict=True):
                    if not queued.answer.done():
                        queued.answer.set_result(answer)
        finally:
            self._release()
            for queued in batch:
                if not queued.answer.done():  # this task was cancelled: the outcome is unknown
                    queued.answer.cancel()

    async def _one_by_one(self, batch: Sequence[_Queued]) -> None:
        """Each submission of a failed batch written alone, in order, in its request's
        context (its database span in its trace); a cancelled request's is not written.
        Once one fails for an outage (``bus.infrastructure_fault``: the database away or
        not answering), the rest answer that failure unwritten: each would wait out its own
        timeouts, one after the other, and the last request of a full batch its timeouts
        times the batch."""
        outage: Exception | None = None
        for queued in batch:
            if queued.answer.done():
                continue
            if outage is not None:
                queued.answer.set_exception(outage)
                continue
            try:
                alone = self._write_alone(queued.submission)
                outcome = await asyncio.create_task(alone, context=queued.context)
            except Exception as exc:
                if queued.answer.done():
                    continue
                if isinstance(exc, asyncpg.UniqueViolationError) and exc.constraint_name == _JOB_ID:
                    # Its job id is its own: the batch did commit (the connection was lost
                    # after it), so its job, history and event are stored.
                    queued.answer.set_result((True, True))
                else:
                    queued.answer.set_exception(exc)
                    if infrastructure_fault(exc) is not None:
                        outage = exc
            else:
                if not queued.answer.done():
                    queued.answer.set_result(outcome)

    async def _statement(self, batch: Sequence[_Queued]) -> list[Outcome]:
        links = [trace.Link(q.link) for q in batch if q.link.is_valid]
        attributes = {"trainyard.group_commit.rows": len(batch)}
        with _tracer.start_as_current_span(
            "submission group commit", attributes=attributes, links=links
        ):
            async with self.pool.acquire() as conn:
                answers = await repo.insert_jobs_if_callers(conn, [q.submission for q in batch])
                if any(stored for _, stored in answers):
                    outbox.enqueued_by(conn)
        self.batches += 1
        self.batched_rows += len(batch)
        return answers
