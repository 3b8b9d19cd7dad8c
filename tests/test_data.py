"""Ray Data pipelines through a local Serve app with the SIMULATED engine: rows in equal rows out, ids
kept, errors kept to their own rows, the concurrency cap respected, and the driver's summary."""

from __future__ import annotations

import argparse
import json

import pytest

from serve_app.sample import make, write

pytestmark = pytest.mark.serve


@pytest.fixture(scope="module")
def app(deploy_app):
    return deploy_app(
        "data",
        simulated={"step_s": 0.005},
        autoscaling={"target_ongoing_requests": 8},
    )


@pytest.mark.system  # a Ray Data job
def test_pipeline_keeps_rows_ids_and_errors_in_place(app):
    import ray.data

    from serve_app.data import generate

    rows = [{"id": i, "prompt": f"row {i} says hello"} for i in range(300)]
    for i in (7, 123, 250):
        rows[i]["prompt"] = f"row {i} __simulated_fail__"
    for i in (40, 41):
        rows[i]["prompt"] = "   "  # invalid: refused by validation, in its own row only
    out = generate(ray.data.from_items(rows), app="data", concurrency=3, batch_size=8, max_tokens=3)
    got = sorted(out.take_all(), key=lambda r: r["id"])
    assert [r["id"] for r in got] == list(range(300))  # one row out per row in, none duplicated
    for row in got:
        i = row["id"]
        if i in (7, 123, 250):
            assert row["error"] and "simulated failure" in row["error"]
        elif i in (40, 41):
            assert row["error"].startswith("invalid") and "empty" in row["error"]
        else:
            assert row["error"] is None
            assert row["text"] == f"[simulated] row {i} says", row  # each row got its own answer
            assert row["output_tokens"] == 3 and row["finish_reason"] == "length"
    after = app.stats.remote().result()
    assert after["requests"]["peak"] <= 3  # the concurrency cap held at the app
    assert after["engine_stats"]["peak_running"] >= 8  # rows of several requests shared the engine's steps


def test_default_concurrency_is_what_the_app_absorbs(app):
    from serve_app.data import actor_pool, app_capacity

    assert app_capacity("data") == 1 * 8  # max_replicas x target_ongoing_requests
    pool = actor_pool(8)
    assert pool.max_size * pool.max_concurrent_calls_per_actor >= 8
    assert pool.max_size * pool.max_concurrent_calls_per_actor < 8 + pool.max_size  # no more than asked


