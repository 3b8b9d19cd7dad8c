"""The Ray peers' servers, run inside a peer's own subprocess (``python -m benchmarks.embeddings --serve PEER``): the
naive ``@serve.batch`` deployment as Ray Serve's docs lead to it, and serving it or the app in a local Ray cluster."""

# No ``from __future__ import annotations``: FastAPI must resolve the naive deployment's annotations, and
# its imports are local to the function that builds it.
import asyncio
from typing import Any

from serve_app.engines.encoder import bundled_encoder_path

from ..lib.peers import serve_until_interrupted
from .peers import DIRECT_MARKER, MODEL_NAME, READY_MARKER, app_args, cores

NAIVE_BATCH, NAIVE_WAIT_S = 32, 0.01  # @serve.batch(max_batch_size=32); 0.01 s is Serve's default wait
MAX_ONGOING = 4096  # the app's default; both Ray peers get it, so Serve's router never holds requests back


def naive_app(folder: str, threads: int, dtype: str = "float32") -> Any:
    """What Ray Serve's docs lead to: ``@serve.batch`` around sentence-transformers' ``encode`` (``dtype``: what
    the model is cast to; sentence-transformers loads float32)."""
    from fastapi import FastAPI, Request
    from fastapi.responses import JSONResponse
    from ray import serve

    api = FastAPI()

    @serve.deployment(name="NaiveEmbeddings", max_ongoing_requests=MAX_ONGOING, ray_actor_options={"num_cpus": 1})
    @serve.ingress(api)
    class NaiveEmbeddings:
        def __init__(self) -> None:
            import torch
            from sentence_transformers import SentenceTransformer

            torch.set_num_threads(threads)  # Ray set OMP_NUM_THREADS=1 for one logical CPU: use every core
            self.model = SentenceTransformer(folder, device="cpu", local_files_only=True).eval()
            self.model.to(getattr(torch, dtype))
            self.counts = {"batches": 0, "inputs": 0, "tokens": 0, "padded_tokens": 0}

        def _encode(self, texts: list[str]) -> list[list[float]]:
            lengths = self.model.tokenize(texts)["attention_mask"].sum(1).tolist()  # for the padding waste
            vectors = self.model.encode(texts, batch_size=NAIVE_BATCH, show_progress_bar=False)
            self.counts["batches"] += 1
            self.counts["inputs"] += len(texts)
            self.counts["tokens"] += sum(lengths)
            self.counts["padded_tokens"] += len(texts) * max(lengths)
            return vectors.tolist()

        @serve.batch(max_batch_size=NAIVE_BATCH, batch_wait_timeout_s=NAIVE_WAIT_S)
        async def embed(self, texts: list[str]) -> list[list[float]]:
            return await asyncio.to_thread(self._encode, texts)

        @api.post("/v1/embeddings")
        async def embeddings(self, request: Request) -> JSONResponse:
            body = await request.json()
            texts = [body["input"]] if isinstance(body["input"], str) else body["input"]
            vectors = await asyncio.gather(*(self.embed(text) for text in texts))
            data = [{"object": "embedding", "index": i, "embedding": v} for i, v in enumerate(vectors)]
            return JSONResponse({"object": "list", "model": MODEL_NAME, "data": data, "usage": {}})

        @api.get("/stats")
        async def stats(self) -> dict[str, Any]:
            return {"engine_stats": dict(self.counts), "dtype": dtype}

    return NaiveEmbeddings.bind()


def serve_peer(peer: str, port: int, over: dict[str, Any] | None = None) -> None:
    """Run one Ray peer in this process's own local Ray cluster until SIGINT."""
    import ray
    from ray import serve
    from ray.serve.context import _get_global_client

    from serve_app.direct import replica_urls

    ray.init(address="local", num_cpus=max(4, cores()), include_dashboard=False, log_to_driver=False)
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    name = {"app": "embeddings", "naive": "naive"}.get(peer)
    if peer == "app":
        from serve_app.app import build_embeddings_app as build_app

        # Served at "/" so its /stats route is reachable too (mounted beside the generation app it takes
        # route_prefix /v1/embeddings; the path to /v1/embeddings is the same code either way).
        serve.run(build_app(app_args(over)), name=name, route_prefix="/")
    elif peer == "naive":
        dtype = (over or {}).get("dtype", "float32")
        serve.run(naive_app(str(bundled_encoder_path()), cores(), dtype), name=name, route_prefix="/")
    else:
        raise ValueError(f"unknown Ray peer {peer!r}")
    for url in replica_urls(_get_global_client().get_serve_details()).get(name, []):
        print(DIRECT_MARKER, url, flush=True)  # its replica's own port (direct ingress), for a ``-direct`` peer
    print(READY_MARKER, flush=True)
    serve_until_interrupted()
