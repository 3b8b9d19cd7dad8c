"""The continuous batcher's groups (``group_fn``, ``max_groups``: an engine's LoRA adapters, of which it runs a few
at once): at most ``max_groups`` groups in flight; a record whose group must wait is passed by records of groups in
flight; once it has waited ``max_wait_s``, the group in flight that leaves soonest drains for it (and with
``on_deck`` the waiting group goes in at once, to wait inside the engine for the draining group's place). On a fake
engine, and the generation core on the simulated one (``lora.max_loaded``); no Ray."""

from __future__ import annotations

import asyncio

import pytest

from batching import ContinuousBatcher

from .test_adapter_routing import adapter_core, naming
from .test_continuous_batcher import FakeEngine, Req, ticks, until


def group(req: Req) -> str | None:
    """``A-1`` is of group ``A``; ``base-...`` of none."""
    name = req.name.split("-")[0]
    return None if name == "base" else name


def groups_in(engine: FakeEngine) -> set[str]:
    return {g for g in map(lambda name: group(Req(name, 1)), engine.running) if g is not None}


async def test_a_third_group_waits_and_records_of_groups_in_flight_pass_it():
    engine, most = FakeEngine(), []

    async def watched(req: Req):
        async for output in engine.generate(req):
            most.append(len(groups_in(engine)))
            yield output

    async with ContinuousBatcher(watched, group_fn=group, max_groups=2, max_wait_s=60) as batcher:
        names = ["A-1", "B-1", "C-1", "A-2", "base-1"]
        futures = [batcher.submit_nowait(Req(name, 1, hold=name in ("A-1", "B-1"))) for name in names]
        try:
            await until(lambda: "base-1" in engine.finished and "A-2" in engine.finished)
            await ticks(20)
            assert engine.started == ["A-1", "B-1", "A-2", "base-1"]  # C-1 waits for a group to leave
            engine.release("A-1")
            await until(lambda: "C-1" in engine.started)
        finally:
            engine.release(*names)  # a failure must not leave the batcher draining held records
        await asyncio.gather(*futures)
    assert max(most) <= 2


async def test_a_record_that_waited_max_wait_s_holds_the_head_until_a_group_leaves():
    engine = FakeEngine()
    async with ContinuousBatcher(engine.generate, group_fn=group, max_groups=2, max_wait_s=0.01) as batcher:
        futures = [batcher.submit_nowait(Req(name, 1, hold=True)) for name in ["A-1", "B-1", "C-1"]]
        try:
            await until(lambda: engine.started == ["A-1", "B-1"])
            await asyncio.sleep(0.02)  # C-1 has now waited past max_wait_s
            futures.append(batcher.submit_nowait(Req("A-2", 1)))
            await ticks(20)
            assert engine.started == ["A-1", "B-1"]  # A-2 no longer passes it
            engine.release("A-1")
            await until(lambda: engine.started == ["A-1", "B-1", "C-1"])
            await ticks(20)
            assert "A-2" not in engine.started  # B and C run now: A waits for one of them
        finally:
            engine.release("A-1", "B-1", "C-1")
        await asyncio.gather(*futures)
    assert engine.started == ["A-1", "B-1", "C-1", "A-2"]


@pytest.mark.parametrize(
    "running, costs",
    [
        (["A-1", "A-2", "B-1"], {}),  # as many tokens left in each: B, one record in flight against A's two
        (["A-1", "B-1", "B-2"], {"A-1": 100}),  # A's one record may still add 99 tokens, B's two 4 each: B
    ],
)
async def test_once_it_waited_max_wait_s_the_group_that_leaves_soonest_drains_for_it_and_the_others_go_on(
    running, costs
):
    engine = FakeEngine()
    held = [*running, "C-1"]
    async with ContinuousBatcher(
        engine.generate, group_fn=group, max_groups=2, max_wait_s=0.01, growth_estimator=lambda req: req.cost
    ) as batcher:
        futures = [batcher.submit_nowait(Req(name, costs.get(name, 5), hold=True)) for name in held]
        try:
            await until(lambda: engine.started == running)
            await asyncio.sleep(0.02)  # C-1 has now waited past max_wait_s: B drains for it
            futures += [batcher.submit_nowait(Req(name, 5)) for name in ("B-9", "A-9")]
            await until(lambda: "A-9" in engine.started)  # A goes on
            await ticks(20)
            assert "B-9" not in engine.started
            engine.release(*(name for name in running if name.startswith("B")))
            await until(lambda: "C-1" in engine.started)  # B has left: C takes its place
        finally:
            engine.release(*held)
        await asyncio.gather(*futures)
    assert engine.started.index("C-1") < engine.started.index("B-9")


