"""Run a rendered launch script with every command recorded instead of executed (test helper).

`exec`, `source`, `mkdir` and `dirname` are shell functions that record their arguments, PATH
points nowhere (so any other command lands in `command_not_found_handle` and is recorded), and
a DEBUG trap (inherited by command substitutions through `set -T`) records the first word of
every simple command the script itself runs. A script that only does kvpd's own steps records
nothing but `set`, `cd`, `dirname`, `mkdir`, `source`, `export` and one `exec`.
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

HARNESS = r"""
rec() {
    local a
    printf 'R' >> "$REC"
    for a; do printf '%d:%s' "${#a}" "$a" >> "$REC"; done
    printf '\n' >> "$REC"
}
exec() {
    rec EXEC "$@"
    local k
    for k in $EXPECT_KEYS; do rec ENV "$k" "${!k-<unset>}"; done
}
source() { rec SOURCE "$@"; }
mkdir() { rec MKDIR "$@"; }
dirname() { local p="$1"; case "$p" in */*) printf '%s\n' "${p%/*}";; *) echo .;; esac; }
command_not_found_handle() { rec UNKNOWN "$@"; return 127; }
set -T
trap '[[ ${#FUNCNAME[@]} -eq 0 ]] && rec CMD "$BASH_COMMAND"' DEBUG
PATH=/nonexistent-kvpd-harness
. "$0"
"""
ALLOWED = {"set", "cd", "dirname", "mkdir", "source", "export", "exec"}
HARNESS_OWN = {"PATH=/nonexistent-kvpd-harness", '. "$0"'}


@dataclass
class Run:
    returncode: int
    stderr: str
    records: list[list[str]] = field(default_factory=list)

    def kind(self, name: str) -> list[list[str]]:
        return [r[1:] for r in self.records if r and r[0] == name]

    def foreign_commands(self) -> list[str]:
        """Commands the script ran that are not kvpd's own launch steps."""
        out = [" ".join(r) for r in self.kind("UNKNOWN")]
        for (cmd,) in self.kind("CMD"):
            if cmd in HARNESS_OWN:
                continue
            first = cmd.split(None, 1)[0] if cmd.strip() else ""
            if first not in ALLOWED:
                out.append(cmd)
        return out


def syntax_ok(script: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["/bin/bash", "-n", str(script)], capture_output=True, text=True)


def run_recorded(script: Path, expect_env: list[str]) -> Run:
    rec = script.with_name(script.name + ".rec")
    rec.write_bytes(b"")
    env = {
        "REC": str(rec),
        "EXPECT_KEYS": " ".join(expect_env),
        "HOME": str(script.parent),
        "LC_ALL": "C",  # ${#a} counts bytes: the records are length-prefixed
    }
    r = subprocess.run(
        ["/bin/bash", "--noprofile", "--norc", "-c", HARNESS, str(script)],
        capture_output=True,
        text=True,
        env=env,
        cwd=script.parent,
        timeout=30,
    )
    raw = rec.read_bytes()
    os.unlink(rec)
    return Run(r.returncode, r.stderr, _records(raw))


def _records(raw: bytes) -> list[list[str]]:
    """Parse `R<len>:<bytes><len>:<bytes>...\n` records (fields may hold any byte)."""
    out: list[list[str]] = []
    i = 0
    while i < len(raw):
        assert raw[i : i + 1] == b"R", raw[i : i + 20]
        i += 1
        fields: list[str] = []
        while raw[i : i + 1] != b"\n":
            colon = raw.index(b":", i)
            n = int(raw[i:colon])
            fields.append(raw[colon + 1 : colon + 1 + n].decode("utf-8", "surrogateescape"))
            i = colon + 1 + n
        out.append(fields)
        i += 1
    return out
