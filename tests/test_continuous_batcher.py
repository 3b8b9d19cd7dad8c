"""ContinuousBatcher: continuous, token-budgeted admission in front of a (fake) continuously batching engine.

Focused tests plus hypothesis properties. The engines here are fakes that step on event-loop ticks
(``asyncio.sleep(0)``) or on events the test sets; what is asserted is measured by the fakes themselves
(cost and count inside ``process_fn``, start order), not read back from the batcher. No wall-clock
thresholds: the few tiny sleeps only let a ``max_wait_s`` deadline pass, and the time averages in the
statistics are checked over phases of a tenth of a second, with wide margins.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, fields
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from batching import (
    AdmissionStats,
    BatcherStoppedError,
    ContinuousBatcher,
    QueueFullError,
    RecordStream,
    peak_cost,
)

from .conftest import sized

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


async def until(predicate: Callable[[], bool], ticks: int = 5_000) -> None:
    """Let the loop run (ticks, not seconds) until ``predicate()`` holds; fail if it never does."""
    for _ in range(ticks):
        if predicate():
            return
        await asyncio.sleep(0)
    raise AssertionError("condition never became true")


async def ticks(n: int) -> None:
    for _ in range(n):
        await asyncio.sleep(0)


@dataclass(eq=False)
class Req:
    """A request for :class:`FakeEngine`: its cost, how many outputs it streams, whether it holds at the end."""

    name: str
    cost: int
    tokens: int = 1
    hold: bool = False  # after its outputs, wait for FakeEngine.release(name) before finishing

    def estimate_tokens(self) -> int:
        return self.cost


class FakeEngine:
    """A fake continuously batching engine: each request streams ``tokens`` outputs, one per event-loop tick,
    then (if ``hold``) waits until the test releases it. It records what entered, finished and was
    cancelled, and the cost and count in flight inside it."""

    def __init__(self) -> None:
        self.started: list[str] = []
        self.finished: list[str] = []
        self.cancelled: list[str] = []
        self.running: dict[str, int] = {}
        self.max_count = 0
        self._gates: dict[str, asyncio.Event] = {}

    def gate(self, name: str) -> asyncio.Event:
        return self._gates.setdefault(name, asyncio.Event())

    def release(self, *names: str) -> None:
        for name in names:
            self.gate(name).set()

    async def generate(self, req: Req) -> AsyncIterator[str]:
        self.started.append(req.name)
        self.running[req.name] = req.cost
        self.max_count = max(self.max_count, len(self.running))
        try:
            for i in range(req.tokens):
                await asyncio.sleep(0)
                yield f"{req.name}:{i}"
            if req.hold:
                await self.gate(req.name).wait()
        except asyncio.CancelledError:
            self.cancelled.append(req.name)
            raise
        finally:
            del self.running[req.name]
        self.finished.append(req.name)


# 1 + 2 + 9. Random workloads: budget, exactly-once endings, FIFO, stream order --------------------------------


@st.composite
def workloads(draw: st.DrawFn) -> dict[str, Any]:
    n = draw(st.integers(1, 30))
    record = st.fixed_dictionaries(
        {
            "cost": st.integers(0, 30),
            "outputs": st.integers(0, 4),
            "ticks": st.integers(0, 3),  # event-loop ticks before each output
            "kind": st.sampled_from(["gen", "coro"]),  # async generator, or async def returning one result
            "fail": st.sampled_from([None, None, None, 0, 1, 2]),  # raise after this many outputs
            "sink": st.sampled_from(["future", "stream"]),
            # withdraw: at once after submit / once process_fn produced k outputs / after some ticks
            "cancel": st.sampled_from([None, None, None, "now", 0, 1, 2, "later"]),
            "cancel_ticks": st.integers(0, 8),
            "nowait": st.booleans(),
            "yield_after": st.booleans(),
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
        "max_wait_s": draw(st.sampled_from([0.0, 0.001, 60.0])),
    }


def expected_outputs(spec: dict[str, Any], i: int) -> tuple[list[str], type[BaseException] | None]:
    """What record ``i`` streams and how it ends (error type, or None) if nobody withdraws it."""
    if spec["kind"] == "coro":
        return ([], RuntimeError) if spec["fail"] is not None else ([f"{i}:0"], None)
    fail = spec["fail"]
    produced = spec["outputs"] if fail is None else min(fail, spec["outputs"])
    outputs = [f"{i}:{k}" for k in range(produced)]
    if fail is not None:
        return outputs, RuntimeError
    return outputs, (ValueError if not outputs else None)  # no output at all: the batcher reports it


async def run_workload(w: dict[str, Any]) -> None:
    specs = w["records"]
    budget, max_inflight = w["budget"], w["max_inflight"]
    inside: dict[int, int] = {}  # record -> cost, while its process_fn runs (measured here)
    violations: list[str] = []
    started: list[int] = []
    exits: dict[int, str] = {}  # record -> "done" / "failed" / "cancelled"
    sinks: dict[int, Any] = {}
    cancel_requested: set[int] = set()

    def enter(i: int) -> None:
        started.append(i)
        inside[i] = specs[i]["cost"]
        if len(inside) > max_inflight:
            violations.append(f"{len(inside)} in flight > max_inflight={max_inflight}")
        if len(inside) > 1 and sum(inside.values()) > budget:
            violations.append(f"cost {sum(inside.values())} > budget {budget} with {sorted(inside)} in flight")

    def withdraw_future(i: int) -> None:
        sink = sinks[i]
        if isinstance(sink, asyncio.Future):
            cancel_requested.add(i)
            sink.cancel()

    async def fake_generate(i: int) -> AsyncIterator[str]:
        spec = specs[i]
        enter(i)
        outcome = "failed"
        try:
            for k in range(spec["outputs"]):
                if spec["cancel"] == k:
                    withdraw_future(i)
                if spec["fail"] == k:
                    raise RuntimeError("injected")
                await ticks(spec["ticks"])
                yield f"{i}:{k}"
            if spec["fail"] is not None:
                raise RuntimeError("injected")
            outcome = "done"
        except asyncio.CancelledError:
            outcome = "cancelled"
            raise
        finally:
            del inside[i]
            exits[i] = outcome

    async def fake_complete(i: int) -> str:
        spec = specs[i]
        enter(i)
        outcome = "failed"
        try:
            if spec["cancel"] == 0:
                withdraw_future(i)
            await ticks(spec["ticks"])
            if spec["fail"] is not None:
                raise RuntimeError("injected")
            outcome = "done"
            return f"{i}:0"
        except asyncio.CancelledError:
            outcome = "cancelled"
            raise
        finally:
            del inside[i]
            exits[i] = outcome

    def process(i: int) -> Any:
        return fake_generate(i) if specs[i]["kind"] == "gen" else fake_complete(i)

    batcher = ContinuousBatcher(
        process,
        cost_estimator=lambda i: specs[i]["cost"],
        max_inflight_cost=budget,
        max_inflight=max_inflight,
        max_queue_size=w["queue"],
        order=w["order"],
        lookahead=w["lookahead"],
        max_wait_s=w["max_wait_s"],
    )
    enqueued: list[int] = []
    endings: dict[int, int] = {}
    consumed: dict[int, list[str]] = {}
    stream_end: dict[int, Any] = {}  # record -> "ok" / the exception class / "withdrawn"
    withdrawn_streams: set[int] = set()
    side_tasks: list[asyncio.Task] = []

    async def consume(i: int, stream: RecordStream) -> None:
        got = consumed.setdefault(i, [])
        spec = specs[i]
        try:
            async for output in stream:
                got.append(output)
                if isinstance(spec["cancel"], int) and len(got) == spec["cancel"] and not stream.done:
                    withdrawn_streams.add(i)
                    await stream.aclose()
                    assert stream.done
                    stream_end[i] = "withdrawn"
                    break
            else:
                stream_end[i] = "ok"
        except Exception as exc:  # not BaseException: a withdrawn stream must not raise CancelledError
            stream_end[i] = type(exc)
        endings[i] = endings.get(i, 0) + 1

    async def cancel_later(i: int, n: int) -> None:
        await ticks(n)
        sink = sinks[i]
        if isinstance(sink, RecordStream):
            if not sink.done:
                withdrawn_streams.add(i)
                await sink.aclose()
                assert sink.done
        else:
            cancel_requested.add(i)
            sink.cancel()

    async def produce(ids: list[int]) -> None:
        for i in ids:
            spec = specs[i]
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
            enqueued.append(i)
            sinks[i] = sink
            if stream:
                side_tasks.append(asyncio.ensure_future(consume(i, sink)))
            else:
                sink.add_done_callback(lambda _f, i=i: endings.__setitem__(i, endings.get(i, 0) + 1))
            if spec["cancel"] == "now":
                if stream:
                    withdrawn_streams.add(i)
                    await sink.aclose()
                else:
                    cancel_requested.add(i)
                    sink.cancel()
            elif spec["cancel"] == "later":
                side_tasks.append(asyncio.ensure_future(cancel_later(i, spec["cancel_ticks"])))
            if spec["yield_after"]:
                await asyncio.sleep(0)

    await batcher.start()
    shares = [list(range(len(specs)))[k :: w["producers"]] for k in range(w["producers"])]
    # The timeouts only turn a hang into a failure.
    await asyncio.wait_for(asyncio.gather(*(produce(s) for s in shares)), timeout=10)
    await asyncio.wait_for(batcher.stop(), timeout=10)
    await asyncio.wait_for(asyncio.gather(*side_tasks), timeout=10)

    # 1. Budget and count, as measured inside process_fn.
    assert violations == []
    # Every process_fn that started also ended; none was left running.
    assert inside == {}
    assert set(exits) == set(started)
    assert len(started) == len(set(started))  # nobody was processed twice
    for i, outcome in exits.items():
        if outcome == "cancelled":
            assert i in cancel_requested or i in withdrawn_streams  # only withdrawn records are cancelled

    # 2 + 9. Every future and stream ended exactly once, with what it should have.
    assert sorted(enqueued) == list(range(len(specs)))
    assert endings == {i: 1 for i in range(len(specs))}
    failed = 0
    for i, spec in enumerate(specs):
        outputs, error = expected_outputs(spec, i)
        sink = sinks[i]
        withdrawn = i in cancel_requested or i in withdrawn_streams
        if isinstance(sink, asyncio.Future):
            assert sink.done()
            if sink.cancelled():
                assert i in cancel_requested
                continue
            if error is None:
                assert sink.exception() is None and sink.result() == outputs[-1]
            else:
                assert isinstance(sink.exception(), error)
                failed += 1
        else:
            assert sink.done
            got = consumed[i]
            assert got == outputs[: len(got)]  # in order, nothing skipped
            if i in withdrawn_streams:
                continue
            assert not withdrawn
            assert got == outputs
            if error is None:
                assert stream_end[i] == "ok"
            else:
                assert stream_end[i] is error
                failed += 1

    # 3. Strict FIFO: records entered process_fn in the order they entered the queue.
    if w["order"] == "fifo":
        entered = set(started)
        assert started == [i for i in enqueued if i in entered]

    # 8. The statistics add up.
    stats = batcher.stats
    cancelled = sum(1 for f in sinks.values() if isinstance(f, asyncio.Future) and f.cancelled())
    assert stats.total_submitted == len(specs)
    assert stats.total_submitted == stats.total_completed + stats.total_cancelled
    assert stats.total_cancelled == cancelled + len(withdrawn_streams)
    assert stats.total_failed == failed
    assert stats.in_flight == stats.in_flight_cost == stats.queue_depth == stats.queued_cost == 0


@pytest.mark.parametrize("examples", sized(100, 400, tier="unit"))
def test_random_workloads_keep_the_budget_and_end_every_record_once(examples):
    @settings(SETTINGS, max_examples=examples)
    @given(workloads())
    def run(w):
        asyncio.run(run_workload(w))

    run()


# 1. Oversized records run alone ----------------------------------------------------------------------------


async def test_a_record_costlier_than_the_budget_runs_alone():
    engine = FakeEngine()
    async with ContinuousBatcher(engine.generate, max_inflight_cost=10) as batcher:
        small = batcher.submit_nowait(Req("small", 4, hold=True))
        big = batcher.submit_nowait(Req("big", 25, hold=True))
        tiny = batcher.submit_nowait(Req("tiny", 0))  # FIFO: waits behind the big head
        await until(lambda: engine.started == ["small"])
        engine.release("small")
        await until(lambda: "big" in engine.started)
        await ticks(20)
        assert engine.running == {"big": 25}  # nothing beside it, not even a record of cost 0
        assert batcher.stats.budget_occupancy == 2.5  # the one case the budget is exceeded
        engine.release("big")
        assert await asyncio.gather(small, big, tiny) == ["small:0", "big:0", "tiny:0"]
    assert engine.max_count == 1


# 3. Admission order -----------------------------------------------------------------------------------------


async def test_fifo_head_waits_even_when_a_smaller_record_behind_it_fits():
    engine = FakeEngine()
    async with ContinuousBatcher(engine.generate, max_inflight_cost=10, order="fifo") as batcher:
        futures = [
            batcher.submit_nowait(Req("a", 6, hold=True)),
            batcher.submit_nowait(Req("head", 8)),  # does not fit beside "a"
            batcher.submit_nowait(Req("small", 1)),  # would fit, but must not overtake
        ]
        await until(lambda: engine.started == ["a"])
        await ticks(20)
        assert engine.started == ["a"]
        assert batcher.stats.queue_depth == 2
        engine.release("a")
        await asyncio.gather(*futures)
    assert engine.started == ["a", "head", "small"]


async def test_length_aware_lets_cheaper_records_overtake_within_the_window():
    engine = FakeEngine()
    async with ContinuousBatcher(
        engine.generate, max_inflight_cost=10, order="length_aware", lookahead=8, max_wait_s=60
    ) as batcher:
        futures = [batcher.submit_nowait(Req(name, cost)) for name, cost in [("a", 10), ("b", 8), ("c", 2), ("d", 1)]]
        await asyncio.gather(*futures)
    # "a" ran alone; then the cheapest first: d (1) and c (2) together, b (8) once there was room.
    assert engine.started == ["a", "d", "c", "b"]


async def test_length_aware_window_limits_how_far_a_record_may_overtake():
    engine = FakeEngine()
    async with ContinuousBatcher(
        engine.generate, max_inflight_cost=10, order="length_aware", lookahead=2, max_wait_s=60
    ) as batcher:
        futures = [
            batcher.submit_nowait(Req(name, cost))
            for name, cost in [("a", 10), ("b", 8), ("c", 5), ("d", 1)]  # "d" is outside the window at first
        ]
        await asyncio.gather(*futures)
    assert engine.started == ["a", "c", "d", "b"]  # "d" overtakes "b" only once it is in the window


async def test_length_aware_aging_admits_an_old_head_next():
    engine = FakeEngine()
    async with ContinuousBatcher(
        engine.generate, max_inflight_cost=10, order="length_aware", lookahead=8, max_wait_s=0.001
    ) as batcher:
        first = batcher.submit_nowait(Req("a", 10, hold=True))
        rest = [batcher.submit_nowait(Req(name, cost)) for name, cost in [("b", 8), ("c", 2), ("d", 1)]]
        await until(lambda: engine.started == ["a"])
        await asyncio.sleep(0.01)  # the head "b" is now older than max_wait_s
        engine.release("a")
        await asyncio.gather(first, *rest)
    # Without aging it would be d, c, b (the test above); the old head goes first instead.
    assert engine.started[:2] == ["a", "b"]


async def test_length_aware_aging_keeps_a_stream_of_cheap_records_from_starving_an_expensive_one():
    engine = FakeEngine()
    async with ContinuousBatcher(
        engine.generate, max_inflight_cost=10, order="length_aware", lookahead=64, max_wait_s=0.002
    ) as batcher:
        futures = [batcher.submit_nowait(Req("cheap-0", 1, tokens=3))]
        futures.append(batcher.submit_nowait(Req("big", 10)))
        for n in range(1, 400):  # keep the engine busy with cheap records that would always fit
            if "big" in engine.started:
                break
            futures += [batcher.submit_nowait(Req(f"cheap-{n}-{k}", 1, tokens=3)) for k in range(2)]
            await asyncio.sleep(0.0005)
        assert "big" in engine.started
        await asyncio.gather(*futures)
    assert len(engine.finished) == len(futures)


# 4. Continuous: cost returns the moment a record ends -------------------------------------------------------


async def test_a_short_record_gives_its_cost_back_while_long_ones_still_run():
    engine = FakeEngine()
    async with ContinuousBatcher(engine.generate, max_inflight_cost=30) as batcher:
        long1 = batcher.submit_nowait(Req("long1", 10, tokens=2, hold=True))
        short = batcher.submit_nowait(Req("short", 10, tokens=1))
        long2 = batcher.submit_nowait(Req("long2", 10, tokens=2, hold=True))
        queued = batcher.submit_nowait(Req("queued", 10, tokens=1, hold=True))
        assert await short == "short:0"
        await until(lambda: "queued" in engine.started)
        # "queued" took the short one's place without waiting for a "batch" of long ones to end.
        assert set(engine.running) == {"long1", "long2", "queued"}
        assert engine.finished == ["short"]
        engine.release("long1", "long2", "queued")
        await asyncio.gather(long1, long2, queued)


@pytest.mark.parametrize("sink", ["future", "stream"])
async def test_withdrawing_a_running_record_frees_its_budget_at_once(sink):
    engine = FakeEngine()
    async with ContinuousBatcher(engine.generate, max_inflight_cost=20) as batcher:
        if sink == "future":
            running = batcher.submit_nowait(Req("running", 20, tokens=1, hold=True))
        else:
            running = batcher.stream_nowait(Req("running", 20, tokens=1, hold=True))
        waiting = batcher.submit_nowait(Req("waiting", 20))
        await until(lambda: engine.started == ["running"])
        await ticks(10)
        assert engine.started == ["running"]  # "waiting" only fits once "running" is gone
        if sink == "future":
            running.cancel()  # withdrawn by the future's done callback, on the next loop iteration
        else:
            assert await running.__anext__() == "running:0"
            await running.aclose()
            assert running.done
            assert batcher.inflight_cost == 20  # "waiting" was admitted inside aclose()
        assert await waiting == "waiting:0"
        assert engine.cancelled == ["running"]  # the withdrawn process_fn saw CancelledError
        assert "running" not in engine.finished
    stats = batcher.stats
    assert stats.total_cancelled == 1 and stats.total_completed == 1 and stats.total_submitted == 2


async def test_withdrawing_a_queued_record_never_starts_it():
    engine = FakeEngine()
    async with ContinuousBatcher(engine.generate, max_inflight_cost=10) as batcher:
        first = batcher.submit_nowait(Req("first", 10, hold=True))
        gone_future = batcher.submit_nowait(Req("gone-future", 5))
        gone_stream = batcher.stream_nowait(Req("gone-stream", 5))
        kept = batcher.submit_nowait(Req("kept", 5))
        gone_future.cancel()
        await gone_stream.aclose()
        assert gone_stream.done
        await until(lambda: batcher.stats.queue_depth == 1)
        engine.release("first")
        assert await kept == "kept:0"
        await first
    assert engine.started == ["first", "kept"]
    assert batcher.stats.total_cancelled == 2 and batcher.stats.total_submitted == 4


async def test_a_future_cancelled_just_before_its_record_finishes_is_counted_once():
    async def fake_instant(record: str) -> str:  # finishes in its task's first step
        return record

    async with ContinuousBatcher(fake_instant) as batcher:
        future = batcher.submit_nowait("x")  # admitted at once; its task runs before the cancel callback
        future.cancel()
        await ticks(5)
    stats = batcher.stats
    assert stats.total_submitted == 1
    assert stats.total_submitted == stats.total_completed + stats.total_cancelled


# 5. Stop -------------------------------------------------------------------------------------------------------


async def test_stop_drains_queued_and_running_records():
    engine = FakeEngine()
    batcher = ContinuousBatcher(engine.generate, max_inflight_cost=10, max_inflight=2)
    await batcher.start()
    futures = [batcher.submit_nowait(Req(f"r{i}", 4, tokens=3)) for i in range(6)]
    streams = [batcher.stream_nowait(Req(f"s{i}", 4, tokens=2)) for i in range(3)]
    await batcher.stop()
    assert not batcher.is_running
    assert [f.result() for f in futures] == [f"r{i}:2" for i in range(6)]
    for i, stream in enumerate(streams):
        assert stream.done
        assert [x async for x in stream] == [f"s{i}:0", f"s{i}:1"]
    assert engine.cancelled == [] and engine.running == {}
    stats = batcher.stats
    assert stats.total_completed == stats.total_submitted == 9 and stats.total_cancelled == 0


async def test_two_stops_at_once_both_return_once_the_work_is_drained():
    engine = FakeEngine()
    batcher = ContinuousBatcher(engine.generate, max_inflight_cost=10, max_inflight=1)
    await batcher.start()
    futures = [batcher.submit_nowait(Req(f"r{i}", 4, tokens=2)) for i in range(3)]
    first, second = asyncio.ensure_future(batcher.stop()), asyncio.ensure_future(batcher.stop())
    await asyncio.wait_for(asyncio.gather(first, second), 10)  # the first used to wait forever
    assert not batcher.is_running and [f.result() for f in futures] == [f"r{i}:1" for i in range(3)]


async def test_stop_with_timeout_ends_stuck_records_with_batcher_stopped_error():
    engine = FakeEngine()
    batcher = ContinuousBatcher(engine.generate, max_inflight_cost=10)
    await batcher.start()
    stuck = batcher.submit_nowait(Req("stuck", 10, hold=True))
    stuck_stream = batcher.stream_nowait(Req("stuck-stream", 0, tokens=1, hold=True))  # cost 0 fits beside
    queued = batcher.submit_nowait(Req("queued", 10))  # the head: waits for room
    queued_stream = batcher.stream_nowait(Req("queued-stream", 0))  # fits, but FIFO keeps it behind the head
    await until(lambda: len(engine.started) == 2)
    assert await stuck_stream.__anext__() == "stuck-stream:0"
    await batcher.stop(timeout=0.01)
    assert not batcher.is_running
    for future in (stuck, queued):
        with pytest.raises(BatcherStoppedError):
            future.result()
    for stream in (stuck_stream, queued_stream):
        with pytest.raises(BatcherStoppedError):
            await stream.__anext__()
    # stop() returned only after the stuck process_fns were cancelled and had unwound.
    assert sorted(engine.cancelled) == ["stuck", "stuck-stream"]
    assert engine.running == {}
    assert engine.started == ["stuck", "stuck-stream"]  # the queued ones never reached the engine
    stats = batcher.stats
    assert stats.in_flight == stats.queue_depth == stats.in_flight_cost == 0
    assert stats.total_submitted == 4 == stats.total_completed + stats.total_cancelled
    assert stats.total_cancelled == 2  # the queued two: never admitted, not even while stop() withdrew the rest
    assert stats.total_failed == stats.total_completed == 2  # the stuck two ended with BatcherStoppedError
    assert stats.total_admitted == 2 and stats.total_admitted_cost == 10  # the stuck two entered process_fn


async def test_stop_fails_producers_waiting_on_a_full_queue_and_refuses_new_records():
    engine = FakeEngine()
    batcher = ContinuousBatcher(engine.generate, max_inflight_cost=10, max_queue_size=1)
    await batcher.start()
    running = batcher.submit_nowait(Req("running", 10, hold=True))
    queued = batcher.submit_nowait(Req("queued", 10))
    waiting = asyncio.ensure_future(batcher.submit(Req("waiting", 1)))
    await ticks(10)
    assert not waiting.done()
    stopping = asyncio.ensure_future(batcher.stop())
    await ticks(2)
    with pytest.raises(BatcherStoppedError):
        await waiting
    with pytest.raises(BatcherStoppedError):  # while stopping
        batcher.submit_nowait(Req("late", 1))
    with pytest.raises(BatcherStoppedError):
        await batcher.stream(Req("late", 1))
    assert batcher.is_running
    engine.release("running")
    await stopping
    assert running.result() == "running:0" and queued.result() == "queued:0"
    with pytest.raises(RuntimeError, match=r"start\(\)"):  # after stop
        batcher.submit_nowait(Req("after", 1))
    with pytest.raises(RuntimeError, match=r"start\(\)"):
        await batcher.submit(Req("after", 1))
    assert "waiting" not in engine.started


# 6. Bounded queue ----------------------------------------------------------------------------------------------


async def test_submit_waits_for_queue_room_and_nowait_forms_raise_queue_full():
    engine = FakeEngine()
    async with ContinuousBatcher(engine.generate, max_inflight_cost=10, max_queue_size=2) as batcher:
        first = batcher.submit_nowait(Req("first", 10, hold=True))
        queued = [batcher.submit_nowait(Req(f"q{i}", 10, hold=True)) for i in range(2)]
        with pytest.raises(QueueFullError):
            batcher.submit_nowait(Req("refused", 1))
        with pytest.raises(QueueFullError):
            batcher.stream_nowait(Req("refused", 1))
        waiter = asyncio.ensure_future(batcher.submit(Req("waiter", 1)))
        stream_waiter = asyncio.ensure_future(batcher.stream(Req("stream-waiter", 1)))
        await ticks(20)
        assert not waiter.done() and not stream_waiter.done()
        assert batcher.stats.queue_depth == 2
        engine.release("first")  # "q0" is admitted: one slot frees, for the producer that waited longest
        await until(waiter.done)
        assert not stream_waiter.done()
        assert batcher.stats.queue_depth == 2  # never more than max_queue_size
        engine.release("q0", "q1", "waiter")
        stream = await stream_waiter
        assert [x async for x in stream] == ["stream-waiter:0"]
        assert await (await waiter) == "waiter:0"
        await asyncio.gather(first, *queued)
    assert "refused" not in engine.started
    assert batcher.stats.total_submitted == 5


@pytest.mark.parametrize("method", ["submit_batch_nowait", "stream_batch_nowait"])
async def test_batch_nowait_forms_are_all_or_nothing(method):
    engine = FakeEngine()
    async with ContinuousBatcher(engine.generate, max_inflight_cost=10, max_queue_size=3) as batcher:
        first = batcher.submit_nowait(Req("first", 10, hold=True))
        queued = batcher.submit_nowait(Req("queued", 10))
        enqueue = getattr(batcher, method)
        with pytest.raises(QueueFullError):
            enqueue([Req("x", 1), Req("y", 1), Req("z", 1)])  # 2 slots left, 3 asked for
        assert batcher.stats.queue_depth == 1
        assert batcher.stats.total_submitted == 2
        with pytest.raises(ValueError, match="estimated_cost"):
            enqueue([Req("x", 1), Req("y", 1)], estimated_cost=[1, -1])  # a bad cost queues none
        assert batcher.stats.queue_depth == 1
        sinks = enqueue([Req("x", 1), Req("y", 1)])
        assert len(sinks) == 2 and batcher.stats.queue_depth == 3
        engine.release("first")
        if method == "submit_batch_nowait":
            assert await asyncio.gather(*sinks) == ["x:0", "y:0"]
        else:
            assert [[x async for x in sinks[0]], [x async for x in sinks[1]]] == [["x:0"], ["y:0"]]
        await asyncio.gather(first, queued)
    assert engine.started == ["first", "queued", "x", "y"]


# 7. The peak estimate ------------------------------------------------------------------------------------------


def simulated_peak(running: list[tuple[int, int]]) -> int:
    """Brute force: step by step, each item adds one token until it has added all it may, then frees all."""
    peak, step = 0, 0
    while True:
        alive = [held + step for held, remaining in running if step <= remaining]
        if not alive:
            return peak
        peak = max(peak, sum(alive))
        step += 1


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 50), st.integers(0, 30)), max_size=10))
def test_peak_cost_matches_a_step_by_step_simulation(running):
    assert peak_cost(running) == simulated_peak(running)


def test_peak_cost_example():
    assert peak_cost([(100, 10), (100, 50)]) == 220
    assert peak_cost([]) == 0


@dataclass(eq=False)
class Growing:
    """A request holding ``prompt`` tokens at once that grows by one token per engine step up to
    ``max_tokens``; it exposes ``estimate_growth()`` for the peak estimate."""

    name: int
    prompt: int
    max_tokens: int

    def estimate_tokens(self) -> int:
        return self.prompt + self.max_tokens

    def estimate_growth(self) -> int:
        return self.max_tokens


class FakeLockstepEngine:
    """A fake continuous-batching engine that the test steps: each step, every request in it produces one
    token (an output ``(name, tokens so far)``); after the step, the requests that reached ``max_tokens``
    leave together. Requests progress in lockstep, as in an engine's decode steps."""

    def __init__(self) -> None:
        self.active: dict[int, list[Any]] = {}  # name -> [request, tokens so far, inbox]
        self.acks = 0
        self.left = 0

    async def generate(self, req: Growing) -> AsyncIterator[tuple[int, int]]:
        inbox: asyncio.Queue = asyncio.Queue()
        self.active[req.name] = [req, 0, inbox]
        try:
            while (output := await inbox.get()) is not None:
                yield output
                self.acks += 1  # the batcher has taken this output (and its progress)
        finally:
            self.left += 1

    def held(self) -> list[tuple[int, int]]:
        return [(req.prompt + done, req.max_tokens - done) for req, done, _ in self.active.values()]

    async def run(self, batcher: ContinuousBatcher) -> dict[str, int]:
        """Step until everything queued has run; the largest count, tokens held and peak estimate seen."""
        seen = {"count": 0, "held": 0, "peak": 0}
        while True:
            await until(lambda: len(self.active) == batcher.stats.in_flight)  # the admitted have joined
            if not self.active:
                assert batcher.stats.queue_depth == 0
                return seen
            seen["count"] = max(seen["count"], len(self.active))
            seen["peak"] = max(seen["peak"], peak_cost(self.held()))
            self.acks = 0
            for entry in self.active.values():
                entry[1] += 1
                entry[2].put_nowait((entry[0].name, entry[1]))
            await until(lambda: self.acks == len(self.active))
            seen["held"] = max(seen["held"], sum(held for held, _ in self.held()))
            leaving = [name for name, (req, done, _) in self.active.items() if done == req.max_tokens]
            target = self.left + len(leaving)
            for name in leaving:
                self.active.pop(name)[2].put_nowait(None)
            await until(lambda target=target: self.left == target)


