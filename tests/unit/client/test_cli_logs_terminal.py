"""What the CLI prints on a terminal cannot act on it: a job's output, the last lines of a
failed job's output, any text a server answers.

Seen: ``logs`` wrote a job's output to the terminal as it was (and ``describe`` the last
lines of a failed job's), so a job that printed ``ESC ] 0 ; ... BEL`` retitled the reader's
window, one that printed ``ESC [ 6 n`` made the terminal type a cursor report into the
reader's shell, and ``ESC [ 2 J`` cleared what was read before. Whoever reads a job's logs
(its team, an operator) reads what any member's code printed. Colours and the cursor moves
of progress bars still act; into a file or a pipe, and with ``logs --raw``, the output is as
the job printed it."""

from __future__ import annotations

import io
from pathlib import Path

import httpx
import pytest

from trainyard import cli
from trainyard.terminal_text import HELD_MAX, TerminalText

from .conftest import log_pages, routed_api
from .test_cli_answer_types import JOB as VIEW

JOB = "abc12345-0000-4000-8000-000000000001"


@pytest.mark.parametrize(
    ("printed", "shown"),
    [
        ("\x1b]0;pwned\x07title", "\\x1b]0;pwned\\x07title"),  # window title (OSC)
        ("\x1b]52;c;ZXZpbA==\x07", "\\x1b]52;c;ZXZpbA==\\x07"),  # clipboard (OSC 52)
        ("\x1b[6n", "\\x1b[6n"),  # a cursor report typed into the shell
        ("\x1b[21t", "\\x1b[21t"),  # a window title report, likewise
        ("\x1b[2J\x1b[H", "\\x1b[2J\\x1b[H"),  # clear the screen, cursor home
        ("\x1bP+q\x1b\\", "\\x1bP+q\\x1b\\"),  # a device control string
        ("\x9b6n", "\\x9b6n"),  # the one-character CSI (C1)
        ("a\u202ebc", "a\\u202ebc"),  # a bidirectional override
        ("bell\x07 back\x08", "bell\\x07 back\\x08"),
        # What progress bars and coloured logs print acts as before.
        ("\x1b[31mred\x1b[0m\n", "\x1b[31mred\x1b[0m\n"),
        ("\x1b[38;2;255;0;0mrgb\x1b[39m", "\x1b[38;2;255;0;0mrgb\x1b[39m"),
        (" 50%|#####     |\r100%|##########|\n", " 50%|#####     |\r100%|##########|\n"),
        ("\x1b[A\x1b[2K\x1b[1G\x1b[3C\x1b[1B\x1b[2D", "\x1b[A\x1b[2K\x1b[1G\x1b[3C\x1b[1B\x1b[2D"),
        ("tab\there\n", "tab\there\n"),
    ],
)
def test_only_colours_and_line_bound_moves_act(printed: str, shown: str) -> None:
    text = TerminalText()
    assert text.feed(printed) + text.flush() == shown


def test_a_sequence_split_across_chunks_is_judged_whole() -> None:
    text = TerminalText()
    assert text.feed("loss 0.1 \x1b[3") == "loss 0.1 "
    assert text.feed("1mred") == "\x1b[31mred"
    assert text.feed("then \x1b") == "then "
    assert text.feed("[6n") == "\\x1b[6n"
    assert text.feed("end \x1b[") == "end "
    assert text.flush() == "\\x1b["  # no more output: what was held, written out
    assert text.flush() == ""
    long = "\x1b[" + "1;" * HELD_MAX
    assert text.feed(long) == long.replace("\x1b", "\\x1b")  # too long to hold


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def _logs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, texts: list[str]) -> None:
    state = routed_api(tmp_path, monkeypatch, {"TRAINYARD_URL": "http://api.test"})
    monkeypatch.setenv("TRAINYARD_TOKEN", "ty_a")
    chunks = [
        {"seq": n, "stream": "a0000-n1", "text": text} for n, text in enumerate(texts, start=1)
    ]

    state["route"] = log_pages(True, chunks)


PRINTED = ["\x1b[32mok\x1b[0m \x1b]0;pwned", "\x07\n", "last \x1b["]


def test_logs_on_a_terminal_write_out_what_would_act_on_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _logs(tmp_path, monkeypatch, PRINTED)
    terminal = Terminal()
    monkeypatch.setattr("sys.stdout", terminal)
    assert cli.main(["logs", JOB]) == 0
    assert terminal.getvalue() == "\x1b[32mok\x1b[0m \\x1b]0;pwned\\x07\nlast \\x1b["


def test_logs_with_raw_or_into_a_pipe_are_as_printed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _logs(tmp_path, monkeypatch, PRINTED)
    assert cli.main(["logs", JOB]) == 0  # captured: not a terminal
    assert capsys.readouterr().out == "".join(PRINTED)
    terminal = Terminal()
    monkeypatch.setattr("sys.stdout", terminal)
    assert cli.main(["logs", "--raw", JOB]) == 0
    assert terminal.getvalue() == "".join(PRINTED)


def test_describe_on_a_terminal_writes_out_a_failed_jobs_escapes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    state = routed_api(tmp_path, monkeypatch, {"TRAINYARD_URL": "http://api.test"})
    monkeypatch.setenv("TRAINYARD_TOKEN", "ty_a")
    failure = {"reason": "exit 1", "exit_code": 1, "failure_kind": "user_error"}
    view = {**VIEW, "id": JOB, "status": "FAILED", "failure": {**failure, "log_tail": PAYLOAD}}
    state["route"] = lambda request: httpx.Response(200, json=view)
    terminal, errors = Terminal(), Terminal()
    monkeypatch.setattr("sys.stdout", terminal)
    monkeypatch.setattr("sys.stderr", errors)
    assert cli.main(["describe", JOB]) == 0
    shown = terminal.getvalue()
    assert "\\x1b]0;pwned\\x07" in shown and "\x1b]" not in shown, shown
    assert "\\x1b[6n" in shown and "\x1b[6n" not in shown, shown


PAYLOAD = "Traceback\n\x1b]0;pwned\x07\x1b[6nValueError: boom\n"
