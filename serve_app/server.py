"""The Ray Serve deployment: one engine and one TokenBatcher per replica, reached over HTTP (FastAPI) or
through a ``DeploymentHandle``. Data flows one way: request -> validation -> batcher -> engine -> results.

Handle methods (``handle.<method>.remote(...)``):

- ``generate(prompt, **sampling) -> dict``: one prompt; raises on failure.
- ``generate_batch(prompts, **sampling) -> list[dict]``: one dict per prompt, in order, each with an
  ``error`` (None on success): a prompt that fails does not fail the others.
- ``chat(messages, **sampling) -> dict``: chat messages, with the model's chat template.
- ``stats() -> dict``: the batcher's statistics and the replica's identity.

Sampling keywords: ``max_tokens``, ``temperature``, ``top_p``, ``stop``, ``seed``. Bad input raises a
``ValueError`` naming the problem; a full queue raises :class:`batching.QueueFullError`.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
import uuid
from collections.abc import Sequence
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from ray import serve

from batching import BatcherError, BatcherStoppedError, QueueFullError, TokenBatcher

from .config import AppConfig, BatcherSettings
from .engines import EngineDeadError, GenerationRequest, GenerationResult, build_engine
from .metrics import ReplicaMetrics
from .schemas import (
    ChatCompletionRequest,
    CompletionRequest,
    GenerateRequest,
    GenerateResponse,
    PromptResult,
    SamplingFields,
    usage_of,
)
from .validation import RequestBuilder, RequestError, parse

logger = logging.getLogger("serve_app")

RETRY_AFTER_S = 1

api = FastAPI(
    title="token-batching LLM server",
    description="Token-aware batching in front of vLLM, on Ray Serve.",
    version="0.1.0",
)


class PromptFailedError(RuntimeError):
    """The engine failed one prompt of a request (the rest of its batch was unaffected)."""


def _error(status: int, message: str, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"detail": message}, status_code=status, headers=headers)


@api.exception_handler(RequestValidationError)
async def _invalid(_: Request, exc: RequestValidationError) -> Response:
    """422 naming each bad field. FastAPI's own handler echoes the input back and fails with a 500 when it
    cannot be encoded (bytes that are not UTF-8, lone surrogates): here the input is shown escaped."""
    detail = [
        {"type": e.get("type"), "loc": list(e.get("loc", ())), "msg": e.get("msg"), "input": _preview(e.get("input"))}
        for e in exc.errors()
    ]
    return Response(json.dumps({"detail": detail}, ensure_ascii=True), status_code=422, media_type="application/json")


def _preview(value: Any, limit: int = 200) -> str:
    """A short, always-encodable rendering of a bad input value."""
    text = value.decode("utf-8", "backslashreplace") if isinstance(value, bytes) else repr(value)
    text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text if len(text) <= limit else text[:limit] + "..."


@api.exception_handler(RequestError)
async def _bad_request(_: Request, exc: RequestError) -> JSONResponse:
    return _error(400, str(exc))


@api.exception_handler(QueueFullError)
async def _overloaded(_: Request, exc: QueueFullError) -> JSONResponse:
    return _error(503, f"server overloaded, retry later: {exc}", {"Retry-After": str(RETRY_AFTER_S)})


@api.exception_handler(BatcherStoppedError)
async def _stopping(_: Request, exc: BatcherStoppedError) -> JSONResponse:
    return _error(503, f"replica shutting down, retry: {exc}", {"Retry-After": str(RETRY_AFTER_S)})


@api.exception_handler(EngineDeadError)
async def _engine_dead(_: Request, exc: EngineDeadError) -> JSONResponse:
    return _error(503, f"engine unavailable, retry: {exc}", {"Retry-After": str(RETRY_AFTER_S)})


@api.exception_handler(PromptFailedError)
async def _prompt_failed(_: Request, exc: PromptFailedError) -> JSONResponse:
    return _error(500, str(exc))


@api.exception_handler(TimeoutError)
async def _timeout(_: Request, exc: TimeoutError) -> JSONResponse:
    return _error(504, f"request timed out: {exc}")


@serve.deployment(name="LLMServer")
@serve.ingress(api)
class LLMServer:
    """One replica: builds its engine and TokenBatcher, serves, and drains on shutdown."""

    async def __init__(self, config: dict[str, Any] | AppConfig) -> None:
        self.config = config if isinstance(config, AppConfig) else AppConfig.model_validate(config)
        started = time.monotonic()
        self.engine = build_engine(self.config)
        self.requests = RequestBuilder(self.engine, self.config)
        self.metrics = ReplicaMetrics(self.config.model_name)
        self.batcher = self._new_batcher(self.config.batcher)
        await self.batcher.start()
        self._aborts: set[asyncio.Task] = set()
        self._ongoing = self._peak_ongoing = 0  # requests inside the batcher now, and at most so far
        self._abandoned = 0  # prompts whose callers went away (disconnected, cancelled, timed out)
        self._metrics_task = asyncio.get_running_loop().create_task(self._export_gauges())
        logger.info(
            "replica ready in %.1f s: engine=%s model=%s",
            time.monotonic() - started,
            self.engine.name,
            self.config.model_name,
        )

    def _new_batcher(self, settings: BatcherSettings) -> TokenBatcher[GenerationRequest, GenerationResult]:
        return TokenBatcher(self._process, **settings.batcher_kwargs())

    async def _process(self, batch: list[GenerationRequest]) -> list[GenerationResult]:
        """The batcher's process_fn: one batch into the engine."""
        now = time.monotonic()
        self.metrics.observe_batch(
            len(batch),
            sum(r.estimate_tokens() for r in batch),
            [now - r.submitted_at for r in batch],
        )
        return await self.engine.generate(batch)

    async def _export_gauges(self) -> None:
        while True:
            self.metrics.update(self.batcher.stats)
            await asyncio.sleep(1.0)

    # -- The one path every entry point takes --------------------------------------------------------

    async def _run(self, requests: list[GenerationRequest]) -> list[GenerationResult]:
        """Queue validated requests (all or none: a full queue refuses the request at once) and wait."""
        try:
            futures = self.batcher.submit_batch_nowait(requests)
        except QueueFullError:
            self.metrics.rejected.inc(len(requests))
            raise
        self._ongoing += 1
        self._peak_ongoing = max(self._peak_ongoing, self._ongoing)
        try:
            outcomes = await asyncio.wait_for(
                asyncio.gather(*futures, return_exceptions=True), timeout=self.config.request_timeout_s
            )
        except BaseException:  # the caller went away (or timed out): free its places, abort its requests
            self._abandoned += len(requests)
            for future, request in zip(futures, requests):
                future.cancel()  # a no-op for those already cancelled along with the gather
                if future.cancelled():
                    self._abort_soon(request.request_id)
            raise
        finally:
            self._ongoing -= 1
        results: list[GenerationResult] = []
        for request, outcome in zip(requests, outcomes):
            if isinstance(outcome, (EngineDeadError, BatcherError)):
                raise outcome
            if isinstance(outcome, BaseException):
                outcome = GenerationResult(
                    request.request_id,
                    "",
                    len(request.prompt_token_ids),
                    0,
                    "error",
                    error=f"{type(outcome).__name__}: {outcome}",
                )
            results.append(outcome)
        return results

    def _abort_soon(self, request_id: str) -> None:
        """Abort an engine request in the background (the batcher dropped it if it had not started)."""
        task = asyncio.get_running_loop().create_task(self.engine.abort(request_id))
        self._aborts.add(task)
        task.add_done_callback(self._aborts.discard)

    @staticmethod
    def _raise_failed(results: Sequence[GenerationResult]) -> None:
        for index, result in enumerate(results):
            if result.error is not None:
                raise PromptFailedError(f"prompt {index} failed in the engine: {result.error}")

    # -- DeploymentHandle API ------------------------------------------------------------------------

    async def generate_batch(self, prompts: list[str], **sampling: Any) -> list[dict[str, Any]]:
        """Generate for each prompt; one dict per prompt, in order, with ``error`` set where it failed."""
        options = self.requests.sampling(parse(SamplingFields, sampling))
        results = await self._run(self.requests.from_prompts(prompts, options))
        return [r.to_dict() for r in results]

    async def generate(self, prompt: str, **sampling: Any) -> dict[str, Any]:
        """Generate for one prompt; raises if it fails."""
        options = self.requests.sampling(parse(SamplingFields, sampling))
        results = await self._run(self.requests.from_prompts([prompt], options))
        self._raise_failed(results)
        return results[0].to_dict()

    async def chat(self, messages: list[dict[str, str]], **sampling: Any) -> dict[str, Any]:
        """Answer a conversation (OpenAI-style ``{"role", "content"}`` messages); raises if it fails."""
        body = parse(ChatCompletionRequest, {"messages": messages, **sampling})
        options = self.requests.sampling(body)
        results = await self._run([self.requests.from_chat([m.model_dump() for m in body.messages], options)])
        self._raise_failed(results)
        return results[0].to_dict()

    async def stats(self) -> dict[str, Any]:
        """The batcher's statistics and who this replica is."""
        context = serve.get_replica_context()
        return {
            "replica": {
                "replica_id": str(context.replica_id.unique_id),
                "app": context.app_name,
                "deployment": context.deployment,
                "pid": os.getpid(),
            },
            "engine": self.engine.name,
            "model": self.config.model_name,
            "autoscaling": self.config.autoscaling.model_dump(),
            "requests": {"ongoing": self._ongoing, "peak": self._peak_ongoing, "abandoned_prompts": self._abandoned},
            "engine_stats": self.engine.stats(),
            "batcher_settings": self.config.batcher.model_dump(),
            "batcher": self.batcher.stats.to_dict(),
        }

    # -- HTTP API ------------------------------------------------------------------------------------

    @api.post("/generate", response_model=GenerateResponse)
    async def http_generate(self, body: GenerateRequest) -> GenerateResponse:
        """The seeds' endpoint: texts in ``results``, in input order."""
        options = self.requests.sampling(body)
        results = await self._run(self.requests.from_prompts(body.prompts, options))
        self._raise_failed(results)
        return GenerateResponse(
            task_id=body.task_id,
            results=[r.text for r in results],
            details=[PromptResult(**r.to_dict()) for r in results],
        )

    @api.post("/v1/completions")
    async def http_completions(self, body: CompletionRequest) -> dict[str, Any]:
        """OpenAI completions (non-streaming)."""
        self._check_model(body.model)
        options = self.requests.sampling(body)
        prompts = [body.prompt] if isinstance(body.prompt, str) else body.prompt
        results = await self._run(self.requests.from_prompts(prompts, options))
        self._raise_failed(results)
        return {
            "id": f"cmpl-{uuid.uuid4().hex}",
            "object": "text_completion",
            "created": int(time.time()),
            "model": self.config.model_name,
            "choices": [
                {"index": i, "text": r.text, "finish_reason": r.finish_reason, "logprobs": None}
                for i, r in enumerate(results)
            ],
            "usage": usage_of(results).model_dump(),
        }

    @api.post("/v1/chat/completions")
    async def http_chat_completions(self, body: ChatCompletionRequest) -> dict[str, Any]:
        """OpenAI chat completions (non-streaming), with the model's chat template."""
        self._check_model(body.model)
        if body.max_completion_tokens is not None and body.max_tokens is None:
            body.max_tokens = body.max_completion_tokens
        options = self.requests.sampling(body)
        request = self.requests.from_chat([m.model_dump() for m in body.messages], options)
        (result,) = await self._run([request])
        self._raise_failed([result])
        return {
            "id": f"chatcmpl-{uuid.uuid4().hex}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": self.config.model_name,
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": result.text},
                    "finish_reason": result.finish_reason,
                    "logprobs": None,
                }
            ],
            "usage": usage_of([result]).model_dump(),
        }

    @api.get("/v1/models")
    async def http_models(self) -> dict[str, Any]:
        """The one model this app serves, OpenAI-style."""
        return {"object": "list", "data": [{"id": self.config.model_name, "object": "model", "owned_by": "local"}]}

    @api.get("/stats")
    async def http_stats(self) -> dict[str, Any]:
        """Batcher statistics of the replica that answered, and its identity."""
        return await self.stats()

    @api.get("/healthz")
    async def http_healthz(self) -> JSONResponse:
        """200 when the engine can serve, 503 otherwise."""
        try:
            await self.check_health()
        except Exception as exc:
            return _error(503, f"unhealthy: {exc}")
        return JSONResponse({"status": "ok", "engine": self.engine.name, "model": self.config.model_name})

    def _check_model(self, model: str | None) -> None:
        if model is not None and model not in (self.config.model_name, self.config.model):
            raise RequestError(f"model '{model}' is not served here; this server serves '{self.config.model_name}'")

    # -- Serve lifecycle -----------------------------------------------------------------------------

    async def check_health(self) -> None:
        """Serve's health check: fails when the engine is dead or the batcher stopped."""
        await self.engine.check_health()
        if not self.batcher.is_running:
            raise RuntimeError("the batcher is not running")

    async def reconfigure(self, user_config: dict[str, Any]) -> None:
        """Apply new batcher knobs live (``user_config: {batcher: {...}}``): a new batcher takes new
        requests at once while the old one drains what it holds."""
        settings = BatcherSettings.model_validate(
            {**self.config.batcher.model_dump(), **user_config.get("batcher", {})}
        )
        if settings == self.config.batcher and self.batcher.is_running:
            return
        old, self.batcher = self.batcher, self._new_batcher(settings)
        await self.batcher.start()
        self.config = self.config.model_copy(update={"batcher": settings})
        logger.info("batcher reconfigured: %s", settings.model_dump())
        await old.stop()

    async def __del__(self) -> None:
        """Graceful shutdown: Serve has drained ongoing requests; finish the batcher, then the engine.
        (Any step may be missing if ``__init__`` failed part-way.)"""
        if hasattr(self, "_metrics_task"):
            self._metrics_task.cancel()
        if hasattr(self, "batcher"):
            await self.batcher.stop(timeout=self.config.graceful_shutdown_timeout_s)
            logger.info("replica drained: %s", self.batcher.stats.to_dict())
        if hasattr(self, "engine"):
            await self.engine.shutdown()
