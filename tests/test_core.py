"""The cores outside Ray Serve (the generation core with the SIMULATED engine): the one request path, errors
reported as errors, per-row validation, timeouts, withdrawal, draining. What a Serve replica and a Ray Data actor
both stand on."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from serve_app.config import AppConfig
from serve_app.core import Generator
from serve_app.core.streams import Deadline
from serve_app.engines import GenerationDelta, GenerationResult, TokenLogprob, coalesce
from serve_app.errors import GenerationError, RequestError
from serve_app.openai.chat import ChatCompletionRequest
from serve_app.openai.common import SamplingFields
from serve_app.openai.completions import CompletionRequest
from serve_app.openai.responses import ResponsesRequest
from serve_app.openai.tokenize import TokenizeRequest

from .waits import wait_for

USER = {"role": "user", "content": "Say hi"}


def core(**args) -> Generator:
    return Generator(AppConfig.model_validate({"engine": "simulated", **args}))


async def prompts(generator: Generator, texts: list, **sampling) -> list:
    builder = generator.requests
    return await builder.prompts(texts, builder.sampling(SamplingFields(**sampling)))


async def test_one_path_streams_deltas_then_each_result_in_order():
    generator = core(simulated={"step_s": 0.001})
    await generator.start()
    try:
        requests = await prompts(generator, ["one two", "three four five"], max_tokens=3)
        seen: dict[int, list] = {0: [], 1: []}
        async for index, output in generator.run(requests):
            seen[index].append(output)
        for outputs in seen.values():
            *deltas, result = outputs
            assert all(isinstance(d, GenerationDelta) for d in deltas) and isinstance(result, GenerationResult)
            assert [d.output_tokens for d in deltas] == [1, 2, 3]
            assert "".join(d.text for d in deltas) == result.text and not result.failed
        assert generator.stats()["requests"] == {"ongoing": 0, "peak": 1, "abandoned": 0}
    finally:
        await generator.stop()


@pytest.mark.parametrize(
    ("fields", "end"),
    [
        ({}, "<|assistant|>Hi th\n<|assistant|>"),
        ({"add_generation_prompt": False}, "<|assistant|>Hi th\n"),
        ({"add_generation_prompt": False, "continue_final_message": True}, "<|assistant|>Hi th"),
    ],
)
async def test_a_chats_template_arguments_shape_its_prompt(fields, end):
    """With the simulated engine's template (``<|role|>content`` lines, then the generation prompt)."""
    prefilled = [USER, {"role": "assistant", "content": "Hi th"}]
    body = ChatCompletionRequest.model_validate({"messages": prefilled, **fields})
    (request,) = await core().requests.chat_completion(body)
    assert request.prompt_text == "<|user|>Say hi\n" + end


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"continue_final_message": True}, "continue_final_message"),  # with the generation prompt, as vLLM refuses
        ({"chat_template_kwargs": {"tokenize": True}}, "chat_template_kwargs"),
    ],
)
async def test_template_arguments_vllm_refuses_are_refused_naming_them(fields, param):
    body = ChatCompletionRequest.model_validate({"messages": [USER], **fields})
    with pytest.raises(RequestError) as refused:
        await core().requests.chat_completion(body)
    assert refused.value.param == param


@pytest.mark.parametrize(
    ("fields", "kept"),
    [
        ({"truncate_prompt_tokens": 3}, slice(0, 3)),  # the tokenizer's side: the simulated one keeps the first
        ({"truncate_prompt_tokens": 3, "truncation_side": "left"}, slice(-3, None)),
        ({"truncate_prompt_tokens": -1}, slice(None)),  # the context less one token: the whole prompt here
        ({"truncate_prompt_tokens": 50}, slice(None)),
    ],
)
async def test_truncate_prompt_tokens_keeps_that_many_of_a_prompts_tokens_from_its_side(fields, kept):
    builder, text = core().requests, "the quick brown fox jumps over the lazy dog"
    (whole,) = await builder.completion(CompletionRequest(prompt=text, max_tokens=2))
    (cut,) = await builder.completion(CompletionRequest(prompt=text, max_tokens=2, echo=True, **fields))
    assert cut.prompt_token_ids == whole.prompt_token_ids[kept]
    assert cut.prompt_text == (text if kept == slice(None) else await builder.engine.decode(cut.prompt_token_ids))
    chat = ChatCompletionRequest.model_validate({"messages": [USER], "max_tokens": 2, **fields})
    (whole_chat,), (cut_chat,) = [
        await builder.chat_completion(chat.model_copy(update=u)) for u in ({"truncate_prompt_tokens": None}, {})
    ]
    assert cut_chat.prompt_token_ids == whole_chat.prompt_token_ids[kept]


