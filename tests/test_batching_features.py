"""Beyond the reference: length-aware batching, failure isolation, richer statistics, token estimators."""

from __future__ import annotations

import asyncio
import json
import random
from fractions import Fraction

import pytest

from batching import DynamicBatcher, TokenBatcher
from batching.estimators import HFTokenCounter, heuristic_tokens, text_of
from batching.stats import percentile


def long_tailed_costs(n: int, seed: int = 7) -> list[int]:
    """Mostly short records with a long tail, like real prompts."""
    rng = random.Random(seed)
    return [max(1, min(2000, int(rng.lognormvariate(4.0, 1.0)))) for _ in range(n)]


async def run_workload(costs: list[int], **options) -> DynamicBatcher:
    async def process(batch):
        return batch

    batcher = DynamicBatcher(
        process,
        target_batch_cost=8_000,
        max_batch_size=32,
        batch_timeout_s=0.005,
        max_queue_size=10_000,
        **options,
    )
    async with batcher:
        futures = await batcher.submit_batch(list(range(len(costs))), estimated_cost=costs)
        assert await asyncio.gather(*futures) == list(range(len(costs)))
    return batcher


async def test_length_aware_batching_cuts_padding_waste_sharply():
    costs = long_tailed_costs(3_000)
    fifo = (await run_workload(costs)).stats
    aware = (await run_workload(costs, length_aware=True)).stats
    assert fifo.total_completed == aware.total_completed == len(costs)
    assert fifo.padding_waste > 0.4  # mixed lengths in FIFO order pad a lot
    assert aware.padding_waste < fifo.padding_waste / 4
    assert aware.avg_batch_cost <= 8_000


async def test_length_aware_keeps_the_oldest_record_first_in_line():
    order: list[list[int]] = []

    async def process(batch):
        order.append(batch)
        return batch

    costs = [500, 1, 1, 1, 500, 500, 1, 1]
    async with DynamicBatcher(
        process,
        cost_estimator=lambda i: costs[i],
        target_batch_cost=1_000,
        max_batch_size=3,
        batch_timeout_s=0.01,
        length_aware=True,
    ) as batcher:
        futures = await batcher.submit_batch(list(range(len(costs))))
        await asyncio.gather(*futures)
    # The oldest record (0) leads the first batch, joined by its nearest neighbour in cost that fits the
    # budget (4; 5 would exceed it); each later batch is anchored on the oldest record left.
    assert order == [[0, 4], [1, 2, 3], [5, 6, 7]]
    assert all(costs[i] == 500 for i in order[0])  # the long ones ride together
    assert sorted(i for b in order for i in b) == list(range(len(costs)))


async def test_failure_isolation_fails_only_the_bad_records():
    async def picky(batch):
        if any(r % 5 == 0 for r in batch):
            raise ValueError("bad record in batch")
        return [r * 10 for r in batch]

    async with DynamicBatcher(picky, max_batch_size=8, batch_timeout_s=0.005, isolate_failures=True) as batcher:
        futures = await batcher.submit_batch(list(range(1, 21)))
        results = await asyncio.gather(*futures, return_exceptions=True)
    for r, result in zip(range(1, 21), results):
        if r % 5 == 0:
            assert isinstance(result, ValueError)
        else:
            assert result == r * 10
    stats = batcher.stats
    assert stats.total_failed == 4 and stats.total_completed == 20


async def test_without_isolation_the_whole_batch_fails():
    async def picky(batch):
        if any(r % 5 == 0 for r in batch):
            raise ValueError("bad record in batch")
        return batch

    async with DynamicBatcher(picky, max_batch_size=8, batch_timeout_s=0.005) as batcher:
        futures = await batcher.submit_batch(list(range(1, 9)))
        results = await asyncio.gather(*futures, return_exceptions=True)
    assert all(isinstance(r, ValueError) for r in results)


