"""kvpd's stand-in engine: a rehearsal engine for topology rehearsals at full size (a STAND-IN,
it does no inference).

It speaks what kvpd and its proxy need from a vLLM engine: the OpenAI API (`/v1/completions`,
`/v1/chat/completions`, streamed or not, with `usage`), the P/D handshake (a prefiller asked
with `kv_transfer_params.do_remote_decode` answers with the parameters a decoder needs; a
decoder given `do_remote_prefill` counts the prompt as received KV), `/health`, `/v1/models`,
`/reset_prefix_cache` and `/metrics` with the counters vLLM exports under vLLM's names (the ones
kvpd's bench proof reads). Its prefix cache holds chained block hashes, so repeated prompts
show as hits; with --cache-blocks it holds at most that many blocks, least recently used
evicted first, as an engine's KV cache of limited capacity. It also holds the real process's
other ports (KV side channels, DP RPC) so port checks see the real layout.

Stdlib only and run as a script (`python standin_engine.py --host A --port P --role R -- ARGV`):
it runs on any host with a Python 3, without kvpd installed. Everything after `--` is the real
engine's command line, kept for `ps` and the log; the stand-in reads its model name from it and,
on a decode, its sparse KV offload settings. A decode with sparse offload and kvpd's planner
(`KVPD_SPARSE_PLANNER=kvpd`) runs that planner, kvpd's native core from the node bundle (with
NumPy), for every request (standin_sparse.py beside this script), exports what it loaded and
planned on /metrics (`kvpd:sparse_planner_*`), and does not start when it cannot load it.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import os
import signal
import socket
import sys
import threading
import time
import uuid
from collections import OrderedDict
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

SOURCES = ("local_compute", "local_cache_hit", "external_kv_transfer")
# FAULT INJECTION switch (test only): every completion carries zero tokens, as a P/D
# deployment whose KV transfer failed can answer; the output checks must fail it.
EMPTY = bool(os.environ.get("KVPD_FAULT_EMPTY_COMPLETIONS"))


class Engine:
    """The stand-in's state: its prefix cache and vLLM's counters (thread-safe)."""

    def __init__(
        self, role: str, model: str, block: int, host: str, port: int, capacity: int = 0
    ) -> None:
        self.role, self.model, self.block = role, model, block
        self.host, self.port = host, port
        self.engine_id = f"standin-{host}-{port}"
        self.lock = threading.Lock()
        self.cache: OrderedDict[str, None] = OrderedDict()  # block hashes, oldest use first
        self.capacity = capacity  # blocks; 0: no limit
        self.counters: dict[str, float] = {}
        self.sparse: Any = None  # standin_sparse.Planner of a decode running kvpd's planner

    def count(self, name: str, value: float, **labels: str) -> None:
        key = name + ("{" + ",".join(f'{k}="{v}"' for k, v in labels.items()) + "}")
        with self.lock:
            self.counters[key] = self.counters.get(key, 0.0) + value

    def admit(self, tokens: list[str], received: bool) -> None:
        """Account one prompt: whole blocks already seen are hits, the rest is computed (or
        received from prefill), and its blocks join the cache."""
        h, hashes = "", []
        for i in range(len(tokens) // self.block):
            chunk = "\0".join(tokens[i * self.block : (i + 1) * self.block])
            h = hashlib.sha256((h + chunk).encode()).hexdigest()
            hashes.append(h)
        with self.lock:
            hit_blocks = 0
            for x in hashes:
                if x not in self.cache:
                    break
                hit_blocks += 1
            for x in hashes:
                self.cache[x] = None
                self.cache.move_to_end(x)
            while self.capacity and len(self.cache) > self.capacity:
                self.cache.popitem(last=False)
        n = len(tokens)
        hit = hit_blocks * self.block
        self.count("vllm:prefix_cache_queries_total", n)
        self.count("vllm:prefix_cache_hits_total", hit)
        self.count("vllm:prompt_tokens_total", n)
        rest = n - hit
        got = rest if received else 0
        self.count("vllm:prompt_tokens_by_source_total", hit, source="local_cache_hit")
        self.count("vllm:prompt_tokens_by_source_total", got, source="external_kv_transfer")
        self.count("vllm:prompt_tokens_by_source_total", rest - got, source="local_compute")
        self.count("vllm:external_prefix_cache_queries_total", rest)
        self.count("vllm:external_prefix_cache_hits_total", got)

    def metrics(self) -> str:
        lines = [f"# kvpd stand-in engine {self.engine_id} ({self.role})"]
        with self.lock:
            items = sorted(self.counters.items())
        for key, value in items:
            name, _, labels = key.partition("{")
            labels = f'model_name="{self.model}",engine="0"' + (
                "," + labels if labels[:-1] else "}"
            )
            lines.append(f"{name}{{{labels} {value:g}")
        return "\n".join(lines) + "\n"


def prompt_tokens(body: dict[str, Any]) -> list[str]:
    """Every 4 characters of the text stand for a token, about what a BPE tokenizer makes of
    English (a list of ints is taken as token ids)."""
    if "messages" in body:
        text = " ".join(str(m.get("content", "")) for m in body.get("messages") or [])
    else:
        p = body.get("prompt", "")
        if isinstance(p, list):
            if p and isinstance(p[0], int):
                return [str(t) for t in p]
            text = " ".join(str(x) for x in p)
        else:
            text = str(p)
    return [text[i : i + 4] for i in range(0, len(text), 4)]


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    engine: Engine

    def log_message(self, format: str, *args: Any) -> None:  # quiet: one line per request
        return

    def _send(self, status: int, body: bytes, ctype: str = "application/json") -> None:
        self.send_response(status)
        self.send_header("content-type", ctype)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        e = self.engine
        if self.path == "/health":
            self._send(200, b"")
        elif self.path == "/metrics":
            self._send(200, e.metrics().encode(), "text/plain; version=0.0.4")
        elif self.path == "/v1/models":
            data = [{"id": e.model, "object": "model", "owned_by": "kvpd-standin"}]
            self._send(200, json.dumps({"object": "list", "data": data}).encode())
        else:
            self._send(404, b'{"error": "not found"}')

    def do_POST(self) -> None:
        n = int(self.headers.get("content-length") or 0)
        raw = self.rfile.read(n) if n else b""
        if self.path == "/reset_prefix_cache":
            with self.engine.lock:
                self.engine.cache.clear()
            self._send(200, b"")
            return
        if self.path not in ("/v1/completions", "/v1/chat/completions"):
            self._send(404, b'{"error": "not found"}')
            return
        try:
            body = json.loads(raw or b"{}")
        except ValueError:
            self._send(400, b'{"error": "body is not JSON"}')
            return
        self._generate(body, self.path.endswith("chat/completions"))

    def _generate(self, body: dict[str, Any], chat: bool) -> None:
        e = self.engine
        kv = body.get("kv_transfer_params") or {}
        tokens = prompt_tokens(body)
        e.admit(tokens, received=bool(kv.get("do_remote_prefill")))
        out = max(1, int(body.get("max_tokens") or body.get("max_completion_tokens") or 16))
        if EMPTY:  # FAULT INJECTION: answer as if generation failed silently
            out = 0
        if e.sparse is not None and out:  # one planner call per generated token, as on decode
            loaded, descriptors = e.sparse.plan(len(tokens), out)
            e.count("kvpd:sparse_planner_requests_total", 1)
            e.count("kvpd:sparse_planner_steps_total", out)
            e.count("kvpd:sparse_planner_loaded_tokens_total", loaded)
            e.count("kvpd:sparse_planner_copy_descriptors_total", descriptors)
        rid = self.headers.get("x-request-id") or uuid.uuid4().hex
        usage = {"prompt_tokens": len(tokens), "completion_tokens": out}
        usage["total_tokens"] = len(tokens) + out
        e.count("vllm:generation_tokens_total", out)
        e.count("vllm:request_success_total", 1, finished_reason="length")
        head = {
            "id": ("chatcmpl-" if chat else "cmpl-") + rid,
            "object": "chat.completion" if chat else "text_completion",
            "created": int(time.time()),
            "model": e.model,
        }
        if body.get("stream"):
            self._stream(head, out, chat, usage, body)
            return
        text = " tok" * out
        choice: dict[str, Any] = {"index": 0, "finish_reason": "length"}
        choice.update(
            {"message": {"role": "assistant", "content": text}} if chat else {"text": text}
        )
        if body.get("logprobs") and not chat:
            choice["logprobs"] = logprobs(tokens, out)
        answer: dict[str, Any] = {**head, "choices": [choice], "usage": usage}
        if kv.get("do_remote_decode"):  # the prefill half of the P/D handshake
            answer["kv_transfer_params"] = {
                "do_remote_prefill": True,
                "do_remote_decode": False,
                "remote_engine_id": e.engine_id,
                "remote_block_ids": list(range(len(tokens) // e.block)),
                "remote_request_id": rid,
                "remote_host": e.host,
                "remote_port": e.port,
                "tp_size": 1,
            }
        self._send(200, json.dumps(answer).encode())

    def _stream(
        self,
        head: dict[str, Any],
        out: int,
        chat: bool,
        usage: dict[str, int],
        body: dict[str, Any],
    ) -> None:
        self.send_response(200)
        self.send_header("content-type", "text/event-stream; charset=utf-8")
        self.send_header("transfer-encoding", "chunked")
        self.end_headers()

        def event(obj: Any) -> None:
            data = b"data: " + (obj if isinstance(obj, bytes) else json.dumps(obj).encode())
            data += b"\n\n"
            self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))

        piece = " tok" if out else ""  # empty: one final chunk without text, as vLLM ends
        for i in range(max(out, 1)):
            last = i >= out - 1
            delta = {"content": piece} if chat else None
            choice: dict[str, Any] = {"index": 0, "finish_reason": "length" if last else None}
            choice.update({"delta": delta} if chat else {"text": piece})
            event({**head, "choices": [choice]})
        if (body.get("stream_options") or {}).get("include_usage"):
            event({**head, "choices": [], "usage": usage})
        event(b"[DONE]")
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()


def logprobs(prompt: list[str], out: int) -> dict[str, Any]:
    """Completion logprobs (token ids as `token_id:N`) that depend only on the prompt, so
    every instance "generates" the same tokens for it, as greedy decoding of one model does."""
    seed = hashlib.sha256("\x00".join(prompt).encode()).digest()
    ids = [int.from_bytes(hashlib.sha256(seed + bytes([i % 256])).digest()[:2], "big") % 1000
           for i in range(out)]  # fmt: skip
    names = [f"token_id:{t}" for t in ids]
    top = [{n: -0.5} for n in names]
    return {"tokens": names, "token_logprobs": [-0.5] * out, "top_logprobs": top}


def hold(host: str, ports: list[int]) -> list[socket.socket]:
    """Listen on the real process's other ports, as the real engine would."""
    held = []
    for port in ports:
        s = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind((host, port))
        s.listen(16)
        held.append(s)
    return held


