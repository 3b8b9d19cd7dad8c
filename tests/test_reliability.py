"""Reliability: load, replica and engine faults, shutdown under load and client cancellation, against apps
with the SIMULATED engine on loopback. Each test asserts that nothing is lost, duplicated or left hanging,
and records its figures in ``FIGURES`` (printed at the end of the pytest run; docs/reliability.md quotes them).

Bad input (fuzzing) lives in test_fuzz.py; the real model's up-front limits in test_real_app.py.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from typing import Any

import httpx
import pytest

from harness.launcher import merged
from harness.stats import percentile

from .conftest import FIGURES, sized
from .waits import RowsInThread, batcher_is, per_replica_stats, wait_for

pytestmark = pytest.mark.serve


def replica_actors(app: str) -> list[str]:
    """Names of the app's live replica actors (Serve names them ``SERVE_REPLICA::<app>#<deployment>#<id>``)."""
    import ray

    return sorted(
        a["name"]
        for a in ray.util.list_named_actors(all_namespaces=True)
        if a["name"].startswith(f"SERVE_REPLICA::{app}#")
    )


def running_replicas(app: str) -> int:
    from ray import serve

    status = serve.status().applications.get(app)
    if status is None:
        return 0
    return sum(d.replica_states.get("RUNNING", 0) for d in status.deployments.values())


# -- Load -----------------------------------------------------------------------------------------------


async def _storm(url: str, n: int, retry: bool) -> dict[str, Any]:
    """``n`` concurrent POST /generate requests, each with its own tag; with ``retry``, a 503 is retried
    after its Retry-After. Returns per-request outcomes and timings. (aiohttp: httpx's connection pool
    slows down quadratically with thousands of connections, and the client became the bottleneck.)"""
    import aiohttp

    outcomes: dict[int, dict[str, Any]] = {}
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=300)) as session:

        async def one(i: int) -> None:
            first = time.perf_counter()
            attempts, rejected = 0, 0
            while True:
                attempts += 1
                sent = time.perf_counter()
                body = {"prompts": [f"req{i} tag"], "task_id": f"t{i}"}
                async with session.post(f"{url}/generate", json=body) as response:
                    status, headers, payload = response.status, response.headers, await response.json()
                if status == 503:
                    rejected += 1
                    assert headers.get("Retry-After"), f"503 without Retry-After: {payload}"
                    if retry:
                        await asyncio.sleep(float(headers["Retry-After"]))
                        continue
                break
            outcomes[i] = {
                "status": status,
                "body": payload,
                "latency": time.perf_counter() - sent,
                "total": time.perf_counter() - first,
                "attempts": attempts,
                "rejected": rejected,
            }

        started = time.perf_counter()
        await asyncio.gather(*(one(i) for i in range(n)))
        wall = time.perf_counter() - started
    return {"outcomes": outcomes, "wall": wall}


def _check_storm(storm: dict[str, Any], n: int) -> list[dict[str, Any]]:
    """Every request answered once, 200s carry their own tag; returns the 200 outcomes."""
    outcomes = storm["outcomes"]
    assert sorted(outcomes) == list(range(n))  # none lost: every request got an HTTP answer
    ok = []
    for i, outcome in outcomes.items():
        assert outcome["status"] in (200, 503), outcome
        if outcome["status"] == 200:
            body = outcome["body"]
            assert body["task_id"] == f"t{i}" and body["results"] == [f"[simulated] req{i} tag"], body
            ok.append(outcome)
    return ok


LOAD_APP = {
    "simulated": {"step_s": 0.01, "step_s_per_seq": 0.0001},
    "batcher": {"max_queue_size": 4096},
    "sampling": {"max_tokens": 2},
}


