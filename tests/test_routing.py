"""The token-load router (serve_app/serving/routing/): unit tests on Ray Serve's real ``RequestRouter`` machinery
with fake replicas that carry routing statistics (ranking by tokens held, the cost estimate of handle and HTTP
requests, optimistic accounting between reports, the stale fallback, tie-breaks, the full routing loop), and a
multi-replica run on a local multi-node Ray cluster (in a subprocess: this process belongs to the session's
cluster) where the tokens held stay balanced on a skewed workload, better than with Serve's default router, and
every request is answered once (soak tier); and, under HAProxy in the real app's cluster, chats routed away from
the replica a handle job loads (system tier).
"""

from __future__ import annotations

import asyncio
import logging
import pickle
import time
import uuid
from typing import Any

import pytest
from ray.serve._private.common import (
    DeploymentHandleSource,
    DeploymentID,
    ReplicaID,
    RequestMetadata,
    RequestProtocol,
    StreamingHTTPRequest,
)
from ray.serve.request_router import PendingRequest

from harness.launcher import private_cluster_result
from serve_app.serving.routing import TokenLoadRouter
from serve_app.serving.routing.request_cost import body_call, handle_cost, text_tokens

DEPLOYMENT = DeploymentID(name="LLMServer", app_name="llm")
BUDGET = 10_000.0


class FakeReplica:
    """What a router reads from a ``RunningReplica``: its id, node, limits, routing statistics and queue length."""

    def __init__(
        self,
        name: str,
        load: float = 0.0,
        age_s: float = 0.0,
        node: str = "node-b",
        queue: int = 0,
        prompts: int = 1,
        at: float | None = None,
    ):
        self.replica_id = ReplicaID(unique_id=name, deployment_id=DEPLOYMENT)
        self.node_id = node
        self.availability_zone = None
        self.multiplexed_model_ids: set[str] = set()
        self.max_ongoing_requests = 100
        self.queue = queue  # what Serve's queue-length probe answers
        self.report(load, age_s, at=at, prompts=prompts)

    def report(self, load: float, age_s: float = 0.0, at: float | None = None, prompts: int = 1) -> None:
        """A new report, as ``Replica.record_routing_stats`` makes it (``at``: when it was measured)."""
        at = time.time() - age_s if at is None else at
        self.routing_stats: dict[str, Any] = {"token_load": load, "token_budget": BUDGET, "prompts": prompts, "at": at}

    async def get_queue_len(self, *, deadline_s: float) -> int:
        return self.queue

    def __repr__(self) -> str:
        return self.replica_id.unique_id


async def router_with(*replicas: FakeReplica, node: str = "node-a", prefer_local: bool = False, **kwargs: Any):
    """A ``TokenLoadRouter`` built as Serve's router builds one (its ``initialize_state`` given ``kwargs``), with
    ``replicas`` running; their queue lengths are in its cache once probed."""
    router = TokenLoadRouter(
        deployment_id=DEPLOYMENT,
        handle_source=DeploymentHandleSource.UNKNOWN,
        self_node_id=node,
        prefer_local_node_routing=prefer_local,
        prefer_local_az_routing=True,  # Serve's default for every router; this cluster has no zones
        use_replica_queue_len_cache=True,
    )
    router.initialize_state(**{"default_max_tokens": 128, **kwargs})
    router.update_replicas(list(replicas))
    await router._probe_queue_lens(list(replicas), 0)  # as update_replicas does in the background
    return router


def request(method: str = "generate", *args: Any, **kwargs: Any) -> PendingRequest:
    """A handle call ``method(*args, **kwargs)`` waiting to be routed."""
    ids = {"request_id": uuid.uuid4().hex, "internal_request_id": uuid.uuid4().hex}
    return PendingRequest(args=list(args), kwargs=kwargs, metadata=RequestMetadata(**ids, call_method=method))


def http_request(method: str = "POST", length: int | None = 4_000, path: str = "/generate") -> PendingRequest:
    """An HTTP request as Serve's proxy hands it to its router: a pickled ``StreamingHTTPRequest``."""
    headers = [(b"content-type", b"application/json")]
    if length is not None:
        headers.append((b"content-length", str(length).encode()))
    scope = {"type": "http", "method": method, "path": path, "headers": headers}
    arg = pickle.dumps(StreamingHTTPRequest(asgi_scope=scope, proxy_actor_name="SERVE_PROXY_ACTOR-x"))
    metadata = RequestMetadata(
        request_id="r", internal_request_id=uuid.uuid4().hex, _request_protocol=RequestProtocol.HTTP
    )
    return PendingRequest(args=[arg], kwargs={}, metadata=metadata)


async def route(router: TokenLoadRouter, pending: PendingRequest) -> FakeReplica:
    """Serve's whole routing loop for one request (choose, select by queue length, fulfil): the replica it got."""
    return await asyncio.wait_for(router._choose_replica_for_request(pending), 10)


