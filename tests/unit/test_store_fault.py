"""The store connector's fault injection switch: loaded blocks are corrupted after their
checksum passed, so the store counts hits, its files stay valid, and only the content is wrong."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from kvpd.connectors import fault
from kvpd.connectors.blockstore import BlockStore
from kvpd.plan import faults as plan_faults
from kvpd.plan.build import load_plan
from kvpd.testing import standin_engine

LAYERS = [64, 64]  # two layers of 64 bytes per block (bf16: 32 values each)
BLOCK = sum(LAYERS)


def _blocks(n: int) -> np.ndarray:
    rng = np.random.default_rng(0)
    return rng.integers(0, 256, size=(n, BLOCK), dtype=np.uint8)


def _load(store: BlockStore, keys: list[bytes]) -> tuple[np.ndarray, list[bool]]:
    """What the connector's start_load_kv does: read blocks into the rows of one buffer."""
    rows = np.empty((len(keys), BLOCK), dtype=np.uint8)
    found = store.get_many_into(keys, [memoryview(rows[i]) for i in range(len(keys))])
    return rows, found


@pytest.mark.parametrize("mode", fault.FAULTS)
def test_corrupted_loads_keep_valid_checksums(tmp_path: Path, mode: fault.Fault) -> None:
    store = BlockStore(tmp_path, "layout:v1", io_threads=1)
    try:
        original = _blocks(3)
        keys = [bytes([i]) * 32 for i in range(3)]
        for k, row in zip(keys, original, strict=True):
            assert store.put(k, row.tobytes())
        rows, found = _load(store, keys)
        assert found == [True, True, True]
        assert (rows == original).all()
        fault.corrupt(rows, mode, LAYERS, elem_size=2)
        assert not (rows == original).all()  # the content the engine gets is wrong ...
        again, found = _load(store, keys)
        # ... while every block still loads as a valid hit, byte for byte what was stored
        assert found == [True, True, True]
        assert (again == original).all()
        assert store.counters.corrupt == 0
        assert store.counters.misses == 0
    finally:
        store.close()


def test_each_mode_damages_what_it_says() -> None:
    original = _blocks(2)
    flipped = original.copy()
    fault.corrupt(flipped, "flip", LAYERS, elem_size=2)
    assert ((flipped ^ original)[:, 1::2] == 0x80).all()
    assert (flipped[:, 0::2] == original[:, 0::2]).all()
    swapped = original.copy()
    fault.corrupt(swapped, "swap_layers", LAYERS, elem_size=2)
    assert (swapped[:, :64] == original[:, 64:]).all()
    assert (swapped[:, 64:] == original[:, :64]).all()
    zeroed = original.copy()
    fault.corrupt(zeroed, "zero_block", LAYERS, elem_size=2)
    assert not zeroed[0].any()
    assert (zeroed[1] == original[1]).all()


def test_switch_is_off_unless_set_and_refuses_unknown_values() -> None:
    assert fault.from_env({}) is None
    assert fault.from_env({fault.ENV: ""}) is None
    assert fault.from_env({fault.ENV: "swap_layers"}) == "swap_layers"
    with pytest.raises(ValueError, match="use one of flip, swap_layers, zero_block"):
        fault.from_env({fault.ENV: "flipp"})


def test_plan_names_the_switches_as_fault_injection() -> None:
    assert fault.ENV in plan_faults.SWITCHES  # the plan knows the connector's switch
    assert "KVPD_FAULT_EMPTY_COMPLETIONS" in plan_faults.SWITCHES
    assert not [w for w in load_plan("local").warnings if "FAULT" in w]
    plan = load_plan("local", sets=[f"decode.env.{fault.ENV}=flip"])
    (w,) = [w for w in plan.warnings if "FAULT INJECTION" in w]
    assert w.startswith(f"FAULT INJECTION: decode-0 runs with {fault.ENV}=flip")


def test_standin_logprobs_depend_only_on_the_prompt() -> None:
    a = standin_engine.logprobs(["x", "y"], 4)
    assert a == standin_engine.logprobs(["x", "y"], 4) != standin_engine.logprobs(["x"], 4)
    assert all(t.startswith("token_id:") for t in a["tokens"])
    assert len(a["token_logprobs"]) == 4