@pytest.mark.parametrize("n", sized(300, 2000))
async def test_concurrent_http_requests_are_all_answered_once(serve_instance, deploy, n):
    handle = deploy("load", **LOAD_APP)
    before = await handle.stats.remote()
    storm = await _storm(serve_instance + "/load", n, retry=False)
    ok = _check_storm(storm, n)
    after = await handle.stats.remote()
    served = after["engine_stats"]["requests"] - before["engine_stats"]["requests"]
    # Nothing duplicated: the engine ran exactly the prompts that were answered 200, each once.
    assert served == len(ok)
    assert after["batcher"]["total_completed"] - before["batcher"]["total_completed"] == len(ok)
    assert len(ok) == n  # an unbounded proxy queue: the load is held, nothing refused
    latencies = [o["latency"] for o in ok]
    FIGURES[f"load, {n} concurrent HTTP"] = {
        "ok": len(ok),
        "503": n - len(ok),
        "lost": 0,
        "duplicated": 0,
        "p50_s": round(statistics.median(latencies), 3),
        "p99_s": round(percentile(latencies, 99), 3),
        "req_per_s": round(n / storm["wall"], 1),
        "peak_in_engine": after["engine_stats"]["peak_running"],
    }


@pytest.mark.parametrize(("n", "queue", "running"), sized((300, 32, 32), (2000, 128, 256)))
async def test_overload_beyond_the_batcher_queue_gets_503_retry_after_and_retries_complete(
    serve_instance, deploy, n, queue, running
):
    """``n`` requests at once into an engine that runs ``running`` of them and a batcher queue of ``queue``: far
    more than both hold."""
    handle = deploy(
        "overload",
        **merged(LOAD_APP, {"batcher": {"max_queue_size": queue}, "simulated": {"max_num_seqs": running}}),
    )
    before = await handle.stats.remote()
    storm = await _storm(serve_instance + "/overload", n, retry=True)
    ok = _check_storm(storm, n)
    after = await handle.stats.remote()
    assert len(ok) == n  # retrying after Retry-After, every request completed
    rejected = sum(o["rejected"] for o in ok)
    assert rejected > 0  # the caps were hit: this test exercised the 503 path
    served = after["engine_stats"]["requests"] - before["engine_stats"]["requests"]
    assert served == n  # each request ran exactly once, however often it was refused first
    totals = [o["total"] for o in ok]
    FIGURES[f"overload, {n} concurrent HTTP into a {queue}-prompt batcher queue"] = {
        "completed": len(ok),
        "503_then_retried": rejected,
        "ran_once": served == n,
        "p50_s_incl_retries": round(statistics.median(totals), 3),
        "p99_s_incl_retries": round(percentile(totals, 99), 3),
        "req_per_s": round(n / storm["wall"], 1),
    }


# -- Replica death --------------------------------------------------------------------------------------


async def job_under_way(app: str, n: int) -> RowsInThread:
    """A Ray Data job of ``n`` rows through ``app`` (8 requests of 4 rows in flight, retried), in a thread, once
    80 rows are back: under way, to be disturbed."""
    import ray.data

    from serve_app.data import generate

    rows = [{"id": i, "prompt": f"row {i} says"} for i in range(n)]
    job = RowsInThread(
        lambda: generate(
            ray.data.from_items(rows), app=app, concurrency=8, batch_size=4, max_tokens=3, max_retries=20
        ).iter_rows()
    )
    job.start()
    await wait_for(lambda: len(job.rows) >= 80 or not job.is_alive(), 120, "the job to be under way")
    assert job.is_alive(), f"the job ended before it could be disturbed: {job.failure}"
    return job


def assert_every_row_once(job: RowsInThread, n: int) -> None:
    """The job succeeded with every row exactly once (none lost, none duplicated by a retry), each its own answer."""
    assert not job.failure, job.failure
    assert sorted(int(r["id"]) for r in job.rows) == list(range(n))
    for row in job.rows:
        assert row["error"] is None, row
        assert row["text"] == f"[simulated] row {row['id']} says", row


@pytest.mark.parametrize("n", sized(240, 600, "system"))
async def test_killing_a_replica_mid_job_loses_and_duplicates_no_row(serve_instance, deploy, n):
    import ray
    import ray.data

    deploy(
        "phoenix",
        autoscaling={"min_replicas": 2, "max_replicas": 2},
        simulated={"step_s": 0.07},
    )
    await wait_for(lambda: running_replicas("phoenix") == 2, 60, "two replicas")
    before = replica_actors("phoenix")
    job = await job_under_way("phoenix", n)
    victim = before[0]
    rows_at_kill = len(job.rows)
    killed_at = time.monotonic()
    ray.kill(ray.get_actor(victim, namespace="serve"), no_restart=True)
    await asyncio.to_thread(job.join, 300)
    assert_every_row_once(job, n)
    # Serve replaced the killed replica.
    await wait_for(
        lambda: running_replicas("phoenix") == 2 and victim not in replica_actors("phoenix"), 120, "a new replica"
    )
    FIGURES["replica killed mid Ray Data job"] = {
        "rows": n,
        "rows_done_at_kill": rows_at_kill,
        "lost": 0,
        "duplicated": 0,
        "errors": 0,
        "replaced_in_s": round(time.monotonic() - killed_at, 1),
    }


