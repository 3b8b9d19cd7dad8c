"""The continuous batcher's shared prefixes (``prefix_fn``, ``block_cost``): records whose prompts start alike are
charged for their shared blocks once while any of them runs, as vLLM's prefix cache holds them once, and the blocks
stay counted until the last of them leaves. On a fake engine that measures what its records hold; no Ray."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from batching import ContinuousBatcher

from .conftest import sized
from .test_continuous_batcher import SETTINGS, until


@dataclass(eq=False)
class Prompt:
    """A record whose first ``shared`` blocks are those of system prompt ``family``, then ``own`` cost of its own."""

    name: str
    family: str
    shared: int
    own: int
    block: int = 10

    def estimate_tokens(self) -> int:
        return self.shared * self.block + self.own


def blocks(prompt: Prompt) -> list[tuple[str, int]]:
    """Its blocks' keys: block ``i`` of a family names it and, by its number, the ``i`` before it."""
    return [(prompt.family, i) for i in range(prompt.shared)]


class PrefixEngine:
    """Runs each record until the test releases it; measures what its records hold together (their own costs,
    and each family's blocks once, as many as the longest prefix of it in flight)."""

    def __init__(self) -> None:
        self.running: dict[str, Prompt] = {}
        self.started: list[str] = []
        self.most = 0
        self.gates: dict[str, asyncio.Event] = {}

    def held(self) -> int:
        longest: dict[str, int] = {}
        for p in self.running.values():
            longest[p.family] = max(longest.get(p.family, 0), p.shared * p.block)
        return sum(p.own for p in self.running.values()) + sum(longest.values())

    def release(self, *names: str) -> None:
        for name in names:
            self.gates.setdefault(name, asyncio.Event()).set()

    async def generate(self, prompt: Prompt):
        self.started.append(prompt.name)
        self.running[prompt.name] = prompt
        if len(self.running) > 1:
            self.most = max(self.most, self.held())
        try:
            yield prompt.name
            await self.gates.setdefault(prompt.name, asyncio.Event()).wait()
        finally:
            del self.running[prompt.name]


def batcher(engine: PrefixEngine, budget: int, **kwargs) -> ContinuousBatcher:
    return ContinuousBatcher(engine.generate, max_inflight_cost=budget, prefix_fn=blocks, block_cost=10, **kwargs)


@pytest.mark.parametrize(("prefix_fn", "expected"), [(blocks, ["a", "b", "c"]), (None, ["a", "b"])])
async def test_records_sharing_a_system_prompt_are_charged_for_it_once(prefix_fn, expected):
    """Three records of 40 shared + 10 own: 150 whole, 70 with the prompt once; a budget of 100 runs all three
    with ``prefix_fn``, and two without, which the batcher then counts as 100 where the engine holds 60."""
    engine = PrefixEngine()
    async with ContinuousBatcher(engine.generate, max_inflight_cost=100, prefix_fn=prefix_fn, block_cost=10) as shared:
        futures = [shared.submit_nowait(Prompt(name, "system", 4, 10)) for name in "abc"]
        await until(lambda: len(engine.started) == len(expected))
        await asyncio.sleep(0)
        assert engine.started == expected
        assert (shared.inflight_cost, engine.held()) == ((70, 70) if prefix_fn else (100, 60))
        engine.release("a", "b", "c")
        await asyncio.gather(*futures)


async def test_the_shared_blocks_stay_counted_until_the_last_record_holding_them_leaves():
    """``a`` and ``b`` share 40: 60 in flight. When ``a`` leaves, ``b`` still holds its 50, so ``d`` (another
    system prompt, 55) still waits; it starts once ``b`` leaves."""
    engine = PrefixEngine()
    async with batcher(engine, 100) as shared:
        futures = [shared.submit_nowait(Prompt(name, "system", 4, 10)) for name in "ab"]
        await until(lambda: engine.started == ["a", "b"])
        futures.append(shared.submit_nowait(Prompt("d", "other", 4, 15)))
        engine.release("a")
        await until(lambda: "a" not in engine.running and shared.inflight_cost == 50)
        await asyncio.sleep(0)
        assert engine.started == ["a", "b"]
        engine.release("b")
        await until(lambda: "d" in engine.started)
        assert shared.inflight_cost == 55
        engine.release("d")
        await asyncio.gather(*futures)
    assert shared.inflight_cost == 0


async def test_a_longer_shared_prefix_is_charged_only_for_its_blocks_not_yet_held():
    """``b`` shares ``a``'s 2 blocks and has 2 more of the same family: it adds 20 + its own, not 40."""
    engine = PrefixEngine()
    async with batcher(engine, 1_000) as shared:
        futures = [shared.submit_nowait(Prompt("a", "system", 2, 5)), shared.submit_nowait(Prompt("b", "system", 4, 5))]
        await until(lambda: len(engine.started) == 2)
        assert shared.inflight_cost == engine.held() == 25 + 20 + 5
        engine.release("a", "b")
        await asyncio.gather(*futures)


def test_prefix_fn_must_return_hashable_keys_and_block_cost_be_positive():
    with pytest.raises(ValueError, match="block_cost"):
        ContinuousBatcher(PrefixEngine().generate, prefix_fn=blocks, block_cost=0)
    with pytest.raises(TypeError, match="prefix_fn"):
        ContinuousBatcher(PrefixEngine().generate, prefix_fn=3)

    async def refused() -> None:
        async with ContinuousBatcher(PrefixEngine().generate, prefix_fn=lambda p: [[1, 2]]) as unhashable:
            with pytest.raises(TypeError, match="hashable"):
                unhashable.submit_nowait(Prompt("a", "system", 1, 1))

    asyncio.run(refused())


@st.composite
def prompts(draw: st.DrawFn) -> list[tuple[Prompt, int]]:
    """Records of three families with prefixes of 0-4 blocks, each held for some ticks after it starts."""
    count = draw(st.integers(1, 25))
    return [
        (
            Prompt(f"r{i}", draw(st.sampled_from("xyz")), draw(st.integers(0, 4)), draw(st.integers(0, 30))),
            draw(st.integers(0, 6)),
        )
        for i in range(count)
    ]


@pytest.mark.parametrize("examples", sized(60, 300, tier="unit"))
def test_random_prefixes_keep_what_the_engine_holds_within_the_budget(examples):
    """Whatever the records and the order they leave in, what the engine holds (each family's blocks once) stays
    within the budget while more than one record runs, every record runs, and nothing stays counted."""

    @settings(SETTINGS, max_examples=examples)
    @given(prompts(), st.integers(10, 120), st.integers(1, 8))
    def run(records: list[tuple[Prompt, int]], budget: int, most: int) -> None:
        async def scenario() -> None:
            engine = PrefixEngine()
            async with batcher(engine, budget, max_inflight=most) as shared:

                async def one(prompt: Prompt, ticks: int) -> None:
                    stream = await shared.stream(prompt)
                    async with stream:
                        async for _ in stream:
                            for _ in range(ticks):
                                await asyncio.sleep(0)
                            engine.release(prompt.name)

                await asyncio.wait_for(asyncio.gather(*(one(p, t) for p, t in records)), timeout=10)
            assert engine.most <= budget
            assert sorted(engine.started) == sorted(p.name for p, _ in records)
            assert shared.inflight_cost == 0 and not shared._held

        asyncio.run(scenario())

    run()
