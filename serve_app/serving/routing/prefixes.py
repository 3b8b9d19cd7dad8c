"""Which replica most likely holds a request's prompt prefix in its KV cache, for the token router's prefix score.

Why: vLLM's prefix cache skips the prefill of the leading blocks of a prompt it has seen, but only on the replica that
saw it. Requests that share a long prefix (a system prompt, a few-shot block, an agent's growing conversation) are
served sooner where that prefix was sent before.

How: an approximate index of what this router sent where. A prompt is read as text (the router never tokenizes) and
cut into blocks of ``block_chars`` characters; a block's key hashes it with every block before it (vLLM keys its KV
blocks the same way, by token ids), so two prompts share a key only where they share everything up to it. Each
replica keeps the keys it was sent in least-recently-used order, at most ``capacity_blocks`` of them (about what its
KV cache holds: vLLM evicts its least recently used blocks too), fewer where the replica reports a smaller prefix cache
(:data:`PREFIX_CACHE_TOKENS`; none where it has no prefix cache); a replica that leaves is forgotten.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable, Iterable
from typing import Any

from .request_cost import CHARS_PER_TOKEN

PREFIX_CACHE_TOKENS = "prefix_cache_tokens"
"""A replica's report: the tokens its engine's prefix cache holds at most (its KV cache), 0 where it has none."""


def prompt_text(prompt: Any) -> str | None:
    """A prompt as the text its prefix is read from: a string as is, token ids as their numbers, chat messages as each
    message's role and text in turn; ``None`` for anything else."""
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, (list, tuple)):
        if all(isinstance(item, int) for item in prompt):
            return " ".join(map(str, prompt))
        parts = [_message_text(item) for item in prompt]
        return None if any(p is None for p in parts) else "".join(parts)  # type: ignore[arg-type]
    return None


def _message_text(message: Any) -> str | None:
    if not isinstance(message, dict):
        return None
    content = message.get("content")
    if isinstance(content, list):  # content parts: their text, in order
        content = "".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
    return f"<{message.get('role', '')}>{content or ''}\n"


class PrefixIndex:
    """The prompt blocks sent to each replica, by key, least recently used first."""

    def __init__(self, block_chars: int = 64, capacity_blocks: int = 65_536, max_blocks: int = 2_048) -> None:
        if block_chars < 1 or capacity_blocks < 1 or max_blocks < 1:
            raise ValueError(
                f"PrefixIndex: bad settings block_chars={block_chars} capacity_blocks={capacity_blocks} "
                f"max_blocks={max_blocks}"
            )
        self.block_chars = block_chars
        self.capacity_blocks = capacity_blocks
        self.max_blocks = max_blocks  # a longer prompt is keyed by its first blocks only
        self._blocks: dict[Hashable, OrderedDict[int, None]] = {}

    @property
    def block_tokens(self) -> float:
        """Tokens a block holds, estimated as the router estimates a prompt's."""
        return self.block_chars / CHARS_PER_TOKEN

    def keys(self, text: str, salt: str | None = None) -> list[int]:
        """The keys of ``text``'s whole blocks (a partial last block is not cached by vLLM either), under its
        prefix-cache ``salt`` (vLLM's ``cache_salt``: differently salted prompts share no cached block)."""
        keys: list[int] = []
        key = 0 if salt is None else hash(salt)
        for start in range(0, min(len(text), self.block_chars * self.max_blocks), self.block_chars):
            block = text[start : start + self.block_chars]
            if len(block) < self.block_chars:
                break
            key = hash((key, block))
            keys.append(key)
        return keys

    def matched(self, replica: Hashable, keys: list[int]) -> int:
        """How many of ``keys``' leading blocks ``replica`` was sent (and has not evicted since)."""
        held = self._blocks.get(replica)
        if not held:
            return 0
        count = 0
        for key in keys:
            if key not in held:
                break
            count += 1
        return count

    def record(self, replica: Hashable, keys: list[int], cache_tokens: float | None = None) -> None:
        """``replica`` was sent a prompt of ``keys``: they are its most recently used, the oldest beyond its capacity
        go (``capacity_blocks``, or what ``cache_tokens``, the prefix cache it reports, holds where that is less), a
        prompt's tail before its head, as vLLM evicts them."""
        capacity = self.capacity_blocks
        if cache_tokens is not None:
            capacity = min(capacity, int(cache_tokens / self.block_tokens))
        if capacity < 1:
            self._blocks.pop(replica, None)
            return
        if not keys:
            return
        held = self._blocks.setdefault(replica, OrderedDict())
        for key in reversed(keys):
            held[key] = None
            held.move_to_end(key)
        while len(held) > capacity:
            held.popitem(last=False)

    def replicas(self) -> set[Hashable]:
        return set(self._blocks)

    def forget(self, replicas: Iterable[Hashable]) -> None:
        for replica in replicas:
            self._blocks.pop(replica, None)
