"""What reaches the operator's terminal: node-sourced text without terminal control sequences.

Logs, stderr of remote commands, log tails and error messages carry bytes a node wrote. An
escape sequence among them could retitle the window, rewrite earlier lines (hiding a failure),
set the clipboard (OSC 52) or, on some terminals, answer back as if typed. kvpd's own output is
styled by rich; everything printed through the consoles here, and the raw log text `kvpd logs`
writes, is cleaned first: escape sequences are removed, other control characters but newline
and tab are shown as "?", and a carriage return ends the line instead of rewriting it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from rich.console import Console
from rich.segment import Segment

_ESCAPES = re.compile(
    r"\x1b\[[0-?]*[ -/]*[@-~]"  # CSI: colours, cursor moves, erase
    r"|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)?"  # OSC: titles, hyperlinks, clipboard
    r"|\x1b[PX^_][^\x1b]*(?:\x1b\\)?"  # DCS, SOS, PM, APC strings
    r"|\x1b[@-Z\\-_]|\x1b."  # other two-byte escapes
    r"|\x9b[0-?]*[ -/]*[@-~]"  # 8-bit CSI
)
_CONTROLS = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]")


def clean(text: str) -> str:
    """`text` safe to print on a terminal (see the module docstring)."""
    text = _ESCAPES.sub("", text).replace("\r\n", "\n").replace("\r", "\n")
    return _CONTROLS.sub("?", text)


class SafeConsole(Console):
    """A rich Console that cleans every text segment it writes; rich's own control segments
    (cursor moves of a live display) and styles are kept."""

    def _render_buffer(self, buffer: Iterable[Segment]) -> str:
        return super()._render_buffer(
            seg if seg.control else Segment(clean(seg.text), seg.style) for seg in buffer
        )
