"""Hypothesis properties: for random costs, limits, timeouts, interleavings, cancellations and failures,
every future resolves exactly once, no batch breaks its limits, and the statistics add up."""

from __future__ import annotations

import asyncio
from collections import deque

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from batching import DynamicBatcher
from batching.policies import take_fifo, take_length_aware
from batching.rates import DrainRate

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def workloads(draw):
    n = draw(st.integers(1, 60))
    return {
        "costs": draw(st.lists(st.integers(0, 50), min_size=n, max_size=n)),
        "target": draw(st.integers(1, 60)),
        "max_size": draw(st.integers(1, 12)),
        "min_size": draw(st.integers(1, 4)),
        "timeout": draw(st.sampled_from([0.0, 0.0005, 0.002])),
        "queue": draw(st.integers(1, 30)),
        "producers": draw(st.integers(1, 4)),
        "yields": draw(st.lists(st.booleans(), min_size=n, max_size=n)),
        "cancel": draw(st.lists(st.booleans(), min_size=n, max_size=n)),
        "fail_mod": draw(st.sampled_from([0, 3, 7])),
        "concurrency": draw(st.integers(1, 3)),
        "length_aware": draw(st.booleans()),
        "isolate": draw(st.booleans()),
    }


async def run(w) -> None:
    costs = w["costs"]
    batches: list[list[int]] = []

    async def process(batch: list[int]) -> list[int]:
        batches.append(list(batch))
        await asyncio.sleep(0)
        if w["fail_mod"] and any(r % w["fail_mod"] == 0 for r in batch):
            raise RuntimeError("injected")
        return [r * 2 for r in batch]

    max_size = max(w["max_size"], w["min_size"])
    batcher = DynamicBatcher(
        process,
        cost_estimator=lambda r: costs[r],
        target_batch_cost=w["target"],
        max_batch_size=max_size,
        min_batch_size=w["min_size"],
        batch_timeout_s=w["timeout"],
        max_queue_size=w["queue"],
        max_concurrent_batches=w["concurrency"],
        length_aware=w["length_aware"],
        isolate_failures=w["isolate"],
    )
    resolutions: dict[int, int] = {}
    futures: dict[int, asyncio.Future] = {}
    enqueued: list[int] = []  # the order submit() returned in, i.e. the order records entered the queue

    async def produce(ids: list[int]) -> None:
        for i in ids:
            future = await batcher.submit(i)
            enqueued.append(i)
            futures[i] = future
            future.add_done_callback(lambda _f, i=i: resolutions.__setitem__(i, resolutions.get(i, 0) + 1))
            if w["cancel"][i]:
                future.cancel()
            if w["yields"][i]:
                await asyncio.sleep(0)

    await batcher.start()
    shares = [list(range(len(costs)))[k :: w["producers"]] for k in range(w["producers"])]
    await asyncio.wait_for(asyncio.gather(*(produce(s) for s in shares)), timeout=30)
    await asyncio.wait_for(batcher.stop(), timeout=30)

    # Every future resolved exactly once.
    assert len(futures) == len(costs)
    assert all(f.done() for f in futures.values())
    assert resolutions == {i: 1 for i in range(len(costs))}
    for i, f in futures.items():
        if not f.cancelled() and f.exception() is None:
            assert f.result() == i * 2

    # No batch breaks the limits, except a lone oversized record.
    for batch in batches:
        assert 1 <= len(batch) <= max_size
        assert sum(costs[r] for r in batch) <= w["target"] or len(batch) == 1
    # Cancelled-before-start records never reach process_fn; others reach it (again only on isolation).
    processed = {r for b in batches for r in b}
    assert processed | {i for i, f in futures.items() if f.cancelled()} == set(range(len(costs)))

    # The statistics add up.
    stats = batcher.stats
    assert stats.total_submitted == len(costs)
    assert stats.total_submitted == stats.total_completed + stats.total_cancelled
    assert stats.total_completed == len(processed)
    assert stats.total_batches == len(batches)
    assert stats.total_batch_cost == sum(costs[r] for b in batches for r in b)
    assert stats.queue_depth == stats.in_flight == stats.queued_cost == 0
    assert stats.total_oversized == sum(1 for b in batches if costs[b[0]] > w["target"] and len(b) == 1)
    if not w["length_aware"] and not w["isolate"]:
        assert [r for b in batches for r in b] == [r for r in enqueued if r in processed]  # FIFO


@SETTINGS
@given(workloads())
def test_random_workloads_resolve_every_future_once_within_limits(w):
    asyncio.run(run(w))


