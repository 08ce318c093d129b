"""Masking secrets in what kvpd gathers from hosts (diagnose archives), by allow-list and shape.

An environment value is shown only when its name is on a list of names known to hold no
secret; every other value is "****". Free text (logs, host facts, command lines, rendered
files) is scrubbed of what secrets look like: values of secret-bearing flags (`--api-key`,
`--hf-token`, `--password`, ...), `NAME=value` and `"name": "value"` pairs whose name says
secret (`DB_PASS`, `*_TOKEN`, ...), credentials in URLs (`user:pass@`), `Authorization`
headers and well-known token formats (Hugging Face, OpenAI-style, GitHub, AWS, JWT).
Masking by shape is a safety net, not a proof: `--shareable` leaves out what it cannot vouch
for (environments, state, rendered files, the listening-sockets table).
"""

from __future__ import annotations

import re

MASK = "****"

# Names whose values are facts about the machine or the run, never credentials.
SAFE_NAMES = frozenset(
    """PATH HOME USER LOGNAME SHELL PWD LANG LANGUAGE TERM TZ HOSTNAME SHLVL OLDPWD TMPDIR
    PYTHONPATH PYTHONHASHSEED PYTHONUNBUFFERED PYTHONDONTWRITEBYTECODE VIRTUAL_ENV
    LD_LIBRARY_PATH LD_PRELOAD OMP_NUM_THREADS MKL_NUM_THREADS CUDA_VISIBLE_DEVICES
    ASCEND_RT_VISIBLE_DEVICES ASCEND_VISIBLE_DEVICES ASCEND_HOME_PATH ASCEND_TOOLKIT_HOME
    ASCEND_OPP_PATH ASCEND_AICPU_PATH TORCH_DEVICE_BACKEND_AUTOLOAD NO_PROXY no_proxy
    DO_NOT_TRACK KVPD_DEPLOYMENT KVPD_PROCESS HF_HUB_OFFLINE TRANSFORMERS_OFFLINE HF_HOME
    MOONCAKE_CONFIG_PATH GLOO_SOCKET_IFNAME TP_SOCKET_IFNAME HCCL_SOCKET_IFNAME
    NCCL_SOCKET_IFNAME""".split()
)
SAFE_PREFIXES = ("LC_", "VLLM_", "HCCL_", "NCCL_", "KVPD_", "ASCEND_", "UCM_", "MMC_", "TASK_")

_SECRET_WORD = r"(?:KEY|TOKEN|SECRET|PASS|PASSWD|PASSWORD|PWD|CREDENTIALS?|AUTH|COOKIE)"
SECRET_NAME = re.compile(_SECRET_WORD, re.IGNORECASE)
# A name that ends in a secret word: DB_PASS, HF_TOKEN, api_key, --hf-token (not *_TOKENS,
# --tokenizer or --ssl-keyfile, which are counts and paths; nor monkey=).
_NAME = r"(?:[A-Za-z_][\w.-]*?[_.-])?(?:API|ACCESS)?" + _SECRET_WORD + r"(?![\w-])"


def env_value(name: str, value: str) -> str:
    """`value` if `name` is known to be safe (and does not itself say secret), else MASK."""
    safe = name in SAFE_NAMES or name.startswith(SAFE_PREFIXES)
    if not safe or (SECRET_NAME.search(name) and name not in ("PWD", "OLDPWD")):
        return MASK
    return scrub(value)


_RULES: tuple[tuple[re.Pattern[str], str], ...] = (
    # --api-key X, --hf-token=X, --password X, --db-pass X ...
    (re.compile(r"(--?" + _NAME + r")(=|\s+)(?!\*\*\*\*)(\S+)", re.IGNORECASE), rf"\1\2{MASK}"),
    # NAME=value / NAME: value with a secret name (DB_PASS=..., HF_TOKEN: ...)
    (re.compile(r"(?<![\w-])(" + _NAME + r")(\s*[=:]\s*)(?!\*\*\*\*)([^\s,;'\"}]+)",
                re.IGNORECASE), rf"\1\2{MASK}"),
    # "api_key": "value" (JSON, Python reprs, quoted YAML)
    (re.compile(r"([\"'][\w.-]*?" + _SECRET_WORD + r"[\"']\s*:\s*)([\"'])[^\"']*\2",
                re.IGNORECASE), rf"\1\2{MASK}\2"),
    # credentials in a URL: scheme://user:pass@host
    (re.compile(r"([A-Za-z][\w+.-]*://[^/\s:@]+):[^/\s@]+@"), rf"\1:{MASK}@"),
    # Authorization: Bearer xyz / Basic xyz
    (re.compile(r"\b(Bearer|Basic|Token)\s+[A-Za-z0-9._~+/=-]{8,}", re.IGNORECASE),
     rf"\1 {MASK}"),
    # token formats: Hugging Face, OpenAI-style, GitHub, Slack, AWS access keys, JWTs
    (re.compile(r"\b(?:hf_[A-Za-z0-9]{20,}|sk-[A-Za-z0-9_-]{16,}|gh[pousr]_[A-Za-z0-9]{20,}|"
                r"xox[abpr]-[A-Za-z0-9-]{10,}|AKIA[0-9A-Z]{16}|"
                r"eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,})"), MASK),
)  # fmt: skip


def scrub(text: str) -> str:
    """`text` with every secret shape above replaced by MASK."""
    for pattern, repl in _RULES:
        text = pattern.sub(repl, text)
    return text


def env_text(raw: str) -> str:
    """A /proc/<pid>/environ (NUL-separated) as sorted NAME=value lines, values masked."""
    pairs = sorted(kv.partition("=") for kv in raw.split("\0") if kv)
    return "\n".join(f"{k}={env_value(k, v)}" for k, _, v in pairs)
