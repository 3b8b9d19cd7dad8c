"""Resumable jobs through a local Serve app with the SIMULATED engine: a driver killed part way and run again with
``--resume`` sends only the unwritten rows to the app, and the output holds every id once; the Python API's
``checkpoint=`` does the same; inputs without ids get stable ones from file and row position."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from serve_app.sample import write
from tests.waits import completed, idle, wait_until

pytestmark = pytest.mark.system  # Ray Data jobs, and drivers killed part way


@pytest.fixture(scope="module")
def app(deploy_app):
    return deploy_app("resume", simulated={"step_s": 0.05}, autoscaling={"target_ongoing_requests": 8})


def kill_once_written(run: subprocess.Popen, count: Callable[[], int], at_least: int) -> None:
    """Kill ``run`` once ``count()`` (what it has written) reaches ``at_least``: waiting on its output, not on a
    clock; it must not have ended by then. Then wait until Ray has marked its job dead, which stops the job's
    workers: until then its Ray Data actors may still send a call, which the replica would count as the resume's
    (seen once in a fresh-clone run: one prompt too many)."""
    try:
        deadline = time.monotonic() + 180
        while count() < at_least:
            assert run.poll() is None, "the first run ended before it could be killed"
            assert time.monotonic() < deadline, "the first run wrote nothing in 180 s"
            time.sleep(0.2)
    finally:
        run.kill()
        run.wait()
    from ray._private.state import jobs

    def dead() -> bool:
        return any(job["DriverPid"] == run.pid and job["IsDead"] for job in jobs())

    wait_until(dead, 60, "Ray to mark the killed driver's job dead", interval=0.25)


def written(folder: Path) -> list[dict]:
    return [json.loads(line) for f in sorted(folder.glob("*.json*")) for line in f.read_text().splitlines() if line]


def test_a_killed_driver_resumes_with_only_the_unwritten_rows(app, tmp_path, caplog):
    import ray

    from serve_app import driver

    rows = 64
    data = write(tmp_path / "problems.jsonl", rows=rows)
    lines = [json.loads(line) for line in data.read_text().splitlines()]
    data.write_text("".join(json.dumps({k: v for k, v in r.items() if k != "id"}) + "\n" for r in lines))  # no ids
    out = tmp_path / "out"
    flags = ["--input", str(data), "--output", str(out), "--app", "resume", "--max-tokens", "4"]
    flags += ["--concurrency", "2", "--batch-size", "4"]  # blocks of 8 rows: 8 writes
    address = ray.get_runtime_context().gcs_address
    first = subprocess.Popen(
        [sys.executable, "-m", "serve_app.driver", *flags, "--address", address],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    kill_once_written(first, lambda: len(written(out)), 16)
    partial = len(written(out))
    assert 16 <= partial < rows, partial
    idle(app)
    before = completed(app)
    args = driver.parser().parse_args([*flags, "--resume", "--address", address])
    summary = driver.run(args)
    sent = completed(app) - before
    assert 0 < summary["rows_skipped"] < rows
    assert sent == rows - summary["rows_skipped"]  # only the rows not recorded as written went to the app
    got = written(out)
    ids = [r["id"] for r in got]
    assert sorted(ids) == sorted(f"problems.jsonl:{i}" for i in range(rows))  # every row, each once
    assert summary["rows_in"] == summary["rows_out"] == rows and summary["duplicate_ids"] == 0
    assert all(r["error"] is None and r["output_tokens"] == 4 for r in got)
    with caplog.at_level(logging.INFO, logger="serve_app.driver"):
        again = driver.run(args)  # a finished job resumed: nothing left to send, nothing written twice
    assert again["rows_skipped"] == rows and again["rows_out"] == rows and again["duplicate_ids"] == 0
    assert "nothing to run" in caplog.text  # ended before Ray Data started a read, an actor or a filter


@pytest.mark.parametrize("own_ids", [False, True], ids=["numbered", "own-ids"])
def test_python_api_checkpoint_skips_rows_already_written(app, tmp_path, own_ids):
    """With ids the job numbers (file and row) and with the input's own (read by Ray's JSON reader: its pandas
    blocks once failed the checkpoint filter on the second run)."""
    from serve_app.data import generate
    from serve_app.data.resume import read

    data = tmp_path / "rows.jsonl"
    ids = [f"rows.jsonl:{i}" for i in range(30)]
    data.write_text(
        "".join(json.dumps({"prompt": f"row {i}"} | ({"id": ids[i]} if own_ids else {})) + "\n" for i in range(30))
    )
    out, checkpoint = tmp_path / "out", tmp_path / "ckpt"

    def job() -> None:
        ds = read(str(data), id_column="id")
        generate(ds, app="resume", concurrency=2, batch_size=5, max_tokens=2, checkpoint=checkpoint).write_json(
            str(out), mode="append"
        )

    job()
    first = written(out)
    assert sorted(r["id"] for r in first) == sorted(f"rows.jsonl:{i}" for i in range(30))
    assert all(r["text"] == f"[simulated] row {r['id'].split(':')[1]}" for r in first)  # each row its own answer
    before = completed(app)
    job()
    assert completed(app) == before  # every id was recorded: nothing sent again
    assert len(written(out)) == 30


def test_resume_refuses_what_it_cannot_resume(app, tmp_path):
    from serve_app import driver

    data = write(tmp_path / "problems.jsonl", rows=5)
    out = tmp_path / "out"
    out.mkdir()
    base = ["--input", str(data), "--output", str(out), "--app", "resume"]
    with pytest.raises(ValueError, match="nothing to resume"):
        driver.run(driver.parser().parse_args([*base, "--resume"]))
    with pytest.raises(ValueError, match="--limit cannot be resumed"):
        driver.run(driver.parser().parse_args([*base, "--resume", "--limit", "2"]))
    with pytest.raises(ValueError, match="no deployment 'LLMServer' in a Serve app 'nope'"):
        driver.run(driver.parser().parse_args([*base[:3], str(tmp_path / "o2"), "--app", "nope"]))


def test_rows_without_ids_are_numbered_by_file_and_position_in_every_format(serve_instance, tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from serve_app.data import read
    from serve_app.data.resume import PENDING_SUFFIX, local_shape, positioned, unwritten_rows

    rows = [{"prompt": f"p{i}", "n": i} for i in range(5)]
    (tmp_path / "a.json").write_text(json.dumps(rows))  # one JSON array
    (tmp_path / "b.csv").write_text("prompt,n\n" + "".join(f"p{i},{i}\n" for i in range(5)))
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "c.parquet", row_group_size=2)
    folder = tmp_path / "parts"
    folder.mkdir()
    for name in ("x.jsonl", "y.jsonl"):
        (folder / name).write_text("".join(json.dumps(r) + "\n" for r in rows))
    for path, names in ((tmp_path / "a.json", ["a.json"]), (tmp_path / "b.csv", ["b.csv"])):
        got = sorted(read(str(path), id_column="id").take_all(), key=lambda r: r["n"])
        assert [(r["id"], r["prompt"]) for r in got] == [(f"{names[0]}:{i}", f"p{i}") for i in range(5)]
    got = read(str(tmp_path / "c.parquet"), id_column="id").take_all()
    assert sorted((r["id"], r["n"]) for r in got) == [(f"c.parquet:{i}", i) for i in range(5)]  # across row groups
    got = read(str(folder), id_column="id").take_all()
    assert sorted((r["id"], r["prompt"]) for r in got) == sorted(
        (f"{f}:{i}", f"p{i}") for f in ("x.jsonl", "y.jsonl") for i in range(5)
    )
    kept = [{"id": 7, "prompt": "has its own id"}]
    (tmp_path / "own.jsonl").write_text(json.dumps(kept[0]) + "\n")
    assert read(str(tmp_path / "own.jsonl"), id_column="id").take_all() == kept  # an id column is left as it is
    (tmp_path / "lines.txt").write_text("first\n\n  \nfourth\r\nfifth \u2028 still fifth")
    got = positioned(str(tmp_path / "lines.txt"), kind="text", id_column="id").take_all()
    assert [(r["id"], r["text"]) for r in got] == [
        ("lines.txt:0", "first"),
        ("lines.txt:3", "fourth"),  # blank lines are no rows, but keep their numbers
        ("lines.txt:4", "fifth \u2028 still fifth"),  # only a newline ends a line
    ]
    # what the driver measures of a local input in its own process is what Ray Data reads of it
    for path in ("a.json", "b.csv", "c.parquet", "parts", "own.jsonl"):
        ds = read(str(tmp_path / path))
        assert local_shape(str(tmp_path / path)) == (ds.columns(), ds.count()), path
    assert local_shape(str(tmp_path / "lines.txt"), kind="text") == (["text"], 3)
    (folder / "notes.md").write_text("not an input")
    assert local_shape(str(folder)) is None  # a folder with other files: Ray Data's reader decides what it reads
    assert local_shape(str(tmp_path / "missing.jsonl")) is None
    # a checkpoint holding the ids Ray Data read holds every row the driver counts here, and one id short is one row
    (folder / "notes.md").unlink()
    for path, kind in [(p, None) for p in ("a.json", "b.csv", "c.parquet", "parts", "own.jsonl")] + [
        ("lines.txt", "text")
    ]:
        ds = positioned(str(tmp_path / path), kind, "id") if kind else read(str(tmp_path / path), id_column="id")
        ids = [r["id"] for r in ds.take_all()]
        checkpoint = tmp_path / f"checkpoint-{path}"
        checkpoint.mkdir()
        pq.write_table(pa.table({"id": ids[1:]}), checkpoint / "part.parquet")
        assert unwritten_rows(str(tmp_path / path), checkpoint, "id", kind) == 1, path
        pq.write_table(pa.table({"id": ids[:1]}), checkpoint / "first.parquet")
        assert unwritten_rows(str(tmp_path / path), checkpoint, "id", kind) == 0, path
        (checkpoint / "first.parquet").rename(checkpoint / f"first{PENDING_SUFFIX}")  # not committed: not written
        assert unwritten_rows(str(tmp_path / path), checkpoint, "id", kind) == 1, path
    assert unwritten_rows(str(tmp_path / "missing.jsonl"), tmp_path / "checkpoint-a.json", "id") is None


def test_in_process_jobs_resume_with_checkpointed(serve_instance, tmp_path):
    import ray.data

    from serve_app.data import InProcessGenerate, checkpointed, read

    data = tmp_path / "rows.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"row {i}"}) + "\n" for i in range(12)))
    out, checkpoint = tmp_path / "out", tmp_path / "ckpt"

    def job() -> None:
        ds = checkpointed(read(str(data), id_column="id", blocks=3), checkpoint)
        ds.map_batches(
            InProcessGenerate,
            fn_constructor_kwargs={"config": {"engine": "simulated"}, "sampling": {"max_tokens": 2}},
            batch_size=4,
            compute=ray.data.ActorPoolStrategy(size=1),
            num_cpus=0.1,
        ).write_json(str(out), mode="append")

    job()
    files = sorted(out.iterdir())
    assert sorted(r["id"] for r in written(out)) == sorted(f"rows.jsonl:{i}" for i in range(12))
    job()  # everything recorded: nothing read past the checkpoint, nothing written
    assert sorted(out.iterdir()) == files
    assert len(written(out)) == 12


def test_a_killed_openai_batch_job_resumes_with_only_the_unwritten_lines(app, tmp_path):
    """The same for an OpenAI Batch file (on this module's app: a resume needs CPUs free beside the replicas)."""
    pytest.importorskip("vllm")  # the batch line and output models are vLLM's
    import ray

    from serve_app import driver

    handle = app
    lines = 80
    requests = tmp_path / "requests.jsonl"
    body = {"max_tokens": 4, "temperature": 0}
    line = {"method": "POST", "url": "/v1/completions"}
    texts = [json.dumps({**line, "custom_id": f"c{i}", "body": {**body, "prompt": f"p {i}"}}) for i in range(lines)]
    requests.write_text("\n".join(texts) + "\n")
    out = tmp_path / "results.jsonl"
    flags = ["--openai-batch", str(requests), "--output", str(out), "--app", "resume"]
    flags += ["--concurrency", "16", "--batch-size", "4"]  # blocks of 16 lines: 5 writes
    flags += ["--address", ray.get_runtime_context().gcs_address]
    first = subprocess.Popen(
        [sys.executable, "-m", "serve_app.driver", *flags], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    parts = tmp_path / "results.jsonl.parts"

    def parted() -> int:
        return sum(f.read_text().count("\n") for f in parts.glob("*.jsonl")) if parts.is_dir() else 0

    kill_once_written(first, parted, 16)
    assert not out.exists()  # the output is assembled only when every line is answered
    idle(handle)
    before = completed(handle)
    summary = driver.run(driver.parser().parse_args([*flags, "--resume"]))
    assert 0 < summary["lines_skipped"] < lines
    assert completed(handle) - before == lines - summary["lines_skipped"]  # only the unwritten lines were sent
    answered = [json.loads(line) for line in out.read_text().splitlines()]
    assert [a["custom_id"] for a in answered] == [f"c{i}" for i in range(lines)]  # each once, in input order
    assert summary["status_codes"] == {"200": lines} and summary["duplicate_ids"] == 0