async def run_lockstep(requests: list[Growing], budget: int, peak_estimate: bool) -> dict[str, int]:
    engine = FakeLockstepEngine()
    async with ContinuousBatcher(
        engine.generate,
        max_inflight_cost=budget,
        max_queue_size=len(requests),
        peak_estimate=peak_estimate,
        progress_fn=lambda output: output[1],
    ) as batcher:
        futures = batcher.submit_batch_nowait(requests)
        seen = await asyncio.wait_for(engine.run(batcher), timeout=30)
        results = await asyncio.gather(*futures)
    assert results == [(r.name, r.max_tokens) for r in requests]
    return seen


async def test_peak_estimate_admits_more_records_on_a_workload_with_growth():
    # Long records (10 + 40) and short ones (10 + 5): the short ones leave long before a long one peaks.
    requests = [Growing(i, 10, 40 if i % 4 == 0 else 5) for i in range(24)]
    plain = await run_lockstep(requests, budget=100, peak_estimate=False)
    peak = await run_lockstep(requests, budget=100, peak_estimate=True)
    assert plain["held"] <= 100 and peak["held"] <= 100
    assert peak["peak"] <= 100
    assert peak["count"] > plain["count"]


@settings(SETTINGS, max_examples=150)
@given(
    st.lists(st.tuples(st.integers(0, 20), st.integers(1, 12)), min_size=1, max_size=16),
    st.integers(0, 40),
)
def test_peak_estimate_never_lets_what_runs_outgrow_the_budget(shapes, slack):
    requests = [Growing(i, prompt, grow) for i, (prompt, grow) in enumerate(shapes)]
    budget = max(r.estimate_tokens() for r in requests) + slack  # no record is costlier than the budget
    seen = asyncio.run(run_lockstep(requests, budget, peak_estimate=True))
    assert seen["peak"] <= budget
    assert seen["held"] <= budget


