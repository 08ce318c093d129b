"""Host records and the per-user index on a host, through its Transport only.

The record lives in the deployment's run dir (`RECORD_FILE`, mode 0600): the dir `up` makes
private and marks as the deployment's, so it goes with the run dir and no other user can
write it. The index (`INDEX_DIR` in the login user's home: one file per deployment naming its
run dir) is what another deployment's `up` and preflight read to find the records on a host
without knowing their profiles: the home is the one place every controller logging in as that
user finds, and kvpd can only ever signal that user's processes anyway. The index is a hint for
naming conflicts; nothing is acted on through it.
"""

from __future__ import annotations

import hashlib
import posixpath

from kvpd.exec.records.model import INDEX_DIR, RECORD_FILE, HostRecord
from kvpd.exec.records.validate import MAX_RECORD_BYTES
from kvpd.exec.transport import Transport
from kvpd.plan.value import Plan

# $1 file, $2 byte limit. Exit 3: no such file; 4: not a regular file. At most $2 bytes, so a
# huge file planted in the run dir cannot exhaust the controller's memory.
READ_SH = r"""f=$1
[ -e "$f" ] || [ -L "$f" ] || exit 3
[ -f "$f" ] && [ ! -L "$f" ] || { echo "$f is not a regular file" >&2; exit 4; }
head -c "$2" -- "$f"
"""
# $1 index dir, $2 record file name, $3 byte limit: per indexed deployment RS name US run dir
# US record (the record part empty when there is none).
LIST_SH = r"""d=$1
[ -d "$d" ] || exit 0
for f in "$d"/*; do
  [ -f "$f" ] && [ ! -L "$f" ] || continue
  dir=$(head -c 4096 -- "$f" | head -n 1)
  printf '\036%s\037%s\037' "${f##*/}" "$dir"
  r="$dir/$2"
  [ -f "$r" ] && [ ! -L "$r" ] && head -c "$3" -- "$r"
done
exit 0
"""


class RecordUnreadable(OSError):
    """The host could not be asked (or answered with an error)."""


def record_path(plan: Plan, host: str) -> str:
    """Where `host`'s record of `plan` is, as the plan names the run dir (the transport
    resolves a relative one under the login dir, as `up` did)."""
    return posixpath.join(plan.host(host).run_dir, RECORD_FILE)


def index_path(deployment: str, run_dir: str) -> str:
    """One entry per deployment and run dir: two instances of one deployment name in other
    run dirs (two checkouts on one machine) do not overwrite each other's entry."""
    tag = hashlib.sha256(run_dir.encode()).hexdigest()[:12]
    return posixpath.join(INDEX_DIR, f"{deployment}@{tag}")  # '@' is in no deployment name


def read_raw(t: Transport, path: str) -> bytes | None:
    """The record file's bytes (at most one more than a record may have), None if absent."""
    r = t.run(["sh", "-c", READ_SH, "kvpd-record", t.resolve(path), str(MAX_RECORD_BYTES + 1)],
              timeout_s=30)  # fmt: skip
    if r.exit_code == 3:
        return None
    if not r.ok:
        raise RecordUnreadable(f"reading {path} on {t.host} failed: {r.stderr.strip()[-200:]}")
    return r.stdout.encode("utf-8", "surrogateescape")


def write(t: Transport, record: HostRecord) -> None:
    """The record, atomically (the transport's temp file + rename), mode 0600."""
    t.put(posixpath.join(record.run_dir, RECORD_FILE), record.to_bytes(), mode=0o600)


def write_index(t: Transport, deployment: str, run_dir: str) -> None:
    t.put(index_path(deployment, run_dir), (run_dir + "\n").encode(), mode=0o600)


def remove(t: Transport, run_dir: str, deployment: str) -> None:
    """Remove the record and the index entry: nothing of the deployment runs on the host."""
    paths = [posixpath.join(run_dir, RECORD_FILE), t.resolve(index_path(deployment, run_dir))]
    r = t.run(["rm", "-f", "--", *paths], timeout_s=30)
    if not r.ok:
        raise RecordUnreadable(f"removing the host record on {t.host}: {r.stderr.strip()}")


def list_indexed(t: Transport) -> list[tuple[str, str, bytes]]:
    """(deployment, run dir, raw record) of every deployment the host's index names."""
    r = t.run(["sh", "-c", LIST_SH, "kvpd-index", t.resolve(INDEX_DIR), RECORD_FILE,
               str(MAX_RECORD_BYTES + 1)], timeout_s=30)  # fmt: skip
    if not r.ok:
        raise RecordUnreadable(f"listing {INDEX_DIR} on {t.host}: {r.stderr.strip()[-200:]}")
    out = []
    for entry in r.stdout.split("\036")[1:]:
        parts = entry.split("\037", 2)
        if len(parts) == 3:
            name = parts[0].split("@", 1)[0]
            out.append((name, parts[1], parts[2].encode("utf-8", "surrogateescape")))
    return out
