"""ContinuousBatcher with priorities, aging, the low-priority share cap, fair share between tenants (VTC), and
the computed retry hint (``expected_wait``, ``QueueFullError.retry_after_s``) in both modes.

Time is the test's: every test runs on :class:`ClockLoop`, an event loop whose clock stands still until the
test moves it, and the batchers read their time from the loop. Ages, share holds and drain rates are thus
exactly what the test makes them, with no sleeps and no wall-clock thresholds. The fake engine finishes a
record when the test says (or on the next loop tick); what is asserted is measured inside the engine.
"""

from __future__ import annotations

import asyncio
import enum
import json
import pickle
import selectors
from collections.abc import AsyncIterator, Awaitable, Callable, Hashable
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from batching import BatcherStoppedError, ContinuousBatcher, DynamicBatcher, QueueFullError, RecordStream
from batching.recorders import TENANTS_KEPT

from .conftest import sized

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


class NeverBlocks(selectors.DefaultSelector):
    """A selector that refuses to wait: nothing here does I/O, so a loop about to wait (for a timer the
    standing clock never reaches, or for nothing at all) is stuck, and the test fails instead of hanging."""

    def select(self, timeout: float | None = None) -> list[Any]:
        events = super().select(0)
        if not events and (timeout is None or timeout > 0):
            raise RuntimeError("the event loop would wait with nothing to do: stuck")
        return events


class ClockLoop(asyncio.SelectorEventLoop):
    """An event loop whose clock moves only when the test moves it (``now``)."""

    def __init__(self) -> None:
        super().__init__(NeverBlocks())
        self.now = 1_000.0

    def time(self) -> float:
        return self.now


def run(main: Callable[[ClockLoop], Awaitable[Any]]) -> Any:
    """Run ``main(loop)`` to its end on a fresh :class:`ClockLoop`."""
    loop = ClockLoop()
    try:
        return loop.run_until_complete(main(loop))
    finally:
        loop.close()


async def ticks(n: int = 1) -> None:
    for _ in range(n):
        await asyncio.sleep(0)


async def until(predicate: Callable[[], bool], limit: int = 5_000) -> None:
    """Let the loop run (ticks, not seconds) until ``predicate()`` holds; fail if it never does."""
    for _ in range(limit):
        if predicate():
            return
        await asyncio.sleep(0)
    raise AssertionError("condition never became true")


@dataclass(eq=False)
class Job:
    """A record: its cost, priority and tenant; with ``hold`` it runs until the test releases it."""

    name: str
    cost: int = 1
    priority: int = 0
    tenant: Hashable = None
    hold: bool = False

    def estimate_tokens(self) -> int:
        return self.cost


class Engine:
    """A fake continuously batching engine: records what started, in order, and what runs now."""

    def __init__(self) -> None:
        self.started: list[str] = []
        self.running: dict[str, Job] = {}
        self._gates: dict[str, asyncio.Event] = {}

    def release(self, *names: str) -> None:
        for name in names:
            self._gates.setdefault(name, asyncio.Event()).set()

    def held(self, at_least: int = -(10**9)) -> tuple[int, int]:
        """(cost, count) running now of the records with priority ``>= at_least``."""
        jobs = [job for job in self.running.values() if job.priority >= at_least]
        return sum(job.cost for job in jobs), len(jobs)

    async def generate(self, job: Job) -> str:
        self.started.append(job.name)
        self.running[job.name] = job
        try:
            await asyncio.sleep(0)
            if job.hold:
                await self._gates.setdefault(job.name, asyncio.Event()).wait()
        finally:
            del self.running[job.name]
        return job.name


# Priority order ---------------------------------------------------------------------------------------------


@SETTINGS
@given(
    st.lists(st.tuples(st.integers(0, 4), st.integers(1, 9)), min_size=1, max_size=30),
    st.sampled_from(["fifo", "length_aware"]),
)
def test_everything_queued_at_once_is_admitted_in_priority_order(jobs, order):
    """Lowest priority number first; FIFO within a priority (``fifo``), or the cheapest first within one
    (``length_aware`` with a window over everything and no head aging), ties by arrival."""

    async def main(loop: ClockLoop) -> list[str]:
        engine = Engine()
        async with ContinuousBatcher(
            engine.generate, max_inflight=1, order=order, lookahead=64, max_wait_s=60
        ) as batcher:
            blocker = batcher.submit_nowait(Job("blocker", hold=True, priority=9))  # admitted: the engine is idle
            futures = [batcher.submit_nowait(Job(str(i), cost, p)) for i, (p, cost) in enumerate(jobs)]
            await until(lambda: engine.started == ["blocker"])
            engine.release("blocker")
            await asyncio.gather(blocker, *futures)
        return engine.started[1:]

    if order == "fifo":
        expected = sorted(range(len(jobs)), key=lambda i: (jobs[i][0], i))
    else:
        expected = sorted(range(len(jobs)), key=lambda i: (jobs[i][0], jobs[i][1], i))
    assert run(main) == [str(i) for i in expected]


def test_the_record_chosen_next_waits_for_room_rather_than_let_a_lower_priority_pass():
    async def main(loop: ClockLoop) -> None:
        engine = Engine()
        async with ContinuousBatcher(engine.generate, max_inflight_cost=10) as batcher:
            first = batcher.submit_nowait(Job("first", 6, priority=1, hold=True))
            high = batcher.submit_nowait(Job("high", 8, priority=0))  # does not fit beside "first"
            low = batcher.submit_nowait(Job("low", 1, priority=5))  # would fit
            await ticks(20)
            assert engine.started == ["first"]  # "low" would fit, but "high" goes first and waits
            engine.release("first")
            await asyncio.gather(first, low, high)
        assert engine.started == ["first", "high", "low"]

    run(main)


