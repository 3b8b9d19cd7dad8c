"""Ray Data batch inference: stream a whole dataset through the Serve app (or an in-process engine).

    import ray
    from serve_app.data import generate

    ds = ray.data.read_json("problems.jsonl", lines=True)
    out = generate(ds, app="llm", prompt_column="prompt", max_tokens=64)   # lazy; one row out per row in
    out.write_json("out/")

``generate`` wraps ``ds.map_batches(ServeGenerate, ...)``: a pool of async map actors that send each batch
of rows to the app through its ``DeploymentHandle`` as one request, with at most ``concurrency`` requests
in flight: by default what the app's autoscaling absorbs (max replicas x target ongoing requests), as the
seeds advise, so the driver neither starves nor floods the replicas.

Every input row yields exactly one output row, with its input columns plus ``text``, ``prompt_tokens``,
``output_tokens``, ``finish_reason`` and ``error`` (None on success). Transient failures (a full replica
queue, a replica restarting or dying) are retried with backoff; what still fails gets an error value in
its own rows, or fails the job with ``fail_fast=True``.

Embedding a corpus works the same way through the embedding app (``ServeEmbed``), or in-process
(``InProcessEmbed``): each row gains ``embedding`` (a list of floats; null where it failed), ``tokens``
and ``error``, and ``write_parquet`` stores the vectors as a list column::

    out = embed(ray.data.read_parquet("docs/"), app="embeddings", text_column="text")
    out.write_parquet("vectors/")
"""

from __future__ import annotations

import asyncio
import logging
import math
import random
from collections.abc import Sequence
from typing import Any, ClassVar

import numpy as np
import pyarrow as pa

from .config import AppConfig

logger = logging.getLogger(__name__)

OUTPUT_COLUMNS = ("text", "prompt_tokens", "output_tokens", "finish_reason", "error")
DEFAULT_BATCH_SIZE = 8
EMBED_BATCH_SIZE = 64
"""Rows per embedding request: texts are cheap and many, so bigger requests save per-call overhead while
the replica's batcher still cuts its own batches by length across all requests."""


class RowFailedError(RuntimeError):
    """A row failed and ``fail_fast`` was asked for."""


def _transient(exc: BaseException) -> bool:
    """Whether a handle call failure may succeed on retry (overload, a replica restarting or gone)."""
    from ray import exceptions as ray_exceptions

    from batching import BatcherStoppedError, QueueFullError

    from .engines import EngineDeadError

    cause = getattr(exc, "cause", None) or exc
    transient = (
        QueueFullError,
        BatcherStoppedError,
        EngineDeadError,
        TimeoutError,
        ray_exceptions.RayActorError,
        ray_exceptions.ActorUnavailableError,
        ray_exceptions.ObjectLostError,
    )
    try:
        from ray.serve.exceptions import BackPressureError, DeploymentUnavailableError

        transient += (BackPressureError, DeploymentUnavailableError)
    except ImportError:  # pragma: no cover - older Ray
        pass
    return isinstance(cause, transient) or isinstance(exc, transient)


def _rows_out(batch: dict[str, np.ndarray], results: Sequence[dict[str, Any]], columns: dict[str, Any]) -> Any:
    """A table of the input columns plus ``columns`` (name -> Arrow type) taken from each row's result.

    The output columns carry their Arrow types explicitly: a batch in which no row failed has only nulls in
    ``error``, which Arrow would otherwise type as ``null`` in that batch and ``string`` in another, and
    Parquet files written from such batches could not be read back as one dataset."""
    table = {name: _arrow_column(values) for name, values in batch.items()}
    for column, arrow_type in columns.items():
        table[column] = pa.array([r.get(column) for r in results], type=arrow_type)
    return pa.table(table)


def _arrow_column(values: np.ndarray) -> Any:
    """An input column as Arrow: 1-D arrays as they are, N-D ones as Ray Data's tensor column."""
    if values.ndim <= 1:
        return pa.array(values)
    from ray.data.extensions import ArrowTensorArray

    return ArrowTensorArray.from_numpy(values)