@pytest.mark.system  # replicas replaced under a Ray Data job
async def test_redeploying_a_changed_config_mid_job_loses_and_duplicates_no_row(serve_instance, deploy):
    """``serve deploy`` of a changed config while a Ray Data job runs: Serve replaces every replica (a rolling
    update, old replicas drained), and the job still gets every row exactly once, without an error."""

    config = {"autoscaling": {"min_replicas": 2, "max_replicas": 2}, "simulated": {"step_s": 0.2}}
    deploy("redeploy", **config)
    await wait_for(lambda: running_replicas("redeploy") == 2, 60, "two replicas")
    before = set(replica_actors("redeploy"))
    n = 1_200  # about 25 s of work: the rolling update (new replicas up, old ones drained) ends well before
    job = await job_under_way("redeploy", n)
    rows_at_redeploy = len(job.rows)
    changed = {**config, "simulated": {"step_s": 0.15}}  # a new config: every replica is replaced
    await asyncio.to_thread(deploy, "redeploy", **changed)  # returns once the new replicas run
    replaced = not before & set(replica_actors("redeploy"))
    rows_at_replaced = len(job.rows)
    await asyncio.to_thread(job.join, 300)
    assert replaced, f"old replicas still serve: {before & set(replica_actors('redeploy'))}"
    assert rows_at_replaced < n, "the job ended before the new replicas took over: nothing was tested"
    assert_every_row_once(job, n)
    FIGURES["config redeployed mid Ray Data job"] = {
        "rows": n,
        "rows_done_at_redeploy": rows_at_redeploy,
        "rows_done_when_replaced": rows_at_replaced,
        "lost": 0,
        "duplicated": 0,
        "errors": 0,
    }


# -- Engine failures ------------------------------------------------------------------------------------


async def test_engine_raising_mid_batch_fails_only_the_bad_records_with_isolation(serve_instance, deploy):
    handle = deploy(
        "isolate",
        simulated={"batch_overhead_s": 0.05, "padded": True},
        batcher={"mode": "batch", "isolate_failures": True, "max_batch_size": 32, "batch_timeout_s": 0.05},
    )
    before = (await handle.stats.remote())["batcher"]
    prompts = [f"fine {i}" for i in range(12)]
    prompts[5] = "__simulated_raise__ here"
    mixed, *others = await asyncio.gather(
        handle.generate_batch.remote(prompts, max_tokens=1),
        *(handle.generate.remote(f"bystander {i}", max_tokens=2) for i in range(6)),
    )
    after = (await handle.stats.remote())["batcher"]
    assert [r["error"] is None for r in mixed] == [i != 5 for i in range(12)]
    assert "raise marker" in mixed[5]["error"]
    assert [r["text"] for r in others] == [f"[simulated] bystander {i}" for i in range(6)]
    assert after["total_failed"] - before["total_failed"] == 1
    assert after["total_completed"] - before["total_completed"] == 18  # resolved, the failed one included


async def test_engine_raising_mid_batch_fails_only_that_batch_without_isolation(serve_instance, deploy):
    handle = deploy(
        "noisolate",
        simulated={"batch_overhead_s": 2, "padded": True},
        batcher={"mode": "batch", "max_batch_size": 8, "batch_timeout_s": 0, "max_concurrent_batches": 1},
    )
    bad = handle.generate_batch.remote(["a", "__simulated_raise__", "c"], max_tokens=1)
    # the bad batch is in the engine before what follows is sent, so that it queues for the next batch
    await wait_for(batcher_is(handle, "in_flight", lambda n: n == 3), 30, "the bad batch in the engine")
    later = [handle.generate.remote(f"later {i}", max_tokens=2) for i in range(5)]
    rows = await bad
    assert all(r["error"] and "raise marker" in r["error"] for r in rows)  # the whole batch failed...
    assert [(await c)["text"] for c in later] == [f"[simulated] later {i}" for i in range(5)]  # ...and only it
    assert (await handle.stats.remote())["batcher"]["total_failed"] == 3


