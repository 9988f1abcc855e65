"""The CLI waits long enough to hear a service say that its database is not answering.

The services give up on a PostgreSQL that keeps its connections and answers nothing after a
statement's and a connection's timeouts (15 s by default) and answer 503 naming the
database; the client gave up after 10 s, so its user read "cannot reach ...: The read
operation timed out" about a platform that was reachable."""

from __future__ import annotations

import httpx

from trainyard.client import TrainyardClient
from trainyard_platform.shared.settings import DatabaseSettings


def test_the_client_outwaits_the_services_database_timeouts() -> None:
    database = DatabaseSettings()
    given_up_after = database.query_timeout_seconds + database.acquire_timeout_seconds
    with TrainyardClient("http://127.0.0.1:9", "t") as client:
        timeout: httpx.Timeout = client._http.timeout
    assert timeout.read is not None and timeout.read > given_up_after
