"""The guides' runtime confirmations read from engine logs: layerwise buffer reuse and the
store's `hit external` counts, in the exact words UCM, vLLM-Ascend and kvpd's store log."""

from __future__ import annotations

from kvpd.bench.logcheck import confirm, store_hits
from kvpd.plan.build import load_plan
from kvpd.plan.value import LogCheck

# UCMConnector's line (UCM guide) and kvpd's store connector's line (kvpd/connectors/store.py)
UCM = (
    "INFO ucm_connector.py:211: request_id: cmpl-1, total_blocks_num: 62, hit hbm: 0, "
    "hit external: 50\n"
)
KVPD = (
    "INFO store.py:203: kvpd store: request cmpl-2-0: total blocks 4, hit hbm 1, hit external 3\n"
)
LAYERWISE = (
    "INFO layerwise_cache_layout.py:88: Layerwise KV cache reuse merged 156 descriptors into 6 "
    "descriptors using 3 buffer assignments.\n"
)


def test_hit_lines_of_ucm_and_kvpd_store_are_summed() -> None:
    assert store_hits(UCM + KVPD + "unrelated\n") == (2, 1, 53)
    assert store_hits("") == (0, 0, 0)


def test_external_scenario_needs_hits_in_the_logs() -> None:
    checks = (LogCheck("prefill-0", "store_hits"), LogCheck("prefill-1", "store_hits"))
    logs = {"prefill-0": UCM, "prefill-1": ""}
    ok = confirm("ucm", checks, logs.get, "external")
    assert ok.problems == []
    assert "hit external 50 blocks" in ok.notes[0]
    cold = confirm("ucm", checks, {"prefill-0": UCM.replace("50", "0"), "prefill-1": ""}.get,
                   "external")  # fmt: skip
    assert "zero `hit external` blocks" in cold.problems[0]
    silent = confirm("ucm", checks, {"prefill-0": "", "prefill-1": ""}.get, "external")
    assert "no `hit external` line at all" in silent.problems[0]
    assert "kvpd logs prefill-0" in silent.problems[0]
    # without a cache expectation the counts are only reported
    assert confirm("as-is", checks, {"prefill-0": "", "prefill-1": ""}.get, None).problems == []


def test_layerwise_reuse_line_must_show_when_reuse_is_configured() -> None:
    checks = (LogCheck("prefill-0", "layerwise_reuse"),)
    assert confirm("as-is", checks, {"prefill-0": LAYERWISE}.get, None).problems == []
    (problem,) = confirm("as-is", checks, {"prefill-0": "started\n"}.get, None).problems
    assert "no `Layerwise KV cache reuse merged ...` line" in problem
    unreadable = confirm("as-is", checks, {}.get, None)
    assert unreadable.problems == []
    assert "could not read" in unreadable.notes[0]


def test_plans_name_the_checks_their_connectors_call_for() -> None:
    assert load_plan("layerwise-sparse-1p1d").log_checks == (
        LogCheck("prefill-0", "layerwise_reuse"),
    )
    lw_all = load_plan("layerwise-sparse-1p1d", sets=["prefill.layerwise.independent_layers=all"])
    assert lw_all.log_checks == ()  # "all" turns reuse off: no line to expect
    large = load_plan("large-ep").log_checks
    assert [c.process for c in large] == [f"prefill-dp{i}" for i in range(4)]
    assert {c.kind for c in large} == {"store_hits"}
    assert load_plan("local").log_checks == (LogCheck("prefill-0", "store_hits"),)
    # a rehearsal replaces UCM and AscendStore: their lines cannot appear there
    assert load_plan("large-ep", rehearse=True).log_checks == ()


def test_up_confirms_the_layerwise_layout_from_this_starts_log() -> None:
    from types import SimpleNamespace

    from kvpd.cli.up_view import confirm_layout as _confirm_layout

    plan = load_plan("layerwise-sparse-1p1d")
    old = "=== kvpd: lw/prefill-0 started 1 ===\n" + LAYERWISE
    logs = {"prefill-0": old + "=== kvpd: lw/prefill-0 started 2 ===\nready\n"}
    svc = SimpleNamespace(logs=lambda n, deployment, lines: SimpleNamespace(text=logs[n]))
    ((ok, text),) = _confirm_layout(svc, plan)  # the line of an earlier start does not count
    assert not ok
    assert "no `Layerwise KV cache reuse merged ...` line" in text
    logs["prefill-0"] += LAYERWISE
    assert _confirm_layout(svc, plan) == [
        (True, "scenario 'as started': prefill-0: layerwise KV cache reuse is on.")
    ]
    assert _confirm_layout(svc, load_plan("local")) == []
