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


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    from serve_app.models import prepare

    return AutoTokenizer.from_pretrained(str(prepare()))


def accepts(constraint, text: str) -> bool:
    """Whether a structural tag lets the model write ``text`` (xgrammar's own check, as vLLM's grammar runs it)."""
    import xgrammar
    from xgrammar.testing import _is_grammar_accept_string

    return _is_grammar_accept_string(xgrammar.Grammar.from_structural_tag(constraint["structural_tag"]), text)


def test_forced_calls_are_constrained_in_the_tool_parsers_own_format_as_vllm_forces_them(tokenizer) -> None:
    """vLLM's composed parser's ``adjust_request`` gives the constraint: hermes forces a call as its own
    ``<tool_call>`` markup (a structural tag), its arguments held to the schema where the tool is strict (or the
    ``tool_strict_level`` says so); a parser without such a tag forces vLLM's JSON list of calls."""
    from serve_app.engines.parsers import OutputParsers
    from serve_app.openai.tools import ChatTool, output_schema

    hermes = OutputParsers("hermes", None).over(tokenizer)
    time = {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object"}}}
    paris = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    loose = '<tool_call>\n{"name": "get_weather", "arguments": {"town": 1}}\n</tool_call>'
    other = '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>'
    assert hermes.reads_forced_calls
    required = hermes.tool_constraint([WEATHER, time], "required", None)
    assert [accepts(required, text) for text in (paris, loose, other, "Sunny")] == [True, True, True, False]
    named = hermes.tool_constraint([WEATHER, time], {"type": "function", "function": {"name": "get_weather"}}, None)
    assert [accepts(named, text) for text in (paris, other, "Sunny")] == [True, False, False]
    assert hermes.tool_constraint([WEATHER], "auto", None) is None  # auto, no strict tool: free text, as vLLM's
    strict = {**WEATHER, "function": {**WEATHER["function"], "strict": True}}
    held = hermes.tool_constraint([strict], "required", None)
    assert [accepts(held, text) for text in (paris, loose)] == [True, False]
    assert accepts(hermes.tool_constraint([strict], "auto", None), "Sunny")  # auto: text, or a call as strict
    pinned = OutputParsers("hermes", None, "parameter").over(tokenizer).tool_constraint([WEATHER], "required", None)
    assert [accepts(pinned, text) for text in (paris, loose)] == [True, False]

    pythonic = OutputParsers("pythonic", None).over(tokenizer)
    assert not pythonic.reads_forced_calls
    expected = output_schema([ChatTool.model_validate(WEATHER)], "required", None)
    assert json.loads(pythonic.tool_constraint([WEATHER], "required", None)["json"]) == expected


def test_a_call_forced_in_the_models_own_format_is_read_by_its_parser(tokenizer) -> None:
    from serve_app.engines.parsers import OutputParsers

    parse = OutputParsers("hermes", None).over(tokenizer).tool_reader([WEATHER])
    said = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    for how, name, reason in (("required", None, "tool_calls"), ("named", "get_weather", "stop")):
        content, calls, finish = ToolCalls(how, name, parse).answer(said, "stop")
        assert not content and finish == reason
        assert [(c.function.name, json.loads(c.function.arguments)) for c in calls] == [
            ("get_weather", {"city": "Paris"})
        ]


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
