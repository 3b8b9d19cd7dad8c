"""What a router sent each replica since that replica's latest report: the optimistic accounting between reports
that :class:`~serve_app.serving.routing.TokenLoadRouter` adds to each reported token load."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ray.serve.request_router import ReplicaID


@dataclass(eq=False)  # identity: two requests may look alike
class Routed:
    """A request this router sent (or is about to send) to a replica: its cost and since when."""

    internal_id: str
    cost: float
    replica_id: ReplicaID
    at: float
    routed: bool = False  # the replica took it (on_request_routed); else only chosen so far


class Books:
    """The requests this router sent one replica that its latest report (measured at ``at``) does not count yet,
    their tokens (``delta``) and how many they are (``requests``), both kept as requests come and go. A report
    counts a request routed ``settle_s`` before it was measured; a request that completes leaves at once. (One
    that completes after a report counted it is not taken off until the next report: a report counts a batch's
    prompts only while they run, so its full cost would be too much.)"""

    def __init__(self, settle_s: float) -> None:
        self.settle_s = settle_s
        self.stamp = self.at = -math.inf
        self.delta = 0.0
        self.requests = 0
        self.fresh: dict[str, list[Routed]] = {}  # by internal request id (dependent calls may share one)

    def report(self, stamp: float, now: float) -> None:
        """A new report (its ``at``, seen ``now``): forget what it counts (once per report, over the requests sent
        since the last). It was measured before it was seen, whatever the replica's clock says."""
        if stamp == self.stamp:
            return
        self.stamp, self.at = stamp, min(stamp, now)
        cutoff = self.at - self.settle_s
        for internal_id, entries in list(self.fresh.items()):
            kept = [r for r in entries if r.at > cutoff]
            if kept:
                self.fresh[internal_id] = kept
            else:
                del self.fresh[internal_id]
        self.delta = sum(r.cost for entries in self.fresh.values() for r in entries)
        self.requests = sum(len(entries) for entries in self.fresh.values())

    def add(self, routed: Routed) -> None:
        if routed.at > self.at - self.settle_s:
            self.fresh.setdefault(routed.internal_id, []).append(routed)
            self.delta += routed.cost
            self.requests += 1

    def remove(self, routed: Routed) -> bool:
        entries = self.fresh.get(routed.internal_id, [])
        for index, other in enumerate(entries):
            if other is routed:
                del entries[index]
                if not entries:
                    del self.fresh[routed.internal_id]
                self.delta -= routed.cost
                self.requests -= 1
                return True
        return False

    def complete(self, internal_id: str) -> None:
        entries = self.fresh.get(internal_id)
        if entries:
            self.remove(next((r for r in entries if r.routed), entries[0]))
