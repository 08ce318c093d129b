"""The prompt prefixes a backend was sent, as chained hashes of fixed-size chunks, in a bounded
LRU: an approximation of what that backend's prefix cache holds.

The proxy does not tokenize. A prompt given as token ids is cut into chunks of `block` ids; a
prompt given as text (or chat messages) into chunks of `block * CHARS_PER_TOKEN` characters,
about `block` tokens of text. A chunk need not be an engine block: it is the granularity of a
match, and coarser chunks cost less CPU: the default, 128 tokens (vLLM-Ascend's block size),
takes about 2 us for the keys of a 1,000-token prompt. Chunk i's
key hashes chunk i together with key i-1, so a key stands for the whole prefix up to its chunk,
as the engine's block hashes do: two prompts share the first k keys exactly when they share
the first k chunks (up to 64-bit hash collisions). The keys are Python's `hash()` of tuples:
fast, and never leave the process (so hash randomization does not matter)."""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

CHARS_PER_TOKEN = 4  # what rewrite.estimate_prompt_tokens also assumes
_START = hash("kvpd-prefix")  # the key before the first chunk
# Between chat messages: the role and content of each message are hashed, in order.
_ROLE_END, _MESSAGE_END = "\x1f", "\x1e"


def prompt_of(body: dict[str, Any]) -> str | list[int] | None:
    """The part of a request body that the engine's prefix cache sees: the text of the prompt
    (the first one of a batch), the chat messages as one text, or token ids. None: nothing
    to index (a body of another shape)."""
    prompt = body.get("prompt")
    if prompt is None:
        messages = body.get("messages")
        if not isinstance(messages, list):
            return None
        parts: list[str] = []
        for m in messages:
            if not isinstance(m, dict):
                continue
            parts += (str(m.get("role", "")), _ROLE_END)
            content = m.get("content")
            if isinstance(content, str):
                parts.append(content)
            elif isinstance(content, list):
                parts += (str(p.get("text", "")) for p in content if isinstance(p, dict))
            parts.append(_MESSAGE_END)
        return "".join(parts)
    if isinstance(prompt, list) and prompt:
        prompt = prompt[0] if not isinstance(prompt[0], int) else prompt
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list) and all(isinstance(t, int) for t in prompt):
        return prompt
    return None


def prefix_keys(body: dict[str, Any], block: int) -> tuple[int, ...]:
    """The chained keys of the prompt's whole chunks (a partial last chunk is not cached by
    the engine either)."""
    prompt = prompt_of(body)
    if not prompt:
        return ()
    chunks: list[str] | list[tuple[int, ...]]
    if isinstance(prompt, str):
        size = block * CHARS_PER_TOKEN
        chunks = [prompt[i : i + size] for i in range(0, len(prompt) - size + 1, size)]
    else:
        chunks = [tuple(prompt[i : i + block]) for i in range(0, len(prompt) - block + 1, block)]
    keys: list[int] = []
    append = keys.append
    h = _START
    for chunk in chunks:
        h = hash((h, chunk))
        append(h)
    return tuple(keys)


class PrefixIndex:
    """The keys routed to one backend, least recently used first, each with the number of
    requests it was routed with; at most `capacity` keys (chunks), the oldest evicted first,
    as the engine evicts its free blocks."""

    __slots__ = ("capacity", "_keys")

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1 chunk, not {capacity}")
        self.capacity = capacity
        self._keys: OrderedDict[int, int] = OrderedDict()

    def __len__(self) -> int:
        return len(self._keys)

    def match(self, keys: tuple[int, ...]) -> int:
        """How many leading chunks of the prompt this backend was sent."""
        held = self._keys
        n = 0
        for k in keys:
            if k not in held:
                break
            n += 1
        return n

    def uses(self, key: int) -> int:
        """How many requests with this prefix were routed here (0: none remembered)."""
        return self._keys.get(key, 0)

    def insert(self, keys: tuple[int, ...]) -> None:
        """Record a prompt sent to this backend: its chunks become the most recently used.
        A prompt longer than the capacity keeps its last `capacity` chunks, like the engine
        whose cache it overflows."""
        held = self._keys
        pop = held.pop
        for k in keys:
            held[k] = pop(k, 0) + 1
        evict = held.popitem
        for _ in range(len(held) - self.capacity):
            evict(last=False)

    def clear(self) -> None:
        self._keys.clear()