def names(ranks: list[list[Any]]) -> list[list[str]]:
    return [[r.replica_id.unique_id for r in rank] for rank in ranks]


# -- What a request costs ---------------------------------------------------------------------------------


def test_handle_calls_cost_prompt_tokens_plus_max_tokens_per_prompt():
    assert handle_cost("generate", ["x" * 400], {"max_tokens": 50}, 128) == 100 + 50
    assert handle_cost("generate_stream", ["x" * 400], {}, 128) == 100 + 128  # default max_tokens
    assert handle_cost("generate", [], {"prompt": [1, 2, 3], "max_tokens": 7}, 128) == 3 + 7  # token ids, by keyword
    batch = handle_cost("generate_batch", [["y" * 40] * 48], {"max_tokens": 1_024, "priority": 5}, 128)
    assert batch == 48 * (10 + 1_024)  # 48 prompts: 48 times a chat's weight, where Serve counts one request
    messages = [
        {"role": "system", "content": "s" * 40},
        {"role": "user", "content": [{"type": "text", "text": "u" * 80}]},
    ]
    assert handle_cost("chat", [messages], {"max_completion_tokens": 20}, 128) == 10 + 20 + 20
    assert handle_cost("chat_stream", [messages], {"max_tokens": 10, "n": 3}, 128) == 3 * (30 + 10)
    assert handle_cost("stats", [], {}, 128) == 0 and handle_cost("model_card", [], {}, 128) == 0
    assert handle_cost("embed", ["x"], {}, 128) is None  # not a generation method: unknown
    assert handle_cost("generate", [object()], {}, 128) is None  # an unresolved reference: unknown
    assert text_tokens({"role": "user"}) == 0 and text_tokens(None) is None


async def test_unknown_costs_are_priced_at_the_fallback_and_http_by_its_content_length():
    router = await router_with(FakeReplica("r0"), default_max_tokens=100)
    assert router.estimate_cost(request("generate", "x" * 40, max_tokens=5)) == 15
    assert router.estimate_cost(request("generate", object())) == 128 + 100  # nothing readable: the constant
    assert router.estimate_cost(request("unknown_method", "x")) == 128 + 100
    assert router.estimate_cost(http_request(length=4_000)) == 1_000 + 100  # body / 4 + default max_tokens
    assert router.estimate_cost(http_request("GET", length=None, path="/stats")) == 0
    assert router.estimate_cost(http_request(length=None)) == 128 + 100  # chunked: no length
    broken = http_request()
    broken.args = [b"not a pickle"]
    assert router.estimate_cost(broken) == 128 + 100  # never raises
    custom = await router_with(FakeReplica("r0"), unknown_cost=7)
    assert custom.estimate_cost(request("generate", object())) == 7
    with pytest.raises(ValueError, match="stale_after_s"):
        await router_with(FakeReplica("r0"), stale_after_s=0)


async def test_haproxys_route_calls_are_priced_from_the_body_as_the_handle_call_of_the_same_shape():
    """Under HAProxy the ingress router (serve_app/serving/ingress_router.py) asks the deployment's router to pick
    for an HTTP body: ``/generate``'s prompts, chat messages and a completion's prompt cost what the handle calls
    do; a body that says nothing (or is not JSON) costs the constant."""
    router = await router_with(FakeReplica("r0"), default_max_tokens=100)

    def priced(body: Any) -> float:
        method, fields = body_call(body)
        return router.estimate_cost(request(method, **fields))

    batch = {"prompts": ["y" * 40] * 48, "max_tokens": 1_024, "temperature": 0.0, "task_id": "t"}
    assert priced(batch) == 48 * (10 + 1_024)
    chat = {"model": "m", "messages": [{"role": "user", "content": "u" * 80}], "max_completion_tokens": 20, "n": 2}
    assert priced(chat) == 2 * (20 + 20)
    assert priced({"model": "m", "prompt": "x" * 400, "stream": True}) == 100 + 100  # the default max_tokens
    assert body_call({"input": "an embedding"}) == ("__call__", {})
    # A Responses API body: as a chat of its instructions and input messages (a follow-up's new turn alone)
    responses = {"model": "m", "instructions": "i" * 40, "input": "x" * 400, "max_output_tokens": 30, "store": True}
    system, user = {"role": "system", "content": "i" * 40}, {"role": "user", "content": "x" * 400}
    assert body_call(responses) == ("chat", {"messages": [system, user], "max_tokens": 30, "model": "m"})
    assert priced(responses) == 10 + 100 + 30
    items = [user, {"type": "function_call_output", "call_id": "c", "output": "4"}]
    follow_up = {"model": "m", "input": items, "previous_response_id": "resp_1"}
    assert body_call(follow_up) == ("chat", {"messages": [user], "model": "m", "previous_response_id": "resp_1"})
    assert priced(follow_up) == 100 + 100
    assert priced({"input": "x"}) == priced(None) == priced([1, 2]) == 128 + 100


