"""What a router sent each replica, and what of it ended, since that replica's latest report: the optimistic
accounting between reports that :class:`~serve_app.serving.routing.TokenLoadRouter` applies to each reported
token load (:class:`Books`, one per replica), and each request's life from its choice to its end
(:class:`Ledger`)."""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ray.serve.request_router import ReplicaID

MAX_CHOICES = 10_000
"""Requests chosen but never confirmed routed, or never completed (cancelled while queued), are forgotten beyond
this many."""


@dataclass(eq=False)  # identity: two requests may look alike
class Routed:
    """A request this router sent (or is about to send) to a replica: its cost and since when."""

    internal_id: str
    cost: float
    replica_id: ReplicaID
    at: float
    routed: bool = False  # the replica took it (on_request_routed); else only chosen so far
    shared: float = 0.0
    """Tokens of ``cost`` the replica most likely holds already: the prompt's prefix that requests in flight there
    share, which its admission counts once (``batcher.shared_prefixes``)."""

    @property
    def tokens(self) -> float:
        """What the request adds to the replica's held tokens."""
        return max(0.0, self.cost - self.shared)


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
        self.delta = sum(r.tokens for entries in self.fresh.values() for r in entries)
        self.gone_tokens = sum(tokens for tokens, _ in self.gone)
        self.requests = sum(len(entries) for entries in self.fresh.values()) - len(self.gone)

    def held(self, load: float) -> float:
        """Tokens held, given the latest report's ``load``."""
        return max(0.0, load - self.gone_tokens) + self.delta

    def add(self, routed: Routed) -> None:
        if routed.at > self.at - self.settle_s:
            self.fresh.setdefault(routed.internal_id, []).append(routed)
            self.delta += routed.tokens
            self.requests += 1

    def remove(self, routed: Routed) -> bool:
        entries = self.fresh.get(routed.internal_id, [])
        for index, other in enumerate(entries):
            if other is routed:
                del entries[index]
                if not entries:
                    del self.fresh[routed.internal_id]
                self.delta -= routed.tokens
                self.requests -= 1
                return True
        return False

    def complete(self, routed: Routed, now: float) -> None:
        """``routed`` ended here (or was refused) at ``now``: off the books if fresh, else off the report that
        counts it (one measured after it arrived and before it ended)."""
        if self.remove(routed):
            return
        if routed.at + self.settle_s <= self.at < now:
            self.gone.append((routed.tokens, now))
            self.gone_tokens += routed.tokens
            self.requests -= 1


class Ledger:
    """Every request a router chose a replica for, from that choice until it completes, and the books of each
    replica it counts them in. Serve may pass a request through ``choose_replicas`` more than once (a replica
    refused it), confirms where it went (``on_request_routed``; over gRPC a unary call's only with its answer,
    after its end: ignored) and reports its end (``on_request_completed``)."""

    def __init__(self, settle_s: float, forget_after_s: float) -> None:
        self.settle_s = settle_s
        self.forget_after_s = forget_after_s
        self.books: dict[ReplicaID, Books] = {}  # per replica: what its report does not show yet
        self._chosen: dict[Hashable, Routed] = {}  # by the pending request's identity: chosen, not yet seen routed
        self._open: dict[str, Routed] = {}  # by internal request id: chosen or routed, not completed
        self._ended: dict[str, float] = {}  # by internal request id: completed (when), for a late confirmation

    def book(self, replica_id: ReplicaID) -> Books:
        books = self.books.get(replica_id)
        if books is None:
            books = self.books[replica_id] = Books(self.settle_s)
        return books

    def previous(self, key: Hashable, internal_id: str) -> Routed | None:
        """This pending request's earlier choice (a second pass after a replica refused it), if any."""
        previous = self._chosen.get(key)
        return previous if previous is not None and previous.internal_id == internal_id else None

    def choose(self, key: Hashable, chosen: Routed) -> None:
        """Count the request at the replica it was just ranked first for (a burst chosen back to back spreads
        before any of it reaches a replica); a second pass for the same request moves it."""
        previous = self._chosen.get(key)
        if previous is not None:
            self.book(previous.replica_id).remove(previous)
        if len(self._chosen) >= MAX_CHOICES:
            cutoff = chosen.at - self.forget_after_s
            self._chosen = {key: c for key, c in self._chosen.items() if c.at > cutoff}
        self._chosen[key] = chosen
        self.book(chosen.replica_id).add(chosen)
        self._ended.pop(chosen.internal_id, None)  # chosen again: refused by a replica, now retried
        self._remember(chosen)

    def routed(
        self, key: Hashable, internal_id: str, replica_id: ReplicaID, cost: Callable[[], float], now: float
    ) -> None:
        """The replica took it: count it there from ``now`` (``cost()`` if it was never chosen here), unless it
        has completed already."""
        chosen = self.previous(key, internal_id)
        self._chosen.pop(key, None)
        if internal_id in self._ended:
            return
        if chosen is None:
            chosen = Routed(internal_id, cost(), replica_id, 0.0)
        else:
            self.book(chosen.replica_id).remove(chosen)
            if chosen.replica_id != replica_id:  # another replica took it: what the first held does not count there
                chosen.shared = 0.0
        chosen.replica_id, chosen.at, chosen.routed = replica_id, now, True
        self.book(replica_id).add(chosen)
        self._remember(chosen)

    def end(self, internal_id: str, replica_id: ReplicaID, now: float) -> Routed | None:
        """It completed on ``replica_id`` at ``now``: what it was counted as there (``None``: nothing), for that
        replica's books to take off (:meth:`Books.complete`) once its latest report is in."""
        self._ended[internal_id] = now
        while self._ended and next(iter(self._ended.values())) < now - self.forget_after_s:
            del self._ended[next(iter(self._ended))]  # a late confirmation comes within milliseconds
        routed = self._open.pop(internal_id, None)
        if routed is None or routed.replica_id == replica_id:
            return routed
        self.book(routed.replica_id).remove(routed)  # it was counted where it was chosen, and ran elsewhere
        return Routed(routed.internal_id, routed.cost, replica_id, routed.at, routed.routed)

    def forget(self, replica_ids: set[ReplicaID]) -> None:
        """Replicas gone: their books with them."""
        for replica_id in replica_ids:
            self.books.pop(replica_id, None)

    def is_open(self, internal_id: str) -> bool:
        """Whether that request is chosen or routed and has not completed."""
        return internal_id in self._open

    def __len__(self) -> int:
        """Requests open (chosen or routed, not completed)."""
        return len(self._open)

    def _remember(self, routed: Routed) -> None:
        """Keep ``routed`` until it completes (the latest choice or confirmation of its request)."""
        self._open.pop(routed.internal_id, None)
        self._open[routed.internal_id] = routed  # newest last
        if len(self._open) > MAX_CHOICES:  # never completed (given up before it was sent): the oldest go
            del self._open[next(iter(self._open))]
