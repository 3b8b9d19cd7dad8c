"""The SIMULATED engine's LoRA adapter slots: the adapters it holds loaded, least recently used first, at most as many
as it runs in one step (vLLM's ``max_loras``); a step that runs one it does not hold loads it, the oldest goes."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable


class AdapterSlots:
    """At most ``slots`` adapters held, least recently used first."""

    def __init__(self, slots: int) -> None:
        self.slots = slots
        self._held: OrderedDict[str, None] = OrderedDict()

    def held(self) -> list[str]:
        return list(self._held)

    def load(self, adapters: Iterable[str | None]) -> int:
        """Hold the adapters a step runs (None: the base model), loading those not held; how many were loaded."""
        loads = 0
        for adapter in dict.fromkeys(adapters):
            if adapter is None:
                continue
            if adapter in self._held:
                self._held.move_to_end(adapter)
                continue
            self._held[adapter] = None
            loads += 1
            while len(self._held) > self.slots:
                self._held.popitem(last=False)
        return loads

    def keep(self, adapters: Iterable[str]) -> None:
        """Forget every held adapter not among ``adapters`` (no longer served)."""
        kept = set(adapters)
        for gone in [name for name in self._held if name not in kept]:
            del self._held[gone]
