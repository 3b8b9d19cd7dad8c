"""Where the reference is weak, the batcher is correct: one test (or more) per point of issue #2."""

from __future__ import annotations

import asyncio
import functools
import threading
import time
from collections.abc import Callable

import pytest

from batching import BatchCancelledError, BatcherStoppedError, DynamicBatcher, QueueFullError
from batching.batcher import PURGE_INTERVAL_S

from .waits import wait_for

soon = functools.partial(wait_for, timeout=5, interval=0.001)
"""The suite's wait, polled every millisecond: these tests watch a batcher on their own event loop."""


async def echo(batch: list) -> list:
    return list(batch)


def blocked_producers(batcher: DynamicBatcher) -> int:
    """How many producers wait in ``submit`` for a place in the full queue."""
    return len(batcher._admission._waiters)


class Recorder:
    """An async process_fn that records every batch it gets (as lists of records)."""

    def __init__(self) -> None:
        self.batches: list[list] = []

    async def __call__(self, batch: list) -> list:
        self.batches.append(list(batch))
        return list(batch)


# 1. Invalid arguments ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"target_batch_cost": 0}, "target_batch_cost"),
        ({"target_batch_cost": -5}, "target_batch_cost"),
        ({"max_batch_size": 0}, "max_batch_size"),
        ({"min_batch_size": 0}, "min_batch_size"),
        ({"min_batch_size": 5, "max_batch_size": 4}, "min_batch_size"),
        ({"batch_timeout_s": -0.1}, "batch_timeout_s"),
        ({"batch_timeout_s": float("nan")}, "batch_timeout_s"),
        ({"max_queue_size": 0}, "max_queue_size"),
        ({"prefetch_batches": 0}, "prefetch_batches"),
        ({"default_cost": -1}, "default_cost"),
        ({"max_concurrent_batches": 0}, "max_concurrent_batches"),
        ({"lookahead": 0}, "lookahead"),
        ({"batch_overhead": -1}, "batch_overhead"),
        ({"batch_overhead": True}, "batch_overhead"),
        ({"max_batch_size": 2.5}, "max_batch_size"),
    ],
)
def test_invalid_arguments_raise_value_error_naming_the_parameter(kwargs, name):
    with pytest.raises(ValueError, match=name):
        DynamicBatcher(echo, **kwargs)


async def test_negative_and_non_numeric_costs_are_rejected_at_submit():
    async with DynamicBatcher(echo, batch_timeout_s=0.001) as batcher:
        with pytest.raises(ValueError, match="estimated_cost"):
            await batcher.submit("x", estimated_cost=-1)
        with pytest.raises(TypeError, match="estimated_cost"):
            await batcher.submit("x", estimated_cost="ten")
        with pytest.raises(ValueError, match="cost_estimator"):
            DynamicBatcher(echo, cost_estimator=lambda r: -3)._cost_of("x", None)
        with pytest.raises(ValueError, match="estimated_cost has 1 entries but records has 2"):
            await batcher.submit_batch(["a", "b"], estimated_cost=[1])
        # a bad cost anywhere in submit_batch queues nothing
        with pytest.raises(ValueError):
            await batcher.submit_batch(["a", "b"], estimated_cost=[1, -1])
        assert batcher.stats.total_submitted == 0
        assert await (await batcher.submit("ok", estimated_cost=2.2)) == "ok"
        assert batcher.stats.total_batch_cost == 3  # fractional costs round up


# 2. The budget is a ceiling ---------------------------------------------------------------------------


async def test_batches_never_exceed_the_budget_and_oversized_records_run_alone():
    process = Recorder()
    costs = {"a": 6, "b": 5, "big": 25, "c": 4, "d": 6, "e": 10}
    async with DynamicBatcher(
        process, cost_estimator=costs.__getitem__, target_batch_cost=10, batch_timeout_s=0.01
    ) as batcher:
        futures = await batcher.submit_batch(list(costs))
        assert await asyncio.gather(*futures) == list(costs)
    for batch in process.batches:
        total = sum(costs[r] for r in batch)
        assert total <= 10 or batch == ["big"], batch
    assert ["big"] in process.batches
    # The reference would have put "a"+"b" (11) together; we never do.
    assert ["a", "b"] not in process.batches
    assert batcher.stats.total_oversized == 1


# 3. min_batch_size never holds a record past the timeout ----------------------------------------------