# 8. Statistics -------------------------------------------------------------------------------------------------


async def test_stats_for_streamed_records():
    engine = FakeEngine()
    occupancy: list[float] = []
    async with ContinuousBatcher(engine.generate, max_inflight_cost=12, max_inflight=3) as batcher:
        streams = [batcher.stream_nowait(Req(f"s{i}", 1 + i % 5, tokens=4)) for i in range(12)]

        async def consume(stream: RecordStream) -> list[str]:
            out = []
            async for x in stream:
                occupancy.append(batcher.stats.budget_occupancy)
                out.append(x)
            return out

        outputs = await asyncio.gather(*(consume(s) for s in streams))
        stats = batcher.stats
    assert outputs == [[f"s{i}:{k}" for k in range(4)] for i in range(12)]
    assert all(0 <= o <= 1 for o in occupancy) and max(occupancy) > 0.5
    assert 0 < stats.utilization <= 1
    assert 0 < stats.first_output_p50_s <= stats.first_output_p95_s <= stats.first_output_p99_s
    # 9 of the 12 waited in the queue for a place (3 in flight at most); nobody waited longer than it took.
    assert 0 < stats.queue_wait_p50_s <= stats.queue_wait_p95_s <= stats.queue_wait_p99_s
    assert stats.queue_wait_p50_s < stats.first_output_p50_s <= stats.latency_p50_s
    assert stats.queue_wait_p99_s < stats.first_output_p99_s <= stats.latency_p99_s
    assert 0 < stats.mean_budget_occupancy <= 1
    assert stats.in_flight == 0 and stats.in_flight_cost == 0 and stats.budget_occupancy == 0
    assert stats.budget == 12
    assert stats.total_submitted == 12 == stats.total_completed + stats.total_cancelled
    assert stats.total_admitted == 12
    assert stats.total_admitted_cost == sum(1 + i % 5 for i in range(12))
    assert 1 < stats.mean_in_flight < 3.001  # never more than max_inflight=3, more than one most of the time
    assert engine.max_count <= 3