def _error_row(message: str) -> dict[str, Any]:
    return {"text": "", "prompt_tokens": 0, "output_tokens": 0, "finish_reason": "error", "error": message}


class _ServeRows:
    """``map_batches`` callable class: each batch's input column goes to a handle method of the Serve app as
    one request, which answers one dict per row (``error`` set in a row that failed alone).

    Args:
        app: the Serve application name (``serve_config.yaml``'s ``name``).
        deployment: the deployment in it.
        column: the column holding each row's input text.
        options: keyword arguments for every call (sampling fields, ``truncate_prompt_tokens``, ...).
        max_retries: retries of a transient failure, with exponential backoff from ``backoff_s``.
        fail_fast: raise on the first failed row instead of writing an error value into it.
        timeout_s: the longest one request may take (then it counts as a transient failure).
    """

    method: ClassVar[str]
    columns: ClassVar[dict[str, Any]]
    """The output columns and their Arrow types."""

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
    ) -> None:
        from ray import serve

        self.call = getattr(serve.get_deployment_handle(deployment, app_name=app), self.method)
        self.column = column
        self.options = dict(options or {})
        self.max_retries = max_retries
        self.backoff_s = backoff_s
        self.fail_fast = fail_fast
        self.timeout_s = timeout_s

    def error_row(self, message: str) -> dict[str, Any]:
        """The result of a row that failed (its output columns empty, ``error`` set)."""
        raise NotImplementedError

    async def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        if self.column not in batch:
            raise KeyError(f"no column '{self.column}' in the dataset (columns: {sorted(batch)})")
        values = [str(p) if p is not None else "" for p in batch[self.column]]
        results = await self._results(values)
        if self.fail_fast:
            for result in results:
                if result["error"] is not None:
                    raise RowFailedError(result["error"])
        return _rows_out(batch, results, self.columns)

    async def _results(self, values: list[str]) -> list[dict[str, Any]]:
        """One result per value: retried while transient; split when one bad value spoils a request."""
        for attempt in range(self.max_retries + 1):
            try:
                return await asyncio.wait_for(self.call.remote(values, **self.options), timeout=self.timeout_s)
            except ValueError as exc:  # bad input: keep the error to the rows that cause it
                if len(values) == 1:
                    return [self.error_row(f"invalid: {getattr(exc, 'cause', exc)}")]
                middle = len(values) // 2
                return await self._results(values[:middle]) + await self._results(values[middle:])
            except Exception as exc:
                if not _transient(exc) or attempt == self.max_retries:
                    message = f"{type(getattr(exc, 'cause', exc)).__name__}: {getattr(exc, 'cause', exc)}"
                    logger.warning("giving up on %d rows after %d attempts: %s", len(values), attempt + 1, message)
                    return [self.error_row(message) for _ in values]
                delay = self.backoff_s * 2**attempt * (0.5 + random.random())
                logger.info("transient failure (%s); retry %d in %.1f s", type(exc).__name__, attempt + 1, delay)
                await asyncio.sleep(delay)
        raise AssertionError("unreachable")  # pragma: no cover


class ServeGenerate(_ServeRows):
    """Each batch's prompts go to the generation app as one ``generate_batch`` request; see
    :class:`_ServeRows` for the arguments (``prompt_column`` and ``sampling`` name two of them here)."""

    method: ClassVar[str] = "generate_batch"
    columns: ClassVar[dict[str, Any]] = {
        "text": pa.string(),
        "prompt_tokens": pa.int64(),
        "output_tokens": pa.int64(),
        "finish_reason": pa.string(),
        "error": pa.string(),
    }

    def __init__(
        self,
        app: str = "llm",
        deployment: str = "LLMServer",
        prompt_column: str = "prompt",
        sampling: dict[str, Any] | None = None,
        **options: Any,
    ) -> None:
        super().__init__(app, deployment, prompt_column, sampling, **options)

    def error_row(self, message: str) -> dict[str, Any]:
        return _error_row(message)


