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

from bisect import bisect_right
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from functools import lru_cache
from typing import Any, overload

CHARS_PER_TOKEN = 4  # what rewrite.estimate_prompt_tokens also assumes
MAX_GROWTH = 8  # the longest chunk, in blocks
GROW = 2  # chunks a prompt is indexed beyond what its backend already held
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


@lru_cache(maxsize=64)
def chunk_sizes(block: int, n: int = _HEAD + 1) -> tuple[int, ...]:
    """The sizes in tokens of the first `n` chunks."""
    return tuple(chunk_tokens(i, block) for i in range(n))


def tokens_upto(i: int, block: int) -> int:
    """Tokens of the first i chunks."""
    if i <= 0:
        return 0
    head = _head_ends(block)
    if i <= len(head):
        return head[i - 1]
    return head[-1] + (i - len(head)) * block * MAX_GROWTH


def _whole_chunks(n: int, unit: int) -> int:
    """How many whole chunks a prompt of `n` items has."""
    head = _head_ends(unit)
    if n < head[-1]:
        return bisect_right(head, n)
    return len(head) + (n - head[-1]) // (unit * MAX_GROWTH)


class PromptKeys(Sequence[int]):
    """The chained keys of a prompt's whole chunks, each hashed only when first read: a
    prompt is matched only as deep as some backend holds it, and indexed at most GROW chunks
    deeper, so a prompt no backend has seen costs GROW hashes, whatever its length."""

    __slots__ = ("_prompt", "_unit", "_n", "_keys", "_start")

    def __init__(self, prompt: str | tuple[int, ...], unit: int) -> None:
        self._prompt = prompt
        self._unit = unit
        self._n = _whole_chunks(len(prompt), unit)
        self._keys: list[int] = []
        self._start = 0  # where the next chunk to hash starts

    def __len__(self) -> int:
        return self._n

    def _extend(self, count: int) -> list[int]:
        """The first `count` keys (at most all), hashing those not hashed yet."""
        keys = self._keys
        if len(keys) >= count:
            return keys
        prompt, unit, start = self._prompt, self._unit, self._start
        head = _head_ends(unit)
        h = keys[-1] if keys else _START
        for i in range(len(keys), min(count, self._n)):
            stop = head[i] if i < len(head) else start + unit * MAX_GROWTH
            h = hash((h, prompt[start:stop]))
            keys.append(h)
            start = stop
        self._start = start
        return keys

    @overload
    def __getitem__(self, i: int) -> int: ...
    @overload
    def __getitem__(self, i: slice) -> list[int]: ...
    def __getitem__(self, i: int | slice) -> int | list[int]:
        if isinstance(i, slice):
            return self._extend(self._n)[i]
        if i < 0:
            i += self._n
        if not 0 <= i < self._n:
            raise IndexError(i)
        return self._extend(i + 1)[i]

    def __iter__(self) -> Iterator[int]:
        i = 0
        while i < self._n:
            keys = self._extend(i + 1)
            yield keys[i]
            i += 1

    def held_in(self, held: dict[int, int]) -> int:
        """How many leading keys `held` has, hashing only up to the first it lacks."""
        keys, n = self._keys, self._n
        i = 0
        while i < n:
            if i == len(keys):
                self._extend(i + 1)
            if keys[i] not in held:
                return i
            i += 1
        return n

    def first(self, count: int) -> list[int]:
        """The first `count` keys (fewer if the prompt has fewer)."""
        return self._extend(count)[:count]


NO_KEYS = PromptKeys((), 1)


def prefix_keys(body: dict[str, Any], block: int) -> PromptKeys:
    """The chained keys of the prompt's whole chunks (a partial last chunk is not cached by
    the engine either), hashed as they are read."""
    prompt = prompt_of(body)
    if not prompt:
        return NO_KEYS
    if isinstance(prompt, str):
        return PromptKeys(prompt, block * CHARS_PER_TOKEN)
    return PromptKeys(tuple(prompt), block)


