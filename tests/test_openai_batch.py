"""OpenAI Batch files through a SIMULATED generation app and the embedding app (all-MiniLM-L6-v2 on the padded
engine): one output line per request line, in order, each body equal to what the HTTP route answers for the same
request; malformed lines become 400 lines in OpenAI's envelope; a rerun with ``--resume`` sends nothing again."""

from __future__ import annotations

import asyncio
import base64
import json
import logging

import httpx
import numpy as np
import pytest

from .conftest import sized

pytestmark = pytest.mark.serve
pytest.importorskip("vllm")  # the batch line and output models are vLLM's

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
EMBEDDINGS = "/v1/embeddings"
RESPONSES = "/v1/responses"
TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {}}}}


@pytest.fixture(scope="module")
def served(serve_instance, deploy_app):
    """A simulated generation app at ``/batch`` and the embedding app at ``/batch/v1/embeddings``."""
    from ray import serve

    from serve_app.app import build_embeddings_app

    deploy_app("batch", simulated={"step_s": 0.001})
    serve.run(
        build_embeddings_app(
            {"engine": "padded", "cpus_per_replica": 0.25, "autoscaling": {"min_replicas": 1, "max_replicas": 1}}
        ),
        name="batch-embeddings",
        route_prefix="/batch/v1/embeddings",
    )
    yield serve_instance + "/batch"
    serve.delete("batch-embeddings", _blocking=False)


def good_lines(triples: int) -> list[dict]:
    """``triples`` requests to each of the three routes, with fields each route takes (greedy, so answers repeat),
    one to the Responses API, and three the routes themselves refuse."""
    lines = []
    for i in range(triples):
        chat = {"messages": [{"role": "user", "content": f"question {i} about batches"}], "max_tokens": 3 + i % 3}
        if i % 4 == 1:
            chat |= {"temperature": 0, "stop": ["zzz"], "n": 2, "user": "tenant-a", "priority": 2}
        if i % 4 == 3:  # tools shown to the model (the simulated engine can make no call: tests/test_real_tools.py)
            chat |= {"tools": [TOOL], "tool_choice": "none"}
        lines.append({"url": CHAT, "body": chat})
        completion = {"prompt": f"prompt {i} goes", "max_tokens": 4, "temperature": 0}
        if i % 3 == 0:
            completion |= {"echo": True, "logit_bias": {"5": 1.0}, "seed": 7}
        lines.append({"url": COMPLETIONS, "body": completion})
        texts = [f"text {i}", "another text"] if i % 2 else f"one text {i}"
        lines.append({"url": EMBEDDINGS, "body": {"input": texts} | ({"encoding_format": "base64"} if i % 5 else {})})
    lines.append({"url": RESPONSES, "body": {"input": "a question in a batch", "max_output_tokens": 4}})
    lines = [{"custom_id": f"req-{n}", "method": "POST", **line} for n, line in enumerate(lines)]
    refused = {
        "refused-chat": (CHAT, {"messages": [], "max_tokens": -1}),
        "refused-field": (COMPLETIONS, {"x": 1}),
        "refused-tools": (
            CHAT,
            {"messages": [{"role": "user", "content": "f?"}], "tools": [TOOL], "tool_choice": "required"},
        ),
    }
    return lines + [{"custom_id": c, "method": "POST", "url": u, "body": b} for c, (u, b) in refused.items()]


BAD = [
    "this is not JSON",
    json.dumps({"custom_id": "no-url", "method": "POST", "body": {}}),
    json.dumps({"custom_id": "bad-url", "method": "POST", "url": "/v1/images", "body": {}}),
    json.dumps({"custom_id": "get", "method": "GET", "url": CHAT, "body": {"messages": []}}),
    json.dumps({"custom_id": "streamed", "method": "POST", "url": CHAT, "body": {"messages": [], "stream": True}}),
    json.dumps({"custom_id": "body-not-object", "method": "POST", "url": CHAT, "body": [1, 2]}),
]


def comparable(body: dict, approx: bool = False) -> dict:
    """A body without what differs between two answers to one request: its id and creation time, and the last
    bits of a vector, which depend on the batch a text lands in. In float32 that is 1e-5 at most; in bfloat16 (the
    engines' dtype on a CPU with AMX or AVX512-BF16) up to 1.5e-3 here, where the vectors of two of these texts
    differ by 4.5e-2 or more somewhere."""
    from serve_app.engines.cpu import cpu_dtype

    tolerance = 1e-5 if cpu_dtype() == "float32" else 5e-3
    out = {k: v for k, v in body.items() if k not in ("id", "created", "created_at")}
    out["output"] = [{k: v for k, v in item.items() if k != "id"} for item in out.get("output", [])]
    for item in out.get("data", []):
        vector = item.get("embedding")
        if isinstance(vector, str):
            vector = np.frombuffer(base64.b64decode(vector), dtype="<f4").tolist()
        if vector is not None:
            item["embedding"] = pytest.approx(vector, abs=tolerance) if approx else vector
    return out


async def posted(url: str, lines: list[dict], at_once: int = 16) -> list[httpx.Response]:
    """Each line's body POSTed to its route, ``at_once`` at a time; the answers in the lines' order."""
    gate = asyncio.Semaphore(at_once)
    async with httpx.AsyncClient(base_url=url, timeout=120) as http:

        async def post(line: dict) -> httpx.Response:
            async with gate:
                return await http.post(line["url"], json=line["body"])

        return await asyncio.gather(*(post(line) for line in lines))