def test_haproxy_set_after_ray_serve_was_imported_fails_the_build_instead_of_bypassing_the_router(monkeypatch):
    from ray.serve._private.constants import RAY_SERVE_ENABLE_HA_PROXY

    from serve_app.serving.ingress_router import haproxy_enabled

    monkeypatch.setenv("RAY_SERVE_ENABLE_HA_PROXY", "1" if RAY_SERVE_ENABLE_HA_PROXY else "0")
    assert haproxy_enabled() is RAY_SERVE_ENABLE_HA_PROXY  # as Serve read it at import: agreed
    monkeypatch.setenv("RAY_SERVE_ENABLE_HA_PROXY", "0" if RAY_SERVE_ENABLE_HA_PROXY else "1")
    with pytest.raises(RuntimeError, match="before importing Ray"):
        haproxy_enabled()


# -- Ranking by tokens held -------------------------------------------------------------------------------


async def test_ranks_replicas_by_tokens_held_not_by_ongoing_requests():
    # busy holds one 48-prompt batch (1 ongoing request), idle holds nothing, chats holds 12 short chats
    busy, idle, chats = (
        FakeReplica("busy", 9_000, queue=1),
        FakeReplica("idle", 100, queue=2),
        FakeReplica("chats", 3_000, queue=12),
    )
    router = await router_with(busy, idle, chats)
    ranks = await router.choose_replicas([busy, idle, chats], request("generate", "hi", max_tokens=8))
    assert names(ranks) == [["idle"], ["chats"], ["busy"]]  # one replica per rank, best first
    assert await route(router, request("chat", [{"role": "user", "content": "hi"}])) is idle
    # Serve's default router, on the same replicas, prefers the fewest ongoing requests: the busy one
    assert min([busy, idle, chats], key=lambda r: r.queue) is busy


async def test_a_full_replica_passes_the_request_to_the_next_rank():
    full, next_best = FakeReplica("full", 0, queue=100), FakeReplica("next", 500)  # full: at max_ongoing_requests
    router = await router_with(full, next_best, FakeReplica("last", 5_000))
    pending = request("generate", "x" * 400, max_tokens=100)
    assert await route(router, pending) is next_best
    router.on_request_routed(pending, next_best.replica_id, None)  # what Serve calls once the replica accepts
    assert router.held_tokens(next_best, time.time()) == 500 + 200  # counted where it went
    assert router.held_tokens(full, time.time()) == 0  # not where it was first ranked


# -- Optimistic accounting between reports ----------------------------------------------------------------


async def test_a_burst_spreads_across_replicas_before_the_next_report():
    replicas = [FakeReplica(f"r{i}", 0) for i in range(3)]
    router = await router_with(*replicas)
    burst = [request("generate_batch", ["x" * 400] * 16, max_tokens=150) for _ in range(6)]  # 4,000 tokens each
    chosen = [await route(router, pending) for pending in burst]  # back to back: no report, no replica answered yet
    assert sorted(chosen.count(r) for r in replicas) == [2, 2, 2]
    for pending, replica in zip(burst, chosen):
        router.on_request_routed(pending, replica.replica_id, None)
    assert [router.held_tokens(r, time.time()) for r in replicas] == [8_000.0] * 3


async def test_a_4k_request_counts_at_once_though_the_report_is_a_second_old():
    a, b = FakeReplica("a", 1_000, age_s=1.0), FakeReplica("b", 1_200, age_s=1.0)
    router = await router_with(a, b)
    big = request("generate", "x" * 4_000, max_tokens=3_000)  # 4,000 tokens
    assert await route(router, big) is a
    router.on_request_routed(big, a.replica_id, None)
    assert router.held_tokens(a, time.time()) == 5_000
    assert await route(router, request("chat", [{"role": "user", "content": "hi"}], max_tokens=16)) is b


async def test_a_report_measured_after_routing_replaces_the_delta_and_an_older_one_does_not():
    a, b = FakeReplica("a", 0), FakeReplica("b", 0)
    router = await router_with(a, b, settle_s=0.0)
    pending = request("generate", "x" * 4_000, max_tokens=3_000)
    replica = await route(router, pending)
    router.on_request_routed(pending, replica.replica_id, None)
    routed_at = time.time()
    replica.report(300, at=routed_at - 0.5)  # measured before it arrived: the delta still counts
    assert router.held_tokens(replica, time.time()) == 300 + 4_000
    replica.report(4_100, at=routed_at + 0.01)  # measured after: it already counts the request
    assert router.held_tokens(replica, time.time()) == 4_100
    router.on_request_completed(replica.replica_id, pending.metadata.internal_request_id)
    assert router.held_tokens(replica, time.time()) == 100  # it ended: off the report that counts it, at once
    replica.report(100, at=time.time() + 0.01)
    assert router.held_tokens(replica, time.time()) == 100


