"""The SIMULATED engine's prefix cache: the KV blocks of the prompts it has run, keyed as vLLM keys them, so that a
prompt whose leading blocks it still holds skips their prefill (and a router that keeps a prompt's requests together
shows in the engine's time)."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

BLOCK_TOKENS = 16
"""Tokens a KV block holds: vLLM's block size on a GPU."""


class PrefixCache:
    """Full blocks of prompt tokens, each keyed by a hash of itself and every block before it (vLLM's block hash), the
    least recently used first; once they hold more than ``capacity_tokens`` the oldest go. An approximation of vLLM's:
    the blocks of running requests are not kept apart from the free ones."""

    def __init__(self, capacity_tokens: int, block_tokens: int = BLOCK_TOKENS) -> None:
        self.block_tokens = block_tokens
        self.capacity = max(1, capacity_tokens // block_tokens)
        self._blocks: OrderedDict[int, None] = OrderedDict()

    def keys(self, token_ids: Sequence[int]) -> list[int]:
        """The chained keys of the full blocks of ``token_ids``."""
        keys, parent, size = [], 0, self.block_tokens
        for start in range(0, len(token_ids) - size + 1, size):
            parent = hash((parent, tuple(token_ids[start : start + size])))
            keys.append(parent)
        return keys

    def admit(self, token_ids: Sequence[int]) -> int:
        """A prompt entering the engine: how many of its tokens the cache holds (its leading blocks found, short of
        its last token, which vLLM always computes); then all its blocks are held, the most recently used, its tail
        to go first (vLLM frees a request's blocks in reverse, so that a shared head outlives the tails)."""
        keys, hit = self.keys(token_ids), 0
        for key in keys[: max(len(token_ids) - 1, 0) // self.block_tokens]:  # the blocks before its last token
            if key not in self._blocks:
                break
            hit += 1
        for key in reversed(keys):
            self._blocks[key] = None
            self._blocks.move_to_end(key)
        while len(self._blocks) > self.capacity:
            self._blocks.popitem(last=False)
        return hit * self.block_tokens
