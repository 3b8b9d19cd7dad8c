"""The Ray Serve deployment: one engine and one batcher per replica, reached over HTTP (FastAPI) or through
a ``DeploymentHandle``. Data flows one way: request -> validation -> batcher -> engine -> outputs, and every
entry point takes the one path :meth:`LLMServer._run_request`.

Handle methods (``handle.<method>.remote(...)``):

- ``generate(prompt, **sampling) -> dict``: one prompt; raises on failure.
- ``generate_batch(prompts, **sampling) -> list[dict]``: one dict per prompt, in order, each with an
  ``error`` (None on success): a prompt that fails does not fail the others.
- ``chat(messages, **sampling) -> dict``: chat messages, with the model's chat template.
- ``generate_stream(prompt, **sampling)`` and ``chat_stream(messages, **sampling)``: generators; call them
  with ``handle.options(stream=True)``. They yield ``{"type": "delta", "text", "output_tokens"}`` as tokens
  come, then one ``{"type": "result", ...}`` (the same dict ``generate`` returns).
- ``stats() -> dict``: the batcher's statistics and the replica's identity.

Sampling keywords: ``max_tokens``, ``temperature``, ``top_p``, ``stop``, ``seed``, and vLLM's ``top_k``,
``min_p``, ``repetition_penalty``, ``frequency_penalty``, ``presence_penalty``, ``min_tokens``,
``ignore_eos``, ... Bad input raises a ``ValueError`` naming the problem; a full queue raises
:class:`batching.QueueFullError`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Sequence
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from ray import serve

from batching import BatcherError, ContinuousBatcher, QueueFullError, TokenBatcher

from . import door, replica
from .autoscaling import replica_load
from .batchers import build_batcher
from .config import AppConfig, BatcherSettings
from .engines import (
    EngineDeadError,
    GenerationDelta,
    GenerationOutput,
    GenerationRequest,
    GenerationResult,
    build_engine,
)
from .http_errors import error_response as _error
from .http_errors import install_error_handlers
from .metrics import ReplicaMetrics
from .openai_format import DONE, ChatFormat, CompletionFormat, error_body, sse
from .schemas import (
    ChatCompletionRequest,
    CompletionRequest,
    GenerateRequest,
    GenerateResponse,
    OpenAIRequest,
    PromptResult,
    SamplingFields,
)
from .streams import FutureStream, merge
from .validation import ModelNotFoundError, RequestBuilder, RequestError, parse

logger = logging.getLogger("serve_app")

MODELS_TIMEOUT_S = 5.0
"""How long ``/v1/models`` waits for the embedding app's model card."""

api = FastAPI(
    title="token-batching LLM server",
    description="Token-aware admission and batching in front of vLLM, on Ray Serve.",
    version="0.2.0",
)
door.install(api)  # API key and body limit in front of every route; before @serve.ingress freezes the app


install_error_handlers(api)


class PromptFailedError(RuntimeError):
    """The engine failed one prompt of a request (the rest of its batch was unaffected)."""


@api.exception_handler(PromptFailedError)
async def _prompt_failed(_: Request, exc: PromptFailedError) -> Response:
    return _error(500, str(exc))


def _raise_failed(results: Sequence[GenerationResult]) -> None:
    for index, result in enumerate(results):
        if result.error is not None:
            raise PromptFailedError(f"prompt {index} failed in the engine: {result.error}")


def _stream_error(exc: BaseException) -> str:
    """An error that ends a stream already under way, as vLLM's server sends it (then ``[DONE]``)."""
    status = 503 if isinstance(exc, (QueueFullError, BatcherError, EngineDeadError)) else 500
    if isinstance(exc, TimeoutError):
        status = 504
    return sse(error_body(status, f"{type(exc).__name__}: {exc}"))


