"""Tool calling's request and answer shapes, engine aside (tests/test_real_app.py runs them on vLLM): the tool
choices a request may make, the calls read back from a forced or parsed output, and the answer's body and stream
chunks as the OpenAI client reads them."""

from __future__ import annotations

import json

import pytest
from openai.types.chat import ChatCompletion, ChatCompletionChunk

from serve_app.engines import GenerationDelta, GenerationResult
from serve_app.openai.chat import ChatCompletionRequest, ChatFormat
from serve_app.openai.tools import ToolCalls

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}


def request(**fields) -> ChatCompletionRequest:
    return ChatCompletionRequest.model_validate({"messages": [{"role": "user", "content": "hi"}], **fields})


@pytest.mark.parametrize(
    ("fields", "mode", "refused"),
    [
        ({}, "none", []),
        ({"tools": [WEATHER]}, "auto", []),
        ({"tools": [WEATHER], "tool_choice": "none"}, "none", []),
        ({"tools": [WEATHER], "tool_choice": "required"}, "required", []),
        ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "get_weather"}}}, "named", []),
        (
            {"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "other"}}},
            "named",
            ["tool_choice"],
        ),
        ({"tool_choice": "auto"}, "none", ["tool_choice"]),
        (
            {"tools": [WEATHER], "tool_choice": "required", "response_format": {"type": "json_object"}},
            "required",
            ["response_format"],
        ),
    ],
)
def test_tool_choices(fields, mode, refused) -> None:
    body = request(**fields)
    assert body.tool_mode == mode
    assert [field for field, _ in body.refusals()] == refused


def result(text: str, reason: str = "stop") -> GenerationResult:
    return GenerationResult("r", text, 5, 7, reason)


def test_forced_calls_are_read_from_the_output_and_a_cut_one_stays_content() -> None:
    required = ToolCalls("required")
    content, calls = required.read('[{"name": "get_weather", "parameters": {"city": "Paris"}}]')
    assert content is None and [(c.function.name, json.loads(c.function.arguments)) for c in calls] == [
        ("get_weather", {"city": "Paris"})
    ]
    assert required.finish_reason(calls, "stop") == "tool_calls"
    assert required.read('[{"name": "get_weather", "param') == ('[{"name": "get_weather", "param', [])
    named = ToolCalls("named", "get_weather")
    content, calls = named.read('{"city": "Paris"}')
    assert content is None and calls[0].function.arguments == '{"city": "Paris"}'
    assert named.finish_reason(calls, "stop") == "stop"
    assert named.finish_reason(calls, "length") == "length"  # cut short: its arguments may not parse
    auto = ToolCalls("auto", parse=lambda text: ("before", [("get_weather", '{"city": "Oslo"}')]))
    content, calls = auto.read("anything")
    assert content == "before" and calls[0].function.name == "get_weather"
    assert auto.finish_reason(calls, "stop") == "tool_calls"
    assert ToolCalls("auto").read("plain") == ("plain", [])  # no parser: the output is the content


def test_the_answer_and_its_stream_carry_the_calls_in_openais_shape() -> None:
    text = '[{"name": "get_weather", "parameters": {"city": "Paris"}}]'
    fmt = ChatFormat("m", calls=ToolCalls("required"))
    body = ChatCompletion.model_validate(fmt.response([result(text)]).model_dump())
    (choice,) = body.choices
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    (call,) = choice.message.tool_calls
    assert call.type == "function" and call.id and json.loads(call.function.arguments) == {"city": "Paris"}

    fmt = ChatFormat("m", calls=ToolCalls("required"))
    chunks = [*fmt.chunks(0, GenerationDelta("r", text[:10], 3)), *fmt.final_chunks(0, result(text))]
    chunks = [ChatCompletionChunk.model_validate(c.model_dump()) for c in chunks]
    assert not any(c.choices[0].delta.content for c in chunks)  # the output is not content: it is read at the end
    (with_calls,) = [c for c in chunks if c.choices[0].delta.tool_calls]
    (delta_call,) = with_calls.choices[0].delta.tool_calls
    assert delta_call.index == 0 and delta_call.function.name == "get_weather"
    assert json.loads(delta_call.function.arguments) == {"city": "Paris"}
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