# Aging ------------------------------------------------------------------------------------------------------


@SETTINGS
@given(st.integers(1, 4), st.sampled_from([1.0, 2.0, 5.0]), st.sampled_from([0.25, 0.5, 1.0]))
def test_aging_admits_a_low_priority_record_under_a_stream_of_higher_ones(priority, aging_s, step):
    """A record of priority ``p`` waits behind a continuous stream of fresh priority-0 records (one arrives
    each time one finishes) until its effective priority ``p - floor(waited / aging_s)`` beats theirs (0):
    the first admission after it has waited ``(p + 1) * aging_s``, never before, never later."""

    async def main(loop: ClockLoop) -> int:
        engine = Engine()
        async with ContinuousBatcher(engine.generate, max_inflight=1, aging_s=aging_s) as batcher:
            futures = [batcher.submit_nowait(Job("h0", hold=True))]
            futures.append(batcher.submit_nowait(Job("low", priority=priority)))
            await until(lambda: "h0" in engine.running)
            for k in range(1, 1_000):
                loop.now += step
                futures.append(batcher.submit_nowait(Job(f"h{k}", hold=True)))  # fresh: it has waited 0
                engine.release(*engine.running)
                await until(lambda k=k: len(engine.started) == k + 1)
                if engine.started[-1] == "low":
                    engine.release(*(f"h{i}" for i in range(k + 1)))
                    await asyncio.gather(*futures)
                    return k
        raise AssertionError("the low-priority record was never admitted")

    admitted_at = run(main)  # the step whose admission took it, after waiting admitted_at * step seconds
    first_due = next(k for k in range(1, 1_000) if (k * step) // aging_s >= priority + 1)
    assert admitted_at == first_due


def test_without_aging_a_stream_of_higher_priority_records_keeps_a_lower_one_waiting():
    async def main(loop: ClockLoop) -> None:
        engine = Engine()
        async with ContinuousBatcher(engine.generate, max_inflight=1, aging_s=None) as batcher:
            futures = [batcher.submit_nowait(Job("h0", hold=True)), batcher.submit_nowait(Job("low", priority=1))]
            await until(lambda: "h0" in engine.running)
            for k in range(1, 50):
                loop.now += 3_600.0
                futures.append(batcher.submit_nowait(Job(f"h{k}", hold=True)))
                engine.release(*engine.running)
                await until(lambda k=k: len(engine.started) == k + 1)
            assert "low" not in engine.started
            engine.release(*(f"h{k}" for k in range(50)))
            await asyncio.gather(*futures)
        assert engine.started[-1] == "low"

    run(main)


# The share cap ----------------------------------------------------------------------------------------------


def test_a_batch_job_is_held_to_its_share_while_interactive_work_is_about():
    """A batch job (priority 5) fills the engine; an interactive request (priority 0) takes the first room
    that frees; from then on, and for ``share_hold_s`` after the last interactive request, the batch job
    holds at most half the budget, so the next interactive request starts at once. Once the hold has
    passed, the batch job fills the engine again."""

    async def main(loop: ClockLoop) -> None:
        engine = Engine()
        async with ContinuousBatcher(
            engine.generate, max_inflight_cost=100, low_priority_share=0.5, share_hold_s=5.0
        ) as batcher:
            batch = [batcher.submit_nowait(Job(f"b{i}", 10, priority=5, hold=True)) for i in range(30)]
            await until(lambda: len(engine.running) == 10)
            assert engine.held() == (100, 10)  # nothing of a higher priority about: no cap

            first = batcher.submit_nowait(Job("i1", 10, priority=0, hold=True))
            await ticks(10)
            assert "i1" not in engine.started  # the budget is full
            engine.release("b0")
            await until(lambda: "i1" in engine.running)
            for k in range(1, 9):  # the batch job shrinks to its share, then holds it: nothing refills it
                engine.release(f"b{k}")
                await ticks(10)
                assert engine.held(at_least=5)[0] == max(50, 90 - 10 * k)
            assert engine.held(at_least=5) == (50, 5)  # b9, and b10 to b13 admitted within the share
            engine.release("i1")
            await first
            await ticks(10)
            assert engine.held(at_least=5) == (50, 5)  # the hold: i1 left less than 5 s ago

            second = batcher.submit_nowait(Job("i2", 10, priority=0, hold=True))
            await ticks(3)
            assert "i2" in engine.running  # room at once
            engine.release("i2")
            await second
            loop.now += 4.9
            await ticks(10)
            assert engine.held(at_least=5) == (50, 5)
            loop.now += 0.2  # 5 s after i2 left: the hold ends (a timer: nothing else happens meanwhile)
            await until(lambda: engine.held(at_least=5) == (100, 10))
            engine.release(*(f"b{i}" for i in range(30)))
            await asyncio.gather(*batch)

    run(main)


def test_an_aged_batch_record_the_share_cap_holds_back_does_not_hold_back_interactive_ones():
    """A batch record (priority 1) that has waited long enough to come first by aging, but that the share cap holds
    back while interactive work is about, lets the interactive request behind it start at once."""

    async def main(loop: ClockLoop) -> None:
        engine = Engine()
        async with ContinuousBatcher(
            engine.generate, max_inflight_cost=100, low_priority_share=0.5, aging_s=10.0
        ) as batcher:
            batch = [batcher.submit_nowait(Job(f"b{i}", 10, priority=1, hold=True)) for i in range(6)]
            await until(lambda: len(engine.running) == 6)
            first = batcher.submit_nowait(Job("i1", 10, priority=0, hold=True))  # fits: the cap holds the batch
            await until(lambda: "i1" in engine.running)
            waiting = batcher.submit_nowait(Job("b6", 10, priority=1))
            loop.now += 25.0  # b6 has aged two levels: its effective priority (-1) now beats a fresh 0
            second = batcher.submit_nowait(Job("i2", 10, priority=0, hold=True))
            await until(lambda: "i2" in engine.running)  # not held back behind b6, which the cap holds
            assert "b6" not in engine.started and engine.held(at_least=1) == (60, 6)
            engine.release("i1", "i2", *(f"b{i}" for i in range(6)))
            await asyncio.gather(first, second, waiting, *batch)
            assert engine.started.index("b6") > engine.started.index("i2")

    run(main)


def test_the_share_cap_lets_a_lone_record_larger_than_the_share_run():
    async def main(loop: ClockLoop) -> None:
        engine = Engine()
        async with ContinuousBatcher(
            engine.generate, max_inflight_cost=100, max_inflight=4, low_priority_share=0.5
        ) as batcher:
            high = batcher.submit_nowait(Job("high", 10, priority=0, hold=True))
            big = batcher.submit_nowait(Job("big", 80, priority=3, hold=True))  # over the share, but alone
            small = batcher.submit_nowait(Job("small", 5, priority=3))  # beside "big": over the share
            await until(lambda: set(engine.running) == {"high", "big"})
            await ticks(10)
            assert "small" not in engine.started
            engine.release("big")
            await asyncio.gather(big, small)
            # The count share: at most 2 of max_inflight=4 for the lower priorities while "high" runs.
            lows = [batcher.submit_nowait(Job(f"l{i}", 1, priority=1, hold=True)) for i in range(3)]
            await until(lambda: engine.held(at_least=1)[1] == 2)
            await ticks(10)
            assert engine.held(at_least=1)[1] == 2
            engine.release("high", "l0", "l1", "l2")
            await asyncio.gather(high, *lows)

    run(main)


@dataclass(eq=False)
class Prompted:
    """A record of an LLM-like engine: ``prompt`` tokens to process before its first output, then ``growth`` more."""

    name: str
    prompt: int
    growth: int = 5
    priority: int = 0

    def estimate_tokens(self) -> int:
        return self.prompt + self.growth

    def estimate_growth(self) -> int:
        return self.growth


class SteppingEngine:
    """A fake streaming engine: each record yields its first output (its prompt processed) and then its last only
    when the test says so (``prefilled``, ``finish``)."""

    def __init__(self) -> None:
        self.started: list[str] = []
        self._first: dict[str, asyncio.Event] = {}
        self._last: dict[str, asyncio.Event] = {}

    def _gate(self, gates: dict[str, asyncio.Event], name: str) -> asyncio.Event:
        return gates.setdefault(name, asyncio.Event())

    def prefilled(self, *names: str) -> None:
        for name in names:
            self._gate(self._first, name).set()

    def finish(self, *names: str) -> None:
        for name in names:
            self._gate(self._first, name).set()
            self._gate(self._last, name).set()

    async def stream(self, job: Prompted) -> AsyncIterator[str]:
        self.started.append(job.name)
        await self._gate(self._first, job.name).wait()
        yield f"{job.name}: first token"
        await self._gate(self._last, job.name).wait()
        yield f"{job.name}: done"


def test_a_batch_jobs_prompts_are_held_to_the_step_budget_while_interactive_work_is_about():
    """With interactive work about, the batch job's records may put at most ``low_priority_step_budget`` into each
    engine step: a record's prompt until its first output, then one token. Each first output makes room for the
    next prompt; without interactive work (and once the hold has passed) there is no step budget."""

    async def main(loop: ClockLoop) -> None:
        engine = SteppingEngine()
        async with ContinuousBatcher(
            engine.stream, max_inflight_cost=1_000, low_priority_step_budget=25, share_hold_s=5.0
        ) as batcher:
            alone = [batcher.submit_nowait(Prompted(f"a{i}", 10, priority=1)) for i in range(4)]
            await until(lambda: len(engine.started) == 4)  # nothing of a higher priority about: no step budget
            engine.finish("a0", "a1", "a2", "a3")
            await asyncio.gather(*alone)

            chat = batcher.submit_nowait(Prompted("chat", 10, priority=0))
            await until(lambda: "chat" in engine.started)
            batch = [batcher.submit_nowait(Prompted(f"b{i}", 10, priority=1)) for i in range(6)]
            await until(lambda: engine.started[-2:] == ["b0", "b1"])  # 10 + 10 within 25; b2 would make 30
            await ticks(10)
            assert engine.started[-2:] == ["b0", "b1"]
            engine.prefilled("b0")  # b0 now puts one token a step: 1 + 10 + 10 = 21
            await until(lambda: "b2" in engine.started)
            await ticks(10)
            assert "b3" not in engine.started  # 31
            engine.prefilled("b1", "b2")  # 1 + 1 + 1 + 10 + 10 = 23: b3 and b4
            await until(lambda: "b4" in engine.started)
            await ticks(10)
            assert "b5" not in engine.started  # 33
            engine.finish("chat")
            await chat
            loop.now += 5.1  # the hold ends: b5 goes in beside the others
            await until(lambda: "b5" in engine.started)
            engine.finish(*(f"b{i}" for i in range(6)))
            await asyncio.gather(*batch)

    run(main)


def test_the_step_budget_lets_a_lone_batch_record_with_a_longer_prompt_run():
    async def main(loop: ClockLoop) -> None:
        engine = SteppingEngine()
        async with ContinuousBatcher(engine.stream, low_priority_step_budget=8) as batcher:
            chat = batcher.submit_nowait(Prompted("chat", 10, priority=0))
            long = batcher.submit_nowait(Prompted("long", 50, priority=2))  # over the budget, but alone
            short = batcher.submit_nowait(Prompted("short", 2, priority=2))  # 50 + 2 until "long" is prefilled
            await until(lambda: engine.started == ["chat", "long"])
            await ticks(10)
            engine.prefilled("long")  # 1 + 2 within 8
            await until(lambda: "short" in engine.started)
            engine.finish("chat", "long", "short")
            await asyncio.gather(chat, long, short)

    run(main)


# Fair share between tenants (VTC) ---------------------------------------------------------------------------


@SETTINGS
@given(
    st.lists(st.lists(st.integers(1, 20), min_size=1, max_size=15), min_size=2, max_size=4),
    st.randoms(use_true_random=False),
    st.integers(1, 60),
    st.integers(1, 4),
)
def test_fair_share_keeps_backlogged_tenants_within_one_record_of_each_other(backlogs, rnd, budget, max_inflight):
    """Tenants whose backlogs were all queued at once (in any interleaving) are admitted so that, while
    two of them still have records queued, their admitted costs differ by at most the largest record cost:
    the tenant with the lowest counter goes next, so no counter passes another by more than one record."""
    jobs = [Job(f"{t}.{k}", cost, tenant=t) for t, costs in enumerate(backlogs) for k, cost in enumerate(costs)]
    rnd.shuffle(jobs)
    largest = max(job.cost for job in jobs)

    async def main(loop: ClockLoop) -> list[str]:
        engine = Engine()
        async with ContinuousBatcher(
            engine.generate, max_inflight_cost=budget, max_inflight=max_inflight, fair_share=True
        ) as batcher:
            blocker = batcher.submit_nowait(Job("blocker", hold=True, tenant="other"))
            futures = batcher.submit_batch_nowait(jobs)
            engine.release("blocker")
            await asyncio.gather(blocker, *futures)
        return engine.started[1:]

    by_name = {job.name: job for job in jobs}
    admitted = dict.fromkeys(range(len(backlogs)), 0)
    queued = {t: len(costs) for t, costs in enumerate(backlogs)}
    for name in run(main):
        job = by_name[name]
        admitted[job.tenant] += job.cost
        queued[job.tenant] -= 1
        backlogged = [admitted[t] for t in admitted if queued[t]]
        if len(backlogged) > 1:
            assert max(backlogged) - min(backlogged) <= largest


def test_without_fair_share_one_tenants_backlog_goes_first():
    """The counterpart of the fairness property: arrival order lets the first tenant's backlog run first."""

    async def main(loop: ClockLoop, fair: bool) -> list[Hashable]:
        engine = Engine()
        async with ContinuousBatcher(engine.generate, max_inflight=1, fair_share=fair) as batcher:
            jobs = [Job(f"a{i}", tenant="a") for i in range(6)] + [Job(f"b{i}", tenant="b") for i in range(6)]
            await asyncio.gather(*batcher.submit_batch_nowait(jobs))
        return [name[0] for name in engine.started]

    assert run(lambda loop: main(loop, False)) == ["a"] * 6 + ["b"] * 6
    assert run(lambda loop: main(loop, True)) == ["a", "b"] * 6


def test_a_tenant_back_from_idle_starts_level_with_the_least_served():
    """VTC's lift: a tenant that had nothing queued or in flight comes back at the lowest counter of the
    backlogged tenants, not at the counter it left with, so it gets no burst for the time it was away."""

    async def main(loop: ClockLoop) -> list[str]:
        engine = Engine()
        async with ContinuousBatcher(engine.generate, max_inflight=1, fair_share=True) as batcher:
            blocker = batcher.submit_nowait(Job("blocker", tenant="a", hold=True))
            jobs = [Job(f"{t}{i}", tenant=t, hold=True) for i in range(12) for t in "ab"]
            futures = [blocker, *batcher.submit_batch_nowait(jobs)]
            await until(lambda: "blocker" in engine.running)
            for _ in range(10):  # a and b take turns; c has nothing queued
                count = len(engine.started)
                engine.release(*engine.running)
                await until(lambda count=count: len(engine.started) == count + 1)
            started_before = len(engine.started)
            futures += batcher.submit_batch_nowait([Job(f"c{i}", tenant="c", hold=True) for i in range(12)])
            while len(engine.started) < started_before + 9:
                engine.release(*engine.running)
                count = len(engine.started)
                await until(lambda count=count: len(engine.started) == count + 1)
            engine.release(*(job.name for job in jobs), *(f"c{i}" for i in range(12)), "blocker")
            await asyncio.gather(*futures)
            return engine.started[started_before : started_before + 9]

    after = run(main)
    # Counters a, b and c level: c takes its turn after a and b (older heads), never several in a row.
    assert [name[0] for name in after] == ["a", "b", "c"] * 3


# Random workloads: exactly once, budget, share, step budget, priority order -----------------------------


@st.composite
def workloads(draw: st.DrawFn) -> dict[str, Any]:
    n = draw(st.integers(1, 30))
    record = st.fixed_dictionaries(
        {
            "cost": st.integers(0, 30),
            "growth": st.integers(0, 30),  # of its cost (at most all of it): the rest is its "prompt"
            "priority": st.integers(0, 3),
            "tenant": st.sampled_from(["x", "y", "z", None]),
            "ticks": st.integers(0, 3),
            "ticks_after_first": st.integers(0, 3),
            "fail": st.booleans(),
            "sink": st.sampled_from(["future", "stream"]),
            "cancel": st.sampled_from([None, None, None, "now", "later", "running"]),
            "cancel_ticks": st.integers(0, 8),
            "nowait": st.booleans(),
            "yield_after": st.booleans(),
            "advance": st.sampled_from([0.0, 0.0, 1.0, 7.0]),  # seconds the clock moves before it is submitted
        }
    )
    return {
        "records": draw(st.lists(record, min_size=n, max_size=n)),
        "budget": draw(st.integers(1, 40)),
        "max_inflight": draw(st.integers(1, 6)),
        "queue": draw(st.integers(1, 12)),
        "producers": draw(st.integers(1, 4)),
        "order": draw(st.sampled_from(["fifo", "length_aware"])),
        "lookahead": draw(st.integers(1, 8)),
        "share": draw(st.sampled_from([1.0, 0.75, 0.5, 0.25])),
        "step_budget": draw(st.sampled_from([None, None, 1, 5, 20, 60])),
        "streaming": draw(st.booleans()),  # process_fn yields a first output, then its last; else returns one
        "fair_share": draw(st.booleans()),
        "clock": draw(st.booleans()),  # the clock moves (records age), or stands still
    }


async def run_workload(w: dict[str, Any]) -> None:
    """Random records with priorities and tenants from several producers, some withdrawn (queued or running),
    some failing, some streaming a first output before their last. The share hold never ends once it began; the
    clock moves (records age: ``aging_s`` 5) or stands still (then strict priority order holds too)."""
    specs = w["records"]
    budget, max_inflight, share, step_budget = w["budget"], w["max_inflight"], w["share"], w["step_budget"]
    inside: dict[int, int] = {}  # record -> cost, while its process_fn runs
    first_out: set[int] = set()  # records that have yielded their first output

    def step_load(j: int) -> int:  # what it puts into each engine step: its "prompt", then a token
        return 1 if j in first_out else max(1, specs[j]["cost"] - min(specs[j]["growth"], specs[j]["cost"]))

    violations: list[str] = []
    entered: list[int] = []
    submitted: list[int] = []  # in the order submit returned
    withdrawn: set[int] = set()
    endings: dict[int, int] = {}
    sinks: dict[int, Any] = {}
    side_tasks: list[asyncio.Task] = []

    def priority(i: int) -> int:
        return specs[i]["priority"]

    def enter(i: int) -> None:
        p = priority(i)
        entered.append(i)
        inside[i] = specs[i]["cost"]
        if len(inside) > max_inflight or (len(inside) > 1 and sum(inside.values()) > budget):
            violations.append(f"budget: {inside} in flight")
        # Submitted before i, so queued when i was admitted; with the clock standing, none has aged.
        before = submitted[: submitted.index(i)]
        waiting = [j for j in before if j not in entered and j not in withdrawn]
        if not w["clock"] and any(priority(j) < p for j in waiting):
            violations.append(f"{i} (priority {p}) entered while a higher priority waited: {waiting}")
        if any(priority(j) < p for j in before):  # a higher priority was about: the cap holds (for ever)
            lower = [j for j in inside if priority(j) >= p]
            cost = sum(inside[j] for j in lower)
            if len(lower) > 1 and (cost > share * budget or len(lower) > share * max_inflight):
                violations.append(f"share: {i} entered; priorities >= {p} hold {cost} in {len(lower)} records")
            load = sum(step_load(j) for j in lower)
            if len(lower) > 1 and step_budget is not None and load > step_budget:
                violations.append(f"step budget: {i} entered; priorities >= {p} put {load} into a step")
        stats = batcher.stats
        if sum(stats.tokens_by_priority.values()) != stats.queued_cost + stats.in_flight_cost:
            violations.append(f"tokens_by_priority {stats.tokens_by_priority}")
        if sum(stats.in_flight_by_priority.values()) != stats.in_flight_cost:
            violations.append(f"in_flight_by_priority {stats.in_flight_by_priority}")
        if sum(stats.queued_by_tenant.values()) != stats.queue_depth or 0 in stats.queued_by_tenant.values():
            violations.append(f"queued_by_tenant {stats.queued_by_tenant} of {stats.queue_depth} queued")
        if sum(stats.admitted_cost_by_tenant.values()) != stats.total_admitted_cost:
            violations.append(f"admitted_cost_by_tenant {stats.admitted_cost_by_tenant}")

    async def process(i: int) -> str:
        enter(i)
        try:
            if specs[i]["cancel"] == "running":
                withdraw(i)
            await ticks(specs[i]["ticks"])
            if specs[i]["fail"]:
                raise RuntimeError("injected")
            return f"r{i}"
        finally:
            del inside[i]

    async def process_streaming(i: int) -> AsyncIterator[str]:
        enter(i)
        try:
            if specs[i]["cancel"] == "running":
                withdraw(i)
            await ticks(specs[i]["ticks"])
            if specs[i]["fail"]:
                raise RuntimeError("injected")
            first_out.add(i)
            yield f"f{i}"
            await ticks(specs[i]["ticks_after_first"])
            yield f"r{i}"
        finally:
            del inside[i]

    def withdraw(i: int) -> None:
        withdrawn.add(i)
        sink = sinks[i]
        if isinstance(sink, RecordStream):
            side_tasks.append(asyncio.ensure_future(sink.aclose()))
        else:
            sink.cancel()

    async def withdraw_later(i: int) -> None:
        await ticks(specs[i]["cancel_ticks"])
        withdraw(i)

    async def consume(i: int, stream: RecordStream) -> None:
        try:
            async for _ in stream:
                pass
        except Exception:
            pass
        endings[i] = endings.get(i, 0) + 1

    batcher = ContinuousBatcher(
        process_streaming if w["streaming"] else process,
        cost_estimator=lambda i: specs[i]["cost"],
        growth_estimator=lambda i: specs[i]["growth"],
        priority_fn=priority,
        tenant_fn=lambda i: specs[i]["tenant"],
        max_inflight_cost=budget,
        max_inflight=max_inflight,
        max_queue_size=w["queue"],
        order=w["order"],
        lookahead=w["lookahead"],
        max_wait_s=60,
        low_priority_share=share,
        low_priority_step_budget=step_budget,
        share_hold_s=1e9,
        aging_s=5.0,
        fair_share=w["fair_share"],
    )
    loop = asyncio.get_running_loop()

    async def produce(ids: list[int]) -> None:
        for i in ids:
            spec = specs[i]
            if w["clock"]:
                loop.now += spec["advance"]  # type: ignore[attr-defined]
            stream = spec["sink"] == "stream"
            if spec["nowait"]:
                while True:
                    try:
                        sink = batcher.stream_nowait(i) if stream else batcher.submit_nowait(i)
                        break
                    except QueueFullError:
                        await asyncio.sleep(0)
            else:
                sink = await (batcher.stream(i) if stream else batcher.submit(i))
            submitted.append(i)
            sinks[i] = sink
            if stream:
                side_tasks.append(asyncio.ensure_future(consume(i, sink)))
            else:
                sink.add_done_callback(lambda _f, i=i: endings.__setitem__(i, endings.get(i, 0) + 1))
            if spec["cancel"] == "now":
                withdraw(i)
            elif spec["cancel"] == "later":
                side_tasks.append(asyncio.ensure_future(withdraw_later(i)))
            if spec["yield_after"]:
                await asyncio.sleep(0)

    await batcher.start()
    shares = [list(range(len(specs)))[k :: w["producers"]] for k in range(w["producers"])]
    await asyncio.gather(*(produce(s) for s in shares))
    await batcher.stop()
    while side_tasks:
        await side_tasks.pop()
    await ticks(2)  # the futures' done callbacks

    assert violations == []
    assert inside == {}
    assert len(entered) == len(set(entered))  # nobody processed twice
    assert endings == {i: 1 for i in range(len(specs))}  # every future and stream ended exactly once
    assert set(entered) | withdrawn == set(range(len(specs)))  # the rest ran
    for i, sink in sinks.items():
        if isinstance(sink, asyncio.Future) and i not in withdrawn:
            assert (sink.exception() is not None) == specs[i]["fail"]
    # Order within one priority (and one tenant, with fair share): arrival order.
    if w["order"] == "fifo":
        for p in range(4):
            for tenant in ["x", "y", "z", None] if w["fair_share"] else [...]:
                group = [i for i in submitted if priority(i) == p and (tenant is ... or specs[i]["tenant"] == tenant)]
                assert [i for i in entered if i in group] == [i for i in group if i in set(entered)]
    stats = batcher.stats
    assert stats.total_submitted == len(specs) == stats.total_completed + stats.total_cancelled
    assert stats.tokens_by_priority == stats.in_flight_by_priority == stats.queued_by_tenant == {}
    assert stats.queue_depth == stats.in_flight == stats.queued_cost == stats.in_flight_cost == 0
    for tenant in {s["tenant"] for s in specs}:  # admitted: every record that ran, and some withdrawn before it did
        ran = sum(specs[i]["cost"] for i in entered if specs[i]["tenant"] == tenant)
        could = sum(s["cost"] for s in specs if s["tenant"] == tenant)
        assert ran <= stats.admitted_cost_by_tenant.get(tenant, 0) <= could


@pytest.mark.parametrize("examples", sized(100, 300, tier="unit"))
def test_random_workloads_with_priorities_and_tenants_keep_every_rule(examples):
    @settings(SETTINGS, max_examples=examples)
    @given(workloads())
    def check(w):
        run(lambda loop: run_workload(w))

    check()


# Statistics -------------------------------------------------------------------------------------------------


def test_stats_carry_the_cost_held_by_each_priority_and_admitted_for_each_tenant():
    async def main(loop: ClockLoop) -> None:
        engine = Engine()
        async with ContinuousBatcher(engine.generate, max_inflight_cost=10) as batcher:
            futures = [
                batcher.submit_nowait(Job("a", 6, priority=2, hold=True, tenant="x")),
                batcher.submit_nowait(Job("b", 3, priority=0, hold=True, tenant="y")),
                batcher.submit_nowait(Job("c", 5, priority=0, hold=True, tenant="x")),  # queued: 9 + 5 > 10
                batcher.submit_nowait(Job("d", 7, priority=-1, hold=True)),  # the head: queued (shared tenant)
            ]
            await until(lambda: len(engine.running) == 2)
            stats = batcher.stats
            assert stats.tokens_by_priority == {-1: 7, 0: 8, 2: 6}
            assert list(stats.tokens_by_priority) == [-1, 0, 2]  # ascending
            assert stats.in_flight_by_priority == {0: 3, 2: 6}
            assert stats.admitted_cost_by_tenant == {"x": 6, "y": 3} and stats.queued_by_tenant == {"x": 1, None: 1}
            exported = stats.to_dict()
            assert exported["tokens_by_priority"] == {"-1": 7, "0": 8, "2": 6}  # string keys, as JSON has them
            assert exported["in_flight_by_priority"] == {"0": 3, "2": 6}
            assert exported["queued_by_tenant"] == {"x": 1, "None": 1}
            assert json.loads(json.dumps(exported)) == exported
            engine.release("a", "b", "c", "d")
            await asyncio.gather(*futures)
        stats = batcher.stats
        assert stats.tokens_by_priority == stats.in_flight_by_priority == stats.queued_by_tenant == {}
        assert stats.admitted_cost_by_tenant == {"x": 11, "y": 3, None: 7}

    run(main)


# Where priority and tenant come from ------------------------------------------------------------------------


class Level(enum.IntEnum):
    INTERACTIVE = 0
    BATCH = 5


@dataclass
class Tagged:
    priority: Any = 0
    tenant: Any = None


def test_priority_and_tenant_come_from_the_record_or_the_functions_and_are_checked():
    async def main(loop: ClockLoop) -> None:
        async def echo(record: Any) -> Any:
            return record

        async with ContinuousBatcher(echo, fair_share=True) as batcher:
            assert await batcher.submit_nowait(Tagged(Level.BATCH, "key-1")) == Tagged(Level.BATCH, "key-1")
            assert await batcher.submit_nowait("no attributes: priority 0, the shared tenant") is not None
            with pytest.raises(TypeError, match=r"Tagged\.priority must be an int.*str 'high'"):
                batcher.submit_nowait(Tagged("high"))
            with pytest.raises(TypeError, match=r"Tagged\.priority must be an int.*bool True"):
                batcher.submit_nowait(Tagged(True))
            with pytest.raises(TypeError, match=r"Tagged\.priority must be an int.*float 1\.5"):
                await batcher.submit(Tagged(1.5))
            with pytest.raises(TypeError, match=r"Tagged\.tenant must be hashable"):
                batcher.stream_nowait(Tagged(0, ["a", "list"]))
            with pytest.raises(TypeError, match=r"Tagged\.priority"):  # all or nothing: a bad one queues none
                batcher.submit_batch_nowait([Tagged(0), Tagged(None)])
            assert batcher.stats.total_submitted == 2
        async with ContinuousBatcher(echo, priority_fn=lambda r: r["p"], tenant_fn=lambda r: r["t"]) as batcher:
            assert await batcher.submit_nowait({"p": 3, "t": "key-2"}) == {"p": 3, "t": "key-2"}
            with pytest.raises(TypeError, match="priority_fn must be an int"):
                batcher.submit_nowait({"p": "3", "t": None})
            assert batcher.stats.admitted_cost_by_tenant == {"key-2": 1}  # counted by tenant without fair share too
        for fair in (True, False):  # the tenant is read either way: stats count by it
            async with ContinuousBatcher(echo, tenant_fn=lambda r: [r], fair_share=fair) as batcher:
                with pytest.raises(TypeError, match="tenant_fn must be hashable"):
                    batcher.submit_nowait(1)

    run(main)


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"low_priority_share": 0}, ValueError, "low_priority_share"),
        ({"low_priority_share": 1.5}, ValueError, "low_priority_share"),
        ({"low_priority_share": True}, ValueError, "low_priority_share"),
        ({"aging_s": 0}, ValueError, "aging_s"),
        ({"aging_s": "30"}, ValueError, "aging_s"),
        ({"share_hold_s": -1}, ValueError, "share_hold_s"),
        ({"priority_fn": 3}, TypeError, "priority_fn"),
        ({"tenant_fn": "user"}, TypeError, "tenant_fn"),
    ],
)
def test_bad_priority_settings_are_refused_naming_the_parameter(kwargs, error, match):
    with pytest.raises(error, match=match):
        ContinuousBatcher(lambda r: r, **kwargs)