async def test_an_end_comes_off_the_report_that_counted_it_until_a_report_measured_after_it():
    """Reports reach a router 1-2 s late: a replica that just finished a batch must not look full that long."""
    clock = [time.time()]

    def tick() -> float:
        clock[0] += 0.1
        return clock[0]

    a, b = FakeReplica("a", 0, at=clock[0]), FakeReplica("b", 0, at=clock[0])
    router = await router_with(a, b, settle_s=0.0)
    router._clock = lambda: clock[0]
    batch = request("generate_batch", ["x" * 400] * 48, max_tokens=256)  # 48 x (100 + 256) = 17,088 tokens
    replica = await route(router, batch)
    router.on_request_routed(batch, replica.replica_id, None)
    other = b if replica is a else a
    replica.report(17_088 + 200, at=tick())  # counts the batch, and 200 tokens of another router's
    assert router.held_tokens(replica, tick()) == 17_288
    chat = request("generate", "x" * 400, max_tokens=100)  # 200 tokens
    assert await route(router, chat) is other
    router.on_request_routed(chat, other.replica_id, None)

    tick()
    router.on_request_completed(replica.replica_id, batch.metadata.internal_request_id)
    assert router.held_tokens(replica, tick()) == 200  # at once: not 17,288 until the next report
    assert await route(router, request("generate", "x" * 40, max_tokens=10)) is replica  # 20 < 200 + 200
    replica.report(17_288, at=clock[0] - 0.25)  # measured before the end: the end still comes off it
    assert router.held_tokens(replica, tick()) == 200 + 20
    replica.report(150, at=tick())  # measured after the end: it shows what is left (the 20 included)
    assert router.held_tokens(replica, tick()) == 150

    # a report that counted only part of what ended (a batch's prompts end one by one): never below zero
    other.report(120, at=tick())  # counts 120 of the chat's 200 tokens
    tick()
    router.on_request_completed(other.replica_id, chat.metadata.internal_request_id)
    assert router.held_tokens(other, tick()) == 0
    other.report(0, at=tick())
    assert router.held_tokens(other, tick()) == 0
    assert router._ledger.books[other.replica_id].gone == [] and not router._ledger.is_open(
        chat.metadata.internal_request_id
    )


async def test_a_unary_call_confirmed_with_its_answer_is_not_counted_again():
    """Over gRPC (serve.env) Serve confirms a unary call's replica (``on_request_routed``) when its answer arrives,
    after ``on_request_completed``: a batch that just ended must not come back as held for another report."""
    clock = [time.time()]
    a = FakeReplica("a", 0, at=clock[0])
    router = await router_with(a, settle_s=0.0)
    router._clock = lambda: clock[0]
    batch = request("generate_batch", ["x" * 400] * 48, max_tokens=256)  # 17,088 tokens
    assert await route(router, batch) is a  # counted from the choice: no confirmation while it runs
    clock[0] += 1.0
    a.report(17_088, at=clock[0])  # the report counts it
    clock[0] += 5.0
    a.report(17_088, at=clock[0])
    clock[0] += 0.5
    router.on_request_completed(a.replica_id, batch.metadata.internal_request_id)
    router.on_request_routed(batch, a.replica_id, None)  # the answer arrives, with its confirmation
    assert router.held_tokens(a, clock[0]) == 0
    clock[0] += 0.5
    a.report(0, at=clock[0])
    assert router.held_tokens(a, clock[0]) == 0
    assert not router._ledger and not router._ledger.books[a.replica_id].fresh


async def test_a_report_within_settle_s_of_routing_does_not_replace_the_delta_yet():
    a = FakeReplica("a", 0)
    router = await router_with(a, settle_s=0.5)
    pending = request("generate", "x" * 400, max_tokens=100)
    await route(router, pending)
    router.on_request_routed(pending, a.replica_id, None)
    later = time.time() + 0.1  # (the router is told the time: a report is never newer than when it is seen)
    a.report(0, at=later)  # too soon: the request may still be on its way into the batcher
    assert router.held_tokens(a, later) == 200
    later += 1.0
    a.report(200, at=later)
    assert router.held_tokens(a, later) == 200

    b = FakeReplica("b", 0)
    router = await router_with(b, settle_s=0.5)
    ahead = request("generate", "x" * 400, max_tokens=100)
    assert await route(router, ahead) is b
    router.on_request_routed(ahead, b.replica_id, None)
    b.report(0, at=time.time() + 9)  # the replica's clock 9 s ahead: its report counts from when it is seen
    assert router.held_tokens(b, time.time()) == 200


