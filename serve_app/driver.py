"""Batch inference from the command line: stream a dataset through the running Serve app with Ray Data.

    python -m serve_app.driver --input data/problems.jsonl --output out/ [--app llm] [--concurrency N]
        [--prompt-column prompt] [--id-column id] [--limit K] [--format jsonl|parquet] [--max-tokens 64]
        [--resume] [--checkpoint DIR]
    python -m serve_app.driver --openai-batch requests.jsonl --output results.jsonl [--resume]
    python -m serve_app.driver --task embed --input docs.parquet --output vectors/ --format parquet
        [--text-column text] [--app embeddings]
    python -m serve_app.driver --task chat --input chats.jsonl --output answers/ [--messages-column messages]
        [--tools tools.json] [--tool-choice auto|none|required|FUNCTION]

Reads JSONL, JSON, Parquet or CSV; writes one output row per input row (JSONL or Parquet) into the output
folder, recording the written rows' ids in a checkpoint (``--resume`` runs the job again over only the rows not
yet written; rows without an id get ``"<file>:<row>"``); Ray Data shows progress; ends with a summary: rows,
errors, wall time, the replicas' batch statistics, and for generation output tokens/s and accuracy (when the
input has an ``answer`` column), for embeddings texts/s, tokens and the vectors' dimensions.
"""

from __future__ import annotations

import argparse
import json
import logging
import shutil
import sys
import time
from pathlib import Path
from typing import Any

from .config import DATA_PRIORITY
from .data.progress import JobProgress
from .data.resume import IO_CPUS, checkpointed_rows, local_path, local_shape, nothing_left, read
from .data.summary import batch_summary, replica_stats, summarize

logger = logging.getLogger(__name__)


def run_openai_batch(args: argparse.Namespace) -> dict[str, Any]:
    """Answer an OpenAI Batch file through the apps; the summary."""
    from .data.batch_files import run_batch_file
    from .data.jobs import app_capacity

    if args.limit:
        raise ValueError("--limit does not apply to --openai-batch")
    app = args.app or "llm"
    concurrency = args.concurrency or app_capacity(app)
    started = time.monotonic()
    summary = run_batch_file(
        args.openai_batch,
        args.output,
        llm_app=app,
        embeddings_app=args.embeddings_app,
        concurrency=concurrency,
        batch_size=args.batch_size or 8,
        resume=args.resume,
        progress_s=args.progress_s,
        priority=args.priority,
        tenant=args.tenant,
    )
    return {**summary, "wall_s": round(time.monotonic() - started, 2)}


def chat_job_fields(args: argparse.Namespace) -> dict[str, Any]:
    """A chat job's fields from its flags: the tools (a JSON file of OpenAI's tool list) and ``tool_choice`` (a
    function's name: that function)."""
    fields: dict[str, Any] = {}
    if args.tools:
        try:
            fields["tools"] = json.loads(Path(args.tools).read_text())
        except (OSError, ValueError) as exc:
            raise ValueError(f"--tools: cannot read a JSON list of tools from '{args.tools}': {exc}") from None
    choice = args.tool_choice
    if choice is not None:
        named = choice not in ("auto", "none", "required")
        fields["tool_choice"] = {"type": "function", "function": {"name": choice}} if named else choice
    return fields


