"""Engine log file names from a group's `log_name` template (pure).

The guides tee each engine's output to `prefiller_dp_$dp_rank.log` / `decoder_dp_$dp_rank.log`;
`log_name: prefiller_dp_{dp_rank}.log` gives kvpd's logs the same names (in the run dir's
`logs/` folder, where `kvpd logs` and `down` find them)."""

from __future__ import annotations

import re
import string

from kvpd.plan.layout import EnginePlacement

PLACEHOLDERS = ("name", "role", "host", "instance", "dp_rank")
LOG_DIR = "logs"
EXAMPLE = "prefiller_dp_{dp_rank}.log"
NUMBERS = ("instance", "dp_rank")
NUMBER_SPEC = re.compile(r"0[1-9]d?|[1-9]d?|d")


def template_problem(template: str) -> str | None:
    """What is wrong with a `log_name` template, or None."""
    try:
        parts = [(f, spec, conv) for _, f, spec, conv in string.Formatter().parse(template)
                 if f is not None]  # fmt: skip
    except ValueError as e:
        return (
            f"{template!r} is not a valid template ({e}); write e.g. prefiller_dp_{{dp_rank}}.log"
        )
    fields = [f for f, _, _ in parts]
    for f, spec, conv in parts:
        # A format spec can pad a name to any width (`{name:>999999999}`) or fill it with '.';
        # only zero-padding of a number, up to 2 digits wide, is useful in a file name.
        if conv or (spec and not (f in NUMBERS and NUMBER_SPEC.fullmatch(spec))):
            how = "!" + conv if conv else ":" + (spec or "")
            return (
                f"{template!r} formats {{{f}}} with {how}; a "
                "placeholder takes no conversion, and only {dp_rank} and {instance} a "
                "zero-padding such as {dp_rank:02d}."
            )
    unknown = [f for f in fields if f not in PLACEHOLDERS]
    if unknown:
        return (
            f"{template!r} uses {{{unknown[0]}}}; the placeholders are "
            + ", ".join(f"{{{p}}}" for p in PLACEHOLDERS)
            + "."
        )
    if "/" in template or template in (".", "..") or not template.strip():
        return f"{template!r} must be a file name (it goes into the run dir's {LOG_DIR}/)."
    return None


def log_file(template: str | None, ep: EnginePlacement) -> str:
    """The log path (relative to the run dir) of engine process `ep`."""
    if not template:
        return f"{LOG_DIR}/{ep.name}.log"
    name = template.format(
        name=ep.name, role=ep.role, host=ep.host, instance=ep.instance, dp_rank=ep.dp_ranks[0]
    )
    return f"{LOG_DIR}/{name}"
