"""Autoscaling, proven under load: sustained load takes an app from 1 to 2 replicas and, once it stops, back
to 1, with every request answered exactly once (the clients' count reconciled with the engines'), through
HTTP and through a Ray Data job at its default concurrency; and the token-aware policy
(``autoscaling.metric: tokens``, serve_app/autoscaling.py): unit tests of the policy function with fake
metrics, and a deployment it scales up on token load that ongoing requests would never scale.

Apps run the SIMULATED engine with a real cost per decode step, so a replica stays busy while it holds
work. Serve's metric pipeline runs faster here than shipped (reports every 1 s over a 3 s window, 1 s
upscale and 8 s downscale delays) so the module takes about 2 minutes; the figures (time to scale up and
down) go to ``FIGURES`` and docs/reliability.md's tables. Nothing asserts a wall-clock threshold: only
replica counts reached within generous timeouts, and the reconciliation of requests.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from typing import Any

import pytest

from harness.stats import percentile
from serve_app.serving.autoscaling import PROMPTS, TOKEN_BUDGET, TOKEN_LOAD, TokenAutoscalingPolicy, replica_load

from .conftest import FIGURES
from .waits import RowsInThread, per_replica_stats, wait_for

FAST_METRICS = {"metrics_interval_s": 1.0, "look_back_period_s": 3.0, "upscale_delay_s": 1.0, "downscale_delay_s": 8.0}
"""Serve's autoscaling loop, sped up for tests (shipped values: serve_config.yaml)."""

BUSY_ENGINE = {
    # One replica runs 8 sequences at once, 0.05 s a decode step: with max_tokens 8 a prompt takes 0.4 s and a
    # replica serves about 20 prompts/s; more load than that queues in its batcher (its ongoing requests grow).
    "simulated": {"step_s": 0.05, "max_num_seqs": 8},
    "batcher": {"max_inflight": 8},
    "sampling": {"max_tokens": 8},
}


def expected_text(prompt: str, tokens: int) -> str:
    """The simulated engine's answer: the prompt's words, cycled, one per token."""
    words = prompt.split()
    return "[simulated] " + " ".join(words[i % len(words)] for i in range(tokens))


# -- The policy, with fake metrics ----------------------------------------------------------------------


def context(
    metrics: dict[str, dict[str, float]] | None,
    replicas: int = 1,
    requests: float = 0.0,
    queued: float = 0.0,
    **config: Any,
) -> Any:
    """A real ``AutoscalingContext`` holding fake per-replica aggregated metrics."""
    from ray.serve.config import AutoscalingConfig, AutoscalingContext

    names = [f"r{i}" for i in range(replicas)]
    return AutoscalingContext(
        deployment_id=None,
        deployment_name="LLMServer",
        app_name="llm",
        current_num_replicas=replicas,
        target_num_replicas=replicas,
        running_replicas=names,
        total_num_requests=lambda: requests,  # Serve passes these lazily, as callables
        total_queued_requests=lambda: queued,
        aggregated_metrics=lambda: metrics,
        raw_metrics=None,
        capacity_adjusted_min_replicas=1,
        capacity_adjusted_max_replicas=4,
        policy_state={},
        last_scale_up_time=None,
        last_scale_down_time=None,
        current_time=time.time(),
        config=AutoscalingConfig(**{"min_replicas": 1, "max_replicas": 4, **config}),
    )


def test_policy_asks_for_the_token_load_over_the_target_per_replica():
    policy = TokenAutoscalingPolicy(target_tokens=4_000)
    held = {TOKEN_LOAD: {"r0": 9_000.0, "r1": 5_000.0}, PROMPTS: {"r0": 90.0, "r1": 50.0}}
    desired, state = policy(context(held, replicas=2, requests=2))  # 2 ongoing requests: requests would not scale
    assert desired == pytest.approx(14_000 / 4_000)  # Serve rounds up (4) and clips to max_replicas
    assert state == {"basis": "tokens", "tokens": 14_000, "target_tokens": 4_000}
    idle = {TOKEN_LOAD: {"r0": 0.0, "r1": 300.0}, PROMPTS: {"r0": 0.0, "r1": 3.0}}
    assert policy(context(idle, replicas=2, requests=50))[0] == pytest.approx(300 / 4_000)  # 50 short: 1 replica


def test_policy_default_target_is_the_replicas_in_flight_token_budget():
    metrics = {
        TOKEN_LOAD: {"r0": 20_000.0},
        TOKEN_BUDGET: {"r0": 8_192.0, "r1": 8_192.0},  # r1 just started: no load reported yet
        PROMPTS: {"r0": 100.0},
    }
    desired, state = TokenAutoscalingPolicy()(context(metrics, replicas=2))
    assert desired == pytest.approx(20_000 / 8_192)
    assert state["target_tokens"] == 8_192


