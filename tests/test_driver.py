"""The driver's summary of a job, read back from the files the job wrote (no Ray: files as Ray Data writes them),
and the paths it hands Ray Data."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from serve_app.data.summary import summarize
from serve_app.driver import absolute_paths, parser


def test_the_summary_reads_every_written_file_whatever_types_its_columns_took(tmp_path: Path) -> None:
    """A file in which no row failed has only nulls in ``error`` (typed apart from a file with a failure) and one
    holds a line longer than JSON's default read block; ids repeated across files are counted as duplicates."""
    out = tmp_path / "out"
    out.mkdir()
    clean = [{"id": f"f:{i}", "text": f"{i + 1}", "output_tokens": 3, "error": None, "answer": i + 1} for i in range(3)]
    failed = [
        {"id": "f:2", "text": "", "output_tokens": 0, "error": "boom", "answer": 3},
        {"id": "f:3", "text": "x" * (2 << 20), "output_tokens": 5, "error": None, "answer": 4},
    ]
    for name, rows in [("a_000000.json", clean), ("b_000000.json", failed)]:
        (out / name).write_text("".join(json.dumps(r) + "\n" for r in rows))
    (out / "c_000000.json").write_text("")  # an empty block's file
    summary = summarize(str(out), "jsonl", has_answer=True)
    assert summary == {"rows": 5, "errors": 1, "tokens": 14, "correct": 3, "duplicate_ids": 1, "dimensions": []}


def test_the_summary_of_an_embedding_job_in_parquet_gives_the_vectors_dimensions(tmp_path: Path) -> None:
    out = tmp_path / "vectors"
    out.mkdir()
    for part, rows in enumerate([[[0.5] * 4, None], [[1.0] * 4]]):
        table = pa.table(
            {
                "id": [f"t:{part}:{i}" for i in range(len(rows))],
                "embedding": pa.array(rows, type=pa.list_(pa.float64())),
                "tokens": [7 if r is not None else 0 for r in rows],
                "error": [None if r is not None else "too long" for r in rows],
            }
        )
        pq.write_table(table, out / f"{part}_000000.parquet")
    summary = summarize(str(out), "parquet", has_answer=False, task="embed")
    assert summary == {"rows": 3, "errors": 1, "tokens": 14, "correct": 0, "duplicate_ids": 0, "dimensions": [4]}


def test_the_jobs_local_paths_are_made_absolute_from_the_callers_folder(tmp_path: Path, monkeypatch) -> None:
    """Ray Data reads and writes in worker processes whose folder is the cluster's: a relative path means the
    caller's folder (``tests/test_real_docs.py`` runs the docs' jobs from a folder of their own); a URI stays."""
    monkeypatch.chdir(tmp_path)
    args = absolute_paths(parser().parse_args(["--input", "data/in.jsonl", "--output", "out/", "--checkpoint", "c"]))
    assert (args.input, args.output, args.checkpoint) == tuple(str(tmp_path / p) for p in ("data/in.jsonl", "out", "c"))
    args = absolute_paths(parser().parse_args(["--openai-batch", "s3://bucket/requests.jsonl", "--output", "~/r"]))
    assert args.openai_batch == "s3://bucket/requests.jsonl" and args.output == str(Path.home() / "r")
