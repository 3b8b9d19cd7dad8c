"""Ray Data jobs without a Serve app: each map actor holds one core (the seeds' in-process pattern), shared by
that actor's concurrent batches, and takes the same path as a replica's requests (timeouts, withdrawal on
cancel, per-row errors).

    ds.map_batches(InProcessGenerate, fn_constructor_kwargs={"config": {...}, "sampling": {"max_tokens": 64}},
                   batch_size=16, compute=ray.data.ActorPoolStrategy(size=1, max_concurrent_calls_per_actor=4))
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np

from ..config import AppConfig, EmbeddingConfig
from ..core import Embedder, Generator
from ..core.base import freeze_startup_heap
from ..openai.common import Origin
from .rows import EMBED_COLUMNS, GENERATE_COLUMNS, generate_columns, rows_out, texts

logger = logging.getLogger(__name__)


class _InProcess:
    """A ``map_batches`` callable class over one core, started on the actor's event loop at its first batch and
    released when Ray Data lets the actor go."""

    columns: dict[str, Any]  # a class's own, or its instance's (a generation job's with logprobs)

    def __init__(self, core: Any, column: str) -> None:
        self.core = core
        self.column = column
        self._started = False

    async def __call__(self, batch: dict[str, np.ndarray]) -> Any:
        if not self._started:
            self._started = True
            await self.core.start()
            freeze_startup_heap()
        return rows_out(batch, await self.rows(texts(batch, self.column)), self.columns)

    async def rows(self, values: list[str]) -> list[dict[str, Any]]:
        raise NotImplementedError

    def __del__(self) -> None:
        """Release the engine's processes (Ray Data deletes its actors' UDF on a graceful exit)."""
        core = getattr(self, "core", None)
        if core is not None:
            core.engine.close()


class InProcessGenerate(_InProcess):
    """Each row's prompt through the actor's generation core; rows gain ``text``, ``prompt_tokens``,
    ``output_tokens``, ``finish_reason`` and ``error`` (None on success), and ``logprobs`` where the sampling asks
    for them, as with ``ServeGenerate``.

    Args:
        config: the generation app's ``args`` (:class:`~serve_app.config.AppConfig`).
        prompt_column: the column holding each row's prompt.
        sampling: sampling fields for every row (``max_tokens``, ``temperature``, ...).
        priority, tenant: how the actor's batcher orders the rows, if the actor serves several jobs' batches.
    """

    columns: dict[str, Any] = GENERATE_COLUMNS

    def __init__(
        self,
        config: dict[str, Any] | None = None,
        prompt_column: str = "prompt",
        sampling: dict | None = None,
        priority: int = 0,
        tenant: str | None = None,
    ) -> None:
        super().__init__(Generator(AppConfig.model_validate(config or {})), prompt_column)
        self.sampling = dict(sampling or {})
        self.columns = generate_columns(self.sampling)
        self.origin = Origin(priority=priority, tenant=tenant)

    async def rows(self, values: list[str]) -> list[dict[str, Any]]:
        return await self.core.rows(values, self.sampling, self.origin)


class InProcessEmbed(_InProcess):
    """Each row's text through the actor's embedding core; rows gain ``embedding`` (null where it failed),
    ``tokens`` and ``error``, as with ``ServeEmbed``.

    Args:
        config: the embedding app's ``args`` (:class:`~serve_app.config.EmbeddingConfig`).
        text_column: the column holding each row's text.
        truncate_prompt_tokens: keep the first N tokens of a longer text (-1: the model's maximum).
    """

    columns: dict[str, Any] = EMBED_COLUMNS

    def __init__(
        self, config: dict[str, Any] | None = None, text_column: str = "text", truncate_prompt_tokens: int | None = None
    ) -> None:
        super().__init__(Embedder(EmbeddingConfig.model_validate(config or {})), text_column)
        self.truncate = truncate_prompt_tokens

    async def rows(self, values: list[str]) -> list[dict[str, Any]]:
        return await self.core.rows(values, self.truncate)
