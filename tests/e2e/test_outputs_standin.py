"""Empty output is a failure: the local profile rehearsed with kvpd's stand-in engines, decode
switched (fault injection) to answer every completion with zero tokens. `vllm bench serve`
counts those requests as successful; kvpd's bench fails the phase with the count, and the
canary's output check fails too."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.e2e.local_deploy import REPO, engine_missing, kvpd, local_sets, set_args

pytestmark = pytest.mark.e2e

NAME, PORT = "e2e-standin-empty", 18680  # own deployment and ports (the shared local one: 18600)


def test_zero_token_completions_fail_canary_and_bench(tmp_path: Path) -> None:
    reason = engine_missing()  # the bench client and the tokenizer
    if reason:
        pytest.skip(reason)
    args = [*set_args(local_sets(NAME, PORT)), "--set", "decode.env.KVPD_FAULT_EMPTY_COMPLETIONS=1"]
    kvpd("down", "--deployment", NAME, check=False)
    shutil.rmtree(REPO / ".kvpd" / NAME, ignore_errors=True)
    try:
        r = kvpd("up", "local", "--rehearse-with", "standin", "--yes", "--json",
                 "--keep-on-failure", *args, check=False)  # fmt: skip
        assert r.returncode != 0, r.stdout
        out = json.loads(r.stdout)
        assert "canary" in out, f"up failed before its canary:\n{r.stdout}\n{r.stderr}"
        canary = out["canary"]
        assert "no tokens came back" in " ".join(canary["problems"]), canary
        r = kvpd("bench", "local", *args, "--num-prompts", "4", "--input-len", "64",
                 "--output-len", "8", "--results", str(tmp_path), "--json", "--no-verify-outputs",
                 check=False)  # fmt: skip
        assert r.returncode != 0
        (rec,) = json.loads(r.stdout)["records"]
        assert rec["result"]["completed"] == 4
        assert rec["result"]["failed"] == 0
        assert any("4 of 4 successful requests returned zero tokens" in p for p in rec["problems"])
    finally:
        kvpd("down", "--deployment", NAME, check=False)
