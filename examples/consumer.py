"""Another system reading Trainyard's events: a durable JetStream consumer of its own.

    python examples/consumer.py --url nats://user:password@nats:4222 --name billing-export \
        --filter 'trainyard.job.*.v1.>'

It needs only nats-py, none of Trainyard's code, and follows the consumer's obligations of
docs/events.md: it creates (or resumes) its own durable consumer on the stream ``TRAINYARD``,
so a restart goes on where it stopped; it deduplicates by the event's sender and ``id``
(delivery is at least once; an id is unique only within its sender, so another sender's event
under an id seen before is another event: the sender is the ``source``, and for the runner's
events, which every node sends as ``trainyard/runner``, the node named by ``data.node_id``
too, as docs/events.md asks); it acknowledges an event only after handling it (here: printing one line of JSON
to stdout). Non-finite numbers arrive as the strings "NaN", "Infinity" and "-Infinity", so the
strict JSON parser below never meets a bare NaN.

``--seen FILE`` keeps the events handled across restarts (one per line: sender, a tab, id; a
line of an id alone, as earlier versions wrote, counts for that id from any sender); without
it they are kept in memory only. ``--max-events N`` stops after N events were handled (for trying it out).

Bad options are refused naming the option (exit status 2). A NATS server that cannot be
reached or refuses the credentials is said in one line on stderr, naming the server (its
password left out) and the reason, each time the reason changes while nats-py tries again
(60 times, 2 s apart); then, or when the server refuses the consumer, the program ends with
exit status 1.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import sys
from collections import OrderedDict
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import nats
from nats.js import api
from nats.js.errors import NotFoundError

STREAM = "TRAINYARD"
MAX_REMEMBERED = 1_000_000
"""Most events kept in memory; the oldest are forgotten first (redeliveries are recent)."""


class SeenIds:
    """The events already handled, by (sender, id): in memory, and appended to ``path`` when
    given. An id alone (a line without a sender) stands for that id from any sender."""

    def __init__(self, path: Path | None) -> None:
        self._ids: OrderedDict[tuple[str, str], None] = OrderedDict()
        self._path = path
        if path is not None and path.exists():
            for line in path.read_text().splitlines():
                source, _, event_id = line.strip().rpartition("\t")
                self._remember((source, event_id))

    def __contains__(self, key: object) -> bool:
        if not isinstance(key, tuple) or len(key) != 2:
            return False
        return key in self._ids or ("", key[1]) in self._ids

    def add(self, source: str, event_id: str) -> None:
        self._remember((source, event_id))
        if self._path is not None:
            with self._path.open("a") as out:
                out.write(f"{source}\t{event_id}\n")

    def _remember(self, key: tuple[str, str]) -> None:
        if key[1]:
            self._ids[key] = None
            while len(self._ids) > MAX_REMEMBERED:
                self._ids.popitem(last=False)


def _no_bare_constants(token: str) -> Any:
    raise ValueError(f"{token} is not JSON")


RUNNER = "trainyard/runner"


def sender(event: dict[str, Any]) -> str:
    """Who sent ``event``, as far as deduplication goes: its ``source``; for a runner's event
    the node too (``trainyard/runner/<node>``), as every runner node says one source."""
    data = event.get("data")
    node = data.get("node_id") if isinstance(data, dict) else None
    if event["source"] == RUNNER and isinstance(node, str) and node:
        return f"{RUNNER}/{node}"
    return str(event["source"])


def handle(raw: bytes) -> dict[str, Any]:
    """Parse one event (strict JSON) and return the line to print; raises ValueError when the
    message is not a CloudEvent."""
    event = json.loads(raw, parse_constant=_no_bare_constants)
    if not isinstance(event, dict):
        raise ValueError("not a Trainyard event (not a JSON object)")
    missing = [k for k in ("id", "type", "source", "subject", "data") if k not in event]
    if missing:
        raise ValueError(f"not a Trainyard event (missing {', '.join(missing)})")
    return {
        "id": event["id"],
        "source": event["source"],
        "type": event["type"],
        "subject": event["subject"],
        "time": event.get("time"),
        "data": event["data"],
    }


async def consume(args: argparse.Namespace) -> int:
    seen = SeenIds(args.seen)
    said: list[str] = []

    async def say_error(exc: Exception) -> None:
        """One line per new connection error (nats-py logs each with its traceback, and
        tries again: 60 times, 2 s apart, before it gives up)."""
        reason = str(exc).strip() or type(exc).__name__
        if not said or said[-1] != reason:
            print(f"NATS at {shown_url(args.url)}: {reason}; trying again", file=sys.stderr)
        said.append(reason)

    nc = await nats.connect(args.url, name=args.name, error_cb=say_error)
    js = nc.jetstream()
    one = len(args.filter) == 1
    config = api.ConsumerConfig(
        durable_name=args.name,
        ack_policy=api.AckPolicy.EXPLICIT,
        deliver_policy=api.DeliverPolicy.NEW if args.new else api.DeliverPolicy.ALL,
        # One filter travels in the create request's subject, where NATS permissions see it.
        filter_subject=args.filter[0] if one else None,
        filter_subjects=None if one else args.filter,
        max_ack_pending=256,
    )
    try:
        await js.consumer_info(STREAM, args.name)
    except NotFoundError:
        await js.add_consumer(STREAM, config)
    sub = await js.pull_subscribe_bind(durable=args.name, stream=STREAM)
    handled = 0
    try:
        while args.max_events is None or handled < args.max_events:
            try:
                messages = await sub.fetch(batch=64, timeout=5)
            except nats.errors.TimeoutError:
                continue
            for msg in messages:
                try:
                    line = handle(msg.data)
                except ValueError as exc:
                    print(f"skipped message {msg.subject}: {exc}", file=sys.stderr)
                    await msg.term()  # never redelivered: it will not parse next time either
                    continue
                if (sender(line), line["id"]) in seen:
                    print(f"duplicate {line['id']} ignored", file=sys.stderr)
                else:
                    print(json.dumps(line, allow_nan=False), flush=True)
                    seen.add(sender(line), line["id"])
                    handled += 1
                await msg.ack()  # after handling: a crash before it means a redelivery
                if args.max_events is not None and handled >= args.max_events:
                    break
    finally:
        await nc.drain()
    return 0


_DURABLE_NAME = re.compile(r"[A-Za-z0-9_-]{1,200}")


def durable_name(text: str) -> str:
    """A durable consumer's name: letters, digits, ``_`` and ``-`` (NATS refuses ``.``,
    ``*``, ``>`` and white space in one, and it is part of API subjects)."""
    if not _DURABLE_NAME.fullmatch(text):
        raise argparse.ArgumentTypeError(
            f"{text!r}: use 1 to 200 letters, digits, '_' or '-' (a NATS durable name)"
        )
    return text


def shown_url(url: str) -> str:
    """``url`` with its password (if any) left out, for messages."""
    try:
        parts = urlsplit(url)
        if parts.password is None:
            return url
        netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
        return parts._replace(netloc=netloc).geturl()
    except ValueError:
        return "the --url given"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", default="nats://127.0.0.1:4222", help="NATS URL with credentials")
    parser.add_argument(
        "--name", required=True, type=durable_name, help="the durable consumer's name (yours alone)"
    )
    parser.add_argument(
        "--filter",
        action="append",
        help="subject filter, repeatable (default: every event, trainyard.>)",
    )
    parser.add_argument("--new", action="store_true", help="start at new events, not the oldest")
    parser.add_argument("--seen", type=Path, help="file keeping the handled events across restarts")
    parser.add_argument("--max-events", type=int, help="stop after this many events")
    args = parser.parse_args(argv)
    if args.max_events is not None and args.max_events < 1:
        parser.error(f"argument --max-events: {args.max_events} is not at least 1")
    args.filter = args.filter or ["trainyard.>"]
    try:
        return asyncio.run(consume(args))
    except KeyboardInterrupt:
        return 0
    except (OSError, TimeoutError, nats.errors.Error) as exc:
        reason = str(exc).strip() or type(exc).__name__
        print(f"{parser.prog}: NATS at {shown_url(args.url)}: {reason}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
