"""The embedding application's builder (``import_path: serve_app.embeddings.app:build_app``).

In ``serve_config.yaml`` it runs beside the generation app with ``route_prefix: /v1/embeddings``: Serve
routes each request to the app with the longest matching prefix, so one base URL serves
``/v1/embeddings`` from here and every other route from the generation app, with no extra hop in front of
either, and each app autoscales (and can be redeployed) on its own.
"""

from __future__ import annotations

import logging
from typing import Any

from ray.serve import Application

from ..app import deployment_options
from .config import EmbeddingConfig
from .server import EmbeddingServer

logger = logging.getLogger("serve_app")


def build_app(args: dict[str, Any] | None = None) -> Application:
    """Build the embedding application from ``args`` (see :class:`~serve_app.embeddings.config.EmbeddingConfig`)."""
    config = EmbeddingConfig.model_validate(args or {})
    options = deployment_options(config)
    logger.info("building the embedding app for %s with %s", config.model_name, options)
    return EmbeddingServer.options(**options).bind(config.model_dump())
