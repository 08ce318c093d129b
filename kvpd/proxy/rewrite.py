"""How the proxy reads client bodies (untrusted: parsed once, proxy-reserved fields removed,
re-encoded, never forwarded raw), rewrites them for prefill and decode, and estimates their
work in tokens for balancing."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from kvpd.proxy.relay import Failure


def _compact_dumps() -> Callable[[Any], str]:
    """Compact JSON text, as `json.JSONEncoder(separators=(",", ":"), ensure_ascii=False)
    .encode` gives it, with the C encoder made once instead of on every call (half the cost
    of encoding a request body; the proxy encodes two per request). No circular-reference
    check: every body comes from json.loads, a tree (and a RecursionError is caught anyway)."""
    py = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False)
    make = getattr(json.encoder, "c_make_encoder", None)
    if make is None:
        return py.encode
    c = make(None, py.default, json.encoder.encode_basestring, None, ":", ",", False, False, True)

    def dumps(obj: Any) -> str:
        return "".join(c(obj, 0))

    return dumps


dumps = _compact_dumps()

# Fields only the proxy may set: they tell engines where KV (or, for encoder caches, EC) comes
# from and goes to (a client's own would point a decoder at any host, or mix another request's
# cache into its answer). vLLM also reads the first two from `vllm_xargs` (its extra_args).
RESERVED_FIELDS = ("kv_transfer_params", "ec_transfer_params", "batch_kv_transfer_params")

PREFILL_KV_PARAMS = {
    "do_remote_decode": True,
    "do_remote_prefill": False,
    "remote_engine_id": None,
    "remote_block_ids": None,
    "remote_host": None,
    "remote_port": None,
}
DEFAULT_MAX_TOKENS = 256  # decode work estimate when the request sets no limit


def as_text(raw: bytes) -> str | bytes:
    """A JSON object's bytes as json.loads would decode them, without its encoding detection
    for the usual case: text starting with "{" and a non-zero byte is UTF-8 (surrogatepass, as
    json.loads decodes it); anything else is left to json.loads."""
    if raw[:1] == b"{" and raw[1:2] != b"\x00":
        return raw.decode("utf-8", "surrogatepass")
    return raw


def parse_body(raw: bytes, what: str = "body") -> dict[str, Any]:
    """A client's JSON object, or Failure(400): invalid JSON or UTF-8, nesting too deep for
    the parser (RecursionError), or anything but an object."""
    try:
        body = json.loads(as_text(raw))
    except (ValueError, RecursionError) as e:
        reason = "nested too deeply" if isinstance(e, RecursionError) else str(e)[:200]
        raise Failure(400, "bad_request", f"invalid JSON {what}: {reason}") from None
    if not isinstance(body, dict):
        raise Failure(400, "bad_request", f"invalid JSON {what}: it must be an object")
    return body


def client_body(raw: bytes) -> dict[str, Any]:
    """The generation request a client sent, without the fields only the proxy may set."""
    body = parse_body(raw)
    for name in RESERVED_FIELDS:
        body.pop(name, None)
    xargs = body.get("vllm_xargs")
    if isinstance(xargs, dict) and any(name in xargs for name in RESERVED_FIELDS):
        body["vllm_xargs"] = {k: v for k, v in xargs.items() if k not in RESERVED_FIELDS}
    return body


def encode(body: dict[str, Any]) -> bytes:
    """A body for a backend, or Failure(400) for what JSON text cannot carry on (a lone
    surrogate such as "\\ud83d" has no UTF-8 form)."""
    try:
        return dumps(body).encode()
    except (UnicodeEncodeError, RecursionError, ValueError) as e:
        raise Failure(400, "bad_request", f"the body cannot be re-encoded: {e}"[:300]) from None


def _part_chars(parts: Any) -> int:
    """Characters of a string, or of the `text` of each part in a content list."""
    if isinstance(parts, str):
        return len(parts)
    chars = 0
    for part in parts if isinstance(parts, list) else ():
        if isinstance(part, dict) and isinstance(part.get("text"), str):
            chars += len(part["text"])
    return chars


def _message_chars(messages: Any) -> int:
    """Characters of text in a string or a list of messages (each a string, or an object
    with `content`: a string or a list of parts); two levels only, whatever the nesting."""
    if isinstance(messages, str):
        return len(messages)
    chars = 0
    for message in messages if isinstance(messages, list) else ():
        if isinstance(message, str):
            chars += len(message)
        elif isinstance(message, dict):
            chars += _part_chars(message.get("content"))
    return chars


def estimate_prompt_tokens(body: dict[str, Any]) -> int:
    """Cheap token estimate: token-id lists count exactly, text counts 4 characters a token
    (chat and Anthropic messages, a Responses API input, a system prompt). Total over any
    JSON: a field of an unexpected type counts as little, never raises."""
    prompt = body.get("prompt")
    if prompt is None:
        chars = _message_chars(body.get("messages")) + _message_chars(body.get("input"))
        chars += _part_chars(body.get("system"))
        return chars // 4 + 1
    if isinstance(prompt, str):
        return len(prompt) // 4 + 1
    if isinstance(prompt, list):
        if not prompt or isinstance(prompt[0], int):
            return len(prompt) + 1
        total = 0
        for p in prompt:
            total += len(p) // 4 + 1 if isinstance(p, str) else len(p) if isinstance(p, list) else 1
        return total
    return 1


def decode_tokens(body: dict[str, Any], prompt_tokens: int) -> int:
    limit = (
        body.get("max_tokens")
        or body.get("max_completion_tokens")
        or body.get("max_output_tokens")
        or DEFAULT_MAX_TOKENS
    )
    n = body.get("n") or 1
    try:
        return prompt_tokens + int(limit) * int(n)
    except (TypeError, ValueError, OverflowError):  # e.g. a list, 1e400, a 5000-digit number
        return prompt_tokens + DEFAULT_MAX_TOKENS


def prefill_request_body(
    body: dict[str, Any],
    kv_params: dict[str, Any],
    limit_fields: tuple[str, ...] = ("max_tokens", "max_completion_tokens"),
) -> dict[str, Any]:
    """The prefiller's copy: one token (the API's first limit field set to 1, the others too
    where the client set them), no streaming, no minimum length, in the foreground and not
    stored (a Responses API request)."""
    p = dict(body)
    p[limit_fields[0]] = 1
    for name in limit_fields[1:]:
        if name in p:
            p[name] = 1
    p["stream"] = False
    p.pop("stream_options", None)
    p.pop("min_tokens", None)  # a minimum above 1 would contradict max_tokens=1
    p.pop("min_completion_tokens", None)
    if "background" in p:
        p["background"] = False
    if limit_fields[0] == "max_output_tokens":
        p["store"] = False
    p["kv_transfer_params"] = kv_params
    return p


def child_request_ids(request_id: str, chat: bool, body: dict[str, Any]) -> list[str]:
    """The ids vLLM gives the request (what the decoder reports to the metaserver)."""
    if chat:
        return [f"chatcmpl-{request_id}"]
    prompt = body.get("prompt")
    n = len(prompt) if isinstance(prompt, list) and prompt and not isinstance(prompt[0], int) else 1
    return [f"cmpl-{request_id}-{i}" for i in range(n)]
