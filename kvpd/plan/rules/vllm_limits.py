"""Settings vLLM refuses at start, and a plugin allow-list that hides the NPU platform (pure).

vLLM's SchedulerConfig refuses `max_num_batched_tokens` below `max_model_len` when chunked
prefill is off (a prompt of max_model_len could never be scheduled) and below `max_num_seqs`
(a step must fit one token of each sequence). `VLLM_PLUGINS`, when set, is vLLM's allow-list of
plugins, platform plugins included: without `ascend` vLLM-Ascend's platform is filtered out and
the engine starts without the NPU platform.
"""

from __future__ import annotations

from kvpd.plan.rules.base import Checker
from kvpd.profile.schema import ASCEND

ASCEND_PLATFORM_PLUGIN = "ascend"  # vLLM-Ascend's entry point in vllm.platform_plugins


def _where(c: Checker, role: str, field: str) -> tuple[str, ...]:
    """The field as written: the group's own, else `engine:` (the default it inherits)."""
    g = c.p.group(role)
    return (role, field) if getattr(g, field, None) is not None else ("engine", field)


def _who(c: Checker, role: str, path: tuple[str, ...]) -> str:
    """The group, or (for an `engine:` value) every group that inherits it."""
    if path[0] != "engine":
        return role
    return ", ".join(r for r, g in c.groups() if getattr(g, path[1], None) is None)


def rule_batched_tokens(c: Checker) -> None:
    reported: set[tuple[tuple[str, ...], str]] = set()
    for gf in c.gfacts():
        mnbt = gf.opts.max_num_batched_tokens
        if mnbt is None:
            continue
        path = _where(c, gf.role, "max_num_batched_tokens")
        mml = gf.max_model_len
        if gf.opts.enable_chunked_prefill is False and mml is not None and mnbt < mml:
            if (path, "len") in reported:
                continue
            reported.add((path, "len"))
            c.err(
                path,
                f"{_who(c, gf.role, path)}: max_num_batched_tokens {mnbt} is below "
                f"max_model_len {mml} with "
                "chunked prefill off; vLLM refuses to start (a full-length prompt could never "
                f"be scheduled). Raise max_num_batched_tokens to {mml} or more, or enable "
                "chunked prefill.",
            )
        seqs = gf.opts.max_num_seqs
        if seqs is not None and mnbt < seqs and (path, "seqs") not in reported:
            reported.add((path, "seqs"))
            c.err(
                path,
                f"{_who(c, gf.role, path)}: max_num_batched_tokens {mnbt} is below "
                f"max_num_seqs {seqs}; vLLM refuses to start. Raise max_num_batched_tokens to "
                f"{seqs} or more, or lower max_num_seqs.",
            )


def rule_platform_plugin(c: Checker) -> None:
    for gf in c.gfacts():
        if not gf.hardware & set(ASCEND):
            continue
        value = gf.env.get("VLLM_PLUGINS")
        if value is None:
            continue
        if ASCEND_PLATFORM_PLUGIN in value.split(","):  # vLLM splits on ',' and strips nothing
            continue
        g = gf.group
        path: tuple[str, ...] = (
            (gf.role, "env") if g.env and "VLLM_PLUGINS" in g.env
            else ("engine", "env") if c.p.engine.env and "VLLM_PLUGINS" in c.p.engine.env
            else ("env",)
        )  # fmt: skip
        fixed = ",".join([ASCEND_PLATFORM_PLUGIN, *(v for v in value.split(",") if v)])
        c.err(
            (*path, "VLLM_PLUGINS"),
            f"VLLM_PLUGINS={value!r} is vLLM's plugin allow-list and leaves out vLLM-Ascend's "
            f"platform plugin {ASCEND_PLATFORM_PLUGIN!r}, so {gf.role} on Ascend would start "
            f"without the NPU platform. Set VLLM_PLUGINS={fixed} or remove it.",
            on_hardware=True,
        )