def test_policy_prices_requests_queued_in_callers_at_the_tokens_per_prompt_held():
    metrics = {TOKEN_LOAD: {"r0": 4_000.0}, PROMPTS: {"r0": 20.0}}  # 200 tokens a prompt
    desired, state = TokenAutoscalingPolicy(target_tokens=2_000)(context(metrics, queued=10))
    assert desired == pytest.approx((4_000 + 10 * 200) / 2_000)
    assert state["tokens"] == 6_000


def test_policy_falls_back_to_ongoing_requests_until_replicas_report_tokens():
    policy = TokenAutoscalingPolicy(target_tokens=2_000)
    desired, state = policy(context({}, replicas=1, requests=96, target_ongoing_requests=32))
    assert desired == pytest.approx(3.0) and state == {"basis": "requests"}
    cold = context(None, replicas=0)
    assert policy(cold)[0] == 0  # no replica: hold Serve's target (its cold-start path scales from 0)
    with pytest.raises(ValueError, match="target_tokens"):
        TokenAutoscalingPolicy(target_tokens=0)


def test_replica_load_counts_queued_and_in_flight_tokens_in_both_batcher_modes():
    from batching import AdmissionStats, BatchStats

    continuous = AdmissionStats(queued_cost=3_000, queue_depth=12, in_flight=4, in_flight_cost=1_000, budget=8_192)
    assert replica_load(continuous, batch_budget=99) == {TOKEN_LOAD: 4_000.0, TOKEN_BUDGET: 8_192.0, PROMPTS: 16.0}
    # batch mode tracks records in flight, not their cost: priced at the mean cost per record so far
    batch = BatchStats(queued_cost=500, queue_depth=5, in_flight=10, avg_batch_size=20.0, avg_batch_cost=2_000.0)
    assert replica_load(batch, batch_budget=65_536) == {TOKEN_LOAD: 1_500.0, TOKEN_BUDGET: 65_536.0, PROMPTS: 15.0}


def test_replica_load_with_max_priority_counts_only_those_priorities_tokens():
    from batching import AdmissionStats

    stats = AdmissionStats(
        queued_cost=3_000, queue_depth=12, in_flight=4, in_flight_cost=1_000, budget=8_192,
        tokens_by_priority={0: 500, 1: 3_500},
    )  # fmt: skip
    assert replica_load(stats)[TOKEN_LOAD] == 4_000.0  # every priority
    assert replica_load(stats, max_priority=0)[TOKEN_LOAD] == 500.0  # a Ray Data job's tokens do not scale out


def test_metric_tokens_selects_the_policy_and_bad_settings_fail_naming_the_field():
    from pydantic import ValidationError
    from ray.serve.config import AutoscalingConfig

    from serve_app.app import deployment_options
    from serve_app.config import AppConfig

    requests = deployment_options(AppConfig(engine="simulated"))["autoscaling_config"]
    assert "policy" not in requests  # Serve's own policy on ongoing requests
    tokens = AppConfig(engine="simulated", autoscaling={"metric": "tokens", "target_tokens": 5_000})
    scaling = deployment_options(tokens)["autoscaling_config"]
    policy = AutoscalingConfig(**scaling).policy  # what Serve builds: it imports and pickles the class
    assert policy.policy_function == "serve_app.serving.autoscaling:TokenAutoscalingPolicy"
    assert policy.policy_kwargs == {"target_tokens": 5_000} and policy.get_policy() is TokenAutoscalingPolicy
    for bad, field in [
        ({"metric": "kv"}, "metric"),
        ({"target_tokens": 1_000}, "target_tokens"),  # only with metric: tokens
        ({"max_priority": 0}, "max_priority"),  # likewise
        ({"metric": "tokens", "target_tokens": 0}, "target_tokens"),
        ({"look_back_period_s": 5, "metrics_interval_s": 10}, "look_back_period_s"),
    ]:
        with pytest.raises(ValidationError, match=field):
            AppConfig(autoscaling=bad)


# -- Under load -----------------------------------------------------------------------------------------