@pytest.mark.parametrize(
    ("rows", "batch_size", "calls"),
    [(2000, 8, 256), (10_000_000, 8, 256), (240, 4, 2), (5, 8, 256), (1, 1, 1), (100_000, 64, 16)],
)
def test_job_blocks_let_every_call_be_in_flight_and_write_as_the_job_goes(rows, batch_size, calls):
    from serve_app.data import job_blocks
    from serve_app.data.jobs import ASYNC_BATCHES_PER_BLOCK

    blocks = job_blocks(rows, batch_size, calls)
    batches = -(-rows // batch_size)
    assert 1 <= blocks <= batches  # no block smaller than a batch
    per_block = rows / blocks
    assert per_block <= batch_size * calls + batch_size  # a block is at most a wave of calls: written as the job goes
    in_flight = min(blocks, calls) * min(ASYNC_BATCHES_PER_BLOCK, -(-per_block // batch_size))
    assert in_flight >= min(calls, batches)  # Ray Data can have every call (or every batch) in flight at once


@pytest.mark.system  # a Ray Data job
def test_transient_overload_is_retried_until_every_row_succeeds(deploy_app):
    import ray.data

    from serve_app.data import generate

    deploy_app(
        "busy",
        simulated={"step_s": 0.02},
        batcher={"max_inflight": 2, "max_queue_size": 4},
        max_ongoing_requests=64,
    )
    rows = [{"id": i, "prompt": f"p {i}"} for i in range(120)]
    out = generate(ray.data.from_items(rows), app="busy", concurrency=12, batch_size=4, max_tokens=2, max_retries=20)
    got = out.take_all()
    assert sorted(r["id"] for r in got) == list(range(120))
    assert all(r["error"] is None for r in got), [r["error"] for r in got if r["error"]][:3]


@pytest.mark.system  # a Ray Data job
def test_fail_fast_fails_the_job(app):
    import ray.data

    from serve_app.data import generate

    rows = [{"id": 0, "prompt": "ok"}, {"id": 1, "prompt": "__simulated_fail__"}]
    with pytest.raises(Exception, match="simulated failure"):
        generate(ray.data.from_items(rows), app="data", concurrency=1, fail_fast=True).take_all()


@pytest.mark.system  # a Ray Data job
def test_driver_streams_the_sample_dataset_and_summarizes(app, tmp_path):
    from serve_app import driver

    data = write(tmp_path / "problems.jsonl", rows=60)
    args = driver.parser().parse_args(
        ["--input", str(data), "--output", str(tmp_path / "out"), "--app", "data", "--max-tokens", "4", "--limit", "50"]
    )
    summary = driver.run(args)
    assert summary["rows_in"] == summary["rows_out"] == 50
    assert summary["errors"] == 0 and summary["duplicate_ids"] == 0
    assert summary["output_tokens"] == 50 * 4
    assert 0 <= summary["accuracy"] <= 1
    batching = summary["batching"]
    assert batching["replicas"] == 1 and batching["completed"] == 50 and batching["mean_in_flight"] > 0
    written = [json.loads(line) for f in (tmp_path / "out").glob("*.json*") for line in f.read_text().splitlines()]
    assert sorted(r["id"] for r in written) == list(range(50))
    again = driver.run(argparse.Namespace(**{**vars(args), "limit": 20}))  # a rerun replaces the output
    assert again["rows_in"] == again["rows_out"] == 20 and again["duplicate_ids"] == 0


def test_driver_refuses_a_missing_column(app, tmp_path):
    from serve_app import driver

    data = write(tmp_path / "problems.jsonl", rows=5)
    args = argparse.Namespace(
        **{**vars(driver.parser().parse_args(["--input", str(data), "--output", "x"])), "prompt_column": "question"}
    )
    with pytest.raises(ValueError, match="no column 'question'"):
        driver.run(args)


def test_sample_dataset_is_reproducible_with_known_answers():
    rows = make(50, seed=3)
    assert rows == make(50, seed=3)
    assert len({len(r["prompt"]) for r in rows}) > 20  # varied lengths
    first = rows[0]
    assert set(first) == {"id", "prompt", "answer"} and isinstance(first["answer"], int)


@pytest.mark.system  # a Ray Data job
def test_driver_logs_progress_a_person_can_read(app, tmp_path, caplog):
    import logging
    import re

    from serve_app import driver
    from serve_app.data.progress import describe

    data = write(tmp_path / "problems.jsonl", rows=30)
    flags = ["--input", str(data), "--output", str(tmp_path / "out"), "--app", "data", "--max-tokens", "4"]
    args = driver.parser().parse_args([*flags, "--progress-s", "0.05", "--batch-size", "2", "--concurrency", "2"])
    with caplog.at_level(logging.INFO, logger="serve_app.data.progress"):
        summary = driver.run(args)
    assert summary["rows_out"] == 30
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("progress: ")]
    assert len(lines) >= 2, lines  # while it ran, and at the end
    for line in lines:
        assert re.fullmatch(r"progress: rows \d+/30 \(\d+%\), [\d.]+ output tok/s, ETA (\d+ s|unknown), 0 errors", line)
    assert re.fullmatch(r"rows 30/30 \(100%\), [\d.]+ output tok/s, ETA 0 s, 0 errors", summary["progress"])
    assert describe({"rows": 15, "tokens": 60, "errors": 1}, 30, 2.0) == (
        "rows 15/30 (50%), 30.0 output tok/s, ETA 2 s, 1 errors"
    )
    assert describe({"rows": 0, "tokens": 0, "errors": 0}, 30, 1.0).endswith("ETA unknown, 0 errors")


def test_a_job_that_asks_for_log_probabilities_gets_a_typed_logprobs_column():
    """Rows carry ``logprobs`` and ``prompt_logprobs`` (Arrow-typed, so batches with and without a failed row are one
    dataset) only where the job's sampling asks for them, with each token's id; minus infinity stays as the engine
    computed it, a prompt's first token has no log probability, a failed row has null."""
    import numpy as np

    from serve_app.core.rows import generation_error_row as error_row
    from serve_app.data.rows import GENERATE_COLUMNS, LOGPROBS_TYPE, generate_columns, rows_out

    assert generate_columns({"max_tokens": 8}) is GENERATE_COLUMNS and "logprobs" not in GENERATE_COLUMNS
    assert "prompt_logprobs" not in generate_columns({"logprobs": 1})
    columns = generate_columns({"max_tokens": 8, "logprobs": 1, "prompt_logprobs": 0})
    token = {"token": "Paris", "logprob": -0.25, "top": (("Paris", -0.25), ("Lyon", float("-inf"))), "token_id": 7}
    prompt = ({"token": "The", "logprob": None, "top": (), "token_id": 1}, {**token, "top": (), "token_id": 9})
    done = {"text": "Paris", "prompt_tokens": 3, "output_tokens": 1, "finish_reason": "stop", "error": None}
    rows = [{**done, "logprobs": (token,), "prompt_logprobs": prompt}, error_row("boom")]
    table = rows_out({"prompt": np.array(["a", "b"])}, rows, columns)
    assert table.schema.field("logprobs").type == table.schema.field("prompt_logprobs").type == LOGPROBS_TYPE
    first, failed = table.column("logprobs").to_pylist()
    assert first == [
        {
            "token": "Paris",
            "logprob": -0.25,
            "token_id": 7,
            "top": [{"token": "Paris", "logprob": -0.25}, {"token": "Lyon", "logprob": float("-inf")}],
        }
    ]
    assert failed is None
    scored, failed = table.column("prompt_logprobs").to_pylist()
    assert [(t["token"], t["logprob"], t["token_id"]) for t in scored] == [("The", None, 1), ("Paris", -0.25, 9)]
    assert failed is None
