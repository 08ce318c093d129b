"""Extra `args` as `vllm serve` reads them, so a rule sees a flag in every spelling vLLM accepts.

vLLM's FlexibleArgumentParser turns `_` into `-` in a long flag's name (up to the first `.`),
reads `--flag.key=value` as one key of a JSON-valued flag, turns `-O3`, `-O=3` and `-Ox` into
`-O ...`, and expands `--config FILE` into the options inside FILE. argparse then accepts any
unambiguous prefix of a long flag (`allow_abbrev` stays on) and `--no-X` for boolean flags.
A rule that compared raw strings would let each of those spellings past it.
"""

from __future__ import annotations

import re
from collections.abc import Collection

# A flag that stands for other options kvpd cannot see -> why it is refused and what to do.
OPAQUE_FLAGS = {
    "--config": (
        "reads more options from a YAML file, which kvpd cannot check",
        "put each option in the profile (the fields kvpd derives, the rest in args)",
    ),
    "--api-key": (
        "would put a secret on the command line (in the plan, the launch script and `ps`)",
        "set VLLM_API_KEY in the group's env instead (masked in every plan and log)",
    ),
    "--hf-token": (
        "would put a secret on the command line (in the plan, the launch script and `ps`)",
        "set HF_TOKEN in the group's env instead (masked in every plan and log)",
    ),
}

# Any other flag named for a secret (--db-password, --auth-token, --s3-secret-key ...): the
# value would show in the plan, the launch script and `ps` just the same.
SECRET_FLAG = re.compile(
    r"^--(?:[\w-]*-)?(?:key|token|secret|pass|passwd|password|credentials?)$", re.IGNORECASE
)
SECRET_FLAG_WHY = OPAQUE_FLAGS["--api-key"][0]


def flag_name(arg: str) -> str:
    """The flag an argument sets, spelled as vLLM's own help spells it ("" for a value)."""
    if arg.startswith("--") and len(arg) > 2:
        name = arg[2:].split("=", 1)[0].split(".", 1)[0]
        return "--" + name.replace("_", "-")
    if arg.startswith("-O"):
        return "-O"
    if arg.startswith("-") and len(arg) > 1 and not arg[1].isdigit():
        return arg.split("=", 1)[0]
    return ""


def resolve(name: str, known: Collection[str]) -> str | None:
    """The flag of `known` (names, or a mapping keyed by them) that `name` sets: itself, its
    `--no-` form, or the one flag it abbreviates (argparse expands unambiguous prefixes).
    None when it sets none of them."""
    if not name:
        return None
    if name in known:
        return name
    if name.startswith("--no-") and "--" + name[5:] in known:
        return "--" + name[5:]
    if name.startswith("--") and len(name) > 4:
        longer = [k for k in known if k.startswith(name) and k.startswith("--")]
        if longer:
            return min(longer, key=len)
    return None


def arg_value(args: list[str], flag: str) -> str | None:
    """The value extra args give `flag` (`--flag v`, `--flag=v`, `--flag_v`'s spellings and
    abbreviations included); the last one wins, as in argparse."""
    found = None
    for i, arg in enumerate(args):
        if resolve(flag_name(arg), (flag,)) != flag:
            continue
        if "=" in arg and "." not in arg.split("=", 1)[0]:
            found = arg.split("=", 1)[1]
        elif i + 1 < len(args):
            found = args[i + 1]
    return found