ADMISSION_FIELDS = [
    "total_submitted",
    "total_admitted",
    "total_completed",
    "total_failed",
    "total_cancelled",
    "total_admitted_cost",
    "queue_depth",
    "queued_cost",
    "in_flight",
    "in_flight_cost",
    "budget",
    "budget_occupancy",
    "mean_budget_occupancy",
    "mean_in_flight",
    "busy_time_s",
    "idle_time_s",
    "queue_wait_p50_s",
    "queue_wait_p95_s",
    "queue_wait_p99_s",
    "latency_p50_s",
    "latency_p95_s",
    "latency_p99_s",
    "first_output_p50_s",
    "first_output_p95_s",
    "first_output_p99_s",
    "tokens_by_priority",
    "in_flight_by_priority",
    "admitted_cost_by_tenant",
    "queued_by_tenant",
]


def test_admission_stats_has_its_fields_in_order_and_exports_them():
    assert [f.name for f in fields(AdmissionStats)] == ADMISSION_FIELDS
    stats = AdmissionStats(busy_time_s=3.0, idle_time_s=1.0, mean_in_flight=2.5)
    assert stats.utilization == 0.75 and AdmissionStats().utilization == 0.0
    exported = stats.to_dict()
    assert list(exported) == [*ADMISSION_FIELDS, "utilization"]
    assert exported["utilization"] == 0.75 and exported["mean_in_flight"] == 2.5


