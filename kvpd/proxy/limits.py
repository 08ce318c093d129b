"""Requests the decoder will refuse, known before any prefill.

A request invalid only in its output limit (`max_tokens: "ten"`, a negative one, or one no
prompt leaves room for: at least the model's max_model_len) would otherwise cost a full
prefill (which runs with a limit of 1) before the decoder answers 400. Such a request goes
straight to a decoder instead, without a prefill: vLLM validates it before any work, so the
client gets the engine's own 400, exactly as from a direct call; if the decoder accepts it
after all, it is served there, just not disaggregated.

max_model_len comes from the engines: a decoder's `GET /v1/models` (vLLM reports it per
served model), fetched in the background until one answers and refreshed now and then; until
then nothing is decided by length."""

from __future__ import annotations

import asyncio
import json
import logging
import re
from typing import TYPE_CHECKING, Any

from kvpd.proxy.apis import LIMIT_FIELDS, GenerationRoute
from kvpd.proxy.hostpool import fetch
from kvpd.proxy.upstream import UpstreamError

if TYPE_CHECKING:
    from kvpd.proxy.backends import BackendPool

log = logging.getLogger("kvpd.proxy")

REFRESH_S = 60.0
RETRY_S = 2.0
_INT_TEXT = re.compile(r"\s*[-+]?\d+\s*")  # what pydantic's lax mode reads as an int


class ModelLimits:
    def __init__(self, pools: list[BackendPool], auth_header: bytes) -> None:
        self.pools = pools
        self.auth_header = auth_header
        self.max_model_len: dict[str, int] = {}  # served model id -> its context length

    async def run(self) -> None:
        while True:
            got = await self.refresh()
            await asyncio.sleep(REFRESH_S if got else RETRY_S)

    async def refresh(self) -> bool:
        for pool in self.pools:
            for backend in pool.backends:
                if not backend.usable:
                    continue
                try:
                    # on a connection of its own, closed after: one fetch a minute
                    # must not hold an idle connection besides the pool's
                    resp = await fetch(backend.pool, b"GET", b"/v1/models", b"", 5.0,
                                       b"Connection: close\r\n" + self.auth_header)  # fmt: skip
                except UpstreamError:
                    continue
                found = _model_lengths(resp.body) if resp.status == 200 else None
                if found:
                    self.max_model_len = found
                    return True
        return False

    def refused(self, body: dict[str, Any], route: GenerationRoute) -> bool:
        """Whether the engines will surely refuse this request for its output limit."""
        for name in LIMIT_FIELDS[route]:
            value = body.get(name)
            if value is None:
                continue
            if isinstance(value, str):
                if _INT_TEXT.fullmatch(value) is None:
                    return True  # not a number at all ("ten")
                continue
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                if isinstance(value, (list, dict)):
                    return True
                continue
            if value < 0:
                return True
            limit = self._limit(body.get("model"))
            if limit and value >= limit:
                return True  # the prompt has at least one token: no room
        return False

    def _limit(self, model: object) -> int:
        lengths = self.max_model_len
        if isinstance(model, str) and model in lengths:
            return lengths[model]
        if len(lengths) == 1 and model is None:
            return next(iter(lengths.values()))
        return 0


def _model_lengths(raw: bytes) -> dict[str, int]:
    """{model id: max_model_len} from a /v1/models answer (checked: engines are trusted for
    their answers, not for their shape)."""
    try:
        doc = json.loads(raw)
    except (ValueError, RecursionError):
        return {}
    data = doc.get("data") if isinstance(doc, dict) else None
    out: dict[str, int] = {}
    for card in data if isinstance(data, list) else ():
        if not isinstance(card, dict):
            continue
        mid, n = card.get("id"), card.get("max_model_len")
        if isinstance(mid, str) and isinstance(n, int) and not isinstance(n, bool) and n > 0:
            out[mid] = n
    return out