async def test_min_batch_size_does_not_hold_records_past_the_timeout():
    process = Recorder()
    async with DynamicBatcher(process, min_batch_size=10, max_batch_size=20, batch_timeout_s=0.02) as batcher:
        started = time.monotonic()
        futures = await batcher.submit_batch([1, 2, 3])
        assert await asyncio.gather(*futures) == [1, 2, 3]
        elapsed = time.monotonic() - started
    assert process.batches == [[1, 2, 3]]  # one batch, in order, no re-enqueueing
    assert elapsed < 5  # generous: the point is it was not held forever (the reference can stall)


async def test_min_batch_size_with_a_full_queue_does_not_deadlock():
    process = Recorder()
    async with DynamicBatcher(
        process, min_batch_size=4, max_batch_size=8, max_queue_size=2, batch_timeout_s=0.005
    ) as batcher:

        async def produce(base: int) -> list:
            futures = [await batcher.submit(base + i) for i in range(5)]
            return await asyncio.gather(*futures)

        results = await asyncio.wait_for(asyncio.gather(produce(0), produce(100)), timeout=30)
    assert results == [[0, 1, 2, 3, 4], [100, 101, 102, 103, 104]]
    assert max(len(b) for b in process.batches) <= 2  # the queue never held more than max_queue_size


# 4. FIFO ----------------------------------------------------------------------------------------------


async def test_records_reach_process_fn_in_submission_order():
    process = Recorder()
    async with DynamicBatcher(
        process,
        cost_estimator=lambda r: r % 7 + 1,
        target_batch_cost=12,
        max_batch_size=5,
        batch_timeout_s=0.002,
    ) as batcher:

        async def produce(start: int) -> None:
            for i in range(start, start + 50):
                await batcher.submit(i)
                if i % 3 == 0:
                    await asyncio.sleep(0)

        await asyncio.gather(produce(0), produce(1000), produce(2000))
    flat = [r for batch in process.batches for r in batch]
    assert sorted(flat) == sorted(list(range(50)) + list(range(1000, 1050)) + list(range(2000, 2050)))
    for start in (0, 1000, 2000):
        mine = [r for r in flat if start <= r < start + 50]
        assert mine == list(range(start, start + 50))


async def test_fifo_is_global_across_producers():
    order: list[int] = []

    async def process(batch):
        order.extend(batch)
        return batch

    async with DynamicBatcher(process, max_batch_size=3, batch_timeout_s=0.001) as batcher:
        futures = [await batcher.submit(i) for i in range(20)]
        await asyncio.gather(*futures)
    assert order == list(range(20))


# 5. Cancelled futures never reach process_fn ----------------------------------------------------------


async def test_cancelled_future_is_dropped_before_its_batch():
    process = Recorder()
    async with DynamicBatcher(process, max_batch_size=10, batch_timeout_s=0.02) as batcher:
        futures = await batcher.submit_batch(list(range(5)))
        futures[1].cancel()
        futures[3].cancel()
        results = await asyncio.gather(*futures, return_exceptions=True)
    assert process.batches == [[0, 2, 4]]
    assert [r for i, r in enumerate(results) if i not in (1, 3)] == [0, 2, 4]
    stats = batcher.stats
    assert stats.total_cancelled == 2
    assert stats.total_submitted == stats.total_completed + stats.total_cancelled == 5


async def test_cancelling_a_waiting_caller_drops_its_record():
    release = asyncio.Event()
    batches: list[list] = []

    async def gated(batch):
        batches.append(list(batch))
        await release.wait()
        return batch

    async with DynamicBatcher(gated, max_batch_size=1, batch_timeout_s=0) as batcher:
        first = await batcher.submit("first")  # occupies process_fn until released
        await soon(lambda: batches == [["first"]], what="the first batch in process_fn")

        async def caller(x):
            return await (await batcher.submit(x))

        waiting = asyncio.ensure_future(caller("gone"))
        # "gone" is queued; its caller awaits it
        await soon(lambda: batcher.stats.total_submitted == 2, what="two submitted")
        waiting.cancel()
        release.set()
        assert await first == "first"
        assert await (await batcher.submit("after")) == "after"
    assert batches == [["first"], ["after"]]
    assert batcher.stats.total_cancelled == 1


