"""Agent frameworks as their users run them against an OpenAI-compatible server: the OpenAI Agents SDK (the
Responses API, its default, and chat completions), pydantic-ai and LangChain (chat completions) each run a
tool-using turn: the model calls a Python function, the framework runs it and sends its output back, and the model
answers. The model is the SIMULATED engine saying scripted replies in the bundled model's tokens, read by vLLM's
parsers (``tests/test_parsers.py``): it calls ``get_weather`` when asked, and answers once the tool's output asks it
to (the last reply a prompt asks for wins), so each framework's whole loop is checked, not a model's luck."""

from __future__ import annotations

import asyncio
import json

import pytest

from .conftest import REPLY as MARK

pytestmark = pytest.mark.serve

MODEL = "SmolLM2-135M-Instruct"
ASK = f"What is the weather in Paris? {MARK}1"
"""Reply 1: a thought, then a call of get_weather for Paris."""
ANSWER = "Hello there!"
"""Reply 0's answer (after its thought), which the tool's output asks for."""


def get_weather(city: str) -> str:
    """The weather in a city."""
    CALLED.append(city)
    return f"sunny in {city} {MARK}0"


CALLED: list[str] = []


@pytest.fixture(scope="module")
def base_url(scripted_app):
    return scripted_app[0] + "/v1"


@pytest.fixture(autouse=True)
def calls():
    CALLED.clear()
    yield CALLED


@pytest.mark.parametrize("api, streamed", [("responses", False), ("responses", True), ("chat", False)])
def test_the_openai_agents_sdk_runs_a_tool_and_answers(base_url, api, streamed, calls):
    agents = pytest.importorskip("agents")
    import openai

    agents.set_tracing_disabled(True)  # tracing would export to OpenAI's servers
    client = openai.AsyncOpenAI(base_url=base_url, api_key="unused", max_retries=0)
    kind = agents.OpenAIResponsesModel if api == "responses" else agents.OpenAIChatCompletionsModel
    agent = agents.Agent(
        name="weather",
        instructions="Answer questions about the weather.",
        tools=[agents.function_tool(get_weather)],
        model=kind(model=MODEL, openai_client=client),
    )
    if streamed:

        async def run() -> agents.RunResultStreaming:
            result = agents.Runner.run_streamed(agent, ASK, max_turns=4)
            kinds = {event.type async for event in result.stream_events()}
            assert "raw_response_event" in kinds, kinds  # the Responses API's events, as they came
            return result

        result = asyncio.run(run())
    else:
        result = agents.Runner.run_sync(agent, ASK, max_turns=4)
    assert result.final_output == ANSWER and calls == ["Paris"]
    made = [item for item in result.new_items if item.type == "tool_call_item"]
    assert [json.loads(item.raw_item.arguments) for item in made] == [{"city": "Paris"}]


def test_pydantic_ai_runs_a_tool_and_answers(base_url, calls):
    pytest.importorskip("pydantic_ai")
    from pydantic_ai import Agent
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider

    model = OpenAIChatModel(MODEL, provider=OpenAIProvider(base_url=base_url, api_key="unused"))
    agent = Agent(model, tools=[get_weather], instructions="Answer questions about the weather.")
    assert agent.run_sync(ASK).output == ANSWER and calls == ["Paris"]


def test_langchain_binds_a_tool_reads_the_call_and_answers_after_its_output(base_url, calls):
    pytest.importorskip("langchain_openai")
    from langchain_core.messages import HumanMessage, ToolMessage
    from langchain_openai import ChatOpenAI

    llm = ChatOpenAI(model=MODEL, base_url=base_url, api_key="unused", max_retries=0).bind_tools([get_weather])
    history = [HumanMessage(ASK)]
    asked = llm.invoke(history)
    (call,) = asked.tool_calls
    assert call["name"] == "get_weather" and call["args"] == {"city": "Paris"}
    history += [asked, ToolMessage(get_weather(**call["args"]), tool_call_id=call["id"])]
    assert llm.invoke(history).content == ANSWER and calls == ["Paris"]
