"""The proxy against the engines it fronts, as a real client sees them: the official `openai`
SDK calls every vLLM API the proxy serves, through the proxy and directly against the local
CPU deployment's decode engine, streaming and not, and the answers must be equal (ids,
timestamps and the engines' own KV hand-over figures aside), errors included."""

from __future__ import annotations

import http.client
import json
import re
import socket
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from kvpd.proxy.http1 import ChunkedReader
from tests.e2e.local_deploy import LocalDeployment, metric

openai = pytest.importorskip("openai")

pytestmark = pytest.mark.e2e

PROMPT = "The quick brown fox jumps over the lazy dog and then runs away into the forest where"
# Fields that differ between any two calls of the same request.
VOLATILE = frozenset(("id", "created", "created_at", "system_fingerprint", "request_id",
                      "item_id", "response_id", "kv_transfer_params",
                      "prompt_tokens_details", "sequence_number"))  # fmt: skip


def strip(value: Any) -> Any:
    """The value without the volatile fields, at any depth."""
    if isinstance(value, dict):
        return {k: strip(v) for k, v in value.items() if k not in VOLATILE}
    if isinstance(value, list):
        return [strip(v) for v in value]
    return value


def stream_summary(events: list[Any]) -> dict[str, Any]:
    """A stream as what it says, not how it is cut: vLLM puts one or several tokens in an
    event as the engine runs ahead of the API server, so the text is joined and consecutive
    events that differ only in their text are one."""
    text: list[str] = []
    shapes: list[Any] = []
    for event in events:
        event = strip(event)
        _pull_text(event, text)
        if shapes and _unfinished(shapes[-1]) == _unfinished(event):
            shapes[-1] = event  # the same event, or the last token's and the finish in one
        else:
            shapes.append(event)
    return {"text": "".join(text), "events": shapes}


def _unfinished(event: Any) -> Any:
    """`event` with its choices' finish and stop reasons unset: whether the last tokens come
    in the event that says `length` or just before it depends on timing, not on the server."""
    if isinstance(event, dict):
        return {k: None if k in ("finish_reason", "stop_reason") else _unfinished(v)
                for k, v in event.items()}  # fmt: skip
    if isinstance(event, list):
        return [_unfinished(v) for v in event]
    return event


def _pull_text(event: Any, text: list[str]) -> None:
    """Move the generated text out of an event: completions, chat, Responses, Anthropic."""
    if not isinstance(event, dict):
        return
    for choice in event.get("choices") or ():
        if isinstance(choice.get("text"), str):
            text.append(choice.pop("text"))
        delta = choice.get("delta")
        if isinstance(delta, dict) and isinstance(delta.get("content"), str):
            text.append(delta.pop("content"))
    if isinstance(event.get("delta"), str):  # response.output_text.delta
        text.append(event.pop("delta"))
    data = event.get("data")
    if isinstance(data, dict) and "choices" in data:  # a raw SSE event: {"event", "data"}
        _pull_text(data, text)
    delta = data.get("delta") if isinstance(data, dict) else None
    if isinstance(delta, dict) and isinstance(delta.get("text"), str):  # content_block_delta
        text.append(delta.pop("text"))


@pytest.fixture
def pair(local_deployment: LocalDeployment) -> Iterator[tuple[Any, Any]]:
    """SDK clients for the proxy and for the decode engine, no retries (an error is data)."""
    clients = tuple(
        openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=120)
        for url in (local_deployment.proxy, local_deployment.decode)
    )
    yield clients  # type: ignore[misc]
    for c in clients:
        c.close()


def both(pair: tuple[Any, Any], call: Any) -> tuple[Any, Any]:
    """`call(client)` directly, then through the proxy (a cold decoder when called directly:
    its prefix cache holds the prompt only after the proxy's call): each result, or the
    exception raised, proxy's first."""
    out = []
    for client in reversed(pair):
        try:
            out.append(call(client))
        except openai.APIError as e:
            out.append(e)
    return out[1], out[0]


def dumped(result: Any) -> Any:
    if isinstance(result, openai.APIStatusError):
        return {"status": result.status_code, "class": type(result).__name__,
                "body": strip(result.body)}  # fmt: skip
    if isinstance(result, Exception):
        return {"class": type(result).__name__}
    if isinstance(result, openai.Stream):
        return stream_summary([event.model_dump() for event in result])
    if hasattr(result, "model_dump"):
        return strip(result.model_dump())
    return strip(result)


def assert_same(pair: tuple[Any, Any], call: Any) -> Any:
    via_proxy, direct = (dumped(r) for r in both(pair, call))
    assert via_proxy == direct
    return via_proxy


