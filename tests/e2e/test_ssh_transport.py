"""SSHTransport against the namespace test bed: host keys, files, detached processes, jump
hosts, hostile values that must arrive verbatim, and connection timings (printed with -s)."""

from __future__ import annotations

import socket
import statistics
import subprocess
import sys
import threading
import time
import uuid

import pytest

from kvpd.errors import HostKeyError, PlanError, TransportError
from kvpd.exec.fanout import raise_for_failures, run_on_hosts
from kvpd.exec.ssh import SSHTransport
from kvpd.plan.value import HostSpec

pytestmark = pytest.mark.ssh

CANARY = "kvpd-canary"
# Each would run `touch kvpd-canary` (or similar) if it ever reached a shell unquoted.
HOSTILE = [
    "with space",
    "  leading and trailing  ",
    "it's",
    'double"quote',
    f"$(touch {CANARY})",
    f"`touch {CANARY}`",
    f"; touch {CANARY}",
    f"&& touch {CANARY}",
    f"|| touch {CANARY}",
    f"| touch {CANARY}",
    f"a\ntouch {CANARY}",
    f"'; touch {CANARY}; '",
    f'"; touch {CANARY}; "',
    f"> {CANARY}",
    f"& touch {CANARY} &",
    "*",
    "?",
    "[a-z]*",
    "~",
    "~root",
    "$HOME",
    "${HOME}",
    "$((1+1))",
    "\\",
    "back\\slash\\n",
    "tab\there",
    "a=b",
    "-n",
    "--",
    "!",
    "#not a comment",
    "{a,b}",
    "ünïcödé ✓",
    "",
]
# Directory and file names: no "/" and not empty.
HOSTILE_NAMES = [v for v in HOSTILE if v and "/" not in v and v not in (".", "..")]
BAD_ENV_NAMES = ["A B", "A;touch x", "1A", "A-B", "$(x)", "A=B", "", "A\nB", "Ä", "A.B"]


def wait_until(cond, timeout_s: float = 10.0, interval_s: float = 0.05) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(interval_s)
    return bool(cond())


