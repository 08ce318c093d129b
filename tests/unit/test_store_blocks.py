"""kvpd's KV block store without vLLM: keys, tiers, disk budget, and what it does with bad files."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kvpd.connectors import blockstore
from kvpd.connectors.blockstore import BlockStore
from kvpd.connectors.dram_tier import DramTier
from kvpd.connectors.hashing import StoreIdentity, chain_keys
from kvpd.connectors.settings import parse_settings
from kvpd.connectors.store_folder import StoreConfigError

REPO = Path(__file__).resolve().parents[2]
IDENT = StoreIdentity(model="/models/tiny", dtype="bfloat16", layout="L2", block_size=4)
LAYOUT = "test-layout:v1"


def payload(i: int, size: int = 4096) -> bytes:
    return bytes((i * 7 + j) % 251 for j in range(size))


def key(i: int) -> bytes:
    return chain_keys(IDENT, list(range(i * 4, i * 4 + 4)))[0]


@pytest.fixture
def store(tmp_path: Path) -> BlockStore:
    s = BlockStore(tmp_path, LAYOUT, dram_bytes=0, io_threads=2)
    yield s
    s.close()


# ---- keys ----------------------------------------------------------------------------------


KEYS_SCRIPT = """
from kvpd.connectors.hashing import StoreIdentity, chain_keys
ident = StoreIdentity(model="/models/tiny", dtype="bfloat16", layout="L2", block_size=4, tp_size=2)
print(",".join(k.hex() for k in chain_keys(ident, list(range(19)), tp_rank=1)))
"""


def test_keys_are_stable_across_processes_and_hash_seeds() -> None:
    ident = StoreIdentity(
        model="/models/tiny", dtype="bfloat16", layout="L2", block_size=4, tp_size=2
    )
    here = ",".join(k.hex() for k in chain_keys(ident, list(range(19)), tp_rank=1))
    for seed in ("0", "1", "random"):
        env = dict(os.environ, PYTHONHASHSEED=seed)
        out = subprocess.run(
            [sys.executable, "-c", KEYS_SCRIPT],
            env=env,
            cwd=REPO,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        assert out == here


def test_keys_cover_full_blocks_and_chain_over_the_prefix() -> None:
    a = chain_keys(IDENT, list(range(10)))  # 2 full blocks of 4, a partial one has no key
    assert len(a) == 2
    b = chain_keys(IDENT, list(range(8)) + [99, 98, 97, 96])
    assert b[:2] == a
    assert len(b) == 3
    # same block tokens after a different prefix: a different key (the parent is hashed in)
    c = chain_keys(IDENT, [5, 5, 5, 5] + list(range(4, 8)))
    assert c[1] != a[1]
    assert chain_keys(IDENT, list(range(12)), limit=1) == a[:1]


@pytest.mark.parametrize(
    "field,value",
    [
        ("model", "/models/other"),
        ("dtype", "float16"),
        ("layout", "L3"),
        ("block_size", 2),
        ("tp_size", 2),
    ],
)
def test_every_identity_field_changes_the_keys(field: str, value: object) -> None:
    other = StoreIdentity(**{**{f: getattr(IDENT, f) for f in IDENT.__slots__}, field: value})
    assert chain_keys(other, list(range(8)))[0] != chain_keys(IDENT, list(range(8)))[0]


def test_tp_ranks_get_disjoint_keys() -> None:
    ident = StoreIdentity(model="m", dtype="bfloat16", layout="L", block_size=4, tp_size=2)
    assert chain_keys(ident, list(range(4)), tp_rank=0) != chain_keys(
        ident, list(range(4)), tp_rank=1
    )
    with pytest.raises(ValueError):
        chain_keys(ident, list(range(4)), tp_rank=2)


# ---- tiers ---------------------------------------------------------------------------------


def test_dram_tier_is_a_byte_budgeted_lru() -> None:
    d = DramTier(capacity_bytes=300)
    for i in range(3):
        d.put(bytes([i]), b"x" * 100)
    assert d.get(b"\x00") is not None  # 0 becomes most recently used
    d.put(b"\x03", b"y" * 100)  # evicts 1, the least recently used
    assert b"\x01" not in d
    assert b"\x00" in d
    assert b"\x03" in d
    assert d.used == 300
    d.put(b"big", b"z" * 301)  # larger than the tier: not cached, nothing evicted
    assert b"big" not in d
    assert len(d) == 3


def test_roundtrip_and_prefix_lookup(store: BlockStore) -> None:
    assert store.put(key(0), payload(0)) is True
    assert store.put(key(0), payload(0)) is False  # already there
    assert store.put(key(1), memoryview(payload(1))) is True
    assert store.get(key(0)) == payload(0)
    assert store.get_many([key(1), key(2)]) == [payload(1), None]
    assert store.lookup_prefix([key(0), key(1), key(2), key(0)]) == 2
    path = store.path_of(key(0))
    assert path.parent.parent == store.data
    assert len(path.parent.name) == 3
    c = store.counters.snapshot()
    assert (c["hits"], c["misses"], c["blocks_written"], c["bytes_written"]) == (2, 1, 2, 8192)


def test_dram_tier_serves_repeat_reads(tmp_path: Path) -> None:
    s = BlockStore(tmp_path, LAYOUT, dram_bytes=1 << 20)
    s.put(key(0), payload(0))
    s.path_of(key(0)).unlink()  # the disk copy is gone; the DRAM copy still serves
    assert s.get(key(0)) == payload(0)
    assert s.counters.snapshot()["dram_hits"] == 1


def test_two_stores_share_one_folder(tmp_path: Path) -> None:
    a = BlockStore(tmp_path, LAYOUT)
    b = BlockStore(tmp_path, LAYOUT, dram_bytes=1 << 20)
    a.put(key(3), payload(3))
    assert b.lookup_prefix([key(3)]) == 1
    assert b.get(key(3)) == payload(3)
    other = BlockStore(tmp_path, "another-layout")
    assert other.get(key(3)) is None  # another KV layout never reads these bytes


def test_disk_budget_evicts_least_recently_used(tmp_path: Path) -> None:
    size = 4096 + BlockStore(tmp_path, LAYOUT).header_len
    s = BlockStore(tmp_path, LAYOUT, capacity_bytes=10 * size)
    for i in range(10):
        s.put(key(i), payload(i))
    past = time.time() - 1000
    for i in range(10):  # make recency explicit: block i used at past + i
        os.utime(s.path_of(key(i)), (past + i, past + i))
    assert s.get(key(0)) == payload(0)  # reading makes block 0 the most recently used
    for i in range(10, 13):
        s.put(key(i), payload(i))
    assert s.disk_usage() <= 10 * size
    assert s.path_of(key(0)).exists()
    assert not s.path_of(key(1)).exists()
    assert not s.path_of(key(2)).exists()
    assert all(s.path_of(key(i)).exists() for i in range(10, 13))
    assert s.counters.snapshot()["evicted"] >= 3


# ---- reliability -----------------------------------------------------------------------------


def test_flipped_payload_byte_is_a_miss_and_removed(store: BlockStore) -> None:
    store.put(key(0), payload(0))
    path = store.path_of(key(0))
    data = bytearray(path.read_bytes())
    data[-100] ^= 0x01
    path.write_bytes(bytes(data))
    assert store.peek(key(0))  # the header is fine; only the checksum can tell
    assert store.get(key(0)) is None
    assert not path.exists()
    assert store.counters.snapshot()["corrupt"] == 1


def test_flipped_header_byte_is_a_miss_at_lookup(store: BlockStore) -> None:
    store.put(key(0), payload(0))
    path = store.path_of(key(0))
    data = bytearray(path.read_bytes())
    data[9] ^= 0xFF  # inside the format version
    path.write_bytes(bytes(data))
    assert store.lookup_prefix([key(0)]) == 0
    assert not path.exists()


def test_truncated_file_is_a_miss_and_removed(store: BlockStore) -> None:
    store.put(key(0), payload(0))
    store.put(key(1), payload(1))
    for k, cut in ((key(0), 1000), (key(1), 3)):
        p = store.path_of(k)
        p.write_bytes(p.read_bytes()[:cut])
    assert store.get(key(0)) is None
    assert not store.path_of(key(0)).exists()
    assert store.lookup_prefix([key(1)]) == 0
    assert not store.path_of(key(1)).exists()
    assert store.put(key(0), payload(0))
    assert store.get(key(0)) == payload(0)


KILLED_WRITER = """
import sys, time
from pathlib import Path
from kvpd.connectors import blockstore
from kvpd.connectors.blockstore import BlockStore

