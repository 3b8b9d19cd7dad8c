"""The reports the token router ranks by (serve_app/serving/routing/reports.py): in the ingress router's process it
asks each replica for its report itself and ranks by whichever report was measured last; elsewhere Serve's relay
alone. Unit tests on Ray Serve's real router machinery with fake replicas."""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace
from typing import Any

import pytest

from serve_app.serving.routing import reports as routing_reports
from serve_app.serving.routing.reports import Reports

from .test_routing import FakeReplica, request, route, router_with
from .waits import wait_for


class AskedReplica(FakeReplica):
    """A fake replica that also answers the router's own ``record_routing_stats`` call, as the actor does."""

    def __init__(self, name: str, load: float, answer: float | None, **kwargs: Any) -> None:
        super().__init__(name, load, **kwargs)
        self.answer = answer  # the load it reports when asked; None: it never answers
        self.asked = 0

        async def record_routing_stats() -> dict[str, Any]:
            self.asked += 1
            if self.answer is None:
                await asyncio.sleep(3600)
            return {"token_load": self.answer, "token_budget": 10_000.0, "prompts": 1, "at": time.time()}

        self._actor_handle = SimpleNamespace(record_routing_stats=SimpleNamespace(remote=record_routing_stats))


async def test_the_newest_report_counts_the_relayed_or_the_replicas_own_answer():
    relayed_late = AskedReplica("a", 9_000, answer=100, age_s=1.5)  # the relay's report is 1.5 s old
    reports = Reports()
    assert reports.of(relayed_late)["token_load"] == 9_000
    await reports.ask([relayed_late], timeout_s=1)
    assert reports.of(relayed_late)["token_load"] == 100  # measured just now: newer
    relayed_late.report(7_000, at=time.time() + 1)  # a relayed report measured after it
    assert reports.of(relayed_late)["token_load"] == 7_000
    reports.forget({relayed_late.replica_id})
    assert reports.replicas() == set()


async def test_a_replica_that_does_not_answer_keeps_the_report_it_had():
    silent, answering = AskedReplica("s", 500, answer=None), AskedReplica("t", 500, answer=20)
    reports = Reports()
    started = time.monotonic()
    await reports.ask([silent, answering], timeout_s=0.2)
    assert time.monotonic() - started < 5  # the round is not held up by the silent one
    assert reports.of(silent)["token_load"] == 500 and reports.of(answering)["token_load"] == 20


async def test_the_ingress_routers_process_polls_and_ranks_by_the_fresh_reports(monkeypatch):
    """Serve's relay says replica ``a`` holds 6,000 tokens (it did, a second ago); asked itself, it holds none now:
    in the polling process the next request goes to it, not to ``b`` with its 3,000."""
    a, b = AskedReplica("a", 6_000, answer=0, age_s=1.0), AskedReplica("b", 3_000, answer=3_000, age_s=1.0)
    router = await router_with(a, b)
    assert await route(router, request("generate", "x" * 40, max_tokens=10)) is b  # no polling: the relay decides
    assert a.asked == 0
    monkeypatch.setattr(routing_reports, "POLL_PERIOD_S", 0.05)
    router = await router_with(a, b)
    await route(router, request("generate", "x" * 40, max_tokens=10))  # the first request starts the polling
    await wait_for(lambda: router.held_tokens(a, time.time()) == 0, 10, "a's own report", interval=0.01)
    assert await route(router, request("generate", "x" * 40, max_tokens=10)) is a
    router._reports._task.cancel()
    with pytest.raises(ValueError, match="period"):
        routing_reports.poll_in_this_process(0)


async def test_with_one_replica_up_the_poll_asks_nothing_until_a_second_comes(monkeypatch):
    """One replica: a report changes no pick, so the polling process leaves it alone; a second replica up, it asks
    both."""
    monkeypatch.setattr(routing_reports, "POLL_PERIOD_S", 0.01)
    a, b = AskedReplica("a", 0, answer=0), AskedReplica("b", 0, answer=0)
    up, rounds = [a], 0

    def replicas() -> list[AskedReplica]:
        nonlocal rounds
        rounds += 1
        return list(up)

    reports = Reports()
    reports.start(replicas)
    try:
        await wait_for(lambda: rounds >= 5, 10, "five rounds of the poll", interval=0.01)
        assert a.asked == 0  # five rounds with one replica: never asked
        up.append(b)
        await wait_for(lambda: a.asked and b.asked, 10, "both replicas asked, two up", interval=0.01)
    finally:
        reports._task.cancel()
