"""kvpd's descriptors against what MemFabric's `offload.sparse_copy` accepts (memfabric-hybrid
1.3.0, which installs and imports on x86 without an NPU), without calling into the device.

Checked: the Python entry takes the four descriptor tensors and a device; it passes their
`data_ptr()`s to the binding (intercepted here instead of launching the kernel); the kernel
shipped in the wheel reads sources/destinations as uint64, lengths and the count as uint32, and
pairs entry g (K) with g + count/2 (V). A CPU stand-in for the kernel then follows those rules
over the intercepted addresses, copying from a host pool into a hot buffer, and every top-k
position's slot must hold that token's K and V bytes.
"""

from __future__ import annotations

import ctypes
import inspect
import re
import sys
from pathlib import Path

import numpy as np
import pytest

ap = pytest.importorskip("kvpd.native.ascend_planner", reason="kvpd's native core is not built")
mf = pytest.importorskip(
    "memfabric_hybrid", reason="memfabric-hybrid is not installed (pyproject's dev extra)"
)

KERNEL_H = "_kernel/acc_offload/operators/acc_offload_sparse_copy.h"


class TensorStandIn:
    """STAND-IN for a pinned CPU torch tensor: what the wrapper uses of it (data_ptr)."""

    def __init__(self, array: np.ndarray) -> None:
        self.array = array

    def data_ptr(self) -> int:
        return self.array.ctypes.data


class DeviceStandIn:
    """STAND-IN for torch.device('npu:3')."""

    index = 3


def kernel_source() -> str:
    return (Path(mf.__file__).parent / KERNEL_H).read_text()


def test_binding_takes_four_addresses_and_a_device() -> None:
    params = list(inspect.signature(mf.offload.sparse_copy).parameters)
    assert params == ["srcPtrs", "dstPtrs", "lenPtrs", "sizePtr", "deviceId"]
    impl = sys.modules["mf_acc_offload"].sparse_copy_impl
    assert "sparse_copy(srcPtrs: typing.SupportsInt, dstPtrs: typing.SupportsInt" in impl.__doc__


def test_kernel_element_types_match_the_descriptor_dtypes() -> None:
    src = kernel_source()
    # OffloadSparseCopyKernel picks the KV kernel (size >= cores) or the MoE one; both read so:
    assert re.search(r"inputs_ = reinterpret_cast<__gm__ uint64_t \*>\(inputs\)", src)
    assert re.search(r"outputs_ = reinterpret_cast<__gm__ uint64_t \*>\(outputs\)", src)
    assert re.search(r"lens_ = reinterpret_cast<__gm__ uint32_t \*>\(lens\)", src)
    assert re.search(r"size_ = \*\(reinterpret_cast<__gm__ uint32_t \*>\(size\)\)", src)
    assert "half_ = size_ >> 1" in src
    assert "uint32_t vIdx = group + half_" in src
    assert (
        "OffloadSparseCopyKernel<uint8_t>"
        in (
            Path(mf.__file__).parent / "_kernel/acc_offload/operators/acc_offload_sparse_copy.cpp"
        ).read_text()
    )  # lengths count bytes


def test_descriptors_drive_the_copy_right(monkeypatch) -> None:
    rows, k, cap, max_token, block, tok_k, tok_v = 3, 16, 32, 512, 16, 64, 16
    rng = np.random.default_rng(5)
    blocks = max_token // block
    # Host pool: K and V of every (block, offset) hold recognisable bytes.
    n_blocks = rows * blocks + 7
    host_k = rng.integers(0, 256, (n_blocks, block, tok_k), dtype=np.uint8)
    host_v = rng.integers(0, 256, (n_blocks, block, tok_v), dtype=np.uint8)
    hot_k = np.zeros((rows, cap, tok_k), np.uint8)
    hot_v = np.zeros((rows, cap, tok_v), np.uint8)
    bt = (rng.permutation(n_blocks)[: rows * blocks]).reshape(rows, blocks).astype(np.int32)

    last = np.full(rows, -1, np.int64)
    stt = np.full((rows, cap), -1, np.int32)
    lru = np.tile(np.arange(cap, dtype=np.int32), (rows, 1))
    cur, mt, ms = (np.empty((rows, k), np.int32) for _ in range(3))
    mc = np.empty(rows, np.int32)
    ws = [np.zeros(shape, np.int32) for shape in ((8, max_token), (8, max_token), (8, 3 * cap))]
    ws += [np.zeros((8, k), np.int32), np.zeros(8, np.int32)]
    gvas, addr = np.zeros(2 * rows * k, np.int64), np.zeros(2 * rows * k, np.int64)
    size, num = np.zeros(2 * rows * k, np.int32), np.zeros(1, np.int32)
    calls = []
    monkeypatch.setattr(
        sys.modules["mf_acc_offload"], "sparse_copy_impl", lambda *a: calls.append(a) or 0
    )
    req = np.arange(rows, dtype=np.int64)
    stable = np.full(rows, max_token, np.int32)
    for _ in range(4):
        topk = np.stack([rng.permutation(max_token)[:k] for _ in range(rows)]).astype(np.int32)
        ptrs = [a.ctypes.data for a in (req, last, topk, stable, stt, lru, cur, mc, mt, ms, *ws)]
        ap.lru_resident_compact(*ptrs, rows, k, cap, max_token, 8, 2)
        ap.compute_lru_resident_addrs(
            mc, mt, ms, bt, block, tok_k, tok_v, host_k.ctypes.data, host_v.ctypes.data,
            hot_k.ctypes.data, hot_v.ctypes.data, cap, 2, gvas, addr, size, num,
        )  # fmt: skip
        mf.offload.sparse_copy(
            *(TensorStandIn(a) for a in (gvas, addr, size, num)), DeviceStandIn()
        )
        src_p, dst_p, len_p, size_p, device = calls.pop()
        assert (src_p, dst_p, len_p, size_p, device) == (
            gvas.ctypes.data, addr.ctypes.data, size.ctypes.data, num.ctypes.data, 3,
        )  # fmt: skip
        kernel_stand_in(src_p, dst_p, len_p, size_p)
        for r in range(rows):
            for p, t in enumerate(topk[r]):
                s = cur[r, p]
                b, off = bt[r, t // block], t % block
                assert (hot_k[r, s] == host_k[b, off]).all()
                assert (hot_v[r, s] == host_v[b, off]).all()


def kernel_stand_in(src_p: int, dst_p: int, len_p: int, size_p: int) -> None:
    """STAND-IN for the AscendC kernel on the CPU, reading the descriptors as it does: count as
    uint32, addresses as uint64, lengths as uint32 bytes, entry g paired with g + count/2."""
    n = ctypes.c_uint32.from_address(size_p).value
    src = (ctypes.c_uint64 * n).from_address(src_p)
    dst = (ctypes.c_uint64 * n).from_address(dst_p)
    lens = (ctypes.c_uint32 * n).from_address(len_p)
    half = n >> 1
    for g in range(half):
        for i in (g, g + half):
            ctypes.memmove(dst[i], src[i], lens[i])