@pytest.mark.parametrize("special", [True, False])
async def test_a_completions_add_special_tokens_reaches_the_engines_tokenizer(monkeypatch, special):
    """The bundled model's tokenizer adds no special token to a prompt, so this is seen at the engine's call."""
    generator = core()
    asked: list[bool] = []

    async def encode(texts, add_special_tokens=True):
        asked.append(add_special_tokens)
        return [[1, 2, 3] for _ in texts]

    monkeypatch.setattr(generator.engine, "encode", encode)
    body = CompletionRequest(prompt=["a", "b"], max_tokens=2, add_special_tokens=special)
    await generator.requests.completion(body)
    await generator.requests.tokenize(TokenizeRequest(prompt="a", add_special_tokens=special))
    assert asked == [special, special]


async def test_max_tokens_past_the_context_gets_the_room_the_context_has_as_vllms_server_gives_it():
    generator = core(simulated={"max_model_len": 64, "step_s": 0})
    await generator.start()
    try:
        (request,) = await prompts(generator, ["x" * 200], max_tokens=100)  # 50 tokens: room for 14
        assert request.sampling.max_tokens == 64 - len(request.prompt_token_ids) == 14
        (result,) = await generator.complete([request])
        assert result.output_tokens == 14 and result.finish_reason == "length"
        with pytest.raises(RequestError) as refused:
            await prompts(generator, ["x" * 200], max_tokens=100, min_tokens=20)
        assert refused.value.param == "min_tokens"
    finally:
        await generator.stop()


@pytest.mark.parametrize("keep", [0, 100_000])
async def test_a_truncation_that_leaves_nothing_or_exceeds_the_context_is_refused_naming_it(keep):
    with pytest.raises(RequestError) as refused:
        await core().requests.completion(CompletionRequest(prompt="hello there", truncate_prompt_tokens=keep))
    assert refused.value.param == "truncate_prompt_tokens"


async def test_repetition_detection_is_refused_by_an_engine_that_does_not_detect_it():
    """The simulated engine ends no request for repeating itself: a request asking for it is a 400 naming the field,
    not an answer that ignored it."""
    repeats = {"max_pattern_size": 4, "min_count": 3}
    with pytest.raises(RequestError) as refused:
        await core().requests.completion(CompletionRequest(prompt="hello there", repetition_detection=repeats))
    assert refused.value.param == "repetition_detection"


def test_reasoning_effort_reaches_the_template_and_sets_its_thinking_unless_the_request_does():
    """On chat completions, and from the Responses API's ``reasoning.effort``."""

    def kwargs(**fields):
        return ChatCompletionRequest.model_validate({"messages": [USER], **fields}).template_kwargs()

    assert kwargs(reasoning_effort="none")["enable_thinking"] is False
    assert kwargs(reasoning_effort="low")["reasoning_effort"] == "low"
    assert kwargs(reasoning_effort="none", chat_template_kwargs={"enable_thinking": True})["enable_thinking"] is True
    assert "enable_thinking" not in kwargs()
    responses = ResponsesRequest(input="hi", reasoning={"effort": "none"}, chat_template_kwargs={"x": 1})
    assert kwargs(**responses.chat_body([])) == {**kwargs(reasoning_effort="none"), "x": 1}  # as chat passes them


async def test_a_paced_stream_sends_its_first_token_at_once_and_joins_what_comes_within_the_interval():
    generator = core(simulated={"step_s": 0.001}, batcher={"stream_interval_s": 1.0})
    await generator.start()
    try:  # 6 tokens a millisecond apart, the interval far longer: the first alone, the rest with the end
        (request,) = await prompts(generator, ["one two"], max_tokens=6)
        outputs = [output async for _, output in generator.run([request])]
        first, joined, result = outputs
        assert (first.output_tokens, joined.output_tokens) == (1, 6) and isinstance(result, GenerationResult)
        assert first.text + joined.text == result.text
    finally:
        await generator.stop()


