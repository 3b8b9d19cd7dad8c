"""Ray Data jobs through the Serve apps: ``map_batches`` actors send each batch of rows to an app through its
``DeploymentHandle`` as one request, at most ``concurrency`` requests in flight in all (by default what the app's
autoscaling absorbs, max replicas x target ongoing requests, as the seeds advise), so the driver neither starves
nor floods the replicas.

Every input row yields exactly one output row, with its input columns plus the result columns and ``error`` (None
on success). The app answers each row on its own (a refused or failed row gets its ``error``); failures the error
table calls retryable (a full queue, a replica restarting or gone, a timeout) are retried with backoff; what still
fails gets an error value in its rows, or fails the job with ``fail_fast=True``.
"""

from __future__ import annotations

import logging
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..config import DATA_PRIORITY
from .actors import ServeChat, ServeEmbed, ServeGenerate, app_handle
from .resume import checkpointed

logger = logging.getLogger(__name__)


DEFAULT_BATCH_SIZE = 8
EMBED_BATCH_SIZE = 64
"""Rows per embedding request: texts are cheap and many, so bigger requests save per-call overhead while the
replica's batcher still cuts its own batches by length across all requests."""
CALLS_PER_ACTOR = 128
ASYNC_BATCHES_PER_BLOCK = int(os.environ.get("RAY_DATA_DEFAULT_ASYNC_BATCH_UDF_MAX_CONCURRENCY", "4"))
"""Batches of one block that Ray Data runs at once through an async ``map_batches`` class (its own setting, of the
same name): a job has at most this many requests in flight per block in flight."""


def app_capacity(app: str = "llm", deployment: str = "LLMServer") -> int:
    """Requests the app's autoscaling absorbs: max replicas x target ongoing requests (from a replica)."""
    info = app_handle(app, deployment).stats.remote().result(timeout_s=60)
    scaling = info["autoscaling"]
    return max(1, int(scaling["max_replicas"] * scaling["target_ongoing_requests"]))


def job_blocks(rows: int, batch_size: int, calls: int) -> int:
    """How many blocks to read ``rows`` into for ``calls`` requests of ``batch_size`` rows in flight. A block is
    written and checkpointed at once, so there is at least one a wave of calls; and a block has at most
    :data:`ASYNC_BATCHES_PER_BLOCK` requests in flight, so there are enough for all ``calls`` to be; none smaller
    than a batch. (A 2,000-row job read as one block, a wave, wrote nothing until its end, so a kill lost every row,
    and ran 3% slower than in 64 blocks.)"""
    waves = math.ceil(rows / (batch_size * calls))
    wanted = max(waves, math.ceil(calls / ASYNC_BATCHES_PER_BLOCK))
    return max(1, min(wanted, math.ceil(rows / batch_size)))


def actor_pool(concurrency: int, actors: int | None = None) -> Any:
    """An async actor pool with at most ``concurrency`` calls (each one request) in flight in all.

    The map actors only await handle calls, so one holds ``CALLS_PER_ACTOR`` of them easily; more actors only cost
    start-up (a worker process each: about 1.5 s apiece on 2 cores, measured in the e2e benchmark)."""
    import ray.data

    size = actors or math.ceil(concurrency / CALLS_PER_ACTOR)
    per_actor = math.ceil(concurrency / size)
    return ray.data.ActorPoolStrategy(
        size=size, max_tasks_in_flight_per_actor=per_actor, max_concurrent_calls_per_actor=per_actor
    )


