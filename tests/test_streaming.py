"""Streaming and the OpenAI surface against a local app with the SIMULATED continuous-batching engine: the
OpenAI Python client with and without ``stream=True``, Server-Sent Events framing, usage, the field matrix
(honoured / refused with 400 naming the field / malformed 400 / unknown ignored), disconnects mid-stream (engine
abort, budget freed), and handle streaming."""

from __future__ import annotations

import json
from itertools import accumulate

import httpx
import pytest

from .waits import wait_for

pytestmark = pytest.mark.serve

MODEL = "SmolLM2-135M-Instruct"


F_CALL = {"name": "f", "arguments": "{}"}
F_TOOL = {"function": {"name": "f", "parameters": {"type": "object", "properties": {}}}}
"""A tool as a client gives it (``type`` left to its default)."""
TOOL_HISTORY = [
    {"role": "user", "content": "call f"},
    {"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "type": "function", "function": F_CALL}]},
    {"role": "tool", "tool_call_id": "c1", "content": "f says 3"},
]
"""A conversation with a tool call and the tool's answer in it."""


@pytest.fixture(scope="module")
def app(serve_instance, deploy_app):
    handle = deploy_app("stream", simulated={"step_s": 0.002}, sampling={"max_tokens": 8})
    return serve_instance + "/stream", handle


@pytest.fixture
def client(app):
    openai = pytest.importorskip("openai")
    return openai.AsyncOpenAI(base_url=app[0] + "/v1", api_key="unused", max_retries=0)


def sse_events(text: str) -> list[str]:
    """The ``data:`` payloads of an SSE body, in order."""
    return [line[len("data: ") :] for line in text.split("\n") if line.startswith("data: ")]


def sse_payloads(text: str) -> list[dict]:
    """The JSON payloads of an SSE body, in order (``[DONE]`` left out)."""
    return [json.loads(event) for event in sse_events(text) if event != "[DONE]"]


def token_chunk_ends(text: str) -> list[int]:
    """Where each chunk of a streamed completion asked with ``return_token_ids`` ends, counted in tokens (chunks
    that carry none, and those without a choice, left out)."""
    chunks = sse_payloads(text)
    return list(accumulate(n for c in chunks if c["choices"] and (n := len(c["choices"][0].get("token_ids") or []))))


async def test_openai_client_completions_streamed_deltas_equal_the_whole_text(client):
    whole = await client.completions.create(model=MODEL, prompt="the quick brown fox", max_tokens=12)
    stream = await client.completions.create(
        model=MODEL, prompt="the quick brown fox", max_tokens=12, stream=True, stream_options={"include_usage": True}
    )
    pieces, usage, reasons = [], None, []
    async for chunk in stream:
        if chunk.choices:
            pieces.append(chunk.choices[0].text)
            reasons.append(chunk.choices[0].finish_reason)
        if chunk.usage is not None:
            usage = chunk.usage
    assert whole.choices[0].text.startswith("[simulated] the quick brown fox")
    assert "".join(pieces) == whole.choices[0].text
    assert len(pieces) >= 12  # token by token, not one block at the end
    assert reasons[-1] == whole.choices[0].finish_reason == "length" and set(reasons[:-1]) == {None}
    assert usage is not None and usage.completion_tokens == whole.usage.completion_tokens == 12
    assert usage.prompt_tokens == whole.usage.prompt_tokens > 0


async def test_openai_client_chat_streamed_deltas_equal_the_whole_message(client):
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "name three colours"}]
    whole = await client.chat.completions.create(model=MODEL, messages=messages, max_completion_tokens=10)
    stream = await client.chat.completions.create(model=MODEL, messages=messages, max_tokens=10, stream=True)
    roles, pieces, reasons = [], [], []
    async for chunk in stream:
        assert chunk.object == "chat.completion.chunk" and chunk.model == MODEL
        delta = chunk.choices[0].delta
        roles += [delta.role] if delta.role else []
        pieces.append(delta.content or "")
        reasons.append(chunk.choices[0].finish_reason)
    assert whole.choices[0].message.role == "assistant" and whole.usage.completion_tokens == 10
    assert "".join(pieces) == whole.choices[0].message.content
    assert roles == ["assistant"] and reasons[-1] == "length"


