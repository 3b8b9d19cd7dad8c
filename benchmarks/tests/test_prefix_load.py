"""The routing benchmark's prefix workload (benchmarks/routing/prefix_load.py): seeded system prompts of the stated
length, and conversations that grow turn by turn on their own history, against a stand-in chat server in this
process (no Ray, no engine)."""

from __future__ import annotations

import asyncio
import json
import math

from benchmarks.routing import prefix_load
from benchmarks.routing.spread import Spread

USAGE = {"completion_tokens": 3, "prompt_tokens": 10, "prompt_tokens_details": {"cached_tokens": 4}}


async def answer(request, number: int, usage: dict = USAGE):
    """A streamed chat answer, ``answer <number>``, of 3 tokens, 4 of its 10 prompt tokens cached."""
    from aiohttp import web

    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    for chunk in (
        {"choices": [{"delta": {"content": f"answer {number}"}}]},
        {"choices": [], "usage": usage},
    ):
        await response.write(f"data: {json.dumps(chunk)}\n\n".encode())
    await response.write(b"data: [DONE]\n\n")
    return response


async def talk(chat, sessions: bool = False, seconds: float = 0.3, varied: bool = False, responses=None) -> list[dict]:
    """The conversations for ``seconds`` against ``chat``, a stand-in chat route in this process (or ``responses``, a
    stand-in Responses route, for the Responses client)."""
    from aiohttp import web

    app = web.Application()
    if chat is not None:
        app.router.add_post("/v1/chat/completions", chat)
    if responses is not None:
        app.router.add_post("/v1/responses", responses)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    try:
        systems = [f"system {i}" for i in range(8)]
        client = "responses" if responses is not None else "sessions" if sessions else "chat"
        return await prefix_load.conversations(url, systems, seconds, client=client, varied=varied)
    finally:
        await runner.cleanup()


def test_system_prompts_are_seeded_distinct_and_of_the_stated_length():
    from transformers import AutoTokenizer

    from serve_app.models import prepare

    folder = prepare()
    prompts = prefix_load.system_prompts(folder)
    assert prompts == prefix_load.system_prompts(folder)
    assert len(prompts) == prefix_load.CONVERSATIONS // prefix_load.SHARING == len(set(prompts))
    tokenizer = AutoTokenizer.from_pretrained(folder)
    lengths = [len(tokenizer(p, add_special_tokens=False)["input_ids"]) for p in prompts]
    assert all(abs(n - prefix_load.SYSTEM_TOKENS) <= 5 for n in lengths), lengths  # decoded and read back


def test_each_turn_sends_its_conversation_so_far_and_a_failed_turn_ends_it():
    from aiohttp import web

    seen: list[list[dict[str, str]]] = []

    async def chat(request: web.Request) -> web.StreamResponse:
        messages = (await request.json())["messages"]
        seen.append(messages)
        if "client 31" in messages[-1]["content"]:
            return web.json_response({"error": {"message": "refused"}}, status=400)
        return await answer(request, len(messages))

    outcomes = asyncio.run(talk(chat))
    for messages in seen:
        turn = (len(messages) - 2) // 2
        assert messages[0]["content"] == f"system {int(messages[-1]['content'].split('client ')[1].split(':')[0]) // 4}"
        assert [m["role"] for m in messages] == ["system"] + ["user", "assistant"] * turn + ["user"]
        assert all(m["content"] == f"answer {2 + 2 * k}" for k, m in enumerate(messages[2::2]))  # its own answers
    ok = [o for o in outcomes if o["ok"]]
    assert ok and all(o["tokens"] == 3 and o["ttft"] is not None for o in ok)
    refused = [o for o in outcomes if o["client"] == 31]
    assert refused and all(not o["ok"] and o["turn"] == 0 and "400" in o["error"] for o in refused)
    figures = prefix_load.summarize(outcomes)
    assert figures["failed"] == len(refused) and figures["ttft_p50_s"] > 0
    assert figures["cache_hit_rate"] == 0.4


