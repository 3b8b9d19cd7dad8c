"""What a router sent each replica, and what of it ended, since that replica's latest report: the optimistic
accounting between reports that :class:`~serve_app.serving.routing.TokenLoadRouter` applies to each reported
token load."""

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
    """What one replica's latest report (measured at ``at``) does not show yet: the requests this router sent it
    since (``fresh``: their tokens ``delta``, how many ``requests``) and those the report counts that have ended
    since (``gone``: their tokens ``gone_tokens``). Held tokens = ``max(0, report - gone_tokens) + delta``.

    A report counts a request routed ``settle_s`` before it was measured; until then the request is fresh. One
    that ends while fresh leaves at once; one that ends after a report counted it comes off that report until a
    report measured after its end arrives. Without that, a replica that just finished a large batch looks as
    full as before for as long as its report takes to reach the router (1-2 s through Serve's controller), and
    the next batch goes to one that is still busy. A multi-prompt call's prompts may end one by one, and a
    report counts only those still running, so a call's full cost can take off more than the report counted:
    until the next report the replica looks emptier than it is (never below zero)."""

    def __init__(self, settle_s: float) -> None:
        self.settle_s = settle_s
        self.stamp = self.at = -math.inf
        self.delta = self.gone_tokens = 0.0
        self.requests = 0  # fresh requests less gone ones: what the reported queue does not show yet
        self.fresh: dict[str, list[Routed]] = {}  # by internal request id (dependent calls may share one)
        self.gone: list[tuple[float, float]] = []  # (tokens, ended at): counted by the latest report, ended since

    def report(self, stamp: float, now: float) -> None:
        """A new report (its ``at``, seen ``now``): forget what it counts, and the ends it saw (once per report,
        over the requests sent since the last). It was measured before it was seen, whatever the replica's
        clock says."""
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
        self.gone = [(tokens, ended) for tokens, ended in self.gone if ended > self.at]
        self.delta = sum(r.cost for entries in self.fresh.values() for r in entries)
        self.gone_tokens = sum(tokens for tokens, _ in self.gone)
        self.requests = sum(len(entries) for entries in self.fresh.values()) - len(self.gone)

    def held(self, load: float) -> float:
        """Tokens held, given the latest report's ``load``."""
        return max(0.0, load - self.gone_tokens) + self.delta

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

    def complete(self, routed: Routed, now: float) -> None:
        """``routed`` ended here (or was refused) at ``now``: off the books if fresh, else off the report that
        counts it (one measured after it arrived and before it ended)."""
        if self.remove(routed):
            return
        if routed.at + self.settle_s <= self.at < now:
            self.gone.append((routed.cost, now))
            self.gone_tokens += routed.cost
            self.requests -= 1