def model_of(real: list[str], given: str) -> str:
    """--served-model-name of the real command line, else the one kvpd passed."""
    for i, a in enumerate(real[:-1]):
        if a == "--served-model-name":
            return real[i + 1]
    return given


def _sibling(name: str) -> Any:
    """A module beside this script, loaded from its file: the stand-in runs as a script, and its
    parts come from where it does (not from a kvpd on PYTHONPATH, which is the bundle's)."""
    spec = importlib.util.spec_from_file_location(name, Path(__file__).with_name(name + ".py"))
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def start_sparse(engine: Engine, role: str, real: list[str], a: argparse.Namespace) -> None:
    """A decode with sparse KV offload on its real command line: load the planner the plan
    chose and say which, or exit at once saying why it cannot load (never plan without it)."""
    if role != "decode" or "sparse_kv_offload_config" not in " ".join(real):
        return
    sparse = _sibling("standin_sparse")
    if sparse.configured(real) is None:
        return
    try:
        planner, labels, line = sparse.start(
            real, a.sparse_topk, a.sparse_token_bytes, a.block_size
        )
    except sparse.StartError as e:
        print(f"kvpd stand-in engine {role} on {a.host}:{a.port}: cannot start: {e}",
              file=sys.stderr, flush=True)  # fmt: skip
        raise SystemExit(2) from None
    engine.sparse = planner
    engine.count("kvpd:sparse_planner_info", 1, **labels)
    print(f"kvpd stand-in engine {role} on {a.host}:{a.port}: {line}", flush=True)