async def test_engine_raising_for_one_request_fails_only_it_in_continuous_mode(serve_instance, deploy):
    handle = deploy("continuous-raise", simulated={"step_s": 0.01})
    prompts = [f"fine {i}" for i in range(8)]
    prompts[3] = "__simulated_raise__ here"
    rows = await handle.generate_batch.remote(prompts, max_tokens=4)
    assert [r["error"] is None for r in rows] == [i != 3 for i in range(8)]
    assert "raise marker" in rows[3]["error"] and rows[0]["text"] == "[simulated] fine 0 fine 0"
    stats = (await handle.stats.remote())["batcher"]
    assert stats["total_failed"] == 1 and stats["in_flight_cost"] == 0


@pytest.mark.system  # a replica replaced
async def test_dead_engine_makes_serve_replace_the_replica(serve_instance, deploy):
    handle = deploy("lazarus")
    async with httpx.AsyncClient(base_url=serve_instance + "/lazarus", timeout=30) as client:
        old = (await client.get("/stats")).json()["replica"]["replica_id"]
        died_at = time.monotonic()
        response = await client.post("/generate", json={"prompts": ["__simulated_die__"]})
        assert response.status_code == 503 and response.headers["retry-after"]
        assert (await client.get("/healthz")).status_code == 503

        async def replaced() -> bool:
            try:
                stats = (await client.get("/stats")).json()
            except (httpx.HTTPError, ValueError):
                return False
            return stats.get("replica", {}).get("replica_id") not in (None, old)

        await wait_for(replaced, 120, "Serve to replace the unhealthy replica", interval=1)
        replaced_in = time.monotonic() - died_at
        assert (await client.get("/healthz")).status_code == 200
        again = await client.post("/generate", json={"prompts": ["alive again"], "max_tokens": 2})
    assert again.status_code == 200 and again.json()["results"] == ["[simulated] alive again"]
    assert (await handle.generate.remote("via handle", max_tokens=1))["error"] is None
    FIGURES["dead engine"] = {"health_check_failed": True, "replica_replaced_in_s": round(replaced_in, 1)}


# -- Graceful shutdown under load -----------------------------------------------------------------------


async def _http_load(url: str, n: int, stop: asyncio.Event | None = None) -> list[httpx.Response | BaseException]:
    """``n`` concurrent clients; each sends requests one after another until ``stop`` is set (or once)."""
    results: list[httpx.Response | BaseException] = []
    async with httpx.AsyncClient(base_url=url, timeout=120) as client:

        async def client_loop(c: int) -> None:
            k = 0
            while True:
                try:
                    results.append(await client.post("/generate", json={"prompts": [f"c{c} n{k}"], "max_tokens": 1}))
                except httpx.HTTPError as exc:
                    results.append(exc)
                k += 1
                if stop is None or stop.is_set():
                    return

        await asyncio.gather(*(client_loop(c) for c in range(n)))
    return results