async def test_admission_stats_count_what_entered_process_fn_and_its_cost():
    engine = FakeEngine()
    async with ContinuousBatcher(engine.generate, max_inflight_cost=10) as batcher:
        first = batcher.submit_nowait(Req("first", 6, hold=True))
        running = batcher.stream_nowait(Req("running", 3, hold=True))  # fits beside "first": 9 of 10
        queued = batcher.submit_nowait(Req("queued", 8))  # does not fit: waits
        last = batcher.submit_nowait(Req("last", 1))  # would fit, but FIFO keeps it behind "queued"
        assert isinstance(batcher.stats, AdmissionStats)
        await until(lambda: engine.started == ["first", "running"])
        stats = batcher.stats
        assert (stats.total_submitted, stats.total_admitted, stats.total_admitted_cost) == (4, 2, 9)
        assert (stats.queue_depth, stats.queued_cost, stats.in_flight, stats.in_flight_cost) == (2, 9, 2, 9)
        assert stats.budget == 10 and stats.budget_occupancy == 0.9
        queued.cancel()  # withdrawn while queued: never admitted, so "last" is admitted in its place
        await until(lambda: "last" in engine.started)
        await running.aclose()  # withdrawn while running: it was admitted, and its cost counted
        engine.release("first")
        assert await asyncio.gather(first, last) == ["first:0", "last:0"]
    stats = batcher.stats
    assert engine.started == ["first", "running", "last"]
    assert (stats.total_submitted, stats.total_admitted, stats.total_admitted_cost) == (4, 3, 6 + 3 + 1)
    assert (stats.total_completed, stats.total_cancelled, stats.total_failed) == (2, 2, 0)


