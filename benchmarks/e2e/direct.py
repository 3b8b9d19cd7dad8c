"""vLLM with nothing in front: ``LLM.generate`` over every prompt (the ceiling), and ``AsyncLLM`` fed every request
at once as ``vllm serve`` and Ray Serve LLM feed it."""

from __future__ import annotations

import asyncio
import statistics
import time
from typing import Any

from .settings import engine_settings


def run_offline(texts: list[str], max_tokens: int, repeats: int) -> dict[str, Any]:
    from vllm import LLM, SamplingParams

    from serve_app.models import prepare

    llm = LLM(model=str(prepare()), **engine_settings())
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0)
    llm.generate(texts[:2], params)  # warm up
    walls = []
    for _ in range(repeats):
        started = time.perf_counter()
        outputs = llm.generate(texts, params)
        walls.append(time.perf_counter() - started)
    return {"output_tokens": sum(len(o.outputs[0].token_ids) for o in outputs), "wall_s": statistics.median(walls)}


class Direct:
    """vLLM's ``AsyncLLM`` in this process, as ``vllm serve`` and Ray Serve LLM drive it: every request goes in
    at once as its own ``generate()`` stream, tokenized as the app tokenizes it and rendered by vLLM's renderer."""

    def __init__(self) -> None:
        from transformers import AutoTokenizer
        from vllm import AsyncEngineArgs
        from vllm.usage.usage_lib import UsageContext
        from vllm.v1.engine.async_llm import AsyncLLM

        from serve_app.models import prepare

        model = str(prepare())
        self.tokenizer = AutoTokenizer.from_pretrained(model)
        engine_args = AsyncEngineArgs(model=model, disable_log_stats=True, **engine_settings())
        # Sized as `vllm serve` sizes its engine, as the app's is (the same 128 sequences on a CPU).
        self.llm = AsyncLLM.from_engine_args(engine_args, usage_context=UsageContext.OPENAI_API_SERVER)
        self.count = 0

    async def one(self, text: str, max_tokens: int) -> tuple[float, int]:
        """(latency s, output tokens) of one request."""
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt
        from vllm.renderers.inputs.preprocess import parse_model_prompt

        started = time.perf_counter()
        self.count += 1
        parsed = parse_model_prompt(self.llm.model_config, TokensPrompt(prompt_token_ids=self.tokenizer.encode(text)))
        (prompt,) = await self.llm.renderer.render_cmpl_async([parsed])
        final = None
        params = SamplingParams(max_tokens=max_tokens, temperature=0.0)
        async for output in self.llm.generate(prompt, params, f"direct-{self.count}"):
            final = output
        assert final is not None and final.outputs, "no output"
        return time.perf_counter() - started, len(final.outputs[0].token_ids)

    async def burst(self, requests: list[tuple[str, int]]) -> list[tuple[float, int]]:
        return list(await asyncio.gather(*(self.one(text, m) for text, m in requests)))

    def shutdown(self) -> None:
        self.llm.shutdown()


def run_direct(requests: list[tuple[str, int]], repeats: int) -> list[list[tuple[float, int]]]:
    """Each repeat's (latency, output tokens) per request, after a warm-up."""
    direct = Direct()

    async def go() -> list[list[tuple[float, int]]]:
        await direct.burst(requests[:2])  # warm up
        return [await direct.burst(requests) for _ in range(repeats)]

    try:
        return asyncio.run(go())
    finally:
        direct.shutdown()