async def test_a_stream_interval_sends_that_many_tokens_a_delta_the_first_and_the_end_at_once():
    """vLLM's ``stream_interval`` on the simulated engine: the deltas of 8 tokens 3 at a time end at tokens 1, 4, 7 and
    8 (a reader that fell behind may get two of them joined, never a delta ending elsewhere)."""
    generator = core(simulated={"step_s": 0.005})
    await generator.start()
    try:
        (request,) = await prompts(generator, ["one two"], max_tokens=8, stream_interval=3)
        outputs = [output async for _, output in generator.run([request])]
        *deltas, result = outputs
        counts = [delta.output_tokens for delta in deltas]
        assert counts[0] == 1 and counts[-1] == 8 and set(counts) <= {1, 4, 7, 8}, counts
        assert "".join(delta.text for delta in deltas) == result.text and len(result.token_ids) == 8
    finally:
        await generator.stop()


async def test_a_reader_that_fell_behind_gets_the_waiting_deltas_as_one():
    generator = core(simulated={"step_s": 0.001})
    await generator.start()
    try:
        (request,) = await prompts(generator, ["one two"], max_tokens=6)
        outputs = generator.run([request])
        first = (await anext(outputs))[1]
        await wait_for(lambda: generator.batcher.stats.total_completed == 1, 10, "the engine to finish the request")
        assert generator.batcher.stats.in_flight == 0  # its place is free while its reader is away
        rest = [output async for _, output in outputs]
        joined, result = rest  # the five deltas that waited came as one, the result apart
        assert (first.output_tokens, joined.output_tokens) == (1, 6) and isinstance(result, GenerationResult)
        assert first.text + joined.text == result.text
        assert first.token_ids + joined.token_ids == result.token_ids and len(result.token_ids) == 6
    finally:
        await generator.stop()


def test_coalescing_joins_deltas_and_keeps_a_result_apart():
    token = TokenLogprob("a", -0.5)
    early = GenerationDelta("r", "Hel", 1, (token,), (TokenLogprob("p", None),), (7,))
    late = GenerationDelta("r", "lo", 3, (token, token), None, (8, 9))
    assert coalesce(early, late) == GenerationDelta("r", "Hello", 3, (token,) * 3, early.prompt_logprobs, (7, 8, 9))
    plain = coalesce(GenerationDelta("r", "a", 1), GenerationDelta("r", "b", 2))
    assert plain == GenerationDelta("r", "ab", 2) and plain.logprobs is None  # none asked for: none made up
    assert coalesce(early, GenerationResult("r", "Hello", 2, 3, "stop")) is None


@pytest.mark.parametrize("marker", ["__simulated_fail__", "__simulated_raise__"])
async def test_a_prompt_that_fails_ends_with_an_error_result_never_a_finish_reason(marker):
    generator = core(simulated={"step_s": 0.001})
    await generator.start()
    try:
        requests = await prompts(generator, ["fine", f"{marker} here"], max_tokens=2)
        results = await generator.results(requests)
        assert not results[0].failed and results[0].finish_reason == "length"
        assert results[1].failed and results[1].finish_reason == "error" and results[1].error
        with pytest.raises(GenerationError, match="prompt 1 failed"):
            await generator.complete(await prompts(generator, ["fine", f"{marker} again"], max_tokens=2))
    finally:
        await generator.stop()


async def test_a_request_the_engine_aborts_while_its_caller_waits_is_a_failure():
    generator = core(simulated={"step_s": 0.02})
    await generator.start()
    try:
        (request,) = await prompts(generator, ["a long one"], max_tokens=200)
        task = asyncio.ensure_future(generator.results([request]))
        await wait_for(lambda: generator.engine.stats()["running"] == 1, 10, "the request to run", interval=0.01)
        await generator.engine.abort(request.request_id)  # the engine ends it: vLLM's finish reason "abort"
        (result,) = await asyncio.wait_for(task, 10)
        assert result.failed and "aborted" in result.error and result.output_tokens < 200
    finally:
        await generator.stop()


async def test_rows_keep_each_prompts_problem_in_its_own_row():
    generator = core(simulated={"step_s": 0.001})
    await generator.start()
    try:
        rows = await generator.rows(["fine", "   ", "x" * 9000, 5, "__simulated_fail__"], {"max_tokens": 2})
        assert [r["error"] is None for r in rows] == [True, False, False, False, False]
        assert rows[0]["text"] == "[simulated] fine fine" and rows[0]["output_tokens"] == 2
        assert rows[1]["error"] == "invalid: prompts[1] is empty"
        assert "invalid: prompts[2] has 2250 tokens" in rows[2]["error"]
        assert "invalid: prompts[3] must be a string" in rows[3]["error"]
        assert "simulated failure" in rows[4]["error"] and not rows[4]["error"].startswith("invalid")
        for bad, words in (([], "no prompts"), ("one string", "got a single string"), (["x"] * 300, "at most")):
            with pytest.raises(RequestError, match=words):  # what is wrong with the call itself is raised
                await generator.rows(bad, {})
        with pytest.raises(RequestError, match="max_tokens"):
            await generator.rows(["fine"], {"max_tokens": 0})
        assert generator.engine.stats()["requests"] == 2  # only the valid rows reached the engine
    finally:
        await generator.stop()


