"""The tiered KV block store: an in-process DRAM LRU over one-file-per-block shared storage."""

from __future__ import annotations

import os
import socket
import struct
import threading
import time
import uuid
import zlib
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from kvpd.connectors.dram_tier import DramTier
from kvpd.connectors.store_counters import StoreCounters
from kvpd.connectors.store_folder import StoreConfigError, check_store_folder

FORMAT_VERSION = 1
MAGIC = b"KVPDBLK\x00"
# magic, format version, layout length, payload length, crc32 of the payload
_FIXED = struct.Struct("<8sHHQI")
DATA_DIR = "kvpd-blocks-v1"
SUFFIX = ".kvb"
SHARD_CHARS = 3  # 4096 shard folders, all created when a store folder is first opened
SHARDS_MARK = ".shards-ready"
GC_LOW_WATERMARK = 0.9  # evict down to 90% of the budget so GC does not run on every write
STALE_TMP_S = 600.0  # a temp file this old belongs to a writer that died
# Blocks hold request content (KV of users' prompts): readable by the deployment's user only.
# Every engine of a deployment runs as the same login user, also across hosts sharing the
# folder. The crc32 detects torn and corrupt blocks, not tampering: it is no MAC, so whoever
# can write the folder can plant blocks (poison the prefix cache); keep it the user's alone.
FILE_MODE = 0o600
DIR_MODE = 0o700


