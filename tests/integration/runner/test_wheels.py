"""The runner's download of a job's wheel URL against a real https server on loopback:
connected to the address it judged, the certificate checked against the URL's host name."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from tests.fixtures.wheel_server import Answer, Wheels, head, wheel_servers
from trainyard_platform.services.runner.git_remote import PrivateAllowed
from trainyard_platform.services.runner.wheels import WheelRefused, WheelUnreachable, fetch_wheel

pytestmark = pytest.mark.integration
__all__ = ["wheel_servers"]  # the fixture, used by name
LOOPBACK = PrivateAllowed.parse(["127.0.0.0/8"])
NAME = "pkg-1.0-py3-none-any.whl"
BODY = b"not really a zip, never installed here"


def test_the_download_goes_to_the_address_judged_under_the_hosts_name(
    tmp_path: Path, wheel_servers: Wheels
) -> None:
    """The host is resolved once (here by the test's resolver, as no DNS knows
    ``wheels.test``), and that address is connected to: TLS checks the certificate against
    the host name, and ``Host`` names it."""
    server = wheel_servers.serve({f"/{NAME}": Answer(body=BODY)})
    asked: list[str] = []

    def resolver(host: str, port: int) -> list[str]:
        asked.append(host)
        return ["127.0.0.1"]

    path, digest = fetch_wheel(
        f"https://wheels.test:{server.port}/{NAME}", tmp_path, LOOPBACK, resolver=resolver
    )
    assert path == tmp_path / NAME and path.read_bytes() == BODY
    assert digest == hashlib.sha256(BODY).hexdigest()
    assert asked == ["wheels.test"]
    assert server.hosts == [f"wheels.test:{server.port}"]

    # A name the certificate does not hold, at the same address: refused by TLS.
    path.unlink()
    with pytest.raises(WheelUnreachable, match="certificate"):
        fetch_wheel(
            f"https://other.test:{server.port}/{NAME}", tmp_path, LOOPBACK,
            resolver=resolver,
        )  # fmt: skip


def test_a_digest_the_url_names_must_match(tmp_path: Path, wheel_servers: Wheels) -> None:
    server = wheel_servers.serve({f"/{NAME}": Answer(body=BODY)})
    url = f"https://127.0.0.1:{server.port}/{NAME}"
    folder = tmp_path / "wheels"
    folder.mkdir()
    with pytest.raises(WheelRefused, match="sha256"):
        fetch_wheel(f"{url}#sha256={'0' * 64}", folder, LOOPBACK)
    assert list(folder.iterdir()) == []
    good = hashlib.sha256(BODY).hexdigest()
    assert fetch_wheel(f"{url}#sha256={good}", folder, LOOPBACK)[1] == good


@pytest.mark.parametrize("where", ["headers", "body"])
def test_a_server_sending_a_byte_now_and_then_is_left_at_the_deadline(
    tmp_path: Path, wheel_servers: Wheels, where: str
) -> None:
    """Each read waits at most ``timeout`` seconds, and a byte comes long before that: the
    whole download is bounded by ``deadline``, not by how slowly the server can answer
    (the answer here would take half a minute; the runner hangs up after a second)."""
    answer = Answer(body=b"x" * 500, dribble=0.05)
    if where == "body":
        answer = Answer(body=answer.body, dribble=0.05, prompt=len(head(answer)) + 10)
    server = wheel_servers.serve({f"/{NAME}": answer})
    folder = tmp_path / "wheels"
    folder.mkdir()
    with pytest.raises(WheelUnreachable, match="the download took over the 1 s it may take"):
        fetch_wheel(
            f"https://127.0.0.1:{server.port}/{NAME}", folder, LOOPBACK,
            timeout=30, deadline=1,
        )  # fmt: skip
    assert list(folder.iterdir()) == []
    server.close()  # its handler stops, if it has not seen the runner go
    [(sent, whole)] = server.dribbled
    assert sent < whole, "the runner waited for the whole answer"


def test_a_content_length_that_is_no_number_is_not_the_runners_error(
    tmp_path: Path, wheel_servers: Wheels
) -> None:
    """``Content-Length: ²`` passed ``str.isdigit`` and failed ``int``: a ValueError out of
    the download, reported as the requirement being no PEP 508 string. ``http.client``
    reads it as no length: the body runs to the connection's end."""
    answer = Answer(body=BODY, length=False, headers={"Content-Length": "\u00b2"})
    server = wheel_servers.serve({f"/{NAME}": answer})
    path, _ = fetch_wheel(f"https://127.0.0.1:{server.port}/{NAME}", tmp_path, LOOPBACK)
    assert path.read_bytes() == BODY
