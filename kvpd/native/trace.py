"""Top-k traces for the sparse-KV planner: a synthetic step-to-step overlap model and .npz files."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from kvpd.errors import KvpdError


class TraceError(KvpdError):
    """A top-k trace file is missing or malformed."""

    exit_code = 2


@dataclass(frozen=True)
class TopkTrace:
    """One layer's planner inputs over decode steps (every array's first axis is the step)."""

    topk_indices: np.ndarray  # int32 [steps, rows, topk]; <0 or >= max_model_len is padding
    req_ids: np.ndarray  # int64 [steps, rows]
    stable_prefix_lens: np.ndarray  # int32 [steps, rows]
    max_model_len: int

    @property
    def steps(self) -> int:
        return int(self.topk_indices.shape[0])

    @property
    def rows(self) -> int:
        return int(self.topk_indices.shape[1])

    @property
    def topk(self) -> int:
        return int(self.topk_indices.shape[2])


def _distinct(rng: np.random.Generator, n: int, hi: int, exclude: np.ndarray) -> np.ndarray:
    """`n` distinct random tokens in [0, hi) not in `exclude` (fewer only if hi is too small)."""
    out = np.empty(0, dtype=np.int64)
    n = min(n, hi - np.unique(exclude[(exclude >= 0) & (exclude < hi)]).size)
    while out.size < n:
        draw = rng.integers(0, hi, size=2 * (n - out.size) + 8)
        draw = draw[~np.isin(draw, exclude) & ~np.isin(draw, out)]
        _, first = np.unique(draw, return_index=True)
        out = np.concatenate((out, draw[np.sort(first)][: n - out.size]))
    return out


def synthetic_topk_trace(
    *,
    steps: int,
    rows: int,
    topk: int,
    max_model_len: int,
    seq_len_range: tuple[int, int] = (20_000, 131_072),
    overlap: float = 0.8,
    revisit: float = 0.5,
    new_requests_per_step: float = 0.0,
    query_len: int = 1,
    seed: int = 0,
) -> TopkTrace:
    """Decode-like top-k sets: each step keeps `overlap` of the previous step's tokens; of the
    replacements, a `revisit` share comes back from tokens dropped in recent steps (what a hot
    buffer larger than top-k can catch) and the rest is new. The newest token is always chosen
    (it is at or past the stable prefix, so it is always a miss). `new_requests_per_step` rows
    (on average) start a new request with a fresh sequence each step."""
    rng = np.random.default_rng(seed)
    lo, hi = seq_len_range
    hi = min(hi, max_model_len - steps - 1)
    lo = min(lo, hi)
    topk_out = np.full((steps, rows, topk), -1, dtype=np.int32)
    req_out = np.zeros((steps, rows), dtype=np.int64)
    stable_out = np.zeros((steps, rows), dtype=np.int32)
    seq = rng.integers(lo, hi + 1, size=rows)
    req = np.arange(1, rows + 1, dtype=np.int64)
    next_req = rows + 1
    prev: list[np.ndarray | None] = [None] * rows
    dropped: list[np.ndarray] = [np.empty(0, dtype=np.int64) for _ in range(rows)]
    history = 4 * topk
    for step in range(steps):
        p_new = min(new_requests_per_step / rows, 1.0)
        for r in range(rows):
            if step > 0 and rng.random() < p_new:
                seq[r] = rng.integers(lo, hi + 1)
                req[r] = next_req
                next_req += 1
                prev[r], dropped[r] = None, np.empty(0, dtype=np.int64)
            seq[r] += 1
            newest = np.array([seq[r] - 1])
            old = prev[r]
            if old is None:
                chosen = np.concatenate((newest, _distinct(rng, topk - 1, seq[r], newest)))
            else:
                keep_mask = rng.random(old.size) < overlap
                keep = old[keep_mask]
                keep = np.concatenate((newest, keep[keep != newest[0]]))[:topk]
                need = topk - keep.size
                back = np.unique(dropped[r][~np.isin(dropped[r], old)])
                back = rng.permutation(back)[: int(round(need * revisit))]
                # Remember what left the top-k in this step, newest first, without repeats.
                recent = np.concatenate((old[~keep_mask], dropped[r]))
                _, first = np.unique(recent, return_index=True)
                dropped[r] = recent[np.sort(first)][:history]
                fresh = _distinct(rng, need - back.size, seq[r], np.concatenate((keep, back)))
                chosen = np.concatenate((keep, back, fresh))
            prev[r] = chosen
            topk_out[step, r, : chosen.size] = rng.permutation(chosen)
            req_out[step, r] = req[r]
            stable_out[step, r] = seq[r] - query_len
    return TopkTrace(topk_out, req_out, stable_out, int(max_model_len))


def load_topk_trace(path: Path, max_model_len: int | None = None) -> TopkTrace:
    """Read a trace saved by `save_topk_trace` (or any .npz with a `topk_indices` array of shape
    [steps, rows, topk]; `req_ids` and `stable_prefix_lens` are optional)."""
    try:
        data = np.load(path)
    except (OSError, ValueError) as e:
        raise TraceError(f"cannot read top-k trace {path}: {e}") from None
    if "topk_indices" not in data:
        raise TraceError(
            f"{path}: no 'topk_indices' array (found: {sorted(data.files)}). Save one of shape "
            "[steps, rows, topk] with numpy.savez(path, topk_indices=...)"
        )
    topk = np.ascontiguousarray(data["topk_indices"], dtype=np.int32)
    if topk.ndim != 3 or topk.shape[2] < 1:
        raise TraceError(f"{path}: topk_indices must be [steps, rows, topk], got {topk.shape}")
    steps, rows, _ = topk.shape
    req = data["req_ids"] if "req_ids" in data else np.ones((steps, rows))
    mml = int(data["max_model_len"]) if "max_model_len" in data else None
    mml = max_model_len or mml or int(topk.max(initial=0)) + 1
    stable = (
        data["stable_prefix_lens"] if "stable_prefix_lens" in data else np.full((steps, rows), mml)
    )
    for name, arr in (("req_ids", req), ("stable_prefix_lens", stable)):
        if np.shape(arr) != (steps, rows):
            raise TraceError(f"{path}: {name} must be [steps, rows] = {(steps, rows)}")
    return TopkTrace(
        topk,
        np.ascontiguousarray(req, dtype=np.int64),
        np.ascontiguousarray(stable, dtype=np.int32),
        mml,
    )


def save_topk_trace(path: Path, trace: TopkTrace) -> None:
    np.savez_compressed(
        path,
        topk_indices=trace.topk_indices,
        req_ids=trace.req_ids,
        stable_prefix_lens=trace.stable_prefix_lens,
        max_model_len=np.int64(trace.max_model_len),
    )