@pytest.mark.system  # a replica taken away under load
async def test_scaling_down_under_load_drains_and_drops_nothing(serve_instance, apps):
    from ray import serve

    from serve_app.app import deployment_options
    from serve_app.config import AppConfig
    from serve_app.serving.llm import LLMServer

    from .conftest import SIMULATED_DEFAULTS

    args = merged(
        SIMULATED_DEFAULTS,
        {
            "simulated": {"step_s": 0.2},
            "batcher": {"max_inflight": 8},
            "autoscaling": {"min_replicas": 2, "max_replicas": 2},
            "graceful_shutdown_timeout_s": 30,
        },
    )
    two = AppConfig.model_validate(args)
    one = two.model_copy(
        update={"autoscaling": two.autoscaling.model_copy(update={"min_replicas": 1, "max_replicas": 1})}
    )
    apps.append("shrink")
    serve.run(
        LLMServer.options(**deployment_options(two)).bind(two.model_dump()), name="shrink", route_prefix="/shrink"
    )
    await wait_for(lambda: running_replicas("shrink") == 2, 60, "two replicas")
    stop = asyncio.Event()
    load = asyncio.create_task(_http_load(serve_instance + "/shrink", 48, stop))
    handle = serve.get_app_handle("shrink")

    async def both_hold_work() -> bool:
        replicas = await per_replica_stats(handle, 2)
        return all(s["requests"]["ongoing"] > 0 for s in replicas.values())

    await wait_for(both_hold_work, 60, "both replicas holding work")
    # Same init args, fewer replicas: a lightweight update, one replica drains and stops.
    await asyncio.to_thread(
        serve.run,
        LLMServer.options(**deployment_options(one)).bind(two.model_dump()),
        name="shrink",
        route_prefix="/shrink",
    )
    await wait_for(lambda: running_replicas("shrink") == 1 and len(replica_actors("shrink")) == 1, 90, "scale-down")
    served = (await handle.stats.remote())["batcher"]["total_completed"]
    await wait_for(batcher_is(handle, "total_completed", lambda n: n >= served + 8), 60, "the last replica serving on")
    stop.set()
    results = await load
    statuses = [r.status_code if isinstance(r, httpx.Response) else repr(r) for r in results]
    assert set(statuses) == {200}, {s: statuses.count(s) for s in set(statuses)}
    FIGURES["scale 2 -> 1 replicas under load"] = {"requests": len(results), "ok": statuses.count(200), "failed": 0}


@pytest.mark.system  # replicas stopped under load
async def test_deleting_the_app_under_load_answers_every_admitted_request(serve_instance, apps):
    from ray import serve

    from serve_app.app import build_app

    from .conftest import SIMULATED_DEFAULTS

    args = merged(
        SIMULATED_DEFAULTS,
        {"simulated": {"step_s": 0.25}, "batcher": {"max_inflight": 8}, "graceful_shutdown_timeout_s": 30},
    )
    apps.append("sunset")
    handle = serve.run(build_app(args), name="sunset", route_prefix="/sunset")
    calls = [handle.generate.remote(f"h{i}", max_tokens=1) for i in range(64)]
    http = asyncio.create_task(_http_load(serve_instance + "/sunset", 64))
    # Every request reaches the replica before the delete: one still on its way to the proxy when the route goes
    # is not admitted, and Serve answers it 404 (as it should), which is not what this test is about.
    await wait_for(batcher_is(handle, "total_submitted", lambda n: n >= 128), 60, "all 128 requests admitted")
    queued = (await handle.stats.remote())["batcher"]["queue_depth"]
    started = time.monotonic()
    await asyncio.to_thread(serve.delete, "sunset")
    drained_in = time.monotonic() - started
    results = await asyncio.gather(*calls, return_exceptions=True)
    responses = await http
    assert [r["text"] for r in results] == [f"[simulated] h{i}" for i in range(64)], results  # all drained
    statuses = [r.status_code if isinstance(r, httpx.Response) else repr(r) for r in responses]
    assert set(statuses) == {200}, {s: statuses.count(s) for s in set(statuses)}  # all admitted, all answered
    assert drained_in < 30
    FIGURES["serve.delete under load"] = {
        "in_flight": len(calls) + len(responses),
        "queued_at_delete": queued,
        "answered": len(results) + statuses.count(200),
        "drained_in_s": round(drained_in, 1),
    }


# -- Client cancellation --------------------------------------------------------------------------------


MODES = {
    # one request in the engine at a time, the rest queued in the batcher
    "continuous": {"simulated": {"step_s": 1.5}, "batcher": {"max_inflight": 1}},
    # one batch in the engine, 5 queued behind it (not a full batch). The first batch runs 6 s (12 tokens of 0.5 s),
    # however early its caller leaves (a static batch runs to its end), so that the five reach the queue while it
    # runs even on a slow, loaded CI machine: at 1.5 s they once arrived after it had ended and formed a batch of
    # their own. The last request asks for one token: its batch takes 0.5 s.
    "batch": {
        "simulated": {"step_s": 0.5, "padded": True},
        "batcher": {"mode": "batch", "max_batch_size": 8, "batch_timeout_s": 0, "max_concurrent_batches": 1},
    },
}