async def test_completed_and_refused_requests_leave_the_delta():
    a, b = FakeReplica("a", 0), FakeReplica("b", 50)
    router = await router_with(a, b)
    done, refused, running = (request("generate", f"{i}".ljust(400, "x"), max_tokens=100) for i in range(3))
    for pending in (done, running):
        replica = await route(router, pending)
        router.on_request_routed(pending, replica.replica_id, None)
    assert router.held_tokens(a, time.time()) + router.held_tokens(b, time.time()) == 50 + 2 * 200
    router.on_request_completed(a.replica_id, done.metadata.internal_request_id)
    router.on_request_completed(b.replica_id, done.metadata.internal_request_id)
    assert router.held_tokens(a, time.time()) + router.held_tokens(b, time.time()) == 50 + 200
    # refused: chosen, then completed without ever being routed (Serve retries it)
    target = await route(router, refused)
    router.on_request_completed(target.replica_id, refused.metadata.internal_request_id)
    assert router.held_tokens(a, time.time()) + router.held_tokens(b, time.time()) == 50 + 200
    router.on_request_completed(a.replica_id, "never-seen")  # tolerated
    # chosen but never sent (its caller gave up while it waited): the next report forgets it
    abandoned = request("generate", "x" * 4_000, max_tokens=1_000)
    target = await route(router, abandoned)
    assert router.held_tokens(target, time.time()) >= 2_000
    target.report(0, at=time.time() + 1)
    assert router.held_tokens(target, time.time() + 1) == 0
    assert abandoned.metadata.internal_request_id not in router._ledger.books[target.replica_id].fresh


# -- Stale statistics, tie-breaks ---------------------------------------------------------------------------


@pytest.mark.parametrize("case", ["stale", "missing", "no at", "multiplexed"])
async def test_stale_or_missing_statistics_fall_back_to_power_of_two_choices(case):
    replicas = [FakeReplica(f"r{i}", 1_000 * i) for i in range(4)]
    pending = request("generate", "hi")
    if case == "stale":
        replicas[2].report(0, age_s=30)  # older than stale_after_s
    elif case == "missing":
        replicas[2].routing_stats = {}  # a replica that just started
    elif case == "no at":
        del replicas[2].routing_stats["at"]
    else:
        pending.metadata.multiplexed_model_id = "adapter-1"
    router = await router_with(*replicas, stale_after_s=5)
    for _ in range(20):
        ranks = await router.choose_replicas(replicas, pending)
        assert len(ranks) == 1 and len(ranks[0]) == 2  # Serve's shape: two random replicas, the shorter queue wins
    held = [router.held_tokens(r, time.time()) for r in replicas]
    assert all(h in (None, 1_000 * i) for i, h in enumerate(held))  # nothing counted
    assert await route(router, pending) in replicas
    replicas[2].report(0)  # it reports again: tokens decide
    if case != "multiplexed":
        assert names(await router.choose_replicas(replicas, request("generate", "hi")))[0] in (["r0"], ["r2"])


async def test_a_stale_report_is_a_warning_a_replica_yet_to_report_is_not(caplog):
    replicas = [FakeReplica(f"r{i}", 1_000 * i) for i in range(2)]
    replicas[1].routing_stats = {}  # start-up: no report yet
    router = await router_with(*replicas, stale_after_s=5)
    with caplog.at_level(logging.INFO, logger="serve_app"):
        await router.choose_replicas(replicas, request("generate", "hi"))
        replicas[1].report(1_000)
        await router.choose_replicas(replicas, request("generate", "hi"))  # every replica reports: tokens decide
        replicas[1].report(1_000, age_s=30)  # then its reports stop reaching the router
        for _ in range(3):
            await router.choose_replicas(replicas, request("generate", "hi"))
    fallbacks = [r for r in caplog.records if "without a fresh report" in r.getMessage()]
    assert [r.levelno for r in fallbacks] == [logging.INFO, logging.WARNING]  # once per fallback, not per request
    assert "(1 stale)" in fallbacks[1].getMessage()


async def test_ties_go_to_the_local_node_then_the_shorter_queue_and_tokens_beat_both():
    here, there = FakeReplica("here", 1_000, node="node-a", prompts=9), FakeReplica("there", 1_050, node="node-b")
    local = await router_with(here, there, prefer_local=True)  # as the HTTP proxy routes
    assert names(await local.choose_replicas([here, there], request("generate", "hi"))) == [["here"], ["there"]]
    anywhere = await router_with(here, there)  # a handle: no locality preference; 50 tokens is within 1% of 10,000
    assert names(await anywhere.choose_replicas([here, there], request("generate", "hi"))) == [["there"], ["here"]]
    far = FakeReplica("far", 0, node="node-b")
    local = await router_with(here, far, prefer_local=True)
    assert names(await local.choose_replicas([here, far], request("generate", "hi"))) == [["far"], ["here"]]
    even = [FakeReplica(f"e{i}", 0) for i in range(3)]
    router = await router_with(*even)
    firsts = {names(await router.choose_replicas(even, request("stats")))[0][0] for _ in range(60)}
    assert firsts == {"e0", "e1", "e2"}  # a free call on an even fleet goes anywhere, by chance


