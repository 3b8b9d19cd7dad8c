"""Log probabilities in OpenAI's two shapes, from an engine's :class:`TokenLogprob` values: chat's ``content``
list and completions' parallel lists (with ``echo``, the prompt's first; a stream's ``text_offset`` running on
across its chunks). No engine here: the values are made up, the shapes are what is checked (the real engine's
path: tests/test_real_app.py)."""

from __future__ import annotations

import json

from serve_app.engines import GenerationDelta, GenerationResult, TokenLogprob
from serve_app.openai.chat import ChatFormat
from serve_app.openai.completions import CompletionFormat
from serve_app.openai.logprobs import LOGPROB_FLOOR

PROMPT = (
    TokenLogprob("The", None),  # a prompt's first token has none
    TokenLogprob(" sky", -3.5, ((" sky", -3.5), (" cat", -1.0), (" dog", -2.0))),
)
OUTPUT = (
    TokenLogprob(" is", -0.25, ((" is", -0.25), (" was", -1.5), (" looks", -2.5))),
    TokenLogprob(" blue", float("-inf"), ((" blue", float("-inf")), (" red", -0.5), (" green", -0.75))),
)


def result(**extra: object) -> GenerationResult:
    return GenerationResult("r", " is blue", 2, 2, "length", logprobs=OUTPUT, **extra)  # type: ignore[arg-type]


def dumped(model: object) -> dict:
    """The body as the route sends it (JSON: no infinities)."""
    return json.loads(json.dumps(model.model_dump(mode="json", exclude_none=True)))  # type: ignore[attr-defined]


def test_chat_content_has_each_token_its_bytes_and_the_first_top_logprobs_alternatives():
    body = dumped(ChatFormat("m", top_logprobs=2).response([result()]))
    content = body["choices"][0]["logprobs"]["content"]
    assert [c["token"] for c in content] == [" is", " blue"]
    assert content[0]["bytes"] == list(b" is") and content[0]["logprob"] == -0.25
    assert [t["token"] for t in content[0]["top_logprobs"]] == [" is", " was"]  # the engine's order, 2 of 3
    assert content[1]["logprob"] == LOGPROB_FLOOR  # minus infinity, as OpenAI and vLLM send it
    assert content[1]["top_logprobs"][0]["logprob"] == LOGPROB_FLOOR


def test_chat_without_logprobs_asked_has_none_and_top_logprobs_0_has_no_alternatives():
    assert "logprobs" not in dumped(ChatFormat("m").response([result()]))["choices"][0]
    content = dumped(ChatFormat("m", top_logprobs=0).response([result()]))["choices"][0]["logprobs"]["content"]
    assert [c["top_logprobs"] for c in content] == [[], []]


def test_chat_stream_carries_each_deltas_tokens_on_its_content_chunk():
    fmt = ChatFormat("m", top_logprobs=1)
    chunks = [dumped(c) for c in fmt.chunks(0, GenerationDelta("r", " is", 1, OUTPUT[:1]))]
    chunks += [dumped(c) for c in fmt.chunks(0, GenerationDelta("r", " blue", 2, OUTPUT[1:]))]
    role, first, second = chunks
    assert role["choices"][0]["delta"] == {"role": "assistant", "content": ""} and "logprobs" not in role["choices"][0]
    assert [c["token"] for c in first["choices"][0]["logprobs"]["content"]] == [" is"]
    assert [c["token"] for c in second["choices"][0]["logprobs"]["content"]] == [" blue"]
    assert len(second["choices"][0]["logprobs"]["content"][0]["top_logprobs"]) == 1


def test_completions_lists_tokens_logprobs_offsets_and_logprobs_plus_one_alternatives():
    choice = dumped(CompletionFormat("m", logprobs=1).response([result()]))["choices"][0]
    logprobs = choice["logprobs"]
    assert logprobs["tokens"] == [" is", " blue"] and "".join(logprobs["tokens"]) == choice["text"]
    assert logprobs["token_logprobs"] == [-0.25, LOGPROB_FLOOR]
    assert logprobs["text_offset"] == [0, 3]
    assert logprobs["top_logprobs"][0] == {" is": -0.25, " was": -1.5}  # the token and 1 more: vLLM's k + 1


