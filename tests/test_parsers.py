"""vLLM's output parsers (``vllm.reasoning_parser``, ``vllm.tool_call_parser``) reading what a model writes: a
reasoning model's thoughts apart from its answer, and its own tool calls after them, whole and streamed. The model
is the SIMULATED engine with the bundled model's tokenizer saying scripted replies (``simulated.replies``), so each
case knows what was written; the parsers are vLLM's own, over that tokenizer. In the core (unit), and over HTTP and
handles (serve)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from serve_app.config import AppConfig
from serve_app.core import Generator
from serve_app.engines import GenerationResult
from serve_app.openai.chat import ChatCompletionRequest, ChatFormat
from serve_app.openai.common import SamplingFields
from serve_app.openai.tools import ToolCalls

from .conftest import REPLIES, REPLY, SCRIPTED

MODEL = "SmolLM2-135M-Instruct"
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}


def asking(reply: int, **fields: Any) -> dict[str, Any]:
    """A chat body whose user message asks the simulated model for ``REPLIES[reply]``."""
    return {"messages": [{"role": "user", "content": f"Answer {REPLY}{reply}"}], "max_tokens": 96, **fields}


@pytest.fixture(scope="module")
def loop():
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()


@pytest.fixture(scope="module")
def core(loop):
    generator = Generator(AppConfig.model_validate({"engine": "simulated", **SCRIPTED}))
    loop.run_until_complete(generator.start())
    yield generator
    loop.run_until_complete(generator.stop())


def answered(core: Generator, loop: asyncio.AbstractEventLoop, body: dict[str, Any]) -> tuple[Any, list[Any]]:
    """The body's chat completion and its stream's chunks (as dicts), read as the chat route reads them."""
    request = ChatCompletionRequest.model_validate(body)
    engine = core.engine

    def fmt(prompt_ids: list[int]) -> ChatFormat:
        parse = engine.tool_call_reader(request.tool_dicts() or []) if request.tool_mode == "auto" else None
        calls = ToolCalls.of(request.tool_mode, request.tool_choice, parse)
        top = request.logprob_counts()[0]
        tools = request.tool_dicts() if request.tool_mode == "auto" else None
        reader = lambda: engine.output_reader(prompt_ids, tools)  # noqa: E731
        return ChatFormat(MODEL, 1, top, None, calls, reader, request.include_reasoning)

    async def run() -> tuple[Any, list[Any]]:
        (whole,) = await core.complete(requests := await core.requests.chat_completion(request))
        body = fmt(requests[0].prompt_token_ids).response([whole]).model_dump(mode="json", exclude_none=True)
        streamed = await core.requests.chat_completion(request)
        chunks, stream = [], fmt(streamed[0].prompt_token_ids)
        async for index, output in core.run(streamed):
            final = isinstance(output, GenerationResult)
            chunks += stream.final_chunks(index, output) if final else stream.chunks(index, output)
        return body, [c.model_dump(mode="json", exclude_unset=True) for c in chunks]

    return loop.run_until_complete(run())


def assembled(pieces: list[dict[str, Any]]) -> list[tuple[int, str, dict[str, Any]]]:
    """Streamed pieces of tool calls put together as OpenAI's client does (by ``index``): each call's index, name
    and parsed arguments. Each call's first piece carries its ``id``, ``type`` and name; the rest, its arguments."""
    calls: dict[int, dict[str, Any]] = {}
    for piece in pieces:
        function = piece.get("function") or {}
        if piece["index"] not in calls:
            assert piece.get("id") and piece.get("type") == "function" and function.get("name"), piece
            calls[piece["index"]] = {"name": function["name"], "arguments": ""}
        else:
            assert not piece.get("id") and not function.get("name"), piece
        calls[piece["index"]]["arguments"] += function.get("arguments") or ""
    return [(k, call["name"], json.loads(call["arguments"])) for k, call in sorted(calls.items())]


def deltas(chunks: list[dict[str, Any]], key: str) -> str:
    return "".join(c["choices"][0]["delta"].get(key) or "" for c in chunks if c["choices"])