async def test_mean_in_flight_is_the_time_average_of_records_in_flight_while_any_are():
    """Four records in flight for a phase, then nothing for as long, then two for a phase: 3 on average
    over the busy time (not 2 over the whole running time, nor 2.17 over the admissions)."""
    phase = 0.1
    engine = FakeEngine()
    async with ContinuousBatcher(engine.generate, max_inflight=8) as batcher:
        for size, tag in ((4, "a"), (2, "b")):
            names = [f"{tag}{i}" for i in range(size)]
            futures = batcher.submit_batch_nowait([Req(name, 1, hold=True) for name in names])
            await until(lambda size=size: len(engine.running) == size)
            await asyncio.sleep(phase)  # the engine works on them: what is averaged
            engine.release(*names)
            await asyncio.gather(*futures)
            assert batcher.stats.in_flight == 0
            await asyncio.sleep(phase)  # idle
        stats = batcher.stats
    assert stats.total_admitted == 6 and engine.max_count == 4
    assert stats.mean_in_flight == pytest.approx(3, abs=0.25)
    assert 2 * phase <= stats.busy_time_s < 3 * phase
    assert stats.idle_time_s >= 2 * phase
    assert stats.utilization == pytest.approx(stats.busy_time_s / (stats.busy_time_s + stats.idle_time_s))