@pytest.mark.parametrize("triples", sized(40, 164, "system"))  # 128 and 500 lines
def test_a_batch_file_is_answered_line_for_line_as_the_http_routes_answer(served, tmp_path, triples, caplog):
    from serve_app import driver

    good = good_lines(triples)
    texts = [json.dumps(line) for line in good]
    texts[5:5] = BAD[:3]
    texts.insert(9, "")  # a blank line: skipped, and numbered
    texts += BAD[3:]
    requests = tmp_path / "requests.jsonl"
    requests.write_text("\n".join(texts) + "\n")
    out = tmp_path / "results.jsonl"
    flags = ["--openai-batch", str(requests), "--output", str(out), "--app", "batch"]
    flags += [
        "--embeddings-app",
        "batch-embeddings",
        "--concurrency",
        "32",
        "--batch-size",
        "8",
    ]  # 500 lines: 16 blocks
    summary = driver.run(driver.parser().parse_args(flags))
    answered = [json.loads(line) for line in out.read_text().splitlines()]
    numbered = [f"requests.jsonl:{n}" for n, text in enumerate(texts) if text]
    assert [a["id"] for a in answered] == numbered  # one line out per request line, in input order
    assert (
        summary["lines_in"] == summary["lines_out"] == len(good) + len(BAD) == 3 * triples + 4 + 6
    )  # responses, refused, bad
    assert summary["duplicate_ids"] == 0

    by_custom = {a["custom_id"]: a for a in answered}
    for line, direct in zip(good, asyncio.run(posted(served, good)), strict=True):
        got = by_custom[line["custom_id"]]["response"]
        assert got["status_code"] == direct.status_code, line
        assert comparable(got["body"]) == comparable(direct.json(), approx=True), line  # the route's very answer
        assert got["request_id"]
    for refused in ("refused-chat", "refused-field", "refused-tools"):  # the routes' own refusals (compared above)
        assert by_custom[refused]["response"]["status_code"] >= 400
        assert by_custom[refused]["error"] == by_custom[refused]["response"]["body"]["error"]
    assert sum(a["response"]["status_code"] == 200 for a in answered) == len(good) - 3  # the refused

    bad = [a for a in answered if a["custom_id"] not in {line["custom_id"] for line in good}]
    assert len(bad) == len(BAD)
    for a in bad:
        assert a["response"]["status_code"] == 400
        envelope = a["response"]["body"]["error"]
        assert envelope["code"] == 400 and envelope["type"] and envelope["message"].startswith("invalid batch line")
        assert a["error"] == envelope
    assert {a["custom_id"] for a in bad} == {None, "no-url", "bad-url", "get", "streamed", "body-not-object"}
    assert "url" in by_custom["bad-url"]["error"]["message"] and "stream" in by_custom["streamed"]["error"]["message"]

    from ray import serve

    handle = serve.get_deployment_handle("LLMServer", app_name="batch")
    tenants = handle.stats.remote().result()["batcher"]["admitted_cost_by_tenant"]
    assert any(tenant.startswith("ray-job-") for tenant in tenants), tenants  # lines without a user: the job's
    before = handle.stats.remote().result()["batcher"]["total_completed"]
    with caplog.at_level(logging.INFO, logger="serve_app.data.batch_files"):
        again = driver.run(driver.parser().parse_args([*flags, "--resume"]))
    assert "nothing to send" in caplog.text  # every line was recorded: no Ray Data job at all
    assert handle.stats.remote().result()["batcher"]["total_completed"] == before
    assert again["lines_skipped"] == again["lines_out"] == len(answered) and again["duplicate_ids"] == 0
    assert [json.loads(line)["id"] for line in out.read_text().splitlines()] == numbered


def test_the_openai_handle_method_answers_behind_an_api_key(deploy):
    """The HTTP door wants a key; the handle method, trusted code inside the cluster, passes it as the route's
    caller would, and answers what the route answers."""
    key = "batch-test-key-0123456789abcdef"
    handle = deploy("batch-keyed", api_key=key, simulated={"step_s": 0.001})
    body = {"prompt": "behind the door", "max_tokens": 2}
    answer = handle.openai.remote(COMPLETIONS, body).result()
    assert answer["status_code"] == 200 and answer["body"]["choices"][0]["text"]
    refused = handle.openai.remote(COMPLETIONS, {**body, "max_tokens": 0}).result()
    assert refused["status_code"] >= 400 and refused["body"]["error"]["param"] == "max_tokens"
    with pytest.raises(Exception, match="not JSON"):  # a stream is no JSON body: refused, not garbled
        handle.openai.remote(COMPLETIONS, {**body, "stream": True}).result()


def test_a_batch_jobs_lines_run_at_its_priority_and_tenant_unless_they_name_their_own():
    from serve_app.openai.chat import ChatCompletionRequest
    from serve_app.openai.common import JOB_ORIGIN, Origin

    plain = ChatCompletionRequest(messages=[{"role": "user", "content": "hi"}])
    named = ChatCompletionRequest(messages=[{"role": "user", "content": "hi"}], priority=0, user="alice")
    assert plain.origin == Origin(priority=0, tenant=None)  # an interactive request
    token = JOB_ORIGIN.set(Origin(priority=1, tenant="ray-job-07"))
    try:
        assert plain.origin == Origin(priority=1, tenant="ray-job-07")  # a job's line: the job's
        assert named.origin == Origin(priority=0, tenant="alice")  # a line that says: its own
    finally:
        JOB_ORIGIN.reset(token)