class _Server(ThreadingHTTPServer):
    """The engine's HTTP server. A client that resets its connection (the proxy cancelling a
    request, a benchmark stopping) is an ordinary event for an engine: it is not printed as a
    traceback, which is what socketserver does with every handler error."""

    daemon_threads = True
    request_queue_size = 256  # the proxy fans many connections in

    def handle_error(self, request: object, client_address: object) -> None:
        if isinstance(sys.exc_info()[1], (ConnectionResetError, BrokenPipeError)):
            return
        super().handle_error(request, client_address)  # type: ignore[arg-type]


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    real: list[str] = []
    if "--" in args:
        i = args.index("--")
        args, real = args[:i], args[i + 1 :]
    p = argparse.ArgumentParser(description="kvpd stand-in engine (no inference)")
    p.add_argument("--host", required=True)
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--role", required=True, choices=("prefill", "decode", "mixed"))
    p.add_argument("--served-model-name", default="standin")
    p.add_argument("--block-size", type=int, default=128)
    p.add_argument("--hold-port", type=int, action="append", default=[])
    p.add_argument("--cache-blocks", type=int, default=0, help="prefix cache capacity (0: none)")
    p.add_argument("--sparse-topk", type=int, help="sparse offload: the model's index_topk")
    p.add_argument(
        "--sparse-token-bytes", default="1024,128", help="sparse offload: K,V bytes of a token"
    )
    a = p.parse_args(args)
    model = model_of(real, a.served_model_name)
    engine = Engine(a.role, model, a.block_size, a.host, a.port, a.cache_blocks)
    start_sparse(engine, a.role, real, a)
    handler = type("BoundHandler", (Handler,), {"engine": engine})
    _Server.address_family = socket.AF_INET6 if ":" in a.host else socket.AF_INET
    server = _Server((a.host, a.port), handler)
    held = hold(a.host, a.hold_port)
    signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=server.shutdown).start())
    print(
        f"kvpd stand-in engine {a.role} on {a.host}:{a.port} (holding {a.hold_port}); "
        f"standing in for: {' '.join(real)}",
        flush=True,
    )
    try:
        server.serve_forever(poll_interval=0.5)
    finally:
        server.server_close()
        for s in held:
            s.close()


if __name__ == "__main__":
    main()
