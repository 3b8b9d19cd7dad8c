"""The SIMULATED engine's stepper: continuous batching (or padded batches) on a cost model; the package's
docstring says how."""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any

from ...config import SimulatedSettings
from ..base import Engine, EngineDeadError, GenerationDelta, GenerationOutput, GenerationRequest, GenerationResult
from ..outputs import coalesce
from ..parsers import OutputParsers
from .adapters import AdapterSlots
from .prefix_cache import PrefixCache
from .sequence import SimulatedSequence
from .text import SimulatedText

logger = logging.getLogger(__name__)


class SimulatedEngine(Engine):
    """A stand-in for a model (named simulated wherever it shows)."""

    name = "simulated"

    def __init__(
        self,
        settings: SimulatedSettings,
        tokenizer: str | None = None,
        parsers: OutputParsers | None = None,
        max_adapters: int = 1,
    ) -> None:
        """``tokenizer``: a model folder whose tokenizer it uses; ``parsers``: vLLM's, over that tokenizer;
        ``max_adapters``: the LoRA adapters it holds loaded and runs in one step (vLLM's ``max_loras``)."""
        self.settings = settings
        self.adapter_slots = max_adapters
        self._adapters = AdapterSlots(max_adapters)
        self.text = SimulatedText(settings, tokenizer)
        if self.text.tokenizer is not None:
            self.parsers = parsers.over(self.text.tokenizer) if parsers is not None else None
        self.max_model_len = settings.max_model_len
        self.continuous = self.tracks_requests = not settings.padded
        self._dead: str | None = None
        self._waiting: deque[SimulatedSequence] = deque()
        self._running: list[SimulatedSequence] = []
        self._by_id: dict[str, SimulatedSequence] = {}
        self._wake: asyncio.Event | None = None
        self._stepper: asyncio.Task | None = None
        self._prefixes = PrefixCache(settings.kv_cache_tokens) if settings.prefix_caching else None
        counts = ("batches", "steps", "requests", "aborts", "peak_running", "adapter_loads")
        self._counts = dict.fromkeys((*counts, "prompt_tokens", "cached_prompt_tokens"), 0)

    async def encode(self, texts: Sequence[str], add_special_tokens: bool = True) -> list[list[int]]:
        return [self.text.encode(text) for text in texts]  # its prompts carry no special tokens either way

    async def encode_chat(
        self,
        messages: Sequence[dict[str, Any]],
        tools: Sequence[dict[str, Any]] | None = None,
        template: Mapping[str, Any] | None = None,
    ) -> tuple[list[int], str]:
        text = self.text.chat(messages, tools, template)
        return self.text.encode(text), text

    async def decode(self, token_ids: Sequence[int]) -> str:
        return self.text.decode(token_ids)

    def kv_cache_tokens(self) -> int | None:
        return self.settings.kv_cache_tokens

    def prefix_block_size(self) -> int | None:
        return self._prefixes.block_tokens if self._prefixes is not None else None

    def max_running(self) -> int | None:
        return self.settings.max_num_seqs

    # -- Continuous batching -------------------------------------------------------------------------

    def _admit(self, request: GenerationRequest) -> GenerationResult | None:
        """Markers and health, before a request enters: a final result when it fails at once."""
        if self._dead is not None:
            raise EngineDeadError(f"simulated engine is dead: {self._dead}")
        die = self.settings.die_marker
        if die and die in request.prompt_text:
            self._die("a prompt carried the die marker")
            raise EngineDeadError("simulated engine died (die marker)")
        self._counts["requests"] += 1
        fail = self.settings.fail_marker
        if fail and fail in request.prompt_text:
            return GenerationResult.failure(request, "simulated failure (fail marker)")
        return None

    async def stream(self, request: GenerationRequest) -> AsyncIterator[GenerationOutput]:
        if not self.continuous:
            async for output in super().stream(request):
                yield output
            return
        failed = self._admit(request)
        if failed is not None:
            yield failed
            return
        sequence = SimulatedSequence(request, self.text.script(request.prompt_text))
        self._waiting.append(sequence)
        self._by_id[request.request_id] = sequence
        self._kick()
        queue, later = sequence.outputs, None
        try:
            while True:
                output, later = later if later is not None else await queue.get(), None
                while output.__class__ is GenerationDelta and not queue.empty():  # a reader that fell behind
                    later = queue.get_nowait()  # takes the deltas waiting as one, as vLLM's output collector has them
                    joined = coalesce(output, later) if not isinstance(later, BaseException) else None
                    if joined is None:
                        break
                    output, later = joined, None
                if isinstance(output, BaseException):
                    raise output
                yield output
                if isinstance(output, GenerationResult):
                    return
        finally:
            if not sequence.finished:  # the consumer went away: abort, as vLLM does on cancellation
                sequence.finished = True
                self._counts["aborts"] += 1
                if sequence in self._waiting:
                    self._waiting.remove(sequence)
            self._by_id.pop(request.request_id, None)

    def running(self, request_id: str) -> bool:
        sequence = self._by_id.get(request_id)
        return sequence is not None and not sequence.finished

    def _kick(self) -> None:
        if self._stepper is None or self._stepper.done():
            self._wake = asyncio.Event()
            self._stepper = asyncio.get_running_loop().create_task(self._steps(), name="simulated-engine-steps")
        self._wake.set()

    def step_seconds(self, running: Sequence[SimulatedSequence]) -> float:
        """How long the cost model says one decode step over ``running`` takes."""
        s = self.settings
        prefill = sum(len(q.request.prompt_token_ids) - (q.cached or 0) for q in running if not q.prefilled)
        context = sum(q.context() for q in running)
        return (
            s.step_s + s.step_s_per_seq * len(running) + s.step_s_per_token * context + s.prefill_s_per_token * prefill
        )

    async def _steps(self) -> None:
        """The engine loop: fill free places from the waiting queue, advance every running sequence."""
        while self._dead is None:
            running = self._running = [q for q in self._running if not q.finished]
            self._fill(running)
            if not running:
                self._wake.clear()
                await self._wake.wait()
                continue
            self._counts["peak_running"] = max(self._counts["peak_running"], len(running))
            loads = self._load_adapters(running)
            await asyncio.sleep(self.step_seconds(running) + loads * self.settings.adapter_load_s)
            self._counts["steps"] += 1
            for sequence in running:
                if not sequence.finished:
                    self._advance(sequence)

    def _fill(self, running: list[SimulatedSequence]) -> None:
        """Start waiting sequences while there is room, in order, except one whose adapter would make the step's
        adapters more than ``max_adapters`` (it waits for a place, as in vLLM's scheduler)."""
        adapters = {q.request.sampling.adapter for q in running} - {None}
        skipped: list[SimulatedSequence] = []
        while len(running) < self.settings.max_num_seqs and self._waiting:
            sequence = self._waiting.popleft()
            adapter = sequence.request.sampling.adapter
            if adapter is not None and adapter not in adapters:
                if len(adapters) >= self.adapter_slots:
                    skipped.append(sequence)
                    continue
                adapters.add(adapter)
            if self._prefixes is not None:
                sequence.cached = self._prefixes.admit(sequence.request.prompt_token_ids)
            running.append(sequence)
        self._waiting.extendleft(reversed(skipped))

    def _load_adapters(self, running: Sequence[SimulatedSequence]) -> int:
        """Load the adapters the step runs that the engine does not hold (the least recently used go); how many."""
        loads = self._adapters.load(q.request.sampling.adapter for q in running)
        self._counts["adapter_loads"] += loads
        return loads

    async def loaded_adapters(self) -> list[str]:
        return self._adapters.held()

    async def set_adapters(self, adapters: dict[str, str]) -> None:
        self._adapters.keep(adapters)

    def _advance(self, sequence: SimulatedSequence) -> None:
        request = sequence.request
        sequence.prefilled = True
        if sequence.aborted:
            self._finish(sequence, "abort")
            return
        sequence.produced += 1
        done = sequence.produced >= sequence.limit
        if done or sequence.sent == 0 or sequence.produced - sequence.sent >= (request.sampling.stream_interval or 1):
            new = range(sequence.sent, sequence.produced)  # as vLLM streams: the first token and the end at once
            text, ids = "".join(sequence.token_text(i) for i in new), tuple(sequence.token_id(i) for i in new)
            sequence.outputs.put_nowait(GenerationDelta(request.request_id, text, sequence.produced, token_ids=ids))
            sequence.sent = sequence.produced
        if done:
            bad = self.settings.raise_marker
            if bad and bad in request.prompt_text:
                sequence.finished = True
                sequence.outputs.put_nowait(RuntimeError("simulated engine error (raise marker)"))
                return
            self._finish(sequence, sequence.end_reason())

    def _finish(self, sequence: SimulatedSequence, reason: str) -> None:
        sequence.finished = True
        produced = sequence.produced
        text = "".join(sequence.token_text(i) for i in range(produced))
        request = sequence.request
        ids = tuple(sequence.token_id(i) for i in range(produced))
        prompt = len(request.prompt_token_ids)
        self._counts["prompt_tokens"] += prompt
        self._counts["cached_prompt_tokens"] += sequence.cached or 0
        sequence.outputs.put_nowait(
            GenerationResult(
                request.request_id, text, prompt, produced, reason, token_ids=ids, cached_tokens=sequence.cached
            )
        )

    def _die(self, reason: str) -> None:
        self._dead = reason
        logger.error("simulated engine: %s; the engine is now dead", reason)
        for sequence in [*self._running, *self._waiting]:
            if not sequence.finished:
                sequence.finished = True
                sequence.outputs.put_nowait(EngineDeadError(f"simulated engine died: {reason}"))
        if self._wake is not None:
            self._wake.set()

    # -- Static, padded batches ----------------------------------------------------------------------

    def batch_seconds(self, batch: Sequence[GenerationRequest]) -> float:
        """How long the padded cost model says this batch takes."""
        s = self.settings
        prompts = [len(r.prompt_token_ids) for r in batch]
        outputs = [r.sampling.max_tokens for r in batch]
        return (
            s.batch_overhead_s
            + s.prefill_s_per_token * len(batch) * max(prompts)
            + s.step_s * max(outputs)
            + s.step_s_per_seq * len(batch) * max(outputs)
        )

    async def generate(self, batch: list[GenerationRequest]) -> list[GenerationResult]:
        if self.continuous:
            return await super().generate(batch)
        failed = [self._admit(r) for r in batch]
        self._counts["batches"] += 1
        ids = {r.request_id for r in batch}
        self._by_id.update({r.request_id: SimulatedSequence(r, self.text.script(r.prompt_text)) for r in batch})
        try:
            await asyncio.sleep(self.batch_seconds(batch))
            bad = self.settings.raise_marker
            if bad and any(bad in r.prompt_text for r in batch):
                raise RuntimeError(f"simulated engine error in a batch of {len(batch)} (raise marker)")
            results = []
            for request, failure in zip(batch, failed):
                sequence = self._by_id[request.request_id]
                if failure is not None:
                    results.append(failure)
                    continue
                if not sequence.aborted:
                    sequence.produced = sequence.limit
                self._finish(sequence, "abort" if sequence.aborted else sequence.end_reason())
                results.append(sequence.outputs.get_nowait())
            return results
        finally:
            for request_id in ids:
                self._by_id.pop(request_id, None)

    # -- Lifecycle -----------------------------------------------------------------------------------

    async def abort(self, request_id: str) -> None:
        """Abort a running request (it ends with finish reason "abort"); an unknown id is ignored, as in vLLM."""
        sequence = self._by_id.get(request_id)
        if sequence is not None and not sequence.finished and not sequence.aborted:
            self._counts["aborts"] += 1
            sequence.aborted = True

    def stats(self) -> dict[str, int]:
        return {**self._counts, "running": len(self._running), "waiting": len(self._waiting)}

    async def check_health(self) -> None:
        if self._dead is not None:
            raise EngineDeadError(f"simulated engine is dead: {self._dead}")

    async def shutdown(self) -> None:
        self._die(self._dead or "shut down")
        if self._stepper is not None:
            self._stepper.cancel()
