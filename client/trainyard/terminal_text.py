"""A job's output made safe to print on a terminal, keeping what progress bars and colours use.

A job's output is whatever its code printed, and whoever reads it with ``trainyard logs``
(its team, an operator) reads it on their own terminal. Written there as it is, an escape
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
- Pure text in, text out: the caller decides when to apply it (``trainyard logs`` does on a
  terminal unless asked for ``--raw``; into a file or a pipe the output is the job's, as
  printed).
"""

from __future__ import annotations

import re
from typing import Final

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
