"""The map actors of a Ray Data job through the Serve apps: ``map_batches`` callable classes that send each batch
of rows to an app's handle method as one request and turn its answers into the batch's output rows (one per input
row, an error value in a failed one), retrying what the error table calls retryable."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, ClassVar

import numpy as np

from ..core.rows import chat_error_row, embedding_error_row, generation_error_row
from .progress import report
from .retries import Retries
from .rows import CHAT_COLUMNS, EMBED_COLUMNS, GENERATE_COLUMNS, conversations, generate_columns, rows_out, texts

logger = logging.getLogger(__name__)


class RowFailedError(RuntimeError):
    """A row failed and ``fail_fast`` was asked for."""


class _ServeRows:
    """``map_batches`` callable class: each batch's input column goes to a handle method of a Serve app as one
    request, which answers one dict per row.

    Args:
        app: the Serve application name (``serve_config.yaml``'s ``name``).
        deployment: the deployment in it.
        column: the column holding each row's input text.
        options: keyword arguments for every call (sampling fields, ``truncate_prompt_tokens``, ...).
        max_retries: retries of a retryable failure, with exponential backoff from ``backoff_s``.
        fail_fast: raise on the first failed row instead of writing an error value into it.
        timeout_s: the longest one request may take (then it counts as retryable).
        progress: a :mod:`~serve_app.data.progress` counter actor told of every finished batch, or None.
    """

    method: ClassVar[str]
    columns: dict[str, Any]  # a class's own, or its instance's (a generation job's with logprobs)
    tokens_key: ClassVar[str]
    error_row: ClassVar[Callable[[str], dict[str, Any]]]

    def __init__(
        self,
        app: str,
        deployment: str,
        column: str,
        options: dict[str, Any] | None = None,
        max_retries: int = 6,
        backoff_s: float = 0.5,
        fail_fast: bool = False,
        timeout_s: float = 600.0,
        progress: Any = None,
    ) -> None:
        self.call = getattr(app_handle(app, deployment), self.method)
        self.column = column
        self.options = dict(options or {})
        self.retries = Retries(max_retries, backoff_s, timeout_s)
        self.fail_fast = fail_fast
        self.progress = progress

    def inputs(self, batch: dict[str, np.ndarray]) -> list[Any]:
        """The batch's inputs as the handle method takes them: its column's texts."""
        return texts(batch, self.column)

    async def __call__(self, batch: dict[str, np.ndarray]) -> Any:
        results = await self._results(self.inputs(batch))
        report(self.progress, results, self.tokens_key)
        if self.fail_fast:
            for result in results:
                if result["error"] is not None:
                    raise RowFailedError(result["error"])
        return rows_out(batch, results, self.columns)

    async def _results(self, values: list[Any]) -> list[dict[str, Any]]:
        """One result per value; the call retried while its failure is retryable."""
        try:
            return await self.retries.call(lambda: self.call.remote(values, **self.options))
        except Exception as exc:
            cause = getattr(exc, "cause", None) or exc
            if isinstance(cause, ValueError):  # the job's own arguments are bad: every row says so
                return [type(self).error_row(f"invalid: {cause}") for _ in values]
            message = f"{type(cause).__name__}: {cause}"
            logger.warning("giving up on %d rows: %s", len(values), message)
            return [type(self).error_row(message) for _ in values]


class ServeGenerate(_ServeRows):
    """Each batch's prompts go to the generation app as one ``generate_batch`` request (rows gain ``logprobs`` too
    where ``sampling`` asks for them); see :class:`_ServeRows` for the arguments (``prompt_column`` and
    ``sampling`` name two of them here)."""

    method: ClassVar[str] = "generate_batch"
    tokens_key: ClassVar[str] = "output_tokens"
    columns: dict[str, Any] = GENERATE_COLUMNS
    error_row = staticmethod(generation_error_row)

    def __init__(
        self,
        app: str = "llm",
        deployment: str = "LLMServer",
        prompt_column: str = "prompt",
        sampling: dict[str, Any] | None = None,
        **options: Any,
    ) -> None:
        super().__init__(app, deployment, prompt_column, sampling, **options)
        self.columns = generate_columns(sampling)


class ServeChat(_ServeRows):
    """Each batch's conversations go to the generation app as one ``chat_batch`` request, with the same chat fields
    (``fields``: tools, ``tool_choice``, sampling, ...); see :class:`_ServeRows` for the other arguments."""

    method: ClassVar[str] = "chat_batch"
    tokens_key: ClassVar[str] = "output_tokens"
    columns: dict[str, Any] = CHAT_COLUMNS
    error_row = staticmethod(chat_error_row)

    def __init__(
        self,
        app: str = "llm",
        deployment: str = "LLMServer",
        messages_column: str = "messages",
        fields: dict[str, Any] | None = None,
        **options: Any,
    ) -> None:
        super().__init__(app, deployment, messages_column, fields, **options)

    def inputs(self, batch: dict[str, np.ndarray]) -> list[Any]:
        """The batch's conversations (lists of message dicts)."""
        return conversations(batch, self.column)


class ServeEmbed(_ServeRows):
    """Each batch's texts go to the embedding app as one ``embed_batch`` request; rows gain ``embedding`` (null
    where the row failed), ``tokens`` and ``error``. See :class:`_ServeRows` for the arguments."""

    method: ClassVar[str] = "embed_batch"
    tokens_key: ClassVar[str] = "tokens"
    columns: dict[str, Any] = EMBED_COLUMNS
    error_row = staticmethod(embedding_error_row)

    def __init__(
        self,
        app: str = "embeddings",
        deployment: str = "EmbeddingServer",
        text_column: str = "text",
        truncate_prompt_tokens: int | None = None,
        **options: Any,
    ) -> None:
        super().__init__(app, deployment, text_column, {"truncate_prompt_tokens": truncate_prompt_tokens}, **options)


def app_handle(app: str, deployment: str) -> Any:
    """The handle of ``deployment`` in the running Serve app ``app``; a ``ValueError`` naming them if there is none."""
    from ray import serve

    try:
        return serve.get_deployment_handle(deployment, app_name=app)
    except KeyError:
        running = sorted(serve.status().applications)
        raise ValueError(f"no deployment {deployment!r} in a Serve app {app!r} (apps running: {running})") from None