def test_a_reply_asked_for_by_number_is_said_in_the_models_tokens_and_stops_there(core, loop):
    from transformers import AutoTokenizer

    from serve_app.models import prepare

    tokenizer = AutoTokenizer.from_pretrained(prepare())

    async def run(prompt: str, max_tokens: int) -> tuple[GenerationResult, str]:
        requests = await core.requests.prompts([prompt], core.requests.sampling(SamplingFields(max_tokens=max_tokens)))
        said = ""
        async for _, output in core.run(requests):
            if isinstance(output, GenerationResult):
                return output, said
            said += output.text
        raise AssertionError("no result")

    whole, said = loop.run_until_complete(run(f"say {REPLY}3", 32))
    assert whole.text == said == REPLIES[3] and whole.finish_reason == "stop"
    assert list(whole.token_ids) == tokenizer.encode(REPLIES[3], add_special_tokens=False)
    cut, _ = loop.run_until_complete(run(f"say {REPLY}3", 2))
    assert cut.finish_reason == "length" and cut.output_tokens == 2 and REPLIES[3].startswith(cut.text)
    echoed, _ = loop.run_until_complete(run(f"say {REPLY}9", 3))  # no such reply: the prompt's words
    assert echoed.text.startswith("[simulated] say") and echoed.finish_reason == "length"


def thought_tokens(text: str) -> int:
    """How many tokens the bundled model's tokenizer makes of ``text``."""
    from transformers import AutoTokenizer

    from serve_app.models import prepare

    return len(AutoTokenizer.from_pretrained(prepare()).encode(text, add_special_tokens=False))


def test_thoughts_are_apart_from_the_answer_in_the_body_and_the_stream(core, loop):
    body, chunks = answered(core, loop, asking(0))
    message = body["choices"][0]["message"]
    assert message["content"] == "Hello there!" and body["choices"][0]["finish_reason"] == "stop"
    assert message["reasoning"] == message["reasoning_content"] == "I should greet."
    # usage counts the thoughts' tokens, as vLLM's server does where a reasoning parser reads the output
    assert body["usage"]["completion_tokens_details"] == {"reasoning_tokens": thought_tokens("I should greet.")}
    assert deltas(chunks, "reasoning") == deltas(chunks, "reasoning_content") == "I should greet."
    assert deltas(chunks, "content") == "Hello there!"
    thinking = [c for c in chunks if c["choices"] and c["choices"][0]["delta"].get("reasoning")]
    assert all("content" not in c["choices"][0]["delta"] for c in thinking)  # a thought is no content

    unclosed, unclosed_chunks = answered(core, loop, asking(3))  # thoughts never closed: no answer yet
    assert unclosed["choices"][0]["message"] == {
        "role": "assistant",
        "reasoning": REPLIES[3],
        "reasoning_content": REPLIES[3],
    }
    assert deltas(unclosed_chunks, "reasoning") == REPLIES[3] and not deltas(unclosed_chunks, "content")

    hidden, hidden_chunks = answered(core, loop, asking(0, include_reasoning=False))
    assert hidden["choices"][0]["message"] == {"role": "assistant", "content": "Hello there!"}
    assert hidden["usage"] == body["usage"]  # hidden thoughts were still generated, and count
    assert not deltas(hidden_chunks, "reasoning") and deltas(hidden_chunks, "content") == "Hello there!"


@pytest.mark.parametrize("reply, cities", [(1, ["Paris"]), (2, ["Paris", "Lyon"])], ids=["one call", "two calls"])
def test_the_models_own_calls_after_its_thoughts_are_read_whole_and_streamed(core, loop, reply, cities):
    body, chunks = answered(core, loop, asking(reply, tools=[WEATHER]))  # tool_choice auto: OpenAI's default
    choice = body["choices"][0]
    assert choice["finish_reason"] == "tool_calls" and "content" not in choice["message"]
    assert choice["message"]["reasoning"] == REPLIES[reply][len("<think>") : REPLIES[reply].index("</think>")]
    calls = choice["message"]["tool_calls"]
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls] == [
        ("get_weather", {"city": city}) for city in cities
    ]
    assert deltas(chunks, "reasoning") == choice["message"]["reasoning"] and not deltas(chunks, "content")
    pieces = [piece for c in chunks if c["choices"] for piece in c["choices"][0]["delta"].get("tool_calls", [])]
    assert assembled(pieces) == [(k, "get_weather", {"city": city}) for k, city in enumerate(cities)]
    assert len(pieces) > 2 * len(cities)  # the arguments come piece by piece, as the model writes them
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"