def sha256_fingerprint(pub_path: str) -> str:
    out = subprocess.run(
        ["ssh-keygen", "-l", "-E", "sha256", "-f", pub_path],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return out.split()[1]  # "256 SHA256:... comment (ED25519)"


@pytest.fixture
def h1(testbed):
    t = SSHTransport(testbed.spec("h1"))
    yield t
    t.close()


@pytest.fixture
def workdir(h1):
    """A fresh directory under /tmp on h1 (private to h1), removed afterwards."""
    d = f"/tmp/kvpd-ssh-test-{uuid.uuid4().hex[:8]}"
    assert h1.run(["mkdir", "-p", d]).ok
    yield d
    h1.run(["rm", "-rf", "--", d])


def assert_no_canary(t: SSHTransport, *dirs: str) -> None:
    r = t.run(["find", "/root", "/tmp", *dirs, "-maxdepth", "4", "-name", f"*{CANARY}*"])
    # The hostile-named directories themselves contain the word: only real files count.
    hits = [p for p in r.stdout.splitlines() if p.rsplit("/", 1)[-1] == CANARY]
    assert hits == [], f"injection: {hits}"


# -- connecting ------------------------------------------------------------------------------


def test_connect_with_verified_host_key(testbed, h1) -> None:
    r = h1.run(["hostname"])
    assert r.ok
    assert r.stdout.strip() == "h1"
    assert h1.run(["id", "-u"]).stdout.strip() == "0"


def test_unknown_host_key_refused_with_fingerprint(testbed, tmp_path) -> None:
    empty = tmp_path / "known_hosts"
    empty.write_text("")
    t = SSHTransport(testbed.spec("h1", known_hosts=str(empty)))
    with pytest.raises(HostKeyError) as e:
        t.run(["true"])
    msg = str(e.value)
    assert sha256_fingerprint(testbed.host_key_pub("h1")) in msg
    assert "ssh-ed25519" in msg
    assert testbed.addresses["h1"] in msg
    assert "--accept-new-host-keys" in msg
    assert "ssh-keyscan" in msg
    assert empty.read_text() == ""  # nothing was accepted


def test_accept_flag_records_the_key_then_plain_connect_works(testbed, tmp_path) -> None:
    kh = tmp_path / "sub" / "known_hosts"  # the directory is created too
    t = SSHTransport(testbed.spec("h2", known_hosts=str(kh)), accept_unknown_host_key=True)
    assert t.run(["hostname"]).stdout.strip() == "h2"
    t.close()
    line = kh.read_text().split()
    assert line[0] == testbed.addresses["h2"]
    assert line[1] == "ssh-ed25519"
    pub = open(testbed.host_key_pub("h2")).read().split()[1]
    assert line[2] == pub
    t2 = SSHTransport(testbed.spec("h2", known_hosts=str(kh)))  # no flag: now known
    assert t2.run(["hostname"]).stdout.strip() == "h2"
    t2.close()


def test_changed_host_key_is_refused_even_with_accept_flag(testbed, tmp_path) -> None:
    # known_hosts claims h1's address has h2's key: exactly what a changed key looks like.
    kh = tmp_path / "known_hosts"
    h2_key = " ".join(open(testbed.host_key_pub("h2")).read().split()[:2])
    kh.write_text(f"{testbed.addresses['h1']} {h2_key}\n")
    t = SSHTransport(testbed.spec("h1", known_hosts=str(kh)), accept_unknown_host_key=True)
    with pytest.raises(HostKeyError) as e:
        t.run(["true"])
    msg = str(e.value)
    assert "CHANGED" in msg
    assert sha256_fingerprint(testbed.host_key_pub("h1")) in msg  # what the host offered
    assert sha256_fingerprint(testbed.host_key_pub("h2")) in msg  # what we expected
    assert "ssh-keygen" in msg
    assert "-R" in msg
    assert kh.read_text().count("\n") == 1  # not overwritten


def test_auth_failure_names_host_and_fix(testbed, tmp_path) -> None:
    other = tmp_path / "other_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other)], check=True)
    t = SSHTransport(testbed.spec("h3", key=str(other)))
    with pytest.raises(TransportError) as e:
        t.run(["true"])
    assert not isinstance(e.value, HostKeyError)
    msg = str(e.value)
    assert "h3" in msg
    assert testbed.addresses["h3"] in msg
    assert "authentication failed" in msg
    assert "authorized_keys" in msg


def test_unreachable_host_names_address_and_fix(testbed) -> None:
    spec = testbed.spec("h1", name="ghost", address="10.213.0.250")  # no such host on the bridge
    t = SSHTransport(spec, connect_timeout_s=1.0)
    with pytest.raises(TransportError) as e:
        t.run(["true"])
    msg = str(e.value)
    assert "ghost" in msg
    assert "10.213.0.250" in msg
    assert "Fix" in msg
    refused = SSHTransport(testbed.spec("h1", port=2), connect_timeout_s=2.0)
    with pytest.raises(TransportError, match="cannot connect"):
        refused.run(["true"])


def test_reconnects_after_a_dropped_connection(testbed, h1) -> None:
    assert h1.run(["true"]).ok
    conn = h1._conn
    assert conn is not None
    # Fault injection: cut the TCP connection under paramiko's feet.
    conn.client.get_transport().sock.shutdown(socket.SHUT_RDWR)
    assert wait_until(lambda: not conn.active, 5)
    assert h1.run(["hostname"]).stdout.strip() == "h1"
    assert h1._conn is not conn


def _cut_link_in(h: SSHTransport, seconds: float) -> threading.Timer:
    """Fault injection: the TCP connection cut under paramiko's feet `seconds` from now."""
    conn = h._conn
    assert conn is not None
    sock = conn.client.get_transport().sock
    timer = threading.Timer(seconds, lambda: sock.shutdown(socket.SHUT_RDWR))
    timer.start()
    return timer


def test_a_read_only_command_runs_again_when_the_link_drops_while_it_runs(testbed, h1) -> None:
    """A probe that only reads (a process's state, the listening ports) is run again on a new
    connection: `down` and `status` on a cluster must not fail on a link lost mid-probe."""
    assert h1.run(["true"]).ok
    first = h1._conn
    _cut_link_in(h1, 1.0)  # fires while the command below sleeps (it starts in milliseconds)
    r = h1.run(["sh", "-c", "sleep 3; echo probed"], idempotent=True)
    assert (r.exit_code, r.stdout.strip()) == (0, "probed"), r
    assert h1._conn is not first


def test_a_command_that_may_change_the_host_is_not_run_again(testbed, h1, workdir) -> None:
    """Anything else reports that it may or may not have run: running it twice could start a
    process twice."""
    marker = f"{workdir}/ran-{uuid.uuid4().hex}"
    assert h1.run(["true"]).ok
    _cut_link_in(h1, 1.0)
    with pytest.raises(TransportError, match=r"connection lost while running .* may or may not"):
        h1.run(["sh", "-c", f"echo x >> {marker}; sleep 3"])
    assert wait_until(lambda: h1.run(["cat", marker]).ok, 5)
    assert h1.run(["cat", marker]).stdout == "x\n"  # once


def test_parallel_operations_share_one_connection(testbed, h1) -> None:
    out = run_on_hosts(
        lambda i: h1.run(["sh", "-c", f"sleep 0.2; echo {i}"]).stdout.strip(),
        range(12),
        key=str,
    )
    assert [o.value for o in out.values()] == [str(i) for i in range(12)]
    assert h1.run(["true"]).ok


# -- files and commands ----------------------------------------------------------------------


def test_run_put_read_resolve(testbed, h1, workdir) -> None:
    assert h1.resolve("a/b") == "/root/a/b"
    assert h1.resolve("~/x/../y") == "/root/y"
    assert h1.resolve("/etc//hosts") == "/etc/hosts"
    path = f"{workdir}/deep/er/file.sh"
    h1.put(path, b"#!/bin/sh\necho hi\n", mode=0o755)
    assert h1.read(path) == b"#!/bin/sh\necho hi\n"
    assert h1.run(["stat", "-c", "%a", path]).stdout.strip() == "755"
    assert h1.run([path]).stdout == "hi\n"
    h1.put(path, b"replaced", mode=0o600)  # atomic replace; no temp file left behind
    assert h1.read(path) == b"replaced"
    assert h1.run(["ls", "-A", f"{workdir}/deep/er"]).stdout.split() == ["file.sh"]
    big = bytes(range(256)) * 4096 * 4  # 4 MiB
    h1.put(f"{workdir}/big", big)
    assert h1.read(f"{workdir}/big") == big
    with pytest.raises(FileNotFoundError):
        h1.read(f"{workdir}/missing")
    # Relative paths are under the login directory.
    h1.put("kvpd-ssh-test-rel.txt", b"rel")
    assert h1.run(["cat", "/root/kvpd-ssh-test-rel.txt"]).stdout == "rel"
    h1.run(["rm", "-f", "/root/kvpd-ssh-test-rel.txt"])
    r = h1.run(["sh", "-c", "echo out; echo err >&2; exit 3"], env={"X": "1"})
    assert (r.exit_code, r.stdout, r.stderr) == (3, "out\n", "err\n")
    assert h1.run(["pwd"], cwd=workdir).stdout.strip() == workdir
    assert h1.run(["no-such-command-kvpd"]).exit_code == 127
    assert h1.run(["pwd"], cwd=f"{workdir}/nope").exit_code == 127
    r = h1.run(["sleep", "10.123"], timeout_s=0.5)
    assert r.exit_code == 124
    assert "timed out" in r.stderr
    # ... and the remote command was stopped, not left running without its channel.
    probe = ["sh", "-c", "grep -sl '10\\.12[3]' /proc/[0-9]*/cmdline; exit 0"]
    assert wait_until(lambda: h1.run(probe).stdout == "", 5)  # sleep alone would take 10 s


def test_hosts_have_private_tmp(testbed, h1, workdir) -> None:
    h2 = SSHTransport(testbed.spec("h2"))
    try:
        assert h2.run(["test", "-e", workdir]).exit_code == 1
        assert h2.run(["hostname"]).stdout.strip() == "h2"
    finally:
        h2.close()


# -- processes -------------------------------------------------------------------------------


def test_detached_process_survives_transport_close(testbed, workdir) -> None:
    t1 = SSHTransport(testbed.spec("h1"))
    s = t1.start_detached(
        ["sh", "-c", 'echo "started $V"; exec sleep 300'],
        log=f"{workdir}/logs/p.log",
        cwd=workdir,
        env={"V": "v1"},
    )
    assert s.pgid == s.pid
    assert s.start_ticks > 0
    assert s.log == f"{workdir}/logs/p.log"
    t1.close()

    t2 = SSHTransport(testbed.spec("h1"))
    try:
        assert t2.alive(s.pid, start_ticks=s.start_ticks)
        assert not t2.alive(s.pid, start_ticks=s.start_ticks + 1)
        assert t2.group_alive(s.pgid) == [s.pid]
        assert wait_until(lambda: t2.read(s.log) == b"started v1\n")
        stat = t2.run(["cat", f"/proc/{s.pid}/stat"]).stdout
        fields = stat.rsplit(")", 1)[1].split()
        assert int(fields[3]) == s.pid  # field 6, session id: it leads its own session
        # A wrong start_ticks means "not ours": nothing is signalled.
        assert not t2.signal_group(s.pgid, 15, start_ticks=s.start_ticks + 1)
        assert t2.alive(s.pid)
        assert t2.signal_group(s.pgid, 15, start_ticks=s.start_ticks)
        assert wait_until(lambda: not t2.alive(s.pid))
        assert t2.group_alive(s.pgid) == []
        assert not t2.signal_group(s.pgid, 15, start_ticks=s.start_ticks)
        # The log is appended to, never truncated.
        s2 = t2.start_detached(["echo", "second"], log=s.log, cwd=workdir)
        assert wait_until(lambda: not t2.alive(s2.pid))
        assert wait_until(lambda: t2.read(s.log) == b"started v1\nsecond\n")
    finally:
        t2.close()


def test_group_signal_reaches_children_after_leader_exit(testbed, h1, workdir) -> None:
    s = h1.start_detached(
        ["sh", "-c", "sleep 300 & sleep 300 & echo $! > kids; exit 0"],
        log="kids.log",
        cwd=workdir,
    )
    assert wait_until(lambda: not h1.alive(s.pid))  # the leader is gone, reaped by PID 1
    members = h1.group_alive(s.pgid)
    assert len(members) == 2
    assert s.pid not in members
    assert h1.signal_group(s.pgid, 15, start_ticks=s.start_ticks)
    assert wait_until(lambda: h1.group_alive(s.pgid) == [])


def test_zombie_counts_as_dead(testbed, h1, workdir) -> None:
    # `sleep 0` exits at once; its parent became `sleep 300` by exec and never waits for it.
    s = h1.start_detached(
        ["sh", "-c", "sleep 0 & echo $! > zpid; exec sleep 300"], log="z.log", cwd=workdir
    )
    try:
        assert wait_until(lambda: h1.run(["cat", f"{workdir}/zpid"]).stdout.strip() != "")
        z = int(h1.read(f"{workdir}/zpid"))

        def state() -> str:
            out = h1.run(["cat", f"/proc/{z}/stat"]).stdout
            return out.rsplit(")", 1)[1].split()[0] if out else ""

        assert wait_until(lambda: state() == "Z")
        assert h1.run(["sh", "-c", f"kill -0 {z}"]).ok  # what fools a naive check
        assert not h1.alive(z)
        assert h1.group_alive(s.pgid) == [s.pid]  # the zombie is not listed
    finally:
        h1.signal_group(s.pgid, 9, start_ticks=s.start_ticks)
    assert wait_until(lambda: not h1.alive(s.pid))


def test_start_detached_reports_bad_command_and_cwd(testbed, h1, workdir) -> None:
    with pytest.raises(TransportError, match="command not found"):
        h1.start_detached(["no-such-command-kvpd"], log="x.log", cwd=workdir)
    with pytest.raises(TransportError, match="nope"):
        h1.start_detached(["true"], log="x.log", cwd=f"{workdir}/nope")


def test_ports_listening(testbed, h1, workdir) -> None:
    port = 18123
    s = h1.start_detached(
        [sys.executable, "-m", "http.server", str(port), "--bind", testbed.addresses["h1"]],
        log="http.log",
        cwd=workdir,
    )
    h2 = SSHTransport(testbed.spec("h2"))
    try:
        assert wait_until(lambda: h1.ports_listening([22, port, 9]) == [22, port], 20)
        assert h2.ports_listening([port]) == []  # another host: its own network namespace
    finally:
        h2.close()
        h1.signal_group(s.pgid, 15, start_ticks=s.start_ticks)
    assert wait_until(lambda: h1.ports_listening([port]) == [])


# -- jump hosts ------------------------------------------------------------------------------


def test_proxy_jump_through_h1_to_h2(testbed) -> None:
    spec = testbed.spec("h2", jump=f"root@{testbed.addresses['h1']}:22")
    t = SSHTransport(spec)
    try:
        r = t.run(["sh", "-c", 'hostname; echo "$SSH_CONNECTION"'])
        name, conn = r.stdout.splitlines()
        assert name == "h2"
        assert conn.split()[0] == testbed.addresses["h1"]  # the client, as h2 sees it, is h1
        t.put("/tmp/via-jump", b"ok")
        assert t.read("/tmp/via-jump") == b"ok"
    finally:
        t.close()


def test_proxy_jump_verifies_the_jump_host_key(testbed, tmp_path) -> None:
    kh = tmp_path / "known_hosts"
    kh.write_text(
        "".join(
            line + "\n"
            for line in open(testbed.known_hosts).read().splitlines()
            if not line.startswith(testbed.addresses["h1"] + " ")
        )
    )
    spec = testbed.spec("h2", jump=f"root@{testbed.addresses['h1']}", known_hosts=str(kh))
    with pytest.raises(HostKeyError) as e:
        SSHTransport(spec).run(["true"])
    assert "jump host" in str(e.value)
    assert sha256_fingerprint(testbed.host_key_pub("h1")) in str(e.value)


def test_ssh_config_alias_and_proxy_jump_from_the_users_file(testbed, tmp_path) -> None:
    """Only the alias in the profile: HostName, User, Port, IdentityFile, known_hosts and the
    jump host all come from ssh_config (the bed writes one like a user would)."""
    cfg = tmp_path / "ssh_config"
    cfg.write_text(open(testbed.ssh_config).read() + "Host via-h1-to-h2\n  HostName "
                   f"{testbed.addresses['h2']}\n  User root\n  IdentityFile {testbed.key}\n"
                   f"  UserKnownHostsFile {testbed.known_hosts}\n  ProxyJump h1\n")  # fmt: skip
    for alias, name in (("h3", "h3"), ("via-h1-to-h2", "h2")):
        t = SSHTransport(HostSpec(name=name, address=alias), ssh_config=str(cfg))
        try:
            r = t.run(["sh", "-c", 'hostname; echo "$SSH_CONNECTION"'])
            assert r.ok, r.stderr
            got, conn = r.stdout.splitlines()
            assert got == name
            if alias.startswith("via"):
                assert conn.split()[0] == testbed.addresses["h1"]
        finally:
            t.close()


# -- hostile values --------------------------------------------------------------------------


def test_hostile_argv_arrives_verbatim(testbed, h1, workdir) -> None:
    r = h1.run(["printf", "%s\\0", *HOSTILE], cwd=workdir)
    assert r.ok, r.stderr
    assert r.stdout.split("\0")[:-1] == HOSTILE
    for v in HOSTILE:  # also as the command name itself (not found, never executed)
        if v.startswith("-") or v == "":
            continue
        assert h1.run([v], cwd=workdir).exit_code in (126, 127), v
    assert_no_canary(h1, workdir)


def test_hostile_env_values_arrive_verbatim(testbed, h1, workdir) -> None:
    env = {f"V{i}": v for i, v in enumerate(HOSTILE)}
    code = "import os, sys; sys.stdout.write('\\0'.join(os.environ[f'V{i}'] for i in range(%d)))"
    r = h1.run([sys.executable, "-c", code % len(HOSTILE)], env=env, cwd=workdir)
    assert r.ok, r.stderr
    assert r.stdout.split("\0") == HOSTILE
    assert_no_canary(h1, workdir)


@pytest.mark.parametrize("name", BAD_ENV_NAMES)
def test_invalid_env_names_are_rejected(testbed, h1, workdir, name) -> None:
    with pytest.raises(PlanError, match="invalid environment variable name"):
        h1.run(["true"], env={name: "x"}, cwd=workdir)
    with pytest.raises(PlanError, match="invalid environment variable name"):
        h1.start_detached(["true"], log="x.log", cwd=workdir, env={name: "x"})
    assert_no_canary(h1, workdir)


def test_hostile_paths_and_cwd(testbed, h1, workdir) -> None:
    for name in HOSTILE_NAMES:
        d = f"{workdir}/{name}"
        h1.put(f"{d}/{name}", name.encode())
        assert h1.read(f"{d}/{name}") == name.encode()
        assert h1.run(["cat", "--", f"{d}/{name}"]).stdout == name
        r = h1.run(["pwd"], cwd=d)
        assert r.ok, (name, r)
        assert r.stdout == d + "\n", (name, r)
    listing = h1.run(["find", workdir, "-mindepth", "1", "-maxdepth", "1", "-printf", "%f\\0"])
    assert sorted(listing.stdout.split("\0")[:-1]) == sorted(HOSTILE_NAMES)
    assert_no_canary(h1, workdir)


def test_hostile_detached_start(testbed, h1, workdir) -> None:
    for i, name in enumerate(HOSTILE_NAMES):
        d = f"{workdir}/{name}"
        h1.put(f"{d}/.keep", b"")
        log = f"{d}/{name}.log"
        code = "import os, sys; print(os.getcwd()); print(os.environ['V']); print(sys.argv[1])"
        s = h1.start_detached([sys.executable, "-c", code, name], log=log, cwd=d, env={"V": name})
        assert s.log == log
        assert wait_until(lambda s=s: not h1.alive(s.pid)), i
        assert h1.read(log).decode() == f"{d}\n{name}\n{name}\n", name
    assert_no_canary(h1, workdir)


# -- fan-out and timings ---------------------------------------------------------------------


def test_fanout_collects_values_and_errors(testbed) -> None:
    specs = [testbed.spec(n) for n in testbed.names]
    specs.append(testbed.spec("h1", name="ghost", address="10.213.0.250"))

    def hostname(spec) -> str:
        t = SSHTransport(spec, connect_timeout_s=1.0)
        try:
            return t.run(["hostname"]).stdout.strip()
        finally:
            t.close()

    out = run_on_hosts(hostname, specs, max_workers=8)
    assert list(out) == [*testbed.names, "ghost"]
    assert {n: out[n].value for n in testbed.names} == {n: n for n in testbed.names}
    assert isinstance(out["ghost"].error, TransportError)
    with pytest.raises(TransportError, match="ghost"):
        raise_for_failures(out, "hostname")


def test_measure_connect_exec_and_parallelism(testbed) -> None:
    """Prints the numbers; asserts only a ratio within this run."""
    connect = []
    for _ in range(5):
        t = SSHTransport(testbed.spec("h1"))
        t0 = time.perf_counter()
        t.connect()
        connect.append(time.perf_counter() - t0)
        t.close()
    t = SSHTransport(testbed.spec("h1"))
    t.run(["true"])
    execs = []
    for _ in range(20):
        t0 = time.perf_counter()
        t.run(["hostname"])
        execs.append(time.perf_counter() - t0)
    t.close()

    def connect_and_run(command: str):
        def one(spec) -> str:
            tr = SSHTransport(spec)
            try:
                return tr.run(["sh", "-c", command]).stdout
            finally:
                tr.close()

        return one

    specs = [testbed.spec(n) for n in testbed.names]
    ratios = {}
    for label, command in (
        ("trivial `hostname`", "hostname"),
        ("`hostname; sleep 0.3`", "hostname; sleep 0.3"),
    ):
        fn = connect_and_run(command)
        t0 = time.perf_counter()
        for spec in specs:
            fn(spec)
        serial = time.perf_counter() - t0
        t0 = time.perf_counter()
        out = run_on_hosts(fn, specs)
        parallel = time.perf_counter() - t0
        assert all(o.ok for o in out.values())
        ratios[label] = (serial, parallel)
    print(
        f"\nSSH timings: connect+auth median {statistics.median(connect) * 1000:.0f} ms "
        f"(min {min(connect) * 1000:.0f}, max {max(connect) * 1000:.0f}, n=5); "
        f"exec `hostname` on an open connection median {statistics.median(execs) * 1000:.1f} "
        f"ms (min {min(execs) * 1000:.1f}, n=20)"
    )
    for label, (serial, parallel) in ratios.items():
        print(
            f"  {len(specs)} hosts, connect + {label}: serial {serial:.3f} s, "
            f"parallel {parallel:.3f} s ({serial / parallel:.1f}x)"
        )
    serial, parallel = ratios["`hostname; sleep 0.3`"]
    assert parallel < serial