class ServeEmbed(_ServeRows):
    """Each batch's texts go to the embedding app as one ``embed_batch`` request; rows gain ``embedding``
    (null where the row failed), ``tokens`` and ``error``. See :class:`_ServeRows` for the arguments."""

    method: ClassVar[str] = "embed_batch"
    columns: ClassVar[dict[str, Any]] = {
        "embedding": pa.list_(pa.float64()),
        "tokens": pa.int64(),
        "error": pa.string(),
    }

    def __init__(
        self,
        app: str = "embeddings",
        deployment: str = "EmbeddingServer",
        text_column: str = "text",
        truncate_prompt_tokens: int | None = None,
        **options: Any,
    ) -> None:
        super().__init__(app, deployment, text_column, {"truncate_prompt_tokens": truncate_prompt_tokens}, **options)

    def error_row(self, message: str) -> dict[str, Any]:
        return {"embedding": None, "tokens": 0, "error": message}


def app_capacity(app: str = "llm", deployment: str = "LLMServer") -> int:
    """Requests the app's autoscaling absorbs: max replicas x target ongoing requests (from a replica)."""
    from ray import serve

    info = serve.get_deployment_handle(deployment, app_name=app).stats.remote().result(timeout_s=60)
    scaling = info["autoscaling"]
    return max(1, int(scaling["max_replicas"] * scaling["target_ongoing_requests"]))


CALLS_PER_ACTOR = 128


def actor_pool(concurrency: int, actors: int | None = None) -> Any:
    """An async actor pool with at most ``concurrency`` calls (each one request) in flight in all.

    The map actors only await handle calls, so one holds ``CALLS_PER_ACTOR`` of them easily; more actors
    only cost start-up (a worker process each: about 1.5 s apiece on 2 cores, measured in the e2e benchmark).
    """
    import ray.data

    size = actors or math.ceil(concurrency / CALLS_PER_ACTOR)
    per_actor = math.ceil(concurrency / size)
    return ray.data.ActorPoolStrategy(
        size=size, max_tasks_in_flight_per_actor=per_actor, max_concurrent_calls_per_actor=per_actor
    )


def generate(
    ds: Any,
    *,
    app: str = "llm",
    deployment: str = "LLMServer",
    prompt_column: str = "prompt",
    concurrency: int | None = None,
    batch_size: int = DEFAULT_BATCH_SIZE,
    actors: int | None = None,
    fail_fast: bool = False,
    max_retries: int = 6,
    **sampling: Any,
) -> Any:
    """Stream ``ds`` through the generation app; see the module docstring. Returns a lazy Dataset."""
    kwargs = {"app": app, "deployment": deployment, "prompt_column": prompt_column, "sampling": sampling}
    return _through_app(ds, ServeGenerate, kwargs, concurrency, batch_size, actors, fail_fast, max_retries)


def embed(
    ds: Any,
    *,
    app: str = "embeddings",
    deployment: str = "EmbeddingServer",
    text_column: str = "text",
    concurrency: int | None = None,
    batch_size: int = EMBED_BATCH_SIZE,
    actors: int | None = None,
    fail_fast: bool = False,
    max_retries: int = 6,
    truncate_prompt_tokens: int | None = None,
) -> Any:
    """Stream ``ds`` through the embedding app: each row gains ``embedding``, ``tokens`` and ``error``.
    Returns a lazy Dataset; see the module docstring."""
    kwargs = {"app": app, "deployment": deployment, "text_column": text_column}
    kwargs["truncate_prompt_tokens"] = truncate_prompt_tokens
    return _through_app(ds, ServeEmbed, kwargs, concurrency, batch_size, actors, fail_fast, max_retries)