class ReplicaTimeline:
    """Polls the app's replica count (RUNNING, and all including STARTING) every ``interval`` s."""

    def __init__(self, app: str, interval: float = 0.25) -> None:
        self.app, self.interval = app, interval
        self.points: list[tuple[float, int, int]] = []  # (monotonic time, running, all)
        self._task: asyncio.Task | None = None

    def counts(self) -> tuple[int, int]:
        from ray import serve

        status = serve.status().applications.get(self.app)
        if status is None:
            return 0, 0
        states = [d.replica_states for d in status.deployments.values()]
        return sum(s.get("RUNNING", 0) for s in states), sum(sum(s.values()) for s in states)

    async def _poll(self) -> None:
        while True:
            running, every = await asyncio.to_thread(self.counts)
            self.points.append((time.monotonic(), running, every))
            await asyncio.sleep(self.interval)

    def __enter__(self) -> ReplicaTimeline:
        self._task = asyncio.get_running_loop().create_task(self._poll())
        return self

    def __exit__(self, *_: Any) -> None:
        assert self._task is not None
        self._task.cancel()

    def running(self) -> int:
        return self.points[-1][1] if self.points else 0

    def first(self, test, after: float) -> float | None:
        """Seconds from ``after`` to the first point where ``test(running, all)`` holds."""
        return next((t - after for t, r, a in self.points if t >= after and test(r, a)), None)

    def peak(self) -> int:
        return max((r for _, r, _ in self.points), default=0)


async def http_clients(url: str, clients: int, stop: asyncio.Event, max_tokens: int) -> list[dict[str, Any]]:
    """``clients`` closed-loop clients POSTing one tagged prompt at a time to /generate until ``stop``."""
    import aiohttp

    outcomes: list[dict[str, Any]] = []
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as session:

        async def client(c: int) -> None:
            k = 0
            while not stop.is_set():
                prompt = f"c{c} n{k}"
                body = {"prompts": [prompt], "task_id": f"{c}-{k}", "max_tokens": max_tokens}
                sent = time.monotonic()
                async with session.post(f"{url}/generate", json=body) as response:
                    outcomes.append(
                        {
                            "prompt": prompt,
                            "task_id": body["task_id"],
                            "status": response.status,
                            "body": await response.json(),
                            "latency": time.monotonic() - sent,
                        }
                    )
                k += 1

        await asyncio.gather(*(client(c) for c in range(clients)))
    return outcomes


@pytest.mark.system  # replicas added and taken away
async def test_sustained_http_load_scales_1_to_2_and_back_with_every_request_answered_once(serve_instance, deploy):
    app = "autoscale-http"
    handle = deploy(app, **BUSY_ENGINE, autoscaling={"max_replicas": 2, "target_ongoing_requests": 8, **FAST_METRICS})
    with ReplicaTimeline(app) as timeline:
        await wait_for(lambda: timeline.running() == 1, 60, "one replica")
        stop = asyncio.Event()
        started = time.monotonic()
        # 24 clients: about 24 ongoing requests against a target of 8 per replica
        load = asyncio.create_task(
            http_clients(f"{serve_instance}/{app}", 24, stop, BUSY_ENGINE["sampling"]["max_tokens"])
        )
        await wait_for(lambda: timeline.running() == 2 or load.done(), 120, "a second replica under load")
        scaled_up = time.monotonic() - started

        async def both_serve() -> bool:
            replicas = await per_replica_stats(handle, 2)
            return all(s["engine_stats"]["requests"] > 0 for s in replicas.values())

        await wait_for(both_serve, 60, "both replicas to serve requests")
        stop.set()
        outcomes = await load
        stopped = time.monotonic()
        assert timeline.running() == 2, "scaled down while the load was on"
        replicas = await per_replica_stats(handle, 2)  # before the scale-down takes one away
        await wait_for(lambda: timeline.running() == 1 and timeline.points[-1][2] == 1, 120, "back to one replica")
        scaled_down = time.monotonic() - stopped
    # Every request answered exactly once, with its own answer: none lost, none duplicated.
    assert {o["status"] for o in outcomes} == {200}, {o["status"] for o in outcomes}
    assert len({o["task_id"] for o in outcomes}) == len(outcomes)
    for o in outcomes:
        assert o["body"]["task_id"] == o["task_id"] and o["body"]["results"] == [expected_text(o["prompt"], 8)], o
    engine_runs = sum(s["engine_stats"]["requests"] for s in replicas.values())
    completed = sum(s["batcher"]["total_completed"] for s in replicas.values())
    assert engine_runs == completed == len(outcomes)  # the engines ran exactly what the clients got back
    assert all(s["engine_stats"]["requests"] > 0 for s in replicas.values())  # the new replica took load
    latencies = [o["latency"] for o in outcomes]
    FIGURES["autoscaling 1 -> 2 -> 1, HTTP load"] = {
        "clients": 24,
        "requests": len(outcomes),
        "lost": 0,
        "duplicated": 0,
        "scale_decision_s": round(timeline.first(lambda r, a: a >= 2, started) or -1, 1),
        "scale_up_s": round(scaled_up, 1),
        "scale_down_s": round(scaled_down, 1),
        "per_replica": sorted(s["engine_stats"]["requests"] for s in replicas.values()),
        "p50_s": round(statistics.median(latencies), 2),
        "p99_s": round(percentile(latencies, 99), 2),
    }


