"""The replica reports a token router ranks by: the newest of Serve's relay and, in the ingress router's process, the
replicas' own answers to it.

Why: Serve's controller asks each replica for its report (``record_routing_stats``) and passes it on at its next
control-loop pass, so a router sees it 1-2 s late. A handle's router makes up for that with what it sees itself (what
it sent, what ended). The ingress router at HAProxy's door sees no request end (HAProxy carries the request and its
answer), so a stream that ended still counted until the next report arrived, and under a closed loop of streams the
replicas' loads drifted apart. That process therefore asks every replica for its report itself, every ``period_s``
(the same actor method the controller calls), and ranks by whichever report was measured last; with one
replica up there is nothing to rank, and it asks nothing.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Hashable, Iterable
from typing import Any

logger = logging.getLogger("serve_app")

POLL_PERIOD_S: float | None = None
"""How often the routers of this process ask each replica for its report; ``None``: they do not (Serve's relay only).
Set by the ingress router in its own process (:func:`poll_in_this_process`)."""


def poll_in_this_process(period_s: float) -> None:
    """Have every token router of this process ask each replica for its report every ``period_s``."""
    global POLL_PERIOD_S
    if period_s <= 0:
        raise ValueError(f"the report polling period must be > 0, got {period_s}")
    POLL_PERIOD_S = period_s


class Reports:
    """The newest report of each replica a router knows."""

    def __init__(self) -> None:
        self._polled: dict[Hashable, dict[str, Any]] = {}
        self._task: asyncio.Task[None] | None = None

    def of(self, replica: Any) -> dict[str, Any]:
        """``replica``'s newest report (by when it was measured, ``at``): Serve's relay's or this router's own."""
        relayed = replica.routing_stats or {}
        polled = self._polled.get(replica.replica_id)
        if polled is not None and polled.get("at", 0) > relayed.get("at", 0):
            return polled
        return relayed

    def start(self, replicas: Callable[[], Iterable[Any]]) -> None:
        """Start asking ``replicas()`` for their reports, if this process polls and has not started yet (on the
        router's event loop)."""
        if POLL_PERIOD_S is None or self._task is not None:
            return
        self._task = asyncio.get_running_loop().create_task(self._poll(replicas, POLL_PERIOD_S))

    async def _poll(self, replicas: Callable[[], Iterable[Any]], period_s: float) -> None:
        """Ask every ``period_s`` while there is a choice to make: with one replica up (the shipped config's
        usual state) a report changes no pick, and each round wakes both processes for nothing."""
        while True:
            try:
                running = list(replicas())
                if len(running) > 1:
                    await self.ask(running, timeout_s=max(1.0, 5 * period_s))
            except Exception:  # never stop polling over one round; Serve's relay still comes meanwhile
                logger.warning("token router: asking the replicas for their reports failed", exc_info=True)
            await asyncio.sleep(period_s)

    async def ask(self, replicas: list[Any], timeout_s: float) -> None:
        """One round: each replica's own report (``record_routing_stats``, the actor method the controller calls); a
        replica that does not answer within ``timeout_s`` keeps the report it had."""
        asked = {
            asyncio.ensure_future(replica._actor_handle.record_routing_stats.remote()): replica for replica in replicas
        }
        if not asked:
            return
        done, pending = await asyncio.wait(asked, timeout=timeout_s)
        for future in pending:
            future.cancel()
        for future in done:
            report = None if future.exception() is not None else future.result()
            if isinstance(report, dict) and "at" in report:
                self._polled[asked[future].replica_id] = report
            else:
                logger.debug("token router: no report from %s: %r", asked[future].replica_id, future.exception())

    def replicas(self) -> set[Hashable]:
        return set(self._polled)

    def forget(self, replica_ids: Iterable[Hashable]) -> None:
        for replica_id in replica_ids:
            self._polled.pop(replica_id, None)
