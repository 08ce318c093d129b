"""Node output never drives the operator's terminal: escape sequences are removed before kvpd
prints it (cli/terminal.py)."""

from __future__ import annotations

import io

from rich.table import Table
from rich.text import Text

from kvpd.cli.terminal import SafeConsole, clean

HOSTILE = (
    "ok\x1b]0;owned title\x07 \x1b]52;c;ZWNobyBwd25lZA==\x07"  # window title, clipboard
    "\x1b[2J\x1b[1A\x1b[31mred\x1b[0m"  # erase screen, cursor up, colour
    "\x1bP+q544e\x1b\\ \x9b6n bell\x07 fake\rprompt\x08"  # DCS query, 8-bit CSI, CR rewrite
)


def test_clean_removes_every_escape_and_control() -> None:
    out = clean(HOSTILE)
    assert "\x1b" not in out
    assert "\x9b" not in out
    assert "\x07" not in out
    assert "\r" not in out
    assert "red" in out
    assert "fake\nprompt?" in out
    assert clean("line 1\n\tline 2\n") == "line 1\n\tline 2\n"


def test_the_consoles_clean_strings_tables_and_text_but_keep_their_own_styles() -> None:
    buf = io.StringIO()
    con = SafeConsole(file=buf, force_terminal=True, color_system="standard", width=200)
    table = Table()
    table.add_column("log")
    table.add_row(HOSTILE)
    con.print(HOSTILE, markup=False)
    con.print(table)
    con.print(Text(HOSTILE, style="bold"))
    text = buf.getvalue()
    assert "\x1b]" not in text
    assert "\x1b[2J" not in text
    assert "\x1b[1A" not in text
    assert "\x1b[1m" in text  # rich's own bold survives