def job_tenant() -> str:
    """The tenant a job's requests count against by default: its Ray job (one per driver process)."""
    import ray

    return f"ray-job-{ray.get_runtime_context().get_job_id()}"


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
    priority: int = DATA_PRIORITY,
    tenant: str | None = None,
    checkpoint: str | Path | None = None,
    id_column: str = "id",
    progress: Any = None,
    **sampling: Any,
) -> Any:
    """Stream ``ds`` through the generation app: each row gains ``text``, ``prompt_tokens``, ``output_tokens``,
    ``finish_reason`` and ``error``. Its requests go at ``priority`` (after interactive ones) and count against
    ``tenant``'s fair share (default: this job). With ``checkpoint`` (a folder), writing the result to files
    records each written row's ``id_column`` there, and the same job run again skips those rows
    (:func:`~serve_app.data.resume.checkpointed`). ``progress`` (a :mod:`~serve_app.data.progress` counter
    actor) is told of every finished batch. Returns a lazy Dataset."""
    options = {**sampling, "priority": priority, "tenant": tenant or job_tenant()}
    kwargs = {"app": app, "deployment": deployment, "prompt_column": prompt_column, "sampling": options}
    kwargs["progress"] = progress
    job = Job(concurrency, batch_size, actors, fail_fast, max_retries, checkpoint, id_column)
    return _through_app(ds, ServeGenerate, kwargs, job)


def chat(
    ds: Any,
    *,
    app: str = "llm",
    deployment: str = "LLMServer",
    messages_column: str = "messages",
    concurrency: int | None = None,
    batch_size: int = DEFAULT_BATCH_SIZE,
    actors: int | None = None,
    fail_fast: bool = False,
    max_retries: int = 6,
    priority: int = DATA_PRIORITY,
    tenant: str | None = None,
    checkpoint: str | Path | None = None,
    id_column: str = "id",
    progress: Any = None,
    **fields: Any,
) -> Any:
    """Stream ``ds``'s conversations (``messages_column``: OpenAI's messages, as a list or JSON text) through the
    generation app as chat completions with the same ``fields`` (``tools``, ``tool_choice``, ``max_tokens``, any
    chat completions field): each row gains a generation job's columns and ``content``, ``tool_calls`` (OpenAI's
    shape) and ``reasoning``. Priority, tenant, checkpoint and progress as for :func:`generate`. Returns a lazy
    Dataset."""
    options = {**fields, "priority": priority, "tenant": tenant or job_tenant()}
    kwargs = {"app": app, "deployment": deployment, "messages_column": messages_column, "fields": options}
    kwargs["progress"] = progress
    job = Job(concurrency, batch_size, actors, fail_fast, max_retries, checkpoint, id_column)
    return _through_app(ds, ServeChat, kwargs, job)


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
    checkpoint: str | Path | None = None,
    id_column: str = "id",
    progress: Any = None,
) -> Any:
    """Stream ``ds`` through the embedding app: each row gains ``embedding``, ``tokens`` and ``error``;
    ``checkpoint``, ``id_column`` and ``progress`` as for :func:`generate`. Returns a lazy Dataset."""
    kwargs = {"app": app, "deployment": deployment, "text_column": text_column, "progress": progress}
    kwargs["truncate_prompt_tokens"] = truncate_prompt_tokens
    job = Job(concurrency, batch_size, actors, fail_fast, max_retries, checkpoint, id_column)
    return _through_app(ds, ServeEmbed, kwargs, job)


@dataclass
class Job:
    """How a job streams its rows: requests in flight, rows per request, map actors, failure handling, and the
    checkpoint it resumes from."""

    concurrency: int | None
    batch_size: int
    actors: int | None
    fail_fast: bool
    max_retries: int
    checkpoint: str | Path | None = None
    id_column: str = "id"


def _through_app(ds: Any, fn: type, kwargs: dict[str, Any], job: Job) -> Any:
    concurrency = job.concurrency or app_capacity(kwargs["app"], kwargs["deployment"])
    if concurrency < 1 or job.batch_size < 1:
        raise ValueError(f"concurrency ({concurrency}) and batch_size ({job.batch_size}) must be >= 1")
    logger.info(
        "streaming through app %r: %d requests of %d rows in flight at most", kwargs["app"], concurrency, job.batch_size
    )
    if job.checkpoint is not None:
        ds = checkpointed(ds, job.checkpoint, job.id_column)
    return ds.map_batches(  # derived datasets share ds's context, so its checkpoint settings too
        fn,
        fn_constructor_kwargs={**kwargs, "fail_fast": job.fail_fast, "max_retries": job.max_retries},
        batch_size=job.batch_size,
        batch_format="numpy",
        compute=actor_pool(concurrency, job.actors),
        num_cpus=0.1,
    )
