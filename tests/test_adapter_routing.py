"""The token router's adapter score (serving/routing/adapters.py, router.py): which replicas hold a request's LoRA
adapter (their reports, and where the router sent it since), ranking that charges the others ``adapter_weight``
tokens, and a skewed stream of requests for four adapters over two replicas that each hold two. Unit tests on Ray
Serve's real router machinery with fake replicas; the SIMULATED engine's adapter slots."""

from __future__ import annotations

import random
import time
from collections import OrderedDict
from collections.abc import Sequence

import pytest

from serve_app.config import AppConfig
from serve_app.core import Generator
from serve_app.engines import GenerationRequest
from serve_app.openai.common import SamplingFields
from serve_app.serving.routing.adapters import ADAPTER_SLOTS, ADAPTERS, AdapterIndex
from serve_app.serving.routing.request_cost import body_call

from .test_routing import FakeReplica, request, route, router_with


def holding(replica: FakeReplica, *adapters: str, slots: int = 2) -> FakeReplica:
    """``replica`` reporting, now, that its engine holds ``adapters`` of at most ``slots``."""
    replica.routing_stats.update({ADAPTERS: list(adapters), ADAPTER_SLOTS: slots, "at": time.time()})
    return replica


def test_a_replica_holds_what_its_report_lists_and_what_was_sent_it_since_and_a_full_one_pays_twice():
    index = AdapterIndex(settle_s=0.1)
    report = {ADAPTERS: ["a"], ADAPTER_SLOTS: 2, "at": 100.0}
    assert index.held("r0", report) == {"a"}
    index.sent("r0", "b", 100.5)  # after the report: not in it yet
    assert index.held("r0", report) == {"a", "b"} and index.held("r1", report) == {"a"}
    index.sent("r1", "c", 99.0)  # before a report that does not list it: loaded, then evicted
    assert index.held("r1", {ADAPTERS: [], "at": 100.0}) == set()
    reports = {"r0": report, "r1": {ADAPTERS: [], ADAPTER_SLOTS: 2, "at": 100.0}}
    assert index.charges(reports, "a", 300) == {"r0": 0.0, "r1": 300.0}
    assert index.charges(reports, "z", 300) == {"r0": 600.0, "r1": 300.0}  # r0's two slots are full: a load evicts
    index.forget({"r0"})
    assert index.held("r0", report) == {"a"} and index.replicas() == {"r1"}


async def test_a_replica_without_the_adapter_pays_adapter_weight_tokens_to_load_it():
    light, heavy = FakeReplica("light", 1_000), holding(FakeReplica("heavy", 1_300), "legal", slots=4)

    def first(router, model: str) -> str:
        pending = request("generate", "hi", model=model)
        held = {r.replica_id: router.held_tokens(r, router._clock()) for r in (light, heavy)}
        loading = router.loading([light, heavy], router.adapter(pending))
        return router.rank([light, heavy], held, 100, None, loading)[0].replica_id.unique_id

    router = await router_with(light, heavy, tie_fraction=0, adapter_weight=500, base_model="base")
    assert first(router, "legal") == "heavy"  # 1,300 < 1,000 + 500: the load it saves is worth more
    assert first(router, "other") == "light"  # held nowhere: both would load it, tokens decide
    assert router.adapter(request("generate", "hi", model="base")) is None and first(router, "base") == "light"
    router = await router_with(light, heavy, tie_fraction=0, adapter_weight=200)
    assert first(router, "legal") == "light"  # 1,300 > 1,000 + 200: a small weight loses to tokens held
    router = await router_with(light, heavy, tie_fraction=0)  # the default: no adapter score
    assert router.adapter(request("generate", "hi", model="legal")) is None and first(router, "legal") == "light"
    with pytest.raises(ValueError, match="adapter_weight"):
        await router_with(light, adapter_weight=-1)


def test_the_ingress_routers_body_fields_carry_the_model():
    method, fields = body_call({"prompt": "hi", "model": "legal", "max_tokens": 4})
    assert (method, fields["model"]) == ("generate", "legal")


def zipf(adapters: list[str], count: int, seed: int = 0) -> list[str]:
    """``count`` adapter names, the k-th most asked for with weight 1/k."""
    rng = random.Random(seed)
    return rng.choices(adapters, weights=[1 / (k + 1) for k in range(len(adapters))], k=count)


async def loads(adapter_weight: float) -> int:
    """Adapter loads over 400 requests for four adapters (Zipf) routed to two replicas that each hold two (least
    recently used go) and report what they hold after every request; none completes in between, so tokens held
    grow as they would under load."""
    replicas = [FakeReplica("a", 0), FakeReplica("b", 0)]
    held: dict[str, OrderedDict[str, None]] = {r.replica_id.unique_id: OrderedDict() for r in replicas}
    router = await router_with(*replicas, settle_s=0.0, adapter_weight=adapter_weight)
    count = 0
    for model in zipf(["w", "x", "y", "z"], 400):
        pending = request("generate", "a question", model=model, max_tokens=16)
        replica = await route(router, pending)
        router.on_request_routed(pending, replica.replica_id, None)
        router.on_request_completed(replica.replica_id, pending.metadata.internal_request_id)
        slots = held[replica.replica_id.unique_id]
        if model not in slots:
            count += 1
            slots[model] = None
            while len(slots) > 2:
                slots.popitem(last=False)
        slots.move_to_end(model)
        holding(replica, *slots)  # its next report
    return count


async def test_skewed_requests_for_four_adapters_load_them_far_less_often_with_the_adapter_score():
    without, scored = await loads(0), await loads(1_000)
    assert scored <= 4 and without >= 8 * scored, (without, scored)  # each adapter settles on one replica


def adapter_core(named: str = "wxyz", queue: bool = False) -> Generator:
    """The generation core on the simulated engine, its settings naming an adapter for each letter of ``named``
    (each the bundled one), two at once; ``queue``: ``lora.queue_adapters``."""
    adapters = {name: "bundled" for name in named}
    return Generator(
        AppConfig(
            engine="simulated",
            simulated={"step_s": 0.001},
            lora={"adapters": adapters, "max_loaded": 2, "queue_adapters": queue},
        )
    )


async def naming(generator: Generator, models: Sequence[str | None], max_tokens: int) -> list[GenerationRequest]:
    """One request of prompt ``q`` for each of ``models`` (an adapter's name; None: the base model)."""
    builder = generator.requests
    samplings = [builder.sampling(SamplingFields(model=model, max_tokens=max_tokens)) for model in models]
    return [request for sampling in samplings for request in await builder.prompts(["q"], sampling)]


async def test_the_simulated_engine_runs_at_most_max_loaded_adapters_a_step_and_counts_each_load():
    generator = adapter_core()
    await generator.start()
    try:
        requests = await naming(generator, "wxyzw", max_tokens=3)
        results = await generator.complete(requests)
        assert [r.text.split("]")[0] for r in results] == [f"[simulated {name}" for name in "wxyzw"]
        engine = generator.engine
        assert engine.stats()["adapter_loads"] == 4 and engine.stats()["peak_running"] <= 3
        assert len(await engine.loaded_adapters()) == 2  # what it reports to the router: its two slots
    finally:
        await generator.stop()
