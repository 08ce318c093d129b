"""One owner per shared KV folder: the engines of every host that shares a KV folder (kvpd_store,
UCM storage, ExampleConnector's folder, the CPU rehearsal's hand-over folder) log in as one user.

Why refuse instead of opening the modes: the folder holds KV of users' prompts, so kvpd's store
connector writes its blocks 0600 in 0700 directories (readable by the deployment's user only).
An engine logged in as another user reads none of them (every lookup a silent miss, the P/D
hand-over or the prefix cache quietly gone) and cannot write into their directories. vLLM's
ExampleConnector (the CPU rehearsal's) writes each layer with safetensors, whose save_file
(0.8) creates the file 0600 whatever the umask; a decoder of another user then fails on its
first hand-over, and safetensors reports the EACCES of its open as "FileNotFoundError: No such
file or directory" for a file that is there. Group- or world-readable KV would let every local
user of every node read prompts. One login user (a service account, the same on every
node) is what a cluster gives its serving jobs.

The profile's login users are judged here (a pure check at plan time). A host whose user the
profile leaves unset logs in as whatever ssh picks (~/.ssh/config's User, else the controller's
user) and a container host runs its engines as the image's user: neither is known while
planning, so they are not compared.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from kvpd.plan.value import HostRequirements, HostSpec


def mixed_owners(
    hosts: Sequence[HostSpec], requirements: Mapping[str, HostRequirements]
) -> list[str]:
    """One message per shared folder whose hosts log in as different users (none: all fine)."""
    users = {h.name: h.user for h in hosts if h.transport == "ssh" and h.container is None}
    by_dir: dict[str, dict[str, list[str]]] = {}
    for host, need in sorted(requirements.items()):
        user = users.get(host)
        if user is None:
            continue
        for d in need.shared_dirs:
            by_dir.setdefault(d, {}).setdefault(user, []).append(host)
    return [_message(d, owners) for d, owners in sorted(by_dir.items()) if len(owners) > 1]


def _message(folder: str, owners: dict[str, list[str]]) -> str:
    who = "; ".join(f"{', '.join(hs)} as {u}" for u, hs in sorted(owners.items()))
    return (
        f"the engines sharing the KV folder {folder} would log in as different users ({who}). "
        "KV files are private to the user that writes them (they hold prompts), so an engine "
        "of another user cannot read or extend them. Fix: log in as one user on every host "
        "that shares the folder (set `ssh.user` once at the top, or the same `hosts.<name>."
        "ssh.user` on each), e.g. a service account that exists on every node."
    )
