"""The embedding core without Ray Serve, against vLLM's engine driven directly: where the served app loses to vLLM's
own server. The same corpus and closed loop as ``benchmarks.embeddings`` (64 clients, one text or 16 a call), in
one process: ``direct`` awaits ``PoolingEngine.embed`` on pre-tokenized inputs (AsyncLLM.encode, no batcher);
``core`` awaits ``Embedder.vectors`` (input checks, tokenizing, the admission batcher, the same engine). Prints
texts/s for each; start-up and a warm-up call are not measured.

    python -m benchmarks.embeddings.core [--texts 1000] [--clients 64] [--batcher '{"order": "fifo"}']
"""

import argparse
import asyncio
import json
import time
from collections.abc import Awaitable, Callable


async def closed_loop(call: Callable[[list[int]], Awaitable[object]], chunks: list[list[int]], clients: int) -> float:
    """Seconds for ``clients`` closed-loop callers to send every chunk, in order."""
    position = 0

    async def client() -> None:
        nonlocal position
        while position < len(chunks):
            chunk = chunks[position]
            position += 1
            await call(chunk)

    started = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(clients)))
    return time.perf_counter() - started


async def measure(n_texts: int, clients: int, batcher: dict | None = None) -> dict[str, float]:
    """texts/s of ``direct`` and ``core`` (``batcher``: knobs over its default batcher) for one text and 16 a call."""
    from serve_app.config import EmbeddingConfig
    from serve_app.core import Embedder
    from serve_app.engines.embedding import EmbeddingRequest

    from ..padding import make_texts

    embedder = Embedder(EmbeddingConfig.model_validate({"batcher": batcher} if batcher else {}))
    await embedder.start()
    texts = make_texts(n_texts)
    ids = await embedder.engine.tokenize(texts)
    await embedder.vectors(texts[:clients])  # warm-up
    sent = 0

    async def direct(chunk: list[int]) -> object:
        nonlocal sent
        sent += 1
        return await embedder.engine.embed([EmbeddingRequest(f"direct-{sent}-{i}", ids[i]) for i in chunk])

    async def core(chunk: list[int]) -> object:
        return await embedder.vectors([texts[i] for i in chunk])

    out = {}
    try:
        for per_request, scenario in ((1, "single"), (16, "list16")):
            chunks = [list(range(i, min(i + per_request, n_texts))) for i in range(0, n_texts, per_request)]
            for name, call in (("direct", direct), ("core", core)):
                out[f"{scenario} {name}"] = n_texts / await closed_loop(call, chunks, clients)
                print(f"{scenario} {name}: {out[f'{scenario} {name}']:.1f} texts/s", flush=True)
    finally:
        await embedder.stop()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--texts", type=int, default=1000)
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--batcher", type=json.loads, help="knobs over the core's batcher (JSON object)")
    args = parser.parse_args()
    asyncio.run(measure(args.texts, args.clients, args.batcher))


if __name__ == "__main__":
    main()
