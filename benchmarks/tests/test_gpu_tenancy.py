"""The GPU tenancy benchmark's engine and run, on the CPU with a tiny random model (the GPU is not in CI).

``benchmarks.gpu_tenancy`` runs where only torch and transformers are (a lent GPU machine); these keep it
working between such sessions: the engine's priority order really changes who is served first, and a whole run
writes its page.
"""

from __future__ import annotations

import asyncio
import json

import pytest

from benchmarks.gpu_tenancy.cli import main
from benchmarks.gpu_tenancy.hf_engine import Engine, Request, build_model


@pytest.fixture(scope="module")
def tiny_model():
    return build_model("tiny", "cpu")


def first_token_ranks(model, priorities_on: bool) -> tuple[int, int]:
    """30 queued job prompts (priority 1) then one chat (priority 0) into an engine whose steps hold one prompt:
    the chat's rank among first tokens, and how many requests there were."""
    engine = Engine(model, kv_tokens=32_768, step_tokens=160, max_seqs=64)
    engine.priorities_on = priorities_on
    order: list[str] = []

    async def one(name: str, request: Request) -> None:
        async for tokens in engine.stream(request):
            if tokens and name not in order:
                order.append(name)

    async def run() -> None:
        jobs = [asyncio.ensure_future(one(f"job{i}", Request([5] * 128, 4, 1, stream=True))) for i in range(30)]
        await asyncio.sleep(0)  # the jobs reach the engine's queue first
        await one("chat", Request([7] * 16, 4, 0, stream=True))
        await asyncio.gather(*jobs)

    try:
        asyncio.run(run())
    finally:
        engine.stop()
    return order.index("chat"), len(order)


def test_the_engines_priority_order_puts_a_chat_ahead_of_queued_job_prompts(tiny_model):
    rank, count = first_token_ranks(tiny_model, priorities_on=True)
    fifo_rank, _ = first_token_ranks(tiny_model, priorities_on=False)
    assert count == 31
    assert rank < 5, f"the chat got its first token {rank}th of {count} with priorities on"
    assert fifo_rank > 20, f"FIFO served the chat {fifo_rank}th: the job's prompts were not queued ahead of it"


def test_a_whole_run_on_the_cpu_writes_its_page(tmp_path):
    argv = ["--shape", "tiny", "--device", "cpu", "--rows", "16", "--warm-rows", "8", "--online-s", "1"]
    argv += ["--kv-tokens", "16384", "--step-tokens", "1024", "--max-seqs", "64", "--out", str(tmp_path)]
    assert main([*argv, "--peers", "admission-engine-priority", "engine"]) == 0
    rows = json.loads((tmp_path / "gpu_tenancy.json").read_text())["rows"]
    assert [r["peer"] for r in rows] == ["admission-engine-priority", "engine"]
    for row in rows:
        assert row["alone_chats"] > 0 and row["beside_chats"] > 0
        assert row["job_alone_tok_s"] > 0 and row["job_beside_tok_s"] > 0
        assert row["beside_ttft_p99_s"] >= row["beside_ttft_p50_s"] > 0
    page = (tmp_path / "gpu_tenancy.md").read_text()
    assert "| admission-engine-priority |" in page and "| engine |" in page
