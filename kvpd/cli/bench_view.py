"""The bench section `kvpd plan` prints: the protocol the profile benchmarks with and the
`vllm bench serve` command of each phase (plan.json has the same as data)."""

from __future__ import annotations

import shlex

from kvpd.bench import runner
from kvpd.bench.settings import make_settings
from kvpd.plan.value import Plan

SEED = "<SEED>"  # kvpd bench derives one per run and scenario (kvpd.bench.freshness)
PROTOCOL_TEXT = {
    "plain": "one measured run",
    "prefix": "seed each prompt's first {ratio:g} (output 1), then the measured run",
    "twice": "the same run twice, cold then warm, both measured",
}


def plan_lines(plan: Plan) -> list[str]:
    b = plan.bench
    s = make_settings(b)
    what = PROTOCOL_TEXT.get(b.protocol, b.protocol).format(ratio=b.prefix_ratio)
    lines = [
        f"bench: protocol {b.protocol} ({what}); {b.num_prompts} prompts, input {b.input_len}, "
        f"output {b.output_len}, concurrency {b.max_concurrency or 'unlimited'}, rate "
        f"{b.request_rate}; `kvpd bench` runs through {plan.proxy_url or 'the proxy'}"
    ]
    if b.scenarios:
        lines.append(f"  scenarios: {', '.join(b.scenarios)} (`kvpd bench --all-scenarios`)")
    for point in s.points[:4]:
        phases = runner.protocol_phases(
            s.protocol, input_len=point.input_len, output_len=point.output_len,
            num_prompts=s.num_prompts, seed=0, request_rate=point.request_rate,
            max_concurrency=point.max_concurrency, ignore_eos=s.ignore_eos,
            prefix_ratio=s.prefix_ratio,
        )  # fmt: skip
        for ph in phases:
            argv = runner.build_argv(
                "vllm", ph, base_url=plan.proxy_url or "<proxy>", model=plan.served_model,
                tokenizer=plan.tokenizer, result_dir="<RESULTS>",
                result_filename=f"{point.key}-{ph.name}.json",
            )  # fmt: skip
            argv[argv.index("--seed") + 1] = SEED
            lines.append(f"  {ph.name}: {shlex.join(argv)}")
    if len(s.points) > 4:
        lines.append(f"  ... and {len(s.points) - 4} more sweep points")
    lines.append(
        f"  {SEED}: fresh per run and scenario, from bench.seed {b.seed} (cached prompts of "
        "earlier runs would contaminate the numbers); <RESULTS>: .kvpd/<deployment>/bench/"
    )
    return lines