async def test_cancelled_queued_records_give_back_their_places_at_once():
    """A full queue whose records were cancelled takes new ones without waiting for the busy engine."""
    release = asyncio.Event()
    entered = asyncio.Event()

    async def stuck(batch):
        entered.set()
        await release.wait()
        return batch

    options = {"max_batch_size": 2, "batch_timeout_s": 0, "max_queue_size": 4, "prefetch_batches": 1}
    async with DynamicBatcher(stuck, **options) as batcher:
        asyncio.get_running_loop().call_later(5, release.set)  # a failed assertion must not hang the exit
        running = await batcher.submit_batch(["a", "b"])
        await entered.wait()  # "a" and "b" are in process_fn, which waits
        prefetched = await batcher.submit_batch(["c", "d"])
        # "c" and "d" were cut early into the prefetch buffer
        await soon(lambda: batcher.stats.in_flight == 4, what="four in flight")
        queued = batcher.submit_batch_nowait(["e", "f", "g", "h"])  # the queue is full now
        with pytest.raises(QueueFullError):
            batcher.submit_nowait("i")
        for future in queued[:3]:
            future.cancel()
        stats = batcher.stats
        assert stats.queue_depth == 1 and stats.queued_cost == 1 and stats.total_cancelled == 3
        # A full queue is rescanned for cancelled records at most every PURGE_INTERVAL_S: once it has been,
        # the cancelled places are free again, while the engine still holds "a" and "b".
        late = await retry_while_full(lambda: batcher.submit_batch_nowait(["j", "k", "l"]), PURGE_INTERVAL_S)
        waiter = asyncio.ensure_future(batcher.submit("m"))  # and the queue is full once more
        await soon(lambda: blocked_producers(batcher) == 1, what="a producer blocked on the full queue")
        assert not waiter.done() and not release.is_set()
        stats = batcher.stats
        assert stats.queue_depth == 4 and stats.total_cancelled == 3
        release.set()
        results = await asyncio.gather(*running, *prefetched, queued[3], *late, await waiter)
    assert results == ["a", "b", "c", "d", "h", "j", "k", "l", "m"]
    assert batcher.stats.total_submitted == batcher.stats.total_completed + 3


