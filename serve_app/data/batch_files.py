"""OpenAI Batch files through the Serve apps with Ray Data: each request line (``{"custom_id", "method", "url",
"body"}``) goes to the deployment serving its ``url`` through the replicas' ``openai`` handle method, which answers
exactly as that HTTP route would; each answer becomes an output line (``{"id", "custom_id", "response":
{"status_code", "request_id", "body"}, "error"}``), in input order, one per request line. A line that is not a
request (bad JSON, unknown url, ``stream``) becomes a 400 line in OpenAI's error envelope, never a failed job.
A generation line runs at the job's ``priority`` (by default below interactive requests, as every Ray Data job)
and counts against its tenant (by default the job), unless its body names its own ``priority`` or ``user``.

The line and output models are vLLM's ``run-batch`` ones, with bodies kept as the routes' JSON. Each line's ``id``
is its place in the file (``"requests.jsonl:17"``): the key Ray Data's checkpoint records, so a job run again
with ``resume`` sends only the lines not yet written (a ``custom_id`` may be missing or repeated).
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import shutil
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
from ray.data.datasource import BlockBasedFileDatasink

from ..config import DATA_PRIORITY
from ..errors import ERROR_TABLE, error_body, exception_body, validation_error
from .jobs import actor_pool, app_handle, job_blocks, job_tenant
from .progress import JobProgress, report
from .resume import IO_CPUS, checkpointed, checkpointed_rows, local_shape, nothing_left, positioned
from .retries import Retries

logger = logging.getLogger(__name__)

ROUTES = {
    "/v1/chat/completions": "llm",
    "/v1/completions": "llm",
    "/v1/responses": "llm",
    "/v1/embeddings": "embeddings",
}
"""The urls a batch line may name, and which app (generation or embeddings) answers each."""
RETRY_STATUSES = frozenset(kind.status for _, kind in ERROR_TABLE if kind.retry)
"""Answers the error table calls retryable (a full queue, a replica restarting): the line is sent again."""


def batch_models() -> tuple[type, type]:
    """vLLM's batch line and output models, with ``body`` kept as JSON: the routes here validate it themselves."""
    try:
        from vllm.entrypoints.launchers.run_batch import BatchRequestInput, BatchRequestOutput, BatchResponseData
    except ImportError:  # vLLM before the launchers package
        from vllm.entrypoints.openai.protocol import BatchRequestInput, BatchRequestOutput, BatchResponseData
    from pydantic import field_validator

    class BatchLine(BatchRequestInput):
        body: dict[str, Any]

        @field_validator("body", mode="plain")
        @classmethod
        def check_type_for_url(cls, value: Any, info: Any) -> dict[str, Any]:  # replaces vLLM's, by name
            if not isinstance(value, dict):
                raise ValueError("body must be a JSON object")
            return value

    class BatchAnswer(BatchResponseData):
        body: dict[str, Any] | None = None

    class BatchOutputLine(BatchRequestOutput):
        custom_id: str | None
        response: BatchAnswer | None

    return BatchLine, BatchOutputLine


