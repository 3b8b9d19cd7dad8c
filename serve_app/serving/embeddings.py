"""The embedding deployment: a thin Serve shell over the embedding core (:class:`~serve_app.core.Embedder`),
reached over HTTP (``POST /v1/embeddings``) or through a ``DeploymentHandle``. Every route and handle method
takes the core's one path, :meth:`~serve_app.core.Embedder.run`.

Handle methods (``serve.get_app_handle("embeddings").<method>.remote(...)``):

- ``embed(texts) -> list[list[float]]``: one vector per text, in order; bad input raises ``ValueError``.
- ``embed_batch(texts) -> list[dict]``: one dict per text with ``embedding``, ``tokens`` and ``error`` (None on
  success): a text that is refused or fails does not fail the others (Ray Data jobs).
- ``stats() -> dict`` and ``model_card() -> dict``.

Served beside the generation app under ``route_prefix: /v1/embeddings`` (one base URL for both) or alone, when
``/v1/models``, ``/health`` and ``/stats`` are its own too.
"""

from __future__ import annotations

from typing import Any

import pydantic_core
from fastapi.responses import JSONResponse, Response
from ray import serve
from starlette.types import ASGIApp, Receive, Scope, Send

from ..config import EmbeddingConfig
from ..core import Embedder
from ..core.embedder import check
from ..openai.embeddings import EmbeddingRequestBody, response
from .replica import Replica, make_api

MOUNT = "/v1/embeddings"
"""The route prefix this app takes beside the generation app (``serve_config.yaml``)."""


class VectorsResponse(JSONResponse):
    """JSON rendered by pydantic's serializer (in Rust), as FastAPI renders a typed response: the floats of 16
    vectors in about a tenth of the ``json`` module's 2.7 ms, on the cores the model computes on."""

    def render(self, content: Any) -> bytes:
        return pydantic_core.to_json(content)


class MountedAtRoute:
    """Route the same way mounted or alone. Beside the generation app, with ``route_prefix: /v1/embeddings``,
    Serve hands this app that prefix as ``root_path`` and routes are matched relative to it; dropping the prefix's
    ``/v1/embeddings`` tail from ``root_path`` lets the routes keep their full OpenAI paths, whether the app is
    mounted there, under another prefix (``/x/v1/embeddings`` beside a generation app at ``/x``) or alone."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        root = scope.get("root_path", "")
        if scope["type"] in ("http", "websocket") and root.endswith(MOUNT):
            scope = {**scope, "root_path": root[: -len(MOUNT)]}
        await self.app(scope, receive, send)


api = make_api(
    "token-batching embeddings",
    "OpenAI embeddings from vLLM's pooling runner behind continuous admission, or a padded encoder batched by length.",
    MountedAtRoute,
)


@serve.deployment(name="EmbeddingServer")
@serve.ingress(api)
class EmbeddingServer(Replica):
    """One replica: the embedding core behind its HTTP route and handle methods."""

    core: Embedder

    async def __init__(self, config: dict[str, Any] | EmbeddingConfig) -> None:
        await self.setup(api, EmbeddingConfig.model_validate(config), Embedder)

    async def embed(self, texts: list[str] | str, truncate_prompt_tokens: int | None = None) -> list[list[float]]:
        """One vector per text, in order; raises ``ValueError`` naming the first bad text."""
        return await self.core.vectors([texts] if isinstance(texts, str) else texts, truncate_prompt_tokens)

    async def embed_batch(self, texts: list[str], truncate_prompt_tokens: int | None = None) -> list[dict[str, Any]]:
        """One dict per text (``embedding``, ``tokens``, ``error``): a bad or failed text fails alone."""
        return await self.core.rows(texts, truncate_prompt_tokens)

    @api.post("/v1/embeddings")
    async def http_embeddings(self, body: EmbeddingRequestBody) -> Response:
        """OpenAI embeddings: one vector per input, in order, with ``usage``."""
        inputs = self.core.inputs
        inputs.check(body)
        requests = await inputs.requests(body.inputs(), body.truncate_prompt_tokens)
        vectors = check(await self.core.run(requests))
        tokens = sum(len(r.token_ids) for r in requests)
        return VectorsResponse(response(self.config.model_name, vectors, tokens, body.encoding_format))
