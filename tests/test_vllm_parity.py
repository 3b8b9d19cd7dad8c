"""The same tool-calling requests to the real app and to vLLM's own server on the same model and settings (the shipped
config's chat template, tool parser and context, the dtype and compute threads the app's engine has, eager, greedy):
the same prompt to the token, the same tool calls and finish reasons, on chat completions and the Responses API,
the same prompt for a chat template's arguments and a truncation, the same stop reasons, and the same status codes for
what both refuse.
In the soak tier: it starts vLLM's server beside the real app, which `make test` has no time for."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import yaml

from harness.environment import ROOT, http_status, offline_env
from harness.launcher import SERVE_RUN_START_S, running, vllm_server
from harness.ports import free_port

from .test_streaming import sse_payloads, token_chunk_ends

pytestmark = pytest.mark.soak

MODEL = "SmolLM2-135M-Instruct"
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather now",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 24}},
            "required": ["city"],
        },
    },
}
TIME = {
    "type": "function",
    "function": {
        "name": "get_time",
        "description": "The time now in a time zone",
        "parameters": {"type": "object", "properties": {"zone": {"type": "string", "maxLength": 32}}},
    },
}
ASK = [{"role": "user", "content": "What is the weather in Paris? Use the tool."}]
ANSWERED = [
    *ASK,
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
        ],
    },
    {"role": "tool", "tool_call_id": "call_1", "content": "Sunny, 21 degrees"},
]
NAMED = {"type": "function", "function": {"name": "get_weather"}}
STRICT = {"type": "function", "function": {**WEATHER["function"], "strict": True}}

CHATS = [
    pytest.param({"messages": ASK, "tools": [WEATHER, TIME], "tool_choice": "required"}, id="required"),
    pytest.param({"messages": ASK, "tools": [WEATHER, TIME], "tool_choice": NAMED}, id="named"),
    pytest.param({"messages": ASK, "tools": [STRICT, TIME], "tool_choice": "required"}, id="required, a strict tool"),
    pytest.param({"messages": ASK, "tools": [WEATHER, TIME], "tool_choice": "auto"}, id="auto"),
    pytest.param({"messages": ASK, "tools": [STRICT, TIME], "tool_choice": "auto"}, id="auto, a strict tool"),
    pytest.param({"messages": ASK, "tools": [WEATHER], "tool_choice": "none"}, id="none"),
    pytest.param({"messages": ANSWERED, "tools": [WEATHER]}, id="the tool's answer in the history"),
]
RESPONSE_TOOLS = [{"type": "function", **WEATHER["function"]}]
RESPONSES = [
    pytest.param({"tool_choice": "required"}, id="required"),
    pytest.param({"tool_choice": {"type": "function", "name": "get_weather"}}, id="named"),
    pytest.param({"tool_choice": "auto"}, id="auto"),
]
PREFILLED = [*ASK, {"role": "assistant", "content": "Let me look up the weather in"}]
TEMPLATE_CALLS = [
    pytest.param({"add_generation_prompt": False}, id="no generation prompt"),
    pytest.param({"add_generation_prompt": False, "continue_final_message": True}, id="a prefilled answer"),
    pytest.param({"chat_template_kwargs": {"enable_thinking": False}, "reasoning_effort": "low"}, id="variables"),
]
REFUSED: dict[str, dict[str, Any]] = {
    "a named function not among the tools": {"messages": ASK, "tools": [TIME], "tool_choice": NAMED},
    "required without tools": {"messages": ASK, "tool_choice": "required"},
    "a prefilled answer after the generation prompt": {"messages": PREFILLED, "continue_final_message": True},
    "a negative temperature": {"messages": ASK, "temperature": -1},
    "no messages": {"messages": []},
    "a truncation longer than the context": {"messages": ASK, "truncate_prompt_tokens": 100_000},
}


def shipped_vllm_args() -> tuple[list[str], dict[str, str]]:
    """vLLM server arguments and environment for the settings the shipped config gives the app's engine: its compute
    threads too (the cores it reserves), as a different split of a step's sums over threads changes the last bits,
    and greedy decoding then parts a few tokens later."""
    from serve_app.engines.async_llm import kv_cache_bytes, reserved_cores
    from serve_app.engines.cpu import cpu_dtype

    args = yaml.safe_load((ROOT / "serve_config.yaml").read_text())["applications"][0]["args"]
    settings = args["vllm"]
    argv = ["--dtype", cpu_dtype(), "--max-model-len", str(settings["max_model_len"]), "--enforce-eager"]
    argv += ["--chat-template", str(ROOT / settings["chat_template"])]
    argv += ["--enable-auto-tool-choice", "--tool-call-parser", settings["tool_call_parser"]]
    argv += ["--tool-strict-level", settings.get("tool_strict_level", "auto")]
    argv += ["--kv-cache-memory-bytes", str(kv_cache_bytes(settings["cpu_kvcache_space_gb"]))]
    env: dict[str, str] = {}
    reserved = reserved_cores(settings.get("cpu_reserved_cores", "auto"), len(os.sched_getaffinity(0)))
    if reserved is not None:
        env["VLLM_CPU_NUM_OF_RESERVED_CPU"] = str(reserved)
    return argv, env


@pytest.fixture(scope="module")
def vllm_url(tmp_path_factory) -> Iterator[str]:
    """vLLM's own server on the bundled model with the shipped config's settings."""
    from serve_app.models import prepare

    argv, env = shipped_vllm_args()
    port = free_port()
    command = vllm_server(prepare(), MODEL, port, *argv)
    log = tmp_path_factory.mktemp("vllm") / "vllm.log"
    ready = lambda s: http_status(f"{s.url}/health") == 200  # noqa: E731
    with running(command, port, log, {**offline_env(), **env}, ready, SERVE_RUN_START_S) as server:
        yield server.url


def post(url: str, route: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(f"{url}{route}", json={"model": MODEL, **body}, timeout=300)


def warm_post(url: str, route: str, body: dict[str, Any]) -> httpx.Response:
    """The answer to ``body`` sent a second time, its prompt then in the server's prefix cache whatever the server
    served before: a prompt computed whole and one read from the cache differ in the last bits of their sums, and
    a greedy run that meets a near tie parts there (on the ``required`` call below: a call, or none, by one token)."""
    post(url, route, body)
    return post(url, route, body)


def chat_answer(response: httpx.Response) -> tuple[int, Any]:
    """A chat completion's status, and for a 200 the prompt it ran (token ids), its calls (name, parsed arguments)
    with their finish reason, and whether it has content. Not the content's text: where two greedy runs part is
    down to the last bits of the engine's sums (threads, prefill chunks, which prefix a cache held from earlier
    requests), and two servers that served different requests before part a few tokens in, calls or not."""
    if response.status_code != 200:
        return response.status_code, None
    body = response.json()
    choice = body["choices"][0]
    message = choice["message"]
    calls = [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in message.get("tool_calls") or []]
    reason = choice["finish_reason"] if calls else None
    return 200, (body["prompt_token_ids"], calls, reason, bool(message.get("content")))


def responses_answer(response: httpx.Response) -> tuple[int, Any]:
    """A Response's status, and for a 200 its function calls (name, parsed arguments)."""
    if response.status_code != 200:
        return response.status_code, None
    items = response.json()["output"]
    return 200, [(i["name"], json.loads(i["arguments"])) for i in items if i["type"] == "function_call"]