async def test_chat_content_parts_and_n_choices(client):
    parts = [{"type": "text", "text": "hello "}, {"type": "text", "text": "there"}]
    plain = await client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "hello there"}], max_tokens=4
    )
    answer = await client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": parts}], max_tokens=4, n=3
    )
    assert [c.index for c in answer.choices] == [0, 1, 2]
    assert all(c.message.content == plain.choices[0].message.content for c in answer.choices)
    assert answer.usage.completion_tokens == 12 and answer.usage.prompt_tokens == plain.usage.prompt_tokens


async def test_continuous_usage_stats_put_each_choices_usage_so_far_on_each_chunk(app):
    """vLLM's ``continuous_usage_stats`` (with ``include_usage``): every chunk carries its choice's usage so far, the
    counts growing to the final usage chunk's; without ``include_usage`` no chunk does, as on vLLM's server."""
    url, _ = app
    options = {"include_usage": True, "continuous_usage_stats": True}
    bodies = {
        "/v1/completions": {"model": MODEL, "prompt": "a b c", "n": 2},
        "/v1/chat/completions": {"model": MODEL, "messages": [{"role": "user", "content": "a b c"}]},
    }
    async with httpx.AsyncClient(base_url=url, timeout=60) as http:
        for path, body in bodies.items():
            streamed = {**body, "max_tokens": 6, "ignore_eos": True, "stream": True, "stream_options": options}
            response = await http.post(path, json=streamed)
            assert response.status_code == 200, response.text
            *chunks, last = [json.loads(e) for e in sse_events(response.text)[:-1]]
            prompt = last["usage"]["prompt_tokens"]  # one prompt, counted once for its n choices
            seen: dict[int, list[int]] = {}
            for chunk in chunks:
                used = chunk["usage"]
                assert used["prompt_tokens"] == prompt and used["total_tokens"] == prompt + used["completion_tokens"]
                seen.setdefault(chunk["choices"][0]["index"], []).append(used["completion_tokens"])
            assert sorted(seen) == list(range(body.get("n", 1)))
            if "chat" in path:  # the role chunk comes before any of the completion, as vLLM's server stamps it
                assert chunks[0]["choices"][0]["delta"]["role"] == "assistant" and seen[0][0] == 0
            assert all(counts == sorted(counts) and counts[-1] == 6 for counts in seen.values()), seen
            assert last["choices"] == [] and last["usage"]["completion_tokens"] == 6 * body.get("n", 1)
            options_only = {**streamed, "stream_options": {"continuous_usage_stats": True}}
            plain = [json.loads(e) for e in sse_events((await http.post(path, json=options_only)).text)[:-1]]
            assert plain and all("usage" not in c for c in plain)


async def test_what_vllm_bench_serve_sends_is_answered_as_a_stream(app):
    """The exact bodies of vLLM's benchmark client (``vllm bench serve``), which used to get 422s."""
    url, _ = app
    completion = {
        "model": MODEL,
        "prompt": "a b c",
        "repetition_penalty": 1.0,
        "max_tokens": 5,
        "logprobs": None,
        "stream": True,
        "stream_options": {"include_usage": True},
        "ignore_eos": True,
    }
    chat = {
        "model": MODEL,
        "messages": [{"role": "user", "content": [{"type": "text", "text": "a b c"}]}],
        "max_completion_tokens": 5,
        "stream": True,
        "stream_options": {"include_usage": True},
        "ignore_eos": True,
    }
    async with httpx.AsyncClient(base_url=url, timeout=60) as http:
        for path, body in (("/v1/completions", completion), ("/v1/chat/completions", chat)):
            response = await http.post(path, json=body)
            assert response.status_code == 200, response.text
            assert response.headers["content-type"].startswith("text/event-stream")
            events = sse_events(response.text)
            assert events[-1] == "[DONE]"
            chunks = [json.loads(e) for e in events[:-1]]
            assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 5
            assert all(c["choices"] for c in chunks[:-1])
        health = await http.get("/health")
        models = (await http.get("/v1/models")).json()
    assert health.status_code == 200
    (card,) = models["data"]
    assert card["id"] == MODEL and card["root"] == "bundled" and card["max_model_len"] == 2048