def input_shape(path: str) -> tuple[list[str], int]:
    """The input's own columns and its rows: a local input's read here, anything else's by Ray Data."""
    shape = local_shape(path)
    if shape is not None:
        return shape
    ds = read(path)
    return ds.columns(), ds.count()


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Stream the input through the app, write the output, and return the summary."""
    from .data import DEFAULT_BATCH_SIZE, EMBED_BATCH_SIZE, app_capacity, chat, embed, generate, job_blocks

    if args.openai_batch:
        return run_openai_batch(args)
    if not args.input:
        raise ValueError("name the input: --input FILE, or --openai-batch FILE")

    embedding = args.task == "embed"
    app = args.app or ("embeddings" if embedding else "llm")
    deployment = args.deployment or ("EmbeddingServer" if embedding else "LLMServer")
    column, column_flag = {
        "embed": (args.text_column, "--text-column"),
        "chat": (args.messages_column, "--messages-column"),
    }.get(args.task, (args.prompt_column, "--prompt-column"))
    if args.task != "chat" and (args.tools or args.tool_choice):
        raise ValueError("--tools and --tool-choice apply to --task chat")
    chat_fields = chat_job_fields(args) if args.task == "chat" else None
    if args.resume and args.limit:
        raise ValueError("--limit cannot be resumed (a rerun would take the next K unwritten rows); drop one")
    checkpoint = Path(args.checkpoint or f"{str(args.output).rstrip('/')}.checkpoint")
    if args.resume and Path(args.output).exists() and not checkpoint.is_dir():
        raise ValueError(f"nothing to resume: no checkpoint at '{checkpoint}' (set it with --checkpoint)")
    if not args.resume:
        shutil.rmtree(checkpoint, ignore_errors=True)  # a fresh run: forget what the last one wrote
    skipped = checkpointed_rows(checkpoint)
    columns, rows_in = input_shape(args.input)
    if column not in columns:
        raise ValueError(f"the input has no column '{column}' (columns: {columns}); name it with {column_flag}")
    rows_in = min(rows_in, args.limit) if args.limit else rows_in
    concurrency = args.concurrency or app_capacity(app, deployment)
    batch_size = args.batch_size or (EMBED_BATCH_SIZE if embedding else DEFAULT_BATCH_SIZE)
    before = replica_stats(app, deployment)
    progress = JobProgress(rows_in - skipped, args.progress_s, "tokens/s" if embedding else "output tok/s")
    started = time.monotonic()
    if nothing_left(args.input, checkpoint, args.id_column, rows_in, skipped):
        logger.info("every row of '%s' is in the checkpoint '%s': nothing to run", args.input, checkpoint)
    else:
        ds = read(
            args.input, id_column=args.id_column, blocks=job_blocks(rows_in, batch_size, concurrency), columns=columns
        )
        if args.limit:
            ds = ds.limit(args.limit)
        common = {"app": app, "deployment": deployment, "concurrency": concurrency, "fail_fast": args.fail_fast}
        common |= {"checkpoint": checkpoint, "id_column": args.id_column, "progress": progress.counter}
        sampling = {"max_tokens": args.max_tokens} if args.max_tokens else {}
        origin = {"priority": args.priority, "tenant": args.tenant}
        if embedding:
            out = embed(ds, text_column=column, batch_size=batch_size, **common)
        elif chat_fields is not None:
            out = chat(ds, messages_column=column, batch_size=batch_size, **common, **origin, **chat_fields, **sampling)
        else:
            out = generate(ds, prompt_column=column, batch_size=batch_size, **common, **origin, **sampling)
        write = out.write_parquet if args.format == "parquet" else out.write_json
        mode = "append" if args.resume else "overwrite"  # a fresh run replaces the last output
        with progress:
            write(args.output, ray_remote_args={"num_cpus": IO_CPUS}, mode=mode)
    wall = time.monotonic() - started
    after = replica_stats(app, deployment)  # before reading the output back: that time is not the job's
    result = summarize(args.output, args.format, "answer" in columns and not embedding, args.task, args.id_column)
    summary = {
        "rows_in": rows_in,
        "rows_skipped": skipped,
        "rows_out": result["rows"],
        "errors": result["errors"],
        "duplicate_ids": result["duplicate_ids"],
        "wall_s": round(wall, 2),
    }
    if embedding:
        summary["tokens"] = result["tokens"]
        summary["texts_per_s"] = round(result["rows"] / wall, 1) if wall else 0.0
        summary["dimensions"] = result["dimensions"]
    else:
        summary["output_tokens"] = result["tokens"]
        summary["output_tokens_per_s"] = round(result["tokens"] / wall, 1) if wall else 0.0
    summary["progress"] = progress.lines[-1] if progress.lines else None
    summary["batching"] = batch_summary(before, after)
    summary["output"] = str(args.output)
    if "answer" in columns and not embedding:
        summary["accuracy"] = round(result["correct"] / max(1, result["rows"]), 3)
    return summary


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m serve_app.driver", description=__doc__.splitlines()[0])
    p.add_argument("--input", help="a .jsonl, .json, .parquet or .csv file (or folder)")
    p.add_argument("--openai-batch", metavar="FILE", help="an OpenAI Batch request file (instead of --input)")
    p.add_argument("--output", required=True, help="the output folder (with --openai-batch: the output file)")
    p.add_argument("--task", choices=["generate", "chat", "embed"], default="generate")
    p.add_argument("--app", default=None, help="the Serve application name (default: llm, or embeddings)")
    p.add_argument("--deployment", default=None, help="default: LLMServer, or EmbeddingServer")
    p.add_argument("--embeddings-app", default="embeddings", help="--openai-batch: the app for /v1/embeddings")
    p.add_argument("--concurrency", type=int, default=None, help="requests in flight (default: what the app absorbs)")
    p.add_argument("--batch-size", type=int, default=None, help="rows per request (default: 8, or 64 for embed)")
    p.add_argument("--prompt-column", default="prompt")
    p.add_argument("--text-column", default="text", help="--task embed: the column to embed")
    p.add_argument("--messages-column", default="messages", help="--task chat: each row's OpenAI messages")
    p.add_argument("--tools", metavar="FILE", default=None, help="--task chat: a JSON file of OpenAI tools")
    p.add_argument("--tool-choice", default=None, help="--task chat: auto, none, required or a function's name")
    p.add_argument("--id-column", default="id", help="unique row ids; added as '<file>:<row>' where missing")
    p.add_argument("--resume", action="store_true", help="skip the rows the last run of this job wrote")
    p.add_argument("--checkpoint", default=None, help="where written ids are recorded (default: OUTPUT.checkpoint)")
    p.add_argument("--limit", type=int, default=None, help="only the first K rows")
    p.add_argument("--format", choices=["jsonl", "parquet"], default="jsonl")
    p.add_argument("--max-tokens", type=int, default=None)
    p.add_argument(
        "--priority", type=int, default=DATA_PRIORITY, help="lower runs first; interactive requests are 0 (default: 1)"
    )
    p.add_argument("--tenant", default=None, help="whose fair share the job counts against (default: this job)")
    p.add_argument("--fail-fast", action="store_true", help="fail the job on the first failed row")
    p.add_argument("--progress-s", type=float, default=10.0, help="log rows done, tok/s, ETA, errors this often")
    p.add_argument("--address", default="auto", help="the Ray cluster running the app")
    return p


def absolute_paths(args: argparse.Namespace) -> argparse.Namespace:
    """The job's local paths made absolute from this process's folder (:func:`.data.resume.local_path`): Ray Data's
    tasks read and write them in the cluster's folder."""
    for name in ("input", "output", "openai_batch", "checkpoint"):
        value = getattr(args, name)
        if value:
            setattr(args, name, local_path(value))
    return args


def main(argv: list[str] | None = None) -> int:
    args = absolute_paths(parser().parse_args(argv))
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    import ray

    try:
        ray.init(address=args.address, namespace="serve", log_to_driver=False)
    except ConnectionError as exc:
        print(
            f"error: no running Ray cluster at '{args.address}' ({exc}); start the app first: make serve",
            file=sys.stderr,
        )
        return 2
    try:
        summary = run(args)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(summary, indent=2))
    rows_in, rows_out = ("lines_in", "lines_out") if args.openai_batch else ("rows_in", "rows_out")
    ok = summary[rows_in] == summary[rows_out] and not summary["duplicate_ids"]
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