@pytest.mark.parametrize("body", CHATS)
def test_the_app_calls_tools_as_vllms_own_server_does(real_app, vllm_url, body):
    body = {**body, "max_tokens": 96, "temperature": 0, "return_token_ids": True}
    app = chat_answer(warm_post(real_app.url, "/v1/chat/completions", body))
    vllm = chat_answer(warm_post(vllm_url, "/v1/chat/completions", body))
    assert app == vllm and app[0] == 200


@pytest.mark.parametrize("choice", RESPONSES)
def test_the_responses_api_calls_tools_as_vllms_own_server_does(real_app, vllm_url, choice):
    body = {"input": ASK[0]["content"], "tools": RESPONSE_TOOLS, **choice, "max_output_tokens": 96, "temperature": 0}
    app = responses_answer(warm_post(real_app.url, "/v1/responses", body))
    vllm = responses_answer(warm_post(vllm_url, "/v1/responses", body))
    assert app == vllm and app[0] == 200


@pytest.mark.parametrize("fields", TEMPLATE_CALLS)
def test_a_chat_template_call_gives_the_prompt_vllms_own_server_gives(real_app, vllm_url, fields):
    body = {"messages": PREFILLED, **fields, "max_tokens": 1, "temperature": 0, "return_token_ids": True}
    app, vllm = (post(url, "/v1/chat/completions", body) for url in (real_app.url, vllm_url))
    assert app.status_code == vllm.status_code == 200, (app.text, vllm.text)
    assert app.json()["prompt_token_ids"] == vllm.json()["prompt_token_ids"]


@pytest.mark.parametrize("side", [None, "left", "right"])
@pytest.mark.parametrize("route", ["/v1/completions", "/v1/chat/completions"])
def test_a_truncated_prompt_keeps_the_tokens_vllms_own_server_keeps(real_app, vllm_url, route, side):
    cut = {"truncate_prompt_tokens": 12, **({"truncation_side": side} if side else {})}
    prompt = {"prompt": ASK[0]["content"] * 3} if route == "/v1/completions" else {"messages": ASK}
    body = {**prompt, **cut, "max_tokens": 1, "temperature": 0, "return_token_ids": True}
    app, vllm = (post(url, route, body).json() for url in (real_app.url, vllm_url))
    if route == "/v1/completions":  # completions give a choice's prompt ids, chat the answer's
        app, vllm = app["choices"][0], vllm["choices"][0]
    assert app["prompt_token_ids"] == vllm["prompt_token_ids"] and len(app["prompt_token_ids"]) == 12


