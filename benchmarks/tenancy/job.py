"""The tenancy benchmark's batch job, as each peer's users run it: the Ray Data driver into the app, every prompt at
once into vLLM's server."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

from ..lib.peers import MODEL_NAME
from ..serving.peers import run_driver

JOB_ROWS, JOB_TOKENS = 1000, 32
JOB_PRIORITY = 1


def job_rows(rows: int, dest: Path) -> Path:
    from serve_app.sample import write

    return write(dest, rows)


async def vllm_job(url: str, path: Path, priority: int) -> dict[str, Any]:
    """Every prompt at once to vLLM's ``/v1/completions`` (as its users feed a batch), at ``priority``."""
    import aiohttp

    prompts = [json.loads(line)["prompt"] for line in path.read_text().splitlines()]
    started = time.perf_counter()
    limit = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=limit, timeout=aiohttp.ClientTimeout(total=3600)) as session:

        async def one(prompt: str) -> int:
            body = {"model": MODEL_NAME, "prompt": prompt, "max_tokens": JOB_TOKENS, "temperature": 0.0}
            body["priority"] = priority  # no ignore_eos: the app's driver stops where the model does, so must this
            async with session.post(f"{url}/v1/completions", json=body) as response:
                payload = await response.json()
                return payload["usage"]["completion_tokens"] if response.status == 200 else 0

        tokens = await asyncio.gather(*(one(p) for p in prompts))
    wall = time.perf_counter() - started
    return {"job_rows": len(prompts), "job_errors": tokens.count(0), "job_tokens": sum(tokens), "job_wall_s": wall}


def app_job(ray_tmp: str, path: Path, out: Path, priority: int) -> dict[str, Any]:
    """The Ray Data driver into the app's cluster, as a user runs it (``--max-tokens``, ``--priority``)."""
    argv = ["--input", str(path), "--output", str(out), "--max-tokens", str(JOB_TOKENS), "--priority", str(priority)]
    summary = run_driver(ray_tmp, argv)
    return {
        "job_rows": summary["rows_out"],
        "job_errors": summary["errors"],
        "job_tokens": summary["output_tokens"],
        "job_wall_s": summary["wall_s"],
    }
