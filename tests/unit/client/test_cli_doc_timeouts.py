"""docs/cli.md said every request gives up after 30 s without an answer, while a code
bundle's upload (and a model's download) waits 600 s for each step: a user whose upload
took minutes read of a limit it never had. The page now says both, and this keeps it saying
what the client's settings are."""

from __future__ import annotations

from pathlib import Path

from trainyard import client

CLI_DOC = (Path(__file__).resolve().parents[3] / "docs" / "cli.md").read_text()
EXIT_5 = next(line for line in CLI_DOC.splitlines() if line.startswith("| 5 |"))


def test_the_exit_codes_say_each_timeout_the_client_has() -> None:
    assert f"within {client.REQUEST_TIMEOUT_S:g} s" in EXIT_5
    for transfer in (client.UPLOAD_TIMEOUT, client.DOWNLOAD_TIMEOUT):
        assert f"{transfer.read:g} s for the two transfers" in EXIT_5
        assert f"{transfer.connect:g} s to connect" in EXIT_5
    assert "upload of the code bundle" in EXIT_5 and "model download" in EXIT_5
