"""A refusal carries the server's ``Retry-After`` as seconds (RFC 9110 10.2.3)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from email.utils import format_datetime

import pytest

from trainyard.client import retry_after


@pytest.mark.parametrize(
    ("header", "seconds"),
    [
        ("7", 7.0),
        (" 120 ", 120.0),
        ("0", 0.0),
        (None, None),
        ("", None),
        ("-3", None),
        ("1.5", None),
        ("soon", None),
        ("Wed, 21 Oct 2015 07:28:00 GMT", 0.0),
    ],
)
def test_delay_seconds_and_past_dates(header: str | None, seconds: float | None) -> None:
    assert retry_after(header) == seconds


def test_an_http_date_is_the_time_left_until_it() -> None:
    header = format_datetime(datetime.now(UTC) + timedelta(seconds=60), usegmt=True)
    left = retry_after(header)
    assert left is not None and 50 <= left <= 60


@pytest.mark.parametrize("header", ["\xb2", "\xb9\xb2", "\u0663"])
def test_digits_that_are_no_ascii_digits_are_no_delay(header: str) -> None:
    # A Retry-After of '²' (str.isdigit() takes it for a digit) ended the command with
    # "unexpected ValueError" from float(); it is no delay-seconds, so no delay at all.
    assert retry_after(header) is None
