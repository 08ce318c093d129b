"""Argument checks of the NumPy fallback, with the native binding's ValueError messages."""

from __future__ import annotations

import operator

import numpy as np

_I32_MAX = 2**31 - 1


def check_array(value: object, name: str, ndim: int, dtype: type[np.generic]) -> np.ndarray:
    """Return `value` unchanged if it is a C-contiguous `ndim`-D array of `dtype`; never copies."""
    dname = np.dtype(dtype).name
    if not isinstance(value, np.ndarray):
        raise ValueError(
            f"{name} must be a numpy.ndarray of dtype {dname}, got {type(value).__name__}"
        )
    if value.dtype != np.dtype(dtype):
        raise ValueError(
            f"{name} must have dtype {dname}, got {value.dtype} "
            f"(convert with .astype(numpy.{dname}))"
        )
    if value.ndim != ndim:
        raise ValueError(f"{name} must be {ndim}-D, got shape {value.shape}")
    if not value.flags.c_contiguous:
        raise ValueError(f"{name} must be C-contiguous (use numpy.ascontiguousarray)")
    return value


def check_int(value: object, name: str, lo: int, hi: int) -> int:
    if isinstance(value, bool):
        raise ValueError(f"{name} must be an integer, got bool")
    try:
        v = operator.index(value)  # type: ignore[arg-type]
    except TypeError:
        raise ValueError(f"{name} must be an integer, got {type(value).__name__}") from None
    if not lo <= v <= hi:
        raise ValueError(f"{name} must be in [{lo}, {hi}], got {v}")
    return v


def check_address(value: object, name: str) -> int:
    try:
        v = operator.index(value)  # type: ignore[arg-type]
    except TypeError:
        raise ValueError(f"{name} must be an integer, got {type(value).__name__}") from None
    if v < 0:
        raise ValueError(f"{name} must be >= 0, got {v}")
    if v >= 2**64:
        raise ValueError(f"{name} must be < 2**64, got {v}")
    return v


def check_planner_sizes(
    num_layers: object,
    max_rows: object,
    topk: object,
    capacity: object,
    max_model_len: object,
    num_threads: object,
) -> tuple[int, int, int, int, int, int]:
    nl = check_int(num_layers, "num_layers", 1, _I32_MAX)
    rows = check_int(max_rows, "max_rows", 1, _I32_MAX)
    k = check_int(topk, "topk", 1, _I32_MAX)
    mml = check_int(max_model_len, "max_model_len", 1, _I32_MAX - 64)
    cap = check_int(capacity, "capacity", 1, _I32_MAX - 1)
    if cap < k:
        raise ValueError(
            f"capacity ({cap}) must be >= topk ({k}): every top-k token needs a slot in the hot "
            "buffer; raise topk_buffer_size"
        )
    nt = check_int(num_threads, "num_threads", 0, 1024)
    return nl, rows, k, cap, mml, nt