BY_ID = (  # with the engine's ids, the second part of a character's bytes (its text the replacement character)
    TokenLogprob(" is", -0.25, ((" is", -0.25), (" was", -1.5)), 318, (318, 373)),
    TokenLogprob("\ufffd", -1.0, (("\ufffd", -1.0), (" x", -2.0)), 9468, (9468, 2124)),
)


def test_return_tokens_as_token_ids_names_each_token_and_alternative_by_its_id_in_both_shapes():
    """vLLM's ``return_tokens_as_token_ids``: ``token_id:<id>`` for a token and its alternatives; chat's ``bytes``
    of the token stay its text's and completions' offsets run over the names, as vLLM's server sends them."""
    answer = GenerationResult("r", " is\ufffd", 2, 2, "length", logprobs=BY_ID)
    content = dumped(ChatFormat("m", top_logprobs=1, by_id=True).response([answer]))["choices"][0]["logprobs"]
    assert [c["token"] for c in content["content"]] == ["token_id:318", "token_id:9468"]
    assert content["content"][0]["bytes"] == list(b" is")
    top = content["content"][0]["top_logprobs"]
    assert top == [{"token": "token_id:318", "bytes": list(b"token_id:318"), "logprob": -0.25}]
    logprobs = dumped(CompletionFormat("m", logprobs=1, by_id=True).response([answer]))["choices"][0]["logprobs"]
    assert logprobs["tokens"] == ["token_id:318", "token_id:9468"]
    assert logprobs["top_logprobs"] == [
        {"token_id:318": -0.25, "token_id:373": -1.5},
        {"token_id:9468": -1.0, "token_id:2124": -2.0},
    ]
    assert logprobs["text_offset"] == [0, 12]
    plain = dumped(CompletionFormat("m", logprobs=1).response([answer]))["choices"][0]["logprobs"]
    assert plain["tokens"] == [" is", "\ufffd"]


RANKED = (  # a prompt's, as the engine gives them with prompt_logprobs 1: the token first, then the most likely
    TokenLogprob("The", None, (), 504),
    TokenLogprob(" sky", -3.5, ((" sky", -3.5), (" cat", -1.0)), 6149, (6149, 2368), (7, 1)),
    TokenLogprob(" is", float("-inf"), ((" is", float("-inf")),), 314, (314,), (1,)),
)


def test_prompt_logprobs_come_in_vllms_field_keyed_by_id_with_rank_and_decoded_token():
    """vLLM's ``prompt_logprobs``: per prompt token (None for the first) a dict by token id; on each completions
    choice, and at the top of a chat completion, wherever the result has them (none asked: no field)."""
    answer = result(prompt_logprobs=RANKED)
    expected = [
        None,
        {
            "6149": {"logprob": -3.5, "rank": 7, "decoded_token": " sky"},
            "2368": {"logprob": -1.0, "rank": 1, "decoded_token": " cat"},
        },
        {"314": {"logprob": LOGPROB_FLOOR, "rank": 1, "decoded_token": " is"}},
    ]
    choice = dumped(CompletionFormat("m").response([answer]))["choices"][0]
    assert choice["prompt_logprobs"] == expected and "logprobs" not in choice
    assert dumped(ChatFormat("m").response([answer]))["prompt_logprobs"] == expected
    echoed = dumped(CompletionFormat("m", echo=["The sky is"], logprobs=0).response([answer]))["choices"][0]
    assert echoed["prompt_logprobs"] == expected  # echo with logprobs computes them: vLLM's server sends them too
    assert "prompt_logprobs" not in dumped(CompletionFormat("m").response([result()]))["choices"][0]