@pytest.mark.parametrize("mode", sorted(MODES))
async def test_disconnected_and_cancelled_callers_free_the_batcher_and_abort_the_engine(serve_instance, deploy, mode):
    handle = deploy(f"cancel-{mode}", **MODES[mode])
    base = await handle.stats.remote()
    async with httpx.AsyncClient(base_url=serve_instance + f"/cancel-{mode}", timeout=60) as client:
        running = asyncio.create_task(client.post("/generate", json={"prompts": ["in the engine"], "max_tokens": 12}))
        await wait_for(batcher_is(handle, "in_flight", lambda n: n == 1), 30, "a request in the engine")
        waiting = [asyncio.create_task(client.post("/generate", json={"prompts": [f"queued {i}"]})) for i in range(3)]
        refs = [handle.generate.remote(f"handle queued {i}") for i in range(2)]
        await wait_for(batcher_is(handle, "queue_depth", lambda n: n == 5), 30, "five queued requests")
        # The queued callers go first (HTTP clients hang up, handle callers cancel): had the running one gone
        # first, its freed place would admit a queued request before that one's own cancellation arrived.
        for task in waiting:
            task.cancel()
        for ref in refs:
            ref.cancel()
        await wait_for(batcher_is(handle, "queue_depth", lambda n: n == 0), 30, "the queued requests to leave")
        running.cancel()
        await asyncio.gather(running, *waiting, return_exceptions=True)

        async def settled() -> dict[str, Any] | None:
            # The engine hears of the running one's abort a loop turn after its caller is counted gone.
            stats = await handle.stats.remote()
            gone = stats["requests"]["abandoned"] - base["requests"]["abandoned"] == 6
            return stats if gone and stats["engine_stats"]["aborts"] > base["engine_stats"]["aborts"] else None

        stats = await wait_for(settled, 30, "the server to see all six callers go and the engine an abort")
        assert stats["batcher"]["queue_depth"] == 0  # their places in the batcher are free
        assert stats["batcher"]["total_cancelled"] - base["batcher"]["total_cancelled"] >= 5
        # The one that had reached the engine was aborted there; the queued ones never reached it.
        assert stats["engine_stats"]["aborts"] - base["engine_stats"]["aborts"] == 1
        await wait_for(batcher_is(handle, "in_flight", lambda n: n == 0), 30, "the batch to end")
        after = await handle.stats.remote()
        assert after["engine_stats"]["requests"] - base["engine_stats"]["requests"] == 1
        fresh = await client.post("/generate", json={"prompts": ["next"], "max_tokens": 1})
    assert fresh.status_code == 200
    FIGURES[f"client cancellation ({mode})"] = {
        "http_disconnects": 4,
        "handle_cancels": 2,
        "queued_freed": 5,
        "engine_aborts": after["engine_stats"]["aborts"] - base["engine_stats"]["aborts"],
        "reached_engine": 1,
    }


# -- Resource limits ------------------------------------------------------------------------------------


async def test_oversized_requests_are_refused_before_the_engine(serve_instance, deploy):
    handle = deploy("limits", simulated={"max_model_len": 512}, max_tokens_limit=256)
    before = await handle.stats.remote()
    async with httpx.AsyncClient(base_url=serve_instance + "/limits", timeout=30) as client:
        cases = {
            "prompt longer than the context": {"prompts": ["word " * 1000]},
            "max_tokens over the server's limit": {"prompts": ["hi"], "max_tokens": 257},
            # max_tokens past the context's room is cut to it, as vLLM's server does; a min_tokens past it cannot be
            "prompt + min_tokens over the context": {"prompts": ["abcd" * 400], "max_tokens": 200, "min_tokens": 150},
            "too many prompts": {"prompts": ["x"] * 257},
        }
        for what, body in cases.items():
            response = await client.post("/generate", json=body)
            assert response.status_code == 400, (what, response.text)
        chat = await client.post(
            "/v1/chat/completions", json={"messages": [{"role": "user", "content": "w " * 2000}], "max_tokens": 8}
        )
        assert chat.status_code == 400 and "context" in chat.text
    for call in (
        handle.generate.remote("word " * 1000),
        handle.generate.remote("hi", max_tokens=10_000),
    ):
        with pytest.raises(ValueError, match=r"context|limit"):
            await call
    after = await handle.stats.remote()
    assert after["engine_stats"]["requests"] == before["engine_stats"]["requests"]  # none reached the engine
    assert after["batcher"]["total_submitted"] == before["batcher"]["total_submitted"]  # nor the batcher