# The computed retry hint ------------------------------------------------------------------------------------


def test_expected_wait_and_retry_after_follow_the_rate_work_leaves_the_engine():
    """One record at a time (budget 10, cost 10 each), finishing one per second: 1.5 records and 15 tokens a
    second over the window once three have left (3 records, 30 tokens from the first to the last, 2 s)."""

    async def main(loop: ClockLoop) -> None:
        engine = Engine()
        async with ContinuousBatcher(
            engine.generate, max_inflight_cost=10, max_inflight=1, max_queue_size=3
        ) as batcher:
            assert batcher.expected_wait(10) == 0.0  # an idle engine admits at once, basis or not
            futures = [batcher.submit_nowait(Job(f"r{i}", 10, hold=True)) for i in range(4)]
            await until(lambda: engine.started == ["r0"])
            assert batcher.expected_wait(10) is None  # it would wait, and nothing has finished: no basis
            with pytest.raises(QueueFullError) as refused:
                batcher.submit_nowait(Job("refused", 10))
            assert refused.value.retry_after_s is None
            for i in range(3):  # r0, r1, r2 leave at +1 s, +2 s, +3 s; each lets the next in
                loop.now += 1.0
                engine.release(f"r{i}")
                await until(lambda i=i: f"r{i + 1}" in engine.running)
            futures.append(batcher.submit_nowait(Job("r4", 10, hold=True)))
            # r3 runs (the whole budget), r4 is queued: before 10 more go, 20 tokens and 2 records must leave.
            assert batcher.expected_wait(10) == pytest.approx(20 / 15) == pytest.approx(2 / 1.5)
            assert batcher.expected_wait(0, 1) == pytest.approx(2 / 1.5)  # the count decides
            assert batcher.expected_wait(25, 1) == pytest.approx(35 / 15)  # the cost decides
            futures.append(batcher.submit_nowait(Job("r5", 10, hold=True)))
            futures.append(batcher.submit_nowait(Job("r6", 10, hold=True)))  # the queue is full now
            with pytest.raises(QueueFullError) as refused:
                batcher.submit_batch_nowait([Job("x", 10), Job("y", 5)])
            assert refused.value.retry_after_s == pytest.approx(5 / 1.5)  # 5 records (45 tokens: 3 s)
            assert refused.value.retry_after_s == batcher.expected_wait(15, 2)
            loop.now += 2.0  # nothing leaves for 2 s: the rate halves (3 over 4 s)
            assert batcher.expected_wait(10) == pytest.approx(40 / 7.5)
            loop.now += 20.0  # past the window: no basis again
            assert batcher.expected_wait(10) is None
            with pytest.raises(ValueError, match="cost"):
                batcher.expected_wait(-1)
            engine.release(*(f"r{i}" for i in range(7)))
            await asyncio.gather(*futures)

    run(main)