def test_the_hit_rate_is_the_cached_share_of_every_prompt_token_and_unknown_where_a_turn_has_none():
    turns = [{"prompt_tokens": 100, "cached_tokens": 90}, {"prompt_tokens": 300, "cached_tokens": 10}]
    assert prefix_load.cache_hit_rate(turns) == 0.25  # 100 of 400, not the mean of 0.9 and 0.03
    assert math.isnan(prefix_load.cache_hit_rate([*turns, {"prompt_tokens": 50, "cached_tokens": None}]))
    assert math.isnan(prefix_load.cache_hit_rate([]))


def test_each_replica_hit_rate_counts_what_its_engine_finished_while_the_load_ran():
    spread = Spread([])
    assert spread.hit_rates() == []  # no samples
    spread.prompts = [[(1_000, 500), (0, 0)], [(1_400, 800), (2_000, 100)], [(2_000, 1_100), (2_000, 100)]]
    assert spread.hit_rates() == [0.6, 0.05]  # 600 of 1,000 since the first sample; 100 of 2,000
    spread.prompts = [[(10, 5)], [(10, 5)]]
    assert math.isnan(spread.hit_rates()[0])  # nothing finished there


def test_with_sessions_each_conversation_names_itself_in_the_session_header():
    sessions: dict[str | None, set[str]] = {}  # x-session-id -> the conversations (client, first question) it named

    async def chat(request):
        messages = (await request.json())["messages"]
        sessions.setdefault(request.headers.get("x-session-id"), set()).add(messages[1]["content"])
        return await answer(request, len(messages))

    asyncio.run(talk(chat))
    assert list(sessions) == [None]  # no header unless asked
    sessions.clear()
    outcomes = asyncio.run(talk(chat, sessions=True, seconds=1.0))  # time for conversations to start over
    assert None not in sessions and len(sessions) > prefix_load.CONVERSATIONS  # a new id for each new conversation
    assert all(len(firsts) == 1 for firsts in sessions.values())  # one conversation's turns, and only its
    assert max(o["turn"] for o in outcomes) == prefix_load.TURNS - 1


