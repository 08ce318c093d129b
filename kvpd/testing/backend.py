"""A stand-in for vLLM engines behind kvpd's proxy, for fault injection and benchmarks (it
does no inference): a prefiller that answers JSON with kv_transfer_params and a decoder that
waits, then streams SSE chunks, speaking the HTTP vLLM speaks to a P/D proxy.

Fault switches, settable at any time: `healthy` (GET /health 200 or 503), `fail_status` (answer
every generation with that status), `hang` (accept generation requests and never answer),
`silent` (never answer anything, health checks included), `trickle_s` (send a generation's
answer one byte every `trickle_s` seconds), `body_200` (answer every generation 200 with these
bytes: a backend that says OK with a body the proxy cannot use), `first_chunk_after_s` (answer
a streaming generation's head at once, as vLLM does, and its first chunk only this much later:
a decoder waiting for a long remote prefill or a queue).

In a process of its own (to SIGKILL it, or to give it its own CPU and open-files budget):
`python -m kvpd.testing.backend --prefill-port P --decode-port D` prints `prefill=P decode=D`
once both listen."""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sys
from typing import Any

from kvpd.proxy.apis import GENERATION_PATHS, is_chat
from kvpd.proxy.http1 import encode_chunk
from kvpd.proxy.routing import Request, Router
from kvpd.proxy.server import ClientConnection, ServerState

_SSE_HEAD = (
    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream; charset=utf-8\r\n"
    b"transfer-encoding: chunked\r\n\r\n"
)