async def test_a_stale_queue_length_in_serves_cache_does_not_decide_ties():
    """After a burst, Serve's queue-length cache may still hold a long queue for a replica this router has not
    sent to since (its entries live 10 s); both now report an empty queue, so free calls go to both."""
    was_busy, other = FakeReplica("was-busy", 0, queue=12, prompts=0), FakeReplica("other", 0, prompts=0)
    router = await router_with(was_busy, other)
    assert router._replica_queue_len_cache.get(was_busy.replica_id) == 12  # probed during the burst
    got = {(await route(router, request("stats"))).replica_id.unique_id for _ in range(40)}
    assert got == {"was-busy", "other"}


async def test_replicas_that_leave_take_their_books_with_them():
    a, b = FakeReplica("a", 0), FakeReplica("b", 0)
    router = await router_with(a, b)
    pending = request("generate", "x" * 400)
    replica = await route(router, pending)
    router.on_request_routed(pending, replica.replica_id, None)
    router.update_replicas([r for r in (a, b) if r is not replica])
    assert replica.replica_id not in router._ledger.books
    router.on_replica_actor_died(a.replica_id)
    assert a.replica_id not in router._ledger.books


def test_the_app_config_selects_the_router_and_serve_can_load_it():
    from ray.serve.config import RequestRouterConfig

    from serve_app.config import AppConfig
    from serve_app.serving.options import deployment_options

    routing = {"stale_after_s": 3.0, "prefix_weight": 2, "adapter_weight": 500}
    options = deployment_options(AppConfig(engine="simulated", routing=routing))
    config = RequestRouterConfig(**options["request_router_config"])
    cls = config.get_request_router_class()  # what every proxy and handle does: pickled by value, loaded back
    assert cls.__name__ == "TokenLoadRouter"
    assert config.request_router_kwargs == {
        "stale_after_s": 3.0,
        "default_max_tokens": 128,
        "prefix_weight": 2.0,
        "prefix_max_share": 1.0,
        "adapter_weight": 500.0,
        "base_model": "SmolLM2-135M-Instruct",
        "session_affinity": True,
    }
    assert "request_router_config" not in deployment_options(AppConfig(engine="simulated", routing={"router": "serve"}))


def test_one_replica_at_most_is_not_routed_by_tokens_nor_behind_the_ingress_router(monkeypatch):
    """With ``max_replicas: 1`` there is nothing to pick: Serve's own router, and under HAProxy no ingress router
    for each request to visit first. From two replicas up, both."""
    from serve_app import app as app_module
    from serve_app.config import AppConfig
    from serve_app.serving.options import deployment_options

    one = {"engine": "simulated", "autoscaling": {"min_replicas": 1, "max_replicas": 1}}
    two = {**one, "autoscaling": {"min_replicas": 1, "max_replicas": 2}}
    assert not AppConfig(**one).routes_by_tokens and AppConfig(**two).routes_by_tokens
    assert "request_router_config" not in deployment_options(AppConfig(**one))
    assert "request_router_config" in deployment_options(AppConfig(**two))
    monkeypatch.setattr(app_module, "haproxy_enabled", lambda: True)
    attached: list[Any] = []
    monkeypatch.setattr(app_module, "with_ingress_router", lambda app, poll_s: attached.append(app) or app)
    app_module.build_app(one)
    assert attached == []
    app_module.build_app(two)
    assert len(attached) == 1


# -- Several replicas on several nodes ----------------------------------------------------------------------


@pytest.mark.soak
def test_token_router_balances_tokens_held_across_nodes_better_than_serves_router():
    """4 replicas of the SIMULATED engine, one per node of a local 4-node cluster; the same skewed workload (a few
    48-prompt batches with long outputs among many short chats, streamed and over HTTP) through each router in
    turn. Asserts on what the subprocess prints: every request answered once, the replicas on 4 nodes, and the
    spread of tokens held (max - min over the replicas, sampled while the load runs) smaller with the token router.
    A measurement (20 s of load per router on 4 nodes), so in the soak tier; the system tier places replicas across
    nodes (test_placement.py) and routes by tokens under HAProxy (below)."""
    result = private_cluster_result(["-m", "benchmarks.routing", "--check"], timeout_s=540)
    for router in ("tokens", "serve"):
        run = result[router]
        assert run["errors"] == [], run["errors"]
        assert run["answered"] == run["sent"] and run["prompts_run"] == run["prompts_sent"], run  # each once
        assert len(set(run["nodes"].values())) == 4, run["nodes"]  # the replicas really sit on 4 nodes
        assert run["samples"] >= 10
    tokens, serve = result["tokens"], result["serve"]
    assert tokens["spread_mean"] < serve["spread_mean"], (tokens["spread_mean"], serve["spread_mean"])
    # Until 2026-11-27 this failed now and then (16,276 against 16,052 in one fresh clone; 2 of 14 runs by hand):
    # the router counted a batch that had just ended as still held until the next report (1-2 s), and over gRPC
    # counted it once more when Serve confirmed its replica with the answer, so the next batch went beside a busy
    # one. Since that fix the token router's spread was 14,029-14,195 in four runs, at this scenario's floor (one
    # long batch), and no replica held more than its budget; Serve's router's 17,345-19,479 (15,535 its lowest seen).
    # Not the p90: a 48-prompt batch cannot be split, so whenever one has just landed the spread is one batch's
    # tokens under either router, and that is what this scenario's p90 measures: in two of three runs on
    # 2026-11-26 the token router's was the larger, by under 0.5% (18,786 against 18,703; 18,841 against 18,761).