async def test_request_timeout_withdraws_and_aborts_what_has_not_finished():
    generator = core(simulated={"step_s": 0.05}, request_timeout_s=0.3, batcher={"max_inflight": 1})
    await generator.start()
    try:
        requests = await prompts(generator, ["running", "queued"], max_tokens=100)
        with pytest.raises(TimeoutError, match=r"request_timeout_s=0\.3"):
            await generator.results(requests)
        stats = generator.stats()
        assert stats["batcher"]["in_flight"] == 0 and stats["batcher"]["queue_depth"] == 0  # freed at once
        assert stats["requests"]["abandoned"] == 2
        await wait_for(lambda: generator.engine.stats()["aborts"] == 1, 10, "the engine abort", interval=0.01)
        assert generator.engine.stats()["requests"] == 1  # the running one was aborted; the queued one never ran
    finally:
        await generator.stop()


@pytest.mark.parametrize("mode", ["continuous", "batch"])
async def test_leaving_the_stream_early_frees_the_batcher_and_aborts_the_engine(mode):
    engine = {"step_s": 0.02} if mode == "continuous" else {"step_s": 0.02, "padded": True}
    generator = core(simulated=engine, batcher={"mode": mode})
    await generator.start()
    try:
        (request,) = await prompts(generator, ["leave early"], max_tokens=50)
        outputs = generator.run([request])
        if mode == "continuous":
            assert isinstance((await outputs.__anext__())[1], GenerationDelta)
        else:
            pending = asyncio.ensure_future(outputs.__anext__())
            await wait_for(lambda: generator.engine.stats()["batches"] == 1, 10, "the batch to start", interval=0.01)
            pending.cancel()
            await asyncio.gather(pending, return_exceptions=True)
        await outputs.aclose()
        await wait_for(lambda: generator.engine.stats()["aborts"] == 1, 10, "the engine abort", interval=0.01)
        # continuous: its place is free at once; batch: when the static batch it was part of ends
        await wait_for(lambda: generator.batcher.stats.in_flight == 0, 10, "the batcher to free it", interval=0.01)
        assert generator.stats()["requests"]["abandoned"] == 1
    finally:
        await generator.stop()


async def test_stop_drains_what_is_queued_then_releases_the_engine():
    generator = core(simulated={"step_s": 0.01}, batcher={"max_inflight": 2})
    await generator.start()
    requests = await prompts(generator, [f"p{i}" for i in range(6)], max_tokens=3)
    task = asyncio.ensure_future(generator.results(requests))
    await wait_for(lambda: generator.batcher.stats.total_submitted == 6, 10, "all six queued", interval=0.01)
    await generator.stop(timeout=30)
    results = await task
    assert [r.text for r in results] == [f"[simulated] p{i} p{i} p{i}" for i in range(6)]
    with pytest.raises(Exception, match="dead"):
        await generator.check_health()


def test_retry_after_is_the_batchers_estimate_rounded_up_and_bounded():
    from batching import BatcherStoppedError, QueueFullError
    from serve_app.errors import retry_after
    from serve_app.serving.http import exception_response

    assert retry_after(QueueFullError("full", retry_after_s=7.2)) == 8
    assert retry_after(QueueFullError("full", retry_after_s=0.05)) == 1  # at least a second
    assert retry_after(QueueFullError("full", retry_after_s=10_000)) == 60  # at most a minute
    assert retry_after(QueueFullError("full")) == 1  # no basis for an estimate yet
    assert retry_after(BatcherStoppedError("stopping")) == 1
    response = exception_response(QueueFullError("queue full", retry_after_s=2.5))
    assert response.status_code == 503 and response.headers["retry-after"] == "3"
    assert exception_response(RequestError("bad")).headers.get("retry-after") is None  # 4xx: nothing to retry


FREEZE = """
import gc, json
from serve_app.core.base import freeze_startup_heap
import ray  # a process holding a core carries Ray's objects
before = len(gc.get_objects())
freeze_startup_heap()
print(json.dumps({"before": before, "frozen": gc.get_freeze_count(), "scanned": len(gc.get_objects())}))
"""


