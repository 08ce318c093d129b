"""The prompt prefixes a backend was sent, as chained hashes of chunks, in a bounded LRU: an
approximation of what that backend's prefix cache holds.

The proxy does not tokenize. A prompt given as token ids is cut into chunks of token ids; a
prompt given as text (or chat messages) into chunks of CHARS_PER_TOKEN characters a token. The
chunks grow along the prompt: two of `block` tokens, two of twice that, and so on up to
MAX_GROWTH times `block`. The boundaries depend only on the position, so two prompts are cut
alike where they agree; short prompts are matched finely, and a long prompt costs few chunks
(CPU per request: a 1,000-token prompt has 8 chunks with the default block of 32 tokens). A
chunk need not be an engine block: it is the granularity of a match. Chunk i's key hashes
chunk i together with key i-1, so a key stands for the whole prefix up to its chunk, as the
engine's block hashes do: two prompts share the first k keys exactly when they share the
first k chunks (up to 64-bit hash collisions). The keys are Python's `hash()` of tuples:
fast, and never leave the process (so hash randomization does not matter)."""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

CHARS_PER_TOKEN = 4  # what rewrite.estimate_prompt_tokens also assumes
MAX_GROWTH = 8  # the longest chunk, in blocks
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


def chunk_tokens(i: int, block: int) -> int:
    """The size of chunk i in tokens: block, block, 2 block, 2 block, 4 block, ..."""
    return block << min(i // 2, MAX_GROWTH.bit_length() - 1)


def prefix_keys(body: dict[str, Any], block: int) -> tuple[int, ...]:
    """The chained keys of the prompt's whole chunks (a partial last chunk is not cached by
    the engine either)."""
    prompt = prompt_of(body)
    if not prompt:
        return ()
    scale = CHARS_PER_TOKEN if isinstance(prompt, str) else 1
    keys: list[int] = []
    h = _START
    start, i, end = 0, 0, len(prompt)
    while True:
        stop = start + chunk_tokens(i, block) * scale
        if stop > end:
            return tuple(keys)
        chunk = prompt[start:stop]
        h = hash((h, chunk if isinstance(chunk, str) else tuple(chunk)))
        keys.append(h)
        start, i = stop, i + 1


class PrefixIndex:
    """The keys routed to one backend, least recently used first, each with the number of
    requests it was routed with and its chunk's size; at most `capacity` tokens of chunks,
    the oldest evicted first, as the engine evicts its free blocks."""

    __slots__ = ("capacity", "block", "tokens", "_keys")

    def __init__(self, capacity: int, block: int) -> None:
        if capacity < 1 or block < 1:
            raise ValueError(f"capacity and block must be >= 1 token, not {capacity}, {block}")
        self.capacity = capacity
        self.block = block
        self.tokens = 0  # the sizes of the chunks held
        self._keys: OrderedDict[int, tuple[int, int]] = OrderedDict()  # key -> (uses, size)

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
        return self._keys.get(key, (0, 0))[0]

    def insert(self, keys: tuple[int, ...]) -> None:
        """Record a prompt sent to this backend: its chunks become the most recently used.
        A prompt longer than the capacity keeps its last chunks, like the engine whose cache
        it overflows."""
        held = self._keys
        pop = held.pop
        for i, k in enumerate(keys):
            old = pop(k, None)
            if old is None:
                size = chunk_tokens(i, self.block)
                self.tokens += size
                held[k] = (1, size)
            else:
                held[k] = (old[0] + 1, old[1])
        evict = held.popitem
        while self.tokens > self.capacity and held:
            self.tokens -= evict(last=False)[1][1]

    def clear(self) -> None:
        self._keys.clear()
        self.tokens = 0
