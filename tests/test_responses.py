"""``/v1/responses`` (OpenAI's Responses API) over HTTP with the OpenAI Python client, against a SIMULATED-engine app
that says scripted replies in the bundled model's tokens (``simulated.replies``) with vLLM's parsers reading them:
a response and its stream of events, function calls and their outputs continuing a stored response, GET and DELETE
of stored responses, and refusals naming the Responses field."""

from __future__ import annotations

import json

import httpx
import pytest

from .conftest import REPLY as MARK

pytestmark = pytest.mark.serve

MODEL = "SmolLM2-135M-Instruct"
WEATHER = {
    "type": "function",
    "name": "get_weather",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}
"""A function tool as the Responses API gives it."""


@pytest.fixture(scope="module")
def app(scripted_app):
    return scripted_app


@pytest.fixture(scope="module")
def client(app):
    openai = pytest.importorskip("openai")
    return openai.OpenAI(base_url=app[0] + "/v1", api_key="unused", max_retries=0)


def test_a_response_and_its_stream_of_events(app, client):
    whole = client.responses.create(model=MODEL, input=f"Greet me {MARK}0", max_output_tokens=64)
    assert whole.status == "completed" and whole.output_text == "Hello there!"
    reasoning, message = whole.output
    assert reasoning.type == "reasoning" and reasoning.content[0].text == "I should greet."
    assert message.type == "message" and message.role == "assistant" and message.status == "completed"
    assert whole.usage.input_tokens > 0 and 0 < whole.usage.output_tokens <= 64
    assert whole.usage.total_tokens == whole.usage.input_tokens + whole.usage.output_tokens
    assert 0 < whole.usage.output_tokens_details.reasoning_tokens < whole.usage.output_tokens  # the thoughts'

    events = list(client.responses.create(model=MODEL, input=f"Greet me {MARK}0", max_output_tokens=64, stream=True))
    assert [e.sequence_number for e in events] == list(range(len(events)))
    kinds = [e.type for e in events]
    assert kinds[:3] == ["response.created", "response.in_progress", "response.output_item.added"]
    assert kinds[-1] == "response.completed" and kinds.count("response.output_item.done") == 2
    thoughts = "".join(e.delta for e in events if e.type == "response.reasoning_text.delta")
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert (thoughts, text) == ("I should greet.", "Hello there!")
    (done,) = [e for e in events if e.type == "response.output_text.done"]
    assert done.text == text
    final = events[-1].response
    assert final.output_text == text and [item.type for item in final.output] == ["reasoning", "message"]
    assert kinds.index("response.output_text.delta") > kinds.index("response.content_part.added")

    # On the wire each event is named by its type, as OpenAI sends it (its client reads the data alone).
    body = {"model": MODEL, "input": f"Greet me {MARK}0", "max_output_tokens": 64, "stream": True}
    wire = httpx.post(f"{app[0]}/v1/responses", json=body, timeout=60).text.strip().split("\n\n")
    fields = [dict(line.split(": ", 1) for line in event.split("\n")) for event in wire[:-1]]
    assert [f.get("event") for f in fields] == [json.loads(f["data"])["type"] for f in fields] == kinds
    assert wire[-1] == "data: [DONE]"

    cut = client.responses.create(model=MODEL, input=f"Greet me {MARK}0", max_output_tokens=3)
    assert cut.status == "incomplete" and cut.incomplete_details.reason == "max_output_tokens"