@pytest.mark.parametrize(
    ("path", "extra", "status", "param"),
    [
        # honoured (vLLM's sampling extensions and OpenAI's penalties)
        ("/v1/completions", {"top_k": 5, "min_p": 0.1, "repetition_penalty": 1.1, "min_tokens": 1}, 200, None),
        ("/v1/completions", {"frequency_penalty": 0.5, "presence_penalty": -0.5, "logit_bias": {"17": 3}}, 200, None),
        ("/v1/completions", {"seed": 3, "user": "u1", "ignore_eos": True, "stop": ["zz"], "n": 2}, 200, None),
        ("/v1/completions", {"echo": True, "best_of": 1, "logprobs": None, "suffix": None}, 200, None),
        ("/v1/completions", {"echo": True, "max_tokens": 0}, 200, None),
        (
            "/v1/chat/completions",
            {"response_format": {"type": "text"}, "tool_choice": "none", "store": False},
            200,
            None,
        ),
        ("/v1/chat/completions", {"logprobs": False, "metadata": {"k": "v"}, "parallel_tool_calls": False}, 200, None),
        ("/v1/chat/completions", {"logprobs": False, "top_logprobs": 0}, 200, None),
        ("/v1/chat/completions", {"include_reasoning": False}, 200, None),  # no reasoning parser here: no thoughts
        # refused: cannot be honoured here (the simulated engine computes no log probabilities; vLLM's does)
        ("/v1/completions", {"logprobs": 2}, 400, "logprobs"),
        ("/v1/completions", {"logprobs": 0, "echo": True}, 400, "logprobs"),
        ("/v1/chat/completions", {"top_logprobs": 2}, 400, "top_logprobs"),
        ("/v1/completions", {"suffix": "end"}, 400, "suffix"),
        ("/v1/completions", {"max_tokens": 0}, 400, "max_tokens"),
        ("/v1/completions", {"use_beam_search": True}, 400, "use_beam_search"),
        ("/v1/completions", {"stream_options": {"include_usage": True}}, 400, "stream_options"),
        ("/v1/chat/completions", {"logprobs": True}, 400, "logprobs"),
        # structured output: the simulated engine constrains none (vLLM's does: test_real_vllm_engine.py)
        ("/v1/chat/completions", {"response_format": {"type": "json_object"}}, 400, "response_format"),
        ("/v1/completions", {"structured_outputs": {"choice": ["a", "b"]}}, 400, "structured_outputs"),
        ("/v1/completions", {"allowed_token_ids": [5, 6]}, 400, "allowed_token_ids"),
        ("/v1/chat/completions", {"bad_words": ["x"]}, 400, "bad_words"),
        ("/v1/chat/completions", {"response_format": {"type": "structural_tag", "format": {}}}, 400, "response_format"),
        (
            "/v1/chat/completions",
            {"response_format": {"type": "json_object"}, "structured_outputs": {"regex": "a+"}},
            400,
            "response_format",
        ),
        ("/v1/chat/completions", {"response_format": {"type": "json_schema"}}, 400, "response_format"),
        ("/v1/completions", {"structured_outputs": {"regex": "a", "choice": ["b"]}}, 400, "structured_outputs"),
        ("/v1/completions", {"structured_outputs": {"disable_any_whitespace": True}}, 400, "structured_outputs"),
        # tools: shown to the model; auto needs a tool parser, a forced call structured output (vLLM's engine has both)
        ("/v1/chat/completions", {"tools": [{"type": "function", **F_TOOL}]}, 400, "tool_choice"),
        ("/v1/chat/completions", {"tools": [F_TOOL], "tool_choice": "required"}, 400, "tool_choice"),
        ("/v1/chat/completions", {"tools": [F_TOOL], "tool_choice": "none"}, 200, None),
        ("/v1/chat/completions", {"tool_choice": "required"}, 400, "tool_choice"),
        ("/v1/chat/completions", {"messages": TOOL_HISTORY}, 200, None),
        (
            "/v1/chat/completions",
            {"tools": [F_TOOL], "tool_choice": {"type": "function", "function": {"name": "g"}}},
            400,
            "tool_choice",
        ),
        ("/v1/chat/completions", {"tools": [{"type": "retrieval"}]}, 400, "tools"),
        ("/v1/chat/completions", {"functions": [{"name": "f"}]}, 400, "functions"),
        ("/v1/chat/completions", {"model": "gpt-9"}, 404, "model"),
        # malformed or unknown
        ("/v1/completions", {"n": 0}, 400, "n"),
        ("/v1/completions", {"top_k": -2}, 400, "top_k"),
        ("/v1/completions", {"logit_bias": {"not-a-token": 1}}, 400, "logit_bias"),
        ("/v1/completions", {"logprobs": 21}, 400, "logprobs"),
        ("/v1/chat/completions", {"logprobs": True, "top_logprobs": -1}, 400, "top_logprobs"),
        ("/v1/chat/completions", {"frequency_penalty": 3}, 400, "frequency_penalty"),
        # vLLM's extensions this server does not implement: refused unless at vLLM's default; unknown: ignored
        ("/v1/completions", {"prompt_logprobs": 1}, 400, "prompt_logprobs"),
        ("/v1/chat/completions", {"echo": True}, 400, "echo"),
        ("/v1/chat/completions", {"moderation": {"input": {"mode": "block"}}}, 400, "moderation"),
        ("/v1/chat/completions", {"bad_words": [], "include_reasoning": True, "prompt_cache_key": "k"}, 200, None),
        ("/v1/chat/completions", {"no_such_field": 1, "response_format": {"type": "text", "extra": 1}}, 200, None),
        ("/v1/completions", {"no_such_field": 1, "stream": True, "stream_options": {"newer": 1}}, 200, None),
        ("/v1/chat/completions", {f"field_of_2027_{i}": {"any": [i]} for i in range(5)}, 200, None),
    ],
)
async def test_openai_field_matrix(app, path, extra, status, param):
    url, _ = app
    body = (
        {"prompt": "hi there", "max_tokens": 2}
        if path == "/v1/completions"
        else {
            "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 2,
        }
    )
    async with httpx.AsyncClient(base_url=url, timeout=60) as http:
        response = await http.post(path, json={**body, **extra})
    assert response.status_code == status, response.text
    if status == 200 and extra.get("stream"):
        assert response.text.endswith("data: [DONE]\n\n") and '"choices"' in response.text
    elif status == 200:
        assert response.json()["choices"]
    else:
        error = response.json()["error"]
        assert set(error) == {"message", "type", "param", "code"} and error["code"] == status
        assert param in (error["param"] or "") and param in error["message"]