# 9. Streams ------------------------------------------------------------------------------------------------------


async def test_stream_raises_the_error_after_the_outputs_before_it():
    async def fake_failing(record: int) -> AsyncIterator[int]:
        for k in range(record):
            await asyncio.sleep(0)
            yield k
        raise RuntimeError(f"engine failed after {record}")

    async with ContinuousBatcher(fake_failing) as batcher:
        async with batcher.stream_nowait(3) as stream:
            got = []
            with pytest.raises(RuntimeError, match="after 3"):
                async for x in stream:
                    got.append(x)
            assert got == [0, 1, 2]
            with pytest.raises(RuntimeError, match="after 3"):  # it stays ended
                await stream.__anext__()
        future = batcher.submit_nowait(2)
        with pytest.raises(RuntimeError, match="after 2"):
            await future
    assert batcher.stats.total_failed == 2


async def test_stream_of_an_async_def_and_of_a_generator_without_output():
    async def fake_one(record: str) -> str:
        await asyncio.sleep(0)
        return record.upper()

    async def fake_silent(record: str) -> AsyncIterator[str]:
        await asyncio.sleep(0)
        return
        yield  # an async generator that yields nothing

    async with ContinuousBatcher(fake_one) as batcher:
        assert [x async for x in await batcher.stream("hi")] == ["HI"]
        assert await (await batcher.submit("yo")) == "YO"
    async with ContinuousBatcher(fake_silent) as batcher:
        stream = await batcher.stream("x")
        with pytest.raises(ValueError, match="no output"):
            async for _ in stream:
                pass


async def test_a_reader_that_fell_behind_takes_the_waiting_outputs_joined_and_a_prompt_one_each_alone():
    produced = asyncio.Event()

    async def fake_tokens(record: int) -> AsyncIterator[str]:
        for k in range(record):
            yield f"t{k}"
            if k == 3:
                produced.set()  # four outputs made; the reader below has not run since the first
                await ticks(50)
            await asyncio.sleep(0)
        yield "END"

    def join(earlier: str, later: str) -> str | None:
        return None if later == "END" else f"{earlier}+{later}"

    async with ContinuousBatcher(fake_tokens, coalesce_fn=join) as batcher:
        stream = batcher.stream_nowait(6)
        first = await stream.__anext__()
        await produced.wait()  # the reader is busy elsewhere while t1..t3 arrive
        behind = await stream.__anext__()
        rest = [x async for x in stream]
        assert first == "t0"
        assert behind == "t1+t2+t3"  # one output for the three that waited
        assert rest == ["t4", "t5", "END"]  # read as they came: nothing was held back to be joined; END apart
        assert batcher.stats.total_completed == 1
    with pytest.raises(TypeError, match="coalesce_fn"):
        ContinuousBatcher(fake_tokens, coalesce_fn="join")  # type: ignore[arg-type]


def join_tokens(earlier: str, later: str) -> str | None:
    return None if later == "END" else f"{earlier}+{later}"


class Tokens:
    """A fake engine whose one record emits a token each time the test calls :meth:`emit`, then ``END``."""

    def __init__(self) -> None:
        self.queue: asyncio.Queue[str | None] = asyncio.Queue()

    def emit(self, *tokens: str | None) -> None:
        for token in tokens:
            self.queue.put_nowait(token)

    async def generate(self, record: int) -> AsyncIterator[str]:
        while (token := await self.queue.get()) is not None:
            yield token
        yield "END"


@contextlib.asynccontextmanager
async def paced(interval_s: float) -> AsyncIterator[tuple[Tokens, RecordStream]]:
    """A stream paced at ``interval_s`` whose first token has been read (it goes at once), and its engine."""
    engine = Tokens()
    async with ContinuousBatcher(engine.generate, coalesce_fn=join_tokens, stream_interval_s=interval_s) as batcher:
        stream = batcher.stream_nowait(1)
        engine.emit("t0")
        assert await stream.__anext__() == "t0"
        yield engine, stream


async def test_a_paced_stream_holds_what_comes_within_its_interval_and_its_end_wakes_it_at_once():
    async with paced(1.0) as (engine, stream):  # far longer than the test: only the end can release what it holds
        reader = asyncio.ensure_future(stream.__anext__())
        engine.emit("t1", "t2")
        await ticks(200)
        assert not reader.done()  # held: they came within the interval of t0
        engine.emit(None)  # the end: what is held goes at once, and the end after it
        await until(reader.done)
        assert reader.result() == "t1+t2"
        assert [x async for x in stream] == ["END"]


