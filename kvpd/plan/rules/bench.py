"""`bench:` rules: benchmark lengths against max_model_len, and scenarios that can mean what
they say (pure)."""

from __future__ import annotations

from kvpd.plan.bench import STORE_CONNECTORS
from kvpd.plan.rules.base import Checker

LOCAL = "local"  # bench.host: the machine kvpd runs on
STORES = frozenset(STORE_CONNECTORS)  # the external KV stores (a prefix cache of their own)


def rule_bench(c: Checker) -> None:
    """Bench lengths that vLLM would reject, named with both numbers and both fixes (the UCM
    guide benchmarks 32k prompts against --max-model-len 17000)."""
    b = c.p.bench
    lens = [g.max_model_len for g in c.gfacts() if g.max_model_len]
    longest = max([b.input_len, *(b.sweep.input_len if b.sweep else [])])
    out = max([b.output_len, *(b.sweep.output_len if b.sweep else [])])
    if lens and longest + out > min(lens):
        field = ("bench", "sweep", "input_len") if longest > b.input_len else ("bench", "input_len")
        need = longest + out
        c.warn(
            field,
            f"input {longest} + output {out} tokens exceed max_model_len {min(lens)}; vLLM "
            f"will reject these requests. Either bench what the deployment serves (bench."
            f"input_len <= {max(1, min(lens) - out)}, e.g. --set bench.input_len="
            f"{max(1, min(lens) - out)}) or serve what you bench (model.max_model_len >= "
            f"{need}, e.g. --set model.max_model_len={need}; it needs the KV memory).",
        )


def rule_scenarios(c: Checker) -> None:
    """A scenario's `without` must name connectors the deployment has, and `cache: external`
    needs a store left attached."""
    used: set[str] = set()
    for g in c.gfacts():
        used |= set(g.connectors)
    for name, scn in c.p.bench.scenarios.items():
        path = ("bench", "scenarios", name)
        unused = [k for k in scn.without if k not in used]
        if unused:
            c.err(
                (*path, "without"),
                f"scenario {name!r} detaches {', '.join(unused)}, which no group uses "
                f"(connectors here: {', '.join(sorted(used)) or 'none'}). Remove it from "
                "`without` or name a connector of prefill/decode/mixed.",
            )
        left = (used - set(scn.without)) & STORES
        if scn.cache == "external" and not left:
            c.err(
                (*path, "cache"),
                f"scenario {name!r} expects external prefix-cache hits (cache: external) but "
                "no external KV store (ucm, kvpd_store, ascend_store, example) is attached "
                "in it. Attach one to a group's kv_connectors, or set cache: hbm or none.",
            )


def rule_bench_host(c: Checker) -> None:
    """`bench.host` is a host of the profile, or `local` for this machine."""
    h = c.p.bench.host
    if h is not None and h != LOCAL and not c.known_host(h):
        c.err(
            ("bench", "host"),
            f"'{h}' is not a host of this profile.{c.suggest_host(h)} Name one of "
            f"{', '.join(c.p.hosts)} to run `vllm bench serve` there, or `{LOCAL}` for this "
            "machine.",
        )
