"""At most ``max_groups`` distinct groups of records in flight at once (an engine's LoRA adapters, of which vLLM runs
``max_loras`` in a step): which group may start now, and which group drains for a record whose group must wait."""

from __future__ import annotations

from collections.abc import Hashable, Iterable

from .tickets import Ticket

__all__ = ["GroupLimit"]


class GroupLimit:
    """The groups in flight and the drain under way, for :class:`~batching.scheduling.RecordScheduler`."""

    __slots__ = ("counts", "draining", "most", "on_deck")

    def __init__(self, most: int | None, on_deck: bool) -> None:
        self.most = most  # None: no limit
        self.on_deck = on_deck  # the group one drains for may enter before that one has left
        self.counts: dict[Hashable, int] = {}  # records in flight by group
        self.draining: tuple[Hashable, Hashable] | None = None  # (the group draining, the one it drains for)

    def fits(self, group: Hashable) -> bool:
        """Whether a record of ``group`` may start now: it has none; or its group is not draining, and it is in
        flight already, fewer than ``most`` groups are, or (``on_deck``) it is the group one drains for."""
        if group is None or self.most is None:
            return True
        drain = self.draining
        if drain is not None and group == drain[0]:
            return False
        return group in self.counts or len(self.counts) < self.most or (drain is not None and group == drain[1])

    def start_drain(self, waiting: Hashable, running: Iterable[Ticket]) -> None:
        """For ``waiting``, a group that must wait for another to leave and has waited long enough: the group in
        flight that leaves soonest takes no more until it has left (one drain at a time). Soonest: its longest
        record may still add the fewest tokens (``growth`` less what it produced); ties, the fewest records."""
        if self.draining is not None:
            return
        left: dict[Hashable, int] = {}
        for ticket in running:
            if ticket.group is not None:
                left[ticket.group] = max(left.get(ticket.group, 0), ticket.held()[1])
        counts = self.counts  # full here: never empty
        leaving = min(counts, key=lambda group: (left.get(group, 0), counts[group]))
        self.draining = (leaving, waiting if self.on_deck else None)

    def enter(self, group: Hashable) -> None:
        if group is not None:
            self.counts[group] = self.counts.get(group, 0) + 1

    def leave(self, group: Hashable) -> None:
        """A record of ``group`` left; the last one ends a drain of its group."""
        if group is None:
            return
        left = self.counts[group] - 1
        if left:
            self.counts[group] = left
            return
        del self.counts[group]
        if self.draining is not None and group == self.draining[0]:
            self.draining = None