@pytest.mark.parametrize("route", ["/v1/completions", "/v1/chat/completions"])
def test_a_stop_ends_an_answer_with_the_stop_reason_vllms_own_server_gives(real_app, vllm_url, route):
    period = post(real_app.url, "/tokenize", {"prompt": "."}).json()["tokens"][-1]
    prompt = {"prompt": "The capital of France is"} if route == "/v1/completions" else {"messages": ASK}
    for stop in ({"stop": ["\n\n", "."]}, {"stop_token_ids": [period]}):
        body = {**prompt, **stop, "max_tokens": 64, "temperature": 0}
        app, vllm = (warm_post(url, route, body).json()["choices"][0] for url in (real_app.url, vllm_url))
        assert app["finish_reason"] == vllm["finish_reason"] == "stop", (app, vllm)
        assert app["stop_reason"] == vllm["stop_reason"] in (".", period)


@pytest.mark.parametrize("route", ["/v1/completions", "/v1/chat/completions"])
def test_log_probabilities_named_by_id_are_named_as_vllms_own_server_names_them(real_app, vllm_url, route):
    """``return_tokens_as_token_ids``: the names of the first answer token and its alternatives, and the prompt's
    with ``echo`` (a one-token greedy answer: both servers pick the same token, however their sums part later)."""
    asked = {"return_tokens_as_token_ids": True, "max_tokens": 1, "temperature": 0}
    if route == "/v1/completions":
        body = {"prompt": "The capital of France is", "echo": True, "logprobs": 3, **asked}
        app, vllm = (warm_post(url, route, body).json()["choices"][0]["logprobs"] for url in (real_app.url, vllm_url))
        assert app["tokens"] == vllm["tokens"] and app["text_offset"] == vllm["text_offset"]
        assert [sorted(top or ()) for top in app["top_logprobs"]] == [sorted(top or ()) for top in vllm["top_logprobs"]]
    else:
        body = {"messages": ASK, "logprobs": True, "top_logprobs": 3, **asked}
        app, vllm = (
            warm_post(url, route, body).json()["choices"][0]["logprobs"]["content"] for url in (real_app.url, vllm_url)
        )
        assert [(c["token"], c["bytes"]) for c in app] == [(c["token"], c["bytes"]) for c in vllm]
        assert [[(t["token"], t["bytes"]) for t in c["top_logprobs"]] for c in app] == [
            [(t["token"], t["bytes"]) for t in c["top_logprobs"]] for c in vllm
        ]


@pytest.mark.parametrize("route", ["/v1/completions", "/v1/chat/completions"])
def test_prompt_logprobs_are_those_vllms_own_server_gives(real_app, vllm_url, route):
    """``prompt_logprobs``: at every prompt position (None at the first) the prompt token by id with its decoded
    text, and log probabilities within what the two servers' bfloat16 sums part by here (measured: up to 0.6 on one
    token, the second position's equal to the last bit; where the last bits part is not pinned down); the most likely
    token the same at most positions (near ties may swap)."""
    prompt = {"prompt": "The capital of France is"} if route == "/v1/completions" else {"messages": ASK}
    body = {**prompt, "prompt_logprobs": 3, "return_token_ids": True, "max_tokens": 1, "temperature": 0}
    app, vllm = (post(url, route, body).json() for url in (real_app.url, vllm_url))
    if route == "/v1/completions":  # on each choice; chat's at the top
        app, vllm = app["choices"][0], vllm["choices"][0]
    ids = app["prompt_token_ids"]
    assert ids == vllm["prompt_token_ids"]
    app, vllm = app["prompt_logprobs"], vllm["prompt_logprobs"]
    assert app[0] is None and vllm[0] is None and len(app) == len(vllm) == len(ids) > 1
    for token, mine, theirs in zip(map(str, ids[1:]), app[1:], vllm[1:]):
        assert mine[token]["decoded_token"] == theirs[token]["decoded_token"]
        assert abs(mine[token]["logprob"] - theirs[token]["logprob"]) < 1.0, (token, mine, theirs)
        assert len(mine) <= 4 and {p["rank"] for k, p in mine.items() if k != token} <= {1, 2, 3}
    first = [[k for k, p in at.items() if p["rank"] == 1] for at in (*app[1:], *vllm[1:])]
    agree = sum(a == b for a, b in zip(first[: len(ids) - 1], first[len(ids) - 1 :]))
    assert agree >= 0.8 * (len(ids) - 1), first
    total = [sum(at[str(t)]["logprob"] for t, at in zip(ids[1:], side[1:])) for side in (app, vllm)]
    assert abs(total[0] - total[1]) <= 0.05 * abs(total[1]), total