def fake_stalling_write_all(fd, parts):  # fault injection: half the block, then hang
    import os
    data = b"".join(bytes(p) for p in parts)
    os.write(fd, data[: len(data) // 2])
    Path(sys.argv[2]).write_text("half")
    time.sleep(60)

blockstore._write_all = fake_stalling_write_all
BlockStore(sys.argv[1], sys.argv[3]).put(bytes.fromhex(sys.argv[4]), bytes(range(256)) * 64)
"""


def test_writer_killed_half_way_leaves_no_visible_block(tmp_path: Path) -> None:
    root, marker = tmp_path / "store", tmp_path / "marker"
    root.mkdir()
    proc = subprocess.Popen(
        [sys.executable, "-c", KILLED_WRITER, str(root), str(marker), LAYOUT, key(5).hex()],
        cwd=REPO,
    )
    try:
        deadline = time.monotonic() + 60
        while not marker.exists():
            assert proc.poll() is None, "writer did not start"
            assert time.monotonic() < deadline, "writer did not start"
            time.sleep(0.05)
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.wait()
    s = BlockStore(root, LAYOUT)
    assert not s.path_of(key(5)).exists()
    assert s.lookup_prefix([key(5)]) == 0
    assert s.get(key(5)) is None
    temps = list(s.path_of(key(5)).parent.glob("*.tmp"))
    assert len(temps) == 1  # the dead writer's partial file, never under the block's name
    old = time.time() - blockstore.STALE_TMP_S - 10
    os.utime(temps[0], (old, old))
    s.disk_usage()  # a scan removes temp files of dead writers
    assert not temps[0].exists()
    assert s.put(key(5), payload(5))
    assert s.get(key(5)) == payload(5)


RACING_WRITER = """
import sys
from kvpd.connectors.blockstore import BlockStore
s = BlockStore(sys.argv[1], sys.argv[2])
keys = [bytes.fromhex(k) for k in sys.argv[3].split(",")]
for _ in range(int(sys.argv[4])):
    for i, k in enumerate(keys):
        s.put(k, bytes([i]) * 65536, overwrite=True)
"""


def test_two_writers_racing_on_the_same_blocks(tmp_path: Path) -> None:
    keys = [key(i) for i in range(4)]
    args = [str(tmp_path), LAYOUT, ",".join(k.hex() for k in keys), "150"]
    writers = [
        subprocess.Popen([sys.executable, "-c", RACING_WRITER, *args], cwd=REPO) for _ in range(2)
    ]
    reader = BlockStore(tmp_path, LAYOUT)
    seen = 0
    while any(w.poll() is None for w in writers):
        for i, k in enumerate(keys):
            got = reader.get(k)
            if got is not None:
                assert got == bytes([i]) * 65536
                seen += 1
    assert all(w.returncode == 0 for w in writers)
    assert reader.counters.snapshot()["corrupt"] == 0
    assert [reader.get(k) for k in keys] == [bytes([i]) * 65536 for i in range(4)]
    assert not list(tmp_path.rglob("*.tmp"))


def test_missing_store_folder_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(StoreConfigError, match=r"does not exist.*mkdir -p"):
        BlockStore(tmp_path / "nope", LAYOUT)


def test_read_only_store_folder_is_a_clear_error(tmp_path: Path) -> None:
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    try:
        with pytest.raises(StoreConfigError, match=r"read-only.*chmod u\+w"):
            BlockStore(ro, LAYOUT)
    finally:
        ro.chmod(0o755)
    f = tmp_path / "file"
    f.write_text("x")
    with pytest.raises(StoreConfigError, match="not a folder"):
        BlockStore(f, LAYOUT)


# ---- settings --------------------------------------------------------------------------------


def test_settings_defaults_and_unknown_keys() -> None:
    s = parse_settings({"store_path": "/kv", "capacity_gb": 2, "io_threads": 8})
    assert (s.store_path, s.dram_cache_gb, s.capacity_bytes, s.io_threads) == (
        "/kv",
        0.5,
        2 << 30,
        8,
    )
    with pytest.raises(StoreConfigError, match=r"'dram_cache_g' \(did you mean 'dram_cache_gb'"):
        parse_settings({"store_path": "/kv", "dram_cache_g": 1})
    with pytest.raises(StoreConfigError, match="needs kv_connector_extra_config.store_path"):
        parse_settings({})
    with pytest.raises(StoreConfigError, match="io_threads must be an integer >= 1"):
        parse_settings({"store_path": "/kv", "io_threads": 0})
    with pytest.raises(StoreConfigError, match="capacity_gb must be > 0"):
        parse_settings({"store_path": "/kv", "capacity_gb": 0})
    with pytest.raises(StoreConfigError, match="dram_cache_gb must be a number"):
        parse_settings({"store_path": "/kv", "dram_cache_gb": "1"})


def test_get_into_reads_verified_blocks_into_caller_rows(tmp_path) -> None:
    import os as _os

    from kvpd.connectors.blockstore import BlockStore

    store = BlockStore(tmp_path, "layout-x", io_threads=2)
    blocks = {bytes([i]) * 32: _os.urandom(4096) for i in range(6)}
    store.put_many(blocks.items())
    staging = bytearray(6 * 4096)
    rows = [memoryview(staging)[i * 4096 : (i + 1) * 4096] for i in range(6)]
    keys = list(blocks)
    missing = b"\xff" * 32
    found = store.get_many_into([*keys[:5], missing], rows)
    assert found == [True] * 5 + [False]
    for i in range(5):
        assert bytes(rows[i]) == blocks[keys[i]]
    victim = store.path_of(keys[0])  # a flipped byte: not served, and removed
    raw = bytearray(victim.read_bytes())
    raw[-1] ^= 0xFF
    victim.write_bytes(bytes(raw))
    assert store.get_into(keys[0], rows[0]) is False
    assert not victim.exists()
    assert store.get_into(keys[1], memoryview(bytearray(100))) is False  # other size: a miss,
    assert store.path_of(keys[1]).exists()  # but the block itself is fine and stays
    store.close()


def test_blocks_are_readable_by_the_deployment_user_only(tmp_path: Path) -> None:
    """Blocks are KV of users' prompts: no other local user reads them or plants new ones."""
    old = os.umask(0o022)
    try:
        s = BlockStore(tmp_path, LAYOUT, dram_bytes=0, io_threads=2)
        assert s.put(key(1), payload(1))
    finally:
        os.umask(old)
    blocks = list((tmp_path / blockstore.DATA_DIR).rglob(f"*{blockstore.SUFFIX}"))
    assert blocks
    assert all(b.stat().st_mode & 0o077 == 0 for b in blocks)
    assert (tmp_path / blockstore.DATA_DIR).stat().st_mode & 0o077 == 0
    assert blocks[0].parent.stat().st_mode & 0o077 == 0
    s.close()
