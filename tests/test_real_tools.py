"""Tool calling on the real app (`serve run serve_config.yaml`, vLLM and the bundled model, its shipped chat template
with tools and vLLM's `hermes` parser), as the OpenAI Python client and a DeploymentHandle use it: forced calls
(``required``, a named function) of a strict tool are valid against its schema whole and streamed, a tool's answer
in the history is taken, ``auto`` answers either way in a consistent shape, and the template shows the model without
tools exactly what its own template does."""

from __future__ import annotations

import json
from typing import Any

import httpx
import jsonschema
import pytest

pytestmark = pytest.mark.system

PARAMETERS = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 24}, "unit": {"enum": ["celsius", "fahrenheit"]}},
    "required": ["city", "unit"],
    "additionalProperties": False,
}
WEATHER = {
    "type": "function",
    "function": {"name": "get_weather", "description": "The weather now", "parameters": PARAMETERS, "strict": True},
}
"""A strict tool (OpenAI's ``strict: true``): vLLM's structural tag holds its calls' arguments to its schema too."""
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
NAMED = {"type": "function", "function": {"name": "get_weather"}}


def client(real_app: Any) -> Any:
    import openai

    return openai.OpenAI(base_url=f"{real_app.url}/v1", api_key="unused", max_retries=0, timeout=120)


def streamed_calls(stream: Any) -> tuple[list[tuple[str, str]], str | None, str]:
    """The calls a stream's tool-call deltas add up to (OpenAI's shape: pieces by index), its finish reason and
    its content."""
    calls: dict[int, list[str]] = {}
    reason, content = None, ""
    for chunk in stream:
        for choice in chunk.choices:
            content += choice.delta.content or ""
            for piece in choice.delta.tool_calls or ():
                name, arguments = calls.setdefault(piece.index, ["", ""])
                calls[piece.index] = [name + (piece.function.name or ""), arguments + (piece.function.arguments or "")]
            reason = choice.finish_reason or reason
    return [(name, arguments) for name, arguments in (calls[i] for i in sorted(calls))], reason, content


@pytest.mark.parametrize(("choice", "reason"), [("required", "tool_calls"), (NAMED, "stop")], ids=["required", "named"])
def test_forced_calls_match_the_tools_schema_whole_and_streamed(real_app, choice, reason):
    args = {"model": "SmolLM2-135M-Instruct", "messages": ASK, "tools": [WEATHER], "tool_choice": choice}
    args |= {"parallel_tool_calls": False, "max_tokens": 96, "temperature": 0}
    whole = client(real_app).chat.completions.create(**args)
    (answer,) = whole.choices
    assert answer.finish_reason == reason and answer.message.content is None, answer
    (call,) = answer.message.tool_calls
    assert call.type == "function" and call.id and call.function.name == "get_weather"
    jsonschema.validate(json.loads(call.function.arguments), PARAMETERS)
    calls, streamed_reason, content = streamed_calls(client(real_app).chat.completions.create(**args, stream=True))
    # the same call (the whole answer's arguments are the parser's JSON of them, the stream's as the model wrote them)
    assert [(name, json.loads(arguments)) for name, arguments in calls] == [
        (call.function.name, json.loads(call.function.arguments))
    ]
    assert streamed_reason == reason and not content
    assert whole.usage.prompt_tokens > 150  # the tools' definitions are in the prompt the engine ran