GREEDY: dict[str, Any] = {"temperature": 0, "extra_body": {"ignore_eos": True}}


@pytest.mark.parametrize("stream", [False, True])
def test_completions(pair: tuple[Any, Any], stream: bool) -> None:
    extra = {"stream_options": {"include_usage": True}} if stream else {}
    got = assert_same(pair, lambda c: c.completions.create(
        model="tiny", prompt=PROMPT, max_tokens=6, stream=stream, **GREEDY, **extra))  # fmt: skip
    assert got


@pytest.mark.parametrize("stream", [False, True])
def test_chat_completions(pair: tuple[Any, Any], stream: bool) -> None:
    extra = {"stream_options": {"include_usage": True}} if stream else {}
    messages = [{"role": "user", "content": PROMPT}]
    assert_same(pair, lambda c: c.chat.completions.create(
        model="tiny", messages=messages, max_tokens=6, stream=stream,
        **GREEDY, **extra))  # fmt: skip


@pytest.mark.parametrize("stream", [False, True])
def test_responses(pair: tuple[Any, Any], stream: bool) -> None:
    got = assert_same(pair, lambda c: c.responses.create(
        model="tiny", input=PROMPT, max_output_tokens=6, stream=stream, temperature=0))  # fmt: skip
    assert not isinstance(got, dict) or "status" not in got or got["status"] != 404


def plain(method: str, url: str, body: Any = None) -> tuple[int, bytes]:
    """A plain request (urllib: no SDK in between): (status, body)."""
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method,
                                 headers={"Content-Type": "application/json"})  # fmt: skip
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def _raw(url: str, path: str, body: Any, stream: bool = False) -> Any:
    status, raw = plain("POST", url + path, body)
    if stream:
        events = [e for e in raw.decode().split("\n\n") if e.strip()]
        return status, stream_summary([_event(e) for e in events])
    return status, strip(json.loads(raw))


def _event(text: str) -> Any:
    lines = dict(line.split(": ", 1) for line in text.splitlines() if ": " in line)
    data = lines.get("data", "")
    return {"event": lines.get("event"), "data": json.loads(data) if data[:1] == "{" else data}


@pytest.mark.parametrize("stream", [False, True])
def test_anthropic_messages(local_deployment: LocalDeployment, stream: bool) -> None:
    body = {"model": "tiny", "max_tokens": 6, "temperature": 0, "stream": stream,
            "messages": [{"role": "user", "content": PROMPT}]}  # fmt: skip
    via_proxy = _raw(local_deployment.proxy, "/v1/messages", body, stream)
    direct = _raw(local_deployment.decode, "/v1/messages", body, stream)
    assert via_proxy == direct
    assert via_proxy[0] == 200


def test_invocations(local_deployment: LocalDeployment) -> None:
    for body in ({"model": "tiny", "prompt": PROMPT, "max_tokens": 4, "temperature": 0},
                 {"model": "tiny", "messages": [{"role": "user", "content": PROMPT}],
                  "max_tokens": 4, "temperature": 0}):  # fmt: skip
        via_proxy = _raw(local_deployment.proxy, "/invocations", body)
        assert via_proxy == _raw(local_deployment.decode, "/invocations", body)
        assert via_proxy[0] == 200


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("POST", "/tokenize", {"model": "tiny", "prompt": PROMPT}),
        ("POST", "/detokenize", {"model": "tiny", "tokens": [1, 2, 3]}),
        ("GET", "/version", None),
        ("GET", "/ping", None),
        ("GET", "/v1/models", None),
        ("GET", "/openapi.json", None),
    ],
)
def test_passed_through(
    local_deployment: LocalDeployment, method: str, path: str, body: Any
) -> None:
    a = plain(method, local_deployment.proxy + path, body)
    b = plain(method, local_deployment.decode + path, body)
    assert a[0] == b[0] == 200
    assert strip(json.loads(a[1]) if a[1] else None) == strip(json.loads(b[1]) if b[1] else None)


def test_the_clients_request_id_is_kept(pair: tuple[Any, Any]) -> None:
    proxy, direct = pair
    for client in pair:
        done = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=2,
                                         extra_headers={"X-Request-Id": "client-7"})  # fmt: skip
        assert done.id == "cmpl-client-7"
        chat = client.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=2,
            extra_body={"request_id": "client-8"})  # fmt: skip
        assert chat.id == "chatcmpl-client-8"


ERRORS: list[dict[str, Any]] = [
    {"max_tokens": 100000},
    {"max_tokens": "ten"},
    {"max_tokens": -1},
    {"prompt": PROMPT * 40},  # longer than the model
    {"model": "no-such-model"},
    {"temperature": "hot"},
]


