"""The generation core: one engine, one batcher and request building, and the one path every request takes
(:meth:`Generator.run`), whoever sends it: a Serve replica's HTTP routes and handle methods, or a Ray Data actor
in process. Streaming first: a request's outputs come as the engine makes them.

    generator = Generator(AppConfig(engine="simulated"))
    await generator.start()
    requests = await generator.requests.prompts(["Hello"], generator.requests.sampling(SamplingFields()))
    async for index, output in generator.run(requests):       # deltas, then each request's GenerationResult
        ...
    await generator.stop()

A request that fails alone (the engine failed or aborted it, its batch failed) ends with a
:class:`GenerationResult` whose ``error`` says why: each entry point answers it as what it is (an error event, an
exception, an error row), never as a finished generation. What fails the whole request (a full queue, the engine
dead, the replica stopping, ``request_timeout_s``) is raised.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from typing import Any

from batching import BatcherStoppedError, ContinuousBatcher, RecordStream, TokenBatcher

from ..config import AUTO_FALLBACK_TOKENS, AppConfig, BatcherSettings
from ..engines import (
    EngineDeadError,
    GenerationDelta,
    GenerationOutput,
    GenerationRequest,
    GenerationResult,
    build_engine,
    coalesce,
    progress,
)
from ..errors import GenerationError
from ..openai.common import Origin, SamplingFields
from .base import Core, Observer
from .requests import INTERACTIVE, RequestBuilder, parse
from .rows import answer_rows, generation_error_row
from .streams import FutureStream, Place, in_background, merge

FATAL = (EngineDeadError, BatcherStoppedError)
"""Failures of the whole request (then retried elsewhere), not of one prompt."""


def succeeded(result: GenerationResult, index: int = 0) -> GenerationResult:
    """``result``, or :class:`~serve_app.errors.GenerationError` if prompt ``index`` failed."""
    if result.failed:
        raise GenerationError(f"prompt {index} failed in the engine: {result.error}")
    return result


def adapter_of(request: GenerationRequest) -> str | None:
    """The LoRA adapter ``request`` runs with (None: the base model): its group in the continuous batcher."""
    return request.sampling.adapter


def check(results: Sequence[GenerationResult]) -> list[GenerationResult]:
    """``results``, or :class:`~serve_app.errors.GenerationError` for the first that failed."""
    return [succeeded(result, index) for index, result in enumerate(results)]


class Generator(Core[AppConfig, BatcherSettings]):
    """The generation core (see the module's docstring)."""

    def __init__(self, config: AppConfig, observer: Observer | None = None) -> None:
        engine = build_engine(config)
        self.requests = RequestBuilder(engine, config)
        self._places: dict[str, Place] = {}  # requests queued to be read in place, by id, until admitted
        self._in_place = False  # whether the batcher only admits requests, whose own tasks read the engine
        super().__init__(config, engine, observer)

    async def set_runtime_adapters(self, runtime: dict[str, str]) -> None:
        """Serve the ``lora.adapters`` setting's adapters and ``runtime`` (name -> folder, loaded at run time):
        requests may name them from now on, and the engine forgets an adapter no longer among them."""
        adapters = {**runtime, **(self.config.lora.adapters if self.config.lora is not None else {})}
        self.requests.adapters = adapters
        await self.engine.set_adapters(adapters)

    def _new_batcher(self, settings: BatcherSettings) -> TokenBatcher | ContinuousBatcher:
        """``settings.mode``'s batcher; ``auto`` sizes come from the engine (its KV cache, its running cap, its step
        figure for lower priorities)."""
        engine = self.engine
        if settings.mode == "batch":
            kwargs = settings.batcher_kwargs(engine.kv_cache_tokens() or AUTO_FALLBACK_TOKENS)
            self.budget = kwargs["target_batch_tokens"] * kwargs["max_concurrent_batches"]
            return TokenBatcher(self._process_batch, **kwargs)
        kwargs = settings.batcher_kwargs(
            engine.kv_cache_tokens(), engine.max_running(), engine.low_priority_step_tokens()
        )
        self.budget = kwargs["max_inflight_cost"]
        lora = self.config.lora  # queue_adapters: at most max_loaded adapters in the engine, plus the one on deck;
        if lora is not None and lora.queue_adapters:  # otherwise vLLM's scheduler holds what has no slot yet
            kwargs.update(group_fn=adapter_of, max_groups=lora.max_loaded, on_deck=True)
        size = engine.prefix_block_size() if settings.shared_prefixes else None
        if size:  # a shared prompt's blocks count once, as the engine's prefix cache holds them once
            kwargs.update(prefix_fn=lambda request: request.prefix_blocks(size), block_cost=size)
        # Read in place where the batcher needs no output but the first: no peak estimate, no pacing.
        self._in_place = engine.tracks_requests and not (settings.peak_estimate or settings.stream_interval_s)
        process = self._hold if self._in_place else self._process_one
        return ContinuousBatcher(process, progress_fn=progress, coalesce_fn=coalesce, **kwargs)

    async def _process_batch(self, batch: list[GenerationRequest]) -> list[GenerationResult]:
        """Batch mode: one batch into the engine."""
        self._started(batch, batch=True)
        return await self.engine.generate(batch)

    async def _process_one(self, request: GenerationRequest) -> AsyncIterator[GenerationOutput]:
        """Continuous mode: one admitted request's engine stream."""
        self._started([request], batch=False)
        async for output in self.engine.stream(request):
            yield output

    async def _hold(self, request: GenerationRequest) -> AsyncIterator[str]:
        """Continuous mode, read in place: an admitted request's place, held while its reader reads the engine
        (:meth:`_read`). If the batcher withdraws it (a stop timed out), the engine aborts it and the reader ends."""
        place = self._places.pop(request.request_id)
        self._started([request], batch=False)
        try:
            async for marker in place.hold(lambda: self.engine.running(request.request_id)):
                yield marker
        except asyncio.CancelledError:
            if not place.done:
                in_background(self.engine.abort(request.request_id))
            raise

    async def _read(self, request: GenerationRequest, record: RecordStream, place: Place) -> AsyncIterator[Any]:
        """Read in place: once the batcher admits ``request``, its engine stream, read in the caller's own task; an
        abort that the batcher's withdrawal caused ends it with the batcher's error. Leaving early withdraws it."""
        place.reading = True
        outputs = self.engine.stream(request)
        done = False
        try:
            await record.admitted()
            first = True
            async for output in outputs:
                if first:
                    place.started()
                    first = False
                if output.__class__ is GenerationResult:
                    place.end()
                    done = True
                    failure = record.failure() if output.finish_reason == "abort" else None
                    if failure is not None:
                        raise failure
                yield output
        except Exception as exc:
            if not done:
                place.end(exc)
                done = True
            raise
        finally:
            self._places.pop(request.request_id, None)
            await outputs.aclose()
            if not done:
                place.end()
                await record.aclose()

    # -- The one path --------------------------------------------------------------------------------------

    def run(self, requests: list[GenerationRequest]) -> AsyncIterator[tuple[int, GenerationOutput]]:
        """Queue ``requests``, all or none (a full queue raises :class:`~batching.QueueFullError` at once), and
        yield their outputs as ``(index, output)`` as they come; each request ends with its result. Leaving the
        iteration early withdraws or aborts what has not finished."""
        if isinstance(self.batcher, ContinuousBatcher) and self._in_place:
            places = {request.request_id: Place() for request in requests}
            self._places.update(places)
            try:
                records = self._queue(self.batcher.stream_batch_nowait, requests)
            except BaseException:
                for request in requests:
                    self._places.pop(request.request_id, None)
                raise
            streams = [self._read(r, record, places[r.request_id]) for r, record in zip(requests, records)]
        elif isinstance(self.batcher, ContinuousBatcher):
            streams = self._queue(self.batcher.stream_batch_nowait, requests)
        else:
            futures = self._queue(self.batcher.submit_batch_nowait, requests)
            streams = [FutureStream(f, r.request_id, self.engine.abort) for f, r in zip(futures, requests)]
        return self._outputs(requests, streams)

    async def _outputs(self, requests: list[GenerationRequest], streams: list[Any]) -> AsyncIterator[Any]:
        with self._holding(len(requests)) as finished:
            merged = merge(streams, self.config.request_timeout_s)
            try:
                async for index, output in merged:
                    if output.__class__ is GenerationDelta:  # most outputs: nothing to look at
                        yield index, output
                        continue
                    if isinstance(output, FATAL):
                        raise output
                    if isinstance(output, BaseException):  # this request failed alone (its batch failed, ...)
                        output = GenerationResult.failure(requests[index], f"{type(output).__name__}: {output}")
                    elif isinstance(output, GenerationResult) and output.finish_reason == "abort":
                        error = "the engine aborted it before it finished"
                        output = GenerationResult.failure(requests[index], error, output.output_tokens)
                    if isinstance(output, GenerationResult):
                        finished[0] += 1
                    yield index, output
            finally:
                await merged.aclose()  # first: its tasks no longer read the streams
                for stream in streams:
                    await stream.aclose()

    async def results(self, requests: list[GenerationRequest]) -> list[GenerationResult]:
        """Every request's final result, in order (a failed one with its ``error``)."""
        results: list[Any] = [None] * len(requests)
        async for index, output in self.run(requests):
            if isinstance(output, GenerationResult):
                results[index] = output
        return results

    async def complete(self, requests: list[GenerationRequest]) -> list[GenerationResult]:
        """Every request's result, in order, or :class:`~serve_app.errors.GenerationError` if one failed."""
        return check(await self.results(requests))

    async def rows(
        self, prompts: Sequence[Any], sampling: dict[str, Any] | SamplingFields, origin: Origin = INTERACTIVE
    ) -> list[dict[str, Any]]:
        """One dict per prompt (``text``, ``prompt_tokens``, ``output_tokens``, ``finish_reason``, ``error``): a
        prompt that is refused or fails gets its ``error`` in its own row; the others go on."""
        fields = sampling if isinstance(sampling, SamplingFields) else parse(SamplingFields, sampling)
        rows = await self.requests.rows(prompts, self.requests.sampling(fields), origin=origin)
        return await answer_rows(rows, self.results, lambda _, result: result.to_dict(), generation_error_row)
