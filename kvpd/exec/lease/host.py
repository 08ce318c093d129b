"""Taking, renewing and releasing a deployment's lease on its lease host.

Where: one host per deployment holds the lease, the first of the plan's hosts by name, so every
controller with the same profile (and inventory) picks the same one without asking anyone. The
file is `~/.kvpd/leases/<deployment>.json` in the login user's home on that host: a run dir
will not do, as a `local` deployment's relative run dir lies under the controller's working
folder (a second folder would see another dir) and `down --purge` removes run dirs; and a run
dir is private (0700) to its login user anyway, so the user's home is as shared as the
deployment itself. If the lease host is unreachable no change is made (the error says so):
two controllers that cannot see the lease could both change the deployment; `--break-lease`
goes on without a lease, which the user confirms.

How: every step is one `sh` snippet (LEASE_SH) run under `flock` on a lock file next to the
lease, so reading the clock, the file's mtime and content, and a compare-and-swap of the
content are each atomic on the host: a write happens only if the content is still what the
controller read and judged (kvpd.exec.lease.model.decide). Two controllers taking over the same
expired or broken lease thus cannot both win; the loser re-reads and is refused naming the
winner. While the change runs, a thread renews the lease every third of its time to live (a
new `seq`, so the content changes and the host stamps a new mtime); a SIGKILLed kvpd stops
renewing and its lease expires after the time to live. A normal exit or Ctrl-C releases the
lease, removing it only if its content is still the one this controller last wrote.
"""

from __future__ import annotations

import getpass
import os
import secrets
import socket
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from kvpd.errors import TransportError
from kvpd.exec import procfs
from kvpd.exec.lease import model as lease
from kvpd.exec.lease.model import (
    Decision,
    Holder,
    LeaseHeld,
    LeaseLost,
    LeaseRecord,
    Operation,
    Seen,
    Verdict,
)
from kvpd.exec.transport import Transport
from kvpd.plan.value import Plan

LEASE_DIR = "~/.kvpd/leases"
UNLEASED = "unleased"  # the `--break-lease` target when the lease host is unreachable
_ATTEMPTS = 5  # compare-and-swap retries when the lease changed between a read and a write

# $1 mode (read | write | drop), $2 lease file, $3 the version read before ('' = no lease
# file), $4 the new content (write). Under flock on "<dir>/.lock". A version is the file's
# `cksum` (CRC and size: any bytes, and a renewal changes it). read prints the host's epoch
# seconds, then, if there is a lease file, its mtime, its version and at most MAX_BYTES + 1
# bytes of it. write and drop exit 4 unless the version is still $3; write replaces the file
# (temp file + rename) and prints the new version, drop removes it. Exit 3: the dir, the lock or
# the write failed (stderr says).
LEASE_SH = r"""mode=$1 f=$2 want=$3 new=${4-}
d=${f%/*}
umask 077
[ -d "$d" ] || mkdir -p -- "$d" || exit 3
exec 9>>"$d/.lock" || exit 3
flock -w 20 9 || { echo "flock on $d/.lock failed" >&2; exit 3; }
[ -d "$f" ] && { echo "$f is a directory, not a lease file" >&2; exit 3; }
cur=
[ -f "$f" ] && [ ! -L "$f" ] && { cur=$(cksum <"$f") || exit 3; }
if [ "$mode" = read ]; then
  date +%s
  [ -n "$cur" ] || exit 0
  stat -c %Y -- "$f" && printf '%s\n' "$cur" && head -c 4097 -- "$f"
  exit
fi
[ "$cur" = "$want" ] || exit 4
if [ "$mode" = drop ]; then rm -f -- "$f"; exit; fi
t="$f.$$.tmp"
printf '%s' "$new" >"$t" && mv -f -- "$t" "$f" || { rm -f -- "$t"; exit 3; }
cksum <"$f"
"""
CHANGED = 4
Mode = Literal["read", "write", "drop"]  # LEASE_SH's $1
MAX_READ = lease.MAX_BYTES + 1  # one byte more than a record may have: too large is seen


def lease_host(plan: Plan) -> str:
    """The host holding `plan`'s lease: the first by name (see the module doc)."""
    return min(h.name for h in plan.hosts)


def lease_path(deployment: str) -> str:
    return f"{LEASE_DIR}/{deployment}.json"


def me(pid: int | None = None) -> Holder:
    """This controller: login user, host name, PID and its start time, machine (boot id and PID
    namespace: a same-named host elsewhere must not judge this machine's PIDs)."""
    pid = os.getpid() if pid is None else pid
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
        ns = os.readlink("/proc/self/ns/pid").strip("pid:[]")
    except OSError:
        boot, ns = "unknown", "0"
    return Holder(
        user=lease.word(getpass.getuser()),
        host=lease.word(socket.gethostname()),
        pid=pid,
        start_ticks=_start_ticks(pid),
        machine=lease.word(f"{boot}:{ns}"),
    )


def _start_ticks(pid: int) -> int:
    try:
        st = procfs.parse_stat(Path(f"/proc/{pid}/stat").read_text())
    except OSError:
        return 0
    return st.start_ticks if st else 0


def gone_here(record: LeaseRecord | None, here: Holder) -> frozenset[tuple[int, int]]:
    """{(pid, start_ticks)} of the record's holder when it ran on this machine and is gone."""
    if record is None or (record.holder.host, record.holder.machine) != (here.host, here.machine):
        return frozenset()
    h = record.holder
    if h.start_ticks > 0 and _start_ticks(h.pid) != h.start_ticks:
        return frozenset({(h.pid, h.start_ticks)})
    return frozenset()


class LeaseHostError(TransportError):
    """The lease host could not be asked (`--break-lease` may go on without a lease)."""


