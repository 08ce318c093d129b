"""FAULT INJECTION switch of kvpd's store connector (test only): corrupt loaded KV blocks.

`KVPD_FAULT_CORRUPT_LOADED_BLOCKS=flip|swap_layers|zero_block` in a consumer engine's
environment makes the connector damage blocks *after* they passed their checksum, in the
staging buffer, before they are scattered into the paged KV cache. The store's files stay
valid, every load counts as a hit and decode counts the tokens as received KV: the /metrics
proof passes. Only a comparison of the generated output can see it, which is what the switch
exists to prove. `kvpd plan` names the switch wherever a profile sets it.

- flip: the sign of every K/V value (its top bit, for the element size given)
- swap_layers: the bytes of the first two layers trade places
- zero_block: the first block of each load becomes zeros
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Literal, get_args

import numpy as np

ENV = "KVPD_FAULT_CORRUPT_LOADED_BLOCKS"
Fault = Literal["flip", "swap_layers", "zero_block"]
FAULTS: tuple[str, ...] = get_args(Fault)


def from_env(environ: dict[str, str] | None = None) -> Fault | None:
    """The switch's value (None: off). An unknown value is an error, not silently off: a test
    that thinks it injects a fault must not pass because of a typo."""
    raw = (os.environ if environ is None else environ).get(ENV, "").strip()
    if not raw:
        return None
    if raw not in FAULTS:
        raise ValueError(f"{ENV}={raw!r}: use one of {', '.join(FAULTS)} (or unset it).")
    return raw  # type: ignore[return-value]


def corrupt(rows: np.ndarray, fault: Fault, layer_bytes: Sequence[int], elem_size: int) -> None:
    """Damage loaded blocks in place. `rows`: uint8 (blocks, block bytes), layers back to back
    (`layer_bytes` each); `elem_size`: bytes per K/V value (little-endian)."""
    if rows.size == 0:
        return
    if fault == "flip":
        rows[:, elem_size - 1 :: elem_size] ^= 0x80
    elif fault == "zero_block":
        rows[0, :] = 0
    elif fault == "swap_layers":
        if len(layer_bytes) < 2 or layer_bytes[0] != layer_bytes[1]:
            rows[:, elem_size - 1 :: elem_size] ^= 0x80  # one layer: nothing to swap with
            return
        n = layer_bytes[0]
        first = rows[:, :n].copy()
        rows[:, :n] = rows[:, n : 2 * n]
        rows[:, n : 2 * n] = first