async def test_on_deck_the_group_a_group_drains_for_goes_in_at_once_and_the_drain_holds_until_it_left():
    engine = FakeEngine()
    names = ["A-1", "B-1", "C-1", "A-2", "D-1", "B-2", "C-2"]
    async with ContinuousBatcher(
        engine.generate, group_fn=group, max_groups=2, max_wait_s=0.01, on_deck=True
    ) as batcher:
        futures = [batcher.submit_nowait(Req(name, 1, hold=True)) for name in names[:3]]
        try:
            await until(lambda: engine.started == ["A-1", "B-1"])
            await asyncio.sleep(0.02)  # C-1 has now waited past max_wait_s: A drains for it, C goes in on deck
            futures += [batcher.submit_nowait(Req(name, 1, hold=True)) for name in names[3:]]
            await until(lambda: "C-2" in engine.started)
            await ticks(20)
            assert engine.started == ["A-1", "B-1", "C-1", "B-2", "C-2"]  # A takes no more; D waits: one on deck
            await asyncio.sleep(0.02)  # A-2 and D-1 have waited past max_wait_s too: one drain at a time
            await ticks(20)
            assert len(engine.started) == 5
            engine.release("A-1")  # A has left: A-2, first in the queue, is the next on deck (B drains for it)
            await until(lambda: "A-2" in engine.started)
            await ticks(20)
            assert "D-1" not in engine.started
        finally:
            engine.release(*names)
        await asyncio.gather(*futures)
    assert engine.started.index("D-1") > engine.started.index("A-2")


async def test_without_max_groups_groups_do_not_limit_admission():
    engine = FakeEngine()
    async with ContinuousBatcher(engine.generate, group_fn=group) as batcher:
        await asyncio.gather(*[batcher.submit_nowait(Req(f"{g}-1", 1)) for g in "ABCDE"])
    assert engine.started == [f"{g}-1" for g in "ABCDE"]


def test_max_groups_and_group_fn_are_checked():
    with pytest.raises(ValueError, match="max_groups"):
        ContinuousBatcher(FakeEngine().generate, group_fn=group, max_groups=0)
    with pytest.raises(TypeError, match="group_fn"):
        ContinuousBatcher(FakeEngine().generate, group_fn="adapter", max_groups=2)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "named, queue",
    [("wxyz", True), ("w", True), ("wxyz", False)],  # all four in the settings; or one, three loaded at run time
)
async def test_with_queue_adapters_the_generator_lets_max_loaded_adapters_into_the_engine(named, queue):
    """``lora.queue_adapters``: the other two wait in the batcher's queue; off, all four go in and the engine's
    scheduler holds the two it cannot run yet (the simulated engine runs two a step, as vLLM's)."""
    generator = adapter_core(named, queue)
    await generator.start()
    await generator.set_runtime_adapters({name: "bundled" for name in "xyz"})  # no change where they are named
    inside: list[str | None] = []
    most = 0
    stream = generator.engine.stream

    async def watched(request):  # what the engine holds: the adapters of the requests inside it
        nonlocal most
        inside.append(request.sampling.adapter)
        most = max(most, len({a for a in inside if a is not None}))
        try:
            async for output in stream(request):
                yield output
        finally:
            inside.remove(request.sampling.adapter)

    generator.engine.stream = watched  # type: ignore[method-assign]
    try:
        results = await generator.complete(await naming(generator, [*"wxyzw", None], max_tokens=8))
        assert [r.text.split("]")[0] for r in results[:5]] == [f"[simulated {name}" for name in "wxyzw"]
        assert most == (2 if queue else 4)  # every slot in use (adapters loaded at run time too); with the queue,
        # the other two waited in it (none waited max_wait_s, so none went on deck)
    finally:
        await generator.stop()
