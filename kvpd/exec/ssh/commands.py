"""Shell command lines the SSH transport sends (pure): every plan value is quoted, and the
snippets kvpd writes itself take only integers."""

from __future__ import annotations

import posixpath

from kvpd.errors import PlanError
from kvpd.exec import procfs
from kvpd.exec.command_words import check_env, quote_word
from kvpd.plan.quoting import SECRET_NAME

# Exit code when the working directory or the command is unusable: what a shell gives for a
# missing command and what LocalTransport returns for both.
NOT_FOUND = 127

# Appends "$2" to the file "$1": values travel as positional parameters, so none is parsed as
# shell code; umask 077 makes what it creates private (directories 0700, the file 0600).
APPEND_SH = 'umask 077 && mkdir -p -- "$(dirname -- "$1")" && printf "%s" "$2" >> "$1"'


def append_argv(path: str, text: str) -> list[str]:
    """The command that appends `text` to `path` through a POSIX shell (APPEND_SH)."""
    return ["sh", "-c", APPEND_SH, "kvpd-append", path, text]


# LISTEN lines of the TCP tables (header lines never match); procfs parses them.
LISTENING_SNIPPET = "awk '$4 == \"0A\"' /proc/net/tcp /proc/net/tcp6 2>/dev/null; exit 0"


def check_argv(argv: list[str]) -> None:
    if not argv:
        raise PlanError("empty command")
    if argv[0].startswith("-"):
        # `exec`/`setsid` would read it as an option of their own.
        raise PlanError(f"command name must not start with '-': {argv[0]!r}")


def command_line(
    argv: list[str], *, env: dict[str, str] | None = None, cwd: str | None = None
) -> str:
    """A POSIX shell command line running `argv` (no shell expansion of any part) with `env`
    added to the login environment, in `cwd` (relative: to the login directory)."""
    check_argv(argv)
    parts = []
    if cwd is not None:
        parts.append(f"cd -- {quote_word(cwd)} || exit {NOT_FOUND}")
    parts += [f"export {k}={quote_word(v)}" for k, v in check_env(env).items()]
    parts.append("exec " + " ".join(quote_word(a) for a in argv))
    return "; ".join(parts)


def split_secret_env(
    env: dict[str, str] | None,
) -> tuple[dict[str, str], dict[str, str] | None]:
    """(the variables whose name says secret, the rest): a secret must not be in the command
    line sshd runs, which any local user on the host sees in `ps`."""
    if not env:
        return {}, env
    secret = {k: v for k, v in env.items() if SECRET_NAME.search(k)}
    return secret, {k: v for k, v in env.items() if k not in secret}


def env_file(env: dict[str, str]) -> bytes:
    """A file of quoted assignments that `source_and_remove` reads into the environment."""
    return "".join(f"{k}={quote_word(v)}\n" for k, v in check_env(env).items()).encode()


def source_and_remove(path: str) -> str:
    """Command-line prefix: export the assignments of `path` (an env_file), then delete it."""
    q = quote_word(path)
    return f"set -a; . {q} || exit {NOT_FOUND}; set +a; rm -f -- {q}; "


def detached_command_line(
    argv: list[str], *, log: str, cwd: str, env: dict[str, str] | None = None
) -> str:
    """Start `argv` in a new session, detached from the SSH channel; print its PID and stat.

    `cd` is a separate statement (`;`, not `&&`): `cd x && cmd &` would background a subshell
    that keeps the channel's stdout open and hangs the session (testbed.md §4.2). Only the
    fully redirected `setsid` command is backgrounded; `setsid` execs in place because a
    background job of a non-interactive shell is not a group leader, so $! is the new PID and
    the new session and process group have that number.
    """
    check_argv(argv)
    lq = quote_word(log)
    parts = [
        # The log (and a log dir made for it) is private from its creation: engine output may
        # echo request text and secrets. A log kept from an earlier run loses group/other bits.
        f"(umask 077 && mkdir -p -- {quote_word(posixpath.dirname(log) or '.')} && : >>{lq}) "
        f"|| exit {NOT_FOUND}",
        f"{{ [ ! -f {lq} ] || chmod go-rwx -- {lq}; }} 2>/dev/null",
        f"cd -- {quote_word(cwd)} || exit {NOT_FOUND}",
    ]
    parts += [f"export {k}={quote_word(v)}" for k, v in check_env(env).items()]
    # Fail here, with a clear message, rather than leave "not found" in the log only.
    parts.append(
        f"command -v -- {quote_word(argv[0])} >/dev/null || "
        f"{{ echo {quote_word('command not found: ' + argv[0])} >&2; exit {NOT_FOUND}; }}"
    )
    cmd = " ".join(quote_word(a) for a in argv)
    # The new process prints its own stat line (its start time, the PID-reuse guard) on fd 3,
    # the channel, closes it and only then execs the command, which keeps PID and start time:
    # the foreground's read after `$!` finds nothing when the process has already exited and
    # the shell reaped it (a launcher that forks and exits; seen under load). Both read the
    # line with the shell's own `read`, not `cat`: a child would be a second process in the
    # new session carrying the deployment's marks, which a sweep running meanwhile would list.
    report = (
        '{ read -r _kvpd_s </proc/$$/stat && printf "%s\\n" "$_kvpd_s" >&3; } 2>/dev/null; '
        'exec 3>&-; exec "$@"'
    )
    parts.append(
        f"setsid sh -c {quote_word(report)} kvpd-start {cmd} 3>&1 >>{quote_word(log)} 2>&1 "
        "</dev/null &"
    )
    # `&` already ends the statement; what follows runs in the foreground shell. The two
    # outputs may come in either order (see processes.started).
    line = "; ".join(parts[:-1]) + "; " + parts[-1]
    return line + (
        ' p=$!; echo "$p"; { read -r _kvpd_s </proc/$p/stat && printf "%s\\n" "$_kvpd_s"; } '
        "2>/dev/null; exit 0"
    )