@pytest.mark.parametrize(
    ("extra", "param"),
    [({"logprobs": 1}, "logprobs"), ({"structured_outputs": {"choice": ["yes", "no"]}}, "structured_outputs")],
)
async def test_generate_refuses_what_the_simulated_engine_cannot_compute_naming_it(app, extra, param):
    """``/generate`` takes the sampling fields the OpenAI routes do; the simulated engine computes no log
    probabilities and constrains no output, so both are 400s naming the field (vLLM's engine honours them:
    tests/test_real_app.py)."""
    url, _ = app
    async with httpx.AsyncClient(base_url=url, timeout=60) as http:
        response = await http.post("/generate", json={"prompts": ["hi"], "max_tokens": 2, **extra})
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == param


async def test_tokenize_and_detokenize_as_vllms_server_answers_them(app):
    """``/tokenize`` gives the ids a prompt (or chat messages) runs as, their count and the model's context, as the
    generation routes count them; ``/detokenize`` turns ids back into text; what differs from how the generation
    routes tokenize is refused naming the field (the simulated engine's tokens: one a word, ``t<id>`` back)."""
    url, _ = app
    async with httpx.AsyncClient(base_url=url, timeout=60) as http:
        prompt = (await http.post("/tokenize", json={"prompt": "the sea is wide"})).json()
        usage = (await http.post("/v1/completions", json={"prompt": "the sea is wide", "max_tokens": 1})).json()
        chat = (await http.post("/tokenize", json={"messages": [{"role": "user", "content": "hi there"}]})).json()
        chat_usage = (
            await http.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi there"}]})
        ).json()
        text = (await http.post("/detokenize", json={"tokens": prompt["tokens"][:2], "model": MODEL})).json()
        refused = [
            await http.post("/tokenize", json=body)
            for body in (
                {"prompt": "x", "return_token_strs": True},
                {"messages": [{"role": "user", "content": "x"}], "add_special_tokens": True},
                {"messages": [{"role": "user", "content": "x"}], "continue_final_message": True},
                {"prompt": "x", "messages": [{"role": "user", "content": "x"}]},
                {"prompt": "x", "model": "gpt-9"},
            )
        ] + [await http.post("/detokenize", json={"tokens": []})]
    assert prompt["count"] == len(prompt["tokens"]) == usage["usage"]["prompt_tokens"]
    assert prompt["max_model_len"] == 2048
    assert chat["count"] == chat_usage["usage"]["prompt_tokens"]
    assert text == {"prompt": " ".join(f"t{t}" for t in prompt["tokens"][:2])}
    assert [r.status_code for r in refused] == [400, 400, 400, 400, 404, 400]
    assert [r.json()["error"]["param"] for r in refused[:3]] == [
        "return_token_strs",
        "add_special_tokens",
        "continue_final_message",  # and the generation prompt: vLLM refuses both at once
    ]


