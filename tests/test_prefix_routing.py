"""The token router's prefix score (serving/routing/prefixes.py, router.py): the index of prompt blocks sent to each
replica, and ranking that weighs the prompt tokens a replica most likely holds in its prefix cache against the tokens
it holds, bounded by ``prefix_max_share``. Unit tests on Ray Serve's real router machinery with fake replicas."""

from __future__ import annotations

import pytest

from serve_app.serving.routing.prefixes import PREFIX_CACHE_TOKENS, PrefixIndex, prompt_text
from serve_app.serving.routing.request_cost import body_call

from .test_routing import FakeReplica, request, route, router_with

SYSTEM = "You are a careful assistant. " * 140  # 4,060 characters: 63 blocks of 64, about 1,000 tokens


def conversation(turns: int, tag: str) -> list[dict[str, str]]:
    """A chat's messages after ``turns`` user turns: the shared system prompt, then its own history."""
    messages = [{"role": "system", "content": SYSTEM}]
    for turn in range(turns):
        messages += [
            {"role": "user", "content": f"{tag} question {turn} " * 8},
            {"role": "assistant", "content": f"{tag} answer {turn} " * 8},
        ]
    return messages[:-1]  # it ends with the user's question


def test_prompts_share_keys_exactly_as_far_as_they_share_whole_blocks():
    index = PrefixIndex(block_chars=4)
    assert index.keys("abcdefgh") == index.keys("abcdefghij")  # a partial last block has no key
    first, second = index.keys("abcdefghijkl"), index.keys("abcdXfghijkl")
    assert first[0] == second[0] and not set(first[1:]) & set(second[1:])  # a key stands for all before it too
    assert index.keys("abc") == [] and len(index.keys("a" * 40)) == 10
    assert not set(index.keys("abcdefgh", "tenant-a")) & set(index.keys("abcdefgh", "tenant-b"))  # vLLM's cache_salt


def test_each_replica_keeps_its_most_recent_blocks_up_to_its_capacity_and_a_gone_one_is_forgotten():
    index = PrefixIndex(block_chars=4, capacity_blocks=3)
    old, new = index.keys("aaaabbbbcccc"), index.keys("xxxxyyyy")
    index.record("r0", old)
    assert index.matched("r0", old) == 3 and index.matched("r0", index.keys("aaaabbbbzzzz")) == 2
    assert index.matched("r1", old) == 0
    index.record("r0", new)  # two more blocks: the two least recently used go, a prompt's tail before its head
    assert index.matched("r0", new) == 2 and index.matched("r0", old) == 1  # as vLLM evicts: its head stays
    index.forget({"r0"})
    assert index.matched("r0", new) == 0 and index.replicas() == set()
    with pytest.raises(ValueError, match="block_chars"):
        PrefixIndex(block_chars=0)


def test_a_replica_keeps_no_more_blocks_than_the_prefix_cache_it_reports():
    index = PrefixIndex(block_chars=4, capacity_blocks=100)  # a block of 4 characters: 1 token
    first, second = index.keys("aaaabbbbcccc"), index.keys("xxxxyyyyzzzz")
    index.record("r0", first, cache_tokens=4)
    index.record("r0", second, cache_tokens=4)
    assert index.matched("r0", second) == 3 and index.matched("r0", first) == 1  # 4 blocks: first's tail went
    index.record("r1", first, cache_tokens=None)  # no report: the index's own capacity
    index.record("r1", second, cache_tokens=None)
    assert index.matched("r1", first) == 3
    index.record("r2", first, cache_tokens=0)  # no prefix cache: nothing to credit
    assert index.matched("r2", first) == 0 and "r2" not in index.replicas()


