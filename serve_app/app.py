"""The application builders ``serve_config.yaml`` imports: ``serve_app.app:build_app`` (generation) and
``serve_app.app:build_embeddings_app`` (embeddings). ``args`` are validated here, before any replica starts, so a
bad value fails ``serve run`` at once with pydantic's message naming the field."""

from __future__ import annotations

import logging
from typing import Any

from ray.serve import Application

from .config import AppConfig, EmbeddingConfig
from .serving.embeddings import EmbeddingServer
from .serving.ingress_router import haproxy_enabled, with_ingress_router
from .serving.llm import LLMServer
from .serving.options import deployment_options

__all__ = ["build_app", "build_embeddings_app", "deployment_options"]

logger = logging.getLogger("serve_app")


def _application(config: Any, server: Any) -> Application:
    options = deployment_options(config)
    logger.info("building %s for %s with %s", server.name, config.model_name, options)
    return server.options(**options).bind(config.model_dump())


def build_app(args: dict[str, Any] | None = None) -> Application:
    """The generation application from ``args`` (:class:`~serve_app.config.AppConfig`). Under HAProxy (serve.env)
    with the token router, HAProxy asks :class:`~serve_app.serving.ingress_router.IngressRouter` which replica
    takes each request (Serve refuses a custom router HAProxy would bypass); with one replica at most, nothing is
    asked (:attr:`~serve_app.config.AppConfig.routes_by_tokens`)."""
    config = AppConfig.model_validate(args or {})
    app = _application(config, LLMServer)
    if haproxy_enabled() and config.routes_by_tokens:
        app = with_ingress_router(app, config.routing.ingress_poll_s)
    return app


def build_embeddings_app(args: dict[str, Any] | None = None) -> Application:
    """The embedding application from ``args`` (:class:`~serve_app.config.EmbeddingConfig`)."""
    return _application(EmbeddingConfig.model_validate(args or {}), EmbeddingServer)