class StandInBackend:
    """A stand-in vLLM server for one role ("prefill" or "decode")."""

    def __init__(
        self,
        role: str,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        delay_s: float = 0.02,
        chunks: int = 16,
        chunk_gap_s: float = 0.0,
        record: bool = True,
        internal_ids: bool = False,
    ) -> None:
        self.role = role
        self.host = host
        self.bind_port = port
        self.delay_s = delay_s
        self.chunks = chunks
        self.chunk_gap_s = chunk_gap_s
        self.record = record
        self.internal_ids = internal_ids  # report ids to the metaserver with vLLM's suffix
        self.requests: list[tuple[str, dict[bytes, bytes], dict[str, Any]]] = []
        self.metaserver_answers: list[int] = []
        self.healthy = True
        self.fail_status: int | None = None
        self.hang = False
        self.silent = False
        self.trickle_s = 0.0
        self.body_200: bytes | None = None
        self.first_chunk_after_s = 0.0
        # usage.prompt_tokens_details.cached_tokens in answers (None: no details, as vLLM
        # without --enable-prompt-tokens-details)
        self.cached_tokens: int | None = None
        self.served = 0
        self.server: asyncio.AbstractServer | None = None
        self._events: dict[tuple[bytes, int, int | None], list[bytes]] = {}
        router = Router()
        router.add("GET", "/health", self._health)
        router.add("GET", "/v1/models", self._models)
        router.add("POST", "/reset_prefix_cache", self._reset)
        for path in ("/v1/completions", "/v1/chat/completions", "/v1/responses", "/v1/messages",
                     "/invocations"):  # fmt: skip
            router.add_async("POST", path, self._generate)
        router.add("POST", "/tokenize", self._tokenize)
        router.add("POST", "/detokenize", self._tokenize)
        router.add("GET", "/version", self._version)
        router.add("GET", "/ping", self._health)
        router.add("POST", "/ping", self._health)
        router.add("GET", "/openapi.json", self._version)
        self._router = router

    @property
    def port(self) -> int:
        return self._port

    @property
    def name(self) -> str:
        return f"{self.host}:{self.port}"

    async def start(self) -> StandInBackend:
        loop = asyncio.get_running_loop()
        state = ServerState(self._router, loop, access_log=False)
        self._state = state
        self.server = await loop.create_server(
            lambda: ClientConnection(state), self.host, self.bind_port, backlog=2048
        )
        self._port: int = self.server.sockets[0].getsockname()[1]
        return self

    async def stop(self) -> None:
        """Close the listener and every open connection (a crashed server, as clients see it)."""
        if self.server is not None:
            self.server.close()
        for conn in list(self._state.connections):
            conn.abort()
        for task in list(self._state.tasks):
            task.cancel()
        await asyncio.sleep(0)

    # --- endpoints ---------------------------------------------------------------------------
    def _health(self, client: ClientConnection, req: Request) -> None:
        if self.silent:
            return  # the connection stays open and unanswered
        client.send(200 if self.healthy else 503, b"", b"text/plain")

    def _models(self, client: ClientConnection, req: Request) -> None:
        body = {
            "object": "list",
            "data": [
                {"id": "stand-in", "object": "model", "owned_by": self.role, "max_model_len": 512}
            ],  # fmt: skip
        }
        client.send_json(200, json.dumps(body).encode())

    def _tokenize(self, client: ClientConnection, req: Request) -> None:
        """Echoes what it got: path, query and parsed body (tests compare them)."""
        body = json.loads(req.body) if req.body else None
        if self.record:
            self.requests.append((req.path.decode(), req.headers, body or {}))
        if isinstance(body, dict) and body.get("prompt") == "":
            msg = {"error": {"message": "empty prompt", "type": "BadRequestError", "code": 400}}
            client.send_json(400, json.dumps(msg).encode())
            return
        answer = {"path": req.path.decode(), "query": req.query.decode(), "body": body}
        client.send_json(200, json.dumps(answer).encode())

    def _version(self, client: ClientConnection, req: Request) -> None:
        client.send_json(200, json.dumps({"version": "stand-in", "role": self.role}).encode())

    def _reset(self, client: ClientConnection, req: Request) -> None:
        client.send_json(200, b"{}")

    async def _generate(self, client: ClientConnection, req: Request) -> None:
        self.served += 1
        body: dict[str, Any] | None = None
        if self.record or b"metaserver" in req.body or self.role == "prefill":
            body = json.loads(req.body)
        if self.record:
            self.requests.append((req.path.decode(), req.headers, body or {}))
        if await self._faulty_answer(client):
            return
        if self.role == "prefill":
            self._prefill_answer(client, req, body or {})
            return
        await self._decode_answer(client, req, body or {})

    async def _faulty_answer(self, client: ClientConnection) -> bool:
        """The fault this stand-in is set to inject instead of an answer, if any."""
        if self.hang or self.silent:
            await _until_lost(client)
            return True
        if self.trickle_s:
            await self._trickle(client)
            return True
        if self.body_200 is not None:
            client.send_json(200, self.body_200)
            return True
        if self.fail_status is not None:
            msg = {"error": {"message": f"stand-in {self.role} failure", "code": self.fail_status}}
            client.send_json(self.fail_status, json.dumps(msg).encode())
            return True
        return False

    async def _decode_answer(
        self, client: ClientConnection, req: Request, body: dict[str, Any]
    ) -> None:
        """A decoder's (or mixed engine's) completion, after the metaserver call a layerwise
        decoder makes first."""
        streaming = b'"stream":true' in req.body.replace(b" ", b"")
        head_sent = False
        if self.first_chunk_after_s and streaming:
            client.begin_response()
            client.transport.write(_SSE_HEAD)  # type: ignore[union-attr]
            head_sent = True
            await asyncio.sleep(self.first_chunk_after_s)
        kv = body.get("kv_transfer_params") or {}
        if isinstance(kv, dict) and kv.get("metaserver"):
            # shielded: a decoder whose request is dropped still gets the metaserver's answer
            # (tests read it from metaserver_answers)
            call = self._call_metaserver(client, req, kv["metaserver"], body)
            if not await asyncio.shield(asyncio.ensure_future(call)):
                await _until_lost(client)  # a real decoder waits for KV that never comes
                return
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        if client.closed:
            return
        if streaming:
            await self._stream(client, req.path, head_sent)
        else:
            self._complete(client, req.path)

    async def _trickle(self, client: ClientConnection) -> None:
        """A valid answer, one byte at a time (a backend stuck in a crawl)."""
        client.begin_response()
        answer = b'{"id":"slow","choices":[{"index":0,"text":"x"}]}'
        raw = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s"
        for byte in raw % (len(answer), answer):
            if client.closed:
                return
            client.transport.write(bytes((byte,)))  # type: ignore[union-attr]
            await asyncio.sleep(self.trickle_s)
        client.finish()

    def _prefill_answer(self, client: ClientConnection, req: Request, body: dict[str, Any]) -> None:
        rid = req.headers.get(b"x-request-id", b"").decode()
        answer = {
            "id": f"cmpl-{rid}",
            "object": "text_completion",
            "model": "fake",
            "choices": [{"index": 0, "text": "x", "finish_reason": "length"}],
            "usage": self._usage(1),
            "kv_transfer_params": {
                "do_remote_prefill": True,
                "do_remote_decode": False,
                "remote_engine_id": f"fake-{self.port}",
                "remote_block_ids": [[1, 2, 3]],
                "remote_request_id": rid,
                "remote_host": self.host,
                "remote_port": self.port,
            },
        }
        client.send_json(200, json.dumps(answer).encode())

    def _event_chunks(self, path: bytes) -> list[bytes]:
        key = (path, self.chunks, self.cached_tokens)
        events = self._events.get(key)
        if events is None:
            chat = path.endswith(b"chat/completions")
            events = []
            for i in range(self.chunks):
                obj: dict[str, object]
                if chat:
                    choice: dict[str, object] = {"index": 0, "delta": {"content": f"t{i}"}}
                    obj = {"id": "chatcmpl-fake", "object": "chat.completion.chunk"}
                else:
                    choice = {"index": 0, "text": f"t{i}"}
                    obj = {"id": "cmpl-fake", "object": "text_completion"}
                obj["choices"] = [choice]
                events.append(encode_chunk(b"data: " + json.dumps(obj).encode() + b"\n\n"))
            if self.cached_tokens is not None:
                usage = {"id": "cmpl-fake", "choices": [], "usage": self._usage(self.chunks)}
                events.append(encode_chunk(b"data: " + json.dumps(usage).encode() + b"\n\n"))
            events.append(encode_chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n")
            self._events[key] = events
        return events

    async def _stream(self, client: ClientConnection, path: bytes, head_sent: bool = False) -> None:
        client.begin_response()
        write = client.transport.write  # type: ignore[union-attr]
        events = self._event_chunks(path)
        if not head_sent:
            write(_SSE_HEAD)
        for chunk in events:
            if self.chunk_gap_s:
                await asyncio.sleep(self.chunk_gap_s)
                if client.closed:
                    return
            write(chunk)  # one write per event, like an SSE server
        client.finish()

    def _complete(self, client: ClientConnection, path: bytes) -> None:
        text = "".join(f"t{i}" for i in range(self.chunks))
        if path.endswith(b"chat/completions"):
            choice: dict[str, Any] = {"index": 0, "message": {"role": "assistant", "content": text}}
            obj = "chat.completion"
        else:
            choice = {"index": 0, "text": text}
            obj = "text_completion"
        body: dict[str, Any] = {"id": "fake", "object": obj, "model": "fake", "choices": [choice]}
        body["usage"] = self._usage(self.chunks)
        client.send_json(200, json.dumps(body).encode())

    def _usage(self, completion_tokens: int) -> dict[str, Any]:
        usage: dict[str, Any] = {"prompt_tokens": 300, "completion_tokens": completion_tokens,
                                 "total_tokens": 300 + completion_tokens}  # fmt: skip
        if self.cached_tokens is not None:
            usage["prompt_tokens_details"] = {"cached_tokens": self.cached_tokens}
        return usage

    async def _call_metaserver(
        self, client: ClientConnection, req: Request, url: str, body: dict[str, Any]
    ) -> bool:
        """Report each child request to the proxy's metaserver, as a layerwise decoder does."""
        rid = req.headers.get(b"x-request-id", b"").decode()
        if req.path == b"/v1/responses":
            ids = [str(body.get("request_id"))]
        elif is_chat(GENERATION_PATHS.get(req.path.decode(), "completions"), body):
            ids = [f"chatcmpl-{rid}"]
        else:
            prompt = body.get("prompt")
            many = isinstance(prompt, list) and prompt and not isinstance(prompt[0], int)
            n = len(prompt) if many and isinstance(prompt, list) else 1
            ids = [f"cmpl-{rid}-{i}" for i in range(n)]
        if self.internal_ids:
            ids = [i + "-0a1b2c3d" for i in ids]
        results = await asyncio.gather(*(self._post_meta(url, child) for child in ids))
        self.metaserver_answers.extend(results)
        return all(r == 200 for r in results)

    async def _post_meta(self, url: str, child: str) -> int:
        hostport, _, path = url.removeprefix("http://").partition("/")
        host, _, port = hostport.rpartition(":")
        payload = json.dumps(
            {
                "request_id": child,
                "do_remote_prefill": False,
                "do_remote_decode": True,
                "remote_engine_id": f"fake-{self.port}",
                "remote_host": self.host,
                "remote_port": self.port,
                "remote_tp_size": 1,
                "remote_cached_tokens": 0,
            }
        ).encode()
        reader, writer = await asyncio.open_connection(host.strip("[]"), int(port))
        try:
            writer.write(
                b"POST /%s HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\n"
                b"Content-Length: %d\r\nConnection: close\r\n\r\n%s"
                % (path.encode(), hostport.encode(), len(payload), payload)
            )
            status_line = await reader.readline()
            await reader.read()
            return int(status_line.split()[1])
        finally:
            writer.close()


async def _until_lost(client: ClientConnection) -> None:
    lost = asyncio.Event()
    client.on_lost = lost.set
    if not client.closed:
        await lost.wait()


async def _main(args: argparse.Namespace) -> None:
    backends = []
    for role, port in (("prefill", args.prefill_port), ("decode", args.decode_port)):
        if port is None:
            continue
        fb = StandInBackend(
            role,
            port=port,
            delay_s=args.delay_ms / 1e3,
            chunks=args.chunks,
            chunk_gap_s=args.chunk_gap_ms / 1e3,
            record=False,
        )
        backends.append(await fb.start())
    print(" ".join(f"{b.role}={b.port}" for b in backends), flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    for b in backends:
        await b.stop()


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(
        description="stand-in vLLM prefill/decode backends (fault injection, benchmarks)"
    )
    p.add_argument("--prefill-port", type=int)
    p.add_argument("--decode-port", type=int)
    p.add_argument("--delay-ms", type=float, default=20.0)
    p.add_argument("--chunks", type=int, default=16)
    p.add_argument("--chunk-gap-ms", type=float, default=0.0)
    args = p.parse_args(argv)
    try:
        import uvloop

        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    except ImportError:
        pass
    asyncio.run(_main(args))
    sys.exit(0)


if __name__ == "__main__":
    main()