class PrefixIndex:
    """The keys routed to one backend, least recently used first, each with the number of
    requests it was routed with and its chunk's size; at most `capacity` tokens of chunks,
    the oldest evicted first, as the engine evicts its free blocks."""

    __slots__ = ("capacity", "block", "tokens", "downs", "_keys", "_sizes", "_ends", "_longest")

    def __init__(self, capacity: int, block: int) -> None:
        if capacity < 1 or block < 1:
            raise ValueError(f"capacity and block must be >= 1 token, not {capacity}, {block}")
        self.capacity = capacity
        self.block = block
        self.tokens = 0  # the sizes of the chunks held
        self.downs = 0  # the backend's times found down when this index was last emptied
        self._keys: OrderedDict[int, int] = OrderedDict()  # key -> uses << 32 | size
        self._sizes = chunk_sizes(block)  # beyond them every chunk is as long as the last
        self._ends = _head_ends(block)
        self._longest = block * MAX_GROWTH

    def __len__(self) -> int:
        return len(self._keys)

    def match(self, keys: Sequence[int]) -> int:
        """How many leading chunks of the prompt this backend was sent."""
        held = self._keys
        if isinstance(keys, PromptKeys):
            return keys.held_in(held)
        n = 0
        for k in keys:
            if k not in held:
                break
            n += 1
        return n

    def uses(self, key: int) -> int:
        """How many requests with this prefix were routed here (0: none remembered)."""
        return self._keys.get(key, 0) >> _USES_SHIFT

    def insert(self, keys: Sequence[int], held_len: int | None = None) -> None:
        """Record a prompt sent to this backend, GROW chunks deeper than it already held; the
        deepest chunk indexed stands for the rest of the prompt too (its size includes the
        tokens of the chunks after it, which the engine now holds), so the index counts what
        the engine's cache holds while hashing little. The chunks become the most recently
        used, the deepest first, so a prefix is always newer than its continuations and the
        longest continuations are evicted first (as vLLM frees a request's blocks, tail
        first): a key is held only while its parent is, so past the first key not held none
        is, and those are added without looking them up. A prompt longer than the capacity
        keeps its first chunks. `held_len`: what match(keys) just answered, if known."""
        held = self._keys
        m = self.match(keys) if held_len is None else held_len
        n = len(keys)
        upto = min(n, m + GROW)
        got = keys._extend(upto) if isinstance(keys, PromptKeys) else keys[:upto]  # no copy
        sizes = self._sizes
        last = len(sizes) - 1
        before = len(held)
        if upto > m:
            rest = self._upto(n)
            tail = rest - self._upto(upto)  # carried by the deepest chunk indexed
            for i in range(upto - 1, m - 1, -1):
                held[got[i]] = _ONE_USE | (sizes[i if i < last else last] + tail)
                tail = 0
            added = rest - self._upto(m)
        else:
            added = 0
        if len(held) - before != upto - m:  # a 64-bit collision: count again
            added = sum(v & _SIZE_MASK for v in held.values()) - self.tokens
        pop = held.pop
        for i in range(m - 1, -1, -1):
            k = got[i]
            v = pop(k)
            own = sizes[i if i < last else last]
            if v & _SIZE_MASK != own:  # it stood for a tail: now its chunk only
                added += own - (v & _SIZE_MASK)
                v = (v & ~_SIZE_MASK) | own
            held[k] = v + _ONE_USE
        tokens = self.tokens + added
        if tokens > self.capacity:
            evict = held.popitem
            while tokens > self.capacity and held:
                tokens -= evict(last=False)[1] & _SIZE_MASK
        self.tokens = tokens

    def _upto(self, i: int) -> int:
        """Tokens of the first i chunks."""
        ends = self._ends
        if i <= len(ends):
            return ends[i - 1] if i > 0 else 0
        return ends[-1] + (i - len(ends)) * self._longest

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
