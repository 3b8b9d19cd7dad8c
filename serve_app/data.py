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
"""

from __future__ import annotations

import asyncio
import logging
import math
import random
from collections.abc import Sequence
from typing import Any

import numpy as np

from .config import AppConfig

logger = logging.getLogger(__name__)

OUTPUT_COLUMNS = ("text", "prompt_tokens", "output_tokens", "finish_reason", "error")
DEFAULT_BATCH_SIZE = 8


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


def _rows_out(batch: dict[str, np.ndarray], results: Sequence[dict[str, Any]]) -> dict[str, np.ndarray]:
    out = dict(batch)
    for column in OUTPUT_COLUMNS:
        values = [r.get(column) for r in results]
        out[column] = np.array(values, dtype=object if column in ("text", "finish_reason", "error") else np.int64)
    return out


def _error_row(message: str) -> dict[str, Any]:
    return {"text": "", "prompt_tokens": 0, "output_tokens": 0, "finish_reason": "error", "error": message}


class ServeGenerate:
    """``map_batches`` callable class: each batch goes to the Serve app as one ``generate_batch`` request.

    Args:
        app: the Serve application name (``serve_config.yaml``'s ``name``).
        deployment: the deployment in it.
        prompt_column: the column holding prompt text.
        sampling: sampling fields for every row (``max_tokens``, ``temperature``, ...).
        max_retries: retries of a transient failure, with exponential backoff from ``backoff_s``.
        fail_fast: raise on the first failed row instead of writing an error value into it.
        timeout_s: the longest one request may take (then it counts as a transient failure).
    """

    def __init__(
        self,
        app: str = "llm",
        deployment: str = "LLMServer",
        prompt_column: str = "prompt",
        sampling: dict[str, Any] | None = None,
        max_retries: int = 6,
        backoff_s: float = 0.5,
        fail_fast: bool = False,
        timeout_s: float = 600.0,
    ) -> None:
        from ray import serve

        self.handle = serve.get_deployment_handle(deployment, app_name=app)
        self.prompt_column = prompt_column
        self.sampling = dict(sampling or {})
        self.max_retries = max_retries
        self.backoff_s = backoff_s
        self.fail_fast = fail_fast
        self.timeout_s = timeout_s

    async def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        if self.prompt_column not in batch:
            raise KeyError(f"no column '{self.prompt_column}' in the dataset (columns: {sorted(batch)})")
        prompts = [str(p) if p is not None else "" for p in batch[self.prompt_column]]
        results = await self._generate(prompts)
        if self.fail_fast:
            for result in results:
                if result["error"] is not None:
                    raise RowFailedError(result["error"])
        return _rows_out(batch, results)

    async def _generate(self, prompts: list[str]) -> list[dict[str, Any]]:
        """Results for ``prompts``: retried while transient; split when one bad prompt spoils a request."""
        for attempt in range(self.max_retries + 1):
            try:
                call = self.handle.generate_batch.remote(prompts, **self.sampling)
                return await asyncio.wait_for(call, timeout=self.timeout_s)
            except ValueError as exc:  # bad input: keep the error to the rows that cause it
                if len(prompts) == 1:
                    return [_error_row(f"invalid: {getattr(exc, 'cause', exc)}")]
                middle = len(prompts) // 2
                return await self._generate(prompts[:middle]) + await self._generate(prompts[middle:])
            except Exception as exc:
                if not _transient(exc) or attempt == self.max_retries:
                    message = f"{type(getattr(exc, 'cause', exc)).__name__}: {getattr(exc, 'cause', exc)}"
                    logger.warning("giving up on %d rows after %d attempts: %s", len(prompts), attempt + 1, message)
                    return [_error_row(message) for _ in prompts]
                delay = self.backoff_s * 2**attempt * (0.5 + random.random())
                logger.info("transient failure (%s); retry %d in %.1f s", type(exc).__name__, attempt + 1, delay)
                await asyncio.sleep(delay)
        raise AssertionError("unreachable")  # pragma: no cover


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
    """Stream ``ds`` through the Serve app; see the module docstring. Returns a lazy Dataset."""
    concurrency = concurrency or app_capacity(app, deployment)
    if concurrency < 1 or batch_size < 1:
        raise ValueError(f"concurrency ({concurrency}) and batch_size ({batch_size}) must be >= 1")
    logger.info("streaming through app %r: %d requests of %d rows in flight at most", app, concurrency, batch_size)
    return ds.map_batches(
        ServeGenerate,
        fn_constructor_kwargs={
            "app": app,
            "deployment": deployment,
            "prompt_column": prompt_column,
            "sampling": sampling,
            "fail_fast": fail_fast,
            "max_retries": max_retries,
        },
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
        return _rows_out(batch, rows)
