"""What a batch job did, for the driver's closing summary: its rows read back from the written output (rows,
errors, tokens, accuracy against an ``answer`` column, the vectors' dimensions) and the replicas' batch statistics
before and after it."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any


def replica_stats(app: str, deployment: str, probes: int = 24) -> dict[str, dict[str, Any]]:
    """The batch statistics of each replica that answers ``probes`` stats calls, by replica id."""
    from .jobs import app_handle

    handle = app_handle(app, deployment)
    seen: dict[str, dict[str, Any]] = {}
    for _ in range(probes):
        info = handle.stats.remote().result(timeout_s=60)
        seen[info["replica"]["replica_id"]] = info["batcher"]
    return seen


def batch_summary(before: dict[str, dict], after: dict[str, dict]) -> dict[str, Any]:
    """What the replicas seen did during the run: requests completed, and how full their engines were kept
    (continuous admission: the mean requests in flight; batch mode: the mean batch size), with utilization: the
    fraction of the run's time each replica had work (its busy and idle clocks between the two probes; a replica
    first seen after the run counts from its start), averaged over the replicas."""
    completed = batches = 0
    utilization, in_flight = [], []
    for replica, stats in after.items():
        prior = before.get(replica, {})
        completed += stats["total_completed"] - prior.get("total_completed", 0)
        batches += stats.get("total_batches", 0) - prior.get("total_batches", 0)
        busy = stats["busy_time_s"] - prior.get("busy_time_s", 0.0)
        running = busy + stats["idle_time_s"] - prior.get("idle_time_s", 0.0)
        utilization.append(busy / running if running > 0 else 0.0)
        in_flight.append(stats.get("mean_in_flight", 0.0))
    summary: dict[str, Any] = {"replicas": len(after), "completed": completed}
    if batches:
        summary["avg_batch_size"] = round(completed / batches, 2)
    else:
        summary["mean_in_flight"] = round(sum(in_flight) / len(in_flight), 2) if in_flight else 0.0
    summary["utilization"] = round(sum(utilization) / len(utilization), 3) if utilization else 0.0
    return summary


def first_number(text: str) -> int | None:
    """The first integer in ``text``, for scoring answers."""
    match = re.search(r"-?\d+", text.replace(",", ""))
    return int(match.group()) if match else None


def summarize(output: str, fmt: str, has_answer: bool, task: str = "generate", id_column: str = "id") -> dict[str, Any]:
    """Rows, errors, tokens (output tokens, or embedded tokens), accuracy (with answers) and the vectors'
    dimensions (embeddings), read back from the written output: here, file by file (a Ray Data job to read a
    job's output back cost seconds of start-up on a small machine)."""
    rows = errors = tokens = correct = 0
    ids: set[Any] = set()
    duplicates = 0
    dimensions: set[int] = set()
    for batch in written_tables(output, fmt):
        rows += len(batch)
        errors += int(batch["error"].notna().sum())
        tokens += int(batch["tokens" if task == "embed" else "output_tokens"].sum())
        if task == "embed":
            dimensions.update(len(v) for v in batch["embedding"] if v is not None)
        if id_column in batch:
            for row_id in batch[id_column].tolist():
                duplicates += row_id in ids
                ids.add(row_id)
        if has_answer:
            correct += sum(first_number(str(t)) == a for t, a in zip(batch["text"], batch["answer"]))
    return {
        "rows": rows,
        "errors": errors,
        "tokens": tokens,
        "correct": correct,
        "duplicate_ids": duplicates,
        "dimensions": sorted(dimensions),
    }


def written_tables(output: str, fmt: str) -> Iterator[Any]:
    """Each file a job wrote to the folder ``output`` as a pandas frame. One file at a time, as Ray Data reads
    them: a file in which no row failed has only nulls in ``error``, which JSON's reader types apart from another's."""
    import pyarrow.json as pjson
    import pyarrow.parquet as pq

    for path in sorted(Path(output).glob("*.parquet" if fmt == "parquet" else "*.json*")):
        if fmt == "parquet":
            yield pq.read_table(path).to_pandas()
        elif size := path.stat().st_size:  # a whole file in one block: a line may not straddle two (JSON's reader)
            yield pjson.read_json(path, read_options=pjson.ReadOptions(block_size=max(size, 1 << 20))).to_pandas()
