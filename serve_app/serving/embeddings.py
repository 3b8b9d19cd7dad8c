"""The embedding deployment: one encoder and one batcher (batch mode, length-aware, a padded-token budget)
per replica, reached over HTTP (``POST /v1/embeddings``) or through a ``DeploymentHandle``. Every entry
point takes :meth:`EmbeddingServer._run`: inputs -> validation -> batcher -> encoder -> vectors.

Handle methods (``serve.get_app_handle("embeddings").<method>.remote(...)``):

- ``embed(texts) -> list[list[float]]``: one vector per text, in order; bad input raises ``ValueError``.
- ``embed_batch(texts) -> list[dict]``: one dict per text with ``embedding``, ``tokens`` and ``error``
  (None on success): a text that is refused or fails does not fail the others (Ray Data jobs).
- ``stats() -> dict``: the batcher's and the encoder's statistics, and the replica's identity.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from ray import serve
from starlette.types import ASGIApp, Receive, Scope, Send

from .. import door, replica
from ..http_errors import error_response, install_error_handlers
from ..metrics import ReplicaMetrics
from ..validation import ModelNotFoundError, RequestError
from .config import EmbeddingConfig
from .embedder import Embedder, EmbeddingFailedError
from .protocol import EmbeddingBody, response

logger = logging.getLogger("serve_app")


MOUNT = "/v1/embeddings"
"""The route prefix this app takes beside the generation app (``serve_config.yaml``)."""


class MountedAtRoute:
    """Route the same way mounted or alone. Beside the generation app, with ``route_prefix:
    /v1/embeddings`` (one base URL for both), Serve hands this app that prefix as ``root_path`` and routes
    are matched relative to it; dropping the prefix's ``/v1/embeddings`` tail from ``root_path`` lets the
    routes keep their full OpenAI paths, whether the app is mounted there, under another prefix
    (``/x/v1/embeddings`` beside a generation app at ``/x``) or alone."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        root = scope.get("root_path", "")
        if scope["type"] in ("http", "websocket") and root.endswith(MOUNT):
            scope = {**scope, "root_path": root[: -len(MOUNT)]}
        await self.app(scope, receive, send)


api = FastAPI(
    title="token-batching embeddings",
    description="OpenAI embeddings from a padded encoder, batched by length under a padded-token budget.",
    version="0.2.0",
)
api.add_middleware(MountedAtRoute)
install_error_handlers(api)
door.install(api)  # API key and body limit, as on the generation app; before @serve.ingress freezes the app


@api.exception_handler(EmbeddingFailedError)
async def _failed(_: Request, exc: EmbeddingFailedError) -> Response:
    return error_response(500, str(exc))


@serve.deployment(name="EmbeddingServer")
@serve.ingress(api)
class EmbeddingServer:
    """One replica: builds its encoder and batcher, serves, and drains on shutdown."""

    async def __init__(self, config: dict[str, Any] | EmbeddingConfig) -> None:
        self.config = config if isinstance(config, EmbeddingConfig) else EmbeddingConfig.model_validate(config)
        door.configure(api, self.config)
        self.metrics = ReplicaMetrics(self.config.model_name)
        self.embedder = Embedder(self.config, self.metrics)
        self.engine = self.embedder.engine
        self.batcher = self.embedder.batcher
        await self.embedder.start()
        self._metrics_task = asyncio.get_running_loop().create_task(self._export_gauges())

    async def _export_gauges(self) -> None:
        while True:
            self.metrics.update(self.batcher.stats)
            await asyncio.sleep(1.0)

    def _check_model(self, model: str | None) -> None:
        if model is not None and model not in (self.config.model_name, self.config.model):
            raise ModelNotFoundError(
                f"The model `{model}` does not exist; this server embeds with `{self.config.model_name}`"
            )

    # -- DeploymentHandle API ------------------------------------------------------------------------

    async def embed(self, texts: list[str] | str, truncate_prompt_tokens: int | None = None) -> list[list[float]]:
        """One vector per text, in order; raises ``ValueError`` naming the first bad text."""
        return await self.embedder.vectors([texts] if isinstance(texts, str) else texts, truncate_prompt_tokens)

    async def embed_batch(self, texts: list[str], truncate_prompt_tokens: int | None = None) -> list[dict[str, Any]]:
        """One dict per text (``embedding``, ``tokens``, ``error``): a bad or failed text fails alone."""
        return await self.embedder.rows(texts, truncate_prompt_tokens)

    async def model_card(self) -> dict[str, Any]:
        """This app's entry in ``/v1/models``."""
        return replica.model_card(self.config.model_name, self.config.model, self.engine.max_length)

    async def stats(self) -> dict[str, Any]:
        """The batcher's and the encoder's statistics and who this replica is."""
        return {
            "replica": replica.identity(),
            "engine": self.engine.name,
            "device": self.engine.device,
            "model": self.config.model_name,
            "dimensions": self.engine.dimensions,
            "autoscaling": self.config.autoscaling.model_dump(),
            "engine_stats": self.engine.stats(),
            "batcher_settings": self.config.batcher.model_dump(),
            "batcher": self.batcher.stats.to_dict(),
        }

    # -- HTTP API ------------------------------------------------------------------------------------

    @api.post("/v1/embeddings")
    async def http_embeddings(self, body: EmbeddingBody) -> Response:
        """OpenAI embeddings: one vector per input, in order, with ``usage``."""
        self._check_model(body.model)
        if body.dimensions is not None and body.dimensions != self.engine.dimensions:
            raise RequestError(
                f"dimensions: this model gives {self.engine.dimensions}-dimensional vectors and cannot shorten "
                "them (it is not a Matryoshka model)",
                param="dimensions",
            )
        requests = self.embedder.inputs.requests(body.inputs(), body.truncate_prompt_tokens)
        outcomes = await self.embedder.run(requests)
        vectors = self.embedder.check(outcomes)
        tokens = sum(len(r.token_ids) for r in requests)
        return JSONResponse(response(self.config.model_name, vectors, tokens, body.encoding_format))

    @api.get("/v1/models")
    async def http_models(self) -> dict[str, Any]:
        """The embedding model (reached when this app is served alone at ``/``)."""
        return {"object": "list", "data": [await self.model_card()]}

    @api.get("/stats")
    async def http_stats(self) -> dict[str, Any]:
        """Statistics of the replica that answered (reached when this app is served alone at ``/``)."""
        return await self.stats()

    @api.get("/health")
    @api.get("/healthz")
    async def http_health(self) -> Response:
        """200 when the encoder can serve, 503 otherwise."""
        return await replica.health(self.check_health, self.engine.name, self.config.model_name)

    # -- Serve lifecycle -----------------------------------------------------------------------------

    async def check_health(self) -> None:
        """Serve's health check: fails when the encoder is dead or the batcher stopped."""
        await self.engine.check_health()
        if not self.batcher.is_running:
            raise RuntimeError("the batcher is not running")

    async def __del__(self) -> None:
        """Graceful shutdown: Serve has drained ongoing requests; finish the batcher, then the encoder."""
        if hasattr(self, "_metrics_task"):
            self._metrics_task.cancel()
        if hasattr(self, "embedder"):
            await self.embedder.stop(timeout=self.config.graceful_shutdown_timeout_s)