async def test_a_paced_stream_sends_what_it_held_when_its_interval_is_over():
    async with paced(0.2) as (engine, stream):
        engine.emit("t1", "t2")
        assert await asyncio.wait_for(stream.__anext__(), 30) == "t1+t2"  # the interval's timer, not the end
        assert not stream.done
        engine.emit(None)
        assert [x async for x in stream] == ["END"]


async def test_a_paced_stream_withdrawn_while_it_holds_outputs_ends_its_reader():
    async with paced(1.0) as (engine, stream):
        reader = asyncio.ensure_future(stream.__anext__())
        engine.emit("t1")
        await ticks(50)
        assert not reader.done()
        await stream.aclose()  # wakes the reader at once (the interval is far longer than the test)
        await until(reader.done)
        assert reader.result() == "t1"  # what it held, then the end
        with pytest.raises(BatcherStoppedError, match="withdrawn"):
            await stream.__anext__()


async def test_without_coalesce_fn_a_stream_is_not_paced():
    engine = Tokens()
    async with ContinuousBatcher(engine.generate, stream_interval_s=1.0) as batcher:
        stream = batcher.stream_nowait(1)
        engine.emit("t0", "t1")
        assert await stream.__anext__() == "t0"
        reader = asyncio.ensure_future(stream.__anext__())
        await until(reader.done)  # at once, well within the interval: nothing to join them with, no hold
        assert reader.result() == "t1"
        engine.emit(None)
        assert [x async for x in stream] == ["END"]
    with pytest.raises(ValueError, match="stream_interval_s"):
        ContinuousBatcher(engine.generate, stream_interval_s=-0.1)


@pytest.mark.parametrize("where", ["queued", "running"])
async def test_a_stream_withdrawn_by_another_task_ends_its_reader_with_batcher_stopped_error(where):
    engine = FakeEngine()
    async with ContinuousBatcher(engine.generate, max_inflight_cost=10) as batcher:
        blocker = batcher.submit_nowait(Req("blocker", 10, hold=True)) if where == "queued" else None
        stream = batcher.stream_nowait(Req("s", 5, tokens=1, hold=True))
        got: list[str] = []

        async def read() -> None:
            async for x in stream:
                got.append(x)

        reader = asyncio.ensure_future(read())
        if where == "running":
            await until(lambda: got == ["s:0"])
        else:
            await ticks(10)
        await stream.aclose()  # e.g. the client went away; the reader is another task
        if blocker is not None:
            engine.release("blocker")
            await blocker
        await asyncio.wait([reader])
        assert not reader.cancelled()  # the reader's task was not cancelled: it must not end as if it were
        with pytest.raises(BatcherStoppedError, match="withdrawn"):
            reader.result()
    assert engine.started == (["blocker"] if where == "queued" else ["s"])
    assert batcher.stats.total_cancelled == 1


async def test_max_queue_wait_sheds_what_would_wait_too_long_and_serves_the_rest():
    async def fake_slow_engine(record: int) -> int:
        await asyncio.sleep(0.05)  # one record at a time: about 20 records leave per second
        return record

    async with ContinuousBatcher(fake_slow_engine, max_inflight=1, max_queue_wait_s=0.2) as batcher:
        first = [batcher.submit_nowait(i) for i in range(3)]  # nothing has finished: no estimate, no refusal
        await asyncio.gather(*first[:2])
        accepted, refused = [], []
        for i in range(3, 53):
            try:
                accepted.append(batcher.submit_nowait(i))
            except QueueFullError as exc:
                refused.append(str(exc))
        assert accepted and refused  # the first few fit the objective, the rest are refused at once
        assert all("max_queue_wait_s=0.2" in message for message in refused)
        assert len(accepted) < 20  # roughly 0.2 s of queue at ~20 records/s, not the whole burst
        assert await asyncio.gather(*first, *accepted) == [0, 1, 2, *range(3, 3 + len(accepted))]
        assert batcher.stats.total_submitted == 3 + len(accepted)  # refused records were never submitted


@pytest.mark.parametrize(
    ("setting", "value"),
    [
        ("max_queue_wait_s", 0),
        ("max_queue_wait_s", -1.0),
        ("max_queue_wait_s", True),
        ("max_queue_wait_s", "2"),
        ("max_wait_s", -0.5),
        ("max_wait_s", float("nan")),
        ("max_wait_s", False),
        ("max_wait_s", None),
    ],
)
def test_bad_waits_are_refused_by_name(setting, value):
    """``max_queue_wait_s`` must be above 0 (or None: no objective), ``max_wait_s`` at least 0; neither a bool."""
    with pytest.raises(ValueError, match=f"{setting} must be a number in .*got {value!r}"):
        ContinuousBatcher(lambda r: r, **{setting: value})


def test_waits_in_range_are_kept():
    batcher = ContinuousBatcher(lambda r: r, max_wait_s=0, max_queue_wait_s=1.5)
    assert (batcher._max_wait, batcher._max_queue_wait) == (0.0, 1.5)
    assert ContinuousBatcher(lambda r: r, max_queue_wait_s=None)._max_queue_wait is None


async def test_a_streams_reader_can_wait_for_its_admission_and_see_why_it_ended():
    engine = FakeEngine()
    batcher = ContinuousBatcher(engine.generate, max_inflight_cost=10, max_inflight=1)
    await batcher.start()
    running = batcher.stream_nowait(Req("running", 0, tokens=1, hold=True))
    queued = batcher.stream_nowait(Req("queued", 0, tokens=1))
    await asyncio.wait_for(running.admitted(), 10)  # admitted at once: it runs
    waiting = asyncio.ensure_future(queued.admitted())
    await until(lambda: engine.started == ["running"])
    assert not waiting.done() and running.failure() is None  # the queued one waits for the running one's place
    await queued.aclose()  # withdrawn while queued: its admission never comes, and it says why
    with pytest.raises(BatcherStoppedError, match="withdrawn"):
        await asyncio.wait_for(waiting, 10)
    assert isinstance(queued.failure(), BatcherStoppedError)
    await batcher.stop(timeout=0.01)
    assert isinstance(running.failure(), BatcherStoppedError)  # stopped while it ran
    await running.admitted()  # it was admitted, whatever ended it later
