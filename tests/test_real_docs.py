"""README's and docs/'s commands and examples as written, against the session's real app (`serve run
serve_config.yaml`, as `make serve` starts it): each pointed at its port and cluster (tests/README.md says which
others run where)."""

from __future__ import annotations

import json
import shutil
import subprocess
from typing import Any

import pyarrow.parquet as pq
import pytest

from harness.environment import BIN, ROOT

from .test_streaming import sse_payloads

pytestmark = pytest.mark.system


def test_readmes_http_commands_run_as_written_and_the_bundled_adapter_answers_as_trained(real_app):
    """Each ``curl`` of the README's HTTP section, pointed at the app: ``make serve`` serves the bundled LoRA adapter
    beside the base model, listed with its parent, and answers as trained, where the base model does not."""
    ran = dict(real_app.run_commands("README.md", "localhost:8000/generate"))
    outputs = {command.split()[2].split("/", 1)[1]: out for command, out in ran.items()}  # by route, the last kept
    assert len(json.loads(outputs["generate"])["results"]) == 2
    chats = [(c, out) for c, out in ran.items() if "/v1/chat/completions" in c]
    whole, streamed, adapted = (out for _, out in chats)
    assert json.loads(whole)["model"] == "SmolLM2-135M-Instruct" and "Paris" in whole
    assert streamed.rstrip().endswith("data: [DONE]") and len(sse_payloads(streamed)) > 2
    answer = json.loads(adapted)
    assert answer.get("model") == "bundled-answer", answer
    assert answer["choices"][0]["message"]["content"].startswith("ANSWER: 42"), answer
    assert len(json.loads(outputs["v1/embeddings"])["data"]) == 2
    models = {m["id"]: m for m in json.loads(outputs["v1/models"])["data"]}
    assert set(models) == {"SmolLM2-135M-Instruct", "all-MiniLM-L6-v2", "bundled-answer"}
    assert models["bundled-answer"]["parent"] == "SmolLM2-135M-Instruct"
    assert json.loads(outputs["stats"])["engine"] == "vllm"
    assert set(outputs) == {"generate", "v1/chat/completions", "v1/embeddings", "v1/models", "stats", "health"}


@pytest.mark.parametrize(
    ("page", "marker"),
    [("docs/http.md", "localhost:8000/v1/completions"), ("docs/embeddings.md", "curl"), ("docs/fleet.md", "curl")],
)
def test_the_docs_curl_examples_run_as_written_and_are_answered(real_app, page, marker):
    """Each page's ``curl`` example, pointed at the app, is answered: a JSON body with choices or data, or SSE chunks
    that end with ``[DONE]`` (the usage last where the request asks for it), never an error."""
    for command, out in real_app.run_commands(page, marker):
        if '"stream": true' in command:
            assert out.rstrip().endswith("data: [DONE]"), out
            chunks = sse_payloads(out)
            assert len(chunks) > 2 and not any("error" in chunk for chunk in chunks), out
            if "include_usage" in command:
                assert chunks[-1]["usage"]["completion_tokens"] > 0, chunks[-1]
        else:
            body = json.loads(out)
            assert "error" not in body and (body.get("choices") or body.get("data")), body


@pytest.mark.parametrize(
    ("page", "marker", "printed"),
    [
        ("README.md", "from openai import OpenAI", None),  # an answer whole, then streamed
        ("docs/embeddings.md", "from openai import OpenAI", "2 384"),
        ("docs/fleet.md", "default_headers", ""),  # a client that sends its session with every request
    ],
)
def test_the_openai_client_examples_run_as_written(real_app, page, marker, printed):
    out = real_app.run_example(page, marker)
    if printed is None:
        assert len(out.strip()) > 10, out
    else:
        assert out.strip() == printed