def test_without_thoughts_wanted_structured_output_holds_from_the_first_token(core, loop):
    """``include_reasoning: false`` marks a chat's requests as past their reasoning (vLLM's ``reasoning_ended``), so
    vLLM's grammar constrains from the first token; otherwise the engine's reasoning parser decides."""
    bodies = [ChatCompletionRequest.model_validate(asking(0, include_reasoning=flag)) for flag in (False, True)]
    hidden, shown = (loop.run_until_complete(core.requests.chat_completion(body))[0] for body in bodies)
    assert (hidden.reasoning_ended, shown.reasoning_ended) == (True, None)


@pytest.mark.parametrize(
    ("parser", "constraint"),
    [("hermes", "structural_tag"), ("pythonic", "json"), ("poolside_v1", None), (None, "json")],
)
def test_a_forced_call_is_constrained_as_the_engines_tool_parser_says(loop, parser, constraint):
    """On an engine that constrains outputs, a forced call takes the constraint vLLM's tool parser gives: hermes its
    structural tag, pythonic vLLM's JSON list of calls, and poolside_v1, which reads forced calls in its own format
    but has no tag, none, as vLLM's server leaves them (a JSON list it could not read would lose the call); without
    a tool parser, vLLM's JSON list of calls. The SIMULATED engine, told it constrains outputs."""
    from serve_app.config import SimulatedSettings
    from serve_app.core.requests import RequestBuilder
    from serve_app.engines.parsers import OutputParsers
    from serve_app.engines.simulated import SimulatedEngine
    from serve_app.models import prepare

    engine = SimulatedEngine(SimulatedSettings(tokenizer=True), str(prepare()), OutputParsers(parser, None))
    engine.structures_outputs = True
    builder = RequestBuilder(engine, AppConfig.model_validate({"engine": "simulated", **SCRIPTED}))
    body = ChatCompletionRequest.model_validate(asking(1, tools=[WEATHER], tool_choice="required"))
    (request,) = loop.run_until_complete(builder.chat_completion(body))
    given = request.sampling.structured_outputs
    kinds = [] if given is None else [kind for kind in ("structural_tag", "json") if getattr(given, kind)]
    assert kinds == ([constraint] if constraint else [])


def test_parser_settings_are_checked_as_vllm_serve_checks_them():
    from serve_app.config import SimulatedSettings
    from serve_app.engines.parsers import OutputParsers
    from serve_app.engines.simulated import SimulatedEngine
    from serve_app.models import prepare

    with pytest.raises(
        ValueError, match=r"reasoning_parser: 'thinker' is not one of vLLM's reasoning parsers \(.*qwen3"
    ):
        OutputParsers(None, "thinker")
    with pytest.raises(ValueError, match=r"tool_call_parser: 'caller' is not one of vLLM's tool parsers \(.*hermes"):
        OutputParsers("caller", None)
    # deepseek_r1 looks for <think> as one token, which the bundled model's tokenizer has not: refused at start-up
    with pytest.raises(ValueError, match=r"reasoning_parser: 'deepseek_r1' cannot read this model's output: .*think"):
        SimulatedEngine(SimulatedSettings(tokenizer=True), str(prepare()), OutputParsers(None, "deepseek_r1"))


@pytest.mark.serve
def test_the_openai_client_and_handles_get_thoughts_and_calls_apart_from_the_answer(scripted_app):
    openai = pytest.importorskip("openai")
    url, handle = scripted_app
    client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)

    message = client.chat.completions.create(model=MODEL, **asking(0)).choices[0].message
    assert message.content == "Hello there!" and message.model_extra["reasoning_content"] == "I should greet."
    stream = client.chat.completions.create(model=MODEL, stream=True, **asking(0))
    pieces = [(c.choices[0].delta.model_extra.get("reasoning_content"), c.choices[0].delta.content) for c in stream]
    assert (
        "".join(r or "" for r, _ in pieces) == "I should greet."
        and "".join(c or "" for _, c in pieces) == "Hello there!"
    )

    choice = client.chat.completions.create(model=MODEL, tools=[WEATHER], **asking(2)).choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.model_extra["reasoning"] == "Two cities."
    assert [json.loads(c.function.arguments)["city"] for c in choice.message.tool_calls] == ["Paris", "Lyon"]
    streamed = [
        call.model_dump(exclude_none=True)
        for c in client.chat.completions.create(model=MODEL, tools=[WEATHER], stream=True, **asking(2))
        for call in (c.choices[0].delta.tool_calls or [])
    ]
    assert assembled(streamed) == [(0, "get_weather", {"city": "Paris"}), (1, "get_weather", {"city": "Lyon"})]

    messages = asking(1)["messages"]
    result = handle.chat.remote(messages, tools=[WEATHER], max_tokens=96).result()
    assert result["reasoning"] == "Weather needed." and result["content"] is None
    assert [c["function"]["name"] for c in result["tool_calls"]] == ["get_weather"]
    assert result["finish_reason"] == "tool_calls"
    hidden = handle.chat.remote(asking(0)["messages"], max_tokens=96, include_reasoning=False).result()
    assert hidden["reasoning"] is None and hidden["content"] == "Hello there!" and hidden["text"] == REPLIES[0]


