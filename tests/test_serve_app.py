"""Integration: a local Ray Serve app with the SIMULATED engine, reached over HTTP and through handles.

These check the serving logic (batching across requests, order, validation, backpressure, draining,
reconfiguration, health); the real engine is covered by test_real_vllm_engine.py and test_real_app.py.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import httpx
import pytest

from harness.launcher import merged

pytestmark = pytest.mark.serve

SLOW_ENGINE = {"step_s": 0.002}


@pytest.fixture(scope="module")
def app(serve_instance, deploy_app):
    """The default (continuous) batcher in front of the simulated continuous-batching engine."""
    handle = deploy_app("main", simulated=SLOW_ENGINE, sampling={"max_tokens": 16})
    return serve_instance + "/main", handle


async def test_concurrent_http_requests_are_batched_and_answered_in_order(app):
    url, _ = app
    async with httpx.AsyncClient(base_url=url, timeout=60) as client:
        before = (await client.get("/stats")).json()["batcher"]
        responses = await asyncio.gather(
            *(
                client.post(
                    "/generate", json={"prompts": [f"alpha {i}", f"beta {i}", f"gamma {i}"], "task_id": f"t{i}"}
                )
                for i in range(40)
            )
        )
        after = (await client.get("/stats")).json()
    assert all(r.status_code == 200 for r in responses)
    for i, response in enumerate(responses):
        body = response.json()
        assert body["task_id"] == f"t{i}"
        assert [text.split()[1] for text in body["results"]] == ["alpha", "beta", "gamma"]
        assert all(f" {i}" in text for text in body["results"])
        assert [d["finish_reason"] for d in body["details"]] == ["length"] * 3
    records = after["batcher"]["total_completed"] - before["total_completed"]
    assert records == 120
    assert after["engine_stats"]["peak_running"] >= 10  # many requests shared the engine's steps
    assert after["batcher"]["in_flight"] == 0 and after["batcher"]["in_flight_cost"] == 0
    assert after["engine"] == "simulated" and after["replica"]["replica_id"]
    assert after["replica"]["gc"]["frozen_objects"] > 10_000  # Serve froze what its start left (Ray's, the core's)


async def test_concurrent_handle_calls_are_batched(app):
    _, handle = app
    before = await handle.stats.remote()
    results = await asyncio.gather(*(handle.generate.remote(f"prompt number {i}", max_tokens=3) for i in range(30)))
    after = await handle.stats.remote()
    assert [r["text"] for r in results] == [f"[simulated] prompt number {i}" for i in range(30)]
    assert all(r["output_tokens"] == 3 for r in results)
    steps = after["engine_stats"]["steps"] - before["engine_stats"]["steps"]
    assert steps < 30 * 3  # requests ran side by side: fewer engine steps than tokens generated
    rows = await handle.generate_batch.remote(["one", "two", "three"], max_tokens=1)
    assert [r["text"] for r in rows] == ["[simulated] one", "[simulated] two", "[simulated] three"]


async def test_openai_endpoints_answer_in_openai_shapes(app):
    url, _ = app
    async with httpx.AsyncClient(base_url=url, timeout=60) as client:
        chat = await client.post(
            "/v1/chat/completions",
            json={"model": "SmolLM2-135M-Instruct", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3},
        )
        completion = await client.post("/v1/completions", json={"prompt": ["a b", "c d"], "max_tokens": 2})
        models = await client.get("/v1/models")
    assert chat.status_code == 200, chat.text
    body = chat.json()
    assert body["object"] == "chat.completion" and body["choices"][0]["message"]["role"] == "assistant"
    assert body["usage"]["completion_tokens"] == 3
    assert completion.status_code == 200
    assert [c["text"] for c in completion.json()["choices"]] == ["[simulated] a b", "[simulated] c d"]
    assert models.json()["data"][0]["id"] == "SmolLM2-135M-Instruct"


@pytest.mark.parametrize(
    ("body", "status", "fragment"),
    [
        ({}, 422, "prompts"),
        ({"prompts": []}, 400, "no prompts"),
        ({"prompts": "just a string"}, 422, "prompts"),
        ({"prompts": ["  "]}, 400, "prompts[0] is empty"),
        ({"prompts": [1, 2]}, 422, "prompts"),
        ({"prompts": ["x"] * 300}, 400, "at most 256"),
        ({"prompts": ["x" * 9000]}, 400, "context"),
        ({"prompts": ["hi"], "max_tokens": 0}, 422, "max_tokens"),
        ({"prompts": ["hi"], "max_tokens": 5000}, 400, "max_tokens=5000"),
        ({"prompts": ["hi"], "temperature": -1}, 422, "temperature"),
        ({"prompts": ["hi"], "top_p": 0}, 422, "top_p"),
        ({"prompts": ["hi"], "stop": [""]}, 422, "stop"),
        ({"prompts": ["hi"], "bogus": 1}, 422, "bogus"),
    ],
)
async def test_bad_input_gets_a_clear_4xx(app, body, status, fragment):
    url, _ = app
    async with httpx.AsyncClient(base_url=url, timeout=30) as client:
        response = await client.post("/generate", json=body)
    assert response.status_code == status, response.text
    assert fragment in response.text


async def test_malformed_json_and_wrong_model_are_rejected(app):
    url, _ = app
    async with httpx.AsyncClient(base_url=url, timeout=30) as client:
        bad_json = await client.post("/generate", content=b"{not json", headers={"content-type": "application/json"})
        json_type = {"content-type": "application/json"}
        openai_json = await client.post("/v1/completions", content=b"{not", headers=json_type)
        wrong_model = await client.post("/v1/completions", json={"model": "gpt-9", "prompt": "x"})
    assert bad_json.status_code == 422 and "json" in bad_json.text.lower()
    assert bad_json.json()["error"]["code"] == 422  # FastAPI's status, as the seeds' API answers it
    assert openai_json.status_code == 400 and "json" in openai_json.text.lower()  # as OpenAI and vLLM answer it
    assert openai_json.json()["error"]["type"] == "BadRequestError"
    assert wrong_model.status_code == 404 and "gpt-9" in wrong_model.text  # as vLLM answers
    assert wrong_model.json()["error"]["param"] == "model"


async def test_handle_bad_input_raises_value_error(app):
    _, handle = app
    with pytest.raises(ValueError, match="no prompts"):
        await handle.generate_batch.remote([])
    for not_a_list in (True, None, 5, {"a": "b"}):  # found by test_fuzz: True used to raise TypeError
        with pytest.raises(ValueError, match="prompts must be a list of strings"):
            await handle.generate_batch.remote(not_a_list)
    with pytest.raises(ValueError, match="max_tokens"):
        await handle.generate.remote("hi", max_tokens=-3)


async def test_engine_failure_of_one_prompt_keeps_the_others(app):
    url, handle = app
    rows = await handle.generate_batch.remote(["fine", "__simulated_fail__ please", "also fine"], max_tokens=1)
    assert [r["error"] is None for r in rows] == [True, False, True]
    assert "simulated failure" in rows[1]["error"]
    async with httpx.AsyncClient(base_url=url, timeout=30) as client:
        response = await client.post("/generate", json={"prompts": ["__simulated_fail__"]})
    assert response.status_code == 500 and "prompt 0 failed" in response.text


async def test_full_queue_fails_fast_with_503_and_retry_after(serve_instance, deploy_app):
    handle = deploy_app(
        "tiny", simulated={"step_s": 0.1}, sampling={"max_tokens": 4}, batcher={"max_inflight": 1, "max_queue_size": 2}
    )
    async with httpx.AsyncClient(base_url=serve_instance + "/tiny", timeout=60) as client:
        responses = await asyncio.gather(*(client.post("/generate", json={"prompts": [f"p{i}"]}) for i in range(16)))
    codes = [r.status_code for r in responses]
    assert set(codes) <= {200, 503}
    assert codes.count(503) >= 1 and codes.count(200) >= 2
    for r in responses:
        if r.status_code == 503:  # Retry-After: the replica's estimate from its queue and drain rate, bounded
            assert 1 <= int(r.headers["retry-after"]) <= 60 and "overloaded" in r.text
    from batching import QueueFullError

    calls = [handle.generate.remote(f"h{i}") for i in range(12)]
    outcomes = await asyncio.gather(*calls, return_exceptions=True)
    assert any(isinstance(o, QueueFullError) for o in outcomes)
    assert all(isinstance(o, (dict, QueueFullError)) for o in outcomes)


async def test_reconfigure_changes_batcher_knobs_live(serve_instance):
    """A deployment's ``user_config`` changed in the app's config (as ``serve deploy`` sends serve_config.yaml) is
    applied to the running replica: its engine stays, its batcher is swapped."""
    from ray import serve
    from ray.serve.schema import ServeDeploySchema

    from .conftest import SIMULATED_DEFAULTS
    from .waits import wait_for

    client = serve.context._get_global_client()
    # Steps of 0.2 s: 9 requests of 5 tokens sent at once overlap in the engine however slowly they arrive.
    one_replica = {"autoscaling": {"min_replicas": 1, "max_replicas": 1}, "simulated": {"step_s": 0.2}}
    args = merged(SIMULATED_DEFAULTS, one_replica)
    app = {"name": "knobs", "route_prefix": "/knobs", "import_path": "serve_app.app:build_app", "args": args}

    async def deployed(user_config: dict[str, Any] | None, want: dict[str, Any]) -> Any:
        deployments = [] if user_config is None else [{"name": "LLMServer", "user_config": user_config}]
        client.deploy_apps(ServeDeploySchema(applications=[{**app, "deployments": deployments}]))

        async def applied() -> Any:
            status = serve.status().applications.get("knobs")
            if status is None or status.status != "RUNNING":
                return None
            handle = serve.get_app_handle("knobs")
            settings = (await handle.stats.remote())["batcher_settings"]
            return handle if all(settings[key] == value for key, value in want.items()) else None

        return await wait_for(applied, 120, f"the batcher settings {want}", interval=0.05)

    try:
        handle = await deployed(None, {"max_inflight": "auto"})
        handle = await deployed({"batcher": {"max_inflight": 3}}, {"max_inflight": 3})
        # the same settings path, a fresh batcher
        assert (await handle.stats.remote())["batcher"]["total_completed"] == 0
        results = await asyncio.gather(*(handle.generate.remote(f"r{i}", max_tokens=5) for i in range(9)))
        assert len(results) == 9
        after = await handle.stats.remote()
        assert after["batcher"]["total_completed"] == 9
        assert 1 < after["engine_stats"]["peak_running"] <= 3  # the new cap held inside the engine
        handle = await deployed({"batcher": {"mode": "batch", "max_batch_size": 3}}, {"mode": "batch"})
        results = await asyncio.gather(*(handle.generate.remote(f"b{i}", max_tokens=1) for i in range(9)))
        stats = await handle.stats.remote()
        assert [r["text"] for r in results] == [f"[simulated] b{i}" for i in range(9)]
        assert stats["batcher"]["total_completed"] == 9 and stats["batcher"]["avg_batch_size"] <= 3  # batch mode, live
        # one engine all along: the replica was reconfigured, not replaced
        assert stats["engine_stats"]["requests"] == 18
    finally:  # a failure must not leave the app holding the cluster's CPUs for the tests after it
        serve.delete("knobs", _blocking=False)


@pytest.mark.system  # a replica stopped under load
async def test_replica_shutdown_drains_queued_requests(serve_instance):
    from ray import serve

    from serve_app.app import build_app

    from .conftest import SIMULATED_DEFAULTS
    from .waits import wait_for

    args = merged(SIMULATED_DEFAULTS, {"simulated": {"step_s": 1.0}, "batcher": {"max_inflight": 4}})
    handle = serve.run(build_app(args), name="drain", route_prefix="/drain")
    calls = [handle.generate.remote(f"queued {i}", max_tokens=2) for i in range(16)]

    async def all_submitted() -> dict[str, Any] | None:
        stats = (await handle.stats.remote())["batcher"]
        return stats if stats["total_submitted"] >= 16 else None

    # all submitted before the delete: four running in the engine, the rest queued in the batcher
    stats = await wait_for(all_submitted, 60, "the 16 requests to reach the replica")
    assert stats["queue_depth"] > 0  # (16 requests of 2 steps of 1 s, 4 at a time: about 8 s of work)
    started = time.monotonic()
    await asyncio.to_thread(serve.delete, "drain")
    results = await asyncio.gather(*calls, return_exceptions=True)
    assert [r["text"] for r in results] == [f"[simulated] queued {i}" for i in range(16)], results
    assert time.monotonic() - started < 60


async def test_dead_engine_fails_health_check_and_healthz(serve_instance, deploy_app):
    handle = deploy_app("dying")
    async with httpx.AsyncClient(base_url=serve_instance + "/dying", timeout=30) as client:
        assert (await client.get("/healthz")).status_code == 200
        response = await client.post("/generate", json={"prompts": ["__simulated_die__"]})
        assert response.status_code == 503 and "engine" in response.text
        health = await client.get("/healthz")
    assert health.status_code == 503 and "unhealthy" in health.text
    del handle
