"""Quoting for the launch scripts kvpd renders (pure).

Values are data, never code: everything is single-quoted except `$NAME` / `${NAME}` references,
which are kept as "${NAME}" so profiles can extend e.g. LD_LIBRARY_PATH. Command substitution,
backticks and globbing can never come out of a profile value.
"""

from __future__ import annotations

import re
import shlex

_VAR = re.compile(r"\$(?:\{([A-Za-z_][A-Za-z0-9_]*)\}|([A-Za-z_][A-Za-z0-9_]*))")
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
SECRET_NAME = re.compile(r"(KEY|TOKEN|SECRET|PASS|CREDENTIAL|AUTH|COOKIE)", re.IGNORECASE)


def quote(arg: str) -> str:
    return shlex.quote(arg)


def quote_expanding(value: str) -> str:
    """Quote `value` for sh, letting only $NAME/${NAME} expand."""
    parts: list[str] = []
    pos = 0
    for m in _VAR.finditer(value):
        if m.start() > pos:
            parts.append(shlex.quote(value[pos : m.start()]))
        parts.append('"${%s}"' % (m.group(1) or m.group(2)))
        pos = m.end()
    if pos < len(value) or not parts:
        parts.append(shlex.quote(value[pos:]))
    return "".join(parts)


def mask(name: str, value: str) -> str:
    """What to show for an env value in plans and logs."""
    return "****" if SECRET_NAME.search(name) else value


def command_lines(argv: tuple[str, ...] | list[str], indent: str = "    ") -> str:
    """argv as a readable, correctly quoted multi-line shell command (one option per line)."""
    words = [quote(a) for a in argv]
    lines: list[str] = []
    i = 0
    head = []
    while i < len(words) and not words[i].startswith("-"):
        head.append(words[i])
        i += 1
    lines.append(" ".join(head))
    while i < len(words):
        cur = [words[i]]
        i += 1
        while i < len(words) and not words[i].startswith("-"):
            cur.append(words[i])
            i += 1
        lines.append(indent + " ".join(cur))
    return " \\\n".join(lines)
