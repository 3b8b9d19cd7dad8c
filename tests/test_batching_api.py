"""The reference API (flyte.extras) is kept: code written for it works with only the import changed."""

from __future__ import annotations

import asyncio
import inspect
from dataclasses import dataclass, fields

import pytest

from batching import BatchStats, DynamicBatcher, Prompt, TokenBatcher

REFERENCE_DYNAMIC = {
    "cost_estimator": None,
    "target_batch_cost": 32_000,
    "max_batch_size": 256,
    "min_batch_size": 1,
    "batch_timeout_s": 0.05,
    "max_queue_size": 5_000,
    "prefetch_batches": 2,
    "default_cost": 1,
}
REFERENCE_TOKEN = {
    "inference_fn": None,
    "process_fn": None,
    "token_estimator": None,
    "cost_estimator": None,
    "target_batch_tokens": None,
    "target_batch_cost": 32_000,
    "default_token_estimate": None,
    "default_cost": 1,
    "max_batch_size": 256,
    "min_batch_size": 1,
    "batch_timeout_s": 0.05,
    "max_queue_size": 5_000,
    "prefetch_batches": 2,
}


async def echo(batch: list) -> list:
    return list(batch)


@pytest.mark.parametrize(("cls", "expected"), [(DynamicBatcher, REFERENCE_DYNAMIC), (TokenBatcher, REFERENCE_TOKEN)])
def test_constructor_keeps_the_reference_parameters_and_defaults(cls, expected):
    params = inspect.signature(cls.__init__).parameters
    for name, default in expected.items():
        assert name in params, name
        assert params[name].default == default, name


def test_token_batcher_needs_a_function():
    with pytest.raises(TypeError, match="inference_fn"):
        TokenBatcher()


async def test_token_batcher_is_subscriptable_and_runs_the_seed_example():
    async def inference(batch: list[Prompt]) -> list[str]:
        return [f"Response to: {p.text}" for p in batch]

    async with TokenBatcher[Prompt, str](
        inference_fn=inference, target_batch_tokens=32_000, batch_timeout_s=0.01
    ) as batcher:
        f1 = await batcher.submit(Prompt(text="What is Flyte?"))
        f2 = await batcher.submit(Prompt(text="Explain dynamic batching."))
        assert await asyncio.gather(f1, f2) == [
            "Response to: What is Flyte?",
            "Response to: Explain dynamic batching.",
        ]


async def test_process_fn_keyword_and_positional_both_work():
    async with (
        TokenBatcher(process_fn=echo, batch_timeout_s=0.001) as a,
        DynamicBatcher(echo, batch_timeout_s=0.001) as b,
    ):
        assert await (await a.submit("x")) == "x"
        assert await (await b.submit("y")) == "y"


async def test_submit_before_start_says_what_to_do():
    batcher = DynamicBatcher(echo)
    with pytest.raises(RuntimeError, match=r"start\(\)"):
        await batcher.submit(1)


async def test_start_twice_raises_and_restart_after_stop_works():
    batcher = DynamicBatcher(echo, batch_timeout_s=0.001)
    assert not batcher.is_running
    await batcher.start()
    assert batcher.is_running
    with pytest.raises(RuntimeError, match="already running"):
        await batcher.start()
    await batcher.stop()
    assert not batcher.is_running
    await batcher.stop()  # idempotent
    await batcher.start()
    assert await (await batcher.submit(5)) == 5
    await batcher.stop()
    assert batcher.stats.total_completed == 1


async def test_submit_batch_returns_one_future_per_record():
    async with DynamicBatcher(echo, batch_timeout_s=0.001) as batcher:
        futures = await batcher.submit_batch(["a", "b", "c"], estimated_cost=[1, 2, 3])
        assert await asyncio.gather(*futures) == ["a", "b", "c"]
        assert batcher.stats.total_batch_cost == 6


@dataclass
class Costed:
    cost: int

    def estimate_cost(self) -> int:
        return self.cost


@dataclass
class Tokened(Costed):
    tokens: int = 0

    def estimate_tokens(self) -> int:
        return self.tokens