@pytest.mark.soak  # a 600-row load test; the HTTP and token cases scale 1 -> 2 -> 1 in make test
async def test_ray_data_job_at_default_concurrency_scales_1_to_2_and_back_with_every_row_once(serve_instance, deploy):
    import ray.data

    from serve_app.data import app_capacity, generate

    app = "autoscale-data"
    handle = deploy(app, **BUSY_ENGINE, autoscaling={"max_replicas": 2, "target_ongoing_requests": 4, **FAST_METRICS})
    capacity = await asyncio.to_thread(app_capacity, app)
    assert capacity == 2 * 4  # the job's default concurrency: what both replicas absorb at their target
    n = 600
    rows = [{"id": i, "prompt": f"row {i} says"} for i in range(n)]
    # concurrency left to its default (8 requests of 4 rows): 8 ongoing against a target of 4 per replica
    job = RowsInThread(
        lambda: generate(ray.data.from_items(rows), app=app, batch_size=4, max_tokens=8, max_retries=20).iter_rows()
    )
    with ReplicaTimeline(app) as timeline:
        await wait_for(lambda: timeline.running() == 1, 60, "one replica")
        started = time.monotonic()
        job.start()
        await asyncio.to_thread(job.join, 300)
        finished = time.monotonic()
        assert not job.failure, job.failure
        peak = timeline.peak()
        replicas = await per_replica_stats(handle, timeline.running())
        await wait_for(lambda: timeline.running() == 1 and timeline.points[-1][2] == 1, 120, "back to one replica")
        scaled_down = time.monotonic() - finished
    assert peak == 2, f"the job never scaled the app to two replicas (peak {peak})"
    ids = sorted(int(r["id"]) for r in job.rows)
    assert ids == list(range(n))  # every row exactly once
    for row in job.rows:
        assert row["error"] is None and row["text"] == expected_text(f"row {row['id']} says", 8), row
    assert sum(s["engine_stats"]["requests"] for s in replicas.values()) == n  # ran once each, retries included
    up = timeline.first(lambda r, a: r >= 2, started)
    FIGURES["autoscaling 1 -> 2 -> 1, Ray Data job at default concurrency"] = {
        "rows": n,
        "concurrency": capacity,
        "lost": 0,
        "duplicated": 0,
        "scale_up_s_from_job_start": round(up, 1) if up is not None else None,
        "job_s": round(finished - started, 1),
        "scale_down_s": round(scaled_down, 1),
    }


@pytest.mark.system  # replicas added and taken away
async def test_token_policy_scales_up_on_a_token_load_that_ongoing_requests_would_not(serve_instance, deploy):
    app = "autoscale-tokens"
    handle = deploy(
        app,
        **BUSY_ENGINE,
        autoscaling={"max_replicas": 2, "metric": "tokens", "target_tokens": 2_000, **FAST_METRICS},
    )  # target_ongoing_requests stays 64: 3 requests in flight would never scale on requests
    prompt = "long " * 100  # 126 simulated tokens + max_tokens 8 each: 32 of them cost 4,288 tokens
    stop = asyncio.Event()
    answered: list[list[dict[str, Any]]] = []

    async def client(c: int) -> None:
        while not stop.is_set():
            answered.append(await handle.generate_batch.remote([f"{prompt}{c}"] * 32, max_tokens=8))

    with ReplicaTimeline(app) as timeline:
        await wait_for(lambda: timeline.running() == 1, 60, "one replica")
        started = time.monotonic()
        load = asyncio.gather(*(client(c) for c in range(3)))
        await wait_for(lambda: timeline.running() == 2, 120, "a second replica on token load")
        scaled_up = time.monotonic() - started
        stop.set()
        await load
        stopped = time.monotonic()
        replicas = await per_replica_stats(handle, 2)
        await wait_for(lambda: timeline.running() == 1 and timeline.points[-1][2] == 1, 120, "back to one replica")
        scaled_down = time.monotonic() - stopped
    prompts = sum(len(rows) for rows in answered)
    assert all(row["error"] is None for rows in answered for row in rows)
    assert sum(s["engine_stats"]["requests"] for s in replicas.values()) == prompts
    assert max(s["requests"]["peak"] for s in replicas.values()) <= 3  # never more than 3 ongoing requests
    FIGURES["token-aware autoscaling 1 -> 2 -> 1, 3 requests of 32 long prompts"] = {
        "ongoing_requests": 3,
        "target_ongoing_requests": 64,
        "target_tokens": 2_000,
        "scale_up_s": round(scaled_up, 1),
        "scale_down_s": round(scaled_down, 1),
        "prompts": prompts,
    }