def test_a_tools_answer_in_the_history_is_taken_and_answered(real_app):
    call = {"id": "call-1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
    messages = [
        *ASK,
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call-1", "content": "18 degrees celsius, sunny"},
    ]
    answer = client(real_app).chat.completions.create(
        model="SmolLM2-135M-Instruct", messages=messages, tools=[WEATHER], tool_choice="none", max_tokens=24
    )
    (choice,) = answer.choices
    assert choice.message.content and not choice.message.tool_calls and choice.finish_reason in ("stop", "length")
    tokenize = f"{real_app.url}/tokenize"
    counted = httpx.post(tokenize, json={"messages": messages, "tools": [WEATHER]}, timeout=60).json()["count"]
    assert answer.usage.prompt_tokens == counted  # what admission counted: the history and the tools' definitions
    without = httpx.post(tokenize, json={"messages": messages}, timeout=60).json()["count"]
    assert counted > without + 100


def test_auto_answers_with_content_or_calls_and_the_reason_that_goes_with_them(real_app):
    answer = client(real_app).chat.completions.create(
        model="SmolLM2-135M-Instruct", messages=ASK, tools=[WEATHER], max_tokens=64, temperature=0
    )
    (choice,) = answer.choices
    if choice.message.tool_calls:
        assert choice.finish_reason == "tool_calls"
        assert all(
            call.function.name and json.loads(call.function.arguments) is not None for call in choice.message.tool_calls
        )
    else:
        assert choice.finish_reason in ("stop", "length") and choice.message.content


def test_the_template_shows_the_model_without_tools_what_its_own_does(real_app):
    """The shipped template (``vllm.chat_template`` in serve_config.yaml) renders a conversation without tools
    token for token as the bundled model's own template does."""
    from transformers import AutoTokenizer

    from serve_app.models import bundled_path

    tokenizer = AutoTokenizer.from_pretrained(bundled_path())
    conversation = [{"role": "system", "content": "Be brief."}, *ASK, {"role": "assistant", "content": "Sunny."}, *ASK]
    for messages in (ASK, conversation):
        text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        own = tokenizer(text, add_special_tokens=False)["input_ids"]  # as vLLM tokenizes a rendered chat
        served = httpx.post(f"{real_app.url}/tokenize", json={"messages": messages}, timeout=60).json()["tokens"]
        assert served == list(own)


def handle_tool_call() -> dict[str, Any]:
    """A forced call through the handle (run by a driver of the real app's cluster: :meth:`RealApp.call`)."""
    import ray
    from ray import serve

    ray.init(address="auto", namespace="serve")
    llm = serve.get_app_handle("llm")
    return llm.chat.remote(ASK, tools=[WEATHER], tool_choice=NAMED, max_tokens=96).result()


def test_a_handle_returns_the_calls_in_openais_shape(real_app):
    result = real_app.call("tests.test_real_tools:handle_tool_call")
    assert result["finish_reason"] == "stop" and result["content"] is None
    (call,) = result["tool_calls"]
    assert call["function"]["name"] == "get_weather" and call["type"] == "function"
    jsonschema.validate(json.loads(call["function"]["arguments"]), PARAMETERS)


def test_the_docs_example_runs_as_written_and_a_schema_vllm_cannot_compile_is_a_400(real_app):
    """docs/http.md's tool-calling example prints the call's name and its arguments; a strict tool whose schema
    vLLM's grammar backend refuses is a 400 naming ``tools`` when a call is forced (a tool that is not strict
    leaves its arguments free: its schema is not compiled)."""
    import ast

    import openai

    printed = real_app.run_example("docs/http.md", "tools=[weather]")
    name, arguments = printed.strip().split(" ", 1)
    assert name == "get_weather" and set(ast.literal_eval(arguments)) == {"city"}, printed
    bad = {"type": "function", "function": {"name": "f", "parameters": {"type": "no-such-type"}, "strict": True}}
    with pytest.raises(openai.BadRequestError) as refused:
        client(real_app).chat.completions.create(
            model="SmolLM2-135M-Instruct", messages=ASK, tools=[bad], tool_choice="required", max_tokens=8
        )
    assert refused.value.body["param"] == "tools", refused.value.body


def test_the_responses_api_forces_a_call_and_a_schema_and_continues_with_the_tools_answer(real_app):
    """``/v1/responses`` on the real engine: a required function call valid against its schema, the tool's output
    continuing the stored response (on the prompt: the whole exchange, whose start the prefix cache holds, as
    usage says), and ``text.format`` constraining the answer to a JSON schema."""
    responses = client(real_app).responses
    tool = {"type": "function", "name": "get_weather", "parameters": PARAMETERS, "strict": True}
    first = responses.create(
        model="SmolLM2-135M-Instruct",
        input="What is the weather in Paris?",
        tools=[tool],
        tool_choice="required",
        parallel_tool_calls=False,
        max_output_tokens=96,
        temperature=0,
    )
    (call,) = first.output
    assert call.type == "function_call" and call.name == "get_weather" and first.status == "completed"
    jsonschema.validate(json.loads(call.arguments), PARAMETERS)
    answer = {"type": "function_call_output", "call_id": call.call_id, "output": "21 degrees, sunny"}
    second = responses.create(  # the tools given again, as an agent's loop does (they are not carried over)
        model="SmolLM2-135M-Instruct", previous_response_id=first.id, input=[answer], tools=[tool], max_output_tokens=24
    )
    assert second.output and second.usage.input_tokens > first.usage.input_tokens + first.usage.output_tokens
    block = 128  # vLLM's KV-cache block on a CPU: its prefix cache holds a prompt's full blocks
    for usage in (first.usage, second.usage):  # each prompt's full blocks: found in the cache, or written to it
        details = usage.input_tokens_details
        assert details.cached_tokens + details.cache_write_tokens == usage.input_tokens // block * block, usage
    assert second.usage.input_tokens_details.cached_tokens >= first.usage.input_tokens // block * block  # continued

    schema = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 24}}, "required": ["city"]}
    shaped = responses.create(
        model="SmolLM2-135M-Instruct",
        input="Name a French city.",
        text={"format": {"type": "json_schema", "name": "city", "schema": schema}},
        max_output_tokens=48,
    )
    jsonschema.validate(json.loads(shaped.output_text), schema)