async def test_the_router_credits_only_what_a_replicas_reported_prefix_cache_can_still_hold():
    """Two prompts routed to a replica whose engine's prefix cache holds less than both: the older one's head is
    still credited there, its tail is not; a replica that reports no prefix cache is credited nothing."""
    a = FakeReplica("a", 0)
    router = await router_with(a, settle_s=0.0)
    blocks = len(SYSTEM) // 64
    a.routing_stats[PREFIX_CACHE_TOKENS] = (blocks + 10) * router._prefixes.block_tokens
    first, second = request("generate", SYSTEM, max_tokens=4), request("generate", "x" * len(SYSTEM), max_tokens=4)
    for pending in (first, second):
        assert await route(router, pending) is a
    assert router._prefixes.matched(a.replica_id, router.prefix_keys(second)) == blocks
    assert router._prefixes.matched(a.replica_id, router.prefix_keys(first)) == 10
    a.routing_stats[PREFIX_CACHE_TOKENS] = 0
    assert await route(router, request("generate", SYSTEM, max_tokens=4)) is a
    assert router._prefixes.matched(a.replica_id, router.prefix_keys(first)) == 0


def test_a_prompt_is_read_as_text_a_chat_as_its_messages_in_turn():
    chat = [{"role": "system", "content": "be brief"}, {"role": "user", "content": [{"type": "text", "text": "hi"}]}]
    assert prompt_text(chat) == "<system>be brief\n<user>hi\n"
    assert prompt_text(chat).startswith(prompt_text(chat[:1]))  # a longer conversation extends the shorter's text
    assert prompt_text("plain") == "plain" and prompt_text([1, 2]) == "1 2"
    assert prompt_text(None) is None and prompt_text([object()]) is None


async def test_cached_prompt_tokens_take_prefix_weight_tokens_off_a_replica_up_to_its_max_share():
    busy, idle = FakeReplica("busy", 3_000), FakeReplica("idle", 2_000)  # budgets of 10,000 tokens
    held = {busy.replica_id: 3_000.0, idle.replica_id: 2_000.0}
    cached = {busy.replica_id: 900.0}  # the request's prompt tokens that "busy" holds in its prefix cache

    def first() -> FakeReplica:
        return router.rank([busy, idle], held, 1_010, cached)[0]

    router = await router_with(busy, idle, tie_fraction=0, prefix_weight=1)
    assert first() is idle  # 3,000 + 1,010 - 900 > 2,000 + 1,010: a weight of 1 does not cover the difference
    router = await router_with(busy, idle, tie_fraction=0, prefix_weight=2)
    assert first() is busy  # 3,000 + 1,010 - 1,800 < 3,010
    router = await router_with(busy, idle, tie_fraction=0)
    assert first() is busy  # the default weight, 4: 3,600 off, within the default bound (the whole budget)
    router = await router_with(busy, idle, tie_fraction=0, prefix_weight=2, prefix_max_share=0.05)
    assert first() is idle  # the guard: the score takes at most 500 tokens off (5% of the budget)
    router = await router_with(busy, idle, tie_fraction=0, prefix_weight=0)
    assert first() is idle
    with pytest.raises(ValueError, match="prefix_weight"):
        await router_with(busy, prefix_weight=-1)


async def test_each_conversations_turns_go_where_its_prefix_was_sent():
    """Eight conversations over two equally loaded replicas: every later turn goes where the conversation's earlier
    turns went (what the router sent there is counted as held until it completes, as each turn does here)."""
    a, b = FakeReplica("a", 0), FakeReplica("b", 0)
    router = await router_with(a, b, settle_s=0.0)
    went: dict[str, list[str]] = {}
    for turns in (1, 2, 3):
        for tag in "abcdefgh":
            pending = request("chat", conversation(turns, tag), max_tokens=16)
            replica = await route(router, pending)
            router.on_request_routed(pending, replica.replica_id, None)
            router.on_request_completed(replica.replica_id, pending.metadata.internal_request_id)
            went.setdefault(tag, []).append(replica.replica_id.unique_id)
    assert all(len(set(replicas)) == 1 for replicas in went.values()), went