def test_max_queue_wait_refusals_carry_the_expected_wait_as_retry_after():
    async def main(loop: ClockLoop) -> None:
        engine = Engine()
        async with ContinuousBatcher(engine.generate, max_inflight=1, max_queue_wait_s=1.5) as batcher:
            futures = [batcher.submit_nowait(Job(f"r{i}", 1, hold=True)) for i in range(2)]
            await until(lambda: engine.started == ["r0"])
            loop.now += 1.0
            engine.release("r0")  # one record a second from here
            await until(lambda: "r1" in engine.running)
            loop.now += 1.0
            futures.append(batcher.submit_nowait(Job("r2", 1, hold=True)))  # 1 s: r1 must leave
            with pytest.raises(QueueFullError, match=r"max_queue_wait_s=1\.5") as refused:
                batcher.submit_nowait(Job("r3", 1, hold=True))  # 2 s: r1 and r2 must leave
            assert refused.value.retry_after_s == pytest.approx(2.0)
            engine.release("r1", "r2")
            await asyncio.gather(*futures)

    run(main)


def test_dynamic_batcher_expected_wait_and_retry_after_follow_its_drain_rate():
    """Batches of two records of cost 10 finish 2 s apart: 2 records and 20 tokens a second over the window
    (4 records and 40 tokens from the first batch's end to the second's). While the one processing loop is
    busy, new records wait for everything queued ahead of them."""

    async def main(loop: ClockLoop) -> None:
        gates: list[asyncio.Event] = []

        async def process(batch: list[int]) -> list[int]:
            gates.append(gate := asyncio.Event())
            await gate.wait()
            return batch

        async with DynamicBatcher(
            process,
            cost_estimator=lambda r: 10,
            target_batch_cost=1_000,
            max_batch_size=2,
            batch_timeout_s=0,
            max_queue_size=3,
            prefetch_batches=1,
        ) as batcher:
            futures = [batcher.submit_nowait(i) for i in range(2)]
            await until(lambda: len(gates) == 1)  # the loop is busy with [0, 1]
            futures += [batcher.submit_nowait(i) for i in range(2, 4)]
            await until(lambda: batcher.stats.queue_depth == 0)  # [2, 3] cut ahead, into the prefetch buffer
            assert batcher.expected_wait(10) is None  # nothing has finished: no basis
            for i in range(4, 7):
                futures.append(batcher.submit_nowait(i))
            with pytest.raises(QueueFullError) as refused:
                batcher.submit_nowait(99)
            assert refused.value.retry_after_s is None
            for k in range(2):  # [0, 1] ends at +1 s, [2, 3] at +3 s
                loop.now += 1.0 + k
                gates[k].set()
                await until(lambda k=k: len(gates) == k + 2)
            stats = batcher.stats
            assert (stats.queue_depth, stats.queued_cost) == (1, 10)  # [4, 5] in process_fn, [6] queued
            assert batcher.expected_wait(10) == pytest.approx((10 + 10) / 20)
            assert batcher.expected_wait(10, 3) == pytest.approx((1 + 3) / 2)  # the count decides
            futures += [batcher.submit_nowait(i) for i in range(7, 9)]
            with pytest.raises(QueueFullError) as refused:
                batcher.submit_batch_nowait([97, 98])
            assert refused.value.retry_after_s == pytest.approx((3 + 2) / 2)
            for gate in gates[2:]:
                gate.set()
            while not all(f.done() for f in futures):
                for gate in gates:
                    gate.set()
                await asyncio.sleep(0)
            assert await asyncio.gather(*futures) == [*range(9)]

    run(main)


