"""vLLM's ``return_token_ids`` on both OpenAI generation routes, whole and streamed, and on the chat handle: the
prompt's token ids and each choice's generated ones, in the fields vLLM's server sends them in (completions: both
on each choice, a stream's prompt ids on a choice's first chunk; chat: the prompt's at the top, a stream's on each
choice's role chunk); and vLLM's ``stop_reason`` on a choice a stop string or stop token ended. The shapes from
made-up outputs first, then a local app with the SIMULATED engine (the real engine's ids: tests/test_real_app.py)."""

from __future__ import annotations

import json

import httpx
import pytest

from serve_app.engines import GenerationDelta, GenerationResult
from serve_app.openai.chat import ChatFormat
from serve_app.openai.completions import CompletionFormat

from .test_logprobs import dumped
from .test_streaming import sse_events, sse_payloads

MODEL = "SmolLM2-135M-Instruct"


def result(ids: tuple[int, ...]) -> GenerationResult:
    return GenerationResult("r", "x" * len(ids), 3, len(ids), "length", token_ids=ids)


def test_completions_choices_carry_their_prompts_ids_and_their_own():
    fmt = CompletionFormat("m", n=2, prompt_ids=[[1, 2], [3]])
    body = dumped(fmt.response([result((7,)), result((8, 9)), result((10,)), result(())]))
    assert [c["prompt_token_ids"] for c in body["choices"]] == [[1, 2], [1, 2], [3], [3]]
    assert [c["token_ids"] for c in body["choices"]] == [[7], [8, 9], [10], []]
    plain = dumped(CompletionFormat("m").response([result((7,))]))["choices"][0]
    assert "token_ids" not in plain and "prompt_token_ids" not in plain


def test_a_completions_stream_sends_the_prompts_ids_once_per_choice_and_each_chunks_new_ids():
    fmt = CompletionFormat("m", prompt_ids=[[1, 2]])
    chunks = [*fmt.chunks(0, GenerationDelta("r", "a", 1, token_ids=(5,)))]
    chunks += fmt.chunks(0, GenerationDelta("r", "b", 3, token_ids=(6, 7)))
    chunks += fmt.final_chunks(0, result((5, 6, 7)))
    choices = [dumped(c)["choices"][0] for c in chunks]
    assert [c.get("prompt_token_ids") for c in choices] == [[1, 2], None, None]
    assert [c["token_ids"] for c in choices] == [[5], [6, 7], []]  # every id came with its delta


def test_echo_of_the_prompt_alone_returns_no_generated_ids():
    fmt = CompletionFormat("m", echo=["say"], echo_only=True, prompt_ids=[[4, 5]])
    choice = dumped(fmt.response([result((9,))]))["choices"][0]
    assert choice["text"] == "say" and choice["prompt_token_ids"] == [4, 5] and choice["token_ids"] == []


def test_a_choice_a_stop_ended_names_it_whole_and_streamed_and_one_that_ran_out_has_none():
    stopped = GenerationResult("r", "x", 3, 1, "stop", token_ids=(7,), stop_reason="\n\n")
    by_token = GenerationResult("r", "x", 3, 1, "stop", token_ids=(7,), stop_reason=2)
    whole = dumped(CompletionFormat("m", n=3).response([stopped, by_token, result((7,))]))
    assert [c.get("stop_reason") for c in whole["choices"]] == ["\n\n", 2, None]
    assert dumped(ChatFormat("m").response([stopped]))["choices"][0]["stop_reason"] == "\n\n"
    for fmt in (CompletionFormat("m"), ChatFormat("m")):
        assert dumped(fmt.final_chunks(0, stopped)[-1])["choices"][0]["stop_reason"] == "\n\n"


def test_chat_has_the_prompts_ids_at_the_top_and_each_choices_ids_on_it():
    body = dumped(ChatFormat("m", n=2, prompt_ids=[1, 2, 3]).response([result((4,)), result((5, 6))]))
    assert body["prompt_token_ids"] == [1, 2, 3]
    assert [c["token_ids"] for c in body["choices"]] == [[4], [5, 6]]
    plain = dumped(ChatFormat("m").response([result((4,))]))
    assert "prompt_token_ids" not in plain and "token_ids" not in plain["choices"][0]