@pytest.mark.parametrize("route", ["/v1/completions", "/v1/chat/completions"])
def test_continuous_usage_stats_stamp_chunks_as_vllms_own_server_stamps_them(real_app, vllm_url, route):
    """``continuous_usage_stats``: every chunk with a choice carries the usage so far (a chat's role chunk none of
    the completion), on the same prompt count, ending at the same count as vLLM's server's chunks."""
    prompt = {"prompt": "The capital of France is"} if route == "/v1/completions" else {"messages": ASK}
    options = {"include_usage": True, "continuous_usage_stats": True}
    body = {**prompt, "max_tokens": 8, "ignore_eos": True, "stream": True, "stream_options": options}
    seen = []
    for url in (real_app.url, vllm_url):
        text = httpx.post(f"{url}{route}", json={"model": MODEL, **body}, timeout=300).text
        chunks = sse_payloads(text)
        *with_choices, last = chunks
        assert last["choices"] == [] and all(c["choices"] and c["usage"] for c in with_choices), text
        counts = [c["usage"]["completion_tokens"] for c in with_choices]
        roles = [c["usage"]["completion_tokens"] for c in with_choices if c["choices"][0].get("delta", {}).get("role")]
        seen.append(
            (last["usage"]["prompt_tokens"], {c["usage"]["prompt_tokens"] for c in with_choices}, counts[-1], roles)
        )
        assert counts == sorted(counts)
    assert seen[0] == seen[1]


def test_max_tokens_past_the_context_is_cut_to_its_room_as_vllms_own_server_cuts_it(real_app, vllm_url):
    body = {"prompt": "word " * 1900, "max_tokens": 1000, "ignore_eos": True, "temperature": 0}
    app, vllm = (post(url, "/v1/completions", body).json() for url in (real_app.url, vllm_url))
    assert app["usage"]["prompt_tokens"] == vllm["usage"]["prompt_tokens"] < 2048, (app, vllm)
    room = 2048 - app["usage"]["prompt_tokens"]
    assert app["usage"]["completion_tokens"] == vllm["usage"]["completion_tokens"] == room < 1000
    assert app["choices"][0]["finish_reason"] == vllm["choices"][0]["finish_reason"] == "length"


def test_the_app_refuses_what_vllms_own_server_refuses_with_its_status(real_app, vllm_url):
    bodies = {name: {**body, "max_tokens": 16} for name, body in REFUSED.items()}
    app = {name: post(real_app.url, "/v1/chat/completions", body).status_code for name, body in bodies.items()}
    vllm = {name: post(vllm_url, "/v1/chat/completions", body).status_code for name, body in bodies.items()}
    assert app == vllm
    assert all(400 <= status < 500 for status in app.values())


def test_stream_interval_chunks_as_vllms_own_server_chunks(real_app, vllm_url):
    """``stream_interval``: the same streamed completion, four tokens a chunk, ends its chunks where vLLM's server
    ends its: the first token alone, then every fourth, then the end (a reader that fell behind may get two joined)."""
    body = {"prompt": "Count: one, two,", "max_tokens": 10, "ignore_eos": True, "temperature": 0, "stream": True}
    body.update(stream_interval=4, return_token_ids=True)
    ends = []
    for url in (real_app.url, vllm_url):
        ends.append(
            token_chunk_ends(httpx.post(f"{url}/v1/completions", json={"model": MODEL, **body}, timeout=300).text)
        )
    assert all(side[0] == 1 and side[-1] == 10 and set(side) <= {1, 5, 9, 10} for side in ends), ends


def test_repetition_detection_ends_the_answer_where_vllms_own_server_does(real_app, vllm_url):
    """``repetition_detection``: the same greedy answer cut at the same token, with vLLM's stop reason; the finish
    reason is "stop" here and vLLM's own "repetition" there (docs/http.md says why)."""
    body = {"prompt": "1, 2, 1, 2, 1, 2, 1, 2, 1, 2,", "max_tokens": 48, "ignore_eos": True, "temperature": 0}
    body["repetition_detection"] = {"max_pattern_size": 8, "min_count": 4}
    app, vllm = (post(url, "/v1/completions", body).json() for url in (real_app.url, vllm_url))
    (mine,), (theirs,) = app["choices"], vllm["choices"]
    assert mine["text"] == theirs["text"] and app["usage"]["completion_tokens"] < 48
    assert app["usage"]["completion_tokens"] == vllm["usage"]["completion_tokens"]
    assert (mine["finish_reason"], theirs["finish_reason"]) == ("stop", "repetition")
    assert mine["stop_reason"] == theirs["stop_reason"] == "repetition_detected"