def test_cost_precedence_dynamic_batcher():
    batcher = DynamicBatcher(echo, default_cost=7)
    assert batcher._cost_of(Costed(3), 11) == 11  # explicit first
    assert batcher._cost_of(Costed(3), None) == 3  # then the record's estimate_cost()
    assert batcher._cost_of("plain", None) == 7  # then the default
    assert batcher._cost_of(Tokened(3, 5), None) == 3  # DynamicBatcher ignores estimate_tokens
    with_fn = DynamicBatcher(echo, cost_estimator=lambda r: 42)
    assert with_fn._cost_of(Costed(3), None) == 42  # the estimator function beats the protocol
    assert with_fn._cost_of(Costed(3), 1) == 1


def test_cost_precedence_token_batcher():
    batcher = TokenBatcher(echo, default_token_estimate=9)
    assert batcher._cost_of(Tokened(3, 5), None) == 5  # estimate_tokens before estimate_cost
    assert batcher._cost_of(Costed(3), None) == 3
    assert batcher._cost_of(object(), None) == 9
    assert TokenBatcher(echo, token_estimator=lambda r: 99)._cost_of(Tokened(3, 5), None) == 99
    assert TokenBatcher(echo, cost_estimator=lambda r: 98)._cost_of(Tokened(3, 5), None) == 98
    assert TokenBatcher(echo, target_batch_tokens=100)._target == 100
    assert TokenBatcher(echo, target_batch_cost=50)._target == 50


async def test_token_batcher_submit_takes_estimated_tokens():
    async with TokenBatcher(echo, batch_timeout_s=0.001) as batcher:
        await (await batcher.submit("a", estimated_tokens=40))
        await (await batcher.submit("b", estimated_cost=2))
        futures = await batcher.submit_batch(["c", "d"], estimated_tokens=[3, 4])
        await asyncio.gather(*futures)
        assert batcher.stats.total_batch_cost == 40 + 2 + 3 + 4


def test_prompt_estimates_tokens_as_the_reference_does():
    assert Prompt("What is 2+2?").estimate_tokens() == len("What is 2+2?") // 4 + 1
    assert Prompt("").estimate_tokens() == 1


REFERENCE_STATS = [
    "total_submitted",
    "total_completed",
    "total_batches",
    "total_batch_cost",
    "avg_batch_size",
    "avg_batch_cost",
    "busy_time_s",
    "idle_time_s",
]
BATCH_STATS = [
    *REFERENCE_STATS,
    "total_failed",
    "total_cancelled",
    "total_oversized",
    "queue_depth",
    "queued_cost",
    "in_flight",
    "padding_waste",
    "queue_wait_p50_s",
    "queue_wait_p95_s",
    "queue_wait_p99_s",
    "latency_p50_s",
    "latency_p95_s",
    "latency_p99_s",
    "in_flight_cost",
    "budget",
    "budget_occupancy",
    "mean_budget_occupancy",
    "first_output_p50_s",
    "first_output_p95_s",
    "first_output_p99_s",
]


def test_batch_stats_fields_and_utilization():
    assert [f.name for f in fields(BatchStats)] == BATCH_STATS  # the reference's eight first, in its order
    stats = BatchStats(busy_time_s=3.0, idle_time_s=1.0)
    assert stats.utilization == 0.75
    assert BatchStats().utilization == 0.0
    assert list(stats.to_dict()) == [*BATCH_STATS, "utilization"]
    assert stats.to_dict()["utilization"] == 0.75


async def test_wrong_result_count_fails_that_batch_with_value_error_and_keeps_serving():
    calls = 0

    async def short(batch):
        nonlocal calls
        calls += 1
        return batch[:-1] if calls == 1 else batch

    async with DynamicBatcher(short, batch_timeout_s=0.005, max_batch_size=3) as batcher:
        bad = await batcher.submit_batch([1, 2, 3])
        results = await asyncio.gather(*bad, return_exceptions=True)
        assert all(isinstance(r, ValueError) and "returned 2 results" in str(r) for r in results)
        assert await (await batcher.submit(4)) == 4


async def test_exception_fails_only_its_batch():
    async def fail_on_boom(batch):
        if "boom" in batch:
            raise RuntimeError("engine exploded")
        return batch

    async with DynamicBatcher(fail_on_boom, batch_timeout_s=0.005, max_batch_size=2) as batcher:
        futures = await batcher.submit_batch(["a", "boom", "c", "d"])
        results = await asyncio.gather(*futures, return_exceptions=True)
        assert isinstance(results[0], RuntimeError) and isinstance(results[1], RuntimeError)
        assert results[2:] == ["c", "d"]
        stats = batcher.stats
        assert stats.total_failed == 2 and stats.total_completed == 4
