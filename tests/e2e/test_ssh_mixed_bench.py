"""`ucm-pd-mixed` rehearsed with CPU vLLM on a bed host and benched twice (cold, then warm): the
warm run finds the prompts cached, in a rank's own prefix cache or in the connector's store (about
70 s on 2 shared cores).

The guide's DP2 x TP4 is one `vllm serve --data-parallel-size 2` process (vLLM starts one engine
core per rank); the rehearsal runs it the same way: a CPU `vllm serve --data-parallel-size 2` of
the tiny model, two engine-core ranks (`kvpd plan ucm-pd-mixed --rehearse`).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.test_ssh_rehearsal import (
    Rehearsal,
    assert_down_leaves_nothing,
    rehearse,
)
from tests.testbed import Testbed

pytestmark = [pytest.mark.e2e, pytest.mark.ssh]


@pytest.fixture
def mixed(_mixed: Rehearsal) -> Rehearsal:
    return _mixed.ensure_up()  # up again if the `down` test ran before


@pytest.fixture(scope="module")
def _mixed(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Rehearsal]:
    bed: Testbed = request.getfixturevalue("bed")
    yield from rehearse(tmp_path_factory.mktemp("mixed"), bed, "ucm-pd-mixed", {"n1": "h1"}, [])


def test_mixed_runs_two_dp_ranks(mixed: Rehearsal) -> None:
    log = mixed.kvpd("logs", "mixed-0", "-n", "100000").stdout
    assert "EngineCore_DP0" in log
    assert "EngineCore_DP1" in log


def test_mixed_bench_twice_hits_on_the_second_run(mixed: Rehearsal, tmp_path: Path) -> None:
    run = mixed.bench_twice(tmp_path / "bench", 4, input_len=128, output_len=4, timeout=900)
    cold, warm = run["records"]
    assert warm["result"]["completed"] == 4
    assert warm["result"]["failed"] == 0
    # Each DP rank has its own prefix cache, and vLLM's balancer, not kvpd, picks the rank: a
    # warm request may land on the rank that did not serve it cold (in one run all four did).
    # That rank finds the prompt in the connector's shared folder instead, an external hit.
    # Either way a warm prompt finds all its whole 32-token blocks (the rehearsal's block size)
    # but of its last token, at any length: at most 32 tokens short of the prompt.
    total = warm["metrics"]["summary"]  # summed over the engines
    cached = total["prefix_cache_hits"] + total["external_prefix_cache_hits"]
    assert cached >= total["prompt_tokens"] - 4 * 32, warm["metrics"]["per_target"]
    # the output check ran after each phase (on by default in rehearsals): the proxy's
    # completions equal those of mixed-0 asked directly, DP ranks and all
    for rec in (cold, warm):
        assert rec["outputs"]["summary"] == "outputs: 4/4 identical (first 16 tokens)", rec
    assert mixed.up["canary"]["outputs"]["ok"], mixed.up["canary"]


def test_mixed_down_leaves_nothing(mixed: Rehearsal) -> None:
    assert_down_leaves_nothing(mixed)
