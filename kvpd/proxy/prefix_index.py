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
fast, and never leave the process (so hash randomization does not matter).

This runs for every request the proxy routes by cache, so it is written for CPU: the chunk
boundaries and sizes are computed once per block size, and the index keeps one int per key
(the uses and the chunk's size packed together) in an OrderedDict, which moves and evicts in
C."""

from __future__ import annotations

from collections import OrderedDict
from functools import lru_cache
from typing import Any

CHARS_PER_TOKEN = 4  # what rewrite.estimate_prompt_tokens also assumes
MAX_GROWTH = 8  # the longest chunk, in blocks
_START = hash("kvpd-prefix")  # the key before the first chunk
# Between chat messages: the role and content of each message are hashed, in order.
_ROLE_END, _MESSAGE_END = "\x1f", "\x1e"
# An index value: uses << _USES_SHIFT | the chunk's size in tokens (sizes stay below 2**32).
_USES_SHIFT = 32
_ONE_USE = 1 << _USES_SHIFT
_SIZE_MASK = _ONE_USE - 1


def _parts_text(content: Any, parts: list[str]) -> None:
    """A content field as text: a string, or the `text` of each part of a list (OpenAI's and
    Anthropic's content parts, the Responses API's input_text items)."""
    if isinstance(content, str):
        parts.append(content)
    elif isinstance(content, list):
        parts += (str(p.get("text", "")) for p in content if isinstance(p, dict))


def _messages_text(messages: list[Any], parts: list[str]) -> None:
    for m in messages:
        if isinstance(m, str):
            parts += (m, _MESSAGE_END)
        elif isinstance(m, dict):
            parts += (str(m.get("role", "")), _ROLE_END)
            _parts_text(m.get("content"), parts)
            parts.append(_MESSAGE_END)


def _chat_text(body: dict[str, Any]) -> str | None:
    """The text an engine's chat template starts from: Anthropic's `system` first (it comes
    before every message, so it is the prefix requests share), then the messages, or the
    Responses API's `input` (a string or a list of messages)."""
    messages = body.get("messages")
    if messages is None:
        messages = body.get("input")
        if isinstance(messages, str):
            return messages
    if not isinstance(messages, list):
        return None
    parts: list[str] = []
    system = body.get("system")
    if system is not None:
        parts.append("system" + _ROLE_END)
        _parts_text(system, parts)
        parts.append(_MESSAGE_END)
    _messages_text(messages, parts)
    return "".join(parts)


def prompt_of(body: dict[str, Any]) -> str | list[int] | None:
    """The part of a request body that the engine's prefix cache sees: the text of the prompt
    (the first one of a batch), the chat messages as one text, or token ids. None: nothing
    to index (a body of another shape)."""
    prompt = body.get("prompt")
    if prompt is None:
        return _chat_text(body)
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


# Chunks before the growth stops: 1, 1, 2, 2, 4, 4 blocks (then MAX_GROWTH blocks each).
_HEAD = 2 * (MAX_GROWTH.bit_length() - 1)


@lru_cache(maxsize=16)
def _head_ends(unit: int) -> tuple[int, ...]:
    """Where the first _HEAD chunks end, in prompt items (characters or ids), for chunks of
    `unit` items a block."""
    ends, end = [], 0
    for i in range(_HEAD):
        end += chunk_tokens(i, unit)
        ends.append(end)
    return tuple(ends)


@lru_cache(maxsize=16)
def chunk_sizes(block: int, n: int = 64) -> tuple[int, ...]:
    """The sizes in tokens of the first `n` chunks (the index's sizes of a prompt's keys)."""
    return tuple(chunk_tokens(i, block) for i in range(n))


def _chain(prompt: str | tuple[int, ...], unit: int) -> tuple[int, ...]:
    """The chained keys of the whole chunks of a prompt of `unit` items a block."""
    n = len(prompt)
    h, start = _START, 0
    keys: list[int] = []
    append = keys.append
    for stop in _head_ends(unit):
        if stop > n:
            return tuple(keys)
        h = hash((h, prompt[start:stop]))
        append(h)
        start = stop
    for stop in range(start + unit * MAX_GROWTH, n + 1, unit * MAX_GROWTH):
        h = hash((h, prompt[start:stop]))
        append(h)
        start = stop
    return tuple(keys)


def prefix_keys(body: dict[str, Any], block: int) -> tuple[int, ...]:
    """The chained keys of the prompt's whole chunks (a partial last chunk is not cached by
    the engine either)."""
    prompt = prompt_of(body)
    if not prompt:
        return ()
    if isinstance(prompt, str):
        return _chain(prompt, block * CHARS_PER_TOKEN)
    return _chain(tuple(prompt), block)


class PrefixIndex:
    """The keys routed to one backend, least recently used first, each with the number of
    requests it was routed with and its chunk's size; at most `capacity` tokens of chunks,
    the oldest evicted first, as the engine evicts its free blocks."""

    __slots__ = ("capacity", "block", "tokens", "downs", "_keys", "_sizes")

    def __init__(self, capacity: int, block: int) -> None:
        if capacity < 1 or block < 1:
            raise ValueError(f"capacity and block must be >= 1 token, not {capacity}, {block}")
        self.capacity = capacity
        self.block = block
        self.tokens = 0  # the sizes of the chunks held
        self.downs = 0  # the backend's times found down when this index was last emptied
        self._keys: OrderedDict[int, int] = OrderedDict()  # key -> uses << 32 | size
        self._sizes = chunk_sizes(block)

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
        return self._keys.get(key, 0) >> _USES_SHIFT

    def insert(self, keys: tuple[int, ...]) -> None:
        """Record a prompt sent to this backend: its chunks become the most recently used,
        the last chunk first, so a prefix is always newer than its continuations and the
        longest continuations are evicted first (as vLLM frees a request's blocks, tail
        first). So a key is held only while its parent is: past the first key not held, none
        is, and those are added without looking them up. A prompt longer than the capacity
        keeps its first chunks."""
        held = self._keys
        m = self.match(keys)
        sizes = self._sizes
        if len(keys) > len(sizes):  # beyond the first 64 chunks every chunk is the longest
            sizes += (sizes[-1],) * (len(keys) - len(sizes))
        before = len(held)
        added = 0
        for i in range(len(keys) - 1, m - 1, -1):
            size = sizes[i]
            held[keys[i]] = _ONE_USE | size
            added += size
        if len(held) - before != len(keys) - m:  # a 64-bit collision: count again
            added = sum(v & _SIZE_MASK for v in held.values()) - self.tokens
        pop = held.pop
        for i in range(m - 1, -1, -1):
            k = keys[i]
            held[k] = pop(k) + _ONE_USE
        tokens = self.tokens + added
        if tokens > self.capacity:
            evict = held.popitem
            while tokens > self.capacity and held:
                tokens -= evict(last=False)[1] & _SIZE_MASK
        self.tokens = tokens

    def resize(self, capacity: int) -> None:
        """Hold at most `capacity` tokens from now on (the oldest chunks go at once)."""
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1 token, not {capacity}")
        self.capacity = capacity
        held = self._keys
        tokens = self.tokens
        while tokens > capacity and held:
            tokens -= held.popitem(last=False)[1] & _SIZE_MASK
        self.tokens = tokens

    def clear(self) -> None:
        self._keys.clear()
        self.tokens = 0