def test_the_responses_client_sends_each_turn_after_the_response_before_it():
    """Its first turn sends the system prompt and the question, each later one only its question, naming the response
    before; each outcome is read from the stream's events (usage of the final response); a failed turn ends it."""
    from aiohttp import web

    made: dict[str, list[dict[str, str]]] = {}  # response id -> the conversation it ended

    async def responses(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        previous = body.get("previous_response_id")
        conversation = [*(made[previous] if previous else []), *body["input"]]
        if "client 30" in body["input"][-1]["content"]:
            return web.json_response({"error": {"message": "refused"}}, status=400)
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        made[ident := f"resp_{len(made)}"] = [*conversation, {"role": "assistant", "content": "an answer"}]
        usage = {"input_tokens": 10, "output_tokens": 3, "input_tokens_details": {"cached_tokens": 6}}
        final = {"type": "response.incomplete", "response": {"id": ident, "usage": usage}}
        for event in ({"type": "response.output_text.delta", "delta": "an answer"}, final):
            await response.write(f"event: {event['type']}\ndata: {json.dumps(event)}\n\n".encode())
        return response

    outcomes = asyncio.run(talk(None, responses=responses))
    assert made and all(c[0]["role"] == "system" and c[0]["content"].startswith("system ") for c in made.values())
    roles = [[m["role"] for m in c] for c in made.values()]
    assert all(r == ["system"] + ["user", "assistant"] * ((len(r) - 1) // 2) for r in roles)
    assert max(len(c) for c in made.values()) > 3  # later turns continued a stored response
    ok = [o for o in outcomes if o["ok"]]
    assert ok and all(o["tokens"] == 3 and o["ttft"] is not None and o["id"] in made for o in ok)
    refused = [o for o in outcomes if o["client"] == 30]
    assert refused and all(not o["ok"] and o["turn"] == 0 and "400" in o["error"] for o in refused)
    assert prefix_load.summarize(outcomes)["cache_hit_rate"] == 0.6


def test_a_cache_size_is_told_in_the_tokens_it_holds(tmp_path, monkeypatch):
    """Keys and values of every layer and key-value head, two bytes each in bfloat16 and four in float32."""
    config = {"num_hidden_layers": 30, "num_key_value_heads": 3, "hidden_size": 576, "num_attention_heads": 9}
    (tmp_path / "config.json").write_text(json.dumps(config))
    monkeypatch.setattr(prefix_load, "DTYPE", "bfloat16")
    assert prefix_load.cache_size(tmp_path, 0.25) == "0.25 GiB (about 11,651 tokens)"  # 2**28 / 23,040 bytes
    monkeypatch.setattr(prefix_load, "DTYPE", "float32")
    assert prefix_load.cache_size(tmp_path, 2) == "2 GiB (about 46,603 tokens)"


def test_varied_answers_are_drawn_per_turn_from_the_seed_and_fixed_ones_are_all_alike():
    asked: dict[str, list[int]] = {}  # a conversation's first question -> the max_tokens of its turns

    async def chat(request):
        body = await request.json()
        asked.setdefault(body["messages"][1]["content"], []).append(body["max_tokens"])
        return await answer(request, len(body["messages"]))

    asyncio.run(talk(chat))
    assert {n for lengths in asked.values() for n in lengths} == {prefix_load.ANSWER_TOKENS}
    runs = []
    for _ in range(2):
        asked.clear()
        asyncio.run(talk(chat, varied=True))
        runs.append({question: lengths[0] for question, lengths in asked.items()})  # each conversation's first turn
    low, high = prefix_load.VARIED_ANSWERS
    drawn = list(runs[0].values())
    assert all(low <= n <= high for n in drawn) and len(set(drawn)) > 3  # drawn, not one length
    same = runs[0].keys() & runs[1].keys()
    assert len(same) >= prefix_load.CONVERSATIONS and all(runs[0][q] == runs[1][q] for q in same)  # seeded


def test_the_simulated_fleets_app_is_valid_and_its_system_prompts_are_the_workloads():
    from benchmarks.routing import prefixes
    from serve_app.config import AppConfig
    from serve_app.engines.simulated.text import SimulatedText

    configs = {peer: AppConfig.model_validate(prefixes.app_args(peer, 4_096)) for peer in prefixes.PEERS}
    assert all(c.simulated.prefix_caching and c.simulated.kv_cache_tokens == 4_096 for c in configs.values())
    assert configs["tokens-noprefix"].routing.prefix_weight == 0 and configs["serve"].routing.router == "serve"
    systems = prefixes.system_prompts()
    assert len(systems) == prefix_load.CONVERSATIONS // prefix_load.SHARING == len(set(systems))
    assert {len(SimulatedText.tokens(s)) for s in systems} == {prefix_load.SYSTEM_TOKENS}
    assert prefixes.system_prompts() == systems  # seeded


def test_the_simulated_fleets_rounds_become_medians_and_ratios_of_ttft():
    from benchmarks.routing.prefixes import summary

    def run(peer, k, p50, rates):
        figures = {"turns": 10, "output_tok_s": 100.0, "ttft_p99_s": 2.0, "held_imbalance": 0.1}
        return {"peer": peer, "round": k, "ttft_p50_s": p50, "hit_rates": rates, "failed": 0, **figures}

    runs = [
        run("tokens", 0, 1.0, [0.8, 0.9]),
        run("tokens", 1, 2.0, [0.6, 0.7]),
        run("serve", 0, 4.0, [0.4, 0.5]),
        run("serve", 1, 2.0, [0.4, 0.3]),
    ]
    rows = {r["peer"]: r for r in summary(runs, ["tokens", "serve"])}
    assert rows["tokens"]["p50_vs_serve"] == (0.25 + 1.0) / 2 and rows["serve"]["p50_vs_serve"] == 1.0
    assert rows["tokens"]["hit_rate"] == (0.85 + 0.65) / 2 and rows["tokens"]["hit_rates"] == "0.60-0.90"
    assert "p50_vs_noprefix" not in rows["tokens"]  # that peer did not run
