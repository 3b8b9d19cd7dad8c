"""The vLLM pooling engine (``engine: vllm``): vLLM's ``AsyncLLM`` with the pooling runner, the default embedding
engine wherever vLLM supports the model (the bundled all-MiniLM-L6-v2, a BERT, included).

vLLM packs every input it holds into one varlen batch (no padding at all), so the core admits inputs one by one
under a token budget (continuous admission) instead of cutting padded batches. Each input is one
``AsyncLLM.encode`` request with its own id; cancelling it aborts the request in vLLM. Pooling and normalisation
are the model's own sentence-transformers configuration (vLLM reads ``modules.json``: mean pooling, then L2
normalisation for all-MiniLM-L6-v2). Texts are tokenized by vLLM's own renderer, off the event loop.

    engine = PoolingEngine("bundled", PoolingSettings())
    requests = [EmbeddingRequest(str(i), ids) for i, ids in enumerate(await engine.tokenize(texts))]
    vectors = await engine.embed(requests)                  # one list[float] per request, in order
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..config.embeddings import PoolingSettings
from ..errors import EngineDeadError
from ..models import BUNDLED
from .async_llm import AsyncLLMLifecycle, has_cuda, render_tokens, start_async_llm, tokenize_texts
from .embedding import EmbeddingEngine, EmbeddingRequest
from .encoder import bundled_encoder_path

logger = logging.getLogger(__name__)

STEPS_IN_FLIGHT = 2
"""An ``auto`` in-flight budget holds this many of vLLM's scheduler steps: one running, the next one ready."""


class PoolingEngine(AsyncLLMLifecycle, EmbeddingEngine):
    """An ``AsyncLLM`` with ``runner="pooling"`` over one embedding model; on a CPU-only host vLLM's CPU build."""

    name = "vllm"
    continuous = True
    padded = False

    def __init__(
        self, model: str | Path = BUNDLED, settings: PoolingSettings | None = None, served_name: str | None = None
    ) -> None:
        """``served_name``: the model's name in the engine's metrics (vLLM's ``served_model_name``)."""
        settings = settings or PoolingSettings()
        path = str(bundled_encoder_path() if str(model) == BUNDLED else model)
        on_gpu = has_cuda()
        self.device = "cuda" if on_gpu else "cpu"
        args = {"runner": "pooling", "scheduling_policy": settings.scheduling_policy}
        if served_name:
            args["served_model_name"] = served_name
        args.update(settings.engine_args)
        try:
            self._llm: Any = start_async_llm(path, settings, on_gpu, args)
        except Exception as exc:
            raise RuntimeError(
                f"vLLM's pooling runner cannot serve {path}: {exc} (set `engine: padded` for sentence-transformers "
                "in torch)"
            ) from exc
        config = self._llm.model_config
        self.dtype = str(config.dtype).removeprefix("torch.")
        self.max_length = int(config.max_model_len)
        self.dimensions = int(config.embedding_size)
        tokenizer = self._llm.renderer.tokenizer
        self.vocab_size = len(tokenizer)
        self.special_ids = frozenset(tokenizer.all_special_ids)
        scheduler = self._llm.vllm_config.scheduler_config
        self._step_tokens = int(scheduler.max_num_batched_tokens)
        self._max_seqs = int(scheduler.max_num_seqs)
        self._dead: BaseException | None = None
        self._counts = {"inputs": 0, "tokens": 0, "aborts": 0, "failures": 0}
        logger.info(
            "vLLM pooling engine %s on %s (%s): %d dims, max %d tokens, %d tokens and %d inputs a step",
            path,
            self.device,
            self.dtype,
            self.dimensions,
            self.max_length,
            self._step_tokens,
            self._max_seqs,
        )

    async def tokenize(self, texts: Sequence[str]) -> list[list[int]]:
        """Token ids as vLLM's embeddings route tokenizes them (special tokens added), untruncated."""
        return await tokenize_texts(self._llm, texts) if texts else []

    async def embed(self, batch: list[EmbeddingRequest]) -> list[list[float]]:
        """One ``AsyncLLM.encode`` request per input, all at once (vLLM packs them into its steps)."""
        return list(await asyncio.gather(*(self._embed_one(request) for request in batch)))

    async def _embed_one(self, request: EmbeddingRequest) -> list[float]:
        from vllm import PoolingParams
        from vllm.v1.engine.exceptions import EngineDeadError as VLLMEngineDeadError

        if self._dead is not None:
            raise EngineDeadError(f"vLLM engine is dead: {self._dead!r}")
        final = None
        try:
            prompt = await render_tokens(self._llm, request.token_ids)
            async for output in self._llm.encode(prompt, PoolingParams(task="embed"), request.request_id):
                final = output
        except VLLMEngineDeadError as exc:
            self._dead = exc
            raise EngineDeadError(f"vLLM engine died: {exc}") from exc
        except asyncio.CancelledError:
            self._counts["aborts"] += 1  # AsyncLLM.encode aborted the request on its way out
            raise
        if final is None or final.error is not None or not final.finished:
            self._counts["failures"] += 1
            why = final.error.message if final is not None and final.error is not None else "no final output"
            raise RuntimeError(f"vLLM failed input {request.request_id}: {why}")
        self._counts["inputs"] += 1
        self._counts["tokens"] += len(request.token_ids)
        return final.outputs.data.float().tolist()

    def inflight_tokens(self) -> int | None:
        """Two of vLLM's scheduler steps (``max_num_batched_tokens`` each): one running, the next one ready."""
        return STEPS_IN_FLIGHT * self._step_tokens

    def max_running(self) -> int | None:
        """vLLM's cap on inputs in one step (``max_num_seqs``)."""
        return self._max_seqs

    def stats(self) -> dict[str, Any]:
        """Inputs embedded, their tokens (no padding: vLLM packs them), aborts and failures so far."""
        return dict(self._counts)