@dataclass
class HostLease:
    """The lease file of one deployment on its lease host, through `t`."""

    t: Transport
    deployment: str

    @property
    def where(self) -> str:
        return f"{self.t.host}:{lease_path(self.deployment)}"

    def _run(self, mode: Mode, want: str = "", new: str = "") -> tuple[int, str]:
        argv = [
            "sh",
            "-c",
            LEASE_SH,
            "kvpd-lease",
            mode,
            self.t.resolve(lease_path(self.deployment)),
        ]
        r = self.t.run([*argv, want, new], timeout_s=30)
        if r.exit_code not in (0, CHANGED):
            raise LeaseHostError(
                f"the lease of deployment {self.deployment!r} on host {self.t.host} could not "
                f"be {'read' if mode == 'read' else 'written'} (exit {r.exit_code}): "
                f"{r.stderr.strip()[-300:] or 'no message'}. The host needs sh, flock and a "
                f"writable home ({LEASE_DIR})"
            )
        return r.exit_code, r.stdout

    def read(self) -> Seen:
        """The host's clock and the lease file as it is now (untrusted: see lease.parse)."""
        _, out = self._run("read")
        lines = out.split("\n", 3)
        try:
            now = int(lines[0])
            mtime = int(lines[1]) if len(lines) > 2 else None
        except ValueError:
            raise LeaseHostError(
                f"host {self.t.host} answered the lease read of {self.deployment!r} with "
                f"something other than a clock and an mtime: {out[:80]!r}"
            ) from None
        if mtime is None:
            return Seen(now)
        return Seen(now, mtime, lines[3] if len(lines) > 3 else "", lines[2])

    def swap(self, want: str, new: str | None) -> str | None:
        """Replace the lease file of version `want` ('' = none) by `new` (None: remove it):
        the new version ('' after a removal), or None when the file changed meanwhile and
        nothing was written."""
        code, out = self._run("drop" if new is None else "write", want, new or "")
        if code == CHANGED:
            return None
        return out.strip()


@dataclass
class Held:
    """A lease this controller holds: its record and the file's version on the host."""

    host: HostLease
    record: LeaseRecord
    version: str
    decision: Decision  # what taking it found (FREE, EXPIRED, HOLDER_GONE or BROKEN)
    replaced: LeaseRecord | None  # the lease it took over, if readable


def take(
    host: HostLease,
    operation: Operation,
    *,
    ttl_s: int,
    take_over: str = "",
    holder: Holder | None = None,
) -> Held:
    """Take the lease for `operation`, or raise LeaseHeld naming its holder."""
    here = holder or me()
    for _ in range(_ATTEMPTS):
        seen = host.read()
        prev = parsed(seen.content)
        d = lease.decide(seen, here, ttl_s=ttl_s, take_over=take_over, gone=gone_here(prev, here))
        if not d.may_take:
            raise LeaseHeld(lease.held_message(host.deployment, d, host.where), seen.target)
        mine = LeaseRecord(secrets.token_hex(16), here, operation, seen.now, ttl_s)
        version = host.swap(seen.version, mine.render())
        if version is not None:
            return Held(host, mine, version, d, prev)
    raise LeaseHeld(
        f"the lease of deployment {host.deployment!r} changed {_ATTEMPTS} times while kvpd "
        f"tried to take it ({host.where}): other controllers are racing for it; try again",
        "",
    )


def parsed(content: str | None) -> LeaseRecord | None:
    """The record in `content`, or None for no lease file or one kvpd cannot read."""
    if content is None:
        return None
    try:
        return lease.parse(content)
    except ValueError:
        return None


class Renewer:
    """Renews a held lease every third of its time to live until `release`; `lost` says why
    the lease is no longer ours once it was taken over meanwhile."""

    def __init__(self, held: Held) -> None:
        self.held = held
        self.lost = ""
        self._stop = threading.Event()
        self._lock = threading.Lock()
        name = f"kvpd-lease-{held.host.deployment}"
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)

    def start(self) -> Renewer:
        self._thread.start()
        return self

    def _loop(self) -> None:
        interval = max(0.5, self.held.record.ttl_s / 3)
        while not self._stop.wait(interval):
            if not self.renew():
                return

    def renew(self) -> bool:
        """One renewal; False once the lease is lost (then `lost` says to whom)."""
        with self._lock:
            if self.lost:
                return False
            h = self.held
            new = h.record.renewed()
            try:
                version = h.host.swap(h.version, new.render())
            except TransportError:
                return True  # try again next time; the lease expires if the host stays away
            if version is None:
                self.lost = self._who_took()
                return False
            h.record, h.version = new, version
            return True

    def _who_took(self) -> str:
        try:
            seen = self.held.host.read()
        except TransportError as e:
            return f"it changed on its host and could not be read again ({e})"
        now = lease.holder_line(parsed(seen.content)) if seen.content is not None else "nobody"
        return f"the lease was taken over; it is now held by {now}"

    def release(self) -> str:
        """Stop renewing and remove the lease if it is still ours: '' or why it was not."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=60)
        with self._lock:
            if self.lost:
                return self.lost
            h = self.held
            try:
                if h.host.swap(h.version, None) is None:
                    self.lost = self._who_took()
            except TransportError as e:
                return f"the lease at {h.host.where} was not released ({e}); it expires by itself"
            return self.lost


def lost_error(deployment: str, why: str) -> LeaseLost:
    return LeaseLost(
        f"deployment {deployment!r} was changed by another controller while this change ran: "
        f"{why}. Check `kvpd status` before changing it again"
    )


__all__ = ["Held", "HostLease", "LeaseHeld", "LeaseHostError", "Renewer", "Verdict", "take"]
