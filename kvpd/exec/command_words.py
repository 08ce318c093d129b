"""Shell words and environments both transports validate the same way (no paramiko needed)."""

from __future__ import annotations

import re
import shlex

from kvpd.errors import PlanError

ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


def quote_word(word: str) -> str:
    """One shell word that the remote POSIX shell reads back verbatim.

    shlex.quote leaves words made only of "safe" characters bare; a bare `A=b` in command
    position would be taken as a variable assignment, so such words are quoted too.
    """
    if not isinstance(word, str):
        raise PlanError(f"command words must be strings, got {type(word).__name__}: {word!r}")
    if "\0" in word:
        raise PlanError(f"a command word contains a NUL byte, which no shell can pass: {word!r}")
    quoted = shlex.quote(word)
    return quoted if quoted.startswith("'") else f"'{quoted}'"


def check_env(env: dict[str, str] | None) -> dict[str, str]:
    """The environment, validated: names must be shell identifiers, values NUL-free strings."""
    for name, value in (env or {}).items():
        if not isinstance(name, str) or not ENV_NAME.match(name):
            raise PlanError(
                f"invalid environment variable name {name!r}: names must match "
                "[A-Za-z_][A-Za-z0-9_]* (letters, digits, underscore; not starting with a "
                "digit). Rename it in the profile's env settings."
            )
        if not isinstance(value, str) or "\0" in value:
            raise PlanError(f"environment variable {name}: value must be a NUL-free string")
    return dict(env or {})
