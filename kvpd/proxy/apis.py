"""The vLLM HTTP APIs the proxy serves, and how: generation APIs run the deployment's flow
(prefill with a one-token limit and the KV handshake, then decode); the others are passed to a
healthy engine as they are (their answer depends on the model, not on which engine gives it).

docs/proxy.md has this as a table ("APIs"); tests/unit/test_proxy_apis.py holds the proxy
to it."""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from kvpd.proxy.hostpool import fetch
from kvpd.proxy.relay import Failure, error_body
from kvpd.proxy.rewrite import encode, parse_body
from kvpd.proxy.upstream import UpstreamError

if TYPE_CHECKING:
    from kvpd.proxy.backends import BackendPool
    from kvpd.proxy.flows import BackendAuth
    from kvpd.proxy.routing import Request
    from kvpd.proxy.server import ClientConnection

GenerationRoute = Literal["completions", "chat_completions", "responses", "messages", "invocations"]

# path -> the generation API behind it
GENERATION_PATHS: dict[str, GenerationRoute] = {
    "/v1/completions": "completions",
    "/v1/chat/completions": "chat_completions",
    "/v1/responses": "responses",  # OpenAI Responses API
    "/v1/messages": "messages",  # Anthropic Messages API
    "/invocations": "invocations",  # SageMaker: a chat or a completion request, by its body
}

# The fields that bound a request's output, per API: the prefill's copy sets each to 1.
LIMIT_FIELDS: dict[GenerationRoute, tuple[str, ...]] = {
    "completions": ("max_tokens",),
    "chat_completions": ("max_tokens", "max_completion_tokens"),
    "responses": ("max_output_tokens",),
    "messages": ("max_tokens",),
    "invocations": ("max_tokens", "max_completion_tokens"),
}

# Passed to a healthy engine (decoders first): (method, path). vLLM serves /ping for GET and
# POST (SageMaker's health check); /openapi.json describes the engine's own routes.
PASS_THROUGH: tuple[tuple[str, str], ...] = (
    ("POST", "/tokenize"),
    ("POST", "/detokenize"),
    ("GET", "/version"),
    ("GET", "/ping"),
    ("POST", "/ping"),
    ("GET", "/openapi.json"),
)

PASS_THROUGH_TIMEOUT_S = 10.0


def json_media_refusal(req: Request) -> bytes | None:
    """vLLM's 400 for a request whose Content-Type is not application/json, or None. vLLM's
    generation and tokenizer routes check the media type before reading the body, so a
    request without a Content-Type is refused too (as is curl -d: form-urlencoded)."""
    ctype = req.headers.get(b"content-type")
    if ctype is not None and ctype.split(b";", 1)[0].strip().lower() == b"application/json":
        return None
    message = "1 validation error:\n  Unsupported Media Type: Only 'application/json' is allowed"
    return error_body(message, "Bad Request", 400)


def is_chat(route: GenerationRoute, body: dict[str, object]) -> bool:
    """Whether vLLM answers the request as a chat completion (its ids are chatcmpl-...)."""
    if route == "invocations":
        return "messages" in body
    return route in ("chat_completions", "messages")


class PassThrough:
    """A request answered by one healthy engine: the method, path and query as sent, a JSON
    body re-encoded from the parsed one (never the client's raw bytes), the engine's status,
    content type and body back."""

    def __init__(self, pools: list[BackendPool], auth: BackendAuth) -> None:
        self.pools = pools
        self.auth = auth

    async def handle(self, client: ClientConnection, req: Request) -> None:
        data = b""
        refusal = json_media_refusal(req) if req.path.endswith(b"tokenize") else None
        if refusal is not None:
            client.send_json(400, refusal)
            return
        if req.body:
            try:
                data = encode(parse_body(req.body))
            except Failure as f:
                client.send_json(f.status, f.body)
                return
        target = req.path + (b"?" + req.query if req.query else b"")
        extra = self.auth.header(req)
        problems: list[str] = []
        for pool in self.pools:
            for backend in pool.backends:
                if not backend.usable:
                    continue
                try:
                    resp = await fetch(
                        backend.pool, req.method, target, data, PASS_THROUGH_TIMEOUT_S, extra
                    )
                except UpstreamError as e:
                    problems.append(str(e))
                    continue
                if resp.status >= 500:
                    problems.append(f"{backend.name} answered HTTP {resp.status}")
                    continue
                ctype = resp.headers.get(b"content-type", b"application/json")
                client.send(resp.status, resp.body, ctype)
                return
        path = req.path.decode(errors="replace")
        msg = f"no backend answered {path}: " + ("; ".join(problems) or "none is healthy")
        client.send_json(503, error_body(msg, "no_backend", 503))
