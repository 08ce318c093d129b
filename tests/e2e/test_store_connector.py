"""kvpd's store connector on the real CPU engine: centralized P/D through the store, then (after
a restart into two PD-mixed instances on the same store) external hits, sharing between
instances, and a corrupted block served as a miss. Two deployments, each started once."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.local_deploy import REPO, engine_missing, get_json, kvpd, metric, set_args
from tests.e2e.local_deploy import complete as completion

pytestmark = pytest.mark.e2e

NAME_PD, NAME_MIXED, PORT = "e2e-store-pd", "e2e-store-mixed", 19400
STORE = REPO / ".kvpd" / "e2e-store" / "kv"
BASE = (
    "The quick brown fox jumps over the lazy dog and then runs away into the forest where it "
    "meets another fox that says hello to it and they become friends forever and ever more. "
)
PROMPT_X = BASE * 2 + "Tell me the story again"
PROMPT_Y = BASE * 2 + "This time the second fox"
PROMPT_Z = "Another forest, another dog: " + BASE * 2
EXT = "vllm:prompt_tokens_by_source_total"


def complete(url: str, prompt: str, n: int = 12) -> str:
    """The completion's text (the request must succeed)."""
    status, out = completion(url, prompt, n)
    assert status == 200, out
    return out["choices"][0]["text"]


def external_tokens(url: str) -> float:
    return metric(url, EXT, source="external_kv_transfer")


def common_sets(name: str) -> list[str]:
    return [
        f"name={name}",
        f"runtime.run_dir=.kvpd/{name}/run",
        f"kv.kvpd_store.path={STORE.relative_to(REPO)}",
        # kvpd's proxy has no PD-mixed flow yet, so the mixed instances are addressed directly
        f"proxy.port={PORT}" if name == NAME_PD else "proxy=null",
    ]


@pytest.fixture(scope="module")
def pd() -> Iterator[dict[str, str]]:
    reason = engine_missing()
    if reason:
        pytest.skip(reason)
    for name in (NAME_PD, NAME_MIXED):
        kvpd("down", "--deployment", name, check=False)
    shutil.rmtree(STORE.parent, ignore_errors=True)
    STORE.mkdir(parents=True)
    sets = common_sets(NAME_PD) + [
        f"prefill.port={PORT + 100}",
        f"decode.port={PORT + 200}",
        "prefill.kv_connectors=[kvpd_store]",
        "decode.kv_connectors=[kvpd_store]",
    ]
    kvpd("up", "local", "--yes", *set_args(sets))
    try:
        yield {
            "proxy": f"http://127.0.0.1:{PORT}",
            "prefill": f"http://127.0.0.1:{PORT + 100}",
            "decode": f"http://127.0.0.1:{PORT + 200}",
            "log": str(REPO / ".kvpd" / NAME_PD / "run" / "logs" / "decode-0.log"),
        }
    finally:
        kvpd("down", "--deployment", NAME_PD, check=False)


@pytest.fixture(scope="module")
def through_store(pd: dict[str, str]) -> dict[str, Any]:
    """PROMPT_X sent through the P/D deployment (so its blocks are in the store), with what
    the P/D processes showed for it: the decode's external tokens, the store counters, the
    decode log, and the producer's own greedy output (the reference, computed without any
    loaded KV). A fixture, so a test that needs the store seeded gets it even when run alone,
    and its values stay readable after `mixed` has replaced the P/D deployment."""
    before = external_tokens(pd["decode"])
    via_proxy = complete(pd["proxy"], PROMPT_X)
    after = external_tokens(pd["decode"])
    return {
        "external": after - before,
        "via_proxy": via_proxy,
        "reference": complete(pd["prefill"], PROMPT_X),
        "hit_blocks": metric(pd["decode"], "vllm:kvpd_store_hit_blocks_total"),
        "saved_blocks": metric(pd["prefill"], "vllm:kvpd_store_saved_blocks_total"),
        "written_bytes": metric(pd["prefill"], "vllm:kvpd_store_written_bytes_total"),
        "decode_log": Path(pd["log"]).read_text(errors="replace"),
    }


@pytest.fixture(scope="module")
def mixed(pd: dict[str, str], through_store: dict[str, Any]) -> Iterator[dict[str, str]]:
    kvpd("down", "--deployment", NAME_PD, check=False)  # restart: same store, new processes
    sets = common_sets(NAME_MIXED) + [
        "prefill=null",
        "decode=null",
        f"mixed={{hosts: [localhost], instances: 2, port: {PORT + 300}, "
        "kv_connectors: [kvpd_store]}",
    ]
    kvpd("up", "local", "--yes", *set_args(sets))
    try:
        yield {"a": f"http://127.0.0.1:{PORT + 300}", "b": f"http://127.0.0.1:{PORT + 301}"}
    finally:
        kvpd("down", "--deployment", NAME_MIXED, check=False)


def test_centralized_pd_moves_kv_through_the_store(through_store) -> None:
    assert through_store["external"] >= 64  # D loaded P's blocks from the store
    # The producer only saves, so the reference recomputes the prompt: no loaded KV.
    assert through_store["via_proxy"] == through_store["reference"]
    assert through_store["hit_blocks"] >= 2
    assert through_store["saved_blocks"] >= 2
    assert through_store["written_bytes"] > 0
    log = through_store["decode_log"]
    assert "kvpd store: request" in log
    assert "hit external" in log


def test_after_restart_the_same_prompt_is_served_from_the_store(mixed, through_store) -> None:
    before = external_tokens(mixed["a"])
    assert complete(mixed["a"], PROMPT_X) == through_store["reference"]
    assert external_tokens(mixed["a"]) - before >= 64


def test_two_instances_share_hits(mixed) -> None:
    complete(mixed["a"], PROMPT_Y)  # seeds the store from instance a
    # b never saw it; a prompt sharing only the leading whole blocks still gets those blocks
    other_ending = BASE * 2 + "A completely different ending"
    before = external_tokens(mixed["b"])
    on_b = complete(mixed["b"], other_ending)
    assert external_tokens(mixed["b"]) - before >= 64
    assert on_b == complete(mixed["a"], other_ending)


def test_corrupted_block_is_recomputed_not_served(mixed) -> None:
    expected = complete(mixed["a"], PROMPT_Z)  # seeds the store
    newest = sorted(STORE.rglob("*.kvb"), key=lambda p: p.stat().st_mtime)[-2:]
    for path in newest:  # flip payload bytes: the header stays valid, the checksum does not
        data = bytearray(path.read_bytes())
        data[-10] ^= 0xFF
        path.write_bytes(bytes(data))
    corrupt = metric(mixed["b"], "vllm:kvpd_store_corrupt_blocks_total")
    assert complete(mixed["b"], PROMPT_Z) == expected
    assert metric(mixed["b"], "vllm:kvpd_store_corrupt_blocks_total") - corrupt >= 1
    assert not any(p.exists() for p in newest)
    status, _ = get_json(mixed["b"] + "/health")
    assert status == 200