def test_freeze_startup_heap_takes_what_is_alive_out_of_every_later_collection():
    """What a Ray Data actor holding a core does once it has started (Serve does the same for replicas): a full
    collection afterwards walks only what was made since. In a subprocess: it changes the whole process."""
    import json
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", FREEZE], capture_output=True, text=True, timeout=120, check=True)
    counts = json.loads(out.stdout.splitlines()[-1])
    assert counts["before"] > 10_000 and counts["frozen"] >= counts["before"] * 0.9
    assert counts["scanned"] < 100


async def test_one_deadline_times_out_a_wait_and_a_consumer_that_was_elsewhere():
    deadline = Deadline(0.05)
    assert await deadline.wait(asyncio.sleep(0, "ready")) == "ready"
    with pytest.raises(TimeoutError, match=r"request_timeout_s=0\.05"):
        await deadline.wait(asyncio.Event().wait())  # cancelled by the timer while it waits
    assert asyncio.current_task().cancelling() == 0  # the timer's cancel was taken back

    deadline = Deadline(0.01)
    await asyncio.sleep(0.05)  # the deadline passes while the consumer is not waiting on it
    with pytest.raises(TimeoutError):
        await deadline.wait(asyncio.sleep(0))


async def test_a_cancel_from_elsewhere_is_not_taken_for_the_deadline():
    deadline = Deadline(60)
    waiting = asyncio.create_task(deadline.wait(asyncio.Event().wait()))
    await asyncio.sleep(0)
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    deadline.cancel()


async def test_outputs_that_no_one_reads_free_their_place_soon_after_admission():
    """Each request's own task reads the engine while the batcher holds its place (the default on an engine that
    tracks its requests); a caller that drops ``run()``'s outputs unread would hold the place for ever."""
    generator = core(simulated={"step_s": 0.001})
    await generator.start()
    try:
        (request,) = await prompts(generator, ["never read"], max_tokens=4)
        generator.run([request])  # dropped unread
        await wait_for(lambda: generator.batcher.stats.total_failed == 1, 10, "the place to be freed", interval=0.05)
        assert generator.batcher.stats.in_flight == 0 and generator.engine.stats()["requests"] == 0
        (request,) = await prompts(generator, ["read"], max_tokens=4)
        assert (await generator.complete([request]))[0].output_tokens == 4
    finally:
        await generator.stop()


async def test_a_stop_that_times_out_ends_each_reader_with_the_batchers_error():
    from batching import BatcherStoppedError

    generator = core(simulated={"step_s": 0.02})
    await generator.start()
    requests = await prompts(generator, ["long", "longer"], max_tokens=500)
    task = asyncio.ensure_future(generator.results(requests))
    await wait_for(lambda: generator.engine.stats()["running"] == 2, 10, "both to run", interval=0.01)
    await generator.batcher.stop(timeout=0.01)
    with pytest.raises(BatcherStoppedError):
        await asyncio.wait_for(task, 10)
    await wait_for(lambda: generator.engine.stats()["running"] == 0, 10, "the engine to abort both", interval=0.01)
    assert generator.engine.stats()["aborts"] == 2 and generator.batcher.stats.in_flight == 0
    await generator.stop()


@settings(max_examples=60, deadline=None)
@given(texts=st.lists(st.text(max_size=12), min_size=1, max_size=6), chat=st.booleans(), n=st.integers(1, 2))
def test_a_chunk_of_text_alone_is_the_event_its_models_make(texts, chat, n):
    """A stream's chunks of text alone come from a template rendered once by the chunk's model: every event is the
    one the chunk's models make, whatever the text holds (quotes, escapes, control characters, any script)."""
    from serve_app.core.events import sse_events
    from serve_app.openai.chat.format import ChatFormat
    from serve_app.openai.completions import CompletionFormat
    from serve_app.openai.sse import sse

    def fmt() -> Any:
        made = ChatFormat("m", n=n) if chat else CompletionFormat("m", n=n)
        made.id, made.created = "id", 1
        return made

    deltas = [(i % n, GenerationDelta(f"r{i % n}", text, i + 1)) for i, text in enumerate(texts)]

    async def templated() -> list[str]:
        async def outputs() -> Any:
            for item in deltas:
                yield item

        return [event async for event in sse_events(outputs(), [], fmt(), [None] * n)]

    by_models, made = [], fmt()
    for index, delta in deltas:
        chunks = made.chunks(index, delta)
        if chunks:
            by_models.append("".join(sse(chunk) for chunk in chunks))
    assert asyncio.run(templated()) == by_models