class OpenAIBatchLines:
    """``map_batches`` callable class: each row's ``text`` (a request line) answered by its app, as ``line`` (the
    output line's JSON); ``id`` kept. Retryable failures are retried with backoff; what still fails is a line
    with the error table's status."""

    def __init__(
        self,
        apps: dict[str, tuple[str, str]],
        max_retries: int = 6,
        backoff_s: float = 0.5,
        timeout_s: float = 600.0,
        progress: Any = None,
        origin: dict[str, Any] | None = None,
    ) -> None:
        self.apps, self.progress = apps, progress
        self.origin = origin or {}  # the job's priority and tenant, for generation lines (Replica.openai)
        self.handles: dict[str, Any] = {}
        self.line_model, self.output_model = batch_models()
        self.retries = Retries(max_retries, backoff_s, timeout_s)

    async def __call__(self, batch: dict[str, np.ndarray]) -> pa.Table:
        ids = [str(i) for i in batch["id"]]
        lines = await asyncio.gather(*(self.answer(i, str(t)) for i, t in zip(ids, batch["text"])))
        report(self.progress, [summary(json.loads(line)) for line in lines], "tokens")
        return pa.table({"id": pa.array(ids, pa.string()), "line": pa.array(lines, pa.string())})

    async def answer(self, row_id: str, text: str) -> str:
        """One request line's output line."""
        from pydantic import ValidationError

        try:
            request = self.line_model.model_validate_json(text)
        except ValidationError as exc:
            return self.refused(row_id, custom_id(text), str(validation_error(exc.errors())), "line")
        url = request.url
        if request.method.upper() != "POST":
            return self.refused(row_id, request.custom_id, f"method {request.method!r}: only POST", "method")
        if url not in ROUTES:
            return self.refused(row_id, request.custom_id, f"url {url!r}: use one of {sorted(ROUTES)}", "url")
        if request.body.get("stream"):
            return self.refused(row_id, request.custom_id, "'stream' is not supported in a batch", "body.stream")
        status, body = await self.send(ROUTES[url], url, request.body)
        error = body.get("error") if status != 200 else None
        return self.output(row_id, request.custom_id, status, body, error)

    async def send(self, app: str, url: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        """The app's answer, sent again while it is retryable (a failure, or a status the error table retries)."""
        try:
            answer = await self.retries.call(
                lambda: self.handle(app).openai.remote(url, body, **(self.origin if app == "llm" else {})),
                again=lambda a: a["status_code"] in RETRY_STATUSES,
            )
        except Exception as exc:
            kind, envelope = exception_body(getattr(exc, "cause", None) or exc)
            logger.warning("giving up on a %s line: %r", url, exc)
            return kind.status, envelope
        return answer["status_code"], answer["body"]

    def handle(self, app: str) -> Any:
        if app not in self.handles:
            self.handles[app] = app_handle(*self.apps[app])
        return self.handles[app]

    def refused(self, row_id: str, custom: str | None, message: str, param: str) -> str:
        envelope = error_body(400, f"invalid batch line: {message}", param)
        return self.output(row_id, custom, 400, envelope, envelope["error"])

    def output(self, row_id: str, custom: str | None, status: int, body: dict[str, Any], error: Any) -> str:
        response = {"status_code": status, "request_id": f"batch_req_{uuid.uuid4().hex}", "body": body}
        fields = {"id": row_id, "custom_id": custom, "response": response, "error": error}
        return json.dumps(self.output_model.model_validate(fields).model_dump(mode="json"), ensure_ascii=False)


def summary(line: dict[str, Any]) -> dict[str, Any]:
    """An output line as progress counts it: its output tokens (completion tokens, or embedded tokens) and
    whether it failed."""
    body = line["response"]["body"] or {}
    usage = body.get("usage") or {}
    tokens = usage.get("completion_tokens", usage.get("prompt_tokens", 0))
    return {"tokens": tokens, "error": line["error"]}


def custom_id(text: str) -> str | None:
    """The ``custom_id`` of a line that is not a valid request, when it has a string one."""
    try:
        value = json.loads(text).get("custom_id")
    except (ValueError, AttributeError):
        return None
    return value if isinstance(value, str) else None


class LinesDatasink(BlockBasedFileDatasink):
    """Writes each block's ``line`` column as JSON lines (a part file per block; a file datasink, so Ray Data's
    checkpoint commits a block's ids with its file)."""

    def __init__(self, path: str, **kwargs: Any) -> None:
        super().__init__(path, file_format="jsonl", **kwargs)

    def write_block_to_file(self, block: Any, file: Any) -> None:
        lines = block.to_arrow()["line"].to_pylist()
        file.write("".join(line + "\n" for line in lines).encode())


def run_batch_file(
    requests: str | Path,
    output: str | Path,
    *,
    llm_app: str = "llm",
    embeddings_app: str = "embeddings",
    concurrency: int = 64,
    batch_size: int = 8,
    resume: bool = False,
    progress_s: float = 10.0,
    priority: int = DATA_PRIORITY,
    tenant: str | None = None,
) -> dict[str, Any]:
    """Answer an OpenAI Batch file into ``output`` (one output line per request line, in input order) and return
    a summary. Parts and the checkpoint live beside ``output`` (``.parts``, ``.checkpoint``) until the job is run
    afresh; ``resume`` keeps them and sends only the lines not yet written. Progress is logged every
    ``progress_s``. Generation lines run at ``priority`` and count against ``tenant`` (default: this job) unless
    they name their own ``priority`` or ``user``."""
    requests, output = Path(requests), Path(output)
    parts, checkpoint = Path(f"{output}.parts"), Path(f"{output}.checkpoint")
    if not resume:
        for folder in (parts, checkpoint):
            shutil.rmtree(folder, ignore_errors=True)
    skipped = checkpointed_rows(checkpoint)
    shape = local_shape(str(requests), kind="text")
    lines_in = shape[1] if shape else positioned(str(requests), kind="text", id_column="id").count()
    if nothing_left(str(requests), checkpoint, "id", lines_in, skipped, kind="text"):
        logger.info("every line of '%s' is in the checkpoint '%s': nothing to send", requests, checkpoint)
        return assemble(parts, output, lines_in, skipped)
    calls = max(1, math.ceil(concurrency / batch_size))
    blocks = job_blocks(lines_in, batch_size, calls)
    ds = checkpointed(positioned(str(requests), kind="text", id_column="id", blocks=blocks), checkpoint, "id")
    apps = {"llm": (llm_app, "LLMServer"), "embeddings": (embeddings_app, "EmbeddingServer")}
    progress = JobProgress(lines_in - skipped, progress_s, "tok/s (output + embedded)")
    out = ds.map_batches(
        OpenAIBatchLines,
        fn_constructor_kwargs={
            "apps": apps,
            "progress": progress.counter,
            "origin": {"priority": priority, "tenant": tenant or job_tenant()},
        },
        batch_size=batch_size,
        batch_format="numpy",
        compute=actor_pool(calls),
        num_cpus=0.1,
    )
    with progress:
        out.write_datasink(LinesDatasink(str(parts), mode="append"), ray_remote_args={"num_cpus": IO_CPUS})
    return assemble(parts, output, lines_in, skipped)


def assemble(parts: Path, output: Path, lines_in: int, skipped: int) -> dict[str, Any]:
    """Join the part files into ``output`` in input order (by each line's place in the file); the summary."""
    rows = []
    for part in parts.glob("*.jsonl"):
        rows.extend(json.loads(line) for line in part.read_text().splitlines() if line)
    rows.sort(key=lambda r: int(r["id"].rsplit(":", 1)[1]))
    tmp = output.with_name(output.name + ".tmp")
    tmp.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
    tmp.replace(output)
    statuses: dict[str, int] = {}
    for r in rows:
        status = str(r["response"]["status_code"])
        statuses[status] = statuses.get(status, 0) + 1
    ids = [r["id"] for r in rows]
    return {
        "lines_in": lines_in,
        "lines_skipped": skipped,
        "lines_out": len(rows),
        "duplicate_ids": len(ids) - len(set(ids)),
        "status_codes": statuses,
        "output": str(output),
    }