async def retry_while_full(submit: Callable[[], list], interval: float, timeout: float = 5.0) -> list:
    """``submit()`` once the queue takes it, trying every ``interval`` s; fail after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return submit()
        except QueueFullError:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(interval / 5)


async def test_reading_stats_leaves_the_queue_as_it_was():
    """``stats`` is a pure read: it neither drops cancelled records from the queue nor changes the batches."""

    async def run(read_stats: bool) -> list[list[str]]:
        release = asyncio.Event()
        batches: list[list[str]] = []

        async def gated(batch):
            batches.append(list(batch))
            await release.wait()
            return batch

        async with DynamicBatcher(gated, max_batch_size=2, batch_timeout_s=0, prefetch_batches=1) as batcher:
            asyncio.get_running_loop().call_later(5, release.set)  # a failed assertion must not hang the exit
            first = await batcher.submit("first")
            await soon(lambda: batches == [["first"]], what="the first batch in process_fn")
            futures = await batcher.submit_batch(["a", "b", "c", "d", "e", "f"])
            # "a" and "b" are prefetched; c, d, e, f queued
            await soon(lambda: len(batcher._queue) == 4, what="four queued")
            futures[3].cancel()  # "d"
            futures[4].cancel()  # "e"
            queue = batcher._queue
            before = list(queue)
            if read_stats:
                stats = batcher.stats
                assert stats.queue_depth == 2 and stats.queued_cost == 2 and stats.total_cancelled == 2
                assert stats.total_submitted == 7 and stats.in_flight == 3
            assert batcher._queue is queue and len(queue) == len(before)
            assert all(now is then for now, then in zip(queue, before))
            release.set()
            await asyncio.gather(first, *futures, return_exceptions=True)
        stats = batcher.stats
        assert stats.total_cancelled == 2 and stats.total_completed == 5 and stats.total_submitted == 7
        return batches

    # Unread, the cancelled records keep their places until their batch is cut, and leave it then.
    assert await run(read_stats=False) == [["first"], ["a", "b"], ["c"], ["f"]]
    assert await run(read_stats=True) == [["first"], ["a", "b"], ["c"], ["f"]]


# 6. Whatever process_fn raises resolves the batch ----------------------------------------------------


async def test_cancelled_error_from_process_fn_fails_the_batch_and_the_batcher_lives():
    calls = 0

    async def aborting(batch):
        nonlocal calls
        calls += 1
        if calls == 1:
            raise asyncio.CancelledError()  # e.g. the engine aborted the request
        return batch

    async with DynamicBatcher(aborting, batch_timeout_s=0.001) as batcher:
        future = await batcher.submit("x")
        with pytest.raises(BatchCancelledError, match="CancelledError"):
            await future
        assert await (await batcher.submit("y")) == "y"


@pytest.mark.parametrize("exc", [KeyError("k"), ZeroDivisionError(), ValueError("v"), TimeoutError()])
async def test_any_exception_resolves_every_future(exc):
    async def raising(batch):
        raise exc

    batcher = DynamicBatcher(raising, batch_timeout_s=0.001, max_batch_size=3)
    await batcher.start()
    futures = await batcher.submit_batch(list(range(7)))
    await asyncio.wait_for(batcher.stop(), timeout=10)
    assert all(f.done() and isinstance(f.exception(), type(exc)) for f in futures)


async def test_stop_with_timeout_aborts_a_hung_process_fn():
    entered = asyncio.Event()

    async def hang(batch):
        entered.set()
        await asyncio.Event().wait()

    batcher = DynamicBatcher(hang, batch_timeout_s=0.001, max_batch_size=2)
    await batcher.start()
    futures = await batcher.submit_batch(list(range(5)))
    await entered.wait()
    await asyncio.wait_for(batcher.stop(timeout=0.05), timeout=10)
    assert not batcher.is_running
    assert all(f.done() and isinstance(f.exception(), BatcherStoppedError) for f in futures)


# 7. A plain process_fn runs in a thread --------------------------------------------------------------


async def test_blocking_process_fn_does_not_stall_the_event_loop():
    threads: list[str] = []

    def blocking_generate(batch):
        threads.append(threading.current_thread().name)
        time.sleep(0.2)  # a blocking model.generate
        return [x * 2 for x in batch]

    ticks = 0

    async def ticker():
        nonlocal ticks
        while True:
            await asyncio.sleep(0.01)
            ticks += 1

    tick_task = asyncio.ensure_future(ticker())
    async with DynamicBatcher(blocking_generate, batch_timeout_s=0.001) as batcher:
        assert await (await batcher.submit(21)) == 42
    tick_task.cancel()
    assert threads and threads[0] != threading.main_thread().name
    assert ticks >= 5  # the loop kept running while the batch blocked its thread for 200 ms


# 8. max_concurrent_batches ----------------------------------------------------------------------------


@pytest.mark.parametrize("concurrency", [1, 3])
async def test_max_concurrent_batches_bounds_batches_inside_process_fn(concurrency):
    inside = 0
    peak = 0

    async def slow(batch):
        nonlocal inside, peak
        inside += 1
        peak = max(peak, inside)
        await asyncio.sleep(0.02)
        inside -= 1
        return batch

    async with DynamicBatcher(
        slow, max_batch_size=2, batch_timeout_s=0.001, max_concurrent_batches=concurrency
    ) as batcher:
        futures = await batcher.submit_batch(list(range(12)))
        assert await asyncio.gather(*futures) == list(range(12))
    assert peak == concurrency


# Backpressure --------------------------------------------------------------------------------------


async def test_submit_waits_when_the_queue_is_full_and_nowait_raises():
    release = asyncio.Event()
    entered = asyncio.Event()

    async def gated(batch):
        entered.set()
        await release.wait()
        return batch

    async with DynamicBatcher(gated, max_batch_size=1, max_queue_size=2, batch_timeout_s=0, prefetch_batches=1) as b:
        first = await b.submit(0)
        await entered.wait()  # taken by the processing loop
        await b.submit(1)
        await soon(lambda: b.stats.in_flight == 2, what="two in flight")  # prefetched as a full batch
        queued = [await b.submit(2), await b.submit(3)]  # fills the queue
        with pytest.raises(QueueFullError, match="max_queue_size=2"):
            b.submit_nowait(4)
        with pytest.raises(QueueFullError):
            b.submit_batch_nowait([4])
        blocked = asyncio.ensure_future(b.submit(4))
        await soon(lambda: blocked_producers(b) == 1, what="a producer blocked on the full queue")
        assert not blocked.done()  # backpressure: the producer waits
        release.set()
        fut4 = await asyncio.wait_for(blocked, 5)
        assert await asyncio.gather(first, *queued, fut4) == [0, 2, 3, 4]


async def test_stop_refuses_producers_blocked_on_a_full_queue():
    release = asyncio.Event()

    async def gated(batch):
        await release.wait()
        return batch

    batcher = DynamicBatcher(gated, max_batch_size=1, max_queue_size=1, batch_timeout_s=0, prefetch_batches=1)
    await batcher.start()
    accepted = [await batcher.submit(i) for i in range(3)]
    blocked = asyncio.ensure_future(batcher.submit(99))
    await soon(lambda: blocked_producers(batcher) == 1, what="a producer blocked on the full queue")
    stopping = asyncio.ensure_future(batcher.stop())
    # stop() began: the waiting producer is refused
    await soon(blocked.done, what="the blocked producer refused")
    with pytest.raises(BatcherStoppedError):
        await blocked
    with pytest.raises(BatcherStoppedError):
        await batcher.submit(100)
    release.set()
    await asyncio.wait_for(stopping, 5)
    assert [f.result() for f in accepted] == [0, 1, 2]  # graceful: everything queued was processed