class _Done:
    def done(self) -> bool:
        return False


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.integers(0, 100), min_size=1, max_size=80),
    st.integers(1, 150),
    st.integers(1, 20),
    st.integers(1, 40),
    st.sampled_from([0, 0, 1, 16, 64, 500]),
)
@pytest.mark.parametrize("padded", [False, True], ids=["summed", "padded"])
def test_policies_respect_budget_and_order(padded, costs, target, max_size, lookahead, overhead):
    for policy in ("fifo", "length_aware"):
        queue = deque((i, c, _Done(), float(i)) for i, c in enumerate(costs))
        taken: list[int] = []
        rounds = 0
        while queue:
            rounds += 1
            head = queue[0][0]
            if policy == "fifo":
                batch, cost = take_fifo(queue, target, max_size, padded)
            else:
                batch, cost = take_length_aware(queue, target, max_size, lookahead, padded, overhead)
            ids = [e[0] for e in batch]
            if policy == "length_aware" and padded and overhead and len(batch) > 1:
                # Each record joined only if it raised the useful share: the batch's is above its head's alone.
                head_cost, padded_cost = batch[0][1], len(batch) * max(e[1] for e in batch)
                assert cost * (head_cost + overhead) > head_cost * (padded_cost + overhead)
            assert ids and ids[0] == head  # the oldest record is always served next
            assert ids == sorted(ids)  # batches are handed over in arrival order
            assert cost == sum(e[1] for e in batch)
            assert len(batch) <= max_size
            budgeted = len(batch) * max(e[1] for e in batch) if padded else cost
            assert budgeted <= target or len(batch) == 1
            if policy == "fifo" and queue and len(batch) < max_size:  # FIFO stops only where the next won't fit
                grown = [*batch, queue[0]]
                more = len(grown) * max(e[1] for e in grown) if padded else cost + queue[0][1]
                assert more > target
            taken.extend(ids)
            remaining = [e[0] for e in queue]
            assert remaining == sorted(remaining)  # the rest keep their order
        assert sorted(taken) == list(range(len(costs)))
        if policy == "fifo":
            assert taken == list(range(len(costs)))
        assert rounds <= len(costs)


def test_a_batch_overhead_keeps_a_far_longer_record_out_of_a_padded_batch():
    """Four records of about 30 tokens and one of 120 fit a 1,024-token padded budget together (5 x 120), but
    padded to 120 the short ones would be three quarters padding: with a batch costing 64 tokens' worth whatever
    its size, the long one waits for a batch of its own; many records of one length still fill the budget."""

    def queue_of(costs: list[int]) -> deque:
        return deque((i, c, _Done(), float(i)) for i, c in enumerate(costs))

    queue = queue_of([30, 29, 31, 120, 28])
    batch, cost = take_length_aware(queue, 1024, 64, 64, padded=True, overhead=64)
    assert [e[0] for e in batch] == [0, 1, 2, 4] and cost == 118
    assert [e[0] for e in queue] == [3]
    batch, _ = take_length_aware(queue_of([30, 29, 31, 120, 28]), 1024, 64, 64, padded=True)
    assert len(batch) == 5  # no overhead: the budget alone cuts
    batch, _ = take_length_aware(queue_of([30] * 40), 1024, 64, 64, padded=True, overhead=64)
    assert len(batch) == 1024 // 30  # equal lengths: the budget still fills


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.tuples(st.floats(0, 5), st.integers(0, 4), st.integers(0, 50)), max_size=40),
    st.floats(0, 30),
    st.integers(-20, 200),
    st.integers(-5, 20),
)
def test_drain_rate_running_sums_match_a_recount_of_the_window(events, later, cost_over, count_over):
    """The rate window keeps running sums (O(1) amortized per record); they must equal a recount of what
    left within the window, and the wait the slower of cost and records at that rate."""
    rate = DrainRate(window_s=10.0)
    now, seen = 0.0, []
    for gap, count, cost in events:
        now += gap
        rate.note(now, count, cost)
        seen.append((now, count, cost))
    now += later
    window = [event for event in seen if event[0] >= now - 10.0]
    wait = rate.wait(now, cost_over, count_over)
    if cost_over <= 0 and count_over <= 0:
        assert wait == 0.0
    elif not window:
        assert wait is None
    else:
        span = max(now - window[0][0], 1e-3)
        cost, count = sum(e[2] for e in window), sum(e[1] for e in window)
        by_cost = cost_over * span / cost if cost_over > 0 and cost > 0 else 0.0
        by_count = count_over * span / count if count_over > 0 and count > 0 else 0.0
        assert wait == pytest.approx(max(by_cost, by_count))