def test_prompt_logprobs_other_than_0_are_refused_in_a_stream_as_vllm_refuses_them():
    from serve_app.openai.chat import ChatCompletionRequest
    from serve_app.openai.completions import CompletionRequest

    for asked, refused in ((1, True), (-1, True), (0, False)):
        streamed = CompletionRequest(prompt="x", stream=True, prompt_logprobs=asked)
        assert ("prompt_logprobs" in dict(streamed.refusals())) is refused, asked
        chat = ChatCompletionRequest(messages=[{"role": "user", "content": "x"}], stream=True, prompt_logprobs=asked)
        assert ("prompt_logprobs" in dict(chat.refusals())) is refused, asked
    assert not CompletionRequest(prompt="x", prompt_logprobs=5).refusals()


def test_completions_echo_puts_the_prompts_tokens_first_with_none_for_the_first():
    fmt = CompletionFormat("m", echo=["The sky"], logprobs=0)
    choice = dumped(fmt.response([result(prompt_logprobs=PROMPT)]))["choices"][0]
    logprobs = choice["logprobs"]
    assert choice["text"] == "The sky is blue" == "".join(logprobs["tokens"])
    assert logprobs["token_logprobs"] == [None, -3.5, -0.25, LOGPROB_FLOOR]
    assert logprobs["top_logprobs"] == [None, {" sky": -3.5}, {" is": -0.25}, {" blue": LOGPROB_FLOOR}]
    assert logprobs["text_offset"] == [0, 3, 7, 10]


def test_completions_stream_offsets_run_on_across_chunks_and_the_first_carries_the_prompt():
    fmt = CompletionFormat("m", n=2, echo=["The sky"], logprobs=0)
    first = fmt.chunks(1, GenerationDelta("r", " is", 1, OUTPUT[:1], PROMPT))[0]
    second = fmt.chunks(1, GenerationDelta("r", " blue", 2, OUTPUT[1:]))[0]
    other = fmt.chunks(0, GenerationDelta("s", " is", 1, OUTPUT[:1], PROMPT))[0]  # choice 0: its own offsets
    one, two, zero = (dumped(c)["choices"][0] for c in (first, second, other))
    assert one["text"] == "The sky is" and one["logprobs"]["tokens"] == ["The", " sky", " is"]
    assert one["logprobs"]["text_offset"] == [0, 3, 7]
    assert two["text"] == " blue" and two["logprobs"]["text_offset"] == [10]
    assert zero["logprobs"]["text_offset"] == [0, 3, 7]
    final = dumped(fmt.final_chunks(1, result()).pop())["choices"][0]
    assert final["finish_reason"] == "length" and "logprobs" not in final


def test_results_to_dict_carries_logprobs_only_where_asked_for():
    plain = GenerationResult("r", "x", 1, 1, "stop").to_dict()
    assert "logprobs" not in plain and "prompt_logprobs" not in plain
    asked = result().to_dict()
    assert asked["logprobs"][0] == {
        "token": " is",
        "logprob": -0.25,
        "top": ((" is", -0.25), (" was", -1.5), (" looks", -2.5)),
        "token_id": None,  # the made-up values have no ids; the engine's do (tests/test_real_app.py)
        "top_ids": (),
        "top_ranks": (),
    }


def test_echo_only_returns_the_prompt_and_its_logprobs_alone():
    fmt = CompletionFormat("m", echo=["The sky"], logprobs=0, echo_only=True)
    choice = dumped(fmt.response([result(prompt_logprobs=PROMPT)]))["choices"][0]
    assert choice["text"] == "The sky" and choice["logprobs"]["tokens"] == ["The", " sky"]
    stream = CompletionFormat("m", echo=["The sky"], logprobs=0, echo_only=True)
    first = stream.chunks(0, GenerationDelta("r", " is", 1, OUTPUT[:1], PROMPT))
    assert [dumped(c)["choices"][0]["text"] for c in first] == ["The sky"]
    assert dumped(first[0])["choices"][0]["logprobs"]["tokens"] == ["The", " sky"]
    assert stream.chunks(0, GenerationDelta("r", " blue", 2, OUTPUT[1:])) == []  # generated: left out