@pytest.mark.parametrize(
    "change", ERRORS, ids=[next(iter(e)) + str(i) for i, e in enumerate(ERRORS)]
)
def test_errors_are_the_engines(
    pair: tuple[Any, Any], change: dict[str, Any], local_deployment: LocalDeployment
) -> None:
    proxy_url = local_deployment.proxy
    args = {"model": "tiny", "prompt": PROMPT, "max_tokens": 4}
    args.update(change)
    extra = {k: v for k, v in args.items() if k not in ("model", "prompt")}
    before = metric(proxy_url, "kvpd_proxy_sent_without_prefill_total")
    got = assert_same(pair, lambda c: c.completions.create(
        model=args["model"], prompt=args["prompt"], extra_body=extra))  # fmt: skip
    assert isinstance(got, dict), got
    assert got["status"] in (400, 404), got
    # refused for its output limit: the decoder answered without a prefill being run
    sure = "max_tokens" in change
    assert metric(proxy_url, "kvpd_proxy_sent_without_prefill_total") - before == int(sure)


def test_usage_counts_only_prefix_cache_hits_as_cached(pair: tuple[Any, Any]) -> None:
    def call(c: Any) -> Any:
        return c.completions.create(model="tiny", prompt=prompt, max_tokens=2)

    # no engine has it cached; several whole 32-token blocks, so KV is handed over
    prompt = f"{time.time()} {PROMPT} {PROMPT} {PROMPT} {PROMPT}"

    via_proxy, direct = both(pair, call)
    assert via_proxy.usage.model_dump() == direct.usage.model_dump()
    assert via_proxy.usage.prompt_tokens > 64
    assert via_proxy.usage.prompt_tokens_details


def _exchange(url: str, method: str, path: str, body: bytes, headers: dict[str, str]) -> Any:
    """(status, selected headers, body) with no redirect followed."""
    host, _, port = url.removeprefix("http://").partition(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=60)
    try:
        conn.request(method, path, body=body or None, headers=headers)
        r = conn.getresponse()
        data = r.read()
        keep = ("allow", "access-control-allow-methods", "access-control-max-age",
                "access-control-allow-headers")  # fmt: skip
        got = {k: r.getheader(k) for k in keep if r.getheader(k) is not None}
        location = r.getheader("location")
        if location:  # the host part is each server's own
            got["location"] = "/" + location.split("/", 3)[-1]
        return r.status, got, data
    finally:
        conn.close()


JSON = {"Content-Type": "application/json"}
EDGES = [
    ("GET", "/v1/completions", b"", {}),  # 405 with Allow
    ("POST", "/v1/completions/", b"{}", JSON),  # a trailing slash
    ("POST", "/v1/completions", b'{"model": "tiny", "prompt": "x"}',
     {"Content-Type": "text/plain"}),
    ("POST", "/v1/completions", b'{"model": "tiny", "prompt": "x"}', {}),  # no Content-Type
    ("POST", "/tokenize", b'{"model": "tiny", "prompt": "x"}', {}),
    ("OPTIONS", "/v1/completions", b"", {"Origin": "http://a.example",
     "Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": "authorization"}),
]  # fmt: skip


@pytest.mark.parametrize(("method", "path", "body", "headers"), EDGES)
def test_edges_answer_as_vllm(
    local_deployment: LocalDeployment, method: str, path: str, body: bytes, headers: dict
) -> None:
    via_proxy = _exchange(local_deployment.proxy, method, path, body, headers)
    direct = _exchange(local_deployment.decode, method, path, body, headers)
    assert via_proxy[:2] == direct[:2]
    if via_proxy[0] == 400:  # the same text, or the same JSON object
        assert via_proxy[2] == direct[2] or json.loads(via_proxy[2]) == json.loads(direct[2])


def _http10(url: str, request: bytes, again: bytes = b"") -> dict[str, Any]:
    """One raw HTTP/1.0 exchange: the status, the framing and connection headers, the payload
    (de-chunked when the server sent chunks anyway), and whether the server closed the
    connection after the response or served `again` on it."""
    host, _, port = url.removeprefix("http://").partition(":")
    with socket.create_connection((host, int(port)), timeout=120) as sock:
        sock.sendall(request)
        head, body, closed = _read_response(sock)
        second = None
        if not closed and again:
            sock.sendall(again)
            second = _read_response(sock)[0].split(b" ", 2)[1]
    lines = head.split(b"\r\n")
    headers = dict(
        (k.strip().lower(), v.strip()) for k, _, v in (h.partition(b":") for h in lines[1:])
    )
    chunked = headers.get(b"transfer-encoding", b"").lower() == b"chunked"
    if chunked:
        reader = ChunkedReader(collect=True)
        reader.feed(body)
        body = reader.body()
    return {"status": int(lines[0].split()[1]), "chunked": chunked,
            "length": b"content-length" in headers, "connection": headers.get(b"connection"),
            "closed": closed, "second": second, "body": body}  # fmt: skip


