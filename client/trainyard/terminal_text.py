"""What the CLI prints made safe for a terminal, keeping what progress bars and colours use.

The CLI prints what servers answer: a job's output (``logs``, ``attach``, ``submit
--follow``), the last lines of a failed job's output and its reason (``describe``), names,
notes and labels. A job's output is whatever its code printed, and whoever reads it (its
team, an operator) reads it on their own terminal. Written there as it is, an escape
sequence in it acts on that terminal: an OSC one sets the window title or, where the
terminal allows it, the clipboard; a device or window report (``ESC [ 6 n``, ``ESC [ 21 t``)
makes the terminal type an answer into the reader's shell; clearing the screen or moving
the cursor anywhere hides or forges earlier lines.

Contract:
- ``TerminalText().feed(text)`` returns ``text`` with every escape sequence and control
  character written out as an escape (``\\x1b[2J`` prints as those six characters), except
  newline, carriage return and tab, and the control sequences (``ESC [`` ... final byte)
  that colour text (``m``), erase within the line (``K``) and move the cursor up, down,
  along the line or to a column (``A``, ``B``, ``C``, ``D``, ``G``), which is what tqdm,
  rich and coloured loggers print. C1 controls (U+0080-U+009F, one of them a one-character
  ``CSI``) and the bidirectional overrides are written out too.
- A sequence split across two chunks of output is judged whole: the unfinished tail of
  one ``feed`` (at most ``HELD_MAX`` characters) is held and judged with the next;
  ``flush()`` returns what is held, written out, once no more text comes.
- ``guarded_terminal(raw)``: while it lasts, ``sys.stdout`` and ``sys.stderr`` that are
  terminals write through a ``TerminalText`` each (``TerminalStream``); a pipe or a file,
  and any stream with ``raw``, get the text as it is. The CLI's ``main`` runs every command
  so (``trainyard logs --raw`` asks for ``raw``): one guard for all it prints, since the CLI
  itself prints no escape sequence (its tables are plain text).
"""

from __future__ import annotations

import io
import re
import sys
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from typing import Final, TextIO

KEPT_FINALS: Final = frozenset("mKABCDG")
"""Final bytes of the ``ESC [`` sequences passed through (module docstring)."""
HELD_MAX: Final = 64
"""The longest unfinished sequence held for the next chunk; a longer one is written out."""

_SEQUENCE = re.compile(
    r"\x1b\[[0-?]*[ -/]*[@-~]"  # a complete control sequence (CSI)
    r"|[\x00-\x08\x0b-\x0c\x0e-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]"  # one control
)
_UNFINISHED = re.compile(r"\x1b(?:\[[0-?]*[ -/]*)?\Z")


class TerminalText:
    """The filter of the module docstring, for one stream of output."""

    def __init__(self) -> None:
        self._held = ""

    def feed(self, text: str) -> str:
        text = self._held + text
        self._held = ""
        tail = _UNFINISHED.search(text)
        if tail is not None and len(text) - tail.start() <= HELD_MAX:
            text, self._held = text[: tail.start()], text[tail.start() :]
        return _SEQUENCE.sub(_judged, text)

    def flush(self) -> str:
        held, self._held = self._held, ""
        return _SEQUENCE.sub(_judged, held)


def _judged(match: re.Match[str]) -> str:
    found = match.group()
    if len(found) > 2 and found[-1] in KEPT_FINALS:
        return found
    return found.encode("unicode_escape").decode("ascii")


class TerminalStream(io.TextIOBase):
    """``stream`` (a terminal), written through a ``TerminalText``; ``close`` writes what it
    holds and leaves ``stream`` open."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream
        self._text = TerminalText()

    def write(self, text: str) -> int:
        self._stream.write(self._text.feed(text))
        return len(text)

    def flush(self) -> None:
        self._stream.flush()

    def close(self) -> None:
        self._stream.write(self._text.flush())
        self._stream.flush()
        super().close()

    def isatty(self) -> bool:
        return True

    def fileno(self) -> int:
        return self._stream.fileno()

    @property
    def encoding(self) -> str:  # type: ignore[override]  # the wrapped stream's
        return self._stream.encoding

    @property
    def buffer(self) -> object:
        """The terminal's bytes as they are (what a binary download to stdout writes)."""
        return self._stream.buffer


@contextmanager
def guarded_terminal(raw: bool = False) -> Iterator[None]:
    """The module docstring's guard over ``sys.stdout`` and ``sys.stderr``."""
    if raw:
        yield
        return
    swapped: list[tuple[str, TerminalStream]] = []
    for name in ("stdout", "stderr"):
        stream = getattr(sys, name)
        if stream is not None and not isinstance(stream, TerminalStream) and _is_terminal(stream):
            guard = TerminalStream(stream)
            setattr(sys, name, guard)
            swapped.append((name, guard))
    try:
        yield
    finally:
        for name, guard in swapped:
            setattr(sys, name, guard._stream)
            with suppress(OSError, ValueError):  # the terminal went away (a hang-up)
                guard.close()


def _is_terminal(stream: TextIO) -> bool:
    isatty = getattr(stream, "isatty", None)  # a stand-in stream may have none
    try:
        return bool(isatty()) if callable(isatty) else False
    except (OSError, ValueError):  # a closed stream
        return False