def test_the_batch_job_commands_of_readme_and_ray_data_docs_run_as_written(real_app, tmp_path):
    """The README's Ray Data commands, then docs/ray-data.md's (a job resumed, an OpenAI Batch file, embeddings), as
    written, one after another in a folder of their own beside ``.venv``: each job's rows all answered once."""

    def summary(printed: str) -> dict[str, Any]:
        return json.loads(printed[printed.index("{") :])

    def rows(folder: str) -> list[dict[str, Any]]:
        return [json.loads(line) for f in (tmp_path / folder).glob("*.json*") for line in f.read_text().splitlines()]

    (tmp_path / ".venv").symlink_to(ROOT / ".venv")
    _, (_, printed) = real_app.run_commands("README.md", "serve_app.driver", cwd=tmp_path)
    assert len((tmp_path / "data" / "problems.jsonl").read_text().splitlines()) == 200
    first = summary(printed)
    assert first["rows_in"] == first["rows_out"] == 60 and first["errors"] == 0, first
    assert first["output_tokens"] > 0 and 0 <= first["accuracy"] <= 1
    ((_, printed),) = real_app.run_commands("docs/ray-data.md", "--resume", cwd=tmp_path)
    resumed = summary(printed)
    assert resumed["rows_skipped"] == 60 and resumed["rows_out"] == 200 and resumed["errors"] == 0, resumed
    answered = rows("out")
    assert sorted(row["id"] for row in answered) == sorted({row["id"] for row in answered}) and len(answered) == 200
    assert all(row["error"] is None and row["output_tokens"] > 0 for row in answered)
    real_app.run_commands("docs/ray-data.md", "--openai-batch", cwd=tmp_path)
    lines = [json.loads(line) for line in (tmp_path / "results.jsonl").read_text().splitlines()]
    assert sorted(line["custom_id"] for line in lines) == ["q1", "q2", "q3"]
    assert all(line["error"] is None and line["response"]["status_code"] == 200 for line in lines), lines
    ((_, printed),) = real_app.run_commands("docs/ray-data.md", "--task embed", cwd=tmp_path)
    vectors = summary(printed)
    assert vectors["rows_out"] == 200 and vectors["errors"] == 0 and vectors["dimensions"] == [384], vectors
    assert list((tmp_path / "vectors").glob("*.parquet"))


def test_the_python_ray_data_examples_run_as_written_from_the_project_folder(real_app):
    """README's and docs/ray-data.md's Python jobs as written, from the project's folder, where ``make serve`` started
    the cluster (Ray Data's tasks open relative paths there): a row answered; the dataset answered into
    ``out-python/``; the checkpointed job twice, the second adding nothing; the texts embedded. Their outputs are
    the ones .gitignore names, removed afterwards."""
    made = ["out-python", "out-python.checkpoint", "vectors-python"]

    def rows(folder: str) -> int:
        return sum(len(f.read_text().splitlines()) for f in (ROOT / folder).glob("*.json"))

    for name in made:
        shutil.rmtree(ROOT / name, ignore_errors=True)
    sample = ["-m", "serve_app.sample", "--rows", "200", "--output", "data/problems.jsonl"]  # README's command
    subprocess.run([str(BIN / "python"), *sample], cwd=ROOT, check=True, capture_output=True, timeout=120)
    try:
        assert real_app.run_example("README.md", "from serve_app.data import generate").strip()
        real_app.run_example("docs/ray-data.md", 'out.write_json("out-python/")')
        assert rows("out-python") == 200
        for _ in range(2):  # a rerun adds only the rows the checkpoint does not hold: none
            real_app.run_example("docs/ray-data.md", 'checkpoint="out-python.checkpoint"')
            assert rows("out-python") == 400
        real_app.run_example("docs/ray-data.md", "from serve_app.data import embed")
        vectors = pq.read_table(ROOT / "vectors-python")
        assert vectors.num_rows == 200 and len(vectors.column("embedding")[0]) == 384
    finally:
        for name in made:
            shutil.rmtree(ROOT / name, ignore_errors=True)
