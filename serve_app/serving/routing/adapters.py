"""The token router's adapter score: which LoRA adapters each replica most likely holds loaded, from its latest
report (its engine's own list, :data:`ADAPTERS`, and how many it holds at most, :data:`ADAPTER_SLOTS`) and what this
router sent it since (an engine loads an adapter with its first request). A replica that would have to load the
request's adapter is charged what a load costs, and that again where its slots are full (the load evicts one another
request will have to load again)."""

from __future__ import annotations

from collections.abc import Hashable, Iterable
from typing import Any

ADAPTERS = "adapters"
"""The key of a replica's routing report that lists the adapters its engine holds."""
ADAPTER_SLOTS = "adapter_slots"
"""The key of a replica's routing report that says how many adapters its engine holds at most."""


class AdapterIndex:
    """The adapters this router sent each replica, and when, to tell which replicas hold a request's adapter before
    their reports say so. ``settle_s``: how long after a request was sent its replica's report may still miss it."""

    def __init__(self, settle_s: float) -> None:
        self.settle_s = settle_s
        self._sent: dict[Hashable, dict[str, float]] = {}

    def sent(self, replica: Hashable, adapter: str, now: float) -> None:
        self._sent.setdefault(replica, {})[adapter] = now

    def held(self, replica: Hashable, report: dict[str, Any]) -> set[str]:
        """The adapters ``replica`` most likely holds: those its ``report`` lists, and those sent there after the
        report was measured."""
        listed = report.get(ADAPTERS)
        held = set(listed) if isinstance(listed, (list, tuple)) else set()
        at = report.get("at")
        for adapter, when in self._sent.get(replica, {}).items():
            if not isinstance(at, (int, float)) or when > at - self.settle_s:
                held.add(adapter)
        return held

    def charges(self, replicas: dict[Hashable, dict[str, Any]], adapter: str, weight: float) -> dict[Hashable, float]:
        """The tokens each replica (its id -> its report) is charged for ``adapter``: none where it holds it,
        ``weight`` where it would load it, twice that where its slots are full (a load there evicts another)."""
        out = {}
        for replica, report in replicas.items():
            held = self.held(replica, report)
            slots = report.get(ADAPTER_SLOTS)
            full = isinstance(slots, int) and 0 < slots <= len(held)
            out[replica] = 0.0 if adapter in held else weight * (2 if full else 1)
        return out

    def replicas(self) -> set[Hashable]:
        return set(self._sent)

    def forget(self, replicas: Iterable[Hashable]) -> None:
        for replica in replicas:
            self._sent.pop(replica, None)