def test_a_chat_stream_sends_the_prompts_ids_on_the_role_chunk_and_a_delta_with_ids_but_no_text():
    fmt = ChatFormat("m", prompt_ids=[1, 2])
    chunks = [dumped(c) for c in fmt.chunks(0, GenerationDelta("r", "", 1, token_ids=(5,)))]  # an incomplete char
    chunks += [dumped(c) for c in fmt.final_chunks(0, result((5,)))]
    role, first, done = chunks
    assert role["prompt_token_ids"] == [1, 2] and role["choices"][0]["delta"]["role"] == "assistant"
    assert first["choices"][0]["token_ids"] == [5] and "prompt_token_ids" not in first
    assert done["choices"][0]["token_ids"] == [] and done["choices"][0]["finish_reason"] == "length"
    quiet = ChatFormat("m")  # not asked: a delta without text or log probabilities sends nothing
    assert len(quiet.chunks(0, GenerationDelta("r", "", 1, token_ids=(5,)))) == 1  # the role chunk alone


# -- Through a local app with the simulated engine ---------------------------------------------------------------


@pytest.fixture(scope="module")
def app(serve_instance, deploy_app):
    handle = deploy_app("tokenids", simulated={"step_s": 0.002}, sampling={"max_tokens": 5})
    return serve_instance + "/tokenids", handle


def choices_of(events: list[str]) -> dict[int, list[dict]]:
    """A stream's chunks' choices, by choice index."""
    out: dict[int, list[dict]] = {}
    for event in events:
        if event != "[DONE]":
            for choice in json.loads(event)["choices"]:
                out.setdefault(choice["index"], []).append(choice)
    return out


@pytest.mark.serve
async def test_completions_return_the_ids_tokenize_gives_and_a_stream_the_same_ids_as_the_whole_answer(app):
    url, _ = app
    body = {"prompt": ["the sea is wide", "a b"], "n": 2, "max_tokens": 4, "return_token_ids": True}
    async with httpx.AsyncClient(base_url=url, timeout=60) as http:
        whole = (await http.post("/v1/completions", json=body)).json()
        stream = await http.post("/v1/completions", json={**body, "stream": True})
        tokenized = [(await http.post("/tokenize", json={"prompt": p})).json()["tokens"] for p in body["prompt"]]
    choices = whole["choices"]
    assert [c["prompt_token_ids"] for c in choices] == [tokenized[0]] * 2 + [tokenized[1]] * 2
    assert [len(c["token_ids"]) for c in choices] == [4] * 4
    assert sum(len(c["token_ids"]) for c in choices) == whole["usage"]["completion_tokens"]
    streamed = choices_of(sse_events(stream.text))
    for index, chunks in streamed.items():
        assert [c["prompt_token_ids"] for c in chunks if "prompt_token_ids" in c] == [tokenized[index // 2]]
        assert [i for c in chunks for i in c["token_ids"]] == choices[index]["token_ids"]  # the simulated is greedy


@pytest.mark.serve
async def test_chat_returns_the_conversations_ids_and_the_openai_client_reads_them(app):
    openai = pytest.importorskip("openai")
    url, handle = app
    messages = [{"role": "user", "content": "name three colours"}]
    client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
    whole = await client.chat.completions.create(
        model=MODEL, messages=messages, max_tokens=3, extra_body={"return_token_ids": True}
    )
    plain = await client.chat.completions.create(model=MODEL, messages=messages, max_tokens=3)
    async with httpx.AsyncClient(base_url=url, timeout=60) as http:
        tokenized = (await http.post("/tokenize", json={"messages": messages})).json()["tokens"]
        stream = await http.post(
            "/v1/chat/completions",
            json={"messages": messages, "max_tokens": 3, "stream": True, "return_token_ids": True},
        )
    assert whole.prompt_token_ids == tokenized  # the client keeps vLLM's extra fields
    assert len(whole.choices[0].token_ids) == whole.usage.completion_tokens == 3
    assert "prompt_token_ids" not in plain.model_dump() and "token_ids" not in plain.choices[0].model_dump()
    events = sse_payloads(stream.text)
    assert [e["prompt_token_ids"] for e in events if "prompt_token_ids" in e] == [tokenized]  # the role chunk's
    assert "token_ids" not in events[0]["choices"][0]  # the role chunk's choice has none, as vLLM's
    assert [i for e in events[1:] for c in e["choices"] for i in c["token_ids"]] == whole.choices[0].token_ids

    answer = await handle.chat.remote(messages, max_tokens=3, return_token_ids=True)
    items = [
        i async for i in handle.options(stream=True).chat_stream.remote(messages, max_tokens=3, return_token_ids=True)
    ]
    assert answer["prompt_token_ids"] == tokenized and answer["token_ids"] == whole.choices[0].token_ids
    assert [i for item in items[:-1] for i in item["token_ids"]] == items[-1]["token_ids"] == answer["token_ids"]
    assert "token_ids" not in await handle.chat.remote(messages, max_tokens=3)