# -- The HTTP door under HAProxy ----------------------------------------------------------------------------


def http_door_check(url: str) -> dict[str, Any]:
    """Run by a driver of the real app's cluster (`serve run serve_config.yaml`: serve.env's settings, so HAProxy
    holds the HTTP port at ``url``), beside its apps: two replicas of the SIMULATED engine; a ``generate_batch``
    handle call of 48 long prompts (a Ray Data job's shape, invisible to HAProxy: no HTTP connection) loads one,
    then 8 streamed chats arrive over HTTP at once. Returns the prompts each replica holds while the chats stream,
    for each router setting."""
    import os

    import httpx
    import ray
    from ray import serve

    from harness.replicas import replica_actors
    from serve_app.app import build_app
    from serve_app.direct import replica_groups

    assert os.environ.get("RAY_SERVE_ENABLE_HA_PROXY") == "1", "the driver has serve.env's settings"
    ray.init(log_to_driver=False)
    chat = {"messages": [{"role": "user", "content": "hello"}], "max_tokens": 400, "stream": True}
    job_prompts = 48

    async def prompts_held(app: str) -> dict[str, float]:
        async with httpx.AsyncClient(base_url=f"{url}/{app}", timeout=60) as client:
            streams = [client.stream("POST", "/v1/chat/completions", json=chat) for _ in range(8)]
            responses = [await stream.__aenter__() for stream in streams]
            lines = [response.aiter_lines() for response in responses]  # held: a dropped one closes its stream
            for response, chunks in zip(responses, lines):
                assert response.status_code == 200, await response.aread()
                await chunks.__anext__()  # each chat streams: it sits in a replica's batcher
            reports = {name: await a.record_routing_stats.remote() for name, a in replica_actors(app).items()}
            for stream in streams:
                await stream.__aexit__(None, None, None)
        return {name: report["prompts"] for name, report in reports.items()}

    def loaded_replicas(app: str) -> set[str]:
        return {n for n, a in replica_actors(app).items() if ray.get(a.record_routing_stats.remote())["prompts"]}

    def routers_have_the_job(handle: Any) -> bool:
        """Whether the replicas' reports Serve's controller relays to every router (this process's, for ``handle``,
        and the ingress router's, HAProxy's, alike: one long-poll broadcast) show the job. Ray 2.60's internals:
        nothing public shows a router's view. Probing the ingress router's picks instead cannot tell: each pick is
        counted at the replica picked until that replica's next report, and reports arrive at different times, so
        picks ran away from the job's replica while its report still predated the job (the CI failure of
        2026-11-26: 7 and 49 prompts, its report 2 s old)."""
        router = handle._router._asyncio_router.request_router
        reports = [r.routing_stats or {} for r in list(router._replicas.values())]
        return any(float(report.get("prompts") or 0) >= job_prompts for report in reports)

    def wait_until_routed_away(app: str, handle: Any, body: dict) -> None:
        """Until the job is in the replicas' reports as the routers have them, and HAProxy's router for ``app`` (its
        ``/internal/route``) picks the other replica: its load is then 48 prompts' tokens against none, so nothing
        but a report without the job could make it pick the job's replica."""
        group = next(g for g in replica_groups() if g["app_name"] == app and g["protocol"] == "HTTP")
        url = f"http://127.0.0.1:{group['ingress_request_router_targets'][0]['port']}/internal/route"
        deadline, loaded = time.monotonic() + 60, loaded_replicas(app)
        while not routers_have_the_job(handle):
            assert time.monotonic() < deadline, "the job never showed in the reports the routers have"
            time.sleep(0.05)
        while True:
            assert time.monotonic() < deadline, "HAProxy's router never routed away from the job"
            picked = httpx.post(url, json=body, timeout=10).json()["replica_id"]
            if not any(picked.endswith(name) for name in loaded):
                return

    def requests_by_replica(app: str) -> dict[str, int]:
        """The requests each replica's engine took so far, from each replica's own ``/stats`` (its direct port)."""
        group = next(g for g in replica_groups() if g["app_name"] == app and g["protocol"] == "HTTP")
        ports = [target["port"] for target in group["targets"]]  # each binds Serve's HTTP host, as HAProxy does here
        stats = {port: httpx.get(f"http://127.0.0.1:{port}/{app}/stats", timeout=10).json() for port in ports}
        return {str(port): s["engine_stats"]["requests"] for port, s in stats.items()}

    def session_spread(app: str, session: str | None) -> list[int]:
        """Where 8 short chats, one after another, went (requests per replica), with the ``x-session-id`` header
        ``session`` (None: none). The ingress router never sees an HTTP answer end, so it counts each chat at its
        replica until a report measured after it: without a session the next one goes to the other replica."""
        while loaded_replicas(app):  # the cancelled job has left both replicas
            time.sleep(0.2)
        before = requests_by_replica(app)
        headers = {"x-session-id": session} if session else {}
        for _ in range(8):
            body = {**chat, "stream": False, "max_tokens": 4}
            response = httpx.post(f"{url}/{app}/v1/chat/completions", json=body, headers=headers, timeout=60)
            assert response.status_code == 200, response.text
        return sorted(n - before[name] for name, n in requests_by_replica(app).items())

    result = {}
    for router in ("tokens", "serve"):
        args = {
            "engine": "simulated",
            "cpus_per_replica": 0.25,  # beside the real app's replicas on its 2 CPUs
            "simulated": {"step_s": 0.02},  # a 400-token chat streams for about 8 s, the job's answers 20 s
            "autoscaling": {"min_replicas": 2, "max_replicas": 2},
            "routing": {"router": router},
        }
        handle = serve.run(build_app(args), name=router, route_prefix=f"/{router}")
        while len(replica_actors(router)) < 2:
            time.sleep(0.5)
        # Serve's controller relays each replica's report to the routers every second; nothing public shows when a
        # router has its first, and until then the token router falls back to power of two choices
        time.sleep(3.0)
        job = handle.generate_batch.remote(["a long job prompt " * 8] * job_prompts, max_tokens=1_024)
        while not loaded_replicas(router):  # the job sits in one replica's batcher before the chats come
            time.sleep(0.2)
        if router == "tokens":
            wait_until_routed_away(router, handle, chat)  # the routers have the replicas' reports of the job
        result[router] = asyncio.run(prompts_held(router))
        job.cancel()
        if router == "tokens":
            result["session"], result["no_session"] = session_spread(router, "chat-42"), session_spread(router, None)
        serve.delete(router)
    result["fallbacks"] = stale_fallbacks()
    return result