def test_function_calls_and_their_outputs_continue_a_stored_response(client):
    first = client.responses.create(model=MODEL, input=f"Weather in two cities? {MARK}2", tools=[WEATHER])
    calls = [item for item in first.output if item.type == "function_call"]
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [
        ("get_weather", {"city": "Paris"}),
        ("get_weather", {"city": "Lyon"}),
    ]
    assert len({c.call_id for c in calls}) == 2
    streamed = list(client.responses.create(model=MODEL, input=f"Again {MARK}2", tools=[WEATHER], stream=True))
    added = [e.item for e in streamed if e.type == "response.output_item.added" and e.item.type == "function_call"]
    assert [(item.name, item.arguments, item.status) for item in added] == [("get_weather", "", "in_progress")] * 2
    pieces = [e for e in streamed if e.type == "response.function_call_arguments.delta"]
    assert len(pieces) > 2  # the arguments come piece by piece, as the model writes them
    done = [e for e in streamed if e.type == "response.function_call_arguments.done"]
    assert [e.item_id for e in done] == [item.id for item in added]
    assert [e.arguments for e in done] == ["".join(p.delta for p in pieces if p.item_id == e.item_id) for e in done]
    assert [json.loads(e.arguments)["city"] for e in done] == ["Paris", "Lyon"]
    final = streamed[-1].response
    assert [(item.type, item.id) for item in final.output[1:]] == [("function_call", item.id) for item in added]
    assert [item.arguments for item in final.output[1:]] == [e.arguments for e in done]

    outputs = [
        {"type": "function_call_output", "call_id": c.call_id, "output": f"sunny in {json.loads(c.arguments)['city']}"}
        for c in calls
    ]
    # The outputs alone ask for no reply: the model says reply 2 again only because the conversation it continues
    # (the first request's input, then its calls) is in its prompt, ahead of the outputs.
    second = client.responses.create(model=MODEL, previous_response_id=first.id, input=outputs, tools=[WEATHER])
    assert second.previous_response_id == first.id
    assert second.usage.input_tokens > first.usage.input_tokens + first.usage.output_tokens
    assert [item.type for item in second.output] == ["reasoning", "function_call", "function_call"]
    alone = client.responses.create(model=MODEL, input="sunny in Paris")  # no reply asked for: the prompt's words
    assert alone.output[0].content[0].text.startswith("[simulated]")


def test_stored_responses_are_got_and_deleted_and_an_unknown_one_is_a_404(client):
    openai = pytest.importorskip("openai")
    made = client.responses.create(model=MODEL, input=f"Hi {MARK}0", metadata={"case": "store"})
    got = client.responses.retrieve(made.id)
    assert got.model_dump() == made.model_dump() and got.metadata == {"case": "store"}
    client.responses.delete(made.id)
    for call in (lambda: client.responses.retrieve(made.id), lambda: client.responses.delete(made.id)):
        with pytest.raises(openai.NotFoundError, match=made.id):
            call()
    with pytest.raises(openai.NotFoundError) as missing:
        client.responses.create(model=MODEL, input="Hi", previous_response_id="resp_nope")
    assert missing.value.body["param"] == "previous_response_id"
    unstored = client.responses.create(model=MODEL, input=f"Hi {MARK}0", store=False)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(unstored.id)


def test_a_responses_id_names_the_replica_that_made_it(client):
    """What the token router sends a follow-up (``previous_response_id``) back to that replica by."""
    from harness.replicas import replica_actors
    from serve_app.serving.routing.sessions import made_by

    made = client.responses.create(model=MODEL, input=f"Hi {MARK}0", store=False)
    replicas = replica_actors("scripted")
    assert made_by(made.id, ((name, name) for name in replicas)) in replicas, (made.id, list(replicas))


@pytest.mark.parametrize(
    "fields, status, param",
    [
        ({"tools": [{"type": "web_search"}]}, 400, "tools[0].type"),
        ({"input": [{"type": "item_reference", "id": "x"}]}, 400, "input[0].type"),
        (
            {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "u"}]}]},
            400,
            "input[0].content[0].type",
        ),
        ({"text": {"format": {"type": "json_object"}}}, 400, "text.format"),  # the simulated engine constrains nothing
        ({"background": True}, 400, "background"),
        ({"max_output_tokens": 0}, 400, "max_output_tokens"),
        ({"model": "gpt-9"}, 404, "model"),
    ],
)
def test_bad_requests_name_the_responses_field(app, fields, status, param):
    answer = httpx.post(app[0] + "/v1/responses", json={"model": MODEL, "input": "hi", **fields}, timeout=30)
    assert answer.status_code == status, answer.text
    assert answer.json()["error"]["param"] == param, answer.text


def test_a_handle_answers_a_responses_body_as_the_route_does(app):
    answer = app[1].openai.remote("/v1/responses", {"model": MODEL, "input": f"Hi {MARK}0"}).result()
    assert answer["status_code"] == 200 and answer["body"]["output"][-1]["content"][0]["text"] == "Hello there!"