async def test_stats_snapshot_reports_queue_latency_and_exports_a_plain_dict():
    gate = asyncio.Event()

    async def gated(batch):
        await gate.wait()
        return batch

    async with DynamicBatcher(
        gated, max_batch_size=2, batch_timeout_s=0.001, cost_estimator=lambda r: 10, prefetch_batches=1
    ) as batcher:
        futures = await batcher.submit_batch(list(range(8)))
        for _ in range(5_000):  # until one batch is in process_fn and one prefetched (or fail below)
            if batcher.stats.in_flight == 4:
                break
            await asyncio.sleep(0.001)
        busy = batcher.stats
        assert busy.in_flight == 4  # one batch in process_fn, one prefetched
        assert busy.queue_depth == 4 and busy.queued_cost == 40
        assert busy.total_submitted == 8
        gate.set()
        await asyncio.gather(*futures)
    stats = batcher.stats
    assert stats.queue_depth == 0 and stats.in_flight == 0
    assert stats.total_batches == 4 and stats.avg_batch_size == 2.0 and stats.avg_batch_cost == 20
    assert 0 < stats.latency_p50_s <= stats.latency_p95_s <= stats.latency_p99_s
    assert 0 <= stats.queue_wait_p50_s <= stats.queue_wait_p99_s <= stats.latency_p99_s
    assert 0 < stats.utilization <= 1
    exported = json.loads(json.dumps(stats.to_dict()))
    assert exported["total_completed"] == 8 and "utilization" in exported


@pytest.mark.parametrize("q", [0, 1, 7, 25, 29, 50, 57, 90, 95, 99, 99.9, 100])
def test_percentile_is_the_nearest_rank(q):
    """The stats' percentile is the smallest value with at least q% of the values at or below it, at every
    size: exactly where q% of n is a whole number too (n=102, q=50 is the 51st value, not the 52nd)."""
    for n in range(1, 1001):
        values = [float(i) for i in range(1, n + 1)]  # the value is its own rank
        exact = max(1, -(-Fraction(q).limit_denominator(1000) * n // 100))  # ceil, in exact arithmetic
        assert percentile(values, q) == exact, (n, q)
    assert percentile([], 50) == 0.0


async def test_partial_batches_keep_filling_while_the_engine_is_busy():
    sizes: list[int] = []
    engine_free = asyncio.Event()

    async def slow(batch):
        sizes.append(len(batch))
        await engine_free.wait()
        return batch

    async with DynamicBatcher(slow, max_batch_size=100, batch_timeout_s=0.001) as batcher:
        futures = [await batcher.submit(0)]
        while not sizes:
            await asyncio.sleep(0.001)
        for i in range(1, 30):  # each waits past the 1 ms timeout while the engine is busy
            futures.append(await batcher.submit(i))
            await asyncio.sleep(0.002)
        engine_free.set()
        await asyncio.gather(*futures)
    # Event-driven, not timed: cutting at each timeout regardless of the engine would make 29 tiny batches.
    assert sizes == [1, 29]


def test_heuristic_and_text_of():
    assert heuristic_tokens("abcdefgh") == 3
    assert heuristic_tokens({"prompt": "abcd"}) == 2
    assert text_of(type("P", (), {"text": "hi"})()) == "hi"
    with pytest.raises(TypeError, match="text"):
        text_of(42)


class FakeTokenizer:
    """A stand-in tokenizer (whitespace split) that counts how often it is called."""

    def __init__(self) -> None:
        self.calls = 0

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        self.calls += 1
        return list(range(len(text.split())))


async def test_hf_token_counter_counts_caches_and_feeds_token_batcher():
    tokenizer = FakeTokenizer()
    counter = HFTokenCounter(tokenizer, cache_size=2, extra_tokens=16)
    assert counter("one two three") == 3 + 16
    assert counter({"text": "one two three"}) == 19
    assert tokenizer.calls == 1  # cached
    counter("a"), counter("b"), counter("one two three")
    assert tokenizer.calls == 4  # evicted (cache of 2) and counted again

    async def echo(batch):
        return batch

    async with TokenBatcher(echo, token_estimator=HFTokenCounter(FakeTokenizer()), batch_timeout_s=0.001) as b:
        await (await b.submit("four words right here"))
        assert b.stats.total_batch_cost == 4


def test_hf_token_counter_with_a_real_tokenizer_if_installed(tmp_path):
    tokenizers = pytest.importorskip("tokenizers")
    transformers = pytest.importorskip("transformers")
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {"[UNK]": 0, "hello": 1, "world": 2}
    raw = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    raw.pre_tokenizer = pre_tokenizers.Whitespace()
    tok = transformers.PreTrainedTokenizerFast(tokenizer_object=raw, unk_token="[UNK]")
    tok.save_pretrained(tmp_path)
    counter = HFTokenCounter(str(tmp_path))
    assert counter("hello world hello") == 3
    del tokenizers
