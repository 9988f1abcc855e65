"""``trainyard admin prices``: billing's price book (``--billing-url`` at login, or
``TRAINYARD_BILLING_URL``).

    trainyard admin prices ls [--flavor F]         every price, dated, in force or not
    trainyard admin prices show FLAVOR             a flavor's prices, with their etag
    trainyard admin prices set FLAVOR [--gpu-hour P] [--cpu-hour P] [--memory-gib-hour P]
        [--from TIME] [--if-match ETAG]            new prices (operators)

``ls`` is every page of ``GET /v1/prices`` (one row per flavor, date and resource); ``set``
is ``PUT /v1/prices/{flavor}`` with the prices given, from ``--from`` (ISO 8601; default
now, or the beginning for a flavor's first price). ``--json`` prints billing's answer. A
``set`` without any price, or with a price that is no finite decimal number, is a usage
error before any request (exit 2); a time in the past, an unknown flavor or a price out of
bounds is billing's 422 naming the field, one line (exit 1).

``show`` is ``GET /v1/prices/{flavor}`` and prints the flavor's prices with their ``etag``
last (billing's ``ETag``; with ``--json`` on stderr, ``cli_base.emit_tagged``). ``set`` with
``--if-match ETAG`` sends it as ``If-Match``: the new prices are made only while the flavor's
prices are as ``show`` printed them; when another operator set some since, nothing changes
and one line says so and to run ``show`` again (exit 1). Without it and without ``--from``,
``set`` reads the flavor's prices first, and when it has none (404) sends ``If-None-Match:
*``: a first price covers the flavor's usage from the beginning, so when another operator
priced it meanwhile nothing changes (billing's 412, the same one line); a flavor with prices
gets the new ones unconditionally, as before. With ``--from`` it reads nothing: the prices
start then whether they are the flavor's first or not, so the ``PUT`` does the same either
way and goes unconditionally, one request.
"""

from __future__ import annotations

import argparse
from typing import Any

from trainyard.cli_base import (
    CliError,
    Exit,
    Session,
    add_if_match,
    asked,
    decimal_arg,
    if_match,
    refused,
)
from trainyard.cli_render import money, none_yet, table, time_text
from trainyard.client import TrainyardClient, TrainyardError, segment

PRICES = (
    ("--gpu-hour", "price_per_gpu_hour", "GPU-hour"),
    ("--cpu-hour", "price_per_cpu_hour", "CPU-hour"),
    ("--memory-gib-hour", "price_per_memory_gib_hour", "GiB-hour of memory"),
)
"""Each price's option, the field of billing's body and answer, and what it is per."""
HEADER = ("FLAVOR", "FROM", "PER", "PRICE", "CURRENCY", "IN FORCE", "SET BY")


price_arg = decimal_arg("2.75")
"""A price as written (``cli_base.decimal_arg``)."""


def add_commands(
    kinds: argparse._SubParsersAction[argparse.ArgumentParser], common: argparse.ArgumentParser
) -> None:
    """Add ``prices ls|set`` beside the scheduler's kinds of ``admin``."""
    text = "billing's prices per GPU-hour, CPU-hour, GiB-hour (set: operators)"
    prices = kinds.add_parser("prices", parents=[common], help=text, description=text)
    actions = prices.add_subparsers(dest="action", required=True, metavar="ACTION")
    listing = actions.add_parser("ls", parents=[common], help="every price, dated")
    listing.add_argument("--flavor", help="only this flavor's prices")
    listing.set_defaults(run=run_list)
    show = actions.add_parser("show", parents=[common], help="a flavor's prices and their etag")
    show.add_argument("flavor", metavar="FLAVOR")
    show.set_defaults(run=run_show)
    put = actions.add_parser("set", parents=[common], help="new prices of a flavor (operators)")
    put.add_argument("flavor", metavar="FLAVOR")
    for option, field, per in PRICES:
        put.add_argument(option, dest=field, type=price_arg, metavar="PRICE", help=f"per {per}")
    put.add_argument(
        "--from", dest="start", metavar="TIME", help="ISO 8601, not in the past (default: now)"
    )
    add_if_match(put)
    put.set_defaults(run=run_set)


def run_list(session: Session) -> int:
    billing = session.service("billing")
    flavor = session.args.flavor
    rows = asked("billing", lambda: billing.get_all("/v1/prices", flavor=flavor))
    session.emit(
        rows,
        lambda: table(
            HEADER,
            [row for r in rows for row in price_rows(r)],
            empty=none_yet(
                f"no prices of {flavor}" if flavor else "no prices",
                f"trainyard admin prices set {flavor or 'FLAVOR'} --gpu-hour P",
                "sets one",
            ),
        ),
    )
    return Exit.OK


def run_show(session: Session) -> int:
    path = f"/v1/prices/{segment(session.args.flavor)}"
    found = asked("billing", lambda: session.service("billing").get_list(path))
    session.emit_tagged(found, lambda: table(HEADER, [row for r in found for row in price_rows(r)]))
    return Exit.OK


def run_set(session: Session) -> int:
    args = session.args
    body: dict[str, Any] = {
        field: getattr(args, field) for _, field, _ in PRICES if getattr(args, field) is not None
    }
    if not body:
        given = ", ".join(option for option, _, _ in PRICES)
        raise CliError(f"give at least one price: {given}", Exit.USAGE)
    if args.start is not None:
        body["effective_from"] = args.start
    path = f"/v1/prices/{segment(args.flavor)}"
    billing = session.service("billing")
    # Only where the PUT's effect hangs on whether the flavor has prices (no --from: a
    # first price starts at the beginning, a later one now) is that read first; billing's
    # rules offer no one request that says "from the beginning only if first, else
    # refuse", so the read is what makes If-None-Match: * the right condition.
    unread = args.start is not None
    conditions = if_match(args) or ({} if unread else _first_price(billing, path))
    found = asked(
        "billing",
        lambda: billing.call("PUT", path, body, conditions),
        f"trainyard admin prices show {args.flavor}",
    )
    session.emit(found, lambda: table(HEADER, price_rows(found)))
    return Exit.OK


def _first_price(billing: TrainyardClient, path: str) -> dict[str, str]:
    """``If-None-Match: *`` when the flavor has no price yet (``GET`` of its book: 404): its
    first covers its usage from the beginning, so one another operator made meanwhile is
    never followed by a second made as if it were the first (412, nothing changed). A
    flavor with prices: no condition, as before (``--if-match`` makes one). It guards what
    this command's ``PUT`` does against a change between the read and the write; a change
    made after the operator last looked at the book is ``--if-match``'s to catch."""
    try:
        billing.get_list(path)
    except TrainyardError as exc:
        if exc.status != 404:
            raise refused(f"billing: {exc}", exc) from None
        return {"If-None-Match": "*"}
    return {}


def price_rows(price: dict[str, Any]) -> list[tuple[object, ...]]:
    """A price of the book (or the prices one ``set`` made) as a row per resource priced."""
    return [
        (
            price["flavor"],
            time_text(price["effective_from"]),
            per,
            money(price[field]),
            price["currency"],
            "yes" if price["in_force"] else "no",
            price["set_by"],
        )
        for _, field, per in PRICES
        if price.get(field) is not None
    ]