def _through_app(
    ds: Any,
    fn: type[_ServeRows],
    kwargs: dict[str, Any],
    concurrency: int | None,
    batch_size: int,
    actors: int | None,
    fail_fast: bool,
    max_retries: int,
) -> Any:
    concurrency = concurrency or app_capacity(kwargs["app"], kwargs["deployment"])
    if concurrency < 1 or batch_size < 1:
        raise ValueError(f"concurrency ({concurrency}) and batch_size ({batch_size}) must be >= 1")
    logger.info(
        "streaming through app %r: %d requests of %d rows in flight at most", kwargs["app"], concurrency, batch_size
    )
    return ds.map_batches(
        fn,
        fn_constructor_kwargs={**kwargs, "fail_fast": fail_fast, "max_retries": max_retries},
        batch_size=batch_size,
        batch_format="numpy",
        compute=actor_pool(concurrency, actors),
        num_cpus=0.1,
    )


class InProcessGenerate:
    """``map_batches`` callable class for jobs without a Serve app: each Ray actor owns one engine and one
    batcher (the seeds' in-process pattern), and concurrent batches of that actor share its batcher.

        ds.map_batches(InProcessGenerate, fn_constructor_kwargs={"config": {...}, "prompt_column": "prompt"},
                       batch_size=16, compute=ray.data.ActorPoolStrategy(size=1, max_concurrent_calls_per_actor=4))
    """

    def __init__(
        self, config: dict[str, Any] | None = None, prompt_column: str = "prompt", sampling: dict | None = None
    ) -> None:
        from .batchers import build_batcher
        from .engines import build_engine
        from .validation import RequestBuilder

        self.config = AppConfig.model_validate(config or {})
        self.engine = build_engine(self.config)
        self.requests = RequestBuilder(self.engine, self.config)
        self.options = self.requests.sampling(sampling or {})
        self.prompt_column = prompt_column
        self.batcher = build_batcher(self.config.batcher, self.engine)

    async def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        from .validation import RequestError

        if not self.batcher.is_running:
            await self.batcher.start()  # on the actor's event loop, at the first batch
        results: list[dict[str, Any] | None] = []
        futures = []
        for prompt in batch[self.prompt_column]:
            try:
                (request,) = self.requests.from_prompts([str(prompt)], self.options)
            except RequestError as exc:
                results.append(_error_row(f"invalid: {exc}"))
                continue
            results.append(None)
            futures.append(await self.batcher.submit(request))
        outcomes = iter(await asyncio.gather(*futures, return_exceptions=True))
        rows = []
        for result in results:
            if result is None:
                outcome = next(outcomes)
                result = (
                    _error_row(f"{type(outcome).__name__}: {outcome}")
                    if isinstance(outcome, BaseException)
                    else outcome.to_dict()
                )
            rows.append(result)
        return _rows_out(batch, rows, ServeGenerate.columns)


class InProcessEmbed:
    """``map_batches`` callable class for embedding jobs without a Serve app: each Ray actor owns one encoder
    and one batcher (:class:`~serve_app.embeddings.embedder.Embedder`), shared by its concurrent batches;
    rows gain ``embedding``, ``tokens`` and ``error`` as with :class:`ServeEmbed`.

        ds.map_batches(InProcessEmbed, fn_constructor_kwargs={"config": {...}, "text_column": "text"},
                       batch_size=256, compute=ray.data.ActorPoolStrategy(size=1, max_concurrent_calls_per_actor=4))
    """

    def __init__(
        self, config: dict[str, Any] | None = None, text_column: str = "text", truncate_prompt_tokens: int | None = None
    ) -> None:
        from .embeddings.config import EmbeddingConfig
        from .embeddings.embedder import Embedder

        self.embedder = Embedder(EmbeddingConfig.model_validate(config or {}))
        self.text_column = text_column
        self.truncate = truncate_prompt_tokens

    async def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        if not self.embedder.batcher.is_running:
            await self.embedder.start()  # on the actor's event loop, at the first batch
        texts = [str(t) if t is not None else "" for t in batch[self.text_column]]
        return _rows_out(batch, await self.embedder.rows(texts, self.truncate), ServeEmbed.columns)
