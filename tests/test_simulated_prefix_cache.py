"""The SIMULATED engine's prefix cache (engines/simulated/prefix_cache.py, ``simulated.prefix_caching``): which prompt
tokens it finds, what it forgets, what the cost model then charges, and what answers and statistics report. It is
what makes the prefix score's effect show on the simulated fleet (``python -m benchmarks.routing.prefixes``)."""

from __future__ import annotations

import pytest

from serve_app.engines.simulated.prefix_cache import PrefixCache
from serve_app.engines.simulated.sequence import SimulatedSequence

from .test_core import core, prompts

SYSTEM = "You follow the house rules. " * 40  # 1,120 characters: 280 simulated tokens, 17 full blocks of 16


def test_a_prompt_finds_its_leading_whole_blocks_short_of_its_last_token():
    cache = PrefixCache(capacity_tokens=1_000, block_tokens=4)
    assert cache.admit(list(range(10))) == 0  # nothing held yet
    assert cache.admit(list(range(10))) == 8  # two whole blocks; the third is partial
    assert cache.admit(list(range(8))) == 4  # its second block ends with its last token, which is always computed
    assert cache.admit([0, 1, 2, 3, 9, 9, 9, 9, 9]) == 4  # it shares only the first block
    assert cache.admit([9, 1, 2, 3, 4, 5, 6, 7, 8]) == 0  # a block's key stands for every block before it too


def test_the_least_recently_used_blocks_go_once_the_cache_is_full():
    cache = PrefixCache(capacity_tokens=8, block_tokens=4)  # two blocks
    old, new = [1, 1, 1, 1, 2, 2, 2, 2, 0], [7, 7, 7, 7, 8, 8, 8, 8, 0]
    cache.admit(old)
    assert cache.admit(old) == 8
    cache.admit(new)  # its two blocks push both of old's out
    assert cache.admit(old) == 0 and cache.admit(old) == 8
    cache = PrefixCache(capacity_tokens=12, block_tokens=4)  # three blocks
    cache.admit(old)
    cache.admit(new)  # two more blocks, one too many: old's tail goes first (vLLM frees blocks in reverse)
    assert cache.admit(old) == 4


def make_sequence(tokens: int, cached: int | None) -> SimulatedSequence:
    from types import SimpleNamespace

    request = SimpleNamespace(prompt_token_ids=[1] * tokens, prompt_text="x", sampling=SimpleNamespace(adapter=None))
    sequence = SimulatedSequence(request)  # type: ignore[arg-type]
    sequence.cached = cached
    return sequence


def test_the_cost_model_prefills_only_what_the_cache_did_not_hold():
    generator = core(simulated={"prefill_s_per_token": 0.001, "prefix_caching": True})
    engine = generator.engine
    whole, cached = make_sequence(1_000, None), make_sequence(1_000, 960)
    assert engine.step_seconds([whole]) == pytest.approx(1.0)
    assert engine.step_seconds([cached]) == pytest.approx(0.04)
    cached.prefilled = True
    assert engine.step_seconds([cached]) == 0.0  # a decode step alone: this cost model's other terms are 0


@pytest.mark.parametrize("caching", [True, False])
async def test_answers_and_statistics_report_the_prompt_tokens_the_cache_held(caching):
    generator = core(simulated={"step_s": 0.001, "prefix_caching": caching})
    await generator.start()
    try:
        results = []
        for question in ("What is a river?", "What is a stone?"):
            requests = await prompts(generator, [SYSTEM + question], max_tokens=2)
            results += [output async for _, output in generator.run(requests)][-1:]
        stats = generator.engine.stats()
        prompt = results[0].prompt_tokens
        assert stats["prompt_tokens"] == sum(r.prompt_tokens for r in results) > 2 * 280
        if caching:
            assert results[0].cached_tokens == 0 and results[1].cached_tokens == 17 * 16  # the shared rules
            assert stats["cached_prompt_tokens"] == 17 * 16 and prompt > 17 * 16
        else:
            assert [r.cached_tokens for r in results] == [None, None] and stats["cached_prompt_tokens"] == 0
    finally:
        await generator.stop()