@serve.deployment(name="LLMServer")
@serve.ingress(api)
class LLMServer:
    """One replica: builds its engine and batcher, serves, and drains on shutdown."""

    async def __init__(self, config: dict[str, Any] | AppConfig) -> None:
        self.config = config if isinstance(config, AppConfig) else AppConfig.model_validate(config)
        door.configure(api, self.config)
        started = time.monotonic()
        self.engine = build_engine(self.config)
        self.requests = RequestBuilder(self.engine, self.config)
        self.metrics = ReplicaMetrics(self.config.model_name)
        self.batcher = self._new_batcher(self.config.batcher)
        await self.batcher.start()
        self._ongoing = self._peak_ongoing = 0  # requests inside the batcher now, and at most so far
        self._abandoned = 0  # prompts whose callers went away (disconnected, cancelled, timed out)
        self._metrics_task = asyncio.get_running_loop().create_task(self._export_gauges())
        logger.info(
            "replica ready in %.1f s: engine=%s model=%s batcher=%s",
            time.monotonic() - started,
            self.engine.name,
            self.config.model_name,
            self.config.batcher.mode,
        )

    def _new_batcher(self, settings: BatcherSettings) -> TokenBatcher | ContinuousBatcher:
        return build_batcher(settings, self.engine, self._process_batch, self._process_one)

    async def _process_batch(self, batch: list[GenerationRequest]) -> list[GenerationResult]:
        """Batch mode's process_fn: one batch into the engine."""
        self._observe(batch)
        return await self.engine.generate(batch)

    async def _process_one(self, request: GenerationRequest) -> AsyncIterator[GenerationOutput]:
        """Continuous mode's process_fn: one admitted request's engine stream."""
        self._observe([request])
        async for output in self.engine.stream(request):
            yield output

    def _observe(self, requests: list[GenerationRequest]) -> None:
        now = time.monotonic()
        tokens = sum(r.estimate_tokens() for r in requests)
        self.metrics.observe_batch(len(requests), tokens, [now - r.submitted_at for r in requests])

    async def _export_gauges(self) -> None:
        while True:
            self._gauged = self.batcher.stats  # also what record_autoscaling_stats reports
            self.metrics.update(self._gauged)
            await asyncio.sleep(1.0)

    # -- The one path every entry point takes --------------------------------------------------------

    def _run_request(self, requests: list[GenerationRequest]) -> AsyncIterator[tuple[int, GenerationOutput]]:
        """Queue validated requests, all or none (a full queue refuses at once: 503 + Retry-After), and
        return their outputs as ``(index, output)`` as they come; each request ends with its
        :class:`GenerationResult`. Leaving the iteration early withdraws or aborts what has not finished."""
        try:
            if isinstance(self.batcher, ContinuousBatcher):
                streams = self.batcher.stream_batch_nowait(requests)
            else:
                futures = self.batcher.submit_batch_nowait(requests)
                streams = [FutureStream(f, r.request_id, self.engine.abort) for f, r in zip(futures, requests)]
        except QueueFullError:
            self.metrics.rejected.inc(len(requests))
            raise
        return self._outputs(requests, streams)

    async def _outputs(self, requests: list[GenerationRequest], streams: list[Any]) -> AsyncIterator[Any]:
        self._ongoing += 1
        self._peak_ongoing = max(self._peak_ongoing, self._ongoing)
        finished = 0
        try:
            async for index, output in merge(streams, self.config.request_timeout_s):
                if isinstance(output, BaseException):  # this request failed alone; the others go on
                    if isinstance(output, (EngineDeadError, BatcherError)):
                        raise output
                    request = requests[index]
                    error = f"{type(output).__name__}: {output}"
                    output = GenerationResult(
                        request.request_id, "", len(request.prompt_token_ids), 0, "error", error=error
                    )
                finished += isinstance(output, GenerationResult)
                yield index, output
        finally:
            self._ongoing -= 1
            if finished < len(requests):  # the caller went away, timed out, or the engine died
                self._abandoned += len(requests) - finished
            for stream in streams:
                await stream.aclose()

    async def _results(self, requests: list[GenerationRequest]) -> list[GenerationResult]:
        """Every request's final result, in order."""
        results: list[Any] = [None] * len(requests)
        async for index, output in self._run_request(requests):
            if isinstance(output, GenerationResult):
                results[index] = output
        return results

    # -- Validation shared by the entry points -------------------------------------------------------

    def _openai(self, body: OpenAIRequest) -> Any:
        """Check an OpenAI body beyond its schema: the model, fields that cannot be honoured, stream options."""
        self._check_model(body.model)
        for field, why in body.refusals():
            raise RequestError(f"{field}: {why}", param=field)
        if body.stream_options is not None and not body.stream:
            raise RequestError("stream_options: only allowed with stream=true", param="stream_options")
        if body.stream_options is not None and body.stream_options.continuous_usage_stats:
            raise RequestError("stream_options.continuous_usage_stats: not supported", param="stream_options")
        return self.requests.sampling(body)

    def _completion_requests(self, body: CompletionRequest) -> tuple[list[GenerationRequest], list[str]]:
        options = self._openai(body)
        prompt = body.prompt
        prompts = [prompt] if isinstance(prompt, str) or (prompt and isinstance(prompt[0], int)) else prompt
        requests = self.requests.from_prompts(prompts, options, n=body.n)
        if not body.echo:
            return requests, []
        return requests, [r.prompt_text or self.engine.decode(r.prompt_token_ids) for r in requests[:: body.n]]

    def _chat_requests(self, body: ChatCompletionRequest) -> list[GenerationRequest]:
        if body.max_completion_tokens is not None:
            body.max_tokens = body.max_completion_tokens
        options = self._openai(body)
        messages = [{"role": m.role, "content": m.text()} for m in body.messages]
        return self.requests.from_chat(messages, options, n=body.n)

    def _check_model(self, model: str | None) -> None:
        if model is not None and model not in (self.config.model_name, self.config.model):
            served = self.config.model_name
            raise ModelNotFoundError(f"The model `{model}` does not exist; this server serves `{served}`")

    # -- DeploymentHandle API ------------------------------------------------------------------------

    async def generate_batch(self, prompts: list[str], **sampling: Any) -> list[dict[str, Any]]:
        """Generate for each prompt; one dict per prompt, in order, with ``error`` set where it failed."""
        options = self.requests.sampling(parse(SamplingFields, sampling))
        results = await self._results(self.requests.from_prompts(prompts, options))
        return [r.to_dict() for r in results]

    async def generate(self, prompt: str, **sampling: Any) -> dict[str, Any]:
        """Generate for one prompt; raises if it fails."""
        options = self.requests.sampling(parse(SamplingFields, sampling))
        results = await self._results(self.requests.from_prompts([prompt], options))
        _raise_failed(results)
        return results[0].to_dict()

    async def chat(self, messages: list[dict[str, Any]], **sampling: Any) -> dict[str, Any]:
        """Answer a conversation (OpenAI-style messages; any chat completions field as a keyword)."""
        body = parse(ChatCompletionRequest, {"messages": messages, **sampling, "stream": False})
        results = await self._results(self._chat_requests(body))
        _raise_failed(results)
        return results[0].to_dict()

    async def generate_stream(self, prompt: str, **sampling: Any) -> AsyncIterator[dict[str, Any]]:
        """Stream one prompt's output (``handle.options(stream=True)``): deltas, then the result."""
        options = self.requests.sampling(parse(SamplingFields, sampling))
        async for item in self._handle_stream(self.requests.from_prompts([prompt], options)):
            yield item

    async def chat_stream(self, messages: list[dict[str, Any]], **sampling: Any) -> AsyncIterator[dict[str, Any]]:
        """Stream a conversation's answer (``handle.options(stream=True)``): deltas, then the result."""
        body = parse(ChatCompletionRequest, {"messages": messages, **sampling, "stream": False})
        async for item in self._handle_stream(self._chat_requests(body)[:1]):
            yield item

    async def _handle_stream(self, requests: list[GenerationRequest]) -> AsyncIterator[dict[str, Any]]:
        async for _, output in self._run_request(requests):
            if isinstance(output, GenerationDelta):
                yield {"type": "delta", "text": output.text, "output_tokens": output.output_tokens}
            else:
                _raise_failed([output])
                yield {"type": "result", **output.to_dict()}

    async def stats(self) -> dict[str, Any]:
        """The batcher's statistics and who this replica is."""
        return {
            "replica": replica.identity(),
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
        results = await self._results(self.requests.from_prompts(body.prompts, options))
        _raise_failed(results)
        return GenerateResponse(
            task_id=body.task_id,
            results=[r.text for r in results],
            details=[PromptResult(**r.to_dict()) for r in results],
        )

    @api.post("/v1/completions")
    async def http_completions(self, body: CompletionRequest) -> Response:
        """OpenAI completions; ``"stream": true`` answers with Server-Sent Events."""
        requests, echo = self._completion_requests(body)
        return await self._openai_answer(body, requests, CompletionFormat(self.config.model_name, body.n, echo))

    @api.post("/v1/chat/completions")
    async def http_chat_completions(self, body: ChatCompletionRequest) -> Response:
        """OpenAI chat completions, with the model's chat template; ``"stream": true`` answers with SSE."""
        requests = self._chat_requests(body)
        return await self._openai_answer(body, requests, ChatFormat(self.config.model_name, body.n))

    async def _openai_answer(
        self, body: OpenAIRequest, requests: list[GenerationRequest], fmt: CompletionFormat | ChatFormat
    ) -> Response:
        """One JSON body, or (``stream``) Server-Sent Events: each request's chunks as they come."""
        if not body.stream:
            results = await self._results(requests)
            _raise_failed(results)
            return JSONResponse(fmt.response(results).model_dump(mode="json", exclude_none=True))
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        outputs = self._run_request(requests)
        results: list[Any] = [None] * len(requests)

        async def events() -> AsyncIterator[str]:
            async for index, output in outputs:
                if isinstance(output, GenerationDelta):
                    chunks = fmt.chunks(index, output.text)
                else:
                    chunks = fmt.final_chunks(index, output)
                    results[index] = output
                for chunk in chunks:
                    yield sse(chunk)

        return self._sse(events(), lambda: fmt.usage_chunk(results) if include_usage else None)

    @staticmethod
    def _sse(events: AsyncIterator[str], usage: Any) -> StreamingResponse:
        """Server-Sent Events: the chunks, the usage chunk if asked for, ``[DONE]``; an error that happens
        mid-stream is sent as an error event (the status line has already gone out)."""

        async def body() -> AsyncIterator[str]:
            try:
                async for event in events:
                    yield event
                last = usage()
                if last is not None:
                    yield sse(last)
            except Exception as exc:
                logger.warning("stream failed: %r", exc)
                yield _stream_error(exc)
            yield DONE

        return StreamingResponse(body(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"})

    @api.get("/v1/models")
    async def http_models(self) -> dict[str, Any]:
        """The model this app serves, OpenAI-style, with vLLM's ``root`` and ``max_model_len``, and the
        embedding app's model when one is configured beside it (``embeddings_app``)."""
        card = replica.model_card(self.config.model_name, self.config.model, self.engine.max_model_len)
        return {"object": "list", "data": [card, *await self._neighbour_models()]}

    async def _neighbour_models(self) -> list[dict[str, Any]]:
        """The embedding app's model card, if it is configured and answers within a few seconds."""
        name = self.config.embeddings_app
        if name is None:
            return []
        try:
            return [await asyncio.wait_for(serve.get_app_handle(name).model_card.remote(), MODELS_TIMEOUT_S)]
        except Exception as exc:  # listed when it is up; /v1/models must not fail because of it
            logger.warning("the embedding app %r did not give its model: %r", name, exc)
            return []

    @api.get("/stats")
    async def http_stats(self) -> dict[str, Any]:
        """Batcher statistics of the replica that answered, and its identity."""
        return await self.stats()

    @api.get("/health")
    @api.get("/healthz")
    async def http_health(self) -> Response:
        """200 when the engine can serve, 503 otherwise (``/health`` as vLLM's server, ``/healthz`` too)."""
        return await replica.health(self.check_health, self.engine.name, self.config.model_name)

    # -- Serve lifecycle -----------------------------------------------------------------------------

    async def record_autoscaling_stats(self) -> dict[str, float]:
        """Serve's custom autoscaling metrics (every ``look_back_period_s / 5``): the token cost this replica
        holds (batcher queue + engine), its in-flight token budget and its prompts, which
        ``autoscaling.metric: tokens`` scales on (:mod:`serve_app.autoscaling`). It reads the gauges'
        snapshot, at most 1 s old: a fresh one sorts the latency windows (about 4 ms)."""
        stats = getattr(self, "_gauged", None) or self.batcher.stats
        settings = self.config.batcher
        return replica_load(stats, settings.target_batch_tokens * settings.max_concurrent_batches)

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
