"""The sparse-KV planner: native core and NumPy fallback against the plain-Python reference."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvpd.native import fallback
from tests.unit.native_reference import ReferencePlanner, reference_copy_descriptors

try:
    from kvpd.native import _sparse_lru as native
except ImportError:  # pragma: no cover - depends on the build
    native = None

needs_native = pytest.mark.skipif(
    native is None, reason="kvpd.native._sparse_lru is not built (no C++/OpenMP toolchain)"
)
IMPLS = [pytest.param(fallback, id="numpy"), pytest.param(native, id="native", marks=needs_native)]
FAST = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def make_steps(seed: int, n_steps: int, max_rows: int, topk: int, mml: int) -> list[tuple]:
    """Steps of (layer, topk_indices, req_ids, stable_prefix_lens) with overlapping top-k sets,
    padding, out-of-range entries, duplicates, request changes and speculative invalidation."""
    rng = np.random.default_rng(seed)
    prev = rng.integers(0, mml, size=(max_rows, topk))
    req = rng.integers(0, 3, size=max_rows)
    steps = []
    for _ in range(n_steps):
        cur = prev.copy()
        fresh = rng.random(cur.shape) < rng.choice([0.1, 0.3, 0.8])
        cur[fresh] = rng.integers(-2, mml + 3, size=int(fresh.sum()))
        rng.shuffle(cur, axis=1)
        change = rng.random(max_rows) < 0.15
        req[change] = rng.integers(0, 4, size=int(change.sum()))
        rows = int(rng.integers(1, max_rows + 1))
        stable = np.where(rng.random(max_rows) < 0.3, rng.integers(-1, mml + 2, size=max_rows), mml)
        steps.append(
            (
                int(rng.integers(0, 2)),
                np.ascontiguousarray(cur[:rows], dtype=np.int32),
                req[:rows].astype(np.int64),
                stable[:rows].astype(np.int32),
            )
        )
        prev = cur
    return steps


def as_lists(out: tuple) -> tuple:
    return tuple(np.asarray(a).tolist() for a in out)


@FAST
@given(
    seed=st.integers(0, 2**32 - 1),
    max_rows=st.integers(1, 4),
    topk=st.integers(1, 12),
    extra=st.integers(0, 8),
    mml=st.integers(1, 40),
    n_steps=st.integers(1, 8),
)
def test_planner_matches_reference(seed, max_rows, topk, extra, mml, n_steps) -> None:
    capacity = topk + extra
    ref = ReferencePlanner(2, max_rows, topk, capacity, mml)
    impls = [fallback.SparseLRUPlanner(2, max_rows, topk, capacity, mml)]
    if native is not None:
        impls.append(native.SparseLRUPlanner(2, max_rows, topk, capacity, mml, num_threads=2))
    for step in make_steps(seed, n_steps, max_rows, topk, mml):
        want = as_lists(ref.plan(*step))
        for p in impls:
            assert as_lists(p.plan(*step)) == want, type(p).__module__


def test_semantics_by_hand() -> None:
    """Hits keep their slot and become MRU; misses take the LRU slots in top-k order."""
    ref = ReferencePlanner(1, 1, 3, 4, 100)
    cur, mt, ms, mc = ref.plan(0, [[10, 11, 12]], [7], [100])
    assert (cur, mt, ms, mc) == ([[0, 1, 2]], [[10, 11, 12]], [[0, 1, 2]], [3])
    # 11 hits (slot 1); 13 takes slot 3 (never used), 14 takes slot 0 (LRU among the rest).
    cur, mt, ms, mc = ref.plan(0, [[13, 11, 14]], [7], [100])
    assert (cur, mt[0][:2], ms[0][:2], mc) == ([[3, 1, 0]], [13, 14], [3, 0], [2])
    # stable prefix 11: resident 11, 13 and 14 are invalidated and reloaded.
    cur, mt, ms, mc = ref.plan(0, [[11, 13, 13]], [7], [11])
    assert mc == [2]
    assert cur[0][1] == cur[0][2]
    assert mt[0][:2] == [11, 13]
    # A new request id resets the row.
    assert ref.plan(0, [[11, 50, -1]], [8], [100])[0] == [[0, 1, -1]]


@pytest.mark.parametrize("impl", IMPLS)
def test_repeated_token_gets_one_slot(impl) -> None:
    p = impl.SparseLRUPlanner(1, 1, 6, 8, 64)
    topk = np.array([[5, 5, -1, 9, 5, 64]], dtype=np.int32)
    cur, mt, ms, mc = p.plan(0, topk, np.array([1], np.int64), np.array([64], np.int32))
    assert cur.tolist() == [[0, 0, -1, 1, 0, -1]]
    assert mc.tolist() == [2]
    assert mt[0, :2].tolist() == [5, 9]
    assert ms[0, :2].tolist() == [0, 1]
    assert mt[0, 2:].tolist() == [-1] * 4


@needs_native
def test_thread_counts_give_identical_results() -> None:
    rows, topk, cap, mml = 24, 96, 160, 5000
    planners = [native.SparseLRUPlanner(3, rows, topk, cap, mml, num_threads=n) for n in (1, 2, 8)]
    planners.append(fallback.SparseLRUPlanner(3, rows, topk, cap, mml))
    bt = np.arange(rows * (mml // 16 + 1), dtype=np.int32).reshape(rows, -1) + 20000
    for step in make_steps(11, 12, rows, topk, mml):
        outs = [p.plan(*step) for p in planners]
        for out in outs[1:]:
            assert as_lists(out) == as_lists(outs[0])
        descs = [
            mod.build_copy_descriptors(
                *outs[0][1:], bt, 16, 2**40, 2**41, 2**42, 2**43, 1024, 128, cap, num_threads=n
            )
            for mod, n in ((native, 1), (native, 2), (native, 8), (fallback, 0))
        ]
        for d in descs[1:]:
            assert as_lists(d) == as_lists(descs[0])


@FAST
@given(
    seed=st.integers(0, 2**32 - 1),
    rows=st.integers(0, 5),
    k=st.integers(1, 10),
    capacity=st.integers(1, 12),
    block_size=st.sampled_from([1, 16, 128]),
    big=st.booleans(),
    bt64=st.booleans(),
)
def test_descriptors_match_reference(seed, rows, k, capacity, block_size, big, bt64) -> None:
    rng = np.random.default_rng(seed)
    blocks = 6
    mt = rng.integers(-3, blocks * block_size + 5, size=(rows, k)).astype(np.int32)
    ms = rng.integers(-2, capacity + 2, size=(rows, k)).astype(np.int32)
    mc = rng.integers(-1, k + 2, size=rows).astype(np.int32)
    lo = 16384 if big else 0  # block ids past 2^14 overflow 32-bit products (vLLM-Ascend bug)
    bt = rng.integers(lo, lo + 2**20, size=(rows + 1, blocks))
    bt[rng.random(bt.shape) < 0.1] = -1
    bt = bt.astype(np.int64 if bt64 else np.int32)
    bases = [int(x) << (40 if big else 8) for x in rng.integers(1, 2**20, size=4)]
    args = (mt, ms, mc, bt, block_size, *bases, 1152, 128, capacity)
    want = reference_copy_descriptors(*args)
    impls = [fallback] + ([native] if native is not None else [])
    for mod in impls:
        got = mod.build_copy_descriptors(*args)
        assert all(a.dtype == np.uint64 for a in got)
        assert as_lists(got) == tuple(want), mod.__name__


@pytest.mark.parametrize("impl", IMPLS)
def test_64bit_addresses(impl) -> None:
    blk = 40_000  # blk * block_size * token_bytes = 5.9e9 > 2^32
    bt = np.array([[blk, 70_000]], dtype=np.int32)
    mt = np.array([[3, 130]], dtype=np.int32)
    ms = np.array([[4095, 0]], dtype=np.int32)
    base = 0x7F00_0000_0000
    src, dst, sizes = impl.build_copy_descriptors(
        mt,
        ms,
        np.array([2], np.int32),
        bt,
        128,
        base,
        base + 2**36,
        2**50,
        2**51,
        1152,
        128,
        4096,
    )
    assert src.tolist() == [
        base + (blk * 128 + 3) * 1152,
        base + (70_000 * 128 + 2) * 1152,
        base + 2**36 + (blk * 128 + 3) * 128,
        base + 2**36 + (70_000 * 128 + 2) * 128,
    ]
    assert dst.tolist() == [2**50 + 4095 * 1152, 2**50, 2**51 + 4095 * 128, 2**51]
    assert sizes.tolist() == [1152, 1152, 128, 128]


def _planner(impl):
    return impl.SparseLRUPlanner(2, 4, 8, 16, 100)


GOOD = (
    np.zeros((2, 8), np.int32),
    np.zeros(2, np.int64),
    np.zeros(2, np.int32),
)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize(
    ("index", "bad", "name"),
    [
        (0, np.zeros((2, 8), np.int64), "topk_indices"),
        (0, np.zeros(16, np.int32), "topk_indices"),
        (0, np.zeros((2, 7), np.int32), "topk_indices"),
        (0, np.zeros((5, 8), np.int32), "topk_indices"),
        (0, np.zeros((8, 2), np.int32).T, "topk_indices"),
        (0, [[0] * 8] * 2, "topk_indices"),
        (1, np.zeros(2, np.int32), "req_ids"),
        (1, np.zeros(3, np.int64), "req_ids"),
        (2, np.zeros(2, np.int64), "stable_prefix_lens"),
        (2, np.zeros((2, 1), np.int32), "stable_prefix_lens"),
    ],
)
def test_plan_rejects_bad_arrays(impl, index, bad, name) -> None:
    args = list(GOOD)
    args[index] = bad
    with pytest.raises(ValueError, match=name):
        _planner(impl).plan(0, *args)


@pytest.mark.parametrize("impl", IMPLS)
def test_plan_rejects_bad_layer_and_sizes(impl) -> None:
    with pytest.raises(ValueError, match="layer"):
        _planner(impl).plan(2, *GOOD)
    with pytest.raises(ValueError, match=r"capacity \(4\) must be >= topk \(8\)"):
        impl.SparseLRUPlanner(1, 1, 8, 4, 100)
    with pytest.raises(ValueError, match="max_model_len"):
        impl.SparseLRUPlanner(1, 1, 8, 8, 0)
    with pytest.raises(ValueError, match="num_threads"):
        impl.SparseLRUPlanner(1, 1, 8, 8, 10, num_threads=-1)


def _desc_args() -> list:
    z = np.zeros((2, 4), np.int32)
    return [
        z,
        z.copy(),
        np.zeros(2, np.int32),
        np.zeros((2, 3), np.int32),
        128,
        0,
        0,
        0,
        0,
        1152,
        128,
        16,
    ]


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize(
    ("index", "bad", "name"),
    [
        (0, np.zeros((2, 4), np.int64), "miss_tokens"),
        (1, np.zeros((2, 5), np.int32), "miss_slots"),
        (2, np.zeros(3, np.int32), "miss_count"),
        (3, np.zeros((2, 3), np.float32), "block_table"),
        (3, np.zeros((1, 3), np.int32), "block_table"),
        (4, 0, "block_size"),
        (5, -1, "src_base_k"),
        (8, 2**64, "dst_base_v"),
        (9, 0, "token_bytes_k"),
        (11, 0, "capacity"),
    ],
)
def test_descriptors_reject_bad_arguments(impl, index, bad, name) -> None:
    args = _desc_args()
    args[index] = bad
    with pytest.raises(ValueError, match=name):
        impl.build_copy_descriptors(*args)


@pytest.mark.parametrize("impl", IMPLS)
def test_reset_forgets_residency(impl) -> None:
    p = impl.SparseLRUPlanner(1, 1, 2, 2, 10)
    args = (np.array([[3, 4]], np.int32), np.array([1], np.int64), np.array([10], np.int32))
    assert p.plan(0, *args)[3].tolist() == [2]
    assert p.plan(0, *args)[3].tolist() == [0]
    p.reset()
    assert p.plan(0, *args)[3].tolist() == [2]


def test_kvpd_native_0_forces_fallback() -> None:
    code = "import kvpd.native as n; print(n.IMPLEMENTATION, n.implementation_info()['reason'])"
    env = {**os.environ, "KVPD_NATIVE": "0"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split()[0] == "numpy"
    assert "KVPD_NATIVE=0" in out.stdout