def _read_response(sock: socket.socket) -> tuple[bytes, bytes, bool]:
    """(head, body bytes, closed by the server): a Content-Length body is read to its length
    (then a closed connection shows within 2 s), anything else to the close."""
    data = b""
    while b"\r\n\r\n" not in data:
        got = sock.recv(65536)
        if not got:
            return data, b"", True
        data += got
    head, _, body = data.partition(b"\r\n\r\n")
    m = re.search(rb"(?im)^content-length:\s*(\d+)", head)
    while m is None or len(body) < int(m.group(1)):
        got = sock.recv(65536)
        if not got:
            return head, body, True
        body += got
    sock.settimeout(2.0)
    try:
        closed = sock.recv(1) == b""
    except TimeoutError:
        closed = False
    sock.settimeout(120)
    return head, body, closed


def _payload(raw: bytes, stream: bool) -> Any:
    if stream:
        events = [e for e in raw.decode().split("\n\n") if e.strip()]
        return stream_summary([_event(e) for e in events])
    return strip(json.loads(raw))


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
@pytest.mark.parametrize("keep_alive", [False, True], ids=["close", "keep-alive"])
def test_http10_as_vllm_and_by_the_rfc(
    local_deployment: LocalDeployment, keep_alive: bool, stream: bool
) -> None:
    """Raw HTTP/1.0 to the engine and through the proxy. Equal: status and payload. vLLM's
    uvicorn closes every HTTP/1.0 connection (`connection: close`, keep-alive asked or not)
    and frames a stream with chunks, which HTTP/1.0 does not have (a 1.0 client reads chunk
    sizes as payload). The proxy follows HTTP/1.0 itself: a body with a Content-Length and
    `Connection: keep-alive` when asked (then the connection serves the next request), a
    stream unframed and ended by closing."""
    body = json.dumps({"model": "tiny", "prompt": PROMPT, "max_tokens": 4, "temperature": 0,
                       "ignore_eos": True, "stream": stream}).encode()  # fmt: skip
    conn = b"Connection: keep-alive\r\n" if keep_alive else b""
    request = (b"POST /v1/completions HTTP/1.0\r\nContent-Type: application/json\r\n%s"
               b"Content-Length: %d\r\n\r\n%s" % (conn, len(body), body))  # fmt: skip
    again = b"GET /v1/models HTTP/1.0\r\nConnection: keep-alive\r\n\r\n"
    direct = _http10(local_deployment.decode, request, again)
    via_proxy = _http10(local_deployment.proxy, request, again)
    assert via_proxy["status"] == direct["status"] == 200
    assert _payload(via_proxy["body"], stream) == _payload(direct["body"], stream)
    # vLLM (uvicorn): closes, and chunks a stream even for HTTP/1.0
    assert direct["closed"]
    assert direct["connection"] == b"close"
    assert direct["chunked"] == stream
    # the proxy: never chunks for HTTP/1.0; keeps a Content-Length answer's connection if asked
    assert not via_proxy["chunked"]
    assert via_proxy["length"] == (not stream)
    kept = keep_alive and not stream
    assert via_proxy["connection"] == (b"keep-alive" if kept else b"close")
    assert via_proxy["closed"] == (not kept)
    assert via_proxy["second"] == (b"200" if kept else None)


def test_the_engines_metrics_through_the_proxy(local_deployment: LocalDeployment) -> None:
    """Every sample of the decode engine's /metrics (vLLM's real text) is in the proxy's
    /metrics/engines, labelled with its role; each family's HELP/TYPE once."""
    status, own = plain("GET", local_deployment.decode + "/metrics")
    assert status == 200
    status, merged = plain("GET", local_deployment.proxy + "/metrics/engines")
    assert status == 200
    names = {line.split("{")[0].split(" ")[0] for line in own.decode().splitlines()
             if line and not line.startswith("#")}  # fmt: skip
    lines = merged.decode().splitlines()
    decode = {line.split("{")[0] for line in lines if 'role="decode",backend="' in line}
    assert names, sorted(names - decode)[:10]
    assert names <= decode, sorted(names - decode)[:10]
    types = [line for line in lines if line.startswith("# TYPE ")]
    assert len(types) == len(set(types))
    assert any(line.startswith("kvpd_proxy_engine_metrics_up{") and line.endswith(" 1")
               for line in lines)  # fmt: skip
