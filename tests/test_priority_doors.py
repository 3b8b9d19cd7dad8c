"""Priorities and tenants through every door (HTTP bodies, handle keywords, Ray Data jobs), on a SIMULATED engine
that runs one request at a time (``max_inflight: 1``), so the batcher's admission order is the answer order.

Each test queues a batch first and sends a single request after it: FIFO answers the batch first; a better
priority (or, with ``fair_share``, a tenant served less) answers the single request while the batch still runs.
The controls send the same traffic without the difference and see FIFO, so the tests can fail.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import httpx
import pytest

from .waits import wait_for

pytestmark = pytest.mark.serve

ONE_AT_A_TIME = {
    "simulated": {"step_s": 0.02},  # 8 tokens: about 0.16 s a request
    "sampling": {"max_tokens": 8},
    "batcher": {"max_inflight": 1, "low_priority_share": 1.0},  # order by priority alone, no share cap
}
BATCH = [f"queued prompt {i}" for i in range(8)]


@pytest.fixture(scope="module")
def served(serve_instance, deploy_app):
    handle = deploy_app("doors", **ONE_AT_A_TIME)
    fair = deploy_app("fair", **{**ONE_AT_A_TIME, "batcher": {**ONE_AT_A_TIME["batcher"], "fair_share": True}})
    return serve_instance, handle, fair


async def queued(client: httpx.AsyncClient, app: str, rows: int = 4) -> None:
    """Until at least ``rows`` requests wait in ``app``'s batcher queue."""

    async def enough() -> bool:
        stats = (await client.get(f"/{app}/stats")).json()["batcher"]
        return stats["queue_depth"] >= rows

    await wait_for(enough, 30, f"{rows} requests queued in /{app}", interval=0.02)


async def first_done(batch: Any, single: Any) -> str:
    """Which of two awaitables finishes first: ``"single"`` or ``"batch"`` (both are awaited to the end)."""
    batch_task, single_task = asyncio.ensure_future(batch), asyncio.ensure_future(single)
    done, _ = await asyncio.wait({batch_task, single_task}, return_when=asyncio.FIRST_COMPLETED)
    await asyncio.gather(batch_task, single_task)
    return "single" if single_task in done and batch_task not in done else "batch"


async def http_race(
    url: str, app: str, batch_body: dict, route: str, single_body: dict, keys: tuple[str, str] | None = None
) -> str:
    """Which answers first: a batch queued first, or a single request sent after it (``keys``: their API keys)."""
    batch_key, single_key = [{"Authorization": f"Bearer {key}"} for key in keys] if keys else ({}, {})
    async with httpx.AsyncClient(base_url=url, timeout=60) as client:
        batch_body = {"prompts": BATCH, **batch_body}
        batch = asyncio.ensure_future(client.post(f"/{app}/generate", json=batch_body, headers=batch_key))
        await queued(client, app)

        async def single() -> None:
            response = await client.post(f"/{app}{route}", json=single_body, headers=single_key)
            assert response.status_code == 200, response.text

        winner = await first_done(batch, single())
        assert batch.result().status_code == 200, batch.result().text
        return winner


CHAT = {"messages": [{"role": "user", "content": "hello?"}], "max_tokens": 8}
COMPLETION = {"prompt": "hello?", "max_tokens": 8}


@pytest.mark.parametrize(
    ("batch_priority", "route", "single", "expected"),
    [
        (5, "/v1/chat/completions", {**CHAT, "priority": 0}, "single"),  # a better priority overtakes
        (None, "/v1/completions", {**COMPLETION, "priority": -1}, "single"),  # below the default 0
        (None, "/v1/chat/completions", CHAT, "batch"),  # control: both at 0, FIFO
        (5, "/v1/completions", {**COMPLETION, "priority": 5}, "batch"),  # control: one priority, FIFO
    ],
)
async def test_http_priority_orders_admission(served, batch_priority, route, single, expected):
    url, _, _ = served
    body = {} if batch_priority is None else {"priority": batch_priority}
    assert await http_race(url, "doors", body, route, single) == expected


async def test_http_user_is_the_tenant_fair_share_admits(served):
    url, _, _ = served
    chat = {**CHAT, "user": "bob"}
    assert await http_race(url, "fair", {"user": "alice"}, "/v1/chat/completions", chat) == "single"
    # control: the same user for both, so one tenant, FIFO
    assert await http_race(url, "fair", {"user": "bob"}, "/v1/chat/completions", chat) == "batch"