async def test_image_content_part_is_refused_naming_it(app):
    url, _ = app
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
    body = {"messages": [{"role": "user", "content": [{"type": "text", "text": "what"}, image]}]}
    async with httpx.AsyncClient(base_url=url, timeout=30) as http:
        response = await http.post("/v1/chat/completions", json=body)
    assert response.status_code == 400 and response.json()["error"]["param"] == "messages[0].content[1]"


async def test_token_id_prompts_and_echo(app):
    url, _ = app
    async with httpx.AsyncClient(base_url=url, timeout=30) as http:
        ids = await http.post("/v1/completions", json={"prompt": [[5, 6, 7], [8, 9]], "max_tokens": 2})
        echo = await http.post("/v1/completions", json={"prompt": "say it", "max_tokens": 2, "echo": True})
    assert ids.status_code == 200 and [c["index"] for c in ids.json()["choices"]] == [0, 1]
    assert ids.json()["usage"]["prompt_tokens"] == 5
    assert echo.json()["choices"][0]["text"].startswith("say it[simulated] say")


async def test_disconnect_mid_stream_aborts_the_engine_request_and_frees_its_budget(serve_instance, deploy_app):
    """A client that goes away mid-stream: its request is aborted in the engine and its tokens return."""
    handle = deploy_app("abort", simulated={"step_s": 0.05}, batcher={"max_inflight": 4})
    url = serve_instance + "/abort"
    before = await handle.stats.remote()
    async with httpx.AsyncClient(base_url=url, timeout=60) as http:
        body = {"prompt": "long story", "max_tokens": 400, "stream": True}
        async with http.stream("POST", "/v1/completions", json=body) as response:
            assert response.status_code == 200
            received = 0
            async for line in response.aiter_lines():
                received += line.startswith("data: ")
                if received >= 3:
                    break  # leave after three chunks: the connection closes

    async def aborted_and_freed() -> dict | None:
        stats = await handle.stats.remote()
        done = stats["engine_stats"]["aborts"] > before["engine_stats"]["aborts"] and stats["batcher"]["in_flight"] == 0
        return stats if done else None

    stats = await wait_for(aborted_and_freed, 10, "the engine abort and the freed budget", interval=0.1)
    assert stats["engine_stats"]["aborts"] == before["engine_stats"]["aborts"] + 1
    assert stats["batcher"]["in_flight"] == 0 and stats["batcher"]["in_flight_cost"] == 0
    assert stats["batcher"]["total_cancelled"] >= 1
    assert stats["engine_stats"]["steps"] < 100  # it stopped long before its 400 tokens