async def test_the_ingress_routers_body_fields_and_a_one_prompt_batch_are_read_for_prefixes():
    router = await router_with(FakeReplica("a"))
    method, fields = body_call({"messages": conversation(1, "x"), "max_tokens": 5})
    assert router.prefix_keys(request(method, **fields)) == router._prefixes.keys(prompt_text(fields["messages"]))
    responses = {"model": "m", "input": conversation(1, "x"), "max_output_tokens": 5}  # a Responses API first turn
    method, fields = body_call(responses)
    assert router.prefix_keys(request(method, **fields)) == router._prefixes.keys(prompt_text(responses["input"]))
    method, fields = body_call({"prompts": [SYSTEM], "max_tokens": 5})
    assert len(router.prefix_keys(request(method, **fields))) == len(SYSTEM) // 64
    assert router.prefix_keys(request("generate_batch", [SYSTEM, SYSTEM])) == []  # a batch: no one prefix
    router = await router_with(FakeReplica("a"), prefix_weight=0)
    assert router.prefix_keys(request("generate", SYSTEM)) == []


async def test_a_burst_on_one_prefix_piles_on_its_replica_only_up_to_the_max_share():
    """The guard: however strong the prefix score, a replica takes the prefix's requests only while it holds less
    than ``prefix_max_share`` of its budget (2,500 of 10,000 tokens) more than the other."""
    a, b = FakeReplica("a", 0), FakeReplica("b", 0)
    router = await router_with(a, b, settle_s=0.0, tie_fraction=0, prefix_weight=4, prefix_max_share=0.25)
    went = []
    for i in range(20):  # none completes: each adds its own ~510 tokens where the prefix is held, else ~1,525
        pending = request("generate", SYSTEM + f" request {i:02d} ".rjust(64, "x") * 32, max_tokens=10)
        replica = await route(router, pending)
        router.on_request_routed(pending, replica.replica_id, None)
        went.append(replica.replica_id.unique_id)
        held = [router.held_tokens(r, router._clock()) for r in (a, b)]
        assert abs(held[0] - held[1]) <= 2_500 + 1_525, (went, held)
    assert went[1] == went[0] and went[2] == went[0]  # within the share, the prefix wins over tokens held
    assert went.count("a") >= 8 and went.count("b") >= 8  # past it, the other replica takes its part


async def test_a_request_is_booked_less_the_prefix_its_replica_holds_and_whole_where_another_takes_it():
    """Between reports the router adds what it sends to a replica's held tokens as that replica's admission counts
    it: a prompt prefix its requests in flight share, once. Where another replica takes the request, it holds
    none of it there: the whole cost."""
    a, b = FakeReplica("a", 0), FakeReplica("b", 0)
    router = await router_with(a, b, settle_s=0.0, tie_fraction=0)

    def held() -> list[float]:
        return [router.held_tokens(r, router._clock()) for r in (a, b)]

    first = request("generate", SYSTEM, max_tokens=10)
    cost = router.estimate_cost(first)
    went = await route(router, first)
    router.on_request_routed(first, went.replica_id, None)
    assert sorted(held()) == [0, cost]  # nothing of it was held anywhere
    second = request("generate", SYSTEM + "and a question of its own", max_tokens=10)
    assert await route(router, second) is went
    shared = len(router.prefix_keys(first)) * router._prefixes.block_tokens
    assert max(held()) == cost + router.estimate_cost(second) - shared  # chosen: counted less what it shares
    other = b if went is a else a
    router.on_request_routed(second, other.replica_id, None)  # but the other replica took it
    assert sorted(held()) == [cost, router.estimate_cost(second)]


@pytest.mark.serve
async def test_a_replica_reports_the_prefix_cache_its_engine_holds(deploy):
    """What bounds the router's index for that replica: its engine's KV cache where it keeps a prefix cache (the
    SIMULATED engine's opt-in one here), none where it does not."""
    from harness.replicas import replica_actors

    deploy("prefix-cache", simulated={"prefix_caching": True, "kv_cache_tokens": 4_096})
    deploy("no-prefix-cache", simulated={"kv_cache_tokens": 4_096})
    for app, tokens in [("prefix-cache", 4_096), ("no-prefix-cache", 0)]:
        reports = [await actor.record_routing_stats.remote() for actor in replica_actors(app).values()]
        assert [report[PREFIX_CACHE_TOKENS] for report in reports] == [tokens], reports