class BlockStore:
    """KV blocks keyed by content hash: DRAM LRU first, then one checksummed file per block.

    Files live at `<root>/kvpd-blocks-v1/<first 3 hex>/<64 hex>.kvb`. A writer writes a unique
    temporary name in the same folder and renames it into place, so readers see whole blocks or
    nothing, and writers racing on one block each rename identical bytes. Every read checks the
    header (format version, layout, length) and the crc32 of the payload; a block that fails is
    removed and reported as a miss. Recency for the disk budget is the file's mtime, bumped on
    each read, so LRU eviction works across processes sharing the folder.
    """

    def __init__(
        self,
        root: str | os.PathLike[str],
        layout: str,
        *,
        dram_bytes: int = 0,
        capacity_bytes: int | None = None,
        io_threads: int = 4,
    ) -> None:
        self.root = check_store_folder(root)
        self.data = self.root / DATA_DIR
        self.data.mkdir(mode=DIR_MODE, exist_ok=True)
        self._make_shards()
        self.layout = layout.encode()
        if len(self.layout) > 0xFFFF:
            raise StoreConfigError("KV layout descriptor longer than 65535 bytes")
        self.header_len = _FIXED.size + len(self.layout)
        self.dram = DramTier(dram_bytes) if dram_bytes > 0 else None
        self.capacity = capacity_bytes
        self.counters = StoreCounters()
        self._pool = ThreadPoolExecutor(max(1, io_threads), thread_name_prefix="kvpd-store-io")
        self._gc_lock = threading.Lock()
        self._used_lock = threading.Lock()
        self._used: int | None = None  # estimated bytes on disk; None until first scan
        self._tmp_tag = f"{socket.gethostname()}.{os.getpid()}"

    def _make_shards(self) -> None:
        """Create every shard folder once (a marker says it was done), so a block write is one
        open+write+rename instead of a failed open, a mkdir and a second open."""
        mark = self.data / SHARDS_MARK
        if mark.exists():
            return
        for i in range(16**SHARD_CHARS):
            (self.data / f"{i:0{SHARD_CHARS}x}").mkdir(mode=DIR_MODE, exist_ok=True)
        mark.touch()

    # -- paths and headers ------------------------------------------------------------------

    def path_of(self, key: bytes) -> Path:
        h = key.hex()
        return self.data / h[:SHARD_CHARS] / (h + SUFFIX)

    def _header(self, payload: bytes | memoryview) -> bytes:
        crc = zlib.crc32(payload)
        return _FIXED.pack(MAGIC, FORMAT_VERSION, len(self.layout), len(payload), crc) + self.layout

    def _parse_header(self, head: bytes) -> tuple[int, int] | None:
        """(payload length, crc) when `head` is a header of this store's format and layout."""
        if len(head) < self.header_len:
            return None
        magic, version, layout_len, length, crc = _FIXED.unpack_from(head)
        if magic != MAGIC or version != FORMAT_VERSION or layout_len != len(self.layout):
            return None
        if head[_FIXED.size : self.header_len] != self.layout:
            return None
        return length, crc

    # -- lookups ----------------------------------------------------------------------------

    def peek(self, key: bytes) -> bool:
        """Cheap presence check (DRAM, or a disk file whose header and size are right)."""
        if self.dram is not None and key in self.dram:
            return True
        path = self.path_of(key)
        try:
            with open(path, "rb", buffering=0) as f:
                head = f.read(self.header_len)
                size = os.fstat(f.fileno()).st_size
        except OSError:
            return False
        parsed = self._parse_header(head)
        if parsed is None or size != self.header_len + parsed[0]:
            self._remove_if_same(path, None)
            self.counters.add(corrupt=1)
            return False
        return True

    def lookup_prefix(self, keys: Sequence[bytes]) -> int:
        """How many leading keys are present (stops at the first missing block)."""
        for i, key in enumerate(keys):
            if not self.peek(key):
                return i
        return len(keys)

    # -- reads ------------------------------------------------------------------------------

    def get(self, key: bytes) -> bytes | bytearray | None:
        """The verified payload of one block, or None (absent, or corrupt and now removed)."""
        if self.dram is not None:
            value = self.dram.get(key)
            if value is not None:
                self.counters.add(hits=1, dram_hits=1)
                return value
        t0 = time.perf_counter()
        value = self._read_file(key)
        dt = time.perf_counter() - t0
        if value is None:
            self.counters.add(misses=1, read_s=dt)
            return None
        self.counters.add(hits=1, bytes_read=len(value), read_s=dt)
        if self.dram is not None:
            self.dram.put(key, value)
        return value

    def _read_file(self, key: bytes) -> bytearray | None:
        block = self._read_block(key, None)
        return None if block is None else block.obj  # type: ignore[return-value]

    def _read_block(self, key: bytes, out: memoryview | None) -> memoryview | None:
        """Read and verify one block file into `out`, or into a new buffer when `out` is None.

        A block of another size than `out` is simply not what the caller wants (None, kept);
        a bad header, a wrong length or a failed checksum is corruption: counted and removed.
        """
        path = self.path_of(key)
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError:
            return None
        ok, st, dest = False, None, out
        try:
            st = os.fstat(fd)
            parsed = self._parse_header(os.read(fd, self.header_len))
            if parsed is not None and out is not None and parsed[0] != out.nbytes:
                return None
            if parsed is not None and st.st_size == self.header_len + parsed[0]:
                if dest is None:
                    dest = memoryview(bytearray(parsed[0]))
                ok = _read_exact_into(fd, dest) and zlib.crc32(dest) == parsed[1]
        except OSError:
            ok = False
        finally:
            os.close(fd)
        if not ok:
            self.counters.add(corrupt=1)
            self._remove_if_same(path, st)  # the inode check keeps a good copy renamed over it
            return None
        if st is not None:  # always, when ok: fstat came first
            self._touch(path, st)
        return dest

    def get_into(self, key: bytes, out: memoryview) -> bool:
        """Read one verified block straight into `out` (e.g. a row of the KV staging tensor).

        No buffer is allocated per block: fresh 1 MiB allocations are page-faulted in again on
        every read (glibc gives them back to the kernel), which cost more than the read itself.
        False when the block is absent, has another size, or is corrupt (then removed).
        """
        if self.dram is not None:
            value = self.dram.get(key)
            if value is not None and len(value) == out.nbytes:
                out[:] = value
                self.counters.add(hits=1, dram_hits=1)
                return True
        t0 = time.perf_counter()
        ok = self._read_block(key, out) is not None
        dt = time.perf_counter() - t0
        if not ok:
            self.counters.add(misses=1, read_s=dt)
            return False
        self.counters.add(hits=1, bytes_read=out.nbytes, read_s=dt)
        if self.dram is not None:
            self.dram.put(key, bytes(out))
        return True

    def get_many_into(self, keys: Sequence[bytes], outs: Sequence[memoryview]) -> list[bool]:
        """`get_into` for several blocks, each worker thread reading a contiguous share."""
        n = len(keys)
        workers = min(n, self._pool._max_workers)  # our own pool
        if workers <= 1:
            return [self.get_into(k, o) for k, o in zip(keys, outs, strict=True)]
        step = -(-n // workers)

        def chunk(start: int) -> list[bool]:
            return [self.get_into(keys[i], outs[i]) for i in range(start, min(n, start + step))]

        return [ok for part in self._pool.map(chunk, range(0, n, step)) for ok in part]

    def get_many(self, keys: Sequence[bytes]) -> list[bytes | bytearray | None]:
        """`get` for several blocks at once, spread over the io threads."""
        if len(keys) <= 1:
            return [self.get(k) for k in keys]
        return list(self._pool.map(self.get, keys))

    # -- writes -----------------------------------------------------------------------------

    def put(self, key: bytes, payload: bytes | memoryview, *, overwrite: bool = False) -> bool:
        """Store one block; False when it was already on disk (content addressed: same bytes).

        `overwrite` rewrites an existing block (used to repair, and by the race tests).
        """
        path = self.path_of(key)
        if not overwrite and path.exists():
            if self.dram is not None and key not in self.dram:
                self.dram.put(key, bytes(payload))
            return False
        t0 = time.perf_counter()
        header = self._header(payload)
        tmp = path.with_name(f"{path.name}.{self._tmp_tag}.{uuid.uuid4().hex[:12]}.tmp")
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, FILE_MODE)
        except FileNotFoundError:
            path.parent.mkdir(mode=DIR_MODE, exist_ok=True)
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, FILE_MODE)
        try:
            _write_all(fd, [header, payload])
        except BaseException:
            os.close(fd)
            _unlink_quiet(tmp)
            raise
        os.close(fd)
        os.replace(tmp, path)  # atomic: readers see the old state or the whole block
        size = len(header) + len(payload)
        self.counters.add(
            bytes_written=len(payload), blocks_written=1, write_s=time.perf_counter() - t0
        )
        if self.dram is not None:
            self.dram.put(key, bytes(payload))
        self._account(size)
        return True

    def put_many(self, items: Iterable[tuple[bytes, bytes | memoryview]]) -> int:
        """Store several blocks over the io threads; returns how many were newly written."""
        batch = list(items)
        if len(batch) <= 1:
            return sum(self.put(k, v) for k, v in batch)
        return sum(self._pool.map(lambda kv: self.put(*kv), batch))

    # -- disk budget --------------------------------------------------------------------------

    def _account(self, size: int) -> None:
        if self.capacity is None:
            return
        with self._used_lock:
            if self._used is None:
                self._used = self.disk_usage()
            else:
                self._used += size
            over = self._used > self.capacity
        if over:
            self.collect_garbage()

    def _entries(self) -> list[tuple[float, int, Path]]:
        """(mtime, size, path) of every block file; removes temp files of dead writers."""
        out: list[tuple[float, int, Path]] = []
        now = time.time()
        try:
            shards = list(os.scandir(self.data))
        except OSError:
            return out
        for shard in shards:
            if not shard.is_dir():
                continue
            try:
                files = list(os.scandir(shard.path))
            except OSError:
                continue
            for entry in files:
                try:
                    st = entry.stat()
                except OSError:
                    continue
                if entry.name.endswith(SUFFIX):
                    out.append((st.st_mtime, st.st_size, Path(entry.path)))
                elif entry.name.endswith(".tmp") and now - st.st_mtime > STALE_TMP_S:
                    _unlink_quiet(Path(entry.path))
        return out

    def disk_usage(self) -> int:
        return sum(size for _, size, _ in self._entries())

    def collect_garbage(self) -> int:
        """Remove least recently used block files until usage is under the low watermark."""
        if self.capacity is None:
            return 0
        if not self._gc_lock.acquire(blocking=False):
            return 0  # another thread of this process is already collecting
        try:
            entries = self._entries()
            used = sum(size for _, size, _ in entries)
            target = int(self.capacity * GC_LOW_WATERMARK)
            removed = 0
            if used > self.capacity:
                for _, size, path in sorted(entries, key=lambda e: e[0]):
                    if used <= target:
                        break
                    _unlink_quiet(path)
                    if self.dram is not None:
                        self.dram.discard(bytes.fromhex(path.name[: -len(SUFFIX)]))
                    used -= size
                    removed += 1
            with self._used_lock:
                self._used = used
            if removed:
                self.counters.add(evicted=removed)
            return removed
        finally:
            self._gc_lock.release()

    # -- housekeeping -------------------------------------------------------------------------

    def _touch(self, path: Path, st: os.stat_result) -> None:
        # mtime is the cross-process recency for LRU; skip the metadata write if it is fresh.
        now = time.time()
        if now - st.st_mtime > 1.0:
            try:
                os.utime(path, (now, now))
            except OSError:
                pass

    def _remove_if_same(self, path: Path, st: os.stat_result | None) -> None:
        # Remove a bad block, unless a writer has just renamed a good copy over it.
        try:
            if st is not None and os.stat(path).st_ino != st.st_ino:
                return
            path.unlink()
        except OSError:
            pass

    def close(self) -> None:
        self._pool.shutdown(wait=True)


def _read_exact_into(fd: int, out: memoryview) -> bool:
    """Fill `out` from the current offset; False if the file ends early."""
    view = out.cast("B") if out.format != "B" or out.ndim != 1 else out
    got, size = 0, view.nbytes
    while got < size:
        n = os.readv(fd, [view[got:]])
        if n == 0:
            return False
        got += n
    return True


def _write_all(fd: int, parts: list[bytes | memoryview]) -> None:
    views = [memoryview(p).cast("B") for p in parts]
    while views:
        n = os.writev(fd, views)
        while views and n >= len(views[0]):
            n -= len(views[0])
            views.pop(0)
        if views and n:
            views[0] = views[0][n:]


def _unlink_quiet(path: Path) -> None:
    try:
        path.unlink()
    except OSError:
        pass