async def test_http_api_key_is_the_tenant_of_a_request_without_user(served):
    url, _, _ = served
    keys = ("sk-batch-owner", "sk-chat-owner")
    assert await http_race(url, "fair", {}, "/v1/chat/completions", CHAT, keys) == "single"
    assert await http_race(url, "fair", {}, "/v1/completions", COMPLETION, ("sk-same", "sk-same")) == "batch"
    # a user named in the body wins over the key: one user, one tenant, FIFO
    same_user = {**COMPLETION, "user": "carol"}
    assert await http_race(url, "fair", {"user": "carol"}, "/v1/completions", same_user, keys) == "batch"
    async with httpx.AsyncClient(base_url=url, timeout=60) as client:
        tenants = (await client.get("/fair/stats")).json()["batcher"]["admitted_cost_by_tenant"]
    assert "carol" in tenants and len([t for t in tenants if t.startswith("key-")]) == 3
    assert not any("sk-" in t for t in tenants)  # the keys themselves are never shown


async def handle_race(url: str, app: str, handle: Any, batch_kwargs: dict, single_kwargs: dict) -> str:
    async with httpx.AsyncClient(base_url=url, timeout=60) as client:
        batch = handle.generate_batch.remote(BATCH, **batch_kwargs)
        await queued(client, app)
        return await first_done(batch, handle.generate.remote("hello?", **single_kwargs))


@pytest.mark.parametrize(
    ("batch_kwargs", "single_kwargs", "expected"),
    [
        ({"priority": 3}, {}, "single"),  # handle calls default to 0
        ({}, {"priority": 3}, "batch"),  # a worse priority waits its turn
        ({"priority": 3}, {"priority": 3}, "batch"),  # control
    ],
)
async def test_handle_priority_keyword_orders_admission(served, batch_kwargs, single_kwargs, expected):
    url, handle, _ = served
    assert await handle_race(url, "doors", handle, batch_kwargs, single_kwargs) == expected


async def test_handle_tenant_keyword_is_fair_shared(served):
    url, _, fair = served
    assert await handle_race(url, "fair", fair, {"tenant": "big"}, {"tenant": "small"}) == "single"
    assert await handle_race(url, "fair", fair, {"tenant": "big"}, {"tenant": "big"}) == "batch"


async def test_handle_priority_must_be_an_int(served):
    _, handle, _ = served
    with pytest.raises(ValueError, match="priority"):
        await handle.generate.remote("hello?", priority="high")


@pytest.mark.parametrize(("job_priority", "overtakes"), [(None, True), (0, False)])
@pytest.mark.system  # a Ray Data job
async def test_ray_data_jobs_run_after_interactive_requests(served, job_priority, overtakes):
    """A Ray Data job's rows go at DATA_PRIORITY by default, so an interactive request is admitted before the
    rows the job has queued; the same job at priority 0 (control) keeps FIFO: every row queued before it first."""
    import ray.data

    from serve_app.data import DATA_PRIORITY, generate

    assert DATA_PRIORITY > 0
    url, handle, _ = served
    rows = [{"id": i, "prompt": f"row {i}"} for i in range(24)]
    options = {} if job_priority is None else {"priority": job_priority}
    job = generate(ray.data.from_items(rows), app="doors", concurrency=1, batch_size=8, **options)
    thread_out: list[dict[str, Any]] = []
    thread = threading.Thread(target=lambda: thread_out.extend(job.take_all()), daemon=True)
    thread.start()
    async with httpx.AsyncClient(base_url=url, timeout=60) as client:

        async def batcher() -> dict[str, Any]:
            return (await client.get("/doors/stats")).json()["batcher"]

        await queued(client, "doors")
        before = await batcher()
        await handle.generate.remote("hello?")
        admitted = (await batcher())["total_admitted"] - before["total_admitted"]  # ours included
    await asyncio.to_thread(thread.join, 120)
    assert sorted(r["id"] for r in thread_out) == list(range(24)) and not any(r["error"] for r in thread_out)
    if overtakes:  # ours, and at most the rows admitted while it was on its way
        assert admitted <= 3, (admitted, before)
    else:  # FIFO: each row queued before it, then it
        assert admitted >= before["queue_depth"] + 1, (admitted, before)