async def test_handle_streaming_yields_deltas_then_the_result(app):
    _, handle = app
    streaming = handle.options(stream=True)
    items = [item async for item in streaming.generate_stream.remote("one two three", max_tokens=6)]
    assert [i["type"] for i in items] == ["delta"] * 6 + ["result"]
    assert "".join(i["text"] for i in items[:-1]) == items[-1]["text"]
    assert [i["output_tokens"] for i in items[:-1]] == [1, 2, 3, 4, 5, 6]
    chat = [i async for i in streaming.chat_stream.remote([{"role": "user", "content": "hey"}], max_tokens=3)]
    assert chat[-1]["type"] == "result" and chat[-1]["output_tokens"] == 3
    whole = await handle.chat.remote([{"role": "user", "content": "hey"}], max_completion_tokens=3)
    assert whole["text"] == chat[-1]["text"]
    with pytest.raises(ValueError, match="model"):  # the handle checks the model as HTTP does
        await handle.chat.remote([{"role": "user", "content": "hey"}], model="gpt-9")
    with pytest.raises(ValueError, match=r"unknown keyword argument\(s\): max_tokns"):  # HTTP ignores it; a typo
        await handle.chat.remote([{"role": "user", "content": "hey"}], max_tokns=3)


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
@pytest.mark.parametrize("marker", ["__simulated_fail__", "__simulated_raise__"])
async def test_a_prompt_that_fails_mid_stream_ends_with_an_error_event_never_a_finish_reason(app, path, marker):
    """The engine fails the prompt at once (fail marker) or after streaming its tokens (raise marker): the stream
    ends with an error event in OpenAI's envelope, then ``[DONE]``; no chunk says it finished."""
    url, _ = app
    prompt = (
        {"prompt": f"tell {marker}"}
        if path == "/v1/completions"
        else {"messages": [{"role": "user", "content": f"tell {marker}"}]}
    )
    body = {**prompt, "max_tokens": 4, "stream": True, "stream_options": {"include_usage": True}}
    async with httpx.AsyncClient(base_url=url, timeout=60) as http:
        streamed = await http.post(path, json=body)
        whole = await http.post(path, json={**body, "stream": False, "stream_options": None})
    assert streamed.status_code == 200  # the status line went out before the failure
    events = sse_events(streamed.text)
    assert events[-1] == "[DONE]"
    error = json.loads(events[-2])["error"]
    assert error["code"] == 500 and "prompt 0 failed" in error["message"], error
    chunks = [json.loads(e) for e in events[:-2]]
    assert all(c["choices"][0]["finish_reason"] is None for c in chunks), chunks  # never "stop" or "length"
    assert not any("usage" in c and c["usage"] for c in chunks)  # no usage for an answer that did not finish
    if marker == "__simulated_raise__":  # its tokens were streamed before it failed
        assert len(chunks) >= 4
    assert whole.status_code == 500 and "prompt 0 failed" in whole.json()["error"]["message"]


async def test_a_handle_stream_whose_prompt_fails_raises_after_its_deltas(app):
    from serve_app.errors import GenerationError

    _, handle = app
    items = []
    with pytest.raises(GenerationError, match="prompt 0 failed"):
        async for item in handle.options(stream=True).generate_stream.remote("__simulated_raise__ x", max_tokens=3):
            items.append(item)
    assert [i["type"] for i in items] == ["delta"] * 3  # the deltas it made, then the error; never a result
    with pytest.raises(GenerationError, match="simulated failure"):
        await handle.chat.remote([{"role": "user", "content": "__simulated_fail__"}])


async def test_echo_with_max_tokens_0_returns_the_prompt_alone_whole_and_streamed(app):
    """Prompt scoring's request (``echo``, ``max_tokens: 0``): the prompt comes back and nothing generated, as
    vLLM's server answers it (it generates one token and leaves it out)."""
    url, _ = app
    body = {"model": MODEL, "prompt": "alpha beta gamma", "echo": True, "max_tokens": 0}
    async with httpx.AsyncClient(base_url=url, timeout=60) as http:
        whole = await http.post("/v1/completions", json=body)
        streamed = await http.post("/v1/completions", json={**body, "stream": True})
    assert whole.status_code == 200, whole.text
    (choice,) = whole.json()["choices"]
    assert choice["text"] == "alpha beta gamma"
    chunks = [json.loads(e) for e in sse_events(streamed.text)[:-1]]
    assert "".join(c["choices"][0]["text"] for c in chunks) == "alpha beta gamma"
