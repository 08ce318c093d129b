"""Guess why a process failed from its log (pure): a table of log patterns and their causes."""

from __future__ import annotations

import re

HEADER_PREFIX = "=== kvpd: "  # first line `up` appends to a log before each start

# First matching row wins, so specific patterns come before generic ones.
_CAUSES: tuple[tuple[re.Pattern[str], str], ...] = (
    (
        re.compile(r"Address already in use|EADDRINUSE|address in use", re.I),
        "port clash: another process already listens on a port of {name} ({ports}). Find it "
        "with `ss -ltnp` on {host}, stop it, or change the port in the profile.",
    ),
    (
        re.compile(
            r"Failed to infer device type|No CUDA GPUs|CUDA driver|libcuda|"
            r"Found no NVIDIA driver|CUDA error|torch\.cuda",
            re.I,
        ),
        "the engine looked for a CUDA GPU: on a CPU host install vLLM's CPU build "
        "(kvpd's CPU engine setup), on Ascend install vllm-ascend, or fix `hardware:` of {host}.",
    ),
    (
        re.compile(r"aclrt|HCCL|npu-smi|ASCEND_RT_VISIBLE_DEVICES|torch_npu", re.I),
        "an Ascend NPU/driver problem on {host}: check `npu-smi info`, the device ids of "
        "{name} and that CANN's set_env.sh is sourced in its script.",
    ),
    (
        re.compile(
            r"out of memory|OutOfMemoryError|Cannot allocate memory|MemoryError|"
            r"std::bad_alloc|oom-kill|\bKilled\b",
            re.I,
        ),
        "out of memory on {host}: lower the KV cache size / max model length / memory "
        "utilisation of {name}, or run fewer instances on that host.",
    ),
    (
        # kvpd reaches a host only as the node bundle `up` installs and verifies, so this is a
        # damaged bundle (or a process started outside `up`), never a venv to install into.
        re.compile(r"No module named '?(kvpd(?:\.\w+)*)\b"),
        "{name} on {host} could not import `{m1}` from kvpd's node bundle (<run dir>/bundle, "
        "put on its PYTHONPATH by its launch script): run `kvpd down --purge` and `kvpd up` "
        "to reinstall it, and start {name} only through kvpd.",
    ),
    (
        re.compile(r"No module named '?([\w.]+)'?"),
        "the Python package `{m1}` is missing in the environment {name} runs with on "
        "{host}: install it into that venv.",
    ),
    (
        re.compile(r"(\S+): command not found|exec: (\S+): not found"),
        "`{m1}` is not installed or not on PATH on {host}: install the engine there or put "
        "its venv's bin directory on PATH in the profile.",
    ),
    (
        re.compile(r"(\S+): No such file or directory"),
        "a file or binary is missing on {host} ({m1}): check the engine install and the "
        "paths (model, venv) in the profile.",
    ),
    (
        re.compile(r"Permission denied", re.I),
        "permission denied on {host}: check file modes and that the SSH user may use the "
        "devices, ports and directories of {name}.",
    ),
    (
        re.compile(r"undefined symbol|ImportError|version mismatch|incompatible", re.I),
        "incompatible package versions in the environment of {name} on {host}: reinstall "
        "the engine and its plugins with matching versions.",
    ),
    (
        re.compile(r"Connection refused|Failed to connect|connect\(\) failed", re.I),
        "{name} could not reach a service it depends on: check that the earlier stages "
        "are healthy and that addresses/ports in the profile are right.",
    ),
)


def current_run(log_text: str) -> str:
    """The part of a log written since the last `up` started the process (logs append)."""
    idx = log_text.rfind(HEADER_PREFIX)
    if idx < 0:
        return log_text
    line_start = log_text.rfind("\n", 0, idx) + 1
    return log_text[line_start:]


def tail(text: str, n: int = 30) -> list[str]:
    return text.splitlines()[-n:]


def likely_cause(log_text: str, *, name: str, host: str, ports: tuple[int, ...] = ()) -> str:
    """A one-sentence guess with a fix, or "" when no known pattern matches."""
    for pattern, template in _CAUSES:
        m = pattern.search(log_text)
        if m:
            m1 = next((g for g in m.groups() if g), "") if m.groups() else ""
            port_text = ", ".join(map(str, ports)) or "its ports"
            return template.format(name=name, host=host, ports=port_text, m1=m1)
    return ""


def failure_report(
    name: str,
    host: str,
    ports: tuple[int, ...],
    reason: str,
    log: tuple[str, str, str] | None,
    tail_lines: int,
) -> str:
    """What `up` says about a process that failed: the reason, the likely cause and the end of
    its log (`log`: path, host, text; None when it never started)."""
    lines = [f"{name!r} on host {host} {reason}."]
    if log is not None:
        path, log_host, raw = log
        text = current_run(raw)
        cause = likely_cause(text, name=name, host=host, ports=ports)
        if cause:
            lines.append(f"Likely cause: {cause}")
        end = [ln for ln in tail(text, tail_lines + 1) if not ln.startswith(HEADER_PREFIX)]
        end = end[-tail_lines:]
        lines.append(f"Last {len(end)} lines of {path} on {log_host}:")
        lines.extend(f"  | {ln}" for ln in end)
    return "\n".join(lines)