@pytest.mark.system  # a Ray Data job
def test_a_ray_data_chat_job_answers_each_conversation_with_the_jobs_tools(scripted_app, tmp_path):
    """A Ray Data chat job (``serve_app.data.chat``) of a JSON lines file: each row's conversation answered as a chat
    completion with the job's tools (calls, thoughts and content apart, in their own columns), a conversation with a
    tool's answer in it taken whole, and an empty one an error row while the rest go on."""
    from serve_app.data import chat, read

    call = {"id": "call-1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}
    answered = [
        *asking(1)["messages"],
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call-1", "content": "Sunny"},
    ]
    conversations = [asking(2)["messages"], asking(0)["messages"], answered, []]
    path = tmp_path / "chats.jsonl"
    path.write_text("".join(json.dumps({"messages": messages}) + "\n" for messages in conversations))
    job = chat(read(str(path), id_column="id"), app="scripted", tools=[WEATHER], max_tokens=96, concurrency=2)
    rows = {row["id"]: row for row in job.take_all()}
    two, greeting, history, empty = (rows[f"chats.jsonl:{i}"] for i in range(4))

    assert two["finish_reason"] == "tool_calls" and two["reasoning"] == "Two cities." and two["content"] is None
    assert [json.loads(c["function"]["arguments"])["city"] for c in two["tool_calls"]] == ["Paris", "Lyon"]
    assert two["text"] == REPLIES[2] and two["error"] is None
    assert greeting["content"] == "Hello there!" and greeting["tool_calls"] is None
    assert greeting["reasoning"] == "I should greet." and greeting["finish_reason"] == "stop"
    assert history["error"] is None and [c["function"]["name"] for c in history["tool_calls"]] == ["get_weather"]
    assert history["prompt_tokens"] > two["prompt_tokens"]  # the call and the tool's answer are in its prompt
    assert empty["error"].startswith("invalid: ") and "messages" in empty["error"] and empty["tool_calls"] is None


@pytest.mark.system  # a Ray Data job
def test_the_driver_runs_a_chat_job_with_a_tools_file(scripted_app, tmp_path):
    """``python -m serve_app.driver --task chat --tools FILE``: the same job from the command line, its output
    files holding each row's calls and content; ``--tools`` on another task is refused, naming the flag."""
    from serve_app import driver
    from serve_app.data.summary import written_tables

    tools = tmp_path / "tools.json"
    tools.write_text(json.dumps([WEATHER]))
    data = tmp_path / "chats.jsonl"
    data.write_text("".join(json.dumps({"messages": asking(i)["messages"]}) + "\n" for i in (1, 0)))
    flags = ["--input", str(data), "--output", str(tmp_path / "out"), "--app", "scripted", "--tools", str(tools)]
    summary = driver.run(driver.parser().parse_args(["--task", "chat", *flags, "--max-tokens", "96"]))
    assert summary["rows_in"] == summary["rows_out"] == 2 and summary["errors"] == 0 and summary["output_tokens"] > 0
    rows = {
        row["id"]: row for frame in written_tables(str(tmp_path / "out"), "jsonl") for row in frame.to_dict("records")
    }
    called, greeting = rows["chats.jsonl:0"], rows["chats.jsonl:1"]
    assert [call["function"]["name"] for call in called["tool_calls"]] == ["get_weather"]
    assert greeting["content"] == "Hello there!" and greeting["finish_reason"] == "stop"
    with pytest.raises(ValueError, match="--tools and --tool-choice apply to --task chat"):
        driver.run(driver.parser().parse_args(flags))
