"""The SIMULATED engine: no model, deterministic text, and time from a cost model. For tests and
benchmarks of the batching and serving logic only; it is never the default engine.

Tokenization is simulated too: one token per 4 characters. A batch sleeps for
``batch_overhead_s + prefill + decode`` where prefill is ``prefill_s_per_token`` per prompt token (batch
size x the longest prompt when ``padded``) and decode is ``step_s`` per step of the longest generation plus
``step_s_per_seq`` per generated token (per step of the longest, for every sequence, when ``padded``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence

from ..config import SimulatedSettings
from .base import Engine, EngineDeadError, GenerationRequest, GenerationResult

logger = logging.getLogger(__name__)

CHARS_PER_TOKEN = 4


class SimulatedEngine(Engine):
    """A stand-in for a model (named simulated wherever it shows): replies echo the prompt."""

    name = "simulated"

    def __init__(self, settings: SimulatedSettings) -> None:
        self.settings = settings
        self.max_model_len = settings.max_model_len
        self._dead: str | None = None
        self._running: set[str] = set()
        self._aborted: set[str] = set()
        self._counts = {"batches": 0, "requests": 0, "aborts": 0}

    def encode(self, text: str) -> list[int]:
        return [sum(text[i : i + CHARS_PER_TOKEN].encode()) for i in range(0, len(text), CHARS_PER_TOKEN)]

    def encode_chat(self, messages: Sequence[dict[str, str]]) -> tuple[list[int], str]:
        text = "".join(f"<|{m['role']}|>{m['content']}\n" for m in messages) + "<|assistant|>"
        return self.encode(text), text

    def batch_seconds(self, batch: Sequence[GenerationRequest]) -> float:
        """How long the cost model says this batch takes."""
        s = self.settings
        prompts = [len(r.prompt_token_ids) for r in batch]
        outputs = [r.sampling.max_tokens for r in batch]
        prefill = len(batch) * max(prompts) if s.padded else sum(prompts)
        decode_tokens = len(batch) * max(outputs) if s.padded else sum(outputs)
        return (
            s.batch_overhead_s
            + s.prefill_s_per_token * prefill
            + s.step_s * max(outputs)
            + s.step_s_per_seq * decode_tokens
        )

    async def generate(self, batch: list[GenerationRequest]) -> list[GenerationResult]:
        if self._dead is not None:
            raise EngineDeadError(f"simulated engine is dead: {self._dead}")
        die = self.settings.die_marker
        if die and any(die in r.prompt_text for r in batch):
            self._dead = "a prompt carried the die marker"
            logger.error("simulated engine: die marker seen; the engine is now dead")
            raise EngineDeadError("simulated engine died (die marker)")
        self._counts["batches"] += 1
        self._counts["requests"] += len(batch)
        ids = {r.request_id for r in batch}
        self._running |= ids
        try:
            await asyncio.sleep(self.batch_seconds(batch))
            bad = self.settings.raise_marker
            if bad and any(bad in r.prompt_text for r in batch):
                raise RuntimeError(f"simulated engine error in a batch of {len(batch)} (raise marker)")
            return [self._result(r) for r in batch]
        finally:
            self._running -= ids
            self._aborted -= ids

    def _result(self, request: GenerationRequest) -> GenerationResult:
        prompt_tokens = len(request.prompt_token_ids)
        if request.request_id in self._aborted:
            return GenerationResult(request.request_id, "", prompt_tokens, 0, "abort")
        fail = self.settings.fail_marker
        if fail and fail in request.prompt_text:
            return GenerationResult(
                request.request_id, "", prompt_tokens, 0, "error", error="simulated failure (fail marker)"
            )
        n = request.sampling.max_tokens
        words = request.prompt_text.split() or ["..."]
        text = " ".join(words[i % len(words)] for i in range(n))
        return GenerationResult(request.request_id, f"[simulated] {text}", prompt_tokens, n, "length")

    async def abort(self, request_id: str) -> None:
        """Abort a running request (its result becomes an "abort"); an id not running is ignored, as vLLM does."""
        if request_id in self._running:
            self._counts["aborts"] += 1
            self._aborted.add(request_id)

    def stats(self) -> dict[str, int]:
        return dict(self._counts)

    async def check_health(self) -> None:
        if self._dead is not None:
            raise EngineDeadError(f"simulated engine is dead: {self._dead}")

    async def shutdown(self) -> None:
        self._dead = self._dead or "shut down"