def test_queue_full_error_keeps_its_plain_form_and_its_hint_through_pickling():
    plain = QueueFullError("queue full")
    assert str(plain) == "queue full" and plain.retry_after_s is None
    hinted = pickle.loads(pickle.dumps(QueueFullError("overloaded", retry_after_s=2.5)))
    assert str(hinted) == "overloaded" and hinted.retry_after_s == 2.5


def test_stop_with_timeout_withdraws_queued_records_of_every_priority_without_starting_them():
    async def main(loop: ClockLoop) -> None:
        engine = Engine()
        batcher = ContinuousBatcher(engine.generate, max_inflight_cost=10, fair_share=True)
        await batcher.start()
        stuck = batcher.submit_nowait(Job("stuck", 5, priority=1, hold=True))
        head = batcher.submit_nowait(Job("head", 10, priority=0))  # does not fit beside "stuck"
        # These fit, but wait behind the head; withdrawing the head first must not let them start.
        queued = [head, *(batcher.submit_nowait(Job(f"q{k}", 1, priority=2, tenant=k % 2)) for k in range(3))]
        await until(lambda: engine.started == ["stuck"])
        stopping = asyncio.ensure_future(batcher.stop(timeout=5))
        await ticks(5)
        loop.now += 6  # past the timeout
        await stopping
        for future in [stuck, *queued]:
            with pytest.raises(BatcherStoppedError):
                future.result()
        assert engine.started == ["stuck"] and engine.running == {}
        stats = batcher.stats
        assert stats.total_admitted == 1  # not even admitted (and cancelled) while the rest were withdrawn
        assert stats.tokens_by_priority == {} and stats.queue_depth == stats.in_flight == 0

    run(main)


def test_the_admitted_cost_by_tenant_keeps_the_most_recent_tenants_only():
    """A unique tenant on every request (an OpenAI ``user`` per call) must not grow the statistics without bound."""

    async def main(loop: ClockLoop) -> None:
        async def echo(record: Any) -> Any:
            return record

        async with ContinuousBatcher(echo, max_queue_size=2 * TENANTS_KEPT) as batcher:
            tagged = [Tagged(0, f"user-{i}") for i in range(TENANTS_KEPT + 5)]
            await asyncio.gather(*batcher.submit_batch_nowait(tagged))
            await batcher.submit_nowait(Tagged(0, "user-6"))  # admitted again: the most recent now
            kept = batcher.stats.admitted_cost_by_tenant
        assert len(kept) == TENANTS_KEPT and "user-4" not in kept and "user-5" in kept and list(kept)[-1] == "user-6"
        assert kept["user-6"] == 2 and kept[f"user-{TENANTS_KEPT + 4}"] == 1

    run(main)