def test_the_docs_responses_example_runs_as_written(real_app):
    """docs/http.md's Responses API example: a response and its follow-up through ``previous_response_id``."""
    printed = real_app.run_example("docs/http.md", "previous_response_id")
    assert printed.split() in (["completed", "True", "True"], ["incomplete", "True", "True"]), printed


@pytest.mark.parametrize("api", ["responses", "chat"])
def test_the_openai_agents_sdk_calls_a_tool_on_the_real_engine(real_app, api):
    """The Agents SDK's two models (the Responses API, its default, and chat completions) with the real model: a
    required call of a Python function, its arguments valid against the function's schema, run by the SDK (which
    stops there: the model's later turns are not this test's point; tests/test_agents.py runs whole loops)."""
    import asyncio

    import agents
    import openai

    agents.set_tracing_disabled(True)  # tracing would export to OpenAI's servers
    called: list[dict[str, Any]] = []

    @agents.function_tool
    def get_weather(city: str, unit: str) -> str:
        """The weather now in a city, in celsius or fahrenheit."""
        called.append({"city": city, "unit": unit})
        return f"21 degrees {unit} in {city}"

    client = openai.AsyncOpenAI(base_url=f"{real_app.url}/v1", api_key="unused", max_retries=0, timeout=120)
    kind = agents.OpenAIResponsesModel if api == "responses" else agents.OpenAIChatCompletionsModel
    agent = agents.Agent(
        name="weather",
        instructions="Use the tool.",
        tools=[get_weather],
        model=kind(model="SmolLM2-135M-Instruct", openai_client=client),
        model_settings=agents.ModelSettings(tool_choice="required", parallel_tool_calls=False, max_tokens=96),
        tool_use_behavior="stop_on_first_tool",
    )
    result = asyncio.run(agents.Runner.run(agent, "What is the weather in Paris?", max_turns=2))
    (args,) = called
    assert isinstance(args["city"], str) and result.final_output == f"21 degrees {args['unit']} in {args['city']}"


def test_langchain_and_pydantic_ai_get_typed_answers_streams_and_batches_from_the_real_engine(real_app):
    """LangChain's ``with_structured_output(method="json_schema")``, ``stream`` and ``batch``, and pydantic-ai's typed
    output (``NativeOutput``: the schema as ``response_format``), on the real model: structured output makes even a
    135M model's answer valid for the type (room given: it writes long strings)."""
    from langchain_openai import ChatOpenAI
    from pydantic import BaseModel, Field
    from pydantic_ai import Agent, NativeOutput
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider

    class City(BaseModel):
        name: str = Field(max_length=24)
        country: str = Field(max_length=24)

    llm = ChatOpenAI(model="SmolLM2-135M-Instruct", base_url=f"{real_app.url}/v1", api_key="unused", max_tokens=64)
    city = llm.with_structured_output(City, method="json_schema").invoke("Name a city in France.")
    assert isinstance(city, City) and city.name
    pieces = list(llm.stream("Say hello."))
    assert len(pieces) > 1 and "".join(piece.content for piece in pieces)
    answers = llm.batch(["Say hello.", "Say goodbye."])
    assert len(answers) == 2 and all(answer.content for answer in answers)

    model = OpenAIChatModel(
        "SmolLM2-135M-Instruct", provider=OpenAIProvider(base_url=f"{real_app.url}/v1", api_key="x")
    )
    typed = Agent(model, output_type=NativeOutput(City)).run_sync("Name a city in France.")
    assert isinstance(typed.output, City) and typed.output.name


def test_the_docs_ray_data_chat_job_runs_as_written(real_app):
    """docs/ray-data.md's chat job on the real model: each row's conversation answered with the job's strict tool,
    a forced call per row."""
    printed = real_app.run_example("docs/ray-data.md", "from serve_app.data import chat")
    assert printed.split() == ["tool_calls", "get_weather"] * 2, printed
