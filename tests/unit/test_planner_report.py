"""`kvpd status`'s planner column: what a decode's own log says it loaded, parsed as untrusted
host text, and shown against what the plan asked for."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from kvpd.cli.output import status_json, status_table
from kvpd.exec.processes.planner_report import (
    MARKER,
    PlannerReport,
    expected_planner,
    parse_report,
    read_report,
)
from kvpd.exec.processes.status import ProcessStatus
from kvpd.exec.transport import CommandResult
from kvpd.plan.value import ProcessSpec, Role


def render(table: Table) -> str:
    console = Console(width=250, record=True, color_system=None)
    console.print(table)
    return console.export_text()


PLUGIN = (
    "INFO 12-02 05:00:01 [ascend_planner_plugin.py:147] Sparse KV offload planner: kvpd's "
    "native core (kvpd.native.ascend_planner, neon row planner), no JIT build"
)
STANDIN = (
    "kvpd stand-in engine decode on 10.0.0.2:8100: sparse KV offload planner: kvpd's native "
    "core (avx2 row planner, x86_64) from /run/bundle/kvpd/native/_ascend_planner.so; top-k "
    "2048, 4096 slots, 8 rows"
)
OWN = (
    "WARNING 12-02 05:00:01 [ascend_planner_plugin.py:139] Sparse KV offload planner: "
    "vLLM-Ascend's own (JIT build); kvpd: unknown vLLM-Ascend manager version"
)


def test_the_plugin_and_the_standin_lines_name_planner_and_path() -> None:
    assert parse_report(PLUGIN) == PlannerReport("kvpd", "neon")
    assert parse_report(STANDIN) == PlannerReport("kvpd", "avx2")
    assert parse_report(OWN) == PlannerReport("upstream")


def test_the_last_start_counts() -> None:
    assert parse_report("\n".join((PLUGIN, "other line", OWN))) == PlannerReport("upstream")
    assert parse_report("\n".join((OWN, PLUGIN))) == PlannerReport("kvpd", "neon")


def test_no_line_or_a_forged_path_is_not_taken_at_its_word() -> None:
    assert parse_report("INFO starting vLLM\nINFO ready") is None
    assert parse_report("") is None
    forged = PLUGIN.replace("neon row planner", "rm-rf-$(id) row planner")
    assert parse_report(forged) == PlannerReport("kvpd", None)
    unknown = PLUGIN.replace("neon", "quantum")
    assert parse_report(unknown) == PlannerReport("kvpd", None)


def test_labels() -> None:
    assert PlannerReport("kvpd", "neon").label == "kvpd neon"
    assert PlannerReport("kvpd").label == "kvpd"
    assert PlannerReport("upstream").label == "vLLM-Ascend's own"


class _Host:
    host = "d1"

    def __init__(self, code: int, out: str) -> None:
        self.code, self.out = code, out
        self.argv: list[str] = []

    def run(self, argv: list[str], **_: object) -> CommandResult:
        self.argv = argv
        return CommandResult(tuple(argv), self.code, self.out, "")


def test_reading_the_log_on_the_host() -> None:
    host = _Host(0, PLUGIN + "\n")
    assert read_report(host, "/run/logs/decode-0.log") == PlannerReport("kvpd", "neon")  # type: ignore[arg-type]
    # The path is one argv element after "--": never a shell word, never an option.
    assert host.argv[-3:] == ["--", MARKER, "/run/logs/decode-0.log"]
    assert read_report(_Host(1, ""), "/x.log") is None  # type: ignore[arg-type]
    assert read_report(_Host(2, PLUGIN), "/x.log") is None  # type: ignore[arg-type]
    assert read_report(_Host(0, PLUGIN), "") is None  # type: ignore[arg-type]


def _spec(env: tuple[tuple[str, str], ...]) -> ProcessSpec:
    return ProcessSpec("decode-0", "d1", Role.DECODE, 2, "/s.sh", ("vllm",), env=env)


def test_only_processes_the_plan_gives_a_planner_have_one() -> None:
    assert expected_planner(_spec((("KVPD_SPARSE_PLANNER", "kvpd"),))) == "kvpd"
    assert expected_planner(_spec((("OTHER", "1"),))) is None
    assert expected_planner(None) is None


def _row(planned: str | None, said: PlannerReport | None) -> ProcessStatus:
    st = ProcessStatus("decode-0", "d1", 42, True, True, 5.0, [8100], [8100], "/l.log")
    st.planner_planned, st.planner = planned, said
    return st


def test_status_shows_the_log_word_and_flags_a_mismatch() -> None:
    ok = render(status_table("t", [_row("kvpd", PlannerReport("kvpd", "neon"))]))
    assert "Planner (its log)" in ok
    assert "kvpd neon" in ok
    bad = render(status_table("t", [_row("kvpd", PlannerReport("upstream"))]))
    assert "vLLM-Ascend's own (planned: kvpd)" in bad
    silent = render(status_table("t", [_row("kvpd", None)]))
    assert "not reported" in silent
    assert "Planner" not in render(status_table("t", [_row(None, None)]))


def test_status_json_carries_planned_and_reported() -> None:
    row = status_json("t", [_row("kvpd", PlannerReport("kvpd", "neon"))])["processes"][0]
    assert row["planner"] == {"planned": "kvpd", "reported": {"planner": "kvpd", "isa": "neon"}}
    assert "planner" not in status_json("t", [_row(None, None)])["processes"][0]