def stat_snippet(pid: int) -> str:
    """Print /proc/<pid>/stat, nothing if there is no such process."""
    return f"cat /proc/{int(pid)}/stat 2>/dev/null; exit 0"


def group_stats_snippet(pgid: int) -> str:
    """Print `L <stat>` for the process numbered `pgid` if it exists, then /proc/<pid>/stat of
    every process whose process group is `pgid` (any state)."""
    g = int(pgid)
    # `read` is a builtin: no fork per process. The command name may contain spaces and ')',
    # so the fields are taken after the last ") ".
    return (
        f'{{ read -r s </proc/{g}/stat && printf "L %s\\n" "$s"; }} 2>/dev/null; '
        'for f in /proc/[0-9]*/stat; do { read -r s <"$f"; } 2>/dev/null || continue; '
        'r=${s##*) }; set -- $r; [ "$3" = ' + str(g) + ' ] && printf "%s\\n" "$s"; done; exit 0'
    )


def _group_target(pgid: int, start_ticks: int) -> tuple[int, int]:
    """The integers a kill snippet takes, refused unless they name a group kvpd may signal:
    pgid > 1 (`kill -9 -1` is every process of the user) and a known start time."""
    g, t = int(pgid), int(start_ticks)
    if not procfs.signalable(g) or t <= 0:
        raise ValueError(f"refusing to signal process group {g} (leader start time {t})")
    return g, t


def _same_leader(g: int, t: int) -> str:
    """A shell test, true unless process `g` exists with a start time other than `t` (field
    22 of its stat: the 20th word after the command name's closing ") ")."""
    return (
        f"{{ ! read -r _kvpd_s </proc/{g}/stat || "
        '{ _kvpd_r=${_kvpd_s##*) }; set -- $_kvpd_r; [ "${20}" = ' + str(t) + " ]; }; } 2>/dev/null"
    )


def signal_snippet(pgid: int, sig: int, start_ticks: int) -> str:
    """Signal process group `pgid` if its leader, when it still exists, started at
    `start_ticks` (checked in the same shell just before the kill); print `sent` or `gone`."""
    g, t = _group_target(pgid, start_ticks)
    kill = f"kill -{int(sig)} -{g} 2>/dev/null"
    return f"{_same_leader(g, t)} && {kill} && echo sent || echo gone; exit 0"


def kill_later_snippet(pgid: int, start_ticks: int) -> str:
    """TERM the group now, KILL it after 2 s from a fully redirected background job (so the
    channel running this closes at once); each only while the leader, if it still exists, is
    the process that started at `start_ticks`."""
    g, t = _group_target(pgid, start_ticks)
    same = _same_leader(g, t)
    return (
        f"{same} && kill -15 -{g} 2>/dev/null; "
        f"(sleep 2; {same} && kill -9 -{g}) >/dev/null 2>&1 </dev/null & exit 0"
    )


# Prefixed to every command the SSH transport runs: its first stderr line names the login
# shell's PID (which `exec` keeps: the session and group of the command) and that process's
# start time, so a timed-out command's group is killed only while it is still that process.
SELF_IDENTITY = (
    "{ read -r _kvpd_s </proc/$$/stat; } 2>/dev/null; _kvpd_r=${_kvpd_s##*) }; "
    'set -- $_kvpd_r; echo "$$ ${20:-0}" >&2; set --; '
)


def self_identity(line: bytes) -> tuple[int, int] | None:
    """(pgid, start ticks) from the first stderr line SELF_IDENTITY prints; None if it is not
    one (then nothing is killed)."""
    words = line.split()
    if len(words) != 2 or not all(w.isdigit() for w in words):
        return None
    g, t = int(words[0]), int(words[1])
    return (g, t) if procfs.signalable(g) and t > 0 else None