def stale_fallbacks() -> list[str]:
    """The token routers' warnings in this cluster's logs that they routed by counts because a report went stale
    (each router warns once a fallback; see ``TokenLoadRouter.choose_replicas``)."""
    from pathlib import Path

    from ray._private.worker import global_worker

    found = []
    for path in Path(global_worker.node.get_logs_dir_path()).rglob("*"):
        if path.is_file() and path.suffix in (".log", ".err", ".out"):
            text = path.read_text(errors="replace")
            stale = [line for line in text.splitlines() if "without a fresh report" in line and "(0 stale)" not in line]
            found += [f"{path.name}: {line.strip()}" for line in stale]
    return found


@pytest.mark.system
def test_chats_over_http_avoid_the_replica_a_handle_job_loads_under_haproxy(real_app):
    """HAProxy (serve.env) sends each chat straight to a replica; the token router, asked through the app's ingress
    router, sends the 8 to the replica the 48-prompt handle job does not hold (48 prompts on one, 8 on the other)
    once the routers have the replicas' reports of the job. Then 8 chats of one session (``x-session-id``) all go to
    one replica, and 8 without the header do not.
    HAProxy's own least connections (``router: serve``) sees no connection from the job and puts chats on both."""
    result = real_app.call("tests.test_routing:http_door_check", real_app.url)
    tokens, serve = sorted(result["tokens"].values()), sorted(result["serve"].values())
    # Until 2026-11-26 one to three of the eight sometimes went beside the job: the wait before the chats probed the
    # ingress router's picks, which ran away from the job's replica on the router's own bookkeeping while the job's
    # report had not reached it yet (see routers_have_the_job).
    assert tokens == [8, 48], result  # result["fallbacks"]: a router's reports went stale
    # x-session-id: HAProxy forwards it to the ingress router, the token router keeps the session on one replica
    assert result["session"] == [0, 8] and result["no_session"] != [0, 8], result
    assert serve[1] > 48 and sum(serve) == 56, result  # least connections: chats beside the job too
